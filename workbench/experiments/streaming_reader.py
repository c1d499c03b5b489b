"""Experiment 10, streaming to a reader: what a reader sees, a real nginx in the path, client timeouts.

Three parts, each a set of sweep points (``part`` column):

- ``reader``: per language, greedy generations on the model in process; each token timeline goes through
  the display path at each display granularity and :mod:`workbench.measure.reading` gives time to first word and
  first sentence, stalls (> 250 ms), the longest stall and the reading-speed margin (one request row per
  granularity).
- ``proxy``: streaming chat requests to the OpenAI-compatible server (:mod:`workbench.serving.server`,
  which sends ``X-Accel-Buffering: no`` on every stream), either directly or through a real nginx (the
  Debian package) started on a loopback port from a generated config (:func:`workbench.load.proxy.nginx_config`):
  ``buffering_on`` (``proxy_buffering on``, ``proxy_ignore_headers X-Accel-Buffering``, i.e. a server that
  does not send the header, and buffers of ``nginx_buffer_kb`` KiB: ``proxy_buffer_size`` and 8
  ``proxy_buffers`` of that size, what a production config with large ``proxy_buffers`` has),
  ``buffering_default`` (the same with nginx's default buffers of one memory page, 4 KiB on x86-64 Linux),
  ``buffering_off`` (``proxy_buffering off``) and ``header`` (``proxy_buffering on``, the server's header
  honoured). With buffering, nginx reads the upstream into its buffers and writes a buffer to the client
  only when it is full or the upstream has ended (Maxim Dounin, nginx mailing list, 2011-04-25,
  https://nginx.org/pipermail/nginx/2011-April/026438.html): an SSE answer (~200 bytes a token) smaller
  than the buffers arrives all at once at the end (client TTFT = e2e), one larger than a page arrives a
  page at a time (the first chunk after ~20 tokens). That holds for nginx's default
  ``proxy_http_version 1.0`` (``nginx_upstream_http``), where the upstream's body is close-delimited.
  With ``proxy_http_version 1.1`` the upstream answers in HTTP chunks, and nginx (1.22.1, measured here
  by ``tests/experiments/test_streaming_reader.py``) passes each complete chunk on as it arrives even
  with buffering on: each SSE event is one HTTP chunk, so buffering then costs nothing visible. Per request: client TTFT (send to the first content
  chunk), e2e, every chunk's arrival time, ``first_read_bytes`` / ``first_read_chunks`` (response bytes
  and content chunks delivered by the socket read that brought the first content chunk), ``first_after_last``
  (the first chunk arrived after the engine generated the last token: client TTFT >= engine e2e, an
  ordering, not a threshold) and the reader metrics of the chunks as they arrived (granularity
  ``http chunks``). Without nginx (not installed, cannot start) the nginx modes are left out with the
  reason (:func:`workbench.load.proxy.nginx_status`); ``direct`` still runs.

  Design (issue 49; :mod:`workbench.run.design`): with 2+ paths, ``direct`` among them, and ``repeats`` >= 2 the
  proxy points are the arms of one design (:func:`sweep_design`): each round streams the same request along every
  path and ``direct`` again (the A/A control), order shuffled per round from the seed; ``repeats`` rounds first, up
  to ``max_rounds`` while the leading mode's comparison is undecided and ``budget_s`` allows. The outcome is a
  round's client TTFT (what buffering changes); every mode's TTFT over ``direct`` (the marked control) comes from
  one block analysis of the rounds (rounds as blocks, one residual variance pooled over the paths, Dunnett's
  simultaneous intervals: :mod:`workbench.stats.blocks`), with three verdicts (slower / faster, equivalent within
  the margin, undecided with the rounds it would take) in the ``time_ratio`` columns, the A/A control's beside them
  (:func:`ttft_ratio_claim`). One repeat pairs nothing: each path is measured on its own, the comparison
  undecided. Reader and keep-alive points are measured point by point.
- ``keepalive``: a client with a read timeout (``client_timeout_s``) streams a request that waits in the
  queue behind a longer one (``blocker_tokens``). Without keep-alive the server sends nothing until the
  first token and the client times out; with ``keepalive_s`` the response starts at once and ``: keep-alive``
  comments arrive while it waits, so the same client gets its answer.

Timings come from :func:`workbench.stats.metrics.request_timing` over content-chunk arrival stamps (chunk gaps are
``chunk_itl_s``, never ``itl_s``).

External target (issue 23): with ``endpoint: {url, model, api_key_env, name}``
(:mod:`workbench.load.endpoint`) every part runs against that OpenAI-compatible server instead of the model
in process, checked in one line before any point runs (:func:`check_targets`), and no weights load
(:func:`load_for`: the tokenizer alone, for the run record). Rows carry ``target`` (the endpoint's ``name``);
``output_tokens`` come from its ``usage`` (content chunks when it sends none: ``token_count_source``); the
server-side columns (``engine_ttft_s``, ``engine_e2e_s``, ``first_after_last``) stay empty where it sends no
engine figures, and ``server_side_note`` says why.

- ``proxy``: streams from the endpoint ``direct``, and through nginx in front of it for an ``http://`` one.
- ``reader``: the same greedy requests (temperature 0, ``ignore_eos``) streamed from the endpoint; the token
  timeline is replaced by the content chunks' arrival times at the client, fed to the same display path one chunk
  at a time (:func:`workbench.measure.reading.chunk_reader_rows`). What differs: a chunk may carry more than one token
  (or a character's worth of several), so the granularity ``token`` becomes "every chunk the server sends"
  (labelled ``chunk``, ``N tokens`` becomes ``N chunks``, ``T ms`` stays), ``ttft_s`` / ``e2e_s`` are the
  client's (send to first / last content chunk, so they include the transport), ``tpot_s`` / ``decode_tps``
  count the ``usage`` tokens between the first and last chunk (:func:`workbench.load.client.client_decode_steps`),
  ``itl_s`` is empty (no per-token-id stamps leave the server) and ``chunk_itl_s`` holds the chunk gaps.
- ``keepalive``: the same client with a read timeout, queued behind the same blocker, against the endpoint as
  it is (``keepalive`` empty): whether it times out is the external server's own behaviour (its batching, and
  any SSE comments it sends while a request waits, counted in ``keepalives``). The on / off pair is left out:
  ``keepalive_s`` is the built-in server's setting and an external server has no such knob
  (:data:`ENDPOINT_KEEPALIVE_NOTE`, in ``keepalive_note``).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import endpoint as endpoint_mod
from workbench.load.client import stream_request, table_row
from workbench.load.proxy import NGINX_BUFFER_KB, NGINX_MODES, UPSTREAM_HTTP, Paths, nginx_status
from workbench.measure import reading
from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured
from workbench.run import design, design_sweep, sweeps
from workbench.run.point_result import PointResult, point_id
from workbench.share import figures_design
from workbench.share.plots import label, ok_points, split_by_device
from workbench.stats import evidence, metrics

EXPERIMENT = "streaming_reader"
PROXY_MODES = ("direct",) + NGINX_MODES
#: why an external endpoint's keep-alive part has one case, not the built-in server's on / off pair
ENDPOINT_KEEPALIVE_NOTE = ("external endpoint measured as it is: keep-alive on / off is the built-in server's "
                           "keepalive_s setting, which an external server does not expose; any SSE comments it sends "
                           "while the request waits are counted in keepalives")
PROMPTS = {
    "en": "Explain in a few sentences why the sky is blue.",
    "zh": "请用几句话解释为什么天空是蓝色的。",
}


@dataclasses.dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """Parameters of notebook 10 (see the module docstring).

    With 2+ paths (``direct`` among them) and ``repeats`` >= 2 the proxy points are one design
    (:func:`sweep_design`): ``repeats`` rounds first, up to ``max_rounds`` while the leading mode's comparison is
    undecided and ``budget_s`` allows; ``margin`` its equivalence margin.

    Attributes:
        max_new_tokens: tokens per request (greedy, ignore_eos so every request has the same length).
        languages: prompts for the reader part (``en``, ``zh``).
        granularities: display granularities for the reader part.
        proxy_modes: ``direct`` and the nginx modes to measure.
        nginx_upstream_http: nginx's ``proxy_http_version`` to the server (``1.0``, nginx's default, or ``1.1``).
        nginx_buffer_kb: ``proxy_buffer_size`` and each of 8 ``proxy_buffers`` (KiB) in every nginx mode but
            ``buffering_default``.
        client_timeout_s: the keep-alive part's client read timeout.
        keepalive_s: the server's keep-alive comment interval in that part (below ``client_timeout_s``).
        blocker_tokens: length of the request the probe waits behind (0: skip the keep-alive part).
        stall_s: a gap between display updates longer than this is a stall.
        endpoint: an external OpenAI-compatible server for every part, ``{url, model, api_key_env, name}``
            (:class:`workbench.load.endpoint.Endpoint`; see the module docstring for what changes); None: the
            model in process and the built-in server.
    """

    max_new_tokens: int = 64
    languages: list = dataclasses.field(default_factory=lambda: ["en", "zh"])
    granularities: list = dataclasses.field(default_factory=lambda: ["token", "4 tokens", "100 ms"])
    proxy_modes: list = dataclasses.field(default_factory=lambda: list(PROXY_MODES))
    nginx_buffer_kb: int = NGINX_BUFFER_KB
    nginx_upstream_http: str = "1.0"
    client_timeout_s: float = 1.0
    keepalive_s: float = 0.25
    blocker_tokens: int = 48
    stall_s: float = reading.STALL_S
    endpoint: dict | None = None
    repeats: int = 2  # the proxy paths' comparison needs 2 rounds (the notebook's default, one place: its parameters cell agrees)

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        checks.check_int("max_new_tokens", self.max_new_tokens, lo=1, hi=4096)
        checks.check_choice_list("languages", self.languages, sorted(PROMPTS), allow_empty=True)
        checks.check_str_list("granularities", self.granularities, allow_empty=True)
        from workbench.measure.detokenize import Granularity

        for g in self.granularities:
            Granularity.parse(g)
        checks.check_choice_list("proxy_modes", self.proxy_modes, PROXY_MODES, allow_empty=True)
        checks.check_int("nginx_buffer_kb", self.nginx_buffer_kb, lo=4, hi=1 << 20)
        checks.check_choice("nginx_upstream_http", self.nginx_upstream_http, UPSTREAM_HTTP)
        checks.check_float("client_timeout_s", self.client_timeout_s, lo=0, lo_open=True)
        checks.check_float("keepalive_s", self.keepalive_s, lo=0, lo_open=True)
        if self.keepalive_s >= self.client_timeout_s:
            raise ParameterError(f"keepalive_s: must be below client_timeout_s ({self.client_timeout_s:g}) "
                                 f"to keep the client alive (got {self.keepalive_s:g})")
        checks.check_int("blocker_tokens", self.blocker_tokens, lo=0, hi=4096)
        checks.check_float("stall_s", self.stall_s, lo=0, lo_open=True)
        ep = self.target()
        if ep is not None and ep.url.startswith("https://") and set(self.proxy_modes) - {"direct"}:
            raise ParameterError("proxy_modes: nginx modes need an http:// endpoint (its config proxies plain "
                                 "HTTP); use proxy_modes [direct] for an https:// one")

    def target(self) -> "endpoint_mod.Endpoint | None":
        """The external endpoint every part runs against, or None (the model in process, the built-in server)."""
        return None if self.endpoint is None else endpoint_mod.Endpoint.from_param(self.endpoint)

    def needs_model(self) -> bool:
        """Whether the model's weights are needed: not with an endpoint (every part then runs against it)."""
        return self.endpoint is None

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The proxy paths' design (:func:`sweep_design`, ``workbench plan``): one arm per path, ``direct`` the
        control; the reader and keep-alive parts beside it are not a design."""
        proxy = [p for p in self.grid() if p["part"] == "proxy"]
        return (EXPERIMENT, len(proxy), int(self.repeats), int(self.max_rounds)) if interleaves(self, proxy) else None

    def grid(self, nginx_ok: bool = True) -> list[dict]:
        """The points: per language a ``reader`` point, per proxy mode a ``proxy`` point (nginx modes only when
        ``nginx_ok``), and the ``keepalive`` points: keep-alive off and on for the built-in server, one point with
        ``keepalive`` None (the server as it is) for an endpoint."""
        pts = [{"part": "reader", "language": lang, "proxy": "none", "keepalive": False} for lang in self.languages]
        pts += [{"part": "proxy", "language": "en", "proxy": m, "keepalive": False} for m in self.proxy_modes
                if m == "direct" or nginx_ok]
        if self.blocker_tokens:
            modes = (None,) if self.endpoint is not None else (False, True)
            pts += [{"part": "keepalive", "language": "en", "proxy": "direct", "keepalive": k} for k in modes]
        return pts


# ----------------------------------------------------------------------------- measurement


def _paths(cfg: Config, loaded) -> Paths:
    """The run's streaming paths (:class:`workbench.load.proxy.Paths`) for ``cfg``."""
    return Paths(loaded, cfg.target(), cfg.nginx_buffer_kb, cfg.nginx_upstream_http, cfg.keepalive_s)


def _reader_rows(cfg: Config, loaded, lang: str, repeat: int) -> list[dict]:
    stamps: list[float] = []
    settings = GenerationSettings(max_new_tokens=cfg.max_new_tokens, temperature=0.0, seed=cfg.seed + repeat)
    batch = generate_measured(loaded, [PROMPTS[lang]], settings, on_step=lambda ids, t: stamps.append(t))
    rec = batch.records[0]
    n = rec["output_tokens"]
    rows = reading.reader_rows(loaded.tokenizer, rec["output_ids"], stamps[:n], batch.t_submit, cfg.granularities,
                               eos_token_ids(loaded), cfg.stall_s)
    base = {k: rec[k] for k in ("ttft_s", "e2e_s", "tpot_s", "decode_tps", "output_tokens", "prompt_tokens",
                                "finish_reason", "itl_s")}
    return [{**base, **r, "repeat": repeat, "request_id": i} for i, r in enumerate(rows)]


def _proxy_row(cfg: Config, paths: Paths, mode: str, r: int) -> dict:
    """One timed streaming request along path ``mode`` as a request row (``repeat`` and ``request_id`` ``r``)."""
    ep = cfg.target()
    row = stream_request(paths.base(mode), PROMPTS["en"], cfg.max_new_tokens, stall_s=cfg.stall_s, ep=ep)
    if ep is not None:
        row.update(endpoint_mod.row_fields(row, ep))
    return {"max_new_tokens": cfg.max_new_tokens, **table_row(row), "granularity": "http chunks", "repeat": r,
            "request_id": r, "nginx_buffer_kb": None if mode in ("direct", "buffering_default") else cfg.nginx_buffer_kb,
            "nginx_upstream_http": None if mode == "direct" else cfg.nginx_upstream_http}


def _warm(cfg: Config, paths: Paths, mode: str) -> None:
    """``cfg.warmup`` untimed short requests along path ``mode`` (starts its nginx)."""
    for _ in range(cfg.warmup):
        stream_request(paths.base(mode), PROMPTS["en"], 2, ep=cfg.target())


def interleaves(cfg: Config, proxy_points: list[dict]) -> bool:
    """Whether the proxy points are measured as one design (:func:`sweep_design`): 2+ paths, ``direct`` (the control)
    among them, and 2+ rounds (``repeats``); one round pairs nothing, so each path is then measured on its own."""
    return (len(proxy_points) >= 2 and cfg.repeats >= 2
            and any(p["proxy"] == "direct" for p in proxy_points))


#: the design's outcome: a round's client TTFT along a path (one request), lower is better; its ratio to direct's is
#: the ``time_ratio`` columns
TTFT = design.Outcome("ttft_s", False, "client TTFT", "time_ratio")


def lead_mode(modes) -> str | None:
    """The nginx mode whose comparison with ``direct`` sets the finding's verdict: the first of :data:`LEAD_ORDER`
    among ``modes`` (None without one)."""
    return next((m for m in LEAD_ORDER if m in set(modes)), None)


def sweep_design(cfg: Config, paths: Paths, proxy_points: list[dict]) -> design_sweep.SweepDesign:
    """The proxy points as one design (:mod:`workbench.run.design`): the paths are the arms, ``direct`` the marked
    control (measured a second time each round as the A/A arm), the round's client TTFT the primary outcome
    (:data:`TTFT`); the design stops early once the leading nginx mode's comparison (:func:`lead_mode`) is decided.
    Each arm's measurement streams the same request once along its path (:func:`_proxy_row`, ``repeat`` = round);
    each path is warmed up ``cfg.warmup`` times first (its nginx started).

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    pids = {point_id(EXPERIMENT, p): p for p in proxy_points}
    control = next(pid for pid, p in pids.items() if p["proxy"] == "direct")
    lead = lead_mode(p["proxy"] for p in proxy_points)

    def measure(p, rnd):
        t0 = time.perf_counter()
        row = _proxy_row(cfg, paths, p["proxy"], rnd)
        ttft = row.get("ttft_s")
        if not (isinstance(ttft, (int, float)) and ttft == ttft and ttft > 0):
            raise RuntimeError(f"{p['proxy']}: round {rnd}: the request delivered no content "
                               f"({row.get('outcome') or row.get('error') or 'no first chunk'})")
        return design.Measured({TTFT.name: float(ttft)}, [row], time.perf_counter() - t0)

    def prepare(p):
        t0 = time.perf_counter()
        _warm(cfg, paths, p["proxy"])
        return time.perf_counter() - t0

    decide = [pid for pid, p in pids.items() if p["proxy"] == lead] or None
    d = design.Design(EXPERIMENT, list(pids), control, TTFT, decide=decide, **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, prepare)


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One point of the grid (``part`` reader / proxy / keepalive).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"part", ...}`` (:meth:`Config.grid`).
        state: shared by the points of one sweep: ``bench``, the streaming paths (a
            :class:`workbench.load.proxy.Paths` is made on the first point when absent; the caller closes it). The
            proxy points of a design (:func:`interleaves`) are measured by it, never here.

    Returns:
        :class:`workbench.run.point_result.PointResult`: one row per request and the point's wall time.
    """
    if "bench" not in state:
        state["bench"] = _paths(cfg, loaded)
    bench: Paths = state["bench"]
    t0 = time.perf_counter()
    rows: list[dict] = []
    ep = cfg.target()
    if point["part"] == "reader":
        for r in range(cfg.repeats):
            rows += (endpoint_mod.chunk_reader_rows(ep, bench.endpoint_url(), PROMPTS[point["language"]],
                                                    cfg.max_new_tokens, cfg.granularities, cfg.stall_s, r)
                     if ep is not None
                     else _reader_rows(cfg, bench.loaded, point["language"], r))
    elif point["part"] == "proxy":  # one round (or one path): measured on its own, nothing to pair (else: the design)
        _warm(cfg, bench, point["proxy"])
        t0 = time.perf_counter()
        rows = [_proxy_row(cfg, bench, point["proxy"], r) for r in range(cfg.repeats)]
    else:
        base = bench.keepalive_base(point["keepalive"])
        for r in range(cfg.repeats):
            started = threading.Event()
            blocker = threading.Thread(target=stream_request, args=(base, PROMPTS["en"], cfg.blocker_tokens),
                                       kwargs={"ep": ep, "first_chunk": started})
            blocker.start()
            while not started.wait(0.05) and blocker.is_alive():
                pass  # until its first content chunk (or its end): the blocker is in the engine before the probe
            row = stream_request(base, PROMPTS["en"], 4, read_timeout=cfg.client_timeout_s, stall_s=cfg.stall_s,
                                 ep=ep)
            blocker.join()
            extra = ({**endpoint_mod.row_fields(row, ep), "keepalive_note": ENDPOINT_KEEPALIVE_NOTE}
                     if ep is not None else {})
            rows.append({**table_row(row), **extra, "repeat": r, "request_id": r,
                         "client_timeout_s": cfg.client_timeout_s, "blocker_tokens": cfg.blocker_tokens,
                         "keepalive_s": cfg.keepalive_s if point["keepalive"] else None})
    for row in rows:
        row.setdefault("max_new_tokens", cfg.max_new_tokens)
    wall = time.perf_counter() - t0
    extra = generation_columns(rows, wall) if point["part"] == "reader" and rows else {}
    return PointResult(requests=rows, wall_s=wall, extra=extra)


def generation_columns(rows: list[dict], wall_s: float) -> dict:
    """A reader point's per-point figures with each generation counted once.

    The reader part writes one request row per display granularity of each generation (same tokens, same
    timing), so the sweep's own summary would count every generation once per granularity (throughput and
    request counts times the number of granularities, percentiles over copies). This is
    :func:`workbench.stats.metrics.summarize_point` over one row per generation (``repeat``); its columns replace the
    sweep's.
    """
    once = pd.DataFrame(rows).drop_duplicates("repeat")
    return metrics.summarize_point(once, wall_s)


def load_for(cfg: Config):
    """What the run needs loaded: the model (:func:`workbench.measure.models.load_model`), or with an endpoint the
    tokenizer alone (:func:`workbench.measure.models.load_tokenizer_only`: no weights, ``model`` None), for the run record."""
    from workbench.measure import models

    if cfg.needs_model():
        return models.load_model(cfg.model, cfg.device, cfg.dtype)
    return models.load_tokenizer_only(cfg.model)


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The three parts of ``cfg``; nginx modes are left out (reason in ``streaming_reader_nginx.txt``) without nginx.

    The proxy points are one design when they can be paired (:func:`interleaves`, :func:`sweep_design`; every
    finished round on disk under ``design/streaming_reader.parquet``, a resume continues from the last) and reach the
    points table together when the design stops; otherwise, and for the reader and keep-alive points, each point is
    measured and written on its own.

    Args:
        cfg: the sweep's config.
        run_dir: the run folder.
        loaded: from :func:`load_for` (with an endpoint the weights are not needed).
        resume: skip points this run already finished.

    Returns:
        The experiment's points DataFrame (:func:`workbench.run.sweeps.run_sweep`).
    """
    from workbench.run import results

    check_targets(cfg)
    binary, reason = nginx_status()
    results.save_text(run_dir, f"{EXPERIMENT}_nginx.txt", f"nginx: {binary}\n" if binary else f"skipped: {reason}\n")
    bench = _paths(cfg, loaded)
    grid = cfg.grid(nginx_ok=binary is not None)
    state = {"bench": bench}
    proxy = [p for p in grid if p["part"] == "proxy"]
    designed = sweep_design(cfg, bench, proxy) if interleaves(cfg, proxy) else None
    try:
        return sweeps.run_sweep(run_dir, EXPERIMENT, grid,
                                lambda p: measure_point(loaded, cfg, p, state), resume=resume, info=loaded.info,
                                config=cfg, design=designed)
    finally:
        bench.close()


def check_targets(cfg: Config) -> dict | None:
    """One-line errors for the external endpoint before any point runs
    (:func:`workbench.load.endpoint.check_endpoint`); None without one."""
    ep = cfg.target()
    return endpoint_mod.check_endpoint(ep) if ep is not None else None


# ----------------------------------------------------------------------------- summaries and figures


def proxy_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per proxy mode: median client TTFT, e2e, first chunk share of e2e, chunks per request."""
    req = requests[requests.get("part", pd.Series(dtype=str)) == "proxy"] if "part" in requests else requests.iloc[0:0]
    if req.empty:
        return pd.DataFrame()
    req = req.assign(transport_ttft_s=req["ttft_s"] - req["engine_ttft_s"],  # the path's share of the client TTFT
                     first_after_last=req["first_after_last"].astype(str).str.lower().eq("true").astype(float))
    out = req.groupby("proxy").agg(ttft_s_p50=("ttft_s", "median"), e2e_s_p50=("e2e_s", "median"),
                                   transport_ttft_s_p50=("transport_ttft_s", "median"),
                                   chunks_mean=("chunks", "mean"), first_word_s_p50=("first_word_s", "median"),
                                   first_read_bytes_p50=("first_read_bytes", "median"),
                                   first_read_chunks_p50=("first_read_chunks", "median"),
                                   first_after_last_share=("first_after_last", "mean"),
                                   longest_stall_s_max=("longest_stall_s", "max"), n=("ttft_s", "size"))
    out["ttft_share_of_e2e"] = out["ttft_s_p50"] / out["e2e_s_p50"]
    return out.reindex([m for m in PROXY_MODES if m in out.index]).reset_index()


#: the nginx modes in the order the finding states them; the first measured leads (its claim sets the mark):
#: production-sized buffers, the header ignored, is the cost the experiment is about
LEAD_ORDER = ("buffering_on", "buffering_default", "header", "buffering_off")


def ttft_ratio_claim(points: pd.DataFrame | None, requests: pd.DataFrame) -> tuple[str, dict, str]:
    """The finding's claim: each nginx mode's client TTFT over ``direct`` (the design's control) with its decision
    from the block analysis of the rounds (:func:`sweep_design`; the ``time_ratio`` columns: the ratio, its
    simultaneous interval, the verdict), :data:`LEAD_ORDER` first: the leading mode's decision is the finding's
    verdict. A moved A/A control (direct against itself shows a direction) is said and leaves the verdict
    undecided. Without a design (one round, nginx absent, no ``direct``) the claim is undecided with the reason.

    Returns:
        ``(sentences, fields, evidence)``: ``fields`` the finding's decision fields
        (:func:`workbench.run.design.finding_fields`: ``verdict``, ``margin``, ``rounds``, ``seconds``, what an
        undecided verdict needs).
    """
    ok = inter = pd.DataFrame()
    if points is not None and len(points) and {"design", "time_ratio", "part"} <= set(points):
        inter = points[(points["part"] == "proxy") & points["design"].notna()]
        ok = evidence.usable_points(inter)
    arms = ok.drop_duplicates("proxy").set_index("proxy") if len(ok) else ok
    order = [m for m in LEAD_ORDER if m in arms.index]
    if order and "direct" in arms.index:
        clauses = []
        for i, m in enumerate(order):
            name = f"Client TTFT through nginx {m} vs direct" if i == 0 else f"{m} vs direct"
            d = design.decision_from_row(arms.loc[m], TTFT)
            secs = checks.float_or_nan(arms.loc[m].get("seconds_per_round"))
            clauses.append((d.describe(name, words=TTFT.words, seconds_per_round=secs) if d is not None else
                            f"{name}: no decision ({arms.loc[m].get('time_ratio_method') or 'not compared'})") + ".")
        lead = arms.loc[order[0]]
        decision = design.decision_from_row(lead, TTFT)
        fields = design.finding_fields(lead, decision)
        if lead.get("aa_verdict") == "direction":
            clauses.append("The A/A control moved (direct against itself shows a direction): drift, not effects.")
            fields["verdict"] = "undecided"
        ev = (f"client TTFT per path and round (one request each), {len(arms)} paths with direct the control; "
              f"{design.evidence_text(lead)}; {decision.method if decision is not None else ''}")
        return " ".join(clauses), fields, ev
    req = requests[requests["part"] == "proxy"] if "part" in requests else requests.iloc[0:0]
    if len(inter):
        why = "no valid nginx point of the design (marked invalid: too few samples, other load or drift)"
    elif not set(req.get("proxy", ())) & set(NGINX_MODES):
        why = f"nginx modes not measured ({nginx_status()[1] or 'not in proxy_modes'})"
    elif "direct" not in set(req.get("proxy", ())):
        why = "direct (the control) not measured"
    elif req.groupby("proxy").size().max() < 2:
        why = "one round pairs nothing (repeats 1: each path measured on its own, no A/A control)"
    else:
        why = "the paths were measured point by point, not as one design of rounds with an A/A control"
    return f"Client TTFT through nginx vs direct: undecided: {why}.", {"verdict": "undecided"}, why


def headline(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> str:
    """The closing note: each nginx mode's client TTFT over direct with its interval and the A/A noise floor
    (:func:`ttft_ratio_claim`, from the interleaved proxy ``points``), then client TTFT, the path's share and e2e
    per path (medians of the proxy requests of the valid ``points``: a point marked invalid is quoted nowhere) and
    which paths held the first chunk until the last token."""
    t = proxy_table(requests)
    if t.empty:
        return "streaming_reader: no proxy measurements."
    if points is not None and len(points) and "point_id" in points and "point_id" in requests:
        t = proxy_table(requests[requests["point_id"].isin(evidence.point_ids(evidence.usable_points(points)))])
        if t.empty:
            return ttft_ratio_claim(points, requests)[0] + " Client TTFT by path left out: no proxy point is valid."
    by = t.set_index("proxy")
    def path_share(m):
        v = by.loc[m, "transport_ttft_s_p50"]
        return f"of which path {v:.3f} s" if v == v else "path share unknown: no engine TTFT reported"

    parts = [f"{m}: TTFT {by.loc[m, 'ttft_s_p50']:.3f} s, {path_share(m)} "
             f"(e2e {by.loc[m, 'e2e_s_p50']:.3f} s, TTFT/e2e {by.loc[m, 'ttft_share_of_e2e']:.0%})" for m in by.index]
    note = (ttft_ratio_claim(points, requests)[0] + " Client TTFT p50 by path (path = client TTFT minus the "
            "engine's): " + "; ".join(parts) + ".")
    held = [m for m in by.index if by.loc[m, "first_after_last_share"] >= 0.5]
    early = [m for m in by.index if by.loc[m, "first_after_last_share"] < 0.5]
    if held:
        note += (f" First chunk only after the last token (buffering turned TTFT into e2e): {', '.join(held)};"
                 f" before it: {', '.join(early) or 'none'}.")
    if "buffering_default" in by.index:
        note += (f" With nginx's default one-page buffers the first content arrived with "
                 f"{by.loc['buffering_default', 'first_read_bytes_p50']:.0f} response bytes "
                 f"({by.loc['buffering_default', 'first_read_chunks_p50']:.0f} chunks in that read).")
    return note + (" (workbench sweep 10_streaming_reader; nginx proxy_http_version 1.0 unless nginx_upstream_http "
                   "says otherwise; nginx_buffer_kb KiB buffers in buffering_on / off / header)")


def proxy_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Client TTFT of each path over direct with the simultaneous interval its verdict was read from, each round's
    ratio faint (from the run's design table), the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    df = ok_points(points)
    df = df[(df["part"] == "proxy") & df["time_ratio"].notna()] if len(df) and "time_ratio" in df else df.iloc[0:0]
    df = df.assign(path_order=df["proxy"].map({m: i for i, m in enumerate(PROXY_MODES)}))
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, TTFT.name)
    fig = figures_design.ratio_figure(df, "path_order", TTFT.prefix, rounds, name="client TTFT ratio",
                                      x_title="path", y_title="client TTFT ratio vs direct (x, log scale)",
                                      title="Client TTFT over direct (simultaneous 95% intervals; faint: each round; "
                                            "grey band: the A/A control)")
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(PROXY_MODES))), ticktext=list(PROXY_MODES))
    fig.update_yaxes(type="log")  # ratios from 0.7x to 60x: on a linear axis the A/A band is a hairline
    return fig


def proxy_ttft_figure(requests: pd.DataFrame) -> go.Figure:
    req = requests[requests["part"] == "proxy"] if "part" in requests else requests.iloc[0:0]
    fig = go.Figure()
    for col in ("ttft_s", "e2e_s"):
        fig.add_trace(go.Box(x=req["proxy"], y=req[col], name=label(col), boxpoints="all"))
    fig.update_layout(title="Client TTFT and e2e through nginx: buffering on, off, and on with X-Accel-Buffering: no",
                      xaxis_title="path", yaxis_title="seconds", boxmode="group")
    return fig


def chunk_arrival_figure(requests: pd.DataFrame) -> go.Figure:
    req = requests[(requests["part"] == "proxy") & (requests["repeat"] == 0)] if "part" in requests else requests.iloc[0:0]
    fig = go.Figure()
    for _, r in req.iterrows():
        offs = list(r["chunk_offsets_s"]) if r["chunk_offsets_s"] is not None else []
        fig.add_trace(go.Scatter(x=offs, y=list(range(1, len(offs) + 1)), mode="lines+markers", name=r["proxy"],
                                 line={"shape": "hv"}))
        eng = r.get("engine_e2e_s")
        if eng is not None and eng == eng:
            fig.add_vline(x=eng, line={"dash": "dot", "width": 1})
    fig.update_layout(title="Chunk arrival at the client (repeat 0; dotted: the engine's last token): a buffering "
                            "proxy delivers the answer in buffer-sized bursts", xaxis_title="time since send (s)",
                      yaxis_title=label("chunks"))
    return fig


def reader_figure(requests: pd.DataFrame) -> go.Figure:
    req = requests[requests["part"] == "reader"] if "part" in requests else requests.iloc[0:0]
    cols = ("first_word_s", "first_sentence_s", "longest_stall_s", "reading_margin")
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=[label(c) for c in cols])
    if not req.empty:
        g = req.groupby(["language", "granularity"], sort=False)[list(cols)].median().reset_index()
        for lang in g["language"].unique():
            sub = g[g["language"] == lang]
            for i, c in enumerate(cols, 1):
                fig.add_trace(go.Bar(x=sub["granularity"], y=sub[c], name=lang, legendgroup=lang, showlegend=i == 1),
                              row=1, col=i)
    fig.update_layout(title="What the reader sees, per display granularity (medians; margin > 1: faster than reading)",
                      barmode="group")
    return fig


def keepalive_figure(requests: pd.DataFrame) -> go.Figure:
    req = requests[requests["part"] == "keepalive"] if "part" in requests else requests.iloc[0:0]
    fig = go.Figure()
    if not req.empty:
        as_is = (req["target"] if "target" in req else pd.Series("endpoint", index=req.index)).fillna("endpoint")
        setting = req["keepalive"].map({True: "keep-alive comments", False: "no keep-alive"})
        req = req.assign(setting=setting.where(req["keepalive"].notna(), as_is.astype(str) + " as it is"))
        g = req.groupby(["setting", "outcome"]).size().reset_index(name="requests")
        for outcome in g["outcome"].unique():
            sub = g[g["outcome"] == outcome]
            fig.add_trace(go.Bar(x=sub["setting"], y=sub["requests"], name=outcome))
    fig.update_layout(title="A client read timeout on a queued request, with and without SSE keep-alive comments",
                      yaxis_title="requests", barmode="stack")
    return fig


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> dict[str, go.Figure]:
    """The experiment's figures from its points and request rows (the TTFT ratio figure from the design's points;
    ``run_dir``: its rounds, drawn faint)."""
    ok = set(ok_points(points)["point_id"]) if not points.empty else set()
    req = requests[requests["point_id"].isin(ok)] if "point_id" in requests else requests
    figs = {"reader_proxy_ttft": proxy_ttft_figure(req), "reader_chunk_arrival": chunk_arrival_figure(req),
            "reader_metrics": reader_figure(req), "reader_keepalive": keepalive_figure(req)}
    if "time_ratio" in points and points["time_ratio"].notna().any():  # the proxy design (issue 49)
        figs["reader_proxy_ttft_ratio"] = proxy_ratio_figure(points, run_dir)
    return figs


def finding(requests: pd.DataFrame, points: pd.DataFrame | None = None) -> evidence.Finding:
    """The report's finding: :func:`headline` with its evidence and the design's verdict.

    The claim it carries is nginx buffering's cost to TTFT (:func:`ttft_ratio_claim`): each nginx mode's client
    TTFT over direct from the block analysis of the rounds, the A/A control beside it. Its verdict is the leading
    mode's (:data:`LEAD_ORDER`): a direction, equivalent within the margin, or undecided with the rounds it would
    take; undecided when the A/A control moved, with one round, without nginx or without direct.

    Args:
        requests: this experiment's request rows.
        points: its points (the ``time_ratio`` and A/A columns); None: undecided.

    Returns:
        :class:`workbench.stats.evidence.Finding` (point ids: the proxy points).
    """
    text = headline(requests, points)
    _, fields, ev = ttft_ratio_claim(points, requests)
    req = requests[requests["part"] == "proxy"] if "part" in requests else requests.iloc[0:0]
    n = req.groupby("proxy").size().to_dict() if len(req) else {}
    counts = ", ".join(f"{m} {k}" for m, k in n.items()) or "none"
    ids = ()
    if points is not None and len(points) and "part" in points:
        ids = evidence.point_ids(evidence.usable_points(points[points["part"] == "proxy"]))
    if not n:
        fields = {**fields, "verdict": "undecided"}
    return evidence.Finding(text, f"proxy requests per path: {counts}; {ev}", False, ids, **fields)
