"""Reasoning budget: what each thinking-token budget costs in latency and buys in answer quality.

What it measures (notebook ``05_reasoning_budget``): for every (reasoning
budget B, batch size) point, the same seeded tasks (:mod:`workbench.inputs.reasoning`)
answered under budget forcing (:mod:`workbench.techniques.budget_forcing`), in consecutive
batches, with seeds ``seed + pass``. Each request records its
thinking / answer split, time to first answer token (``ttfat_s``), the predicted
answer, ``exact_match`` and the gold answer's log-likelihood; each point adds
``exact_match_mean``, ``gold_logprob_mean``, ``thinking_tokens_mean``, the
truncation and forced-close rates and ``ttfat_s`` percentiles to the usual
latency and throughput summary (:func:`workbench.run.sweeps.run_sweep`).

Quality is summarised with 95% intervals over tasks (Wilson for accuracy, t otherwise)
(:func:`quality_summary`); :func:`figures` draws latency, quality, thinking
tokens and throughput against the budget; :func:`examples_markdown` writes
example outputs per budget.

Design (issue 49; :mod:`workbench.run.design`): with 2+ points and 2+ rounds (:func:`n_rounds`) the points are the
arms of one design (:func:`sweep_design`). A round is one chunk of the tasks (:func:`chunk_size`: the batches of
every batch size fall inside it) in one pass over them: every point answers that chunk once, in its own batches, at
seed ``seed + pass``, and the first batch size's baseline (the smallest budget; marked, not taken from the row order)
a second time, the A/A control (timed, not scored), in an order shuffled per round. ``repeats`` passes come first
(``repeats`` x chunks rounds), then more rounds while the primary comparison is undecided, up to ``max_rounds`` and
within ``budget_s``. Each batch size's points are a group against its smallest budget.

- **Primary outcome** (it alone sets the finding's verdict): the time to first answer token (a round's value: the
  geometric mean over its batches of the batch's median TTFAT) over the smallest budget's, per batch size, from the
  block analysis of the rounds (:mod:`workbench.stats.blocks`).
- **Secondary**, with its own verdict: accuracy at the largest against the smallest budget. The same tasks answered
  under both budgets are pairs, so the comparison is paired (McNemar's exact test and its exact conditional
  interval, :func:`workbench.stats.blocks.paired_binary`), not two independent shares; greedy repeats of a task
  count once. A machine's drift does not change an answer, so accuracy needs tasks, not rounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from workbench.checks import check_choice, check_choice_list, check_int, check_int_list
from workbench.errors import ParameterError
from workbench.inputs.reasoning import (
    LANGUAGES,
    REASONING_KINDS,
    TASK_KINDS,
    Task,
    make_tasks,
    run_reasoning_batch,
    task_inputs,
)
from workbench.measure.generation import GenerationSettings, warm_up
from workbench.predict import predictions
from workbench.run import design, design_sweep, point_result, sweeps
from workbench.run.point_result import PointResult
from workbench.share import figures_design, plots
from workbench.stats import blocks, metrics
from workbench.techniques.budget_forcing import PRE, THINKING_MODES, BudgetSpec, thinking_format

EXPERIMENT = "reasoning"  # the experiment column and point-id prefix, as in earlier runs (comparable)


# ----------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """The reasoning-budget sweep (notebook ``05_reasoning_budget``): budget x batch size.

    With 2+ points and 2+ rounds the points are the arms of one design (:func:`sweep_design`); a round is one chunk
    of the tasks (:func:`chunk_size`).

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
        repeats: passes over the tasks before the first look (``repeats`` x chunks rounds, :func:`n_rounds`).
        max_rounds: the most rounds (chunks of tasks) the design may take, >= :func:`n_rounds`.

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
    max_rounds: int = 6

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
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
        if self.max_rounds < n_rounds(self):
            raise ParameterError(f"max_rounds: must be >= repeats x chunks of the tasks = {n_rounds(self)} (a round is "
                                 f"a chunk of {chunk_size(self)} tasks) (got {self.max_rounds})")

    def spec(self, budget: int) -> BudgetSpec:
        """The :class:`~workbench.techniques.budget_forcing.BudgetSpec` of one budget (``min_budget`` applies to budgets > 0)."""
        return BudgetSpec(budget=budget, min_budget=self.min_budget if budget > 0 else 0,
                          answer_tokens=self.answer_tokens, stop_at_newline=self.stop_at_newline)

    def tasks(self) -> list[Task]:
        return make_tasks(self.num_tasks, self.seed, self.languages, self.task_kinds)

    def grid(self) -> list[dict]:
        """Points: every (reasoning_budget, batch_size), budget outermost."""
        return sweeps.expand_grid(reasoning_budget=self.budgets, batch_size=self.batch_sizes)

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The design (``workbench plan``): one arm per budget, a round per chunk of tasks (:func:`n_rounds` first)."""
        arms = len(self.budgets)
        return (EXPERIMENT, arms, n_rounds(self), int(self.max_rounds)) if arms >= 2 and n_rounds(self) >= 2 else None

    def design_kwargs(self) -> dict:
        """:meth:`workbench.run.design.DesignFields.design_kwargs` with the rounds counted in chunks: ``repeats``
        passes over the tasks first (:func:`n_rounds`)."""
        return {**super().design_kwargs(), "min_rounds": n_rounds(self)}


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one (budget, batch size) point over all tasks, in consecutive batches (the one-round fallback of
    :func:`run`: one round pairs nothing).

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
    batches = [list(tasks[i:i + bs]) for i in range(0, len(tasks), bs)]
    warmup_s = _prepare_point(loaded, cfg, point, batches[0])
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        for b, batch in enumerate(batches):
            recs, w = run_reasoning_batch(loaded, batch, cfg.spec(budget), cfg.thinking, cfg.temperature, cfg.top_p,
                                          cfg.seed + r)
            for i, rec in enumerate(recs):
                rec.update(repeat=r, request_id=b * bs + i, batch_index=b, batch_size=len(batch), batch_wall_s=w)
            requests.extend(recs)
            wall += w
    return PointResult(requests=requests, wall_s=wall, warmup_s=warmup_s, extra=_point_extra(requests))


def _prepare_point(loaded, cfg: Config, point: dict, first: list) -> float:
    """``cfg.warmup`` untimed runs of a point's first batch (its budget's token cap); the seconds they took."""
    fmt = thinking_format(loaded.tokenizer, cfg.thinking)
    spec = cfg.spec(point["reasoning_budget"])
    ids, phases = task_inputs(loaded.tokenizer, first, fmt, point["reasoning_budget"])
    settings = GenerationSettings(max_new_tokens=spec.total_new_tokens(fmt, PRE in phases),
                                  temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    return warm_up(loaded, [t.question for t in first], settings, n=cfg.warmup, input_ids=ids)


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
    """Rounds measured before the first look: ``repeats`` x the chunks of :func:`chunk_size`."""
    return cfg.repeats * math.ceil(cfg.num_tasks / chunk_size(cfg))


def _baselines(points: list[dict]) -> dict[int, dict]:
    """Per batch size, its baseline: the smallest budget."""
    out = {}
    for p in points:
        b = out.get(p["batch_size"])
        if b is None or p["reasoning_budget"] < b["reasoning_budget"]:
            out[p["batch_size"]] = p
    return out


def _largest(points: list[dict]) -> dict[int, dict]:
    """Per batch size, the point its finding compares with the baseline: the largest budget."""
    out = {}
    for p in points:
        b = out.get(p["batch_size"])
        if b is None or p["reasoning_budget"] > b["reasoning_budget"]:
            out[p["batch_size"]] = p
    return out


def _round_ttfat(records: list[dict]) -> float:
    """A batch's time to first answer token: the median over its rows (a row whose answer never began within the
    allowance counts its e2e, a lower bound of its TTFAT)."""
    vals = [x["ttfat_s"] if x.get("ttfat_s") == x.get("ttfat_s") else x.get("e2e_s") for x in records]
    vals = [v for v in vals if isinstance(v, (int, float)) and v == v]
    return metrics.percentiles(vals, (50,))["p50"] if vals else float("nan")


#: The primary outcome: the time to first answer token (a round: the geometric mean of its batches' medians).
TTFAT = design.Outcome("ttfat_s", False, "time to first answer token", "time_ratio")


def sweep_design(loaded, cfg: Config, points: list[dict], state: dict) -> design_sweep.SweepDesign:
    """The points as one design (:mod:`workbench.run.design`). Round ``u`` is pass ``u // chunks`` over chunk
    ``u % chunks`` of the tasks (:func:`chunk_size`): every point answers that chunk in its own batches at seed
    ``cfg.seed + pass`` (the same tasks and seed for every arm of a round), and the first batch size's smallest
    budget a second time, the A/A control (timed, not scored). Each batch size's points are a group against its
    smallest budget (marked); the primary outcome is the round's time to first answer token (:data:`TTFAT`: the
    geometric mean over the chunk's batches of each batch's median); the design stops early once every batch
    size's largest budget is decided. Requests are :func:`measure_point`'s (``request_id`` = the task's index,
    ``batch_index``; ``repeat`` = the round).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    if "tasks" not in state:
        state["tasks"] = cfg.tasks()
    tasks: Sequence[Task] = state["tasks"]
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    size = chunk_size(cfg)
    chunks = math.ceil(len(tasks) / size)

    def answer(p, rnd, score):
        rep, c = divmod(rnd, chunks)
        bs, budget = p["batch_size"], p["reasoning_budget"]
        records, values, wall = [], [], 0.0
        for start in range(c * size, min((c + 1) * size, len(tasks)), bs):
            batch = list(tasks[start:min(start + bs, (c + 1) * size, len(tasks))])
            recs, w = run_reasoning_batch(loaded, batch, cfg.spec(budget), cfg.thinking, cfg.temperature, cfg.top_p,
                                          cfg.seed + rep, score=score)
            values.append(_round_ttfat(recs))
            for i, rec in enumerate(recs):
                rec.update(request_id=start + i, batch_index=start // bs, batch_size=len(batch), batch_wall_s=w)
            records += recs
            wall += w
        ok = [v for v in values if v > 0]
        value = math.exp(sum(math.log(v) for v in ok) / len(ok)) if ok else float("nan")
        return design.Measured({TTFAT.name: value}, records, wall)

    groups: dict = {}
    for bs, base in _baselines(points).items():
        groups[pid(base)] = [pid(p) for p in points if p["batch_size"] == bs]
    first = pid(_baselines(points)[points[0]["batch_size"]])
    decide = [pid(p) for p in _largest(points).values() if pid(p) not in groups]
    d = design.Design(EXPERIMENT, [pid(p) for p in points], first, TTFAT, groups=groups, decide=decide or None,
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(
        d, lambda p, rnd: answer(p, rnd, True),
        lambda p: _prepare_point(loaded, cfg, p, list(tasks[:p["batch_size"]])),
        lambda point_id, result: _point_extra(_sorted(result.requests.get(point_id, []))),
        measure_aa=lambda p, rnd: answer(p, rnd, False))


def _sorted(records: list[dict]) -> list[dict]:
    """A point's requests in task order within each pass (seed), in place; returned."""
    records.sort(key=lambda x: (x.get("seed", 0), x["request_id"]))
    return records


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every (budget, batch size) point of ``cfg`` on the same seeded tasks (experiment ``reasoning``).

    With 2+ points and 2+ rounds (:func:`n_rounds`) the points are one design (:func:`sweep_design`): every finished
    round is on disk (``design/reasoning.parquet``) and a resume continues from the last one; the points are
    recorded when the design stops. Otherwise each point is measured, and written, on its own (:func:`measure_point`).

    Returns:
        The experiment's points DataFrame (see :func:`workbench.run.sweeps.run_sweep`).
    """
    state = {"tasks": cfg.tasks()}
    grid = cfg.grid()
    designed = sweep_design(loaded, cfg, grid, state) if len(grid) >= 2 and n_rounds(cfg) >= 2 else None
    return sweeps.run_sweep(run_dir, EXPERIMENT, grid, lambda p: measure_point(loaded, cfg, p, state), resume=resume,
                            info=loaded.info, loaded=loaded, config=cfg, design=designed)


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


def accuracy_pairs(requests, lo, hi, batch_size=None):
    """The same tasks answered at budgets ``lo`` and ``hi``: per task (and, when sampled, per pass: the seed), the
    exact match under each, paired. Greedy passes give a task's answer again, so each task counts once (its first
    pass).

    Args:
        requests: the experiment's requests (``task_id``, ``seed``, ``reasoning_budget``, ``exact_match``).
        lo, hi: the two budgets.
        batch_size: only this batch size's answers (None: all, one pair per task and seed).

    Returns:
        ``(hi values, lo values)``: two equal-length lists of 0/1, the same task at each position.
    """
    req = requests if batch_size is None else requests[requests["batch_size"] == batch_size]
    greedy = "temperature" not in req or (req["temperature"].fillna(0) == 0).all()
    keys = ["task_id"] if greedy else ["task_id", "seed"]
    sides = {}
    for b in (lo, hi):
        g = req[req["reasoning_budget"] == b].sort_values([c for c in ("seed", "repeat") if c in req])
        sides[b] = g.drop_duplicates(keys).set_index(keys)["exact_match"].astype(float)
    both = sides[hi].index.intersection(sides[lo].index)
    return list(sides[hi].loc[both]), list(sides[lo].loc[both])


def accuracy_clause(requests, small, large, alpha: float = blocks.ALPHA, batch_size=None) -> tuple[str, str]:
    """Accuracy at budget ``large`` against ``small`` over the same tasks, paired
    (:func:`workbench.stats.blocks.paired_binary`: McNemar's exact test and its exact conditional interval for a
    direction, the unconditional interval for equivalence within +-10 points), with its own verdict.

    Returns:
        ``(clause, evidence)``.
    """
    a, b = accuracy_pairs(requests, small, large, batch_size)
    if not a:
        return f"accuracy at budget {large:g} vs {small:g}: undecided: no task answered under both", ""
    got = blocks.paired_binary(a, b, alpha=alpha)
    pct = f"{100 * (1 - alpha):.3g}%"
    pts = (lambda lo, hi: f"{lo * 100:+.0f} to {hi * 100:+.0f} points")
    ulo, uhi = got["unconditional"]
    head = (f"accuracy at budget {large:g} vs {small:g} over the same {got['n']} tasks: {sum(b) / len(b):.0%} -> "
            f"{sum(a) / len(a):.0%}")
    diff = f"{got['difference'] * 100:+.0f} points"
    if got["verdict"] == "direction":
        text = (f"{head}: {'rises' if got['direction'] == 'higher' else 'falls'}, {diff}, {pct} interval "
                f"{pts(got['low'], got['high'])}")
    elif got["verdict"] == "equivalent":
        text = f"{head}: equivalent within +-10 points: {diff}, {pct} interval {pts(ulo, uhi)}"
    else:
        why = ("no task solved under either budget: the tasks are beyond this model" if sum(a) + sum(b) == 0
               else "more tasks (num_tasks) would decide it, not more rounds (a greedy answer repeats)")
        text = (f"{head}: undecided: {diff}, {pct} interval {pts(got['low'], got['high'])} given the tasks that "
                f"changed, {pts(ulo, uhi)} over all tasks; {why}")
    return text, got["method"]


def _design_rows(points):
    """The usable points measured as a design (their decision columns), or None."""
    from workbench.stats import evidence

    if points is None or len(points) == 0 or "design" not in points or TTFAT.prefix not in points:
        return None
    ok = evidence.usable_points(points)
    ok = ok[ok["design"].map(lambda v: isinstance(v, str) and bool(v))]
    return ok if len(ok) else None


def finding(points, requests=None):
    """What the largest thinking budget costs against the smallest, with ONE primary comparison setting the verdict.

    The primary comparison, per batch size: the time to first answer token at the largest budget over the smallest,
    the design's block analysis (:data:`TTFAT`; the verdict of the batch size that is least decided,
    :func:`workbench.run.design.weakest`; an A/A control that moved leaves it undecided). Beside it the means
    (thinking tokens, time to first answer token) as measured, and, secondary with its own verdict and never the
    mark, accuracy over the same tasks, paired (:func:`accuracy_clause`, Bonferroni over the batch sizes). A run
    without a design (one round) decides nothing: undecided.

    Args:
        points: this experiment's points (valid ones are used).
        requests: its requests (one row per task and round); None: no accuracy comparison.

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    from workbench.stats import evidence

    ok = evidence.usable_points(points)
    if ok.empty or "reasoning_budget" not in ok:
        return evidence.nothing_valid("reasoning point finished", points)
    ids = evidence.point_ids(ok)
    lo, hi = ok["reasoning_budget"].min(), ok["reasoning_budget"].max()
    by = ok.groupby("reasoning_budget")[["exact_match_mean", "ttfat_s_p50", "thinking_tokens_mean"]].mean()
    means = (f"Thinking tokens {by.loc[lo, 'thinking_tokens_mean']:.0f} -> {by.loc[hi, 'thinking_tokens_mean']:.0f}, "
             f"time to first answer token p50 {by.loc[lo, 'ttfat_s_p50']:.2f} -> {by.loc[hi, 'ttfat_s_p50']:.2f} s"
             + (" (means over batch sizes)" if ok["batch_size"].nunique() > 1 else "") + ".")
    rows = _design_rows(points)
    decisions, clauses, ev = [], [], []
    sizes = sorted(set(ok["batch_size"]))
    if rows is not None and lo != hi:
        for bs in sizes:
            g = rows[rows["batch_size"] == bs]
            top, base = g[g["reasoning_budget"] == g["reasoning_budget"].max()], g["reasoning_budget"].min()
            if top.empty or top["reasoning_budget"].iloc[0] == base:
                continue
            row = top.iloc[0]
            dec = design.decision_from_row(row, TTFAT)
            if dec is None:
                continue
            tag = f" (batch {bs:g})" if len(sizes) > 1 else ""
            name = f"Time to first answer token at budget {row['reasoning_budget']:g} vs {base:g}{tag}"
            clauses.append(dec.describe(name, words=TTFAT.words,
                                        seconds_per_round=float(row.get("seconds_per_round", float("nan")))))
            decisions.append((row, dec))
        ev.append(f"primary: time to first answer token per round (a chunk of the tasks; the geometric mean of its "
                  f"batches' medians), {design.evidence_text(rows.iloc[0])}")
    weakest = design.weakest([d for _, d in decisions])
    if weakest is None:
        text = (f"Time to first answer token at budget {hi:g} vs {lo:g}: undecided: no comparison (one round pairs "
                f"nothing: 2+ rounds, repeats x chunks of the tasks, measure the budgets as a design).")
        fields = {"verdict": "undecided"}
    else:
        row = next(r for r, d in decisions if d is weakest)
        text = "; ".join(clauses) + "."
        fields = design.finding_fields(row, weakest)
        if row.get("aa_verdict") == "direction":
            text += " The A/A control moved (the smallest budget against itself shows a direction): drift, not effects."
            fields["verdict"] = "undecided"
    text += " " + means
    if requests is not None and "exact_match" in requests and lo != hi:
        req = requests[requests["point_id"].isin(ok["point_id"])] if "point_id" in requests else requests
        acc = [accuracy_clause(req, lo, hi, blocks.ALPHA / len(sizes), bs if len(sizes) > 1 else None)
               + ((f" (batch {bs:g})" if len(sizes) > 1 else ""),) for bs in sizes]
        text += " Secondary, with its own verdict: " + "; ".join(c + tag for c, _, tag in acc) + "."
        ev += [f"accuracy{tag}: {m}" for _, m, tag in acc if m]
        ev.append("accuracy paired task by task (the same tasks under both budgets; greedy repeats counted once)"
                  + (f", Bonferroni over {len(sizes)} batch sizes" if len(sizes) > 1 else ""))
    return evidence.Finding(text, "; ".join(ev), True, ids, **fields)


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
    plots.mark_invalid(fig, pts, "reasoning_budget", "output_throughput_tps")
    return predictions.add_predicted_line(fig, pts, "reasoning_budget", "predicted_output_throughput_tps",
                                       group="batch_size")


def fig_time_ratio(points, run_dir=None):
    """Time to first answer token of every budget over its batch size's smallest budget, with the simultaneous
    interval its verdict was read from, each round's ratio faint, the equivalence band and the A/A control's
    interval (:func:`workbench.share.figures_design.ratio_figure`)."""
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, TTFAT.name)
    fig = figures_design.ratio_figure(
        plots.ok_points(points), "reasoning_budget", TTFAT.prefix, rounds, group="batch_size",
        name=lambda bs: f"batch {bs}", x_title=plots.label("reasoning_budget"),
        y_title="TTFAT / the smallest budget's (x)",
        title="Time to first answer token over the smallest budget (simultaneous 95% intervals; faint: each round)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(points, requests, run_dir=None) -> dict:
    """All figures of the notebook, in report order: ``{name: figure}`` (the time ratio only from a design;
    ``run_dir``: its rounds for the faint points)."""
    figs = {
        "reasoning_latency_vs_budget": fig_latency_vs_budget(points),
        "reasoning_quality_vs_budget": fig_quality_vs_budget(quality_summary(requests)),
        "reasoning_thinking_tokens": fig_thinking_distribution(requests),
        "reasoning_throughput_vs_budget": fig_throughput_vs_budget(points),
    }
    if TTFAT.prefix in points and points[TTFAT.prefix].notna().any():  # measured as a design (issue 49)
        figs["reasoning_time_ratio"] = fig_time_ratio(points, run_dir)
    return figs


def _count(v) -> str:
    """A token count as an integer (``11``, not the column's float ``11.0``), ``?`` where missing."""
    return "?" if v is None or v != v else f"{int(v)}"


def examples_markdown(requests, per_budget: int = 2) -> str:
    """Markdown with the first ``per_budget`` requests of each budget: question id, thinking, answer, gold."""
    lines = ["# Reasoning budget: example outputs", ""]
    first = requests[requests["repeat"] == requests["repeat"].min()] if "repeat" in requests else requests
    first = first[first["batch_size"] == first["batch_size"].min()]
    for budget, g in first.groupby("reasoning_budget", sort=True):
        lines += [f"## Budget {budget:g} thinking tokens", ""]
        for _, r in g.head(per_budget).iterrows():
            pred = r["prediction"] if isinstance(r["prediction"], str) else "none"
            lines += [f"**{r['task_id']}** (gold `{r['gold']}`, predicted `{pred}`, "
                      f"{_count(r['thinking_tokens'])} thinking + {_count(r['answer_tokens'])} answer tokens)", "",
                      "```", f"{r['thinking_text']}{r['answer_text']}", "```", ""]
    return "\n".join(lines)
