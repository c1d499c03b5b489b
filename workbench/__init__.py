"""Workbench for making long LLM generation fast: TTFT, inter-token latency and throughput of a local
``transformers`` model across batch size, context length, temperature, reasoning budget and compression.

The package on one screen (DESIGN.md section 2). Experiments sit on top and never import each other;
everything below them is a plain library module with one concern, and each formula has one home.

Experiments (:mod:`workbench.experiments`), one per numbered notebook:
    batch_size, context_length, temperature, streaming_anatomy, reasoning_budget,
    context_compression, long_output, explorer (notebook 00).

Techniques:   compression (context compression strategies), budget_forcing (thinking budgets),
              long_form (outline + sections).
Inputs:       prompts (exact-length prompts from real text), tasks.haystack, tasks.reasoning.
Serving:      serving.server (engine + OpenAI-compatible app), serving.client (SSE client, load).
Instruments:  generation (measured generate, eos_token_ids, warm_up), detokenize (incremental text,
              display granularity), memory (peak memory, KV-cache bytes), metrics (request_timing,
              percentiles, point summaries, MBU/MFU, the column table COLUMNS).
Quality:      quality (every text and answer metric, continuation log-likelihood, bootstrap CIs).
Checks:       checks (one-line parameter validators), errors (ParameterError).
Models:       models (offline loading of the embedded default or a local model, model facts).
Run machinery: sweeps (shared config fields, grids, the point loop), results (run folders, Parquet),
              notebooks (jupytext sources, parameters, suites, papermill), report (HTML), plots
              (house template, labels), cli (the ``workbench`` command).
"""

__version__ = "0.2.0"

from .errors import ParameterError  # noqa: F401
