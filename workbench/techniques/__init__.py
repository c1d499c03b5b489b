"""Techniques: what a user applies to make generation faster or shorter, each behind a small interface.

``compression`` (context compression strategies), ``retrieval`` (BM25+ / dense chunk ranking), ``segments`` (a
context in whole-character units, cuts and chunks), ``budget_forcing`` (thinking budgets), ``long_form``
(outline then sections), ``speed`` (the speed techniques' model builders: a draft model, int8 dynamic
quantization), ``rungs`` (the speed ladder: torchao weight-only int8 / int4 with group sizes checked, lm_head
handling, static cache + compile), ``budget_batch`` (a measured batch under a thinking budget), ``configurations``
(an engine configuration grid: axes, validity, names, building a configuration, the per-configuration table). Built on :mod:`workbench.measure`; never imports inputs, run machinery or experiments.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["answering", "budget_batch", "budget_forcing", "compression", "configurations", "long_form", "rungs",
           "speed"]
