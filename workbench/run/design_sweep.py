"""A design over a sweep's points (:func:`workbench.run.sweeps.run_sweep`'s ``design=``; docs/design.md section 11):
:class:`SweepDesign` (the :class:`workbench.run.design.Design` with the experiment's ``measure`` / ``prepare`` /
``extra``) and :func:`measure_sweep_design`, which runs it (:func:`workbench.run.design.run_design`) and turns each arm,
or with ``unit_of`` each measurement, into its point's result.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

from workbench.run.design import AA, Design, DesignResult, run_design
from workbench.run.design_plan import remember_spread


@dataclasses.dataclass
class SweepDesign:
    """A design over a sweep's points (:func:`workbench.run.sweeps.run_sweep`'s ``design``).

    Two shapes. By default the points are the arms: each arm is one point whose rows are its requests over every
    round (``repeat`` = round). With ``unit_of`` (queue experiments, where the run is the unit:
    :mod:`workbench.stats.replicates`) each (arm, round) measurement is a point of its own, as a run of a load
    test is: the grid holds one point per arm and round up to ``max_rounds``, ``unit_of`` names each one's
    ``(arm, round)`` (the A/A arm's runs as ``(AA, round)``), and the points of rounds the design did not take
    are not recorded.

    Attributes:
        design: the :class:`workbench.run.design.Design`; its arms (and control, groups, decide) are the points'
            ids, or with ``unit_of`` the experiment's own arm keys (a policy, an engine).
        measure: ``measure(point, round) -> Measured`` (with ``unit_of``: ``measure(arm, round)``).
        prepare: ``prepare(point) -> warm-up seconds`` (once per point and session; with ``unit_of``
            ``prepare(arm)``), or None.
        extra: ``extra(point_id, result) -> dict`` of the experiment's own point columns (quality means, ...), or
            None (with ``unit_of``: ``extra(arm, result)``).
        measure_aa: ``measure_aa(point, round) -> Measured`` for the A/A arm (the same timed work, without what
            only a recorded arm needs: scoring, saved texts), or None: ``measure`` (with ``unit_of``:
            ``measure_aa(arm, round)``).
        unit_of: ``unit_of(point) -> (arm, round)`` for the grid points that record one measurement each, None
            for the others; None: the points are the arms.
    """

    design: Design
    measure: Callable
    prepare: Callable | None = None
    extra: Callable | None = None
    measure_aa: Callable | None = None
    unit_of: Callable | None = None


def _suffixed(design: Design, suffix: str) -> Design:
    if not suffix:
        return design
    f = (lambda a: f"{a}{suffix}")
    return dataclasses.replace(design, arms=[f(a) for a in design.arms], control=f(design.control),
                               groups={f(g): [f(a) for a in m] for g, m in design.groups.items()} if design.groups else None,
                               decide=[f(a) for a in design.decide] if design.decide else None)


def measure_sweep_design(sweep: SweepDesign, by_id: dict, suffix: str, run_dir, info=None) -> dict:
    """Run a sweep's design and turn each arm into its point's result.

    Args:
        sweep: the :class:`SweepDesign`.
        by_id: ``{point id (with suffix): point}``.
        suffix: the point ids' suffix of a changed config (``--allow-changed``), "" otherwise.
        run_dir: the run folder (rounds stored and resumed there).
        info: the model's info (its device: the peak-memory window around each measurement).

    Returns:
        ``{point id: PointResult}``: the arm's requests over the rounds (``repeat`` = round), ``wall_s`` the sum of its
        measurements' wall times, ``warmup_s``, ``extra`` (:meth:`DesignResult.point_columns` of every outcome, then
        the sweep's ``extra``), ``contamination`` (others' load over the whole design) and ``device`` (the arm's
        largest peak memory). With ``sweep.unit_of``: ``{(arm, round): PointResult}`` of every measurement taken
        (the A/A arm's under :data:`AA`), each with its own requests, wall time and :attr:`Measured.extra`. The
        :class:`DesignResult` under ``"__result__"``.
    """
    from workbench.measure import contention, device
    from workbench.run.point_result import PointResult

    per_run = sweep.unit_of is not None          # arms are the experiment's keys, each measurement a point
    design = sweep.design if per_run else _suffixed(sweep.design, suffix)
    point = (lambda arm: arm) if per_run else (lambda arm: by_id[arm])
    dev = getattr(info, "device", None)
    peaks: dict = {}

    def measure(arm, rnd):
        if dev is not None:
            device.reset_peak_memory(dev)
        got = sweep.measure(point(arm), rnd)
        if dev is not None:
            peak, method = device.peak_memory_bytes(dev)
            old = peaks.get(arm, (None, method))[0]
            peaks[arm] = (peak if old is None or (peak is not None and peak > old) else old, method)
        return got

    prepare = (lambda arm: sweep.prepare(point(arm))) if sweep.prepare is not None else None
    measure_aa = (lambda arm, rnd: sweep.measure_aa(point(arm), rnd)) if sweep.measure_aa is not None else None
    load = contention.LoadMonitor()
    result = run_design(design, measure, prepare, run_dir=run_dir, measure_aa=measure_aa)
    contamination = load.stop()
    remember_spread(result, run_dir)
    if per_run:
        out = _run_results(sweep, result, peaks, contamination)
        out["__result__"] = result
        return out
    out = {}
    for arm in design.arms:
        rows = result.table[result.table["arm"] == str(arm)]
        cols = _decision_columns(result, arm)
        if sweep.extra is not None:
            cols.update(sweep.extra(arm, result))
        peak = peaks.get(arm)
        out[arm] = PointResult(requests=result.requests.get(arm, []), wall_s=float(rows["wall_s"].sum()),
                               warmup_s=result.warmup_s.get(arm), extra=cols, contamination=dict(contamination),
                               device={"peak_memory_bytes": peak[0], "peak_memory_method": peak[1]} if peak else {})
    out["__result__"] = result
    return out


def _decision_columns(result: DesignResult, arm) -> dict:
    """An arm's decision columns: the primary outcome's, then each secondary outcome's own ratio columns only."""
    cols = result.point_columns(arm)
    for o in result.design.secondary:
        cols.update({k: v for k, v in result.point_columns(arm, o).items() if k.startswith(o.prefix)})
    return cols


def _run_results(sweep: SweepDesign, result: DesignResult, peaks: dict, contamination: dict) -> dict:
    """``{(arm, round): PointResult}`` of a design whose every measurement is a point (``unit_of``): the round's
    requests and wall time, the measurement's own ``extra`` (:attr:`Measured.extra`: a run's own columns) with the
    arm's decision columns (the A/A arm's: its decision against the control); the warm-up is the measurement's own
    (``warmup_s`` in its extra: a fresh engine per run), else ``prepare``'s on the arm's first round."""
    from workbench.run.point_result import PointResult

    keys = {str(a): a for a in result.design.arms}
    decisions = {a: _decision_columns(result, a) for a in [*result.design.arms, *([AA] if result.design.aa else [])]}
    if sweep.extra is not None:
        for a in result.design.arms:
            decisions[a].update(sweep.extra(a, result))
    requests: dict = {}
    for arm, recs in result.requests.items():
        for rec in recs:
            requests.setdefault((arm, int(rec["repeat"])), []).append(rec)
    out = {}
    first = {}
    for row in result.table.sort_values("round").to_dict("records"):
        arm = keys.get(row["arm"], row["arm"])
        rnd = int(row["round"])
        own = json.loads(row["extra"]) if row.get("extra") else {}
        peak = peaks.get(arm if arm != AA else result.design.control)
        warm = result.warmup_s.get(arm) if arm != AA and arm not in first else None
        mine = own.pop("warmup_s", None)
        warm = mine if mine is not None else warm
        first.setdefault(arm, rnd)
        out[(arm, rnd)] = PointResult(requests=requests.get((arm, rnd), []), wall_s=float(row["wall_s"]),
                                      warmup_s=warm, extra={**own, **decisions.get(arm, {})},
                                      contamination=dict(contamination),
                                      device={"peak_memory_bytes": peak[0], "peak_memory_method": peak[1]}
                                      if peak else {})
    return out
