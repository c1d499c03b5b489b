"""The summaries and the finding of the serving-load experiment (:mod:`workbench.experiments.serving_load`, notebook
``08_serving_load``), from its points.

The sweep's: :func:`kept_up` and :func:`recommend` (their one definition is :mod:`workbench.load.saturation`'s),
:func:`aa_control` (the A/A control's columns), :func:`headline` and :func:`sweep_finding`. The engine comparison's:
:func:`compared` (its runs, one row per arm) and :func:`engines_finding`. :func:`finding` joins the two. The
experiment re-exports them all.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import checks
from workbench.experiments.serving_load.runs import COMPARE_FILE, COMPARISON, EXPERIMENT, THROUGHPUT, TTFT
from workbench.load import saturation
from workbench.load.saturation import knee_points, knee_scan, point_rates
from workbench.run import design
from workbench.share.plots import ok_points
from workbench.stats import blocks, evidence, replicates

KEPT_UP_TOLERANCE = saturation.KEPT_UP_TOLERANCE
kept_up = saturation.kept_up  # the one definition (knee, recommendation, finding, figures, search)
recommend = saturation.recommend  # beside the knees, where the twin's validation reads it too


def aa_control(points: pd.DataFrame, column: str = "ttft_s_p90") -> dict | None:
    """The A/A control: the first engine's open-loop points measured twice per round (arms ``main`` and ``aa``, the
    same rates and seeds, a fresh engine per run), ``column`` (a per-run statistic; ``ttft_s_p50`` when no run has
    the samples for a p90) paired by (rate step, round): :func:`workbench.stats.replicates.aa_columns` (``aa_ratio``,
    ``aa_low``, ``aa_high``, ``design`` ``replicates``, ``rounds`` the pairs) and ``statistic``. None without an
    A/A arm. Valid open-loop points only (stopped-early ones included: the
    statistic of a run is what it is)."""
    if points is None or points.empty or "arm" not in points or column not in points:
        return None
    df = knee_points(points)
    if not (df["arm"] == "aa").any():
        return None
    if df[column].isna().all() and column == "ttft_s_p90" and "ttft_s_p50" in df:
        column = "ttft_s_p50"  # p90 needs 10 independent samples per run
    key = ["engine", "step", "replicate"]
    a = df[df["arm"] == "aa"].groupby(key)[column].first().dropna()
    b = df[df["arm"] == "main"].groupby(key)[column].first().dropna()
    both = a.index.intersection(b.index)
    return dict(replicates.aa_columns(a.loc[both], b.loc[both], "replicates"), statistic=column)


def _attained(r, target: float) -> str:
    """``custom-SLO attainment 1.00 (95% Wilson interval 0.76-1.00)`` of a point row."""
    lo, hi = r.get("slo_attainment_low", np.nan), r.get("slo_attainment_high", np.nan)
    ci = f"95% Wilson interval {lo:.2f}-{hi:.2f}" if lo == lo and hi == hi else "no interval"
    return f"custom-SLO attainment {r.get('slo_attainment', np.nan):.2f} ({ci})"


def _engine_sentence(e: str, g: pd.DataFrame, knee: float, why: str, target: float) -> str:
    """One engine's part of the finding: how far it kept up (three-valued, :func:`kept_up`), the attainment there
    and at the rate that stopped the scan."""
    g = g.assign(_rate=point_rates(g)).sort_values("_rate")
    verdicts = [kept_up(r) for _, r in g.iterrows()]
    if knee == knee:
        at = g[g["_rate"] == knee].iloc[-1]
        text = f"{e}: kept up to {knee:.2f} req/s, {_attained(at, target)} there"
    elif verdicts and verdicts[0] == saturation.UNDETERMINED:
        first = g.iloc[0]
        lo, hi = first.get("backlog_growth_low", np.nan), first.get("backlog_growth_high", np.nan)
        band = (f": its backlog grew {lo:.0%} to {hi:.0%} of arrivals, across the {saturation.KEPT_UP_TOLERANCE:.0%} "
                f"line" if lo == lo and hi == hi else "")
        text = f"{e}: whether it kept up is undetermined even at its lowest open-loop rate (too few requests " \
               f"per point to tell{band}; more requests per point decide)"
    else:
        text = f"{e}: did not keep up even at its lowest open-loop rate"
    nxt = [(r, v) for (_, r), v in zip(g.iterrows(), verdicts) if knee != knee or r["_rate"] > knee][:1]
    if nxt and nxt[0][1] == saturation.FELL_BEHIND:
        r = nxt[0][0]
        comp = r.get("completion_rps", r.get("request_throughput_rps", np.nan))
        how = "stopped early (over-saturated)" if bool(r.get("stopped_early") or False) else \
            f"completions fell behind ({comp:.2f} req/s completed)"
        text += f"; at {r['offered_rps']:.2f} req/s {how}"
        if not bool(r.get("stopped_early") or False):
            text += (f" while {_attained(r, target)} stayed at target: the queue grew within the SLO's slack"
                     if r.get("slo_attainment", np.nan) >= target else f", {_attained(r, target)}")
    elif nxt and knee == knee:
        text += f"; undetermined at {nxt[0][0]['offered_rps']:.2f} req/s"
    return text


def headline(points: pd.DataFrame, target: float = 0.9) -> str:
    """The finding: the recommended engine for the custom SLO (:func:`recommend`) first when there is one, then per
    engine the highest open-loop rate that kept up (:func:`kept_up`, the knee) with the custom SLO's attainment
    there and at the first rate past it; each with its evidence: requests planned per point and attainment with its Wilson 95%
    interval. Only usable points of the sweep count (valid, open-loop, not stopped early; the engine comparison's runs
    are :func:`engines_finding`'s); how many others were left out is said."""
    points = saturation.sweep_points(points)
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        invalid = evidence.any_invalid(points)   # stopped early: re-measuring won't help
        return ("No usable open-loop load point (valid, not stopped early): no knee or recommendation is "
                f"supported{'; ' + evidence.rerun_invalid() if invalid else ''}." if len(points)
                else "No load point finished.")
    k = knee_scan(points)
    parts = [_engine_sentence(e, g, *k.get(e, (float("nan"), "")), target)
             for e, g in knee_points(points).groupby("engine")]
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    if not custom.empty and custom.iloc[0]["engine"]:
        c = custom.iloc[0]
        ci = (f"95% Wilson interval {c['attainment_low']:.2f}-{c['attainment_high']:.2f}"
              if c["attainment_low"] == c["attainment_low"] else "no interval")
        # the claim the mark rests on leads (its first clause is the finding's headline); the knees follow
        parts.insert(0, f"custom SLO: {c['engine']} up to {c['max_rate_rps']:.2f} req/s ({c['goodput_rps']:.2f} "
                     f"req/s goodput; attainment {c['attainment']:.2f}, {ci}, one-sided 95% lower bound "
                     f"{c['attainment_lower']:.2f} >= {target:.2f}, {c['requests']} requests)")
    elif not custom.empty and str(custom.iloc[0]["verdict"]).startswith("missed"):
        parts.append(f"no engine met the custom SLO (attainment >= {target:.0%}: every usable rate's one-sided 95% "
                     f"upper bound below it)")
    elif not custom.empty:
        parts.append(f"no rate is shown to meet the custom SLO (attainment's one-sided 95% lower bound >= "
                     f"{target:.0%}): {custom.iloc[0]['verdict']}")
    n_req = use["requests_planned_window"] if "requests_planned_window" in use else use.get("requests")
    if n_req is None or n_req.isna().all():
        n_txt = "an unknown number of"
    else:
        n_txt = f"{int(n_req.min())}" + (f"-{int(n_req.max())}" if n_req.min() != n_req.max() else "")
    left = len(ok_points(points)) - len(use)
    tail = (f" Evidence: {len(use)} usable open-loop points of {n_txt} planned requests each"
            + (f"; {left} closed-loop, stopped-early or invalid points left out" if left else "") + ".")
    return "; ".join(parts) + "." + tail


def compared(points: pd.DataFrame, usable: bool = True) -> pd.DataFrame:
    """The engine comparison's runs, one row per arm (its runs carry the same decision), indexed by the engine (the
    A/A arm as ``aa``); ``usable``: valid and finished only. Empty without a comparison."""
    if points is None or points.empty or "comparison" not in points or "design" not in points:
        return pd.DataFrame()
    df = evidence.usable_points(points) if usable else points[points["status"].eq("ok")]
    df = df[df["comparison"].eq(COMPARISON) & df["design"].notna()]
    if df.empty:
        return df
    keys = [("aa" if r.get("arm") == "aa" else r["engine"]) for r in df.to_dict("records")]
    return df.assign(_arm=keys).drop_duplicates("_arm").set_index("_arm")



TIME_WORDS = ("slower", "faster")   # a ratio of times above / below 1


def engines_finding(points: pd.DataFrame, run_dir=None) -> evidence.Finding | None:
    """The engine comparison's finding (module docstring): the pick (the engine with the lowest run TTFT p50) against
    the control with its verdict (a direction, equivalent within the margin, or undecided with the rounds and seconds
    it would take) and its throughput beside, every other engine's verdicts, and the pick against its runner-up
    (Tukey's all-pairs level from the design's table in ``run_dir``: the pick was chosen after looking). The control
    kept is a verdict only when every other engine is slower beyond noise or equivalent; a moved A/A control leaves it
    undecided. None without a comparison.

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict, or None.
    """
    every = compared(points, usable=False)
    if every.empty:
        return None
    rows = compared(points)
    control = next((e for e in every.index if every.loc[e].get(f"{TTFT.prefix}_method") == "the control"), None)
    runs = points[points["comparison"].eq(COMPARISON)]
    ids = evidence.point_ids(evidence.usable_points(runs))
    if control not in rows.index:
        return evidence.Finding(f"Engines under the same load: undecided: no usable run of the control "
                                f"({control or 'unknown'}; marked invalid: other load or drift); "
                                f"{evidence.rerun_invalid(run_dir)}.",
                                f"{len(runs)} runs measured, {len(ids)} usable", False, ids, verdict="undecided")
    ctrl = rows.loc[control]
    decisions = {e: design.decision_from_row(rows.loc[e], TTFT) for e in rows.index if e not in ("aa", control)}
    decisions = {e: d for e, d in decisions.items() if d is not None}
    secs = checks.float_or_nan(ctrl.get("seconds_per_round"))
    setting = (f"{checks.float_or_nan(ctrl.get('offered_rps')):.2f} req/s {ctrl.get('profile')}, "
               f"{checks.int_or(ctrl.get('requests_planned'), 0)} requests a run, {int(ctrl['rounds'])} rounds, a fresh "
               f"engine per run")
    def clause(e, d, name):
        t = design.secondary_clause(rows.loc[e], THROUGHPUT, "output throughput")   # no rounds estimate of its own
        return d.describe(name, words=TIME_WORDS, seconds_per_round=secs) + ("; " + t if t is not None else "")

    clauses = [clause(e, d, f"{e} vs {control}, TTFT p50") for e, d in decisions.items()]
    est = {e: d.estimate for e, d in decisions.items() if d.estimate == d.estimate}
    pick = min(est, key=est.get) if est else None
    if pick is not None and est[pick] < 1:
        d = decisions[pick]
        fields = design.finding_fields(rows.loc[pick], d)
        text = (f"Engines under the same load ({setting}): {pick} against {control}: "
                + "; ".join([clause(pick, d, "TTFT p50 of the run")]
                            + [c for e, c in zip(decisions, clauses) if e != pick]) + ".")
        rest = sorted((e for e in est if e != pick), key=est.get)
        said, open_ = design.versus_runner_up(run_dir, EXPERIMENT, TTFT.name, pick, rest[0] if rest else None,
                                              rest[0] if rest else "", d, rows.loc[pick], TIME_WORDS)
        text += said
        fields = open_ or fields
    else:   # the control kept: a verdict only when every other engine is slower beyond noise or equivalent
        fields = design.finding_fields(rows.loc[next(iter(decisions))] if decisions else ctrl)
        fields["verdict"], _ = blocks.keep_control(list(decisions.values()), TTFT.higher_is_better)
        keep = fields["verdict"] != "undecided"
        text = (f"Engines under the same load ({setting}): keep {control}: "
                + ("every other engine is slower beyond noise or equivalent" if keep else
                   "none shown faster, but not every other engine is decided slower or equivalent")
                + ". " + "; ".join(clauses) + ".")
    if ctrl.get("aa_verdict") == "direction":
        text += f" The A/A control moved ({control} against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    method = next((d.method for d in decisions.values()), "")
    rate = ""
    if run_dir is not None and (Path(run_dir) / COMPARE_FILE).is_file():
        got = json.loads((Path(run_dir) / COMPARE_FILE).read_text(encoding="utf-8"))
        rate = (f"; the rate {got['compare_load']:g} x {got['engine']}'s one-at-a-time "
                f"{got['synchronous_rps']:.2f} req/s (a synchronous probe of {got['requests']} requests)")
    ev = (f"engine comparison: {len(runs)} runs, one statistic each (its TTFT p50; its output tokens over its wall "
          f"time); {design.evidence_text(ctrl)}; {method}{rate}")
    return evidence.Finding(text, ev, False, ids, **fields)


def finding(points: pd.DataFrame, target: float = 0.9, run_dir=None) -> evidence.Finding:
    """The report's finding: with the engine comparison, its verdict first (:func:`engines_finding`: the finding's
    verdict), then the sweep's (:func:`sweep_finding`); without it the sweep's alone."""
    sweep = sweep_finding(points, target)
    engines = engines_finding(points, run_dir)
    return sweep if engines is None else evidence.join([engines, sweep])


def sweep_finding(points: pd.DataFrame, target: float = 0.9) -> evidence.Finding:
    """The sweep's finding: :func:`headline`'s sentences, its evidence apart, and whether they are supported.

    Supported when a recommendation for the custom SLO rests on a usable point whose attainment's one-sided 95%
    lower bound reaches the target (:func:`recommend`), or when every usable point is shown to miss it (upper
    bound below the target); not supported without usable points or when no rate could be judged either way.

    Returns:
        :class:`workbench.stats.evidence.Finding` over the usable points' ids.
    """
    points = saturation.sweep_points(points)
    text = headline(points, target)
    body, _, tail = text.partition(" Evidence: ")
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        return evidence.Finding(body, tail.rstrip("."), False)
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    supported, why = False, "no custom-SLO recommendation"
    if not custom.empty:
        c = custom.iloc[0]
        verdict = str(c["verdict"])
        supported = bool(c["engine"]) or verdict.startswith("missed")
        why = (f"recommended rate {verdict}" if c["engine"] else
               "every usable rate shown to miss the custom SLO" if supported else f"not supported: {verdict}")
    aa = aa_control(points)
    if aa is not None:
        why += (f"; A/A control ({aa['rounds']} run pairs, {aa['statistic']}): "
                f"{replicates.describe(aa['aa_ratio'], aa['aa_low'], aa['aa_high'])}")
        if replicates.aa_moved(aa):
            supported, why = False, why + ": the A/A control moved"
    return evidence.Finding(body if supported or body.startswith("No ") else f"Not supported: {body}",
                            f"{tail.rstrip('.')}; {why} (a rate qualifies on attainment's one-sided 95% lower bound)",
                            supported, evidence.point_ids(use))
