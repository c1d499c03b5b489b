"""Prefix sharing in the scheduling experiment (:mod:`workbench.experiments.scheduling`, notebook ``11_scheduling``):
the multi-turn and shared-prefix points on the ``continuous`` engine with its prefix cache on / off, the prefix
points as one design (:func:`prefix_design`), what sharing saved (:func:`prefix_savings`), its part of the finding
(:func:`prefix_finding`) and its figure."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.experiments.scheduling.runs import (
    PREFIX_AA_ARM,
    PREFIX_DESIGN,
    PREFIX_WORKLOADS,
    SHARING,
    TIME_WORDS,
    designed_arms,
    mean_of,
    positive_values,
    run_statistics,
    usable_runs,
    verdict_word,
)
from workbench.load import senders
from workbench.load.conversations import multiturn, shared_prefix_group
from workbench.load.traces import policy_engine
from workbench.run import design, design_sweep
from workbench.run.point_result import PointResult
from workbench.serving import engine_kinds, options
from workbench.share.figures_serving import prefix_savings_figure
from workbench.stats import evidence
from workbench.stats.classes import cache_columns, served_rows

if TYPE_CHECKING:
    from workbench.experiments.scheduling import Config


def prefix_sharing_available() -> bool:
    """Whether the engine options have the ``continuous`` engine's ``prefix_sharing`` switch
    (:class:`workbench.serving.options.EngineOptions`; added by issue 23's prefix sharing)."""
    return "prefix_sharing" in {f.name for f in dataclasses.fields(options.EngineOptions)}


def _prefix_engine(loaded, cfg: Config, prefix_sharing: bool, max_seq_tokens: int):
    """The engine of the multi-turn and shared-prefix points: with prefix sharing in ``multiturn_prefix_sharing`` the
    ``continuous`` engine with its prefix cache on / off (the same engine both ways, so only the cache differs);
    otherwise ``cfg.engine`` under ``fcfs``."""
    if any(cfg.multiturn_prefix_sharing):
        return engine_kinds.make_engine(cfg.engine_options_for("continuous", max_seq_tokens=max_seq_tokens,
                                                              prefix_sharing=prefix_sharing), loaded, None, cfg.settings())
    return policy_engine(loaded, cfg, "fcfs")


def multiturn_point(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """``conversations`` conversations at once, ``turns`` turns each: turn ``k`` sends the whole history (each
    earlier user message and a fixed assistant reply of ``short_max_tokens`` words), so its prompt grows turn
    by turn (:func:`workbench.load.conversations.multiturn`). Rows: ``conversation``, ``turn`` (from 1), the
    engine sender's figures."""
    ctx = (max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 16) * (cfg.turns + 1) + cfg.shared_prefix_tokens + 64
    eng = _prefix_engine(loaded, cfg, prefix_sharing, ctx)
    send = senders.engine_sender(eng, loaded.tokenizer, cfg.settings())
    try:
        rows, warmup_s, t0 = multiturn(send, loaded.tokenizer, conversations=cfg.conversations, turns=cfg.turns,
                                       prompt_tokens=cfg.short_prompt_tokens[0], max_tokens=cfg.short_max_tokens,
                                       shared_prefix_tokens=cfg.shared_prefix_tokens, warmup=cfg.warmup,
                                       max_wait_s=cfg.max_wait_s)
    finally:
        eng.stop()
    return _prefix_point("multiturn", cfg, prefix_sharing, rows, warmup_s, t0)


def shared_prefix_point(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """A shared-prefix group: ``prefix_group_requests`` requests, one after another (each sent when the previous
    one ended: a closed loop, so a request's prefix pages are complete before the next one looks for them), each
    opening with the same system document of ``shared_prefix_tokens`` tokens and asking its own question of
    ``short_prompt_tokens[0]`` tokens (many users of one system prompt or one document;
    :func:`workbench.load.conversations.shared_prefix_group`). Rows: ``conversation`` (the request's index) and
    ``turn`` 1, the engine sender's figures."""
    eng = _prefix_engine(loaded, cfg, prefix_sharing,
                         cfg.shared_prefix_tokens + max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 64)
    send = senders.engine_sender(eng, loaded.tokenizer, cfg.settings())
    try:
        rows, warmup_s, t0 = shared_prefix_group(send, loaded.tokenizer, requests=cfg.prefix_group_requests,
                                                 prefix_tokens=cfg.shared_prefix_tokens,
                                                 prompt_tokens=cfg.short_prompt_tokens[0],
                                                 max_tokens=cfg.short_max_tokens, warmup=cfg.warmup)
    finally:
        eng.stop()
    return _prefix_point("shared_prefix", cfg, prefix_sharing, rows, warmup_s, t0)


def _prefix_point(profile: str, cfg: Config, prefix_sharing: bool, rows: list, warmup_s: float,
                  t0: float) -> PointResult:
    """A multi-turn or shared-prefix point: its rows, the wall time since ``t0`` and the cache columns."""
    wall = time.perf_counter() - t0
    extra = {"profile": profile, "stopped_early": False, "offered_rps": float("nan"),
             **cache_columns(pd.DataFrame(rows), prefix_sharing)}
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s if cfg.warmup else None, extra=extra)


def prefix_design(loaded, cfg: Config) -> design_sweep.SweepDesign:
    """The prefix points as one design: per prefix workload (``multiturn``, ``shared_prefix``) the arms
    ``<workload>_off`` (its control) and ``<workload>_on``, the first workload's ``off`` again as the A/A arm (with
    ``aa_control``); one run of the workload per arm and round on a fresh ``continuous`` engine with its prefix cache
    off / on (:func:`multiturn_point`, :func:`shared_prefix_point`), one point per run. Outcome: :data:`SHARING`
    (the run's mean TTFT).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    workloads = cfg.prefix_workloads()
    arms = [f"{w}_{side}" for w in workloads for side in ("off", "on")]

    def measure(arm, rnd):
        workload, side = arm.rsplit("_", 1)
        res = (multiturn_point if workload == "multiturn" else shared_prefix_point)(loaded, cfg, side == "on")
        served = served_rows(pd.DataFrame(res.requests))
        values = positive_values({SHARING.name: mean_of(served.get("ttft_s", []))}, f"{arm} round {rnd}")
        return design.Measured(values, res.requests, res.wall_s, {**res.extra, "warmup_s": res.warmup_s})

    def unit_of(p):
        if p.get("workload") not in PREFIX_WORKLOADS:
            return None
        return (design.AA if p["arm"] == PREFIX_AA_ARM else f"{p['workload']}_{p['arm']}"), int(p["replicate"])

    d = design.Design(PREFIX_DESIGN, arms, arms[0], SHARING, groups={f"{w}_off": [f"{w}_on"] for w in workloads},
                      aa=cfg.aa_control, **cfg.design_kwargs(prefix=True))
    return design_sweep.SweepDesign(d, measure, unit_of=unit_of)


def prefix_savings(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What prefix sharing saved, per prefix workload (``multiturn``, ``shared_prefix``) measured with sharing off and
    on (usable points only).

    The run is the unit: the ratio is the prefix design's (:func:`prefix_design`: the runs' mean TTFT with sharing on
    over off, rounds as blocks, its simultaneous interval and verdict); beside it the cache hit rates over the runs'
    served requests (:func:`workbench.stats.classes.cache_columns`) and each side's mean run TTFT. Measured without a
    design (one round) the ratio is the one pair's, undecided.

    Returns:
        One row per workload: ``workload``, ``rounds``, ``cache_hit_rate_off`` / ``cache_hit_rate_on``,
        ``ttft_s_mean_off`` / ``ttft_s_mean_on`` (the mean over its runs of the run's mean TTFT, s),
        ``ttft_saved_s`` (off - on, s), ``sharing_ttft_ratio`` (on / off) with ``_low`` / ``_high``, ``verdict``
        (``saves`` / ``costs`` / ``equivalent`` / ``undecided``), ``method`` and ``design``. Empty when no workload has
        both sides.
    """
    cols = ["workload", "rounds", "cache_hit_rate_off", "cache_hit_rate_on", "ttft_s_mean_off", "ttft_s_mean_on",
            "ttft_saved_s", "sharing_ttft_ratio", "sharing_ttft_ratio_low", "sharing_ttft_ratio_high", "verdict",
            "method", "design"]
    stats = run_statistics(points, requests)
    stats = stats[stats["workload"].isin(PREFIX_WORKLOADS)]
    designed = designed_arms(points, SHARING, PREFIX_WORKLOADS)
    out = []
    for w, g in stats.groupby("workload", sort=False):
        on, off = g[g["arm"] == "on"], g[g["arm"] == "off"]
        if on.empty or off.empty:
            continue
        req = served_rows(requests[requests["point_id"].isin(g["point_id"])])
        hit = {side: cache_columns(req[req["point_id"].isin(part["point_id"])], side == "on")["cache_hit_rate"]
               for side, part in (("off", off), ("on", on))}
        m_off, m_on = float(off[SHARING.name].mean()), float(on[SHARING.name].mean())
        row = designed.loc[f"{w}_on"] if f"{w}_on" in designed.index else None
        d = design.decision_from_row(row, SHARING) if row is not None else None
        nan = float("nan")
        out.append({"workload": w, "rounds": int(row["rounds"]) if row is not None else int(min(len(on), len(off))),
                    "cache_hit_rate_off": hit["off"], "cache_hit_rate_on": hit["on"], "ttft_s_mean_off": m_off,
                    "ttft_s_mean_on": m_on, "ttft_saved_s": m_off - m_on,
                    "sharing_ttft_ratio": d.estimate if d is not None else (m_on / m_off if m_off > 0 else nan),
                    "sharing_ttft_ratio_low": d.low if d is not None else nan,
                    "sharing_ttft_ratio_high": d.high if d is not None else nan,
                    "verdict": {"faster": "saves", "slower": "costs"}.get(verdict_word(d), verdict_word(d)),
                    "method": d.method if d is not None else "one round: nothing decided (the run is the unit)",
                    "design": str(row["design"]) if row is not None else ""})
    return pd.DataFrame(out, columns=cols)


def prefix_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding | None:
    """The prefix-sharing part of the finding: per workload the cache hit rate next to the run TTFT ratio on / off
    with its decision (:func:`prefix_savings`, the prefix design: a direction, equivalent, or undecided with the rounds
    it would take); undecided when sharing was measured off and on but no such pair of points is usable (invalid
    points) or with one round; None when no workload was measured both ways. Its verdict is the first workload's."""
    sav = prefix_savings(points, requests)
    if sav.empty:
        if not _measured_both_ways(points):
            return None
        return evidence.Finding("Prefix sharing: undecided: no usable pair of points with sharing off and on; "
                                f"{evidence.rerun_invalid()}.",
                                "the prefix points are invalid or failed", False, (), verdict="undecided")
    designed = designed_arms(points, SHARING, PREFIX_WORKLOADS)
    parts, fields = [], None
    for r in sav.itertuples():
        hit = "n/a" if r.cache_hit_rate_on != r.cache_hit_rate_on else f"{r.cache_hit_rate_on:.0%}"
        row = designed.loc[f"{r.workload}_on"] if f"{r.workload}_on" in designed.index else None
        d = design.decision_from_row(row, SHARING) if row is not None else None
        what = (d.describe("run TTFT on / off", words=TIME_WORDS,
                           seconds_per_round=checks.float_or_nan(row.get("seconds_per_round")))
                if d is not None else f"run TTFT on / off {r.sharing_ttft_ratio:.2f}x: undecided: one round (the run "
                                      f"is the unit: one pair of runs decides nothing)")
        parts.append(f"{r.workload.replace('_', '-')}: cache hit rate {hit} with sharing on, {what}")
        if fields is None:
            fields = design.finding_fields(row, d) if d is not None else {"verdict": "undecided"}
            if row is not None and row.get("aa_verdict") == "direction":
                parts[-1] += " (the A/A control moved: sharing off against itself shows a direction)"
                fields["verdict"] = "undecided"
    use = usable_runs(points)
    ids = evidence.point_ids(use[use.get("workload", pd.Series(dtype=str)).isin(PREFIX_WORKLOADS)])
    ev = "; ".join(f"{r.workload}: {r.rounds} rounds, each one run with sharing off and one on (a fresh engine each), "
                   f"{r.method}" for r in sav.itertuples())
    first = designed.iloc[0] if len(designed) else None
    if first is not None:
        ev += f"; {design.evidence_text(first)}"
    return evidence.Finding("Prefix sharing (continuous engine, on vs off, the run as the unit): " + "; ".join(parts)
                            + ".", ev, False, ids, **fields)


def _measured_both_ways(points: pd.DataFrame) -> bool:
    """Whether some prefix workload has points with sharing off and on (usable or not)."""
    if points is None or points.empty or not {"workload", "prefix_sharing"} <= set(points.columns):
        return False
    pre = points[points["workload"].isin(PREFIX_WORKLOADS)]
    return any(g["prefix_sharing"].fillna(False).astype(bool).nunique() == 2 for _, g in pre.groupby("workload"))


def prefix_cache_savings(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Cache hit rate with prefix sharing on against the run TTFT ratio on / off (the prefix design's simultaneous
    interval as the bar), one marker per prefix workload, its verdict and rounds in the label
    (:func:`prefix_savings`)."""
    return prefix_savings_figure(prefix_savings(points, requests), _measured_both_ways(points))
