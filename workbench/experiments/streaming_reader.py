"""Experiment 10, streaming to a reader: what a reader sees, a real nginx in the path, client timeouts.

Three parts, each a set of sweep points (``part`` column):

- ``reader``: per language, greedy generations on the model in process; each token timeline goes through
  the display path at each display granularity and :mod:`workbench.measure.reading` gives time to first word and
  first sentence, stalls (> 250 ms), the longest stall and the reading-speed margin (one request row per
  granularity).
- ``proxy``: streaming chat requests to the OpenAI-compatible server (:mod:`workbench.serving.server`,
  which sends ``X-Accel-Buffering: no`` on every stream), either directly or through a real nginx (the
  Debian package) started on a loopback port from a generated config (:func:`workbench.serving.proxy.nginx_config`):
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
  reason (:func:`workbench.serving.proxy.nginx_status`); ``direct`` still runs.
- ``keepalive``: a client with a read timeout (``client_timeout_s``) streams a request that waits in the
  queue behind a longer one (``blocker_tokens``). Without keep-alive the server sends nothing until the
  first token and the client times out; with ``keepalive_s`` the response starts at once and ``: keep-alive``
  comments arrive while it waits, so the same client gets its answer.

Timings come from :func:`workbench.stats.metrics.request_timing` over content-chunk arrival stamps (chunk gaps are
``chunk_itl_s``, never ``itl_s``).

External target (issue 23): with ``endpoint: {url, model, api_key_env, name}``
(:mod:`workbench.serving.endpoint`) every part runs against that OpenAI-compatible server instead of the model
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
  count the ``usage`` tokens between the first and last chunk (:func:`workbench.serving.client.client_decode_steps`),
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

from workbench.measure import contention
from workbench import checks
from workbench.stats import evidence, metrics
from workbench.measure import reading
from workbench.run import sweeps
from workbench.errors import ParameterError
from workbench.serving import endpoint as endpoint_mod
from workbench.serving.client import stream_request
from workbench.serving.proxy import NGINX_BUFFER_KB, NGINX_MODES, UPSTREAM_HTTP, Nginx, nginx_status
from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured
from workbench.share.plots import label, ok_points, split_by_device
from workbench.run.point_result import PointResult

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
class Config(sweeps.SweepConfig):
    """Parameters of notebook 10 (see the module docstring).

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
            (:class:`workbench.serving.endpoint.Endpoint`; see the module docstring for what changes); None: the
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

    def __post_init__(self):
        super().__post_init__()
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


# ----------------------------------------------------------------------------- nginx


# ----------------------------------------------------------------------------- client


# ----------------------------------------------------------------------------- measurement


class _Bench:
    """The servers (and nginx) of one run, started on first use."""

    def __init__(self, cfg: Config, loaded):
        self.cfg, self.loaded = cfg, loaded
        self.server = None
        self.keepalive_server = None
        self.proxies: dict[str, Nginx] = {}
        self.served_pid = None

    def endpoint_url(self) -> str:
        """The external endpoint's base URL; a loopback server's CPU time counts as the point's own work, not as
        other load (:data:`workbench.measure.contention.SERVED_BY_PIDS`), from the first use on."""
        ep = self.cfg.target()
        if self.served_pid is None:
            self.served_pid = endpoint_mod.local_server_pid(ep)
            if self.served_pid is not None:
                contention.SERVED_BY_PIDS.add(self.served_pid)
        return ep.url

    def base(self, mode: str) -> str:
        from urllib.parse import urlsplit

        from workbench.serving.server import ServerThread

        ep = self.cfg.target()
        if ep is not None:  # the external endpoint, or nginx in front of it
            url = self.endpoint_url()
            if mode == "direct":
                return url
            if mode not in self.proxies:
                u = urlsplit(ep.url)
                self.proxies[mode] = Nginx(mode, f"{u.hostname}:{u.port or 80}", buffer_kb=self.cfg.nginx_buffer_kb,
                                            upstream_http=self.cfg.nginx_upstream_http).start()
            return self.proxies[mode].base_url
        if self.server is None:
            self.server = ServerThread(self.loaded).start()
        if mode == "direct":
            return self.server.base_url
        if mode not in self.proxies:
            self.proxies[mode] = Nginx(mode, self.server.port, buffer_kb=self.cfg.nginx_buffer_kb,
                                        upstream_http=self.cfg.nginx_upstream_http).start()
        return self.proxies[mode].base_url

    def keepalive_base(self, on: bool | None) -> str:
        """Where the keep-alive part's requests go: the endpoint (``on`` None), the built-in server with
        keep-alive comments (``on``) or without."""
        from workbench.serving.server import ServerThread

        if self.cfg.target() is not None:
            return self.endpoint_url()
        if on:
            if self.keepalive_server is None:
                self.keepalive_server = ServerThread(self.loaded, keepalive_s=self.cfg.keepalive_s).start()
            return self.keepalive_server.base_url
        return self.base("direct")

    def close(self) -> None:
        if self.served_pid is not None:
            contention.SERVED_BY_PIDS.discard(self.served_pid)
        for p in self.proxies.values():
            p.stop()
        for s in (self.server, self.keepalive_server):
            if s is not None:
                s.stop()


def _endpoint_fields(row: dict, ep) -> dict:
    """The columns every row of an endpoint run carries: ``target`` and ``server_side_note`` (engine figures
    reported by its server or not, :mod:`workbench.serving.endpoint`)."""
    e2e = row.get("engine_e2e_s")
    reported = e2e is not None and e2e == e2e
    return {"target": ep.name, "server_side_note": endpoint_mod.REPORTED_NOTE if reported
            else endpoint_mod.SERVER_SIDE_NOTE}


def _for_table(row: dict) -> dict:
    """A :func:`workbench.serving.client.stream_request` row without the caller-only fields (stamps, chunk texts, send time)."""
    return {k: v for k, v in row.items() if k not in ("chunk_stamps", "chunk_texts", "t_send")}


def _endpoint_reader_rows(cfg: Config, url: str, ep, lang: str, repeat: int) -> list[dict]:
    """One greedy request streamed from the endpoint, its chunk timeline shown at each granularity (module
    docstring: what differs from the in-process token timeline)."""
    from workbench.serving.client import client_decode_steps

    row = stream_request(url, PROMPTS[lang], cfg.max_new_tokens, stall_s=cfg.stall_s, ep=ep)
    if row["error"] or not row["chunks"]:
        raise RuntimeError(f"endpoint {ep.name}: no content streamed ({row['error'] or 'an empty answer'})")
    stamps, texts = row["chunk_stamps"], row["chunk_texts"]
    n_out, source = row["output_tokens"], "usage"
    if n_out is None:  # no usage in the stream: count content chunks, and say so
        n_out, source = len(stamps), "chunks"
    steps = client_decode_steps(n_out, row["finish_reason"], texts[0])
    tm = metrics.request_timing(stamps, row["t_send"], decode_steps=steps)
    base = {"ttft_s": tm["ttft_s"], "e2e_s": tm["e2e_s"], "tpot_s": tm["tpot_s"], "decode_tps": tm["decode_tps"],
            "output_tokens": int(n_out), "token_count_source": source, "prompt_tokens": row["prompt_tokens"],
            "finish_reason": row["finish_reason"], "itl_s": [], "chunk_itl_s": tm["itl_s"], "chunks": len(stamps),
            "decode_steps": steps, "text": row["text"], "engine_ttft_s": row["engine_ttft_s"],
            "engine_e2e_s": row["engine_e2e_s"], **_endpoint_fields(row, ep)}
    rows = reading.chunk_reader_rows(list(zip(stamps, texts)), row["t_send"], cfg.granularities, cfg.stall_s)
    return [{**base, **r, "repeat": repeat, "request_id": i} for i, r in enumerate(rows)]


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


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One point of the grid (``part`` reader / proxy / keepalive).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"part", ...}`` (:meth:`Config.grid`).
        state: shared by the points of one sweep: ``bench``, the servers and proxies (a :class:`_Bench` is
            made on the first point when absent; the caller closes it).

    Returns:
        :class:`workbench.run.point_result.PointResult`: one row per request and the point's wall time.
    """
    if "bench" not in state:
        state["bench"] = _Bench(cfg, loaded)
    bench: _Bench = state["bench"]
    t0 = time.perf_counter()
    rows: list[dict] = []
    ep = cfg.target()
    if point["part"] == "reader":
        for r in range(cfg.repeats):
            rows += (_endpoint_reader_rows(cfg, bench.endpoint_url(), ep, point["language"], r) if ep is not None
                     else _reader_rows(cfg, bench.loaded, point["language"], r))
    elif point["part"] == "proxy":
        base = bench.base(point["proxy"])
        for r in range(cfg.warmup):
            stream_request(base, PROMPTS["en"], 2, ep=ep)
        t0 = time.perf_counter()
        for r in range(cfg.repeats):
            row = stream_request(base, PROMPTS["en"], cfg.max_new_tokens, stall_s=cfg.stall_s, ep=ep)
            if ep is not None:
                row.update(_endpoint_fields(row, ep))
            rows.append({**_for_table(row), "granularity": "http chunks", "repeat": r, "request_id": r,
                         "nginx_buffer_kb": None if point["proxy"] in ("direct", "buffering_default") else cfg.nginx_buffer_kb,
                         "nginx_upstream_http": None if point["proxy"] == "direct" else cfg.nginx_upstream_http})
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
            extra = {**_endpoint_fields(row, ep), "keepalive_note": ENDPOINT_KEEPALIVE_NOTE} if ep is not None else {}
            rows.append({**_for_table(row), **extra, "repeat": r, "request_id": r,
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

    ``loaded``: from :func:`load_for` (with an endpoint the weights are not needed)."""
    from workbench.run import results

    check_targets(cfg)
    binary, reason = nginx_status()
    results.save_text(run_dir, f"{EXPERIMENT}_nginx.txt", f"nginx: {binary}\n" if binary else f"skipped: {reason}\n")
    bench = _Bench(cfg, loaded)
    state = {"bench": bench}
    try:
        return sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(nginx_ok=binary is not None),
                                lambda p: measure_point(loaded, cfg, p, state), resume=resume, info=loaded.info,
                                config=cfg)
    finally:
        bench.close()


def check_targets(cfg: Config) -> dict | None:
    """One-line errors for the external endpoint before any point runs
    (:func:`workbench.serving.endpoint.check_endpoint`); None without one."""
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


def headline(requests: pd.DataFrame) -> str:
    """The closing note: client TTFT through nginx with buffering on vs off vs the header (and direct)."""
    t = proxy_table(requests)
    if t.empty:
        return "streaming_reader: no proxy measurements."
    by = t.set_index("proxy")
    def path_share(m):
        v = by.loc[m, "transport_ttft_s_p50"]
        return f"of which path {v:.3f} s" if v == v else "path share unknown: no engine TTFT reported"

    parts = [f"{m}: TTFT {by.loc[m, 'ttft_s_p50']:.3f} s, {path_share(m)} "
             f"(e2e {by.loc[m, 'e2e_s_p50']:.3f} s, TTFT/e2e {by.loc[m, 'ttft_share_of_e2e']:.0%})" for m in by.index]
    note = "Client TTFT p50 by path (path = client TTFT minus the engine's): " + "; ".join(parts) + "."
    held = [m for m in by.index if by.loc[m, "first_after_last_share"] >= 0.5]
    early = [m for m in by.index if by.loc[m, "first_after_last_share"] < 0.5]
    if held:
        note += (f" First chunk only after the last token (buffering turned TTFT into e2e): {', '.join(held)};"
                 f" before it: {', '.join(early) or 'none'}.")
    if "buffering_default" in by.index:
        note += (f" With nginx's default one-page buffers the first content arrived with "
                 f"{by.loc['buffering_default', 'first_read_bytes_p50']:.0f} response bytes "
                 f"({by.loc['buffering_default', 'first_read_chunks_p50']:.0f} chunks in that read).")
    if not any(m in by.index for m in NGINX_MODES):
        note += f" nginx part skipped: {nginx_status()[1] or 'not measured'}."
    return note + (" (workbench sweep 10_streaming_reader; nginx proxy_http_version 1.0 unless nginx_upstream_http "
                   "says otherwise; nginx_buffer_kb KiB buffers in buffering_on / off / header)")


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
def figures(points: pd.DataFrame, requests: pd.DataFrame) -> dict[str, go.Figure]:
    """The experiment's figures from its points and request rows."""
    ok = set(ok_points(points)["point_id"]) if not points.empty else set()
    req = requests[requests["point_id"].isin(ok)] if "point_id" in requests else requests
    return {"reader_proxy_ttft": proxy_ttft_figure(req), "reader_chunk_arrival": chunk_arrival_figure(req),
            "reader_metrics": reader_figure(req), "reader_keepalive": keepalive_figure(req)}


def finding(requests: pd.DataFrame) -> evidence.Finding:
    """The report's finding: :func:`headline` with its evidence.

    The claim it carries is nginx buffering's cost to TTFT: client TTFT with buffering on over buffering off
    (Welch interval on log TTFT over the proxy requests, :func:`workbench.stats.evidence.ratio_interval`); supported
    when that interval excludes 1. Without both nginx modes (nginx absent) the claim is not supported.

    Returns:
        :class:`workbench.stats.evidence.Finding` (no point ids: the proxy part's requests are its evidence).
    """
    text = headline(requests)
    req = requests[requests["part"] == "proxy"] if "part" in requests else requests.iloc[0:0]
    n = req.groupby("proxy").size().to_dict() if len(req) else {}
    counts = ", ".join(f"{m} {k}" for m, k in n.items()) or "none"
    on, off = (req.loc[req["proxy"] == m, "ttft_s"] for m in ("buffering_on", "buffering_off"))
    if len(on) and len(off):
        iv = evidence.ratio_interval(on, off, unit="requests")
        ratio = evidence.describe_ratio(iv, "client TTFT, buffering on / off")
        supported = evidence.ratio_verdict(iv) in ("higher", "lower")
    else:
        ratio, supported = "buffering on / off not both measured (nginx absent): not supported", False
    return evidence.Finding(text, f"proxy requests per path: {counts}; {ratio}", supported)
