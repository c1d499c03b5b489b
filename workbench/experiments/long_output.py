"""Long output (notebook ``07_long_output``): one shot, or outline then sections, at one token budget.

One point per (language, strategy): :func:`workbench.techniques.long_form.run_long_output`
writes the same article with ``one_shot``, ``outline_batch`` or
``outline_sequential`` under one total token budget and records time to first
visible text (``first_text_s``), to first section text, wall time (``wall_s``),
length, section coverage, repetition across sections and throughput (one row
per repeat). A row merges several requests, so it names those quantities for
what they are; ``ttft_s`` / ``itl_s`` are a request's own (the one-shot row), and
``batch_size`` is the number of requests that shared a forward pass (the
sections of ``outline_batch``; 1 otherwise), which MBU / MFU use. Each repeat's
merged text (with its outline) is saved under ``texts/`` in the run folder.

Design (issue 32; :mod:`workbench.stats.comparison`): with 2+ points and ``repeats`` >= 2 the points are
arms measured interleaved by round (:func:`measure_interleaved`): round ``r`` writes every (language,
strategy) text once at seed ``seed + r``, plus the first language's ``one_shot`` text a second time, the
A/A control, in an order shuffled per round from the seed. Per language, each strategy's wall time over
``one_shot``'s (:func:`baseline_strategy`) is the paired within-round ratio, Holm over the language's
strategies (``time_ratio`` columns), and every point carries the A/A columns
(:data:`workbench.stats.comparison.COLUMNS`): the noise floor :func:`finding` prints beside the ratios and
:func:`fig_time_ratio` shades. With one repeat (a round pairs nothing) each point runs on its own
(:func:`measure_point`) and the finding makes no comparative claim.
:func:`figures` compares wait and total time per strategy, and the ratios with the A/A band.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.stats import comparison, evidence, metrics
from workbench.share import plots
from workbench.predict import predictions
from workbench.run import point_result, results, sweeps  # noqa: F401  (plots registers the house template)
from workbench.checks import check_choice_list, check_int
from workbench.measure.generation import WARMUP_NEW_TOKENS, GenerationSettings, warm_up
from workbench.techniques.long_form import DEFAULT_TOPICS, LANGUAGES, STRATEGIES, LongOutputPlan, run_long_output
from workbench.run.point_result import PointResult

EXPERIMENT = "long_output"


@dataclass
class Config(sweeps.SweepConfig):
    """Long-output strategies (notebook ``07_long_output``).

    Attributes:
        budget_tokens: total new-token budget per text, the same for every strategy.
        n_sections: sections asked for.
        outline_tokens: outline budget (0: about 12 per section, at most a quarter of the budget).
        strategies: any of ``one_shot``, ``outline_batch``, ``outline_sequential``.
        languages: ``en`` and / or ``zh``.
        topic_en, topic_zh: the article titles.
        temperature: 0 = greedy.
    """

    budget_tokens: int = 256
    n_sections: int = 4
    outline_tokens: int = 0
    strategies: list = field(default_factory=lambda: list(STRATEGIES))
    languages: list = field(default_factory=lambda: ["en", "zh"])
    topic_en: str = DEFAULT_TOPICS["en"]
    topic_zh: str = DEFAULT_TOPICS["zh"]
    temperature: float = 0.0
    repeats: int = 2  # rounds: 2 pair each strategy with the A/A control (the notebook's default, one place: its parameters cell agrees)

    def __post_init__(self):
        super().__post_init__()
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
    """Save one repeat's merged text (with its outline) as ``texts/long_output_<strategy>_<language>_r<repeat>.md``."""
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


def measure_interleaved(loaded, cfg: Config, points: list[dict], state: dict) -> dict[str, PointResult]:
    """Every (language, strategy) point as an interleaved arm (:mod:`workbench.stats.comparison`), with the A/A control.

    ``cfg.warmup`` untimed short generations of each language's topic first; then ``cfg.repeats`` rounds: round
    ``r`` writes every point's text once at seed ``cfg.seed + r`` (the same topic, plan and seed for every
    strategy of a language), plus the first language's baseline (:func:`baseline_strategy`, ``one_shot``) a
    second time (:data:`workbench.stats.comparison.AA`: timed, neither saved nor stored), in an order shuffled per
    round from ``cfg.seed``. A round's value of an arm is its text's wall time ``wall_s``; per language, every
    strategy is judged against the baseline from the paired within-round ratios, Holm over the language's other
    strategies (:func:`workbench.stats.comparison.compare_groups`).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the notebook's :class:`Config`.
        points: the grid (``{"language", "strategy"}`` dicts), first language first.
        state: ``run_dir`` (optional): where each text is saved (as :func:`measure_point` does, ``r<round>``).

    Returns:
        ``{point_id: PointResult}``: a row per round (``repeat`` = round), ``wall_s`` (seconds, the point's texts
        together), ``warmup_s`` (the language's first point), ``extra`` with :data:`SUMMARY_COLUMNS` medians, the
        ``time_ratio`` columns (:func:`workbench.stats.comparison.arm_columns`: wall time over the language's
        baseline) and the A/A columns (:data:`workbench.stats.comparison.COLUMNS`, the experiment's noise floor).
    """
    plan = cfg.plan()
    pids = [point_result.point_id(EXPERIMENT, p) for p in points]
    by_pid = dict(zip(pids, points))
    langs = list(dict.fromkeys(p["language"] for p in points))
    base_pid = {}
    for lang in langs:
        base = baseline_strategy(p["strategy"] for p in points if p["language"] == lang)
        base_pid[lang] = next(pid for pid, p in by_pid.items() if p["language"] == lang and p["strategy"] == base)
    first_base = base_pid[langs[0]]
    warmup_s = {lang: warm_up(loaded, [cfg.topic(lang)], GenerationSettings(max_new_tokens=WARMUP_NEW_TOKENS),
                              cfg.warmup) for lang in langs}
    got = {pid: {"rows": [], "wall_s": 0.0} for pid in pids}
    table = []
    for rnd, arm in comparison.schedule([*pids, comparison.AA], cfg.repeats, cfg.seed):
        pid = first_base if arm == comparison.AA else arm
        p = by_pid[pid]
        res = run_long_output(loaded, p["strategy"], cfg.topic(p["language"]), plan, p["language"], cfg.temperature,
                              cfg.seed + rnd)
        table.append({"arm": arm, "round": rnd, "value": res.row["wall_s"]})
        if arm == comparison.AA:
            continue
        got[pid]["rows"].append(dict(res.row, repeat=rnd, request_id=0))
        got[pid]["wall_s"] += res.row["wall_s"]
        _save_text(state.get("run_dir"), cfg, p, rnd, res)
    groups = {base_pid[lang]: [pid for pid in pids if by_pid[pid]["language"] == lang] for lang in langs}
    ratio_cols, aa_cols = comparison.compare_groups(pd.DataFrame(table), groups)
    out = {}
    for pid, p in by_pid.items():
        first = pid == next(q for q in pids if by_pid[q]["language"] == p["language"])
        out[pid] = PointResult(requests=got[pid]["rows"], wall_s=got[pid]["wall_s"],
                               warmup_s=warmup_s[p["language"]] if first else 0.0,
                               extra={**_point_extra(got[pid]["rows"]), **ratio_cols[pid], **aa_cols})
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every (language, strategy) point of ``cfg``.

    With 2+ points and ``repeats`` >= 2 the points are measured interleaved by round with the A/A control
    (:func:`measure_interleaved`) and reach the disk together when the last round ends (an interrupt before that
    keeps none of them); with one repeat there is nothing to pair and each point is measured, and written, on
    its own (:func:`measure_point`, warm-up before the first point only).

    Returns:
        The ``long_output`` points.
    """
    grid = cfg.grid()
    state = {"run_dir": run_dir}

    def measure(p):
        if len(grid) < 2 or cfg.repeats < 2:
            return measure_point(loaded, cfg, p, state)
        return sweeps.block_share(state, point_result.point_id(EXPERIMENT, p),
                                  lambda: measure_interleaved(loaded, cfg, grid, state))

    return sweeps.run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded,
                            config=cfg)


REQUEST_COLUMNS = ("language", "strategy", "first_text_s", "first_section_s", "wall_s", "output_tokens", "batch_size",
                   "tpot_s", "chars", "sections_found", "coverage", "repetition", "output_throughput_tps")


def _only(requests: pd.DataFrame) -> pd.DataFrame:
    """This experiment's rows (a run folder may hold every notebook of a suite)."""
    return requests[requests["experiment"] == EXPERIMENT] if "experiment" in requests else requests


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per text: waits, length, coverage, repetition and throughput (seconds)."""
    df = _only(requests)
    return df[[c for c in REQUEST_COLUMNS if c in df]].reset_index(drop=True)


def _ratio_rows(points: pd.DataFrame | None) -> pd.DataFrame:
    """The usable points measured interleaved (their ``time_ratio`` and A/A columns); empty when none were."""
    if points is None or len(points) == 0 or "time_ratio" not in points or "design" not in points:
        return pd.DataFrame()
    ok = evidence.usable_points(points)
    return ok[ok["design"].notna() & ok["time_ratio"].notna()] if "language" in ok and "strategy" in ok \
        else pd.DataFrame()


def _paired_best(ratios: pd.DataFrame, strategies: list, base: str) -> str | None:
    """The strategy with the lowest paired wall-time ratio to ``base`` (:func:`workbench.stats.comparison.paired_best`)
    where every other strategy has one; None otherwise."""
    if ratios.empty or "strategy" not in ratios:
        return None
    r = ratios.drop_duplicates("strategy").set_index("strategy")["time_ratio"]
    if any(s not in r.index for s in strategies if s != base):
        return None
    return comparison.paired_best({s: r[s] for s in strategies if s != base}, base)


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


def _backed(ratios: pd.DataFrame, best: str, base: str, kept=None) -> str:
    """Whether a language's pick (the shortest median wall time) is backed by its paired ratios: ``""`` when it is,
    else the verdict to print beside it ("not supported: the A/A control moved", "no difference beyond noise",
    "not supported: ..."). A strategy other than the baseline needs its ratio below 1 after Holm; the baseline
    itself needs every other strategy within the quality guard (``kept``, :func:`_guarded`; None: all) to have its
    ratio above 1; either way the A/A control steady."""
    if ratios.empty:
        return "not supported: no interleaved rounds (repeats >= 2 pair the strategies within rounds)"
    if comparison.aa_moved_columns(ratios.iloc[0]):
        return comparison.AA_MOVED
    rows = ratios.set_index("strategy")
    if best != base:
        if best not in rows.index:
            return "not supported: not compared"
        v = comparison.verdict_columns(rows.loc[best])
        return "" if v == "lower" else f"not supported: its time vs {base}: {v}"
    others = [comparison.verdict_columns(rows.loc[s]) for s in rows.index
              if s != base and (kept is None or s in kept)]
    if not others:
        return "not supported: no other strategy compared"
    return "" if all(v == "higher" for v in others) else ("not supported: not faster than every other strategy "
                                                          "beyond noise")


def finding(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """Per language, the strategy with the shortest median wall time among those within the quality guard
    (:func:`_guarded`: median section coverage not below the baseline's; a strategy left out is named with its
    coverage and time) (its figures); then each strategy's wall time
    over the language's baseline (``one_shot``, :func:`baseline_strategy`) from the points' ``time_ratio`` columns
    (interleaved rounds: paired within rounds, Holm over the language's strategies), each with the A/A noise floor
    beside it (:func:`workbench.stats.comparison.describe_columns`: "not supported: the A/A control moved" when the
    control's interval excludes 1).

    The finding is supported only when every language's pick is backed (a strategy faster than the baseline with
    its interval below 1 after Holm; the baseline itself, every other strategy slower beyond noise) and the A/A
    control is steady; a pick that is not says why beside it, in the first sentence, so that the mark and the
    first sentence agree. Point-by-point runs (one repeat) pair nothing: no comparative claim.

    Args:
        requests: this experiment's rows (one per text and repeat).
        points: its points; when given, only rows of usable (valid) points count, and the ratios come from them.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    df = _only(requests)
    if points is not None and "point_id" in df:
        df = df[df["point_id"].isin(evidence.usable_points(points)["point_id"])]
    if df.empty or "wall_s" not in df:
        return evidence.Finding("No valid long-output request finished.", "", False)
    ids = tuple(dict.fromkeys(str(p) for p in df["point_id"])) if "point_id" in df else ()
    if "language" not in df:
        df = df.assign(language="all")
    ratios = _ratio_rows(points)
    parts, clauses, ev, supported = [], [], [], True
    for lang, g in df.groupby("language", sort=False):
        med = g.groupby("strategy")[[c for c in ("wall_s", "first_text_s", "coverage") if c in g]].median()
        base = baseline_strategy(med.index)
        kept = _guarded(med, base)
        best = med.loc[kept, "wall_s"].idxmin()
        mine = ratios[ratios["language"] == lang] if not ratios.empty else ratios
        paired = _paired_best(mine, kept, base)
        guard = f" of those covering at least {base}'s sections" if len(kept) < len(med) else ""
        what = "has the shortest wall time" + guard
        if paired is not None and paired != best:  # the medians over drifting rounds disagree with the pairs
            best, what = paired, f"is the fastest paired within rounds{guard} (median wall time"
        row = med.loc[best]
        extra = f", coverage {row['coverage']:.0%}" if "coverage" in row and pd.notna(row["coverage"]) else ""
        why = _backed(mine, best, base, kept) if len(med) > 1 else "not supported: one strategy only"
        supported &= not why
        parts.append(f"{lang}: {best} {what} ({row['wall_s']:.1f} s, first text after "
                     f"{row.get('first_text_s', float('nan')):.2f} s{extra})" + (f": {why}" if why else ""))
        for s in med.index:
            if s not in kept:
                clauses.append(f"{s} ({lang}) left out of the pick by the quality guard: coverage "
                               f"{med.loc[s, 'coverage']:.0%} against {base}'s {med.loc[base, 'coverage']:.0%} "
                               f"(median wall time {med.loc[s, 'wall_s']:.1f} s)")
        for _, r in mine.iterrows():
            if r["strategy"] != base:
                clauses.append(comparison.describe_columns(r, f"{r['strategy']} wall time vs {base} ({lang})"))
        if not mine.empty:
            n = mine.iloc[0].get("rounds")
            ev.append(f"{lang}: wall time paired within {int(n) if n == n else '?'} interleaved rounds, "
                      f"baseline {base}")
    text = "; ".join(parts) + "."
    if clauses:
        text += " " + " ".join(c + "." for c in clauses)
    elif not ratios.empty:
        aa = comparison.aa_from_columns(ratios.iloc[0])
        text += f" {comparison.noise_floor_text(aa, 'interleaved', aa.n if aa else None)}."
    else:
        ev.append("measured point by point (one repeat): no paired ratios, no A/A control")
    return evidence.Finding(text, "; ".join(ev), supported, ids)


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


def fig_time_ratio(points: pd.DataFrame) -> go.Figure:
    """Wall time of each strategy over its language's baseline (``one_shot``; paired within rounds, the interval at
    the point's Holm level), one marker series per language, with the A/A noise floor shaded.

    Args:
        points: the experiment's points with the ``time_ratio`` and A/A columns (interleaved runs).

    Returns:
        A plotly figure: strategy on x, the wall-time ratio (x, 1 = as fast as ``one_shot``) on y.
    """
    fig = comparison.ratio_figure(plots.ok_points(points), "strategy", group="language", marker_size=10)
    fig.update_layout(title="Wall time over one_shot (paired within rounds; grey band: the A/A noise floor)",
                      xaxis_title="strategy", yaxis_title="wall-time ratio vs one_shot (x)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> dict[str, go.Figure]:
    """The notebook's figures by file name, from the run's request rows (``results.read_requests(run)``) and, when
    given, its points (interleaved runs add ``long_output_time_ratio``: the ratios with the A/A band)."""
    figs = {"long_output": long_output_figure(requests)}
    if points is not None and "time_ratio" in points and points["time_ratio"].notna().any():  # issue 32
        figs["long_output_time_ratio"] = fig_time_ratio(points)
    return figs
