"""The scheduling policies as one design (:mod:`workbench.experiments.scheduling`, notebook ``11_scheduling``):
the mixed workload's calibration and point columns, :func:`policy_design`, its A/A control, the closing table
(:func:`recommend`), the policies' part of the finding (:func:`policy_finding`) and their figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.experiments.scheduling.runs import (
    AA_ARM,
    BACKGROUND,
    CONTROL,
    EXPERIMENT,
    INTERACTIVE,
    TIME_WORDS,
    designed_arms,
    positive_values,
    run_statistics,
    run_values,
    usable_runs,
    verdict_word,
)
from workbench.load.traces import calibrate, run_policy, trace_rows
from workbench.run import design, design_sweep
from workbench.serving import scheduling
from workbench.share import figures_design
from workbench.share.plots import table_figure
from workbench.stats import blocks, evidence
from workbench.stats.classes import class_columns

if TYPE_CHECKING:
    from workbench.experiments.scheduling import Config


def calibration(loaded, cfg: Config, state: dict) -> dict:
    """The run's calibration (:func:`calibrate`), measured once and kept in ``state``."""
    if "calibration" not in state:
        state["calibration"] = calibrate(loaded, cfg)
    return state["calibration"]


def mixed_columns(cfg: Config, cal: dict, rows: list, res) -> dict:
    """A mixed run's point columns: its load summary, the offered rate, each class's service alone and the class
    columns (:func:`workbench.stats.classes.class_columns`)."""
    extra = {k: v for k, v in res.summary.items() if k not in ("wall_s", "rate", "concurrency")}
    extra.update(offered_rps=cal["rate_rps"], **{f"alone_s_{c}": v for c, v in cal["alone_s"].items()},
                 **class_columns(pd.DataFrame(rows), cfg.class_slo_ttft_s, res.summary["window_s"]))
    return extra


def policy_design(loaded, cfg: Config, state: dict) -> design_sweep.SweepDesign:
    """The policies as one design (:mod:`workbench.run.design`, module docstring): the arms are ``cfg.policies``,
    ``fcfs`` the marked control and, with ``aa_control``, the A/A arm; arm ``a`` in round ``k`` replays the trace of
    arrival seed ``seed + k`` (:func:`workbench.load.traces.trace_rows`, its class mix exact) on a fresh engine
    under policy ``a`` (:func:`workbench.load.traces.run_policy`), one point per run (``unit_of``: the ``mixed``
    points' ``(arm, replicate)``). Outcomes per run: :data:`INTERACTIVE` (primary), :data:`BACKGROUND`.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    def measure(policy, rnd):
        cal = calibration(loaded, cfg, state)
        rows, res, warmup_s = run_policy(loaded, cfg, policy, trace_rows(cfg, cal["rate_rps"], rnd), cal["alone_s"])
        values = positive_values(run_values(rows), f"{policy} round {rnd}")
        return design.Measured(values, rows, res.summary["wall_s"],
                               {**mixed_columns(cfg, cal, rows, res), "warmup_s": warmup_s})

    def unit_of(p):
        if p.get("workload") != "mixed":
            return None
        return (design.AA if p["arm"] == AA_ARM else p["arm"]), int(p["replicate"])

    d = design.Design(EXPERIMENT, list(cfg.policies), CONTROL, INTERACTIVE, (BACKGROUND,), aa=cfg.aa_control,
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, unit_of=unit_of)


def aa_control(points: pd.DataFrame, requests: pd.DataFrame | None = None) -> dict | None:
    """The policy design's A/A control (fcfs against itself): ``aa_ratio``, ``aa_low``, ``aa_high``, ``aa_verdict``,
    ``design`` and ``rounds`` from its points (every finished one: the design's record, whatever a point's
    validity); None when the run had no such design (one round, no A/A arm)."""
    rows = designed_arms(points, INTERACTIVE, ("mixed",), usable=False)
    if rows.empty or AA_ARM not in rows.index:
        return None
    r = rows.loc[AA_ARM]
    return {"aa_ratio": float(r["aa_ratio"]), "aa_low": float(r["aa_low"]), "aa_high": float(r["aa_high"]),
            "aa_verdict": str(r.get("aa_verdict") or ""), "design": str(r["design"]), "rounds": int(r["rounds"])}


def recommend(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The closing table: per policy its interactive TTFT and background e2e against ``fcfs`` (the class means per
    run, the run as the unit) with the policy design's simultaneous intervals and verdicts (:func:`policy_design`),
    the longest wait and the A/A control. A policy is recommended when its interactive TTFT is lower than fcfs's
    beyond noise and the A/A control did not move. Measured without a design (one round) the ratios are the one pair
    of runs', undecided. Usable points only (:func:`workbench.stats.evidence.usable_points`, serving rules).

    Returns:
        One row per policy: ``policy``, ``interactive_ttft_ratio`` with ``_low`` / ``_high`` and
        ``interactive_verdict``, ``background_e2e_ratio`` with ``_low`` / ``_high`` and ``background_verdict``
        (``faster`` / ``slower`` / ``equivalent`` / ``undecided``), ``queue_s_max``, ``rounds``, ``level``,
        ``recommended``, ``verdict`` and the A/A columns ``aa_ratio``, ``aa_low``, ``aa_high``, ``aa_verdict``,
        ``design``.
    """
    stats = run_statistics(points, requests)
    mixed = stats[stats["workload"] == "mixed"]
    if CONTROL not in set(mixed["arm"]):
        return pd.DataFrame()
    designed = designed_arms(points, INTERACTIVE, ("mixed",))
    aa = aa_control(points) or {"aa_ratio": np.nan, "aa_low": np.nan, "aa_high": np.nan, "aa_verdict": "",
                                "design": "", "rounds": 0}
    moved = aa["aa_verdict"] == "direction"
    use = usable_runs(points)
    first = mixed[mixed["replicate"] == mixed["replicate"].min()].groupby("arm").first()
    nan = float("nan")
    out = []
    for p in [a for a in dict.fromkeys(mixed["arm"]) if a not in (CONTROL, AA_ARM)]:
        row = designed.loc[p] if p in designed.index else None
        d = design.decision_from_row(row, INTERACTIVE) if row is not None else None
        b = design.decision_from_row(row, BACKGROUND) if row is not None else None
        if d is None:   # one round: the one pair of runs, nothing decided
            one = {k: first.loc[p, k] / first.loc[CONTROL, k] if p in first.index and first.loc[CONTROL, k] > 0
                   else nan for k in (INTERACTIVE.name, BACKGROUND.name)}
        verdict = verdict_word(d) if d is not None else "one round: undecided"
        if moved and d is not None:
            verdict = "undecided: the A/A control moved"
        qmax = pd.to_numeric(use[use.get("policy", pd.Series(dtype=str)) == p].get("queue_s_max"), errors="coerce")
        out.append({"policy": p, "interactive_ttft_ratio": d.estimate if d else one[INTERACTIVE.name],
                    "interactive_ttft_ratio_low": d.low if d else nan, "interactive_ttft_ratio_high": d.high if d else nan,
                    "interactive_verdict": verdict_word(d),
                    "background_e2e_ratio": b.estimate if b else one[BACKGROUND.name],
                    "background_e2e_ratio_low": b.low if b else nan, "background_e2e_ratio_high": b.high if b else nan,
                    "background_verdict": verdict_word(b),
                    "queue_s_max": float(qmax.max()) if qmax is not None and qmax.notna().any() else nan,
                    "rounds": int(row["rounds"]) if row is not None else int(mixed["replicate"].nunique()),
                    "level": d.level if d else nan, "recommended": verdict == "faster", "verdict": verdict,
                    "aa_ratio": aa["aa_ratio"], "aa_low": aa["aa_low"], "aa_high": aa["aa_high"],
                    "aa_verdict": aa["aa_verdict"], "design": aa["design"]})
    return pd.DataFrame(out)


def policy_finding(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> evidence.Finding:
    rec = recommend(points, requests)
    use = usable_runs(points)
    use = use[use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"] if not use.empty else use
    ids = evidence.point_ids(use)
    n = int(len(requests[requests["point_id"].isin(use["point_id"])])) if "point_id" in requests and len(use) else 0
    if rec.empty:
        mixed = points[points["workload"] == "mixed"] if "workload" in points else points
        why = f": {evidence.none_valid(mixed, run_dir)}" if len(mixed) and use.empty else ""
        return evidence.Finding(f"Scheduling: undecided: no usable fcfs and policy points to compare{why}.",
                                f"{len(use)} usable points", False, ids, verdict="undecided")
    waits = "; ".join(f"{r.policy}: longest wait {r.queue_s_max:.2f} s" for r in rec.itertuples()
                      if r.queue_s_max == r.queue_s_max)
    designed = designed_arms(points, INTERACTIVE, ("mixed",))
    if not designed_arms(points, INTERACTIVE, ("mixed",), usable=False).empty and CONTROL not in designed.index:
        invalid = evidence.any_invalid(points)
        return evidence.Finding("Scheduling: undecided: no usable fcfs run of the policy design (marked invalid: "
                                "other load, drift or stopped early)"
                                f"{'; ' + evidence.rerun_invalid(run_dir) if invalid else ''}.",
                                f"{len(use)} usable runs", False, ids, verdict="undecided")
    if designed.empty or CONTROL not in designed.index:
        parts = [f"{r.policy}: interactive TTFT {r.interactive_ttft_ratio:.2f}x of fcfs, background e2e "
                 f"{r.background_e2e_ratio:.2f}x (one run each)" for r in rec.itertuples()]
        return evidence.Finding("Scheduling: undecided: one round (each policy ran once; the run is the unit under a "
                                "queue, so one pair of runs decides nothing): " + "; ".join(parts) + ".",
                                f"{len(use)} usable runs, {n} requests" + (f"; {waits}" if waits else ""), False, ids,
                                verdict="undecided")
    ctrl = designed.loc[CONTROL]
    per = checks.int_or(ctrl.get("requests_planned"), 0)
    rate = checks.float_or_nan(ctrl.get("offered_rps"))
    setting = f"{int(ctrl['rounds'])} rounds of {per} requests at {rate:.2f} req/s, a fresh engine per run"
    decisions = {p: design.decision_from_row(designed.loc[p], INTERACTIVE) for p in rec["policy"] if p in designed.index}
    decisions = {p: d for p, d in decisions.items() if d is not None}
    secs = checks.float_or_nan(ctrl.get("seconds_per_round"))
    est = {p: d.estimate for p, d in decisions.items() if d is not None and d.estimate == d.estimate}
    pick = min(est, key=est.get) if est else None
    def clause(p, d, name):
        b = design.secondary_clause(designed.loc[p], BACKGROUND, "background e2e", TIME_WORDS)  # no rounds estimate
        return d.describe(name, words=TIME_WORDS, seconds_per_round=secs) + ("; " + b if b is not None else "")

    clauses = [clause(p, d, f"{p} vs fcfs, interactive TTFT") for p, d in decisions.items()]
    if pick is not None and est[pick] < 1:
        d = decisions[pick]
        row = designed.loc[pick]
        fields = design.finding_fields(row, d)
        lead = (f"For interactive traffic mixed with long reports ({setting}), {pick} against fcfs: "
                + "; ".join([clause(pick, d, "interactive TTFT (the class's mean per run)")]
                            + [c for q, c in zip(decisions, clauses) if q != pick]) + ".")
        rest = sorted((q for q in est if q != pick), key=est.get)
        said, open_ = design.versus_runner_up(run_dir, EXPERIMENT, INTERACTIVE.name, pick, rest[0] if rest else None,
                                              rest[0] if rest else "", d, row, TIME_WORDS)
        lead += said
        fields = open_ or fields
    else:   # fcfs kept: a verdict only when every policy is slower beyond noise or equivalent
        first = designed.loc[next(iter(decisions))] if decisions else ctrl
        fields = design.finding_fields(first)
        fields["verdict"], _ = blocks.keep_control(list(decisions.values()), INTERACTIVE.higher_is_better)
        keep = fields["verdict"] != "undecided"
        lead = (f"For interactive traffic mixed with long reports ({setting}): keep fcfs: "
                + ("every policy is slower beyond noise or equivalent" if keep else
                   "no policy shown faster, but not every one is decided slower or equivalent")
                + ". " + "; ".join(clauses) + ".")
    aa = aa_control(points)
    if aa is not None and aa["aa_verdict"] == "direction":
        lead += " The A/A control moved (fcfs against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    method = next((d.method for d in decisions.values() if d is not None), "")
    ev = (f"{len(use)} usable runs, {n} requests; per run the interactive class's mean TTFT and the background class's "
          f"mean e2e; {design.evidence_text(ctrl)}; {method}" + (f"; {waits}" if waits else ""))
    return evidence.Finding(lead, ev, False, ids, **fields)


def policy_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each policy's interactive TTFT over fcfs's with the simultaneous interval its verdict was read from, each
    round's ratio faint (the design's table), the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    rows = designed_arms(points, INTERACTIVE, ("mixed",))
    rows = rows[rows.index != AA_ARM].reset_index()
    order = {p: i for i, p in enumerate(scheduling.POLICIES)}
    df = rows.assign(point_id=rows["_arm"], policy_order=rows["_arm"].map(order))
    fig = figures_design.ratio_figure(df, "policy_order", INTERACTIVE.prefix,
                                      figures_design.round_ratios(run_dir, EXPERIMENT, INTERACTIVE.name),
                                      name="interactive TTFT ratio", x_title="policy",
                                      y_title="interactive TTFT (class mean per run) / fcfs's (x)",
                                      title="Interactive TTFT against fcfs, the run as the unit (simultaneous 95% "
                                            "intervals; faint: each round; grey band: the A/A control)")
    fig.update_xaxes(tickmode="array", tickvals=list(order.values()), ticktext=list(order))
    return fig


def recommendation_table(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """The :func:`recommend` table as a figure."""
    rec = recommend(points, requests)
    why = ""
    if rec.empty:
        mixed = points[points.get("workload", pd.Series(dtype=str)) == "mixed"] if not points.empty else points
        usable = evidence.usable_points(mixed, serving=True) if not mixed.empty else mixed
        arms = set(usable.get("policy", pd.Series(dtype=str)).dropna())
        why = ("no mixed-workload point measured" if mixed.empty else
               f"no usable fcfs run of the mixed workload to compare with ({len(mixed) - len(usable)} of {len(mixed)} "
               "mixed points invalid or stopped early)" if "fcfs" not in arms else
               "only fcfs measured: no policy to compare with it")
    return table_figure(rec, "Policy per workload: interactive TTFT and its cost to background requests (vs fcfs)",
                        empty_reason=why)
