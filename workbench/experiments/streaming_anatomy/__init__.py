"""Streaming anatomy (notebook ``04_streaming_anatomy``): what the user waits for, and when.

Three sweeps into one run folder, each a ``workbench.run.sweeps.run_sweep`` experiment:

- ``streaming``: one point per output length (short / medium / long). Every
  token id is timed as :func:`workbench.measure.generation.generate_measured` produces
  it, and an every-token display (:class:`workbench.measure.detokenize.StreamTap`) is
  attached to record when text first becomes visible (``first_display_s``) and
  what the display path costs per token (``handler_s_per_token``). With 2+ lengths and ``repeats`` >= 2 the
  lengths are the arms of one design (issue 49; :func:`sweep_design`): every round runs each length once and the
  shortest a second time (the A/A control), order shuffled; the time per output token of the longest output over
  the shortest (:data:`TPOT`: does decoding slow as the output, and its KV cache, grows?), analysed as a block design
  (a direction, equivalent within the margin, or undecided with the rounds it would need). That streaming shows the
  first token before the whole answer is a measurement, not a decision: e2e exceeds TTFT for any answer longer than
  one token.
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
  serves one request at a time, whatever the client concurrency). With 2+ concurrencies and ``repeats`` >= 2 the
  concurrencies are the arms of one design (:func:`http_design`; the run is the unit: a round sends each
  concurrency's requests once and one request alone again, the A/A control): the **primary comparison**, the one
  the finding's verdict rests on, is the client TTFT of the round's requests at the highest concurrency over one
  request alone (:data:`CLIENT_TTFT`: what a user waits for the first token when others ask at the same moment).
  It can come out either way (a server that batches concurrent requests keeps it near 1x; one that serves them in
  turn multiplies it), and it decides in 2-3 rounds where the TPOT comparison, a few percent, needs tens: that one
  is said beside it with its own verdict (issue 49, results/LOG.md 2026-12-06).

:func:`run` measures all three; :func:`figures` draws ITL distribution and
position, perceived latency (stream vs wait), granularity, per-request
timelines and client-vs-engine TTFT from what :func:`run` wrote. Tables are in
seconds; figures show milliseconds on some axes.

**Parts** (this module is the experiment's face: :class:`Config`, the measurements and the designs,
:func:`measure_point`, :func:`run`, and every name below re-exported): :mod:`.summaries` (the outcomes the designs
decide, :data:`TPOT` and :data:`CLIENT_TTFT`, the tables and the finding), :mod:`.charts` (the figures and
:func:`figures`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.checks import check_bool, check_int, check_int_list, check_str_list
from workbench.errors import ParameterError
from workbench.experiments.streaming_anatomy.charts import (
    figures,
    granularity_figure,
    http_ratio_figure,
    itl_histogram_figure,
    itl_long_form,
    itl_position_figure,
    perceived_latency_figure,
    timeline_figure,
    tpot_ratio_figure,
    transport_figure,
)
from workbench.experiments.streaming_anatomy.summaries import (
    ANATOMY_COLUMNS,
    CLIENT_TTFT,
    TPOT,
    anatomy_table,
    finding,
    granularity_table,
    sweep_rows,
    transport_table,
)
from workbench.load.client import measure_http
from workbench.measure.detokenize import Granularity, StreamTap
from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured, warm_up
from workbench.run import design, design_sweep, point_result, sweeps
from workbench.run.point_result import PointResult
from workbench.serving.server import ServerThread
from workbench.stats import metrics

EXPERIMENT = "streaming_anatomy"

DEFAULT_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "用三句话介绍长城。",
    "Give three tips for writing clear emails.",
    "What makes a good cup of tea? Answer briefly.",
)


# --------------------------------------------------------------------------- config


@dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """Streaming anatomy (notebook ``04_streaming_anatomy``).

    With 2+ output lengths and ``repeats`` >= 2 the streaming points are the arms of one design
    (:func:`sweep_design`): ``repeats`` rounds first, up to ``max_rounds`` while the primary comparison is undecided
    and ``budget_s`` allows.

    Attributes:
        output_tokens: new tokens per request, one point each (short / medium / long), each >= 2 (a time per output
            token needs two tokens).
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
        repeats: rounds of the streaming design before the first look; the timed repeats of the granularity and
            HTTP points.
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
    repeats: int = 2
    max_rounds: int = 4

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        check_int_list("output_tokens", self.output_tokens, lo=2)
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

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The primary design (:func:`http_design`, ``workbench plan``): one arm per HTTP concurrency (the ``http``
        experiment), when ``http`` and 2+ levels and rounds."""
        levels = len(set(self.http_concurrency)) if self.http else 0
        return ("http", levels, int(self.repeats), int(self.max_rounds)) if levels >= 2 and self.repeats >= 2 else None

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


def sweep_design(loaded, cfg: "Config", lengths: Sequence[int]) -> design_sweep.SweepDesign:
    """The streaming sweep's output lengths as one design (:mod:`workbench.run.design`): round ``r`` runs one batch
    of each length at seed ``cfg.seed + r``, every token timed with the every-token display attached (as
    :func:`measure_stream`), and the shortest length a second time (the A/A control), in an order shuffled per round.
    The shortest length is the marked control; the primary outcome is the batch's TPOT (:data:`TPOT`, its median
    request); the design stops early once the longest length is decided. Rows are :func:`measure_stream`'s with
    ``repeat`` = round.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep` (points
        ``{"max_new_tokens": n}``); each point's ``extra`` holds ``itl_jitter``.
    """
    prompts = [cfg.prompt] * cfg.batch_size
    pid = (lambda n: point_result.point_id("streaming", {"max_new_tokens": n}))

    def measure(p, rnd):
        settings = cfg.settings(p["max_new_tokens"])
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + rnd), ["token"])
        rows = []
        for rec in batch.records:
            sm = tap.row_summary(rec["request_id"], "token", batch.t_submit)
            rows.append(dict(rec, batch_size=len(prompts), t_start_s=0.0, first_display_s=sm["first_display_s"],
                             handler_s_per_token=sm["handler_s_per_token"]))
        tpots = [r["tpot_s"] for r in rows if r.get("tpot_s") == r.get("tpot_s")]
        return design.Measured({TPOT.name: float(np.median(tpots)) if tpots else float("nan")}, rows, batch.wall_s)

    def extra(point_id, result):
        itls = [float(v) for r in result.requests.get(point_id, []) for v in r["itl_s"]]
        p = metrics.percentiles(itls, (50, 99))
        return {"itl_jitter": p["p99"] / p["p50"] if p["p50"] > 0 else float("nan")}

    lengths = [int(n) for n in lengths]
    short, long_ = min(lengths), max(lengths)
    d = design.Design("streaming", [pid(n) for n in lengths], pid(short), TPOT, decide=[pid(long_)],
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, lambda p: warm_up(loaded, prompts, cfg.settings(p["max_new_tokens"]),
                                                            cfg.warmup), extra)



#: Per-point columns of the HTTP design: medians of its requests over the rounds (seconds).
HTTP_EXTRA = ("transport_ttft_s", "engine_ttft_s", "engine_queue_s")


def http_design(cfg: "Config", base_url: str, tokenizer=None) -> design_sweep.SweepDesign:
    """The HTTP sweep's concurrencies as one design (:mod:`workbench.run.design`), the run the unit: round ``r``
    sends, for each concurrency ``c``, ``c`` streaming requests together (:func:`workbench.load.client.measure_http`,
    seed ``cfg.seed + r``), and one request alone a second time (the A/A control), in an order shuffled per round.
    The lowest concurrency is the marked control; the primary outcome is the median client TTFT of the run's
    requests (:data:`CLIENT_TTFT`); the design stops early once the highest concurrency is decided.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep` (points
        ``{"concurrency": c}``); each point's ``extra`` holds the medians of :data:`HTTP_EXTRA` (``<column>_p50``).
    """
    levels = sorted(int(c) for c in cfg.http_concurrency)
    pid = (lambda c: point_result.point_id("http", {"concurrency": c}))
    prompts = cfg.timeline_prompts()

    def measure(p, rnd):
        got = measure_http(base_url, prompts, p["concurrency"], cfg.http_tokens, 1, 0, cfg.temperature,
                           cfg.seed + rnd, tokenizer=tokenizer)
        return design.Measured({CLIENT_TTFT.name: float(np.median([q["ttft_s"] for q in got["requests"]]))},
                               got["requests"], got["wall_s"])

    def prepare(p):
        return measure_http(base_url, prompts, p["concurrency"], cfg.http_tokens, 0, cfg.warmup, cfg.temperature,
                            cfg.seed, tokenizer=tokenizer)["warmup_s"]

    def extra(point_id, result):
        reqs = result.requests.get(point_id, [])
        return {f"{c}_p50": metrics.percentiles([q[c] for q in reqs], (50,))["p50"] for c in HTTP_EXTRA}

    d = design.Design("http", [pid(c) for c in levels], pid(levels[0]), CLIENT_TTFT, decide=[pid(levels[-1])],
                      **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, prepare, extra)


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
        state: shared by the points of one sweep: ``base_url``, the server's URL, for http points;
            ``granularity``, a cache of the granularity points: the first runs :func:`measure_granularity`
            once for every granularity (all buffers on one ``generate`` per repeat), later ones reuse it,
            and a fully resumed sweep runs nothing.

    Returns:
        :class:`workbench.run.point_result.PointResult`.

    Raises:
        ParameterError: a point of none of these kinds, or an http point without ``base_url``.
    """
    if "max_new_tokens" in point:   # one length on its own (the design, :func:`sweep_design`, measures the rest)
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
    """Measure the streaming (with 2+ lengths and ``repeats`` >= 2 one design, :func:`sweep_design`: its rounds on
    disk in ``design/streaming.parquet``, resumed by round), granularity and (if ``cfg.http``) http sweeps (with 2+
    concurrencies and ``repeats`` >= 2 one design, :func:`http_design`, ``design/http.parquet``) into ``run_dir``.

    Returns:
        The points of the three sweeps (``experiment`` tells them apart).
    """
    common = dict(resume=resume, info=loaded.info, loaded=loaded, config=cfg)
    lengths = list(cfg.output_tokens)
    designed = sweep_design(loaded, cfg, lengths) if len(lengths) >= 2 and cfg.repeats >= 2 else None
    frames = [sweeps.run_sweep(run_dir, "streaming", sweeps.expand_grid(max_new_tokens=lengths),
                               lambda p: measure_point(loaded, cfg, p, {}), design=designed, **common)]
    granularity: dict = {}
    frames.append(sweeps.run_sweep(run_dir, "granularity", sweeps.expand_grid(granularity=cfg.granularities),
                                   lambda p: measure_point(loaded, cfg, p, granularity), **common))
    if cfg.http:
        with ServerThread(loaded) as srv:
            http = {"base_url": srv.base_url}
            served = (http_design(cfg, srv.base_url, loaded.tokenizer)
                      if len(set(cfg.http_concurrency)) >= 2 and cfg.repeats >= 2 else None)
            frames.append(sweeps.run_sweep(run_dir, "http", sweeps.expand_grid(concurrency=cfg.http_concurrency),
                                           lambda p: measure_point(loaded, cfg, p, http), speed_probe=True,
                                           design=served, **common))
    return pd.concat(frames, ignore_index=True)


#: the experiment's face: what notebook 04, the report and the tests read as ``streaming_anatomy.<name>``
__all__ = [
    "EXPERIMENT", "DEFAULT_PROMPTS", "Config", "TPOT", "CLIENT_TTFT", "HTTP_EXTRA", "GRANULARITY_COLUMNS",
    "ANATOMY_COLUMNS", "measure_stream", "sweep_design", "http_design", "measure_granularity", "measure_point", "run",
    "sweep_rows", "anatomy_table", "finding", "granularity_table", "transport_table", "itl_long_form",
    "itl_histogram_figure", "itl_position_figure", "perceived_latency_figure", "timeline_figure",
    "granularity_figure", "transport_figure", "tpot_ratio_figure", "http_ratio_figure", "figures",
]
