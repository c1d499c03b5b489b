"""Experiment 01: batch size versus TTFT and throughput (notebook ``01_batch_size``).

How many requests should share one ``generate`` call? Each point is a (prompt length, batch size) pair;
every row of a batch gets its own window of real text of exactly ``prompt_tokens`` tokens, outputs have
a fixed length (``ignore_eos``), and each point is repeated. Figures: TTFT p50/p99, output throughput,
per-request decode speed and goodput versus batch size, and the TTFT-vs-throughput Pareto front
(vLLM's benchmark conventions; docs/design.md section 7). :func:`recommend` picks the batch size with the
highest goodput under the SLO.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench import checks
from workbench.errors import ParameterError
from workbench.inputs.prompts import build_batch
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.predict import predictions
from workbench.run import design, design_sweep, point_result, sweeps
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, expand_grid
from workbench.share import figures_design
from workbench.share.plots import error_y, label, labels, mark_invalid, ok_points, split_by_device
from workbench.stats import blocks, evidence, metrics

EXPERIMENT = "batch_size"


@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The batch-size trade-off sweep (notebook ``01_batch_size``).

    With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`): ``repeats``
    rounds first, up to ``max_rounds`` while a comparison is undecided and ``budget_s`` allows.

    Attributes:
        batch_sizes: requests per ``generate`` call, each >= 1.
        prompt_tokens: prompt lengths in tokens (chat template included), each
            in [32, model maximum - max_new_tokens].
        max_new_tokens: new tokens per request (>= 1).
        ignore_eos: fixed-length outputs (``min_new_tokens = max_new_tokens``).
        temperature: 0 is greedy.
        top_p: nucleus mass in (0, 1].
        slo_ttft_s, slo_tpot_s: SLO for goodput (seconds, > 0).
    """

    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: list = dataclasses.field(default_factory=lambda: [128, 512])
    max_new_tokens: int = 32
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    repeats: int = 2  # an interval over rounds needs 2 (the notebook's default, one place: its parameters cell agrees)

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        checks.check_int_list("batch_sizes", self.batch_sizes, lo=1)
        self.settings()  # validates max_new_tokens, ignore_eos, temperature, top_p
        if self.max_new_tokens > self.max_context() - 32:
            raise ParameterError(f"max_new_tokens: must be <= {self.max_context() - 32} (the model's context "
                                 f"minus a 32-token prompt) (got {self.max_new_tokens})")
        limit = self.max_context() - self.max_new_tokens
        checks.check_int_list("prompt_tokens", self.prompt_tokens, lo=32, hi=limit)
        checks.check_float("slo_ttft_s", self.slo_ttft_s, lo=0, lo_open=True)
        checks.check_float("slo_tpot_s", self.slo_tpot_s, lo=0, lo_open=True)

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """The :class:`GenerationSettings` of every point."""
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed if seed is None else seed,
        )

    def grid(self) -> list[dict]:
        """Points: every (prompt_tokens, batch_size), prompt length outermost."""
        return expand_grid(prompt_tokens=self.prompt_tokens, batch_size=self.batch_sizes)


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One (prompt_tokens, batch_size) point (:func:`workbench.run.sweeps.measure_generation`).

    Each row of the batch gets a different window of real text of exactly ``prompt_tokens`` tokens.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"prompt_tokens": L, "batch_size": B}``.
        state: the sweep's shared state (unused: every point warms up itself).
    """
    prompts = build_batch(loaded.tokenizer, point["batch_size"], point["prompt_tokens"])
    out = sweeps.measure_generation(loaded, prompts, cfg.settings(), cfg.repeats, cfg.warmup)
    for rec in out.requests:
        rec["context_tokens"] = point["prompt_tokens"]
    return out


THROUGHPUT = design.Outcome("output_throughput_tps", True, "output throughput", "throughput_ratio")
TTFT = design.Outcome("ttft_s", False, "TTFT", "ttft_vs_control")  # ttft_ratio is measured / predicted


def sweep_design(loaded, cfg: Config, points: list[dict]) -> design_sweep.SweepDesign:
    """The points as one design (:mod:`workbench.run.design`): each round runs one batch of every (prompt_tokens,
    batch_size) point and the first point again (the A/A control), order shuffled per round from ``cfg.seed``,
    round ``r`` at seed ``cfg.seed + r``. The control of each prompt length is its smallest batch (marked, not
    taken from the row order); the primary outcome is the batch's output throughput (its tokens over its longest
    request), TTFT (the rows' median) is secondary. The design stops once the recommendation is decided (the batch
    with the highest goodput under the SLO so far, as :func:`recommend` ranks the points, against the smallest batch
    and against its runner-up: :attr:`workbench.run.design.Design.rank`), not once every batch is. Rows are those of
    :func:`measure_point` with ``repeat`` = round.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    settings = cfg.settings()
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    prompts: dict = {}

    def batch(p):
        if pid(p) not in prompts:
            prompts[pid(p)] = build_batch(loaded.tokenizer, p["batch_size"], p["prompt_tokens"])
        return prompts[pid(p)]

    def measure(p, rnd):
        res = generate_measured(loaded, batch(p), dataclasses.replace(settings, seed=settings.seed + rnd))
        for rec in res.records:
            rec.update(batch_size=p["batch_size"], batch_wall_s=res.wall_s, context_tokens=p["prompt_tokens"])
        tps = metrics.summarize_point(pd.DataFrame(res.records), wall_s=max(r["e2e_s"] for r in res.records),
                                      slo_ttft_s=cfg.slo_ttft_s, slo_tpot_s=cfg.slo_tpot_s)
        ttft = float(pd.Series([r["ttft_s"] for r in res.records]).median())
        return design.Measured({THROUGHPUT.name: tps["output_throughput_tps"], TTFT.name: ttft}, res.records,
                               res.wall_s, extra={"goodput_rps": tps["goodput_rps"]})

    groups: dict = {}
    for p in sorted(points, key=lambda p: p["batch_size"]):
        groups.setdefault(p["prompt_tokens"], []).append(pid(p))
    controls = {members[0]: members for members in groups.values()}
    first = next(iter(controls))

    def rank(table):    # recommend()'s order as the rounds so far see it: goodput under the SLO, then the smaller batch
        rows = table[table["arm"] != design.AA]
        good = rows.groupby("arm")["extra"].agg(lambda xs: sum((json.loads(x) if x else {}).get("goodput_rps", 0.0)
                                                          for x in xs) / len(xs))
        size = {pid(p): p["batch_size"] for p in points}
        return sorted((a for a, g in good.items() if g > 0), key=lambda a: (-good[a], size.get(a, 0)))

    d = design.Design(EXPERIMENT, [pid(p) for p in points], first, THROUGHPUT, (TTFT,), groups=controls,
                      rank=rank, **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, lambda p: warm_up(loaded, batch(p), settings, cfg.warmup))


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The batch-size trade-off: every (prompt_tokens, batch_size) point of ``cfg``.

    Each row of a batch gets a different window of real text of exactly
    ``prompt_tokens`` tokens (:func:`workbench.inputs.prompts.build_batch`). With 2+ points and ``repeats`` >= 2
    the points are one design (:func:`sweep_design`, :mod:`workbench.run.design`): every finished round is on disk
    (``design/batch_size.parquet``) and a resume continues from the last one; the points are recorded when the
    design stops. With one repeat there is nothing to pair and each point is measured, and written, on its own.

    Returns:
        The experiment's points DataFrame (see :func:`workbench.run.sweeps.run_sweep`), with the roofline's
        prediction per point and ``ttft_ratio`` / ``tpot_ratio`` (:func:`workbench.predict.predictions.with_predictions`;
        the residual table is saved as ``residuals/batch_size.txt``).
    """
    predictor = predictions.calibrated_predictor(loaded)  # predict before measuring
    state: dict = {}
    grid = cfg.grid()
    designed = sweep_design(loaded, cfg, grid) if len(grid) >= 2 and cfg.repeats >= 2 else None
    points = sweeps.run_sweep(run_dir, EXPERIMENT, grid, lambda p: measure_point(loaded, cfg, p, state), resume=resume,
                              slo_ttft_s=cfg.slo_ttft_s, slo_tpot_s=cfg.slo_tpot_s, info=loaded.info, loaded=loaded,
                              config=cfg, speed_probe=True,  # the twin's calibration: its speed at the moment
                              design=designed)
    points = predictions.with_predictions(points, loaded.info, predictor)
    predictions.save_residuals(run_dir, EXPERIMENT, points)
    return points


def recommend(points: pd.DataFrame) -> pd.Series | None:
    """The usable point (:func:`workbench.stats.evidence.usable_points`: status ok and valid) with the highest
    ``goodput_rps`` (ties: smaller batch, then higher throughput).

    Args:
        points: this experiment's ``points.parquet`` rows.

    Returns:
        That row, or None when no usable point has positive goodput.
    """
    ok = evidence.usable_points(points)
    ok = ok[ok["goodput_rps"] > 0]
    if ok.empty:
        return None
    ranked = ok.sort_values(["goodput_rps", "batch_size", "output_throughput_tps"], ascending=[False, True, False])
    return ranked.iloc[0]


def repeat_throughputs(requests: pd.DataFrame, point_id: str, by_repeat: bool = False):
    """Output throughput (tokens/s) of each repeat of a point: :func:`workbench.stats.metrics.summarize_point` over
    the repeat's rows, its wall time the longest ``e2e_s`` (one ``generate`` call per repeat: every row is
    submitted together). ``by_repeat``: a Series indexed by repeat (round), for pairing by round."""
    g = requests[requests["point_id"] == point_id]
    out = {rep: metrics.summarize_point(r, wall_s=float(r["e2e_s"].max()))["output_throughput_tps"]
           for rep, r in g.groupby("repeat") if len(r)}
    return pd.Series(out, dtype=float) if by_repeat else list(out.values())


def runner_up(points: pd.DataFrame, best: pd.Series) -> pd.Series | None:
    """The usable point ranked right after ``best`` by :func:`recommend`'s order at the same prompt length, or
    None."""
    ok = evidence.usable_points(points)
    ok = ok[(ok["goodput_rps"] > 0) & (ok["prompt_tokens"] == best["prompt_tokens"])]
    ranked = ok.sort_values(["goodput_rps", "batch_size", "output_throughput_tps"], ascending=[False, True, False])
    rest = ranked[ranked["point_id"] != best["point_id"]] if "point_id" in ranked else ranked.iloc[1:]
    return rest.iloc[0] if len(rest) else None


def headline(points: pd.DataFrame, requests: pd.DataFrame | None = None, run_dir=None) -> evidence.Finding:
    """The recommended batch size (highest goodput under the SLO) and its decision: its output throughput against
    the smallest batch of its prompt length (the design's control), from the interleaved rounds' block analysis
    (:mod:`workbench.run.design`), and against the runner-up (Tukey's all-pairs level: the pick was chosen after
    looking) when ``run_dir`` holds the design. The verdict is the throughput comparison's: a direction, equivalent
    within the margin, or undecided with the rounds it would take; undecided too while the comparison with the
    runner-up is (the recommendation not shown better than the next batch size), with the rounds that one needs. A recommended smallest batch is a verdict only
    when every larger batch is lower beyond noise or equivalent ("keep the baseline: none shown faster").

    Args:
        points: this experiment's points.
        requests: its requests (unused since the design runner; kept for callers).
        run_dir: the run folder (its ``design/batch_size.*``: the comparison with the runner-up).

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    usable = evidence.usable_points(points)
    excluded = len(points) - len(usable)
    best = recommend(points)
    if best is None and usable.empty and len(points):
        # nothing to recommend from (a drift, other load): the SLO is not the reason, and the way on is to measure
        # the points again (issue 49: a run on a VM that slowed 55% under notebook 01 was told to relax its SLO)
        return evidence.Finding(f"No valid point to recommend a batch size from: "
                                f"{evidence.none_valid(points, run_dir)}.",
                                f"0 valid points of {len(points)}", False, (), verdict="undecided")
    if best is None:
        return evidence.Finding("No valid batch size met the SLO: relax slo_ttft_s / slo_tpot_s or shorten the "
                                "prompts.", f"{len(usable)} valid points of {len(points)}", False,
                                evidence.point_ids(usable), verdict="undecided")
    text = (f"Recommended batch size: {int(best.batch_size)} at {int(best.prompt_tokens)} prompt tokens "
            f"({best.goodput_rps:.2f} req/s within the SLO, {best.output_throughput_tps:.1f} tok/s, "
            f"TTFT p50 {best.ttft_s_p50:.2f} s).")
    n_req = checks.int_or(best.get("requests"), 0)
    good = int(round(best.goodput_rps * best.wall_s)) if "wall_s" in best else 0
    units, good_units = attainment_units(best, n_req, good)
    att = evidence.wilson_interval(good_units, units) if units else None
    parts = [f"highest goodput among {len(usable)} valid points ({excluded} invalid or failed excluded)",
             f"{n_req} requests at the recommended point" + (
                 f", {good} met the SLO; attainment over {units} independent batches (the rows of one batch share "
                 f"one timing) {good_units}/{units}, {att.describe('{:.2f}')}" if att else "")]
    ids = [str(best.point_id)] if "point_id" in best else []
    same = usable[usable["prompt_tokens"] == best.prompt_tokens].sort_values("batch_size")
    control = same.iloc[0] if len(same) else None
    decision = design.decision_from_row(best, THROUGHPUT)
    if control is None or not isinstance(best.get("design"), str):
        return evidence.Finding(text + " No throughput comparison: one round pairs nothing (repeats 1).",
                                "; ".join(parts), False, tuple(ids), verdict="undecided")
    ids.append(str(control.point_id))
    name = f"Output throughput at batch {int(best.batch_size)} vs batch {int(control.batch_size)}"
    if int(best.batch_size) == int(control.batch_size):          # the baseline itself is the pick
        verdict, _ = blocks.keep_control([design.decision_from_row(r, THROUGHPUT) for _, r in same.iloc[1:].iterrows()],
                                         THROUGHPUT.higher_is_better)
        text += (f" Keep batch {int(best.batch_size)}: every larger batch is slower beyond noise or equivalent."
                 if verdict != "undecided" else f" Keep batch {int(best.batch_size)}: none shown faster, but not "
                                                f"every larger batch is decided slower or equivalent.")
        fields = design.finding_fields(best)
        fields["verdict"] = verdict
    else:
        text += " " + decision.describe(name, words=THROUGHPUT.words,
                                        seconds_per_round=checks.float_or_nan(best.get("seconds_per_round"))) + "."
        fields = design.finding_fields(best, decision)
        rival = runner_up(points, best)
        if rival is not None:
            said, open_ = design.versus_runner_up(run_dir, EXPERIMENT, THROUGHPUT.name, best.point_id,
                                                  rival.point_id, f"batch {int(rival.batch_size)}", decision, best,
                                                  THROUGHPUT.words)
            text += said
            fields = open_ or fields
            if said:
                ids.append(str(rival.point_id))
    if isinstance(best.get("aa_verdict"), str) and best.get("aa_verdict") == "direction":
        text += " The A/A control moved (the smallest batch against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    parts.append(f"throughput per round: {design.evidence_text(best)}")
    return evidence.Finding(text, "; ".join(parts), True, tuple(ids), **fields)


def attainment_units(best, n_req: int, good: int) -> tuple[int, int]:
    """The independent units behind a batch point's SLO attainment, and how many met the SLO.

    The rows of one batch share one timing (one ``generate`` call: one TTFT stamp, one stamp per step), so a
    batch is one unit, not ``batch_size`` (batch 16 x 2 repeats: 2 units, Wilson [0.34, 1.00] for 2 of 2, not
    [0.89, 1.00] over 32 rows). Units: the point's ``n_samples`` (:func:`workbench.stats.metrics.n_samples`), else
    ``round(requests / batch_size)``; units met: ``round(good / batch_size)`` (the rows of a batch meet or miss
    together), at most the units.

    Args:
        best: a points row with ``batch_size`` (and ``n_samples`` when recorded).
        n_req: the point's requests; good: its requests that met the SLO.

    Returns:
        ``(units, units_met)``.
    """
    b = max(1, checks.int_or(best.get("batch_size"), 1))
    units = checks.int_or(best.get("n_samples"), 0) or int(round(n_req / b))
    return units, min(units, int(round(good / b)))


def ttft_vs_batch(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 (solid, with its 95% t-interval over repeat medians) and p99 (dashed) versus batch size, a colour
    per prompt length; invalid points crossed out in grey. p99 is absent where too few samples support it."""
    df = ok_points(points).sort_values(["prompt_tokens", "batch_size"])
    fig = go.Figure()
    colours = px.colors.qualitative.Safe
    for i, (length, g) in enumerate(df.groupby("prompt_tokens")):
        c = colours[i % len(colours)]
        fig.add_trace(go.Scatter(x=g["batch_size"], y=g["ttft_s_p50"], mode="lines+markers", line=dict(color=c),
                                 name=f"{length} tokens, p50", error_y=error_y(g, "ttft_s_p50")))
        if g["ttft_s_p99"].notna().any():
            fig.add_trace(go.Scatter(x=g["batch_size"], y=g["ttft_s_p99"], mode="lines+markers",
                                     line=dict(color=c, dash="dash"), name=f"{length} tokens, p99"))
    mark_invalid(fig, df, "batch_size", "ttft_s_p50")
    predictions.add_predicted_line(fig, df, "batch_size", "predicted_ttft_s", group="prompt_tokens")
    fig.update_layout(title="Time to first token vs batch size (error bars: 95% t-interval over repeat medians)",
                      xaxis_title=label("batch_size"), yaxis_title=label("ttft_s"))
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def throughput_vs_batch(points: pd.DataFrame) -> go.Figure:
    """Output throughput (all rows' tokens / wall time) versus batch size."""
    df = ok_points(points).sort_values("batch_size")
    df["prompt_tokens"] = df["prompt_tokens"].astype(str)
    fig = px.line(df, x="batch_size", y="output_throughput_tps", color="prompt_tokens", markers=True,
                  labels=labels("batch_size", "output_throughput_tps", "goodput_rps", "prompt_tokens"), title="Output throughput vs batch size")
    predictions.add_predicted_line(fig, df, "batch_size", "predicted_output_throughput_tps", group="prompt_tokens")
    mark_invalid(fig, df, "batch_size", "output_throughput_tps")
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def pareto(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 versus output throughput, one curve per prompt length, batch sizes as labels.

    The Pareto-optimal points among the valid ones (no other valid point has both higher throughput and
    lower TTFT) are drawn larger with a black outline.
    """
    df = ok_points(points).sort_values(["prompt_tokens", "batch_size"])
    df["prompt_tokens_label"] = df["prompt_tokens"].astype(str)
    fig = px.line(df, x="output_throughput_tps", y="ttft_s_p50", color="prompt_tokens_label", markers=True,
                  text="batch_size", labels=labels("output_throughput_tps", "ttft_s_p50", prompt_tokens_label="prompt tokens"),
                  title="TTFT vs throughput trade-off (labels: batch size)")
    fig.update_traces(textposition="top center")
    front = metrics.pareto_front(evidence.usable_points(df))  # the front is a best-of choice: valid points only
    fig.add_trace(go.Scatter(x=front["output_throughput_tps"], y=front["ttft_s_p50"], mode="markers",
                             marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(width=2, color="black")),
                             name="Pareto front (valid points)", hovertext=front.get("point_id")))
    mark_invalid(fig, df, "output_throughput_tps", "ttft_s_p50")
    return fig


def decode_speed_vs_batch(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> go.Figure:
    """Per-request decode speed (box over requests) versus batch size; the requests of the points marked invalid in
    ``points`` are left out (a box has no marker to grey), the title says how many."""
    df = requests[requests["output_tokens"] > 1].copy()
    dropped = ""
    if points is not None and "valid" in points and "point_id" in df:
        bad = set(points.loc[points["valid"].eq(False), "point_id"].astype(str))
        out = df["point_id"].astype(str).isin(bad)
        if out.any():
            n = df.loc[out, "point_id"].nunique()
            dropped = f" ({int(out.sum())} requests of {n} invalid point{'s' if n != 1 else ''} left out)"
            df = df[~out]
    df["prompt_tokens"] = df["context_tokens"].fillna(df["prompt_tokens"]).astype(int).astype(str)
    fig = px.box(df, x="batch_size", y="decode_tps", color="prompt_tokens", points=False,
                 labels=labels("batch_size", "decode_tps", "prompt_tokens"),
                 title="Per-request decode speed vs batch size" + dropped)
    fig.update_xaxes(type="category")
    return fig


def goodput_vs_batch(points: pd.DataFrame, recommended: pd.Series | None = None) -> go.Figure:
    """Goodput under the SLO versus batch size, with the recommended point starred."""
    df = ok_points(points).sort_values("batch_size")
    df["prompt_tokens"] = df["prompt_tokens"].astype(str)
    slo = ""
    if not df.empty:
        slo = f" (SLO: TTFT <= {df['slo_ttft_s'].iloc[0]:g} s, TPOT <= {df['slo_tpot_s'].iloc[0]:g} s)"
    fig = px.line(df, x="batch_size", y="goodput_rps", color="prompt_tokens", markers=True, labels=labels("batch_size", "output_throughput_tps", "goodput_rps", "prompt_tokens"),
                  title="Goodput vs batch size" + slo)
    if recommended is not None:
        fig.add_trace(go.Scatter(x=[recommended["batch_size"]], y=[recommended["goodput_rps"]], mode="markers",
                                 marker=dict(symbol="star", size=20, color="gold", line=dict(width=1, color="black")),
                                 name=f"recommended: batch {int(recommended['batch_size'])}"))
    mark_invalid(fig, df, "batch_size", "goodput_rps")
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


def throughput_ratio_vs_batch(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each batch size's output throughput over the smallest batch of its prompt length, with the simultaneous
    interval its verdict was read from and the rounds' own ratios as faint points
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, THROUGHPUT.name)
    return figures_design.ratio_figure(
        ok_points(points), "batch_size", THROUGHPUT.prefix, rounds, group="prompt_tokens",
        name=lambda n: f"{n} prompt tokens", log_x=True, x_title=label("batch_size"),
        y_title="output throughput / smallest batch's (x)",
        title="Output throughput vs the smallest batch (simultaneous 95% intervals; faint: each round)")


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> dict[str, go.Figure]:
    """All figures of the batch-size notebook, by file name (``run_dir``: the design's rounds for the ratio
    figure's faint points)."""
    rec = recommend(points)
    out = {
        "batch_ttft": ttft_vs_batch(points),
        "batch_throughput": throughput_vs_batch(points),
        "batch_pareto": pareto(points),
        "batch_decode_speed": decode_speed_vs_batch(requests, points),
        "batch_goodput": goodput_vs_batch(points, rec),
    }
    if "throughput_ratio" in points and points["throughput_ratio"].notna().any():
        out["batch_throughput_ratio"] = throughput_ratio_vs_batch(points, run_dir)
    return out
