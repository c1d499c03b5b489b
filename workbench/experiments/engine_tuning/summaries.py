"""The recommendation and the finding of the engine-tuning experiment (:mod:`workbench.experiments.engine_tuning`,
notebook ``09_engine_tuning``), from its configurations table
(:func:`workbench.techniques.configurations.configurations`).

:func:`replay_search` (the adaptive search replayed over a measured grid), :func:`choice` (the recommendation as a
decision of the design's block analysis: :func:`workbench.stats.blocks.best_of`), :func:`headline` (ONE
recommendation, the search that produced it and what holds it up) and :func:`finding`. The experiment re-exports
them.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from workbench import checks
from workbench.experiments.engine_tuning.rounds import E2E, EXPERIMENT
from workbench.experiments.engine_tuning.search import coordinate_search
from workbench.run import design, sweeps
from workbench.stats import blocks, evidence
from workbench.techniques.configurations import (
    AXES,
    JOINT,
    aa_moved,
    aa_sentence,
    config_key,
    config_name,
    designed,
    objective,
    recommend,
    speedup_phrase,
    valid,
)


def replay_search(configs: pd.DataFrame, axes: dict[str, list]) -> dict:
    """Run :func:`workbench.experiments.engine_tuning.search.coordinate_search` over a measured grid (evaluation = a
    table lookup) and compare with the full grid's :func:`recommend`: ``{"evaluated", "grid", "adaptive", "full",
    "same", "converged"}``."""
    table = {config_key(r): objective(r) for _, r in configs.iterrows()}
    axes = {a: axes.get(a, [None]) for a in AXES}
    best, seen, converged = coordinate_search(axes, lambda c: table.get(config_key(c), math.inf), is_valid=valid,
                                              joint=JOINT)
    full = recommend(configs)
    adaptive = config_name(best) if math.isfinite(seen.get(config_key(best), math.inf)) else None
    full_name = None if full is None else full["config"]
    return {"evaluated": len(seen), "grid": sum(1 for c in sweeps.expand_grid(**axes) if valid(c)),
            "adaptive": adaptive, "full": full_name, "same": adaptive == full_name, "converged": converged}



def _analysis(configs: pd.DataFrame, run_dir=None) -> blocks.Analysis | None:
    """The design's analysis of the configurations: rebuilt from the run folder's design table when ``run_dir``
    holds it (the runner-up comparison needs the rounds), else from the decisions the rows carry."""
    if run_dir is not None:
        again = design.reanalyse(run_dir, EXPERIMENT)
        if again is not None and again[1] is not None:
            return again[1]
    if not designed(configs):
        return None
    base = configs.loc[configs["baseline"], "config"].iloc[0]
    arms = {}
    for _, r in configs[~configs["baseline"]].iterrows():
        d = design.decision_from_row(r, E2E)
        if d is not None:
            arms[r["config"]] = dataclasses.replace(d, arm=r["config"], control=base)
    r0 = configs.iloc[0]
    return blocks.Analysis(base, None, arms, str(r0.get("time_ratio_method") or ""), True, float("nan"),
                           float("nan"), checks.int_or(r0.get("rounds"), 0), 1 - checks.float_or_nan(
                               r0.get("time_ratio_level")), checks.float_or_nan(r0.get("margin")), float("nan"),
                           pd.DataFrame())


def choice(configs: pd.DataFrame, run_dir=None) -> blocks.Pick | None:
    """The recommendation as a decision (:func:`workbench.stats.blocks.best_of` over the eligible configurations,
    latency lower is better): the fastest estimate, against the baseline and its runner-up; the baseline itself only
    when every other eligible configuration is slower beyond noise or equivalent. None without a design or an
    eligible configuration."""
    if not designed(configs) or "baseline" not in configs or not configs["baseline"].any():
        return None
    eligible = configs.loc[configs["eligible"].astype(bool), "config"].tolist()
    analysis = _analysis(configs, run_dir)
    if analysis is None or not eligible:
        return None
    eligible = [c for c in eligible if c == analysis.control or c in analysis.arms]
    return blocks.best_of(analysis, eligible, higher_is_better=False) if eligible else None


def _flags(r) -> str:
    flags = "" if r["guard_passed"] else f" [guard FAILED: {r['guard_reason']}]"
    if r.get("valid") is False or r.get("valid") == False:  # noqa: E712
        flags += f" [invalid: {r.get('invalid_reason', '')}]"
    if r.get("meets_slo") is False:
        flags += f" [misses the SLO: {r.get('slo_note', '')}]"
    if r.get("recompiles", 0) > 0:  # NaN (uncompiled) compares False
        flags += f" [torch.compile built {int(r['recompiles'])} more graph(s) during the timed repeats]"
    if math.isfinite(r.get("compile_s", float("nan"))):
        flags += f" [compile {r['compile_s']:.0f} s, not in the timings]"
    return flags


def _quality(r) -> str:
    return (f"perplexity x{r['perplexity_ratio']:.4g} (95% upper {r['perplexity_ratio_high']:.4g}), mean KL "
            f"{r['kl_mean']:.3g} nats vs float32; SLO {r.get('slo_note', '')}")


def headline(configs: pd.DataFrame, search: dict | None = None, run_dir=None) -> str:
    """ONE recommendation, the search that produced it, and what holds it up, in one paragraph.

    The recommendation comes from the full grid (``search`` given: the :func:`replay_search` of a grid run,
    whose disagreement becomes a caveat) or from the adaptive search (``configs`` of an adaptive run: then
    the caveat says the rest of the grid was not measured and whether the search converged). A grid measured as
    one design says the decision behind its choice (:func:`choice`): the pick against the baseline and its
    runner-up, or "keep the baseline" only when every other configuration is slower beyond noise or equivalent.
    Every configuration's ratio to the baseline carries its interval and verdict (:func:`speedup_phrase`); the SLO
    verdict says at which percentile it was checked.
    """
    if configs.empty:
        return "No configuration measured."
    best = recommend(configs)
    base = configs[configs["baseline"]].iloc[0] if "baseline" in configs and configs["baseline"].any() else \
        configs.iloc[0]
    adaptive_run = "search" in configs and configs["search"].iloc[0] == "adaptive"
    if adaptive_run:
        source = (f"the adaptive search ({int(configs['search_evaluated'].iloc[0])} of "
                  f"{int(configs['search_grid'].iloc[0])} configurations measured)")
    else:
        source = f"the full grid ({len(configs)} configurations measured)"
    parts = []
    pick = choice(configs, run_dir)
    words = ("slower", "faster")
    if best is None:
        parts.append(f"No configuration of {source} met the SLO and the quality guard on valid points: none is "
                     f"recommended.")
    elif pick is not None and pick.keeps_control:
        row = configs[configs["config"] == pick.pick].iloc[0]
        if pick.verdict == "undecided":
            need = (f"; about {pick.rounds_needed} rounds would decide "
                    f"{'it' if len(pick.open) == 1 else 'them'} at the observed spread" if pick.rounds_needed else "")
            why = (f"none is shown faster, but {', '.join(map(str, pick.open))} "
                   f"{'is' if len(pick.open) == 1 else 'are'} undecided against it{need}")
        elif pick.verdict == "equivalent":
            why = f"every other configuration is equivalent to it within +-{configs['margin'].iloc[0] - 1:.0%}"
        else:
            why = "every other configuration is slower beyond noise or equivalent within the margin"
        parts.append(f"Keep the baseline{' for now' if pick.verdict == 'undecided' else ''} "
                     f"({source.replace(' (', ', ').rstrip(')')}): {pick.pick} ({row['e2e_s_p50']:.3f} s per "
                     f"request): {why}; {_quality(row)}.")
    elif pick is not None:
        row = configs[configs["config"] == pick.pick].iloc[0]
        spr = checks.float_or_nan(row.get("seconds_per_round"))
        versus = pick.versus_control.describe(f"against the baseline {pick.control}", invert=True, words=words,
                                              seconds_per_round=spr)
        parts.append(f"Recommended by {source}: {pick.pick} ({row['e2e_s_p50']:.3f} s per request; {versus}; "
                     f"{_quality(row)}).")
        if pick.versus_runner_up is not None:
            parts.append(pick.versus_runner_up.describe(f"Against the runner-up {pick.runner_up}", invert=True,
                                                        words=words, seconds_per_round=spr) + ".")
    else:
        versus = ("it is the baseline" if best["config"] == base["config"] else
                  f"{speedup_phrase(best)} against the baseline {base['config']}")
        parts.append(f"Recommended by {source}: {best['config']} ({best['e2e_s_p50']:.3f} s per request; "
                     f"{versus}; {_quality(best)}).")
    stated = {base["config"], *([pick.pick] if pick is not None else [])}
    for _, r in configs[~configs["config"].isin(stated)].iterrows():
        if not math.isfinite(r["speedup_vs_baseline"]):
            continue
        parts.append(f"{r['config']}: {speedup_phrase(r)}{_flags(r)}.")
    floor = aa_sentence(configs)  # the noise floor beside the comparisons it judges
    if floor:
        parts.append(floor)
    if adaptive_run:
        conv = bool(configs["search_converged"].iloc[0])
        parts.append("Caveat: the rest of the grid was not measured; the search " + (
            "converged (no single knob change improves its choice), which is the grid's optimum only if the knobs "
            "do not interact." if conv else
            "stopped on its budget before converging, so it could not establish the grid's optimum."))
    elif search and best is not None:
        if search["same"]:
            parts.append(f"The adaptive search, replayed on this grid, finds the same configuration with "
                         f"{search['evaluated']} of {search['grid']} measurements.")
        else:
            why = ("it converged on a different configuration: the knobs interact" if search.get("converged") else
                   "it stopped on its budget before converging")
            parts.append(f"Caveat: the adaptive search, replayed on this grid, could not find this optimum: after "
                         f"{search['evaluated']} of {search['grid']} measurements it would pick "
                         f"{search['adaptive'] or 'nothing'} ({why}).")
    return " ".join(parts)


def finding(configs: pd.DataFrame, search: dict | None = None, points: pd.DataFrame | None = None,
            run_dir=None) -> evidence.Finding:
    """The report's finding: :func:`headline` as its text, with the evidence behind the recommendation.

    Its verdict: a grid measured as one design carries :func:`choice`'s (the pick against the baseline: a
    direction, equivalent within the margin, or undecided with the rounds it needs; the baseline kept only when every
    other eligible configuration is slower beyond noise or equivalent), undecided when the A/A control moved.
    Without a design (one repeat, the adaptive search) a recommendation other than the baseline is a direction only
    when its Welch interval excludes 1; anything else is undecided.

    Returns:
        :class:`workbench.stats.evidence.Finding` (point ids: the usable points of ``points`` when given).
    """
    text = headline(configs, search, run_dir)
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    if configs.empty:
        return evidence.Finding(text, "no configuration measured", False, verdict="undecided")
    best = recommend(configs)
    base = configs[configs["baseline"]].iloc[0] if "baseline" in configs and configs["baseline"].any() else \
        configs.iloc[0]
    pick = choice(configs, run_dir)
    guard_ev = ("quality guard (perplexity ratio and mean KL vs float32 on held-out text, upper 95% bounds over "
                "windows); SLO at the preset's own percentile where the sample supports it")
    if designed(configs):
        an = _analysis(configs, run_dir)
        row = configs[configs["config"] == (pick.pick if pick is not None else base["config"])].iloc[0]
        fields = design.finding_fields(row)
        fields["verdict"] = pick.verdict if pick is not None else "undecided"   # nothing eligible: no choice
        if pick is not None and pick.verdict == "undecided":
            spr = checks.float_or_nan(row.get("seconds_per_round"))
            fields["rounds_needed"] = pick.rounds_needed
            fields["seconds_needed"] = (max(pick.rounds_needed - fields["rounds"], 0) * spr
                                        if pick.rounds_needed is not None and math.isfinite(spr) else None)
        if aa_moved(configs):
            fields["verdict"] = "undecided"
        how = (f"block model on the log scale, rounds as blocks, one residual variance pooled over the "
               f"{an.table.shape[1]} arms ({an.method})" if an.pooled and not an.table.empty else an.method)
        ev = (f"{len(configs)} configurations, one design; request latency (the geometric mean over workloads of a "
              f"round's mean e2e) vs the marked baseline {base['config']}: {how}; {design.evidence_text(row)}; the "
              f"pick against its runner-up at Tukey's level; {guard_ev}")
        return evidence.Finding(text, ev, True, ids, **fields)
    src = points if points is not None and "n_repeats" in points else pd.DataFrame()
    reps = pd.to_numeric(src.get("n_repeats", pd.Series(dtype=float)), errors="coerce")
    n_rep = f"at least {int(reps.min())} repeats each" if reps.notna().any() else "repeats per point in the table"
    ev = (f"{len(configs)} configurations measured one after another, {n_rep}; speed-up vs the baseline "
          f"{base['config']}: 95% Welch t interval on log e2e over repeats (no rounds, no A/A control); {guard_ev}")
    faster = (best is not None and best["config"] != base["config"]
              and best.get("speedup_low", float("nan")) > 1)
    return evidence.Finding(text, ev, True, ids, verdict="direction" if faster else "undecided")
