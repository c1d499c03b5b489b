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

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.run import point_result
from workbench import checks
from workbench.stats import comparison, evidence, metrics
from workbench.predict import predictions
from workbench.run import results, sweeps
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.share.plots import error_y, label, labels, mark_invalid, ok_points, split_by_device
from workbench.inputs.prompts import build_batch
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, expand_grid

EXPERIMENT = "batch_size"


@dataclasses.dataclass
class Config(SweepConfig):
    """The batch-size trade-off sweep (notebook ``01_batch_size``).

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


def measure_interleaved(loaded, cfg: Config, points: list[dict]) -> dict[str, PointResult]:
    """Every (prompt_tokens, batch_size) point as an interleaved arm (:mod:`workbench.stats.comparison`): each round
    runs one batch of every point plus the first point (the smallest batch) a second time, the A/A control of
    the throughput ratio, in an order shuffled per round from ``cfg.seed``; ``cfg.repeats`` rounds, round ``r``
    at seed ``cfg.seed + r``, each point warmed up ``cfg.warmup`` times first. Rows are those of
    :func:`measure_point` with ``repeat`` = round, so ratios of two points pair their batches by round.

    Returns:
        ``{point_id: PointResult}``; every ``extra`` holds the A/A columns (:data:`workbench.stats.comparison.COLUMNS`:
        the second smallest-batch throughput over the first, t over rounds).
    """
    settings = cfg.settings()
    pids = [point_result.point_id(EXPERIMENT, p) for p in points]
    by_pid = dict(zip(pids, points))
    prompts = {pid: build_batch(loaded.tokenizer, p["batch_size"], p["prompt_tokens"]) for pid, p in by_pid.items()}
    got = {pid: {"requests": [], "wall_s": 0.0, "warmup_s": warm_up(loaded, prompts[pid], settings, cfg.warmup)}
           for pid in pids}
    rows = []
    for rnd, arm in comparison.schedule([*pids, comparison.AA], cfg.repeats, cfg.seed):
        pid = pids[0] if arm == comparison.AA else arm
        res = generate_measured(loaded, prompts[pid], dataclasses.replace(settings, seed=settings.seed + rnd))
        for rec in res.records:
            rec.update(repeat=rnd, batch_size=len(prompts[pid]), batch_wall_s=res.wall_s,
                       context_tokens=by_pid[pid]["prompt_tokens"])
        tps = metrics.summarize_point(pd.DataFrame(res.records), wall_s=max(r["e2e_s"] for r in res.records))
        rows.append({"arm": arm, "round": rnd, "value": tps["output_throughput_tps"]})
        if arm != comparison.AA:
            got[pid]["requests"] += res.records
            got[pid]["wall_s"] += res.wall_s
    cols = comparison.compare(pd.DataFrame(rows), pids[0], comparison.AA, adjust=False).columns()
    return {pid: PointResult(requests=g["requests"], wall_s=g["wall_s"], warmup_s=g["warmup_s"], extra=dict(cols))
            for pid, g in got.items()}


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The batch-size trade-off: every (prompt_tokens, batch_size) point of ``cfg``.

    Each row of a batch gets a different window of real text of exactly
    ``prompt_tokens`` tokens (:func:`workbench.inputs.prompts.build_batch`). With 2+ points and ``repeats`` >= 2
    every point is measured interleaved by round (:func:`measure_interleaved`), so the points reach the disk
    together when the last round ends (an interrupt before that keeps none of them); with one repeat there is
    nothing to pair and each point is measured, and written, on its own.

    Returns:
        The experiment's points DataFrame (see :func:`workbench.run.sweeps.run_sweep`), with the roofline's
        prediction per point and ``ttft_ratio`` / ``tpot_ratio`` (:func:`workbench.predict.predictions.with_predictions`;
        the residual table is saved as ``residuals/batch_size.txt``).
    """
    predictor = predictions.calibrated_predictor(loaded)  # predict before measuring
    state: dict = {}

    def measure(p):  # the first point measures every point interleaved by round (issue 32); on Ray, blocks
        if len(cfg.grid()) < 2 or cfg.repeats < 2:  # one round pairs nothing: point by point, each on disk when done
            return measure_point(loaded, cfg, p, state)
        return sweeps.block_share(state, point_result.point_id(EXPERIMENT, p),
                                  lambda: measure_interleaved(loaded, cfg, cfg.grid()))

    points = sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), measure, resume=resume, slo_ttft_s=cfg.slo_ttft_s,
                     slo_tpot_s=cfg.slo_tpot_s, info=loaded.info, loaded=loaded, config=cfg,
                     speed_probe=True)  # the twin's calibration: its speed at the moment
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


def headline(points: pd.DataFrame, requests: pd.DataFrame | None = None) -> evidence.Finding:
    """The recommended batch size with its evidence, and (given the requests) its throughput against the
    smallest batch as a ratio with a 95% interval over repeats, or why none is supported.

    Args:
        points: this experiment's points.
        requests: its requests (for the per-repeat throughputs of the ratio); None skips the ratio.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    usable = evidence.usable_points(points)
    excluded = len(points) - len(usable)
    best = recommend(points)
    if best is None:
        return evidence.Finding("No valid batch size met the SLO: relax slo_ttft_s / slo_tpot_s or shorten the "
                                "prompts.", f"{len(usable)} valid points of {len(points)}", False,
                                evidence.point_ids(usable))
    text = (f"Recommended batch size: {int(best.batch_size)} at {int(best.prompt_tokens)} prompt tokens "
            f"({best.goodput_rps:.2f} req/s within the SLO, {best.output_throughput_tps:.1f} tok/s, "
            f"TTFT p50 {best.ttft_s_p50:.2f} s).")
    n_req = checks.int_or(best.get("requests"), 0)
    good = int(round(best.goodput_rps * best.wall_s)) if "wall_s" in best else 0
    units, good_units = attainment_units(best, n_req, good)
    att = evidence.wilson_interval(good_units, units) if units else None
    ci = (f"TTFT p50 95% interval {best.ttft_s_p50_ci_low:.3g}-{best.ttft_s_p50_ci_high:.3g} s (t over repeat "
          f"medians)" if pd.notna(best.get("ttft_s_p50_ci_low")) else "TTFT p50: no interval (fewer than 2 repeats)")
    parts = [f"highest goodput among {len(usable)} valid points ({excluded} invalid or failed excluded)",
             f"{n_req} requests at the recommended point" + (
                 f", {good} met the SLO; attainment over {units} independent batches (the rows of one batch share "
                 f"one timing) {good_units}/{units}, {att.describe('{:.2f}')}" if att else ""), ci]
    ids = [str(best.point_id)] if "point_id" in best else []
    why = "" if units >= 2 else f"attainment rests on {units} independent batch (an interval needs 2)"
    if requests is not None and "point_id" in best and "point_id" in requests:
        same = usable[usable["prompt_tokens"] == best.prompt_tokens].sort_values("batch_size")
        if len(same) and int(same.iloc[0].batch_size) != int(best.batch_size):
            base = same.iloc[0]
            if isinstance(best.get("design"), str):  # interleaved: pair the two batches of a round (issue 32)
                a, b = repeat_throughputs(requests, best.point_id, True), repeat_throughputs(requests, base.point_id, True)
                iv = evidence.paired_ratio_interval(a, b.reindex(a.index), unit="rounds")
                aa = evidence.Interval(float(best["aa_ratio"]), float(best["aa_low"]), float(best["aa_high"]),
                                       checks.int_or(best.get("rounds"), 0), "", reason="too few rounds")
                floor = f" ({comparison.noise_floor_text(aa, 'interleaved', aa.n)})"
                moved = aa.shown and (aa.low > 1 or aa.high < 1)
            else:
                iv = evidence.ratio_interval(repeat_throughputs(requests, best.point_id),
                                             repeat_throughputs(requests, base.point_id))
                floor, moved = "", False
            name = f"Output throughput at batch {int(best.batch_size)} vs batch {int(base.batch_size)}"
            said = (f"{name}: {comparison.AA_MOVED}: {iv.describe('{:.2f}', 'x')}" if moved
                    else evidence.describe_ratio(iv, name))
            text += " " + said + floor + "."
            ids.append(str(base.point_id))
            if not why and not (iv.shown and iv.low > 1):
                why = (f"the throughput gain over batch {int(base.batch_size)} is not beyond noise" if iv.shown
                       else f"no throughput interval against batch {int(base.batch_size)} ({iv.reason})")
    supported = not why
    if why:
        text = f"Not supported ({why}): {text}"
    return evidence.Finding(text, "; ".join(parts), supported, tuple(ids))


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


def decode_speed_vs_batch(requests: pd.DataFrame) -> go.Figure:
    """Per-request decode speed (box over requests) versus batch size."""
    df = requests[requests["output_tokens"] > 1].copy()
    df["prompt_tokens"] = df["context_tokens"].fillna(df["prompt_tokens"]).astype(int).astype(str)
    fig = px.box(df, x="batch_size", y="decode_tps", color="prompt_tokens", points=False,
                 labels=labels("batch_size", "decode_tps", "prompt_tokens"),
                 title="Per-request decode speed vs batch size")
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
    fig.update_xaxes(type="log", dtick=0.30103)
    return fig


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame) -> dict[str, go.Figure]:
    """All figures of the batch-size notebook, by file name."""
    rec = recommend(points)
    return {
        "batch_ttft": ttft_vs_batch(points),
        "batch_throughput": throughput_vs_batch(points),
        "batch_pareto": pareto(points),
        "batch_decode_speed": decode_speed_vs_batch(requests),
        "batch_goodput": goodput_vs_batch(points, rec),
    }
