"""The summaries and the finding of the context-compression experiment
(:mod:`workbench.experiments.context_compression`, notebook ``06_context_compression``), from its point tables.

The design's arms and outcome as every part reads them: :data:`EXPERIMENT`, :data:`TOTAL_TIME` (the primary outcome,
``time_ratio`` on every point of an arm), :func:`arm_key` and :func:`arm_label`. The summaries: :func:`summarise`
(over depths), :func:`break_even`, :func:`quality_at`, :func:`best_strategy`. The decision: answer quality paired
over the same tasks (:func:`task_matches`, :func:`quality_versus_none`) and :func:`finding` (total time from the
design's block analysis, the pick per context length). The experiment re-exports them all.
"""

from __future__ import annotations

import dataclasses
import math

from workbench import checks
from workbench.experiments.context_compression.charts import (
    ACHIEVED,
    COMPRESSOR,
    LOGPROB,
    MATCH,
    PREFILLED,
    ROUGE,
    TOTAL,
    TTFT,
    TTFT_TOTAL,
)
from workbench.run import design
from workbench.share import plots
from workbench.stats import blocks, evidence
from workbench.techniques.compression import LOSSLESS

EXPERIMENT = "compression"
TOTAL_TIME = design.Outcome("total_s", False, "total time (compressor + answer)", "time_ratio")


def arm_key(p: dict) -> str:
    """A document point's arm: its (strategy, ratio, context length), every depth (task) of it one arm."""
    return f"{p['strategy']}@{p['ratio']:g}@{int(p['context_tokens'])}"


# ----------------------------------------------------------------------------- summaries


def summarise(points):
    """Per (strategy, ratio, context_tokens): point columns averaged over depths (same names as the points)."""
    p = plots.ok_points(points)
    cols = [c for c in (MATCH, LOGPROB, "gold_logprob_per_token_mean", ROUGE, "needle_kept_mean", ACHIEVED,
                        COMPRESSOR, TTFT, TTFT_TOTAL, TOTAL) if c in p]
    return p.groupby(["strategy", "ratio", "context_tokens"], as_index=False)[cols].mean()


def break_even(points):
    """Context length at which each (strategy, ratio) starts to save time over ``none``.

    Answers have a fixed length (``ignore_eos``), so decode time cancels and the saving is prefill. Method, from the
    measured points: fit TTFT against prefilled tokens over all points of the experiment (``ttft = a + b * tokens``,
    least squares; pooling every point makes the per-token prefill cost ``b`` robust to noise), fit each strategy's
    compressor time against context length (``c + d * L``), and solve ``c + d * L = b * L * (1 - 1 / ratio)`` with
    the strategy's mean achieved ratio: ``L* = c / (b * (1 - 1/ratio) - d)``. ``inf`` when the compressor grows at
    least as fast as the prefill it saves, 0 when it costs nothing. ``direct_tokens`` is the crossing of straight
    lines through the measured total times (``none`` vs the strategy), for comparison;
    ``measured`` says whether ``L*`` lies inside the measured lengths.

    Returns:
        DataFrame: strategy, ratio, achieved_ratio, prefill_s_per_token,
        compressor_s_per_token, break_even_tokens, measured, direct_tokens.
    """
    import numpy as np
    import pandas as pd

    cols = ["strategy", "ratio", "achieved_ratio", "prefill_s_per_token", "compressor_s_per_token",
            "break_even_tokens", "measured", "direct_tokens"]
    p = evidence.usable_points(points)  # a fit uses valid points only
    need = {PREFILLED, TTFT, COMPRESSOR, ACHIEVED, "context_tokens"}
    if p.empty or not need <= set(p) or not (p["strategy"] == "none").any():
        return pd.DataFrame(columns=cols)

    def line(xs, ys):
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        if len(set(xs)) < 2:
            return float(np.mean(ys)), 0.0
        b, a = np.polyfit(xs, ys, 1)
        return float(a), float(b)

    _, per_token = line(p[PREFILLED], p[TTFT])
    s = summarise(p)
    base = s[s["strategy"] == "none"].set_index("context_tokens")[TOTAL] if TOTAL in s else None
    rows = []
    for (strat, ratio), g in p[p["strategy"] != "none"].groupby(["strategy", "ratio"]):
        c, d = line(g["context_tokens"], g[COMPRESSOR])
        achieved = float(g[ACHIEVED].mean())
        gain = per_token * (1 - 1 / achieved) - d if achieved > 0 else -d
        if c <= 0 and gain >= 0:
            be = 0.0
        elif gain <= 0:
            be = math.inf
        else:
            be = max(0.0, c / gain)
        direct = math.nan
        if base is not None:
            gs = s[(s["strategy"] == strat) & (s["ratio"] == ratio) & s["context_tokens"].isin(base.index)]
            if len(gs) >= 2:
                a0, b0 = line(base.index, base.to_numpy())
                a1, b1 = line(gs["context_tokens"], gs[TOTAL])
                direct = 0.0 if (a1 <= a0 and b1 <= b0) else (math.inf if b1 >= b0 else max(0.0, (a1 - a0) / (b0 - b1)))
        lengths = p["context_tokens"]
        rows.append({"strategy": strat, "ratio": ratio, "achieved_ratio": achieved, "prefill_s_per_token": per_token,
                     "compressor_s_per_token": d, "break_even_tokens": be,
                     "measured": bool(lengths.min() <= be <= lengths.max()), "direct_tokens": direct})
    return pd.DataFrame(rows, columns=cols)


def quality_at(points, ratio: float = 4):
    """Quality retained at a ratio, per strategy (all lengths and depths averaged), next to ``none``.

    Returns:
        DataFrame: strategy, achieved_ratio_p50, substring_match_mean, match_retained (share of
        ``none``'s), gold_logprob_mean, delta_gold_logprob (vs ``none``), rouge_l_mean.
    """
    p = plots.ok_points(points)  # measured points, valid or not: an answer does not depend on the machine's speed
    base = p[p["strategy"] == "none"]
    sel = p[(p["ratio"] == ratio) | (p["strategy"].isin(LOSSLESS))]
    cols = [c for c in (ACHIEVED, MATCH, LOGPROB, ROUGE) if c in p]
    g = sel.groupby("strategy", as_index=False)[cols].mean()
    m0 = base[MATCH].mean() if not base.empty else float("nan")
    l0 = base[LOGPROB].mean() if not base.empty else float("nan")
    g["match_retained"] = g[MATCH] / m0 if m0 else float("nan")
    g["delta_gold_logprob"] = g[LOGPROB] - l0
    order = ["strategy", ACHIEVED, MATCH, "match_retained", LOGPROB, "delta_gold_logprob", ROUGE]
    return g[[c for c in order if c in g]]


def best_strategy(points):
    """Per context length: the lossy or lossless strategy with the best answer match, ties broken by the
    higher gold log-likelihood, then the lower total time; over valid points only
    (:func:`workbench.stats.evidence.usable_points`).

    Returns:
        DataFrame: context_tokens, strategy, ratio, substring_match_mean, gold_logprob_mean, total_s_p50,
        none_total_s_p50.
    """
    import pandas as pd

    s = summarise(evidence.usable_points(points))  # a best-of choice uses valid points only
    rows = []
    for n, g in s.groupby("context_tokens"):
        g = g.sort_values([MATCH, LOGPROB, TOTAL], ascending=[False, False, True])
        top = g.iloc[0]
        none = g[g["strategy"] == "none"][TOTAL]
        rows.append({"context_tokens": int(n), "strategy": top["strategy"], "ratio": top["ratio"],
                     MATCH: top[MATCH], LOGPROB: top[LOGPROB], TOTAL: top[TOTAL],
                     "none_" + TOTAL: float(none.iloc[0]) if len(none) else None})
    return pd.DataFrame(rows)


def _arm(at, strategy, ratio):
    """The points of one (strategy, ratio) arm among one length's points (a lossless strategy has one ratio)."""
    return at[(at["strategy"] == strategy) & ((at["ratio"] == ratio) | at["strategy"].isin(LOSSLESS))]


def arm_label(strategy, ratio) -> str:
    """An arm's name in words: the strategy, with its target ratio unless it is lossless (``bm25 at ratio 4``)."""
    return strategy + (f" at ratio {ratio:g}" if strategy not in LOSSLESS and ratio == ratio else "")


def task_matches(points) -> dict:
    """``{(strategy, ratio, context_tokens): {depth: 0 or 1}}``: each task's answer match, the majority over its
    passes (greedy answers repeat, so a task is one unit, never one per pass)."""
    out: dict = {}
    for _, r in points.iterrows():
        if MATCH in r and r[MATCH] == r[MATCH]:
            out.setdefault((r["strategy"], r["ratio"], int(r["context_tokens"])), {})[r["depth"]] = int(r[MATCH] >= 0.5)
    return out


def quality_versus_none(points, strategy, ratio, L) -> dict:
    """Answer match of an arm against ``none`` over the same tasks (depths) at length ``L``:
    :func:`workbench.stats.blocks.paired_binary` (McNemar, exact interval, +-10 points equivalence), plus ``lost``:
    the tasks ``none`` answers and the arm does not."""
    m = task_matches(points)
    mine, none = m.get((strategy, ratio, L), {}), m.get(("none", 1, L), {}) or m.get(("none", 1.0, L), {})
    depths = sorted(set(mine) & set(none))
    a, b = [mine[d] for d in depths], [none[d] for d in depths]
    got = blocks.paired_binary(a, b)
    got["lost"] = sum(1 for x, y in zip(a, b) if y == 1 and x == 0)
    got["k"], got["k0"] = sum(a), sum(b)
    return got


def _quality_text(q: dict) -> str:
    """The paired answer-match comparison in words: its verdict and difference in points, with the interval and
    McNemar's p, or, where no task differs, that the tasks cannot tell."""
    n, v = q["n"], q["verdict"]
    head = f"answer match vs none over {n} paired task{'s' if n != 1 else ''}"
    if not q["high"] > q["low"]:
        return (f"{head}: undecided: the same on every task (no task differs; {n} task{'s' if n != 1 else ''} cannot "
                f"bound the difference within +-10 points)")
    word = {"direction": "higher" if q["direction"] == "higher" else "lower",
            "equivalent": "equivalent within +-10 points"}.get(v, "undecided")
    return (f"{head}: {word}, {q['difference'] * 100:+.0f} points ({q['low'] * 100:+.0f} to {q['high'] * 100:+.0f}; "
            f"{q['method']})")


def _analysis(usable, run_dir=None):
    """The design's analysis of total time: rebuilt from the run folder's design table when ``run_dir`` holds it,
    else from the decisions the points carry (one row per arm)."""
    import pandas as pd

    if run_dir is not None:
        again = design.reanalyse(run_dir, EXPERIMENT)
        if again is not None and again[1] is not None:
            return again[1]
    rows = usable.drop_duplicates(["strategy", "ratio", "context_tokens"])
    arms = {}
    for _, r in rows.iterrows():
        d = design.decision_from_row(r, TOTAL_TIME)
        if d is not None:
            arms[arm_key(r)] = dataclasses.replace(d, arm=arm_key(r), control=f"none@1@{int(r['context_tokens'])}")
    if not arms:
        return None
    r0 = rows.iloc[0]
    return blocks.Analysis(next(iter(arms.values())).control, None, arms, str(r0.get("time_ratio_method") or ""),
                           True, float("nan"), float("nan"), checks.int_or(r0.get("rounds"), 0), 0.05,
                           checks.float_or_nan(r0.get("margin")), float("nan"), pd.DataFrame())


def finding(points, run_dir=None) -> "evidence.Finding":
    """Per context length: the recommended strategy and the decisions behind it.

    Total time (compressor + answer) is the primary outcome, from the design's block analysis (:func:`measure_design`:
    (pass, task) rounds as blocks, each length's ``none`` its arms' control). The pick of a length is
    :func:`workbench.stats.blocks.best_of` over ``none`` and the strategies that keep every answer ``none`` gets
    right on the measured tasks: the fastest estimate, against ``none`` and against its runner-up; ``none`` itself
    only when every such strategy is slower beyond noise or equivalent. Answer quality is the paired analysis of the
    same tasks (:func:`quality_versus_none`: McNemar with an exact interval), reported beside it with its own verdict
    ("match 2 of 2 tasks" decides nothing). The verdict: every length decided (a direction where any is, else
    equivalent), else undecided with the most rounds any length needs; undecided when the A/A control moved. One
    repeat (no design): the pick's Welch ratio over the tasks, a direction only when it excludes 1.

    Args:
        points: the document points.
        run_dir: the run folder (the design's table: the runner-up comparison).

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    usable = evidence.usable_points(points)
    if usable.empty:
        return evidence.nothing_valid("compression point finished", points, run_dir)
    designed = "time_ratio_verdict" in usable and usable["time_ratio_verdict"].fillna("").ne("").any()
    analysis = _analysis(usable, run_dir) if designed else None
    parts, ev, decisions, ids = [], [], [], []
    for L, at in usable.groupby("context_tokens"):
        L = int(L)
        arms = [a for a in dict.fromkeys(zip(at["strategy"], at["ratio"])) if a[0] != "none" and a[0] != "summary"]
        none = at[at["strategy"] == "none"]
        ids += list(evidence.point_ids(none))
        if none.empty or not arms:
            parts.append(f"{L} tokens: " + ("none was not measured" if none.empty else "no strategy compared"))
            decisions.append(("undecided", None))
            continue
        t0 = float(none[TOTAL].mean())
        quality = {a: quality_versus_none(usable, *a, L) for a in arms}
        keep = [a for a in arms if quality[a]["lost"] == 0]
        lost = [f"{arm_label(*a)} loses the answer on {quality[a]['lost']} of {quality[a]['k0']} tasks none answers"
                for a in arms if quality[a]["lost"]]
        if designed and analysis is not None:
            base = f"none@1@{L}"
            sub = dataclasses.replace(analysis, control=base, arms={k: v for k, v in analysis.arms.items()
                                                                    if k.endswith(f"@{L}") and k != base})
            keys = {arm_key({"strategy": a[0], "ratio": a[1], "context_tokens": L}): a for a in arms}
            cands = [base] + [k for k, a in keys.items() if a in keep and k in sub.arms]
            pick = blocks.best_of(sub, cands, higher_is_better=False)
            spr = checks.float_or_nan(at["seconds_per_round"].iloc[0]) if "seconds_per_round" in at else float("nan")
            if pick.keeps_control:
                why = {"undecided": "no strategy that keeps the answers is shown faster, but "
                                    f"{', '.join(arm_label(*keys[k]) for k in pick.open)} "
                                    f"{'is' if len(pick.open) == 1 else 'are'} undecided against it",
                       "equivalent": "every strategy that keeps the answers is equivalent within the margin",
                       "direction": "every strategy that keeps the answers is slower beyond noise or equivalent"}
                text = (f"{L} tokens: keep none ({t0:.2f} s total){' for now' if pick.verdict == 'undecided' else ''}"
                        f": {why[pick.verdict]}")
                if pick.verdict == "undecided" and pick.rounds_needed:
                    text += f" (about {pick.rounds_needed} rounds would decide it at the observed spread)"
            else:
                a = keys[pick.pick]
                mine = _arm(at, *a)
                q = quality[a]
                ids += list(evidence.point_ids(mine))
                text = (f"{L} tokens: {arm_label(*a)} ({mine[TOTAL].mean():.2f} s total vs none's {t0:.2f} s; "
                        f"answers match on {q['k']} of {q['n']} tasks, none on {q['k0']}): "
                        + pick.versus_control.describe("total time vs none", words=("slower", "faster"),
                                                       seconds_per_round=spr))
                if pick.versus_runner_up is not None and pick.runner_up is not None:
                    rival = keys.get(pick.runner_up, ("none", 1))
                    text += "; " + pick.versus_runner_up.describe(f"against the runner-up {arm_label(*rival)}",
                                                                  words=("slower", "faster"), seconds_per_round=spr)
                text += f"; {_quality_text(q)}"
            decisions.append((pick.verdict, pick.rounds_needed))
        else:
            fastest = min(keep, key=lambda a: float(_arm(at, *a)[TOTAL].mean()), default=None)
            if fastest is None:
                text = f"{L} tokens: keep none ({t0:.2f} s total): every strategy loses an answer none gets right"
                decisions.append(("undecided", None))
            else:
                mine = _arm(at, *fastest)
                ids += list(evidence.point_ids(mine))
                iv = evidence.ratio_interval(mine[TOTAL], none[TOTAL], unit="tasks")
                v = evidence.ratio_verdict(iv)
                text = (f"{L} tokens: {arm_label(*fastest)} ({mine[TOTAL].mean():.2f} s total vs none's {t0:.2f} s): "
                        + evidence.describe_ratio(iv, "total time vs none") + f"; {_quality_text(quality[fastest])}")
                decisions.append(("direction" if v in ("higher", "lower") else "undecided", None))
        if lost:
            text += "; " + "; ".join(lost)
        parts.append(text)
        ev.append(f"{L} tokens: {len(arms)} strategies against none over {len(none)} tasks (one per depth)")
    open_ = [d for d in decisions if d[0] == "undecided"]
    verdict = ("undecided" if open_ else "direction" if any(d[0] == "direction" for d in decisions) else "equivalent")
    needs = [d[1] for d in open_]
    need = max(needs) if needs and all(n is not None for n in needs) else None
    text = "Context compression - " + "; ".join(parts) + "."
    fields: dict = {"verdict": verdict}
    if designed:
        row = usable[usable["time_ratio_verdict"].fillna("").ne("") | (usable["strategy"] == "none")].iloc[0]
        fields = design.finding_fields(row, verdict=verdict, rounds_needed=need)
        if row.get("aa_verdict") == "direction":
            text += " The A/A control moved (none against itself shows a direction): drift, not strategies."
            fields["verdict"] = "undecided"
        ev.append(f"total time: {design.evidence_text(row)}; a round answers every arm on one task (depth), the "
                  f"tasks in turn; the pick against its runner-up at Tukey's level; answer match paired over the "
                  f"tasks (McNemar exact), a task's match the majority over its passes")
    else:
        text += " Measured point by point (one repeat): Welch ratios over the tasks, no rounds, no A/A control."
    return evidence.Finding(text, "valid points only; " + "; ".join(ev), True, tuple(dict.fromkeys(ids)), **fields)
