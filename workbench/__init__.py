"""Workbench for making long LLM generation fast: TTFT, inter-token latency and throughput of a local
``transformers`` model across batch size, context length, temperature, reasoning budget and compression.

The package by layer, lowest first (``docs/design.md`` section 2; ``tests/test_layout.py`` checks that no module
imports a folder above its own):

    errors, checks,  the ground floor: ParameterError and one-line exceptions, the one-line parameter validators and
    paths            the small converters (float or NaN, a Config's defaults), the repository root and data folder,
                     the workbench cache (atomic writes, the entries a machine's processes share)
    stats/           formulas and statistics: metrics, evidence, slo, the column registry, comparisons, replicates,
                     request classes
    measure/         instruments: device, models, generation, streaming, timers, detokenize, memory, energy,
                     contention, quality, guard, reading
    techniques/      compression, answering, retrieval, segments, budget_forcing, long_form, speed (draft / int8
                     builders), rungs, configurations
    inputs/          prompts, haystack and reasoning tasks
    run/             point results, run folders, drift, sweeps, the Ray executor, notebooks and suites, the suite
                     runner, metrics.json
    serving/         the OpenAI-compatible server: options, engines, scheduling, routes, events, jobs, monitoring
    load/            the load generator: arrival profiles, the one streamed reply and its clients, senders, endpoints,
                     traces, knees and recommendations, bench, nginx in front
    predict/         the roofline latency model and its calibration, predictions, the serving twin (its cost, its
                     validation against a run, what ``workbench simulate`` runs), where a decode step goes
    share/           plots, the HTML report and its findings, CSV / static figures, metrics.json's summary, cost,
                     export and import of other tools' results, the serving and twin figures, the live view
    experiments/     one module (or small folder) per numbered notebook; they never import each other
    cli/             the ``workbench`` command: argument parsing and dispatch

Old flat names that notebooks in users' hands import (``from workbench import models, results, plots, report``)
still resolve, to their modules' new homes; new code imports the folders.
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

# jsonschema imports rfc3987_syntax when it is installed (jupyter-events asks for it) only to check the "iri" string
# format, and that import builds a Lark grammar: ~1.3-3 s in every process that validates a notebook or shows a
# figure (plotly's renderers import nbformat: each notebook kernel's first fig.show()). No schema the workbench's
# processes use has that format, so they do without it: jsonschema skips a format whose checker cannot be imported
# (python-jsonschema/jsonschema#1428). A process that imported it already keeps it.
_sys.modules.setdefault("rfc3987_syntax", None)


def _known_noise(record) -> bool:
    """False for two warnings that every process loading a model printed and no user of this machine can act on
    (a logging filter on their two loggers): torchao's "Failed to load .../_C_*.so" for the CUDA kernels (and other
    Python versions' builds) its wheel ships, on a machine without CUDA; and torch's deprecation of the Enum
    registrations torchao makes when transformers imports it (``torch.utils._pytree``: a note to torchao's
    maintainers). Anything else those loggers say, and both on a CUDA machine, still reaches the log."""
    message = record.getMessage()
    if record.name == "torch.utils._pytree":
        return "is an Enum subclass and is now natively supported" not in message
    if record.name == "torchao" and message.startswith("Failed to load ") and ".so" in message:
        torch = _sys.modules.get("torch")
        return bool(torch is not None and torch.cuda.is_available())
    return True


def _quiet_known_noise() -> None:
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).addFilter(_known_noise)


_quiet_known_noise()

from workbench.errors import ParameterError  # noqa: F401,E402

#: Flat names of the layout before the layer folders, still importable as ``from workbench import NAME`` for notebooks
#: written against it (PEP 562 module ``__getattr__``; ``import workbench.run.results`` itself is gone).
_MOVED = {"models": "workbench.measure.models", "results": "workbench.run.results", "plots": "workbench.share.plots",
          "report": "workbench.share.report"}


def __getattr__(name):
    if name in _MOVED:
        import importlib

        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
