"""Workbench for making long LLM generation fast.

Measures time-to-first-token, inter-token latency and throughput of a local
Hugging Face ``transformers`` model across batch size, context length,
temperature, reasoning budget and context compression. Modules, one concept each:

- :mod:`workbench.models`: load the embedded default model (or any local one) offline.
- :mod:`workbench.generation`: one measured ``generate`` call, timed per token id.
- :mod:`workbench.prompts`: prompts of an exact token length from real text.
- :mod:`workbench.metrics`: percentiles, throughput, goodput, device probe, MBU/MFU.
- :mod:`workbench.results`: run folders, Parquet records, ``load``.
- :mod:`workbench.sweeps`: typed sweep configs, grids, papermill execution.
- :mod:`workbench.plots`: plotly figures with the house template.
- :mod:`workbench.report`: self-contained HTML report of a run.
- :mod:`workbench.cli`: the ``workbench`` command.
"""

__version__ = "0.1.0"

from .errors import ParameterError  # noqa: F401
