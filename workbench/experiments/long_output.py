"""Long output (notebook ``07_long_output``): one shot, or outline then sections, at one token budget.

One point per (language, strategy): :func:`workbench.techniques.long_form.run_long_output`
writes the same article with ``one_shot``, ``outline_batch`` or
``outline_sequential`` under one total token budget and records time to first
visible text (``first_text_s``), to first section text, wall time (``wall_s``),
length, section coverage, repetition across sections and throughput (one row
per round). A row merges several requests, so it names those quantities for
what they are; ``ttft_s`` / ``itl_s`` are a request's own (the one-shot row), and
``batch_size`` is the number of requests that shared a forward pass (the
sections of ``outline_batch``; 1 otherwise), which MBU / MFU use. Each round's
merged text (with its outline) is saved under ``texts/`` in the run folder.

Design (issue 49; :mod:`workbench.run.design`): with 2+ points and ``repeats`` >= 2 the points are the arms of one
design (:func:`sweep_design`): round ``r`` writes every (language, strategy) text once at seed ``seed + r`` (the same
topic, plan and seed for every strategy of a language), and the first language's ``one_shot`` text a second time, the
A/A control (timed, neither saved nor stored), in an order shuffled per round; ``repeats`` rounds first, then more
while a comparison is undecided, up to ``max_rounds`` and within ``budget_s``. Each language's strategies are a group
against its ``one_shot`` (:func:`baseline_strategy`, marked). The **primary outcome** is the text's wall time
(:data:`WALL`); the time to first visible text (:data:`FIRST_TEXT`) is secondary, with its own verdict.

:func:`finding` names the fastest strategy per language within the quality guard (:func:`_guarded`) and decides it
against ``one_shot`` (the design's simultaneous interval) and against its runner-up
(:func:`workbench.stats.blocks.pick_versus`, Tukey's level: the pick is chosen after looking); a ``one_shot`` pick is
a verdict only when every other strategy is slower beyond noise or equivalent. With one repeat (a round pairs
nothing) each point runs on its own (:func:`measure_point`) and the finding decides nothing.
:func:`figures` compares wait and total time per strategy, and the ratios with their intervals.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.checks import check_choice_list, check_int
from workbench.measure.generation import WARMUP_NEW_TOKENS, GenerationSettings, warm_up
from workbench.predict import predictions
from workbench.run import design, design_sweep, point_result, results, sweeps  # noqa: F401  (plots registers the house template)
from workbench.run.point_result import PointResult
from workbench.share import figures_design, plots
from workbench.stats import blocks, evidence, metrics
from workbench.techniques.long_form import DEFAULT_TOPICS, LANGUAGES, STRATEGIES, LongOutputPlan, run_long_output

EXPERIMENT = "long_output"


@dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """Long-output strategies (notebook ``07_long_output``).

    With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`): ``repeats``
    rounds first, up to ``max_rounds`` while a comparison is undecided and ``budget_s`` allows.

    Attributes:
        budget_tokens: total new-token budget per text, the same for every strategy.
        n_sections: sections asked for.
        outline_tokens: outline budget (0: about 12 per section, at most a quarter of the budget).
        strategies: any of ``one_shot``, ``outline_batch``, ``outline_sequential``.
        languages: ``en`` and / or ``zh``.
        topic_en, topic_zh: the article titles.
        temperature: 0 = greedy.
        repeats: rounds before the first look (each round: every text once).
    """

    budget_tokens: int = 256
    n_sections: int = 4
    outline_tokens: int = 0
    strategies: list = field(default_factory=lambda: list(STRATEGIES))
    languages: list = field(default_factory=lambda: ["en", "zh"])
    topic_en: str = DEFAULT_TOPICS["en"]
    topic_zh: str = DEFAULT_TOPICS["zh"]
    temperature: float = 0.0
    repeats: int = 2  # rounds before the design's first look (the notebook's default: its parameters cell agrees)
    max_rounds: int = 4

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        check_int("budget_tokens", self.budget_tokens, lo=16)
        check_int("outline_tokens", self.outline_tokens, lo=0)
        check_choice_list("strategies", self.strategies, STRATEGIES)
        check_choice_list("languages", self.languages, LANGUAGES)
        GenerationSettings(max_new_tokens=self.budget_tokens, temperature=self.temperature)
        self.plan()

    def plan(self) -> LongOutputPlan:
        """The budget split (raises ParameterError when sections get < 8 tokens)."""
        return LongOutputPlan.make(self.budget_tokens, self.n_sections, self.outline_tokens or None)

    def topic(self, language: str) -> str:
        return {"en": self.topic_en, "zh": self.topic_zh}[language]

    def grid(self) -> list[dict]:
        """Points: every (language, strategy), language outermost (what :func:`run` sweeps; ``workbench plan``
        counts them)."""
        return sweeps.expand_grid(language=self.languages, strategy=self.strategies)


#: Per-request columns summarised (median, ``<column>_p50``) in each point.
SUMMARY_COLUMNS = ("coverage", "repetition", "sections_found", "first_text_s", "first_section_s", "chars")

#: The primary outcome: a text's wall time, start to merged text (it alone sets the finding's verdict).
WALL = design.Outcome("wall_s", False, "wall time", "time_ratio")
#: Secondary: the time to first visible text (what a reader waits for before anything shows).
FIRST_TEXT = design.Outcome("first_text_s", False, "time to first visible text", "first_text_vs_control")


def baseline_strategy(strategies) -> str:
    """The strategy every other is compared with.

    Args:
        strategies: the strategies measured (names of :data:`workbench.techniques.long_form.STRATEGIES`).

    Returns:
        ``one_shot`` when measured, else the first one listed.
    """
    strategies = list(strategies)
    return "one_shot" if "one_shot" in strategies else strategies[0]


def _save_text(run_dir, cfg: Config, point: dict, repeat: int, res) -> None:
    """Save one round's merged text (with its outline) as ``texts/long_output_<strategy>_<language>_r<repeat>.md``."""
    if run_dir is None:
        return
    strategy, language = point["strategy"], point["language"]
    head = (f"# {cfg.topic(language)}\n\nstrategy: {strategy}, budget {cfg.plan().budget_tokens} tokens, "
            f"repeat {repeat}\n\n")
    if res.outline:
        head += "## Outline (as generated)\n\n" + res.outline + "\n\n---\n\n"
    results.save_text(run_dir, f"texts/long_output_{strategy}_{language}_r{repeat}.md", head + res.text + "\n")


def _point_extra(rows: list[dict]) -> dict:
    """A point's ``extra``: the median ``<column>_p50`` of :data:`SUMMARY_COLUMNS` over its texts."""
    return {f"{k}_p50": metrics.percentiles([q[k] for q in rows], (50,))["p50"] for k in SUMMARY_COLUMNS}


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One ``{"language", "strategy"}`` point, its repeats back to back (the one-repeat fallback of :func:`run`).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the notebook's :class:`Config` (plan, topic, repeats, temperature, seed).
        point: ``{"language": .., "strategy": ..}``.
        state: shared by the points of one sweep: ``run_dir`` (optional): each repeat's merged text (with
            outline) is saved as ``texts/long_output_<strategy>_<language>_r<repeat>.md``; ``warmed``: set
            by the first point, which runs ``cfg.warmup`` untimed short generations of the topic before its
            timed runs (:func:`workbench.measure.generation.warm_up`), the later ones none.

    Returns:
        :class:`workbench.run.point_result.PointResult`: a row per repeat, ``wall_s`` (seconds), ``warmup_s`` and
        ``extra`` (``<column>_p50`` of :data:`SUMMARY_COLUMNS`).
    """
    strategy, language = point["strategy"], point["language"]
    plan, topic = cfg.plan(), cfg.topic(language)
    warmup = 0 if state.get("warmed") else cfg.warmup
    state["warmed"] = True
    warmup_s = warm_up(loaded, [topic], GenerationSettings(max_new_tokens=WARMUP_NEW_TOKENS), warmup)
    rows, wall = [], 0.0
    for r in range(cfg.repeats):
        res = run_long_output(loaded, strategy, topic, plan, language, cfg.temperature, cfg.seed + r)
        rows.append(dict(res.row, repeat=r, request_id=0))
        wall += res.row["wall_s"]
        _save_text(state.get("run_dir"), cfg, point, r, res)
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s, extra=_point_extra(rows))


def sweep_design(loaded, cfg: Config, points: list[dict], state: dict) -> design_sweep.SweepDesign:
    """The points as one design (:mod:`workbench.run.design`): round ``r`` writes every point's text once at seed
    ``cfg.seed + r`` and the first language's baseline (:func:`baseline_strategy`) a second time, the A/A control
    (timed, its text neither saved nor stored). Each language's strategies are a group against its baseline
    (marked); the primary outcome is the text's wall time (:data:`WALL`), the time to first visible text
    (:data:`FIRST_TEXT`) secondary; every strategy must be decided for an early stop (the pick and its runner-up
    are known only at the end). ``cfg.warmup`` untimed short generations of each language's topic come first (its
    first arm's warm-up).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the notebook's :class:`Config`.
        points: the grid (``{"language", "strategy"}`` dicts), first language first.
        state: ``run_dir`` (optional): where each text is saved (as :func:`measure_point` does, ``r<round>``).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    plan = cfg.plan()
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    langs = list(dict.fromkeys(p["language"] for p in points))
    base = {lang: pid(next(p for p in points if p["language"] == lang
                           and p["strategy"] == baseline_strategy(q["strategy"] for q in points
                                                                  if q["language"] == lang))) for lang in langs}
    warmed: set = set()

    def write(p, rnd, save):
        res = run_long_output(loaded, p["strategy"], cfg.topic(p["language"]), plan, p["language"], cfg.temperature,
                              cfg.seed + rnd)
        if save:
            _save_text(state.get("run_dir"), cfg, p, rnd, res)
        row = dict(res.row, request_id=0)
        first = row.get("first_text_s")
        shown = first if isinstance(first, (int, float)) and math.isfinite(first) and first > 0 else row["wall_s"]
        return design.Measured({WALL.name: row["wall_s"], FIRST_TEXT.name: shown}, [row], row["wall_s"])

    def prepare(p):
        if p["language"] in warmed:
            return 0.0
        warmed.add(p["language"])
        return warm_up(loaded, [cfg.topic(p["language"])], GenerationSettings(max_new_tokens=WARMUP_NEW_TOKENS),
                       cfg.warmup)

    groups = {base[lang]: [pid(p) for p in points if p["language"] == lang] for lang in langs}
    d = design.Design(EXPERIMENT, [pid(p) for p in points], base[langs[0]], WALL, (FIRST_TEXT,), groups=groups,
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, lambda p, rnd: write(p, rnd, True), prepare,
                              lambda point_id, result: _point_extra(result.requests.get(point_id, [])),
                              measure_aa=lambda p, rnd: write(p, rnd, False))


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every (language, strategy) point of ``cfg``.

    With 2+ points and ``repeats`` >= 2 the points are one design (:func:`sweep_design`): every finished round is on
    disk (``design/long_output.parquet``) and a resume continues from the last one; the points are recorded when the
    design stops. With one repeat there is nothing to pair and each point is measured, and written, on its own
    (:func:`measure_point`, warm-up before the first point only).

    Returns:
        The ``long_output`` points.
    """
    grid = cfg.grid()
    state = {"run_dir": run_dir}
    designed = sweep_design(loaded, cfg, grid, state) if len(grid) >= 2 and cfg.repeats >= 2 else None
    return sweeps.run_sweep(run_dir, EXPERIMENT, grid, lambda p: measure_point(loaded, cfg, p, state), resume=resume,
                            info=loaded.info, loaded=loaded, config=cfg, design=designed)


REQUEST_COLUMNS = ("language", "strategy", "first_text_s", "first_section_s", "wall_s", "output_tokens", "batch_size",
                   "tpot_s", "chars", "sections_found", "coverage", "repetition", "output_throughput_tps")


def _only(requests: pd.DataFrame) -> pd.DataFrame:
    """This experiment's rows (a run folder may hold every notebook of a suite)."""
    return requests[requests["experiment"] == EXPERIMENT] if "experiment" in requests else requests


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per text: waits, length, coverage, repetition and throughput (seconds)."""
    df = _only(requests)
    return df[[c for c in REQUEST_COLUMNS if c in df]].reset_index(drop=True)


def _design_rows(points: pd.DataFrame | None) -> pd.DataFrame | None:
    """The usable points measured as a design (their decision columns), or None."""
    if points is None or len(points) == 0 or "design" not in points or WALL.prefix not in points:
        return None
    ok = evidence.usable_points(points)
    if "language" not in ok or "strategy" not in ok:
        return None
    ok = ok[ok["design"].map(lambda v: isinstance(v, str) and bool(v))]
    return ok if len(ok) else None


def _guarded(med: pd.DataFrame, base: str) -> list:
    """The strategies a pick may name (the quality guard): those whose median section coverage is not below the
    baseline's (a strategy that is faster because it delivers fewer of the sections asked for is no faster way to
    write the article, as a speed technique is judged within its quality guard). A NaN coverage (not measured)
    guards nothing.

    Args:
        med: per-strategy medians indexed by strategy (``wall_s`` and, when measured, ``coverage`` in [0, 1]).
        base: the baseline strategy (:func:`baseline_strategy`), always kept.

    Returns:
        The kept strategies, in ``med``'s order.
    """
    if "coverage" not in med or pd.isna(med.loc[base, "coverage"]):
        return list(med.index)
    floor = float(med.loc[base, "coverage"])
    return [s for s in med.index if s == base or pd.isna(med.loc[s, "coverage"])
            or float(med.loc[s, "coverage"]) >= floor - 1e-9]


def pick_decision(mine: pd.DataFrame, kept: list, base: str, analysis=None) -> tuple[str, str, blocks.Decision | None]:
    """One language's pick, the fastest strategy within the quality guard by the design's wall-time ratio to
    ``base``, and the decision that carries it.

    A strategy other than ``base`` is decided when it is faster than ``base`` beyond noise (or equivalent to it) in
    the design's simultaneous interval AND its comparison with the runner-up (:func:`workbench.stats.blocks.pick_versus`
    on ``analysis``, Tukey's level over the kept strategies: the pick was chosen after looking) is decided, faster or
    equivalent; with the runner-up being ``base``, its comparison with ``base`` is that one. ``base`` itself is a
    verdict only when every other kept strategy is slower beyond noise or equivalent ("keep the baseline: none shown
    faster"): equivalent when all are, else a direction. Otherwise undecided, with the rounds its open comparisons
    need.

    Args:
        mine: the language's design rows, indexed by strategy (the ``time_ratio`` decision columns).
        kept: the strategies within the quality guard (:func:`_guarded`), ``base`` among them.
        base: the language's baseline.
        analysis: the design's primary analysis (:func:`workbench.run.design.reanalyse`), None: not at hand.

    Returns:
        ``(pick, clause, decision)``: the decision's verdict and rounds needed are the pick's (None when no kept
        strategy was compared).
    """
    ratio = {s: 1.0 if s == base else float(mine.loc[s, WALL.prefix]) for s in kept if s in mine.index}
    order = sorted(ratio, key=lambda s: (ratio[s], s != base))
    best = order[0]
    spr = float(mine.iloc[0].get("seconds_per_round", float("nan")))
    rows = {s: mine.loc[s].to_dict() | {"point_id": mine.loc[s, "point_id"]} for s in ratio}
    if best == base:
        others = {s: design.decision_from_row(rows[s], WALL) for s in order[1:]}
        others = {s: d for s, d in others.items() if d is not None}
        if not others:
            return best, f"keep {base}: no other strategy compared", None
        v, _ = blocks.keep_control(list(others.values()), WALL.higher_is_better)
        said = "; ".join(d.describe(s, words=WALL.words, seconds_per_round=spr) for s, d in others.items())
        open_ = design.weakest(list(others.values()))
        if v != "undecided":
            return best, f"keep {base}: every other strategy is slower beyond noise or equivalent ({said})", \
                dataclasses.replace(open_, verdict=v, rounds_needed=0)
        return best, (f"{base} is the fastest, but not every other strategy is decided slower or equivalent: none "
                      f"shown faster ({said})"), dataclasses.replace(open_, verdict="undecided")
    vs_base = design.decision_from_row(rows[best], WALL)
    if vs_base is None:
        return best, "not compared", None
    clause = vs_base.describe(f"against {base}", words=WALL.words, seconds_per_round=spr)
    rival = order[1]
    vs_rival = vs_base
    if rival != base:
        cols = analysis.table.columns if analysis is not None else ()
        if rows[best]["point_id"] in cols and rows[rival]["point_id"] in cols:
            vs_rival = blocks.pick_versus(analysis, rows[best]["point_id"], rows[rival]["point_id"],
                                          candidates=len(ratio))
            clause += "; " + vs_rival.describe(f"against the runner-up, {rival}", words=WALL.words,
                                               seconds_per_round=spr)
        else:
            vs_rival = None
            clause += f"; against the runner-up, {rival}: undecided: the run folder's design table is not at hand"
    if vs_rival is None:
        return best, clause, dataclasses.replace(vs_base, verdict="undecided", rounds_needed=None)
    if blocks.pick_stands(vs_base, vs_rival):    # the pick's ratio is below 1: a direction is "faster"
        return best, clause, vs_base
    worst = design.weakest([d for d in (vs_base, vs_rival) if not d.decided]) or vs_rival
    return best, clause, dataclasses.replace(vs_base, verdict="undecided", rounds_needed=worst.rounds_needed)


def finding(requests: pd.DataFrame, points: pd.DataFrame | None = None, run_dir=None) -> evidence.Finding:
    """Per language, the fastest strategy within the quality guard (:func:`_guarded`: median section coverage not
    below the baseline's; a strategy left out is named with its coverage and time), decided by
    :func:`pick_decision`: against ``one_shot`` (the design's simultaneous interval of the wall-time ratio) and
    against its runner-up (Tukey's level, from the run folder's design table); a ``one_shot`` pick only when every
    other strategy is slower beyond noise or equivalent. The primary comparison, the one that sets the verdict, is
    the first language's pick (the suite's ``languages[0]``, English by default; issue 49: one primary outcome sets a
    finding's mark); every other language's pick is said with its own verdict beside it, never the mark. An A/A
    control that moved leaves it undecided. Secondary, each with its own verdict and never the mark: each strategy's
    time to first visible text against ``one_shot``. Point-by-point runs (one repeat) pair nothing: undecided.

    Args:
        requests: this experiment's rows (one per text and round).
        points: its points; when given, only rows of usable (valid) points count, and the decisions come from them.
        run_dir: the run folder (its ``design/long_output.*``: the pick against its runner-up).

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    df = _only(requests)
    if points is not None and "point_id" in df:
        df = df[df["point_id"].isin(evidence.usable_points(points)["point_id"])]
    if df.empty or "wall_s" not in df:
        return evidence.nothing_valid("long-output request finished", points, run_dir)
    ids = tuple(dict.fromkeys(str(p) for p in df["point_id"])) if "point_id" in df else ()
    if "language" not in df:
        df = df.assign(language="all")
    rows = _design_rows(points)
    again = design.reanalyse(run_dir, EXPERIMENT) if run_dir is not None and rows is not None else None
    parts, guard_clauses, second, ev, decided = [], [], [], [], []
    order = list(dict.fromkeys(points["language"] if points is not None and "language" in points else df["language"]))
    groups = dict(tuple(df.groupby("language", sort=False)))
    for lang in [x for x in order if x in groups] + [x for x in groups if x not in order]:   # the plan's order
        g = groups[lang]
        med = g.groupby("strategy")[[c for c in ("wall_s", "first_text_s", "coverage") if c in g]].median()
        base = baseline_strategy(med.index)
        kept = _guarded(med, base)
        guard = f" of those covering at least {base}'s sections" if len(kept) < len(med) else ""
        for s in med.index:
            if s not in kept:
                guard_clauses.append(f"{s} ({lang}) left out of the pick by the quality guard: coverage "
                                     f"{med.loc[s, 'coverage']:.0%} against {base}'s {med.loc[base, 'coverage']:.0%} "
                                     f"(median wall time {med.loc[s, 'wall_s']:.1f} s)")
        mine = rows[rows["language"] == lang].set_index("strategy") if rows is not None else None

        def figures_of(s):
            row = med.loc[s]
            cov = f", coverage {row['coverage']:.0%}" if "coverage" in row and pd.notna(row["coverage"]) else ""
            first = row.get("first_text_s", math.nan)
            return f"median wall time {row['wall_s']:.1f} s, first text after {first:.2f} s{cov}"

        if mine is None or len(med) < 2 or base not in mine.index:
            best = med.loc[kept, "wall_s"].idxmin()
            why = ("one strategy only" if len(med) < 2 else
                   "one round pairs nothing (repeats >= 2 measure the strategies as a design)")
            parts.append(f"{lang}: {best} has the shortest median wall time{guard} ({figures_of(best)}): "
                         f"undecided: {why}")
            decided.append((None, None))
            continue
        best, clause, dec = pick_decision(mine, kept, base, again[1] if again is not None else None)
        role = "" if not decided else f"secondary ({dec.verdict}), "
        if best == base:
            parts.append(f"{lang}: {role}{clause} ({base}: {figures_of(base)})")
        else:
            parts.append(f"{lang}: {role}{best} is the fastest{guard} ({figures_of(best)}): {clause}")
        decided.append((mine.iloc[0].to_dict(), dec))
        for s in mine.index:
            if s == base:
                continue
            said = design.secondary_clause(mine.loc[s], FIRST_TEXT, f"{s} first visible text vs {base} ({lang})")
            if said is not None:
                second.append(said)
        ev.append(f"{lang}: wall time per round, {design.evidence_text(mine.iloc[0])}; baseline {base}")
    text = "; ".join(parts) + "."
    if guard_clauses:
        text += " " + " ".join(c + "." for c in guard_clauses)
    if second:
        text += " Secondary, each with its own verdict: " + "; ".join(second) + "."
    if rows is None:
        ev.append("measured point by point (one repeat): no design, no A/A control")
    row, primary = decided[0] if decided else (None, None)   # the first language's pick is the primary comparison
    if primary is None:             # no decision for it: nothing to read a verdict from
        fields = {"verdict": "undecided"}
    else:
        fields = design.finding_fields(row, primary)
        if row.get("aa_verdict") == "direction":
            text += " The A/A control moved (one_shot against itself shows a direction): drift, not effects."
            fields["verdict"] = "undecided"
    return evidence.Finding(text, "; ".join(ev), True, ids, **fields)


def long_output_figure(requests: pd.DataFrame) -> go.Figure:
    """Time to first visible text, to first section text, and wall time per strategy (medians over repeats)."""
    requests = _only(requests)
    keys = [k for k in ("strategy", "language") if k in requests]
    g = requests.groupby(keys, as_index=False, sort=False).agg(
        first_text_s=("first_text_s", "median"), first_section_s=("first_section_s", "median"), wall_s=("wall_s", "median"),
        coverage=("coverage", "median"), repetition=("repetition", "median"),
        output_tokens=("output_tokens", "median"))
    pred = predictions.predict_rows(requests).groupby(keys, as_index=False, sort=False)["predicted_e2e_s"].median()
    long = pd.concat([
        g.assign(measure="first visible text", seconds=g["first_text_s"]),
        g.assign(measure="first section text", seconds=g["first_section_s"]),
        g.assign(measure="wall time", seconds=g["wall_s"]),
    ] + ([g.merge(pred, on=keys).assign(measure="wall time, predicted (roofline, one generate)",
                                         seconds=lambda d: d["predicted_e2e_s"])]
         if pred["predicted_e2e_s"].notna().any() else []))
    return px.bar(long, x="strategy", y="seconds", color="measure", barmode="group",
                  facet_col="language" if "language" in long else None,
                  hover_data=["coverage", "repetition", "output_tokens"],
                  labels={"seconds": "time (s)", "strategy": "strategy"},
                  title="Long output at equal token budget: wait and total time")


def fig_time_ratio(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Wall time of each strategy over its language's baseline (``one_shot``), with the simultaneous interval its
    verdict was read from, each round's ratio faint, the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`), one series per language.

    Args:
        points: the experiment's points with the ``time_ratio`` decision columns (a design's).
        run_dir: the run folder (the design's rounds for the faint points), or None.

    Returns:
        A plotly figure: strategy on x, the wall-time ratio (x, 1 = as fast as ``one_shot``) on y.
    """
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, WALL.name)
    fig = figures_design.ratio_figure(plots.ok_points(points), "strategy", WALL.prefix, rounds, group="language",
                                      x_title="strategy", y_title="wall time / one_shot's (x)",
                                      title="Wall time over one_shot (simultaneous 95% intervals; faint: each round)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(requests: pd.DataFrame, points: pd.DataFrame | None = None, run_dir=None) -> dict[str, go.Figure]:
    """The notebook's figures by file name, from the run's request rows (``results.read_requests(run)``) and, when
    given, its points (a design adds ``long_output_time_ratio``: the ratios with their intervals; ``run_dir``: its
    rounds for the faint points)."""
    figs = {"long_output": long_output_figure(requests)}
    if points is not None and WALL.prefix in points and points[WALL.prefix].notna().any():   # issue 49
        figs["long_output_time_ratio"] = fig_time_ratio(points, run_dir)
    return figs
