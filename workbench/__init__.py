"""Workbench for making long LLM generation fast: TTFT, inter-token latency and throughput of a local
``transformers`` model across batch size, context length, temperature, reasoning budget and compression.

The package on one screen (DESIGN.md section 2). Experiments sit on top and never import each other;
everything below them is a plain library module with one concern, and each formula has one home.

Experiments (:mod:`workbench.experiments`), one per numbered notebook, each with
``measure_point(loaded, cfg, point, state) -> point_result.PointResult`` and ``run(cfg, run_dir, loaded)``:
    explorer (notebook 00), batch_size, context_length, temperature, streaming_anatomy, reasoning_budget,
    context_compression, long_output, serving_load, engine_tuning, streaming_reader.

Serving:      serving.engines (the one engine interface: fifo / static / continuous), serving.http (errors,
              guard, body reading, schema), serving.chat (chat routes), serving.jobs (resumable jobs),
              serving.events (SSE framing, resumable streams), serving.monitoring (Prometheus, an engine observer),
              serving.server (app assembly, server thread, main), serving.protocol (served-model constants),
              serving.load (arrival profiles, load runs), serving.client (SSE client); slo (presets, search).
Techniques:   compression (context compression strategies), retrieval (BM25+ / dense chunk ranking),
              segments (a context in whole-character units, cuts, chunks), budget_forcing (thinking budgets),
              long_form (outline + sections).
Inputs:       prompts (exact-length prompts from real text), tasks.haystack, tasks.reasoning.
Instruments:  generation (measured generate, eos_token_ids, warm_up), detokenize (incremental text,
              display granularity), memory (KV-cache bytes, memory tracker), energy (NVML energy),
              metrics (request_timing, percentiles, point summaries, MBU/MFU, the column table COLUMNS),
              roofline (the latency model: formulas, device probe figures, calibration), reading
              (reading speed).
Quality:      quality (every text and answer metric, continuation log-likelihood, 95% intervals).
Evidence:     evidence (usable points, fit support, t / ratio / Wilson intervals, verdicts, Finding).
Models:       models (offline loading of the embedded default or a local model, model facts).
Ground floor: device (synchronize, device probe, peak memory, environment facts), checks (one-line
              parameter validators), errors (ParameterError). They import nothing above them.
Run machinery: sweeps (shared config fields, grids, the point loop), drift (the drift reference and its
              verdict), distributed (Ray executor), predictions (the roofline applied: suite plans,
              predictions beside measurements, residuals), resume_check (what a resumed session must share
              with its run: packages, model, device, dtype, effective notebook configs),
              results (run folders, Parquet, point ids, PointResult -> rows), notebooks (jupytext sources,
              parameters, suites, papermill), report (HTML), plots (house template, labels), cli (the
              ``workbench`` command).
"""

__version__ = "0.2.0"

import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

# Offline whatever the import order: set before any submodule imports transformers / huggingface_hub,
# and pushed into huggingface_hub's constant when it was imported first (it reads the variable once).
_os.environ.setdefault("HF_HUB_OFFLINE", "1")
if _os.environ["HF_HUB_OFFLINE"].strip().upper() in ("1", "ON", "YES", "TRUE") \
        and "huggingface_hub.constants" in _sys.modules:
    _sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True

from workbench.run import point_result
from workbench.errors import ParameterError  # noqa: F401
