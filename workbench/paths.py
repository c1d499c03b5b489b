"""Where the repository's files are: the one home of the repository root and of the ``data/`` folder's location
(ground floor).

``REPO`` is the repository root (the folder holding ``pyproject.toml``, ``notebooks/``, ``suites/``, ``results/``);
every module that needs it imports it from here. ``data_dir()`` is ``$WORKBENCH_DATA`` when set, else the
repository's ``data/`` (prompts' source text, the haystacks, the guard's held-out text, shipped model configs, tasks).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent   # the workbench package's own folder (its sources: a run's code identity)
REPO = PACKAGE.parent


def data_dir() -> Path:
    """The repository's ``data/`` folder (``$WORKBENCH_DATA`` overrides it)."""
    env = os.environ.get("WORKBENCH_DATA")
    return Path(env) if env else REPO / "data"
