"""Reasoning budget: what each thinking-token budget costs in latency and buys in answer quality.

What it measures (notebook ``05_reasoning_budget``): for every (reasoning
budget B, batch size) point, the same seeded tasks (:mod:`workbench.inputs.reasoning`)
answered under budget forcing (:mod:`workbench.techniques.budget_forcing`), in consecutive
batches, ``repeats`` times with seeds ``seed + r``. Each request records its
thinking / answer split, time to first answer token (``ttfat_s``), the predicted
answer, ``exact_match`` and the gold answer's log-likelihood; each point adds
``exact_match_mean``, ``gold_logprob_mean``, ``thinking_tokens_mean``, the
truncation and forced-close rates and ``ttfat_s`` percentiles to the usual
latency and throughput summary (:func:`workbench.run.sweeps.run_sweep`).

Quality is summarised with 95% intervals over tasks (Wilson for accuracy, t otherwise)
(:func:`quality_summary`); :func:`figures` draws latency, quality, thinking
tokens and throughput against the budget; :func:`examples_markdown` writes
example outputs per budget.

Design (issue 32; :mod:`workbench.stats.comparison`): with 2+ points and 2+ rounds the points are measured
interleaved by round (:func:`measure_interleaved`). A round is one chunk of the tasks (:func:`chunk_size`: the
batches of every batch size fall inside it) in one repeat: every point answers that chunk once, in its own
batches, at seed ``seed + repeat``, plus the first batch size's baseline (the smallest budget) a second time,
the A/A control, in an order shuffled per round from the seed. Per batch size, each budget's time to first
answer token over the baseline's is the paired within-round ratio, Holm over the budgets compared
(``time_ratio`` columns); every point carries the A/A columns (:data:`workbench.stats.comparison.COLUMNS`), the
noise floor the finding prints beside the ratio. Accuracy and the gold log-likelihood keep their intervals
over tasks: a machine's drift does not change an answer.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from workbench.run import point_result
from workbench.stats import comparison, metrics
from workbench.share import plots
from workbench.predict import predictions
from workbench.run import sweeps
from workbench.techniques.budget_forcing import PRE, THINKING_MODES, BudgetSpec, thinking_format
from workbench.checks import check_choice, check_choice_list, check_int, check_int_list
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, warm_up
from workbench.run.point_result import PointResult
from workbench.inputs.reasoning import LANGUAGES, REASONING_KINDS, TASK_KINDS, Task, make_tasks, run_reasoning_batch, task_inputs

EXPERIMENT = "reasoning"  # the experiment column and point-id prefix, as in earlier runs (comparable)


# ----------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class Config(sweeps.SweepConfig):
    """The reasoning-budget sweep (notebook ``05_reasoning_budget``): budget x batch size.

    Attributes:
        budgets: thinking-token budgets B, each >= 0 (0: no thinking).
        batch_sizes: requests per ``generate`` call, each >= 1.
        min_budget: minimum thinking tokens (s1 "Wait" extension) for every
            budget > 0; must not exceed the smallest such budget.
        answer_tokens: answer allowance after the end of thinking (>= 1).
        num_tasks: tasks per point (the same tasks at every point), >= 1.
        languages: task languages, from ``en``, ``zh``.
        task_kinds: from :data:`workbench.inputs.reasoning.TASK_KINDS`; default the multi-step kinds
            (``arithmetic``, ``counting``, ``logic``); the one-step ``lookup``, ``copy``, ``list_count`` are
            what a ~100M model solves some of the time (the default suite's choice).
        thinking: ``auto`` (native if the tokenizer has ``<think>`` tokens),
            ``native`` or ``emulated``.
        temperature: 0 is greedy.
        top_p: nucleus mass in (0, 1].
        stop_at_newline: end an answer at the end of its line.

    Raises:
        ParameterError: any invalid field, before a model loads.
    """

    budgets: list = dataclasses.field(default_factory=lambda: [0, 16, 64])
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 4])
    min_budget: int = 0
    answer_tokens: int = 24
    num_tasks: int = 8
    languages: list = dataclasses.field(default_factory=lambda: list(LANGUAGES))
    task_kinds: list = dataclasses.field(default_factory=lambda: list(REASONING_KINDS))
    thinking: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    stop_at_newline: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_int_list("budgets", self.budgets, lo=0)
        check_int_list("batch_sizes", self.batch_sizes, lo=1)
        positive = [b for b in self.budgets if b > 0]
        for b in self.budgets:
            self.spec(b)
        if positive and self.min_budget > min(positive):
            raise ParameterError(f"min_budget: must be <= the smallest budget > 0, {min(positive)} (got {self.min_budget!r})")
        check_int("num_tasks", self.num_tasks, lo=1)
        check_choice_list("languages", self.languages, LANGUAGES)
        check_choice_list("task_kinds", self.task_kinds, TASK_KINDS)
        check_choice("thinking", self.thinking, THINKING_MODES)
        GenerationSettings(max_new_tokens=1, temperature=self.temperature, top_p=self.top_p)
        need = max(self.budgets) + self.answer_tokens + 512  # prompt (< 512 tokens) + budget + answer
        if need > self.max_context():
            raise ParameterError(f"budgets: the largest budget leaves no room in the model's {self.max_context()}-token "
                                 f"context (got {max(self.budgets)})")

    def spec(self, budget: int) -> BudgetSpec:
        """The :class:`~workbench.techniques.budget_forcing.BudgetSpec` of one budget (``min_budget`` applies to budgets > 0)."""
        return BudgetSpec(budget=budget, min_budget=self.min_budget if budget > 0 else 0,
                          answer_tokens=self.answer_tokens, stop_at_newline=self.stop_at_newline)

    def tasks(self) -> list[Task]:
        return make_tasks(self.num_tasks, self.seed, self.languages, self.task_kinds)

    def grid(self) -> list[dict]:
        """Points: every (reasoning_budget, batch_size), budget outermost."""
        return sweeps.expand_grid(reasoning_budget=self.budgets, batch_size=self.batch_sizes)


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one (budget, batch size) point over all tasks, in consecutive batches.

    ``cfg.warmup`` untimed runs of the first batch's prompts come first
    (:func:`workbench.measure.generation.warm_up`); then ``cfg.repeats`` timed passes
    over the tasks, repeat ``r`` with seed ``cfg.seed + r``.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"reasoning_budget", "batch_size"}``.
        state: shared by the points of one sweep: ``tasks``, the same seeded tasks for every point
            (``cfg.tasks()`` on the first point when absent).

    Returns:
        :class:`workbench.run.point_result.PointResult`; ``extra`` holds
        ``exact_match_mean``, ``gold_logprob_mean``, ``thinking_tokens_mean``,
        ``answer_truncated_rate``, ``forced_close_rate``, ``thinking_mode`` and
        ``ttfat_s_p50/p90/p99``.
    """
    if "tasks" not in state:
        state["tasks"] = cfg.tasks()
    tasks: Sequence[Task] = state["tasks"]
    budget, bs = point["reasoning_budget"], point["batch_size"]
    spec = cfg.spec(budget)
    batches = [list(tasks[i:i + bs]) for i in range(0, len(tasks), bs)]
    fmt = thinking_format(loaded.tokenizer, cfg.thinking)
    ids, phases = task_inputs(loaded.tokenizer, batches[0], fmt, budget)
    settings = GenerationSettings(max_new_tokens=spec.total_new_tokens(fmt, PRE in phases),
                                  temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    warmup_s = warm_up(loaded, [t.question for t in batches[0]], settings, n=cfg.warmup, input_ids=ids)
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        for b, batch in enumerate(batches):
            recs, w = run_reasoning_batch(loaded, batch, spec, cfg.thinking, cfg.temperature, cfg.top_p, cfg.seed + r)
            for i, rec in enumerate(recs):
                rec.update(repeat=r, request_id=b * bs + i, batch_index=b, batch_size=len(batch), batch_wall_s=w)
            requests.extend(recs)
            wall += w
    return PointResult(requests=requests, wall_s=wall, warmup_s=warmup_s, extra=_point_extra(requests))


def _point_extra(requests: list[dict]) -> dict:
    """A point's ``extra``: the quality and thinking means, rates and ``ttfat_s`` percentiles of its requests."""
    n = len(requests)
    return {
        "exact_match_mean": sum(float(x["exact_match"]) for x in requests) / n,
        "gold_logprob_mean": sum(x["gold_logprob"] for x in requests) / n,
        "thinking_tokens_mean": sum(x["thinking_tokens"] for x in requests) / n,
        "answer_truncated_rate": sum(bool(x["answer_truncated"]) for x in requests) / n,
        "forced_close_rate": sum(bool(x["forced_close"]) for x in requests) / n,
        "thinking_mode": requests[0]["thinking_mode"],
        **{f"ttfat_s_{k}": v for k, v in metrics.percentiles([x["ttfat_s"] for x in requests]).items()},
        # the padded prompt length the batches' forward passes ran at: the roofline's input for the prediction
        "prompt_tokens": max(x["prompt_tokens"] for x in requests),
    }


def chunk_size(cfg: Config) -> int:
    """Tasks per round: the least common multiple of the batch sizes (every batch of every batch size falls
    inside one chunk, so the batches are those :func:`measure_point` runs), all the tasks when that is more."""
    lcm = math.lcm(*cfg.batch_sizes)
    return lcm if lcm <= cfg.num_tasks else cfg.num_tasks


def n_rounds(cfg: Config) -> int:
    """Rounds of the interleaved design: ``repeats`` x the chunks of :func:`chunk_size`."""
    return cfg.repeats * math.ceil(cfg.num_tasks / chunk_size(cfg))


def _baselines(points: list[dict]) -> dict[int, dict]:
    """Per batch size, its baseline: the smallest budget."""
    out = {}
    for p in points:
        b = out.get(p["batch_size"])
        if b is None or p["reasoning_budget"] < b["reasoning_budget"]:
            out[p["batch_size"]] = p
    return out


def measure_interleaved(loaded, cfg: Config, points: list[dict], state: dict) -> dict[str, PointResult]:
    """Every (budget, batch size) point as an interleaved arm (:mod:`workbench.stats.comparison`), with the A/A control.

    Each point is warmed up ``cfg.warmup`` times on its first batch; then :func:`n_rounds` rounds. Round ``u`` is
    repeat ``u // chunks`` and chunk ``u % chunks`` of the tasks (:func:`chunk_size`): every point answers that
    chunk in its own batches at seed ``cfg.seed + repeat`` (the same tasks and seed for every arm of a round),
    plus the first batch size's baseline (the smallest budget) a second time (:data:`workbench.stats.comparison.AA`,
    timed, neither scored nor stored), in an order shuffled per round from ``cfg.seed``. A point's value in a
    round is the geometric mean over its batches of the batch's median time to first answer token; per batch
    size, each budget is judged against the baseline from the paired within-round ratios, Holm over the budgets
    compared (:func:`workbench.stats.comparison.compare`).

    Returns:
        ``{point_id: PointResult}``: requests as :func:`measure_point` records them (``repeat``, ``request_id`` = the
        task's index, ``batch_index``), ``extra`` with its columns, the ``time_ratio`` columns
        (:func:`workbench.stats.comparison.arm_columns`) and the A/A columns (:data:`workbench.stats.comparison.COLUMNS`).
    """
    import pandas as pd

    if "tasks" not in state:
        state["tasks"] = cfg.tasks()
    tasks: Sequence[Task] = state["tasks"]
    pids = [point_result.point_id(EXPERIMENT, p) for p in points]
    by_pid = dict(zip(pids, points))
    base_pid = {bs: point_result.point_id(EXPERIMENT, p) for bs, p in _baselines(points).items()}
    first_base = base_pid[points[0]["batch_size"]]
    fmt = thinking_format(loaded.tokenizer, cfg.thinking)
    got = {}
    for pid, p in by_pid.items():
        bs, spec = p["batch_size"], cfg.spec(p["reasoning_budget"])
        first = list(tasks[:bs])
        ids, phases = task_inputs(loaded.tokenizer, first, fmt, p["reasoning_budget"])
        settings = GenerationSettings(max_new_tokens=spec.total_new_tokens(fmt, PRE in phases),
                                      temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
        got[pid] = {"requests": [], "wall_s": 0.0,
                    "warmup_s": warm_up(loaded, [t.question for t in first], settings, n=cfg.warmup, input_ids=ids)}
    size = chunk_size(cfg)
    chunks = math.ceil(len(tasks) / size)
    rows = []
    for rnd, arm in comparison.schedule([*pids, comparison.AA], n_rounds(cfg), cfg.seed):
        pid = first_base if arm == comparison.AA else arm
        rep, c = divmod(rnd, chunks)
        bs, budget = by_pid[pid]["batch_size"], by_pid[pid]["reasoning_budget"]
        for start in range(c * size, min((c + 1) * size, len(tasks)), bs):
            batch = list(tasks[start:min(start + bs, (c + 1) * size, len(tasks))])
            recs, w = run_reasoning_batch(loaded, batch, cfg.spec(budget), cfg.thinking, cfg.temperature, cfg.top_p,
                                          cfg.seed + rep, score=arm != comparison.AA)
            ttfat = [x["ttfat_s"] for x in recs if x.get("ttfat_s") == x.get("ttfat_s")]
            rows.append({"arm": arm, "round": rnd, "value": metrics.percentiles(ttfat, (50,))["p50"] if ttfat
                         else float("nan")})
            if arm == comparison.AA:
                continue
            for i, rec in enumerate(recs):
                rec.update(repeat=rep, request_id=start + i, batch_index=start // bs, batch_size=len(batch),
                           batch_wall_s=w)
            got[pid]["requests"] += recs
            got[pid]["wall_s"] += w
    table = pd.DataFrame(rows)
    groups = {base: [pid for pid in pids if by_pid[pid]["batch_size"] == bs]  # the A/A's group first
              for bs, base in sorted(base_pid.items(), key=lambda kv: kv[1] != first_base)}
    ratio_cols, aa_cols = comparison.compare_groups(table, groups)
    out = {}
    for pid in pids:
        g = got[pid]
        g["requests"].sort(key=lambda x: (x["repeat"], x["request_id"]))
        out[pid] = PointResult(requests=g["requests"], wall_s=g["wall_s"], warmup_s=g["warmup_s"],
                               extra={**_point_extra(g["requests"]), **ratio_cols[pid], **aa_cols})
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every (budget, batch size) point of ``cfg`` on the same seeded tasks (experiment ``reasoning``).

    With 2+ points and 2+ rounds (:func:`n_rounds`) the points are measured interleaved by round with the A/A
    control (:func:`measure_interleaved`) and reach the disk together when the last round ends; otherwise each
    point is measured, and written, on its own (:func:`measure_point`).

    Returns:
        The experiment's points DataFrame (see :func:`workbench.run.sweeps.run_sweep`).
    """
    state = {"tasks": cfg.tasks()}
    grid = cfg.grid()

    def measure(p):
        if len(grid) < 2 or n_rounds(cfg) < 2:
            return measure_point(loaded, cfg, p, state)
        return sweeps.block_share(state, point_result.point_id(EXPERIMENT, p),
                                  lambda: measure_interleaved(loaded, cfg, grid, state))

    return sweeps.run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded,
                            config=cfg)


# ----------------------------------------------------------------------------- summaries and figures

QUALITY_METRICS = ("exact_match", "gold_logprob")


def quality_summary(requests, by=("reasoning_budget", "batch_size"), confidence: float = 0.95):
    """Mean and 95% interval (Wilson for exact match, t for log-likelihood) of exact match and gold log-likelihood
    per group.

    Returns:
        Long DataFrame: the ``by`` columns, ``metric``, ``n``, ``mean``, ``ci_low``, ``ci_high``.
    """
    from workbench.measure import quality

    df = requests.copy()
    df["exact_match"] = df["exact_match"].astype(float)
    return quality.summarize(df, list(by), metrics=list(QUALITY_METRICS), confidence=confidence)


def finding(points, requests=None):
    """Smallest against largest thinking budget: accuracy (Newcombe interval of the two shares over tasks; the
    headline, and the finding's mark: supported only when accuracy moves beyond noise),
    time to first answer token (interleaved runs: the paired within-round ratio, Holm over the budgets, with the
    A/A noise floor beside it, :func:`time_clauses`; point by point: a Welch ratio over the batches' medians) and
    thinking tokens; a direction only where
    the interval excludes no change, "not supported" where the model solves none of the tasks at any
    budget (the budget's effect on quality is then invisible).

    Args:
        points: this experiment's points (valid ones are used).
        requests: its requests (one row per task and repeat); None: means without intervals.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    from workbench.stats import evidence

    ok = evidence.usable_points(points)
    if ok.empty or "reasoning_budget" not in ok:
        return evidence.Finding("No valid reasoning point finished.", "", False)
    ids = evidence.point_ids(ok)
    by = ok.groupby("reasoning_budget")[["exact_match_mean", "ttfat_s_p50", "thinking_tokens_mean"]].mean()
    lo, hi = by.index.min(), by.index.max()
    text = (f"Thinking budget {lo} -> {hi}: accuracy {by.loc[lo, 'exact_match_mean']:.0%} -> "
            f"{by.loc[hi, 'exact_match_mean']:.0%}, time to first answer token {by.loc[lo, 'ttfat_s_p50']:.2f} -> "
            f"{by.loc[hi, 'ttfat_s_p50']:.2f} s, thinking tokens {by.loc[lo, 'thinking_tokens_mean']:.0f} -> "
            f"{by.loc[hi, 'thinking_tokens_mean']:.0f}")
    if requests is None or "point_id" not in requests or lo == hi:
        return evidence.Finding(text + " (means over batch sizes).", "no per-task values given: no intervals",
                                False, ids)
    req = requests[requests["point_id"].isin(ok["point_id"])]
    at = {b: req[req["reasoning_budget"] == b] for b in (lo, hi)}
    # greedy repeats give the same answer again: each task counts once for accuracy
    answers = {b: at[b][at[b]["repeat"] == at[b]["repeat"].min()] if "repeat" in at[b] and "temperature" in at[b]
               and (at[b]["temperature"] == 0).all() else at[b] for b in (lo, hi)}
    k = {b: int(answers[b]["exact_match"].astype(float).sum()) for b in (lo, hi)}
    n = {b: int(answers[b]["exact_match"].notna().sum()) for b in (lo, hi)}
    acc = evidence.difference_interval(k[hi], n[hi], k[lo], n[lo])
    acc_v = evidence.difference_verdict(acc)
    think = evidence.mean_difference_interval(answers[hi]["thinking_tokens"], answers[lo]["thinking_tokens"],
                                              unit="answers")
    paired = time_clauses(ok, lo, hi)
    if paired is None:  # measured point by point (one round): Welch over the batches' medians, no A/A control
        unit_cols = [c for c in ("point_id", "repeat", "batch_index") if c in req]
        med = {b: at[b].groupby(unit_cols)["ttfat_s"].median() for b in (lo, hi)}  # one value per generate call
        timing = evidence.describe_ratio(evidence.ratio_interval(med[hi], med[lo], unit="batches"),
                                         "time to first answer token") + "."
        timing_ev = []
    else:
        timing, timing_ev = paired
    if k[lo] + k[hi] == 0:
        claim = (f"the budget's effect on accuracy: not supported: no task solved at budget {lo} or {hi} "
                 f"(0 of {n[lo]} and 0 of {n[hi]}); the tasks are beyond this model")
    else:
        claim = {"higher": "accuracy rises", "lower": "accuracy falls"}.get(acc_v, f"accuracy: {acc_v}")
    # the headline is the accuracy claim (what a thinking budget is for); the time it costs rides along
    sentences = [f"From budget {lo} to {hi}, {claim}.", text + ".", timing]
    supported = acc_v in ("higher", "lower")
    ev = [f"{n[lo]} and {n[hi]} answers at budgets {lo} and {hi} (greedy repeats counted once), valid points only",
          f"accuracy change {acc.describe('{:+.2f}')}", f"thinking-token change {think.describe('{:+.1f}')}",
          *timing_ev]
    return evidence.Finding(" ".join(sentences), "; ".join(ev), supported, ids)


def time_clauses(ok, lo, hi) -> tuple[str, list[str]] | None:
    """The time to first answer token at budget ``hi`` over budget ``lo``, per batch size, from the usable points'
    ``time_ratio`` and A/A columns (interleaved runs: paired within rounds, Holm over the budgets, the A/A noise
    floor beside it; "not supported: the A/A control moved" when the control's interval excludes 1,
    :func:`workbench.stats.comparison.describe_columns`). None when the points were not measured interleaved.
    Returns ``("sentences.", evidence parts)``."""
    if "time_ratio" not in ok or "design" not in ok or not ok["design"].notna().any():
        return None
    clauses, ev = [], []
    sizes = sorted(set(ok["batch_size"]))
    for bs in sizes:
        g = ok[ok["batch_size"] == bs]
        top = g[g["reasoning_budget"] == hi]
        if top.empty or not (g["reasoning_budget"] == lo).any():
            continue
        row = top.iloc[0]
        name = f"Time to first answer token at budget {hi} vs {lo}" + (f" (batch {bs})" if len(sizes) > 1 else "")
        clauses.append(comparison.describe_columns(row, name) + ".")
        rounds = row.get("rounds")
        ev.append(f"time to first answer token paired within {int(rounds)} interleaved rounds (the batches' median)"
                  if rounds == rounds and rounds is not None else "time to first answer token paired within rounds")
    if not clauses:
        aa = comparison.aa_from_columns(ok[ok["design"].notna()].iloc[0])
        return f"{comparison.noise_floor_text(aa, 'interleaved', aa.n if aa else None)}.", ev
    return " ".join(clauses), ev


def fig_latency_vs_budget(points):
    """TTFT, TTFAT and e2e medians (p50) vs budget, one colour per metric, one line style per batch size."""
    import plotly.express as px

    pts = plots.ok_points(points)
    cols = {"ttft_s_p50": "TTFT p50", "ttfat_s_p50": "TTFAT p50", "e2e_s_p50": "e2e p50"}
    df = pts.melt(id_vars=["reasoning_budget", "batch_size"], value_vars=list(cols), var_name="metric",
                  value_name="value")
    df["metric"] = df["metric"].map(cols)
    df["batch_size"] = df["batch_size"].astype(str)
    fig = px.line(df.sort_values("reasoning_budget"), x="reasoning_budget", y="value", color="metric",
                  line_dash="batch_size", markers=True,
                  labels=plots.labels("reasoning_budget", "batch_size", value="latency p50 (s)"),
                  title="Latency vs reasoning budget (p50 over requests)")
    pred = predictions.predict_rows(pts)
    for col, name in (("predicted_ttft_s", "predicted TTFT"), ("predicted_e2e_s", "predicted e2e")):
        predictions.add_predicted_line(fig, pred, "reasoning_budget", col, group="batch_size", name=name)
    plots.mark_invalid(fig, pts, "reasoning_budget", "e2e_s_p50")
    return fig


def fig_quality_vs_budget(summary):
    """Accuracy and gold-answer log-likelihood vs budget with 95% interval error bars, colour = batch size."""
    import plotly.express as px

    df = summary.copy()
    df["err_plus"] = df["ci_high"] - df["mean"]
    df["err_minus"] = df["mean"] - df["ci_low"]
    df["batch_size"] = df["batch_size"].astype(str)
    df["metric"] = df["metric"].map({"exact_match": "exact-match accuracy",
                                     "gold_logprob": "gold-answer log-likelihood (nats)"})
    fig = px.line(df.sort_values("reasoning_budget"), x="reasoning_budget", y="mean", color="batch_size",
                  facet_col="metric", error_y="err_plus", error_y_minus="err_minus", markers=True,
                  labels=plots.labels("reasoning_budget", "batch_size", mean="mean (95% interval)"),
                  title="Answer quality vs reasoning budget")
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    return fig


def fig_thinking_distribution(requests):
    """Histogram of thinking tokens per request, one colour per budget (forced closes pile up at B + delimiter)."""
    import plotly.express as px

    df = requests.copy()
    df["reasoning_budget"] = df["reasoning_budget"].astype(str)
    return px.histogram(df, x="thinking_tokens", color="reasoning_budget", barmode="overlay", opacity=0.7,
                        labels=plots.labels("thinking_tokens", reasoning_budget="budget B"),
                        title="Thinking tokens per request")


def fig_throughput_vs_budget(points):
    """Output throughput (all tokens / wall time) vs budget, one line per batch size."""
    import plotly.express as px

    pts = plots.ok_points(points)
    pts = predictions.predict_rows(pts)
    pts["batch_size"] = pts["batch_size"].astype(str)
    fig = px.line(pts.sort_values("reasoning_budget"), x="reasoning_budget", y="output_throughput_tps",
                  color="batch_size", markers=True,
                  labels=plots.labels("reasoning_budget", "batch_size", "output_throughput_tps"),
                  title="Output throughput vs reasoning budget, per batch size")
    return predictions.add_predicted_line(fig, pts, "reasoning_budget", "predicted_output_throughput_tps",
                                       group="batch_size")


def fig_time_ratio(points):
    """Time to first answer token of every budget over its batch size's baseline (paired within rounds, its
    interval at the budget's Holm level), with the A/A noise floor shaded."""
    fig = comparison.ratio_figure(plots.ok_points(points).sort_values("reasoning_budget"), "reasoning_budget",
                                  group="batch_size", name=lambda bs: f"batch {bs}", mode="lines+markers", sort=True)
    fig.update_layout(title="Time to first answer token over the smallest budget (paired within rounds; grey band: "
                            "the A/A noise floor)", xaxis_title=plots.label("reasoning_budget"),
                      yaxis_title="TTFAT ratio vs baseline (x)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(points, requests) -> dict:
    """All figures of the notebook, in report order: ``{name: figure}`` (the time ratio only from interleaved runs)."""
    figs = {
        "reasoning_latency_vs_budget": fig_latency_vs_budget(points),
        "reasoning_quality_vs_budget": fig_quality_vs_budget(quality_summary(requests)),
        "reasoning_thinking_tokens": fig_thinking_distribution(requests),
        "reasoning_throughput_vs_budget": fig_throughput_vs_budget(points),
    }
    if "time_ratio" in points and points["time_ratio"].notna().any():  # interleaved rounds (issue 32)
        figs["reasoning_time_ratio"] = fig_time_ratio(points)
    return figs


def examples_markdown(requests, per_budget: int = 2) -> str:
    """Markdown with the first ``per_budget`` requests of each budget: question id, thinking, answer, gold."""
    lines = ["# Reasoning budget: example outputs", ""]
    first = requests[requests["repeat"] == requests["repeat"].min()] if "repeat" in requests else requests
    first = first[first["batch_size"] == first["batch_size"].min()]
    for budget, g in first.groupby("reasoning_budget", sort=True):
        lines += [f"## B = {budget}", ""]
        for _, r in g.head(per_budget).iterrows():
            pred = r["prediction"] if isinstance(r["prediction"], str) else "none"
            lines += [f"**{r['task_id']}** (gold `{r['gold']}`, predicted `{pred}`, "
                      f"{r['thinking_tokens']} thinking + {r['answer_tokens']} answer tokens)", "",
                      "```", f"{r['thinking_text']}{r['answer_text']}", "```", ""]
    return "\n".join(lines)
