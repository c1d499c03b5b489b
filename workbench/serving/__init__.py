"""Serving: :mod:`.server` (engines and the OpenAI-compatible app) and :mod:`.client` (the load
generator and the SSE client)."""
