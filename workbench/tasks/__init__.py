"""Inputs with known answers: :mod:`.haystack` (needle, multi-key, chat over real text) and
:mod:`.reasoning` (short questions with gold answers for the reasoning-budget experiment)."""
