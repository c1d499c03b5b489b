"""Streaming anatomy (notebook ``04_streaming_anatomy``): what the user waits for, and when.

Three sweeps into one run folder, each a ``workbench.run.sweeps.run_sweep`` experiment:

- ``streaming``: one point per output length (short / medium / long). Every
  token id is timed as :func:`workbench.measure.generation.generate_measured` produces
  it, and an every-token display (:class:`workbench.measure.detokenize.StreamTap`) is
  attached to record when text first becomes visible (``first_display_s``) and
  what the display path costs per token (``handler_s_per_token``).
- ``granularity``: one batch displayed every token, every N tokens and every T
  ms side by side (one ``generate`` per repeat feeds a display buffer per
  granularity, so every granularity sees the same token stamps): updates,
  display lag, added time to first text, and whether the delivered text
  concatenates to the final decode (``text_equal``).
- ``http``: an OpenAI-compatible server on a loopback port
  (:class:`workbench.serving.server.ServerThread`) driven by the official
  ``openai`` client (:func:`workbench.load.client.measure_http`); the client's
  first chunk minus the engine's first text is what HTTP, SSE framing and the
  client add. HTTP rows time text chunks, not tokens: their gaps are
  ``chunk_itl_s`` (no ``itl_s``), their ``tpot_s`` is over the decode steps
  between the first and last chunk, and their ``batch_size`` is 1 (the server
  serves one request at a time, whatever the client concurrency).

:func:`run` measures all three; :func:`figures` draws ITL distribution and
position, perceived latency (stream vs wait), granularity, per-request
timelines and client-vs-engine TTFT from what :func:`run` wrote. Tables are in
seconds; figures show milliseconds on some axes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import checks
from workbench.stats import comparison, evidence, metrics
from workbench.share import plots
from workbench.predict import predictions
from workbench.run import sweeps  # noqa: F401  (plots registers the house template)
from workbench.checks import check_bool, check_int, check_int_list, check_str_list
from workbench.measure.detokenize import Granularity, StreamTap
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured, warm_up
from workbench.run.point_result import PointResult
from workbench.load.client import measure_http
from workbench.serving.server import ServerThread

EXPERIMENT = "streaming_anatomy"

DEFAULT_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "用三句话介绍长城。",
    "Give three tips for writing clear emails.",
    "What makes a good cup of tea? Answer briefly.",
)


# --------------------------------------------------------------------------- config


@dataclass
class Config(sweeps.SweepConfig):
    """Streaming anatomy (notebook ``04_streaming_anatomy``).

    Attributes:
        output_tokens: new tokens per request, one point each (short / medium / long).
        batch_size: requests per ``generate`` call in the anatomy points.
        prompt: the anatomy prompt (a user message).
        ignore_eos: fixed-length anatomy runs (``min_new_tokens = max_new_tokens``).
        temperature, top_p: sampling (0 = greedy).
        granularities: display granularities compared (``token``, ``N tokens``, ``T ms``).
        granularity_tokens: new tokens per request in the granularity / timeline batch.
        timeline_batch: requests in that batch (natural lengths: EOS ends rows).
        http: run the HTTP serving experiment.
        http_concurrency: requests sent together, one point each.
        http_tokens: ``max_tokens`` of each HTTP request (fixed length).
    """

    output_tokens: list = field(default_factory=lambda: [32, 128, 384])
    batch_size: int = 1
    prompt: str = DEFAULT_PROMPTS[0]
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    granularities: list = field(default_factory=lambda: ["token", "4 tokens", "16 tokens", "100 ms", "500 ms"])
    granularity_tokens: int = 64
    timeline_batch: int = 4
    http: bool = True
    http_concurrency: list = field(default_factory=lambda: [1, 4])
    http_tokens: int = 32

    def __post_init__(self):
        super().__post_init__()
        check_int_list("output_tokens", self.output_tokens, lo=1)
        check_int("batch_size", self.batch_size, lo=1)
        check_int("granularity_tokens", self.granularity_tokens, lo=1)
        check_int("timeline_batch", self.timeline_batch, lo=1)
        check_int("http_tokens", self.http_tokens, lo=1)
        check_int_list("http_concurrency", self.http_concurrency, lo=1)
        check_bool("ignore_eos", self.ignore_eos)
        check_bool("http", self.http)
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ParameterError(f"prompt: must be a non-empty string (got {self.prompt!r})")
        check_str_list("granularities", self.granularities)
        labels = [Granularity.parse(g).label for g in self.granularities]
        if len(set(labels)) != len(labels):
            raise ParameterError(f"granularities: must be distinct (got {self.granularities!r})")
        if max(self.output_tokens) > self.max_context() - 64:
            raise ParameterError(f"output_tokens: must leave room for the prompt in the context (got {self.output_tokens!r})")
        self.settings(1)

    def settings(self, max_new_tokens: int, ignore_eos: bool | None = None) -> GenerationSettings:
        """Generation settings of a point."""
        return GenerationSettings(max_new_tokens=max_new_tokens,
                                  ignore_eos=self.ignore_eos if ignore_eos is None else ignore_eos,
                                  temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def plan_points(self) -> list[tuple[str, dict]]:
        """``(experiment, point)`` of the three sweeps :func:`run` measures (``workbench plan`` counts them): the
        streaming points (one per ``output_tokens``), the granularities, and the HTTP concurrencies when ``http``."""
        return ([("streaming", {"max_new_tokens": n}) for n in self.output_tokens]
                + [("granularity", {"granularity": g}) for g in self.granularities]
                + ([("http", {"concurrency": c}) for c in self.http_concurrency] if self.http else []))

    def timeline_prompts(self) -> list[str]:
        """``timeline_batch`` prompts cycling through :data:`DEFAULT_PROMPTS` (English and Chinese)."""
        return [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(self.timeline_batch)]


# --------------------------------------------------------------------------- measurements


def _run_tapped(loaded, prompts, settings, granularities, **kwargs):
    """One ``generate_measured`` batch with a :class:`StreamTap` attached."""
    tap_box: dict = {}

    def on_step(ids, t):
        if "tap" not in tap_box:  # built lazily; its ms-mode clock origin is t0, read just before the call
            tap_box["tap"] = StreamTap(
                loaded.tokenizer, len(prompts), granularities, eos_token_ids(loaded), t0=tap_box.get("t0")
            )
        tap_box["tap"](ids, t)

    tap_box["t0"] = time.perf_counter()
    batch = generate_measured(loaded, prompts, settings, on_step=on_step, **kwargs)
    tap = tap_box.get("tap") or StreamTap(loaded.tokenizer, len(prompts), granularities, eos_token_ids(loaded))
    tap.close(batch.t_submit + batch.wall_s)
    return batch, tap


def measure_stream(
    loaded, prompts: Sequence, settings: GenerationSettings, repeats: int = 1, warmup: int = 1, **kwargs
) -> PointResult:
    """Measure one batch per repeat, with every-token display attached.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        prompts: the batch's prompts.
        settings: generation settings; repeat ``r`` uses ``seed + r``.
        repeats: timed batches.
        warmup: untimed batches first (:func:`workbench.measure.generation.warm_up`).
        **kwargs: passed to :func:`generate_measured`.

    Returns:
        :class:`workbench.run.point_result.PointResult`: one row per request with the generation record, ``repeat``,
        ``batch_size``, ``t_start_s`` (0: all submitted together),
        ``first_display_s`` (submit to first visible text), and
        ``handler_s_per_token``; ``extra`` holds ``itl_jitter`` (ITL p99 / p50
        over all requests; the point's ``itl_s_p50`` / ``itl_s_p99`` come from
        :func:`workbench.stats.metrics.summarize_point`).
    """
    warmup_s = warm_up(loaded, prompts, settings, warmup, **kwargs)
    rows, wall, itls = [], 0.0, []
    for r in range(repeats):
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + r), ["token"], **kwargs)
        wall += batch.wall_s
        for rec in batch.records:
            s = tap.row_summary(rec["request_id"], "token", batch.t_submit)
            row = dict(rec, repeat=r, batch_size=len(prompts), t_start_s=0.0)
            row["first_display_s"] = s["first_display_s"]
            row["handler_s_per_token"] = s["handler_s_per_token"]
            rows.append(row)
            itls.extend(rec["itl_s"])
    p = metrics.percentiles(itls, (50, 99))
    extra = {"itl_jitter": p["p99"] / p["p50"] if p["p50"] > 0 else float("nan")}
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s, extra=extra)


def measure_streams_interleaved(loaded, cfg: "Config", lengths: Sequence[int]) -> dict:
    """The streaming sweep's output lengths measured as interleaved arms (:mod:`workbench.stats.comparison`): every
    round runs one batch of each length plus the shortest length a second time (the A/A control,
    :data:`workbench.stats.comparison.AA`), in an order shuffled per round from ``cfg.seed``; ``cfg.repeats`` rounds,
    round ``r`` at seed ``cfg.seed + r``, each length warmed up ``cfg.warmup`` times first. Rows are those of
    :func:`measure_stream` with ``repeat`` = round, so the TPOT ratio of two lengths pairs their batches by
    round. The A/A control's TPOT ratio (second shortest batch / first, t over rounds of the per-round median
    ratios) is the noise floor of that ratio.

    Returns:
        ``{max_new_tokens: PointResult}``; every result's ``extra`` holds ``itl_jitter`` and the A/A columns
        (:data:`workbench.stats.comparison.COLUMNS`).
    """
    lengths = sorted(int(n) for n in lengths)
    prompts = [cfg.prompt] * cfg.batch_size
    got = {n: {"rows": [], "wall": 0.0, "itls": [], "warmup_s": warm_up(loaded, prompts, cfg.settings(n), cfg.warmup)}
           for n in lengths}
    arms = [*lengths, comparison.AA]
    tpot_rows = []
    for rnd, arm in comparison.schedule(arms, cfg.repeats, cfg.seed):
        n = lengths[0] if arm == comparison.AA else arm
        settings = cfg.settings(n)
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + rnd), ["token"])
        tpots = [r["tpot_s"] for r in batch.records if r.get("tpot_s") == r.get("tpot_s")]
        tpot_rows.append({"arm": arm, "round": rnd, "value": float(np.median(tpots)) if tpots else float("nan")})
        if arm == comparison.AA:
            continue
        g = got[n]
        g["wall"] += batch.wall_s
        for rec in batch.records:
            sm = tap.row_summary(rec["request_id"], "token", batch.t_submit)
            g["rows"].append(dict(rec, repeat=rnd, batch_size=len(prompts), t_start_s=0.0,
                                  first_display_s=sm["first_display_s"],
                                  handler_s_per_token=sm["handler_s_per_token"]))
            g["itls"].extend(rec["itl_s"])
    cols = comparison.compare(pd.DataFrame(tpot_rows), lengths[0], comparison.AA, adjust=False).columns()
    out = {}
    for n, g in got.items():
        p = metrics.percentiles(g["itls"], (50, 99))
        extra = {"itl_jitter": p["p99"] / p["p50"] if p["p50"] > 0 else float("nan"), **cols}
        out[n] = PointResult(requests=g["rows"], wall_s=g["wall"], warmup_s=g["warmup_s"], extra=extra)
    return out


#: Per-request display columns of the granularity sweep, summarised per granularity.
GRANULARITY_COLUMNS = ("updates", "tokens_per_update", "display_lag_s_mean", "display_lag_s_p90",
                       "added_first_display_s", "handler_s_per_token")


def measure_granularity(
    loaded,
    prompts: Sequence,
    settings: GenerationSettings,
    granularities: Sequence = ("token", "4 tokens", "100 ms"),
    repeats: int = 1,
    warmup: int = 1,
) -> dict[str, PointResult]:
    """Run the same batches once with every granularity attached side by side.

    One ``generate`` call per repeat feeds a :class:`~workbench.measure.detokenize.DisplayBuffer`
    per granularity, so every granularity sees the same token stamps; the
    handler time of each is measured separately.

    Returns:
        ``{label: PointResult}`` (see :func:`measure_stream`), each request row
        extended with ``granularity``, ``updates``, ``tokens_per_update``,
        ``display_lag_s_mean``, ``display_lag_s_p90``, ``display_lag_s_max``,
        ``first_display_s``, ``added_first_display_s`` (first display minus
        TTFT), ``handler_s_per_token`` and ``text_equal`` (the delivered text
        concatenates to the final decode). ``extra`` holds ``<column>_p50`` of
        :data:`GRANULARITY_COLUMNS` and ``text_equal`` (all rows).

    Raises:
        ParameterError: an unreadable or repeated granularity.
    """
    labels = [Granularity.parse(g).label for g in granularities]
    if len(set(labels)) != len(labels):
        raise ParameterError(f"granularities: must be distinct (got {list(granularities)!r})")
    warmup_s = warm_up(loaded, prompts, settings, warmup)
    out = {lab: PointResult(requests=[], wall_s=0.0, warmup_s=warmup_s) for lab in labels}
    for r in range(repeats):
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + r), labels)
        for lab in labels:
            out[lab].wall_s += batch.wall_s
            for rec in batch.records:
                s = tap.row_summary(rec["request_id"], lab, batch.t_submit)
                text = s.pop("display_text")
                row = dict(rec, repeat=r, batch_size=len(prompts), t_start_s=0.0, **s)
                row["added_first_display_s"] = s["first_display_s"] - rec["ttft_s"]
                row["text_equal"] = text == rec["text"]
                out[lab].requests.append(row)
    for lab in labels:
        reqs = out[lab].requests
        out[lab].extra = {f"{c}_p50": metrics.percentiles([q[c] for q in reqs], (50,))["p50"]
                          for c in GRANULARITY_COLUMNS}
        out[lab].extra["text_equal"] = all(q["text_equal"] for q in reqs)
    return out


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one point of any of the three sweeps.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the notebook's :class:`Config`.
        point: ``{"max_new_tokens": n}`` (streaming), ``{"granularity": g}`` or ``{"concurrency": c}`` (http).
        state: shared by the points of one sweep: ``interleave``, the output lengths of a streaming sweep
            measured as interleaved arms (the first streaming point runs :func:`measure_streams_interleaved`,
            kept under ``streams``); ``base_url``, the server's URL, for http points;
            ``granularity``, a cache of the granularity points: the first runs :func:`measure_granularity`
            once for every granularity (all buffers on one ``generate`` per repeat), later ones reuse it,
            and a fully resumed sweep runs nothing.

    Returns:
        :class:`workbench.run.point_result.PointResult`.

    Raises:
        ParameterError: a point of none of these kinds, or an http point without ``base_url``.
    """
    if "max_new_tokens" in point:
        if state.get("interleave"):  # the sweep's lengths as interleaved arms with the A/A control (issue 32)
            cache = state.setdefault("streams", {})
            if not cache:
                cache.update(measure_streams_interleaved(loaded, cfg, state["interleave"]))
            return cache[int(point["max_new_tokens"])]
        return measure_stream(loaded, [cfg.prompt] * cfg.batch_size, cfg.settings(point["max_new_tokens"]),
                              cfg.repeats, cfg.warmup)
    if "granularity" in point:
        cache = state.setdefault("granularity", {})
        if not cache:
            cache.update(measure_granularity(loaded, cfg.timeline_prompts(),
                                             cfg.settings(cfg.granularity_tokens, ignore_eos=False),
                                             cfg.granularities, cfg.repeats, cfg.warmup))
        return cache[Granularity.parse(point["granularity"]).label]
    if "concurrency" in point:
        base_url = state.get("base_url")
        if base_url is None:
            raise ParameterError("base_url: an http point needs a running server")
        return PointResult.of(measure_http(base_url, cfg.timeline_prompts(), point["concurrency"], cfg.http_tokens,
                            cfg.repeats, cfg.warmup, cfg.temperature, cfg.seed, tokenizer=loaded.tokenizer))
    raise ParameterError(f"point: expected max_new_tokens, granularity or concurrency (got {point!r})")


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Measure the streaming, granularity and (if ``cfg.http``) http sweeps into ``run_dir``.

    Returns:
        The points of the three sweeps (``experiment`` tells them apart).
    """
    common = dict(resume=resume, info=loaded.info, loaded=loaded, config=cfg)
    streaming: dict = {"interleave": list(cfg.output_tokens)} if len(cfg.output_tokens) > 1 else {}
    frames = [sweeps.run_sweep(run_dir, "streaming", sweeps.expand_grid(max_new_tokens=cfg.output_tokens),
                               lambda p: measure_point(loaded, cfg, p, streaming), **common)]
    granularity: dict = {}
    frames.append(sweeps.run_sweep(run_dir, "granularity", sweeps.expand_grid(granularity=cfg.granularities),
                                   lambda p: measure_point(loaded, cfg, p, granularity), **common))
    if cfg.http:
        with ServerThread(loaded) as srv:
            http = {"base_url": srv.base_url}
            frames.append(sweeps.run_sweep(run_dir, "http", sweeps.expand_grid(concurrency=cfg.http_concurrency),
                                           lambda p: measure_point(loaded, cfg, p, http), speed_probe=True,
                                           **common))
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- tables


ANATOMY_COLUMNS = ("max_new_tokens", "status", "ttft_s_p50", "tpot_s_p50", "itl_s_p50", "itl_s_p99", "itl_jitter",
                   "e2e_s_p50")


def _only(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Rows of one sweep (a run folder may hold every notebook of a suite)."""
    return df[df["experiment"] == experiment].reset_index(drop=True) if "experiment" in df else df


def anatomy_table(points: pd.DataFrame) -> pd.DataFrame:
    """The streaming sweep's points: TTFT, TPOT, ITL p50 / p99, jitter and e2e per output length (seconds)."""
    df = _only(points, "streaming")
    return df[[c for c in ANATOMY_COLUMNS if c in df]]


def _repeat_medians(requests: pd.DataFrame, point_id: str, column: str) -> pd.Series:
    """One median of ``column`` per repeat of a point (the independent units: a batch shares one stamp)."""
    g = requests[requests["point_id"] == point_id]
    return g.groupby("repeat")[column].median() if len(g) and column in g else pd.Series(dtype=float)


def finding(points: pd.DataFrame, requests: pd.DataFrame | None = None) -> evidence.Finding:
    """TTFT against waiting for the whole answer at the longest output (the ratio e2e / TTFT, a t-interval over
    the repeats' log ratios), and TPOT at the longest against the shortest output (Welch ratio interval over
    repeat medians); a direction only where the interval carries it.

    Args:
        points: the points of :func:`run` (the ``streaming`` sweep is used).
        requests: their requests (for the per-repeat values); None: figures without intervals.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    df = evidence.usable_points(_only(points, "streaming"))
    if df.empty:
        return evidence.Finding("No valid streaming point finished.", "", False)
    df = df.sort_values("max_new_tokens")
    lo, hi = df.iloc[0], df.iloc[-1]
    ids = evidence.point_ids(df)
    reqs = _only(requests, "streaming") if requests is not None else None
    have = reqs is not None and {"point_id", "repeat"} <= set(reqs.columns)
    n_rep = int(reqs[reqs["point_id"] == hi["point_id"]]["repeat"].nunique()) if have else 0
    if have:
        e2e, ttft = _repeat_medians(reqs, hi["point_id"], "e2e_s"), _repeat_medians(reqs, hi["point_id"], "ttft_s")
        sooner = evidence.paired_ratio_interval(e2e, ttft.reindex(e2e.index), unit="repeats")
    else:
        sooner = evidence.Interval(float(hi["e2e_s_p50"] / hi["ttft_s_p50"]), float("nan"), float("nan"), 0, "",
                                   reason="per-repeat values not given")
    verdict = evidence.ratio_verdict(sooner)
    head = (f"Streaming shows the first token after {hi['ttft_s_p50']:.2f} s instead of {hi['e2e_s_p50']:.1f} s for a "
            f"{int(hi['max_new_tokens'])}-token answer")
    if verdict == "higher":
        text = f"{head} ({sooner.estimate:.0f}x sooner)."
    else:
        text = f"{head}; how much sooner: {verdict}: {sooner.describe('{:.0f}', 'x')}."
    parts = [f"{n_rep} repeat(s) of {checks.int_or(hi.get('batch_size'), 1)} request(s) per output length",
             f"e2e / TTFT {sooner.describe('{:.1f}', 'x')}"]
    if len(df) > 1 and have:
        a, b = _repeat_medians(reqs, hi["point_id"], "tpot_s"), _repeat_medians(reqs, lo["point_id"], "tpot_s")
        interleaved = isinstance(hi.get("design"), str)
        if interleaved:  # measured by round: pair the two lengths' batches of one round (issue 32)
            tpot = evidence.paired_ratio_interval(a, b.reindex(a.index), unit="rounds")
        else:
            tpot = evidence.ratio_interval(a, b, unit="repeat medians")
        name = (f"TPOT at {int(hi['max_new_tokens'])} vs {int(lo['max_new_tokens'])} tokens "
                f"({hi['tpot_s_p50'] * 1e3:.0f} vs {lo['tpot_s_p50'] * 1e3:.0f} ms)")
        aa = (evidence.Interval(float(hi["aa_ratio"]), float(hi["aa_low"]), float(hi["aa_high"]),
                                checks.int_or(hi.get("rounds"), 0), "", reason="1 round") if interleaved else None)
        moved = aa is not None and aa.shown and (aa.low > 1 or aa.high < 1)
        said = (f"{name}: {comparison.AA_MOVED}: {tpot.describe('{:.2f}', 'x')}" if moved
                else evidence.describe_ratio(tpot, name))
        text += " " + said + (f" ({comparison.noise_floor_text(aa, 'interleaved', aa.n)})" if aa is not None
                              else "") + "."
        parts.append(f"TPOT ratio: {'t over rounds of the paired log ratios' if interleaved else 'Welch over repeat medians'}")
    return evidence.Finding(text, "; ".join(parts), verdict == "higher", ids)


def granularity_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Medians per granularity (``<column>_p50``, seconds) of :func:`measure_granularity` rows, in input order."""
    requests = _only(requests, "granularity")
    cols = ["updates", "tokens_per_update", "display_lag_s_mean", "display_lag_s_p90", "display_lag_s_max",
            "first_display_s", "added_first_display_s", "handler_s_per_token"]
    order = list(dict.fromkeys(requests["granularity"]))
    t = requests.groupby("granularity")[cols].median().reindex(order).add_suffix("_p50")
    t["text_equal"] = requests.groupby("granularity")["text_equal"].all().reindex(order)
    return t.reset_index()


def transport_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Medians per concurrency (seconds): client vs engine TTFT, the transport share, queueing, per-token times.

    Args:
        requests: :func:`~workbench.load.client.measure_http` rows (other sweeps' rows are ignored).

    Returns:
        ``concurrency``, ``requests``, ``ttft_s_p50`` (client), ``engine_ttft_s_p50``,
        ``transport_ttft_s_p50`` (client first chunk minus engine first text), ``transport_ttft_s_max``,
        ``engine_queue_s_p50``, ``tpot_s_p50`` (client: first-to-last chunk over the decode steps between
        them), ``engine_tpot_s_p50``, ``transport_e2e_s_p50``, ``chunks_per_token``.
    """
    g = _only(requests, "http").groupby("concurrency")
    out = g.agg(
        requests=("ttft_s", "size"),
        ttft_s_p50=("ttft_s", "median"),
        engine_ttft_s_p50=("engine_ttft_s", "median"),
        **({"engine_first_text_s_p50": ("engine_first_text_s", "median")} if "engine_first_text_s" in requests else {}),
        transport_ttft_s_p50=("transport_ttft_s", "median"),
        transport_ttft_s_max=("transport_ttft_s", "max"),
        engine_queue_s_p50=("engine_queue_s", "median"),
        tpot_s_p50=("tpot_s", "median"),
        engine_tpot_s_p50=("engine_tpot_s", "median"),
        transport_e2e_s_p50=("transport_e2e_s", "median"),
    )
    out["chunks_per_token"] = g["chunks"].sum() / g["output_tokens"].sum()
    return out.reset_index()


# --------------------------------------------------------------------------- figures


def itl_long_form(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per inter-token gap: ``position`` (the later token's index, 1-based from the 2nd token) and ``itl_ms``."""
    rows = []
    for _, q in requests.iterrows():
        for i, v in enumerate(list(q["itl_s"])):
            rows.append({"position": i + 1, "itl_ms": 1000 * float(v), "max_new_tokens": q.get("max_new_tokens"),
                         "length": f"{q.get('max_new_tokens')} tokens", "repeat": q.get("repeat", 0),
                         "request_id": q.get("request_id", 0)})
    return pd.DataFrame(rows)


def itl_histogram_figure(requests: pd.DataFrame) -> go.Figure:
    """Histogram of inter-token latency (ms), one colour per output length."""
    df = itl_long_form(requests)
    return px.histogram(df, x="itl_ms", color="length", barmode="overlay", nbins=60, opacity=0.6,
                        labels={"itl_ms": "inter-token latency (ms)", "length": "output length"},
                        title="Inter-token latency distribution")


def itl_position_figure(requests: pd.DataFrame) -> go.Figure:
    """ITL (ms) against token position, one line per output length (first repeat, first request)."""
    df = itl_long_form(requests)
    df = df[(df["repeat"] == df["repeat"].min()) & (df["request_id"] == df["request_id"].min())]
    return px.line(df, x="position", y="itl_ms", color="length",
                   labels={"position": "token position", "itl_ms": "inter-token latency (ms)", "length": "output length"},
                   title="Inter-token latency vs position in the output")


def perceived_latency_figure(requests: pd.DataFrame) -> go.Figure:
    """Time to first visible text when streaming vs when waiting for the whole answer, against output tokens."""
    g = requests.groupby("max_new_tokens", as_index=False).agg(
        output_tokens=("output_tokens", "median"), ttft_s=("ttft_s", "median"),
        first_display_s=("first_display_s", "median"), e2e_s=("e2e_s", "median"))
    long = pd.concat([
        g.assign(mode="streaming (first text at TTFT)", seconds=g["first_display_s"]),
        g.assign(mode="whole answer (text at e2e)", seconds=g["e2e_s"]),
    ])
    fig = px.line(long, x="output_tokens", y="seconds", color="mode", markers=True,
                  labels={"output_tokens": "output tokens (median)", "seconds": "time until the user sees text (s)"},
                  title="Perceived latency: streaming vs waiting for the whole answer")
    pred = predictions.predict_rows(requests).groupby("max_new_tokens", as_index=False).agg(  # dotted: the roofline
        output_tokens=("output_tokens", "median"), predicted_ttft_s=("predicted_ttft_s", "median"),
        predicted_e2e_s=("predicted_e2e_s", "median"))
    predictions.add_predicted_line(fig, pred, "output_tokens", "predicted_ttft_s", name="predicted TTFT")
    predictions.add_predicted_line(fig, pred, "output_tokens", "predicted_e2e_s", name="predicted whole answer")
    return fig


def timeline_figure(requests: pd.DataFrame, title: str = "Per-request timeline") -> go.Figure:
    """Per-request timeline: a bar from start to first token (TTFT), then a tick per token (or per chunk).

    Args:
        requests: rows with ``request_id``, ``ttft_s``, ``itl_s`` (token gaps) or, for HTTP rows,
            ``chunk_itl_s`` (text-chunk gaps), and optional ``t_start_s`` (request start relative
            to the first request's, s).
    """
    fig = go.Figure()
    for _, q in requests.iterrows():
        y = f"req {q['request_id']}"
        start = float(q.get("t_start_s", 0.0) or 0.0)
        first = start + float(q["ttft_s"])
        gaps = q.get("itl_s")
        if not isinstance(gaps, (list, tuple, np.ndarray)):
            gaps = q.get("chunk_itl_s")
        gaps = list(gaps) if isinstance(gaps, (list, tuple, np.ndarray)) else []
        ticks = first + np.concatenate([[0.0], np.cumsum(np.asarray(gaps, dtype=float))])
        fig.add_trace(go.Bar(x=[first - start], base=[start], y=[y], orientation="h", name="TTFT",
                             marker_color="#bbbbbb", showlegend=bool(q["request_id"] == requests["request_id"].iloc[0]),
                             legendgroup="ttft"))
        fig.add_trace(go.Scatter(x=ticks, y=[y] * len(ticks), mode="markers", name="token",
                                 marker={"symbol": "line-ns-open", "size": 10}, legendgroup="tok",
                                 showlegend=bool(q["request_id"] == requests["request_id"].iloc[0])))
    fig.update_layout(title=title, xaxis_title="time since first submit (s)", yaxis_title="request",
                      barmode="overlay")
    return fig


def granularity_figure(requests: pd.DataFrame) -> go.Figure:
    """Updates, mean display lag and added time to first text per granularity (medians over requests)."""
    t = granularity_table(requests)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "display updates per request", "mean display lag (ms)", "added time to first text (ms)"))
    x = t["granularity"].astype(str)
    fig.add_trace(go.Bar(x=x, y=t["updates_p50"], name="updates"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=1000 * t["display_lag_s_mean_p50"], name="lag"), row=1, col=2)
    fig.add_trace(go.Bar(x=x, y=1000 * t["added_first_display_s_p50"], name="first text"), row=1, col=3)
    fig.update_layout(title="Display granularity: fewer updates cost lag", showlegend=False)
    fig.update_xaxes(title_text="granularity")
    fig.update_yaxes(title_text="updates", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=3)
    return fig


def transport_figure(requests: pd.DataFrame) -> go.Figure:
    """Client vs engine TTFT per request, by concurrency (what HTTP adds is the gap)."""
    df = _only(requests, "http").copy()
    df["concurrency"] = df["concurrency"].astype(int)
    df["label"] = "r" + df["repeat"].astype(int).astype(str) + " #" + df["request_id"].astype(int).astype(str)
    sides = [df.assign(side="engine TTFT (arrival to first token)", ms=1000 * df["engine_ttft_s"])]
    if "engine_first_text_s" in df:
        sides.append(df.assign(side="engine first text (arrival to first text)", ms=1000 * df["engine_first_text_s"]))
    sides.append(df.assign(side="client TTFT (send to first chunk)", ms=1000 * df["ttft_s"]))
    long = pd.concat(sides)
    fig = px.bar(long, x="label", y="ms", color="side", barmode="group",
                 facet_col="concurrency", labels={"label": "request (repeat, index)", "ms": "time to first token (ms)"},
                 title="HTTP streaming: client-side vs engine-side TTFT")
    fig.update_xaxes(matches=None)
    return fig


@plots.split_by_device
def figures(requests: pd.DataFrame) -> dict[str, go.Figure]:
    """Every figure of the notebook, by file name (the http ones only if that sweep ran).

    Args:
        requests: the run's request rows (``results.read_requests(run)``); each figure takes its sweep's rows.
    """
    req = _only(requests, "streaming")
    gran = _only(requests, "granularity")
    first = gran[gran["granularity"] == gran["granularity"].iloc[0]]
    first = first[first["repeat"] == first["repeat"].min()]
    figs = {
        "itl_histogram": itl_histogram_figure(req),
        "itl_vs_position": itl_position_figure(req),
        "perceived_latency": perceived_latency_figure(req),
        "granularity": granularity_figure(gran),
        "timeline_batch": timeline_figure(first, "Per-request timeline: one batch"),
    }
    http = _only(requests, "http")
    if not http.empty:
        top = http[(http["concurrency"] == http["concurrency"].max()) & (http["repeat"] == 0)]
        figs["http_ttft"] = transport_figure(http)
        figs["timeline_http"] = timeline_figure(top, "Per-request timeline: concurrent HTTP requests (queued; a tick "
                                                     "per text chunk)")
    return figs
