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
:func:`figures` compares wait and total time per strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.stats import evidence, metrics
from workbench.share import plots
from workbench.predict import predictions
from workbench.run import results, sweeps  # noqa: F401  (plots registers the house template)
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


#: Per-request columns summarised (median, ``<column>_p50``) in each point.
SUMMARY_COLUMNS = ("coverage", "repetition", "sections_found", "first_text_s", "first_section_s", "chars")


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One ``{"language", "strategy"}`` point.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the notebook's :class:`Config` (plan, topic, repeats, temperature, seed).
        point: ``{"language": .., "strategy": ..}``.
        state: shared by the points of one sweep: ``run_dir`` (optional): each repeat's merged text (with
            outline) is saved as ``texts/long_output_<strategy>_<language>_r<repeat>.md``; ``warmed``: set
            by the first point, which runs ``cfg.warmup`` untimed short generations of the topic before its
            timed runs (:func:`workbench.measure.generation.warm_up`), the later ones none.

    Returns:
        :class:`workbench.run.point_result.PointResult`: a row per repeat, ``wall_s``, ``warmup_s`` and ``extra``
        (``<column>_p50`` of :data:`SUMMARY_COLUMNS`).
    """
    strategy, language = point["strategy"], point["language"]
    plan, topic = cfg.plan(), cfg.topic(language)
    run_dir = state.get("run_dir")
    warmup = 0 if state.get("warmed") else cfg.warmup
    state["warmed"] = True
    warmup_s = warm_up(loaded, [topic], GenerationSettings(max_new_tokens=WARMUP_NEW_TOKENS), warmup)
    rows, wall = [], 0.0
    for r in range(cfg.repeats):
        res = run_long_output(loaded, strategy, topic, plan, language, cfg.temperature, cfg.seed + r)
        rows.append(dict(res.row, repeat=r, request_id=0))
        wall += res.row["wall_s"]
        if run_dir is not None:
            head = f"# {topic}\n\nstrategy: {strategy}, budget {plan.budget_tokens} tokens, repeat {r}\n\n"
            if res.outline:
                head += "## Outline (as generated)\n\n" + res.outline + "\n\n---\n\n"
            results.save_text(run_dir, f"texts/long_output_{strategy}_{language}_r{r}.md", head + res.text + "\n")
    extra = {f"{k}_p50": metrics.percentiles([q[k] for q in rows], (50,))["p50"] for k in SUMMARY_COLUMNS}
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s, extra=extra)


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every (language, strategy) point of ``cfg``; warm-up before the first point only.

    Returns:
        The ``long_output`` points.
    """
    points = sweeps.expand_grid(language=cfg.languages, strategy=cfg.strategies)
    state = {"run_dir": run_dir}
    return sweeps.run_sweep(run_dir, EXPERIMENT, points, lambda p: measure_point(loaded, cfg, p, state),
                            resume=resume, info=loaded.info, loaded=loaded, config=cfg)


REQUEST_COLUMNS = ("language", "strategy", "first_text_s", "first_section_s", "wall_s", "output_tokens", "batch_size",
                   "tpot_s", "chars", "sections_found", "coverage", "repetition", "output_throughput_tps")


def _only(requests: pd.DataFrame) -> pd.DataFrame:
    """This experiment's rows (a run folder may hold every notebook of a suite)."""
    return requests[requests["experiment"] == EXPERIMENT] if "experiment" in requests else requests


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per text: waits, length, coverage, repetition and throughput (seconds)."""
    df = _only(requests)
    return df[[c for c in REQUEST_COLUMNS if c in df]].reset_index(drop=True)


def finding(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """Per language, the strategy with the shortest median wall time; then that strategy against each other
    one as a wall-time ratio over matched (language, repeat) pairs (t over log ratios), with a direction only
    where the interval excludes 1.

    Args:
        requests: this experiment's rows (one per text and repeat).
        points: its points; when given, only rows of usable (valid) points count.

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
    parts = []
    for lang, g in df.groupby("language"):
        med = g.groupby("strategy")[[c for c in ("wall_s", "first_text_s", "coverage") if c in g]].median()
        best = med["wall_s"].idxmin()
        row = med.loc[best]
        extra = f", coverage {row['coverage']:.0%}" if "coverage" in row and pd.notna(row["coverage"]) else ""
        parts.append(f"{lang}: {best} has the shortest wall time ({row['wall_s']:.1f} s, first text after "
                     f"{row.get('first_text_s', float('nan')):.2f} s{extra})")
    overall = df.groupby("strategy")["wall_s"].median().idxmin()
    key = [c for c in ("language", "repeat") if c in df]
    wall = df.pivot_table(index=key, columns="strategy", values="wall_s", aggfunc="median")
    comparisons, supported, ev = [], False, []
    for other in [c for c in wall.columns if c != overall]:
        pair = wall[[overall, other]].dropna()
        iv = evidence.paired_ratio_interval(pair[overall], pair[other], unit="language-repeat pairs")
        supported |= evidence.ratio_verdict(iv) == "lower"
        comparisons.append(evidence.describe_ratio(iv, f"{overall} wall time vs {other}"))
        ev.append(f"{overall} vs {other}: {len(pair)} matched (language, repeat) pairs")
    text = "; ".join(parts) + "."
    if comparisons:
        text += " " + "; ".join(comparisons) + "."
    return evidence.Finding(text, "; ".join(ev) or "one strategy only", supported, ids)


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


@plots.split_by_device
def figures(requests: pd.DataFrame) -> dict[str, go.Figure]:
    """The notebook's figures by file name, from the run's request rows (``results.read_requests(run)``)."""
    return {"long_output": long_output_figure(requests)}
