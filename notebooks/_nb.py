"""Shared tail of the notebook builders: metadata that papermill and the CLI need, then write.

Every notebook gets the python3 kernelspec and language_info (papermill refuses a notebook without a
language) and ``metadata.workbench.config`` naming its typed config (``module:Class``), which the
command line uses to validate parameters before a kernel starts.
"""
from pathlib import Path

import nbformat as nbf


def write(cells: list, name: str, config: str) -> Path:
    """Write ``notebooks/<name>`` from ``cells`` (outputs empty) with the standard metadata."""
    for i, cell in enumerate(cells):
        cell.id = f"cell-{i:02d}"  # stable ids: rebuilding a notebook changes nothing it did not edit
    nb = nbf.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    nb.metadata["workbench"] = {"config": config}
    path = Path(__file__).with_name(name)
    nbf.write(nb, path)
    return path
