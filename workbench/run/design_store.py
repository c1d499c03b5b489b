"""A design's record in its run folder: every finished round of every arm (``design/<experiment>.parquet``), their
requests (``design/<experiment>_requests.parquet``) and what was decided how (``design/<experiment>.json``), written
after each round so that a resume continues from the last finished round (:func:`workbench.run.design.run_design`)
and an analysis can be rebuilt from the table (:func:`workbench.run.design.reanalyse`).

``design`` below is a :class:`workbench.run.design.Design` (this module sits under it and does not import it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd


def store_paths(run_dir, experiment: str) -> tuple[Path, Path]:
    """The table and requests files of ``experiment``'s design in ``run_dir`` (the description: the table's ``.json``)."""
    folder = Path(run_dir) / "design"
    return folder / f"{experiment}.parquet", folder / f"{experiment}_requests.parquet"


def load_rounds(run_dir, design) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The finished rounds a run folder holds for this design (a round with every arm), else empty tables."""
    if run_dir is None:
        return pd.DataFrame(), pd.DataFrame()
    tpath, rpath = store_paths(run_dir, design.experiment)
    if not tpath.exists():
        return pd.DataFrame(), pd.DataFrame()
    table = pd.read_parquet(tpath)
    want = set(map(str, design.measured_arms()))
    if not want <= set(table["arm"]):
        return pd.DataFrame(), pd.DataFrame()       # another design (a changed grid): start over
    full = [r for r, g in table.groupby("round") if set(g["arm"]) >= want]
    table = table[table["round"].isin(full)]
    req = pd.read_parquet(rpath) if rpath.exists() else pd.DataFrame()
    if not req.empty:
        req = req[req["repeat"].isin(full)]
    return table, req


def save_rounds(run_dir, design, table: pd.DataFrame, req: pd.DataFrame) -> None:
    """Write the rounds so far (the arms' table and their requests), each file atomically; nothing without a run folder."""
    if run_dir is None:
        return
    from workbench.run import results

    tpath, rpath = store_paths(run_dir, design.experiment)
    tpath.parent.mkdir(exist_ok=True)
    results.write_table(rpath, req)
    results.write_table(tpath, table)


def save_description(run_dir, design, rounds: int, seconds: float, stopped: str, looks: list) -> None:
    """``design/<experiment>.json``: what was decided how, so an analysis can be rebuilt from the table
    (:func:`workbench.run.design.reanalyse`)."""
    if run_dir is None:
        return
    from workbench.run import results

    desc = {"experiment": design.experiment, "arms": [str(a) for a in design.arms], "control": str(design.control),
            "groups": {str(g): [str(a) for a in m] for g, m in design.groups.items()} if design.groups else None,
            "aa": design.aa, "margin": design.margin, "min_rounds": design.min_rounds,
            "max_rounds": design.max_rounds, "budget_s": design.budget_s, "spending": design.spending,
            "order": design.order, "seed": design.seed,
            "primary": dataclasses.asdict(design.primary),
            "secondary": [dataclasses.asdict(o) for o in design.secondary],
            "rounds": rounds, "seconds": seconds, "stopped": stopped, "looks": looks}
    path = store_paths(run_dir, design.experiment)[0].with_suffix(".json")
    path.parent.mkdir(exist_ok=True)
    results.atomic_write(path, lambda f: f.write(json.dumps(desc, indent=1)), text=True)


def finished_rounds(run_dir, experiment: str) -> int | None:
    """The rounds a finished design of ``experiment`` took in this run folder (its ``design/<experiment>.json``),
    None when none finished there (never run, or interrupted before its end)."""
    if run_dir is None:
        return None
    path = store_paths(run_dir, experiment)[0].with_suffix(".json")
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["rounds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["finished_rounds", "load_rounds", "save_description", "save_rounds", "store_paths"]
