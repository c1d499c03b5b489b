"""A small OpenAI-compatible streaming server over the workbench model.

Server (:func:`create_app`, FastAPI; :class:`ServerThread` / :func:`serve` run it
with uvicorn, bound to 127.0.0.1 unless another host is named):

- ``POST /v1/chat/completions`` in the OpenAI chat-completions format, so the
  official ``openai`` client and the field's benchmark clients (vLLM
  ``benchmark_serving``, GenAI-Perf, llmperf) talk to it unchanged.
  ``stream: true`` answers with Server-Sent Events, one ``data: {chunk}``
  per display piece, ending with ``data: [DONE]``; ``stream: false`` answers
  with one JSON body. ``max_tokens`` (or ``max_completion_tokens``),
  ``temperature`` (0 = greedy), ``top_p`` and ``seed`` are honoured, plus the
  vLLM extensions ``ignore_eos`` and ``min_tokens``; ``usage`` carries prompt
  and completion token counts (in the body, or in a final chunk when
  ``stream_options.include_usage`` is set). Responses carry
  ``Cache-Control: no-cache``.
- **Concurrency: one engine behind every route** (:mod:`workbench.serving.engines`; ``engine``: ``fifo``
  by default, requests queued and served one at a time, so its queueing time is part of its TTFT;
  ``static`` / ``continuous`` batch them). Chat requests (:mod:`workbench.serving.chat`) and background
  jobs (:mod:`workbench.serving.jobs`) share its queue.
- **Engine-side figures per request**: ``engine_ttft_s`` (request arrival at the
  handler to the first generated token, queueing included), ``engine_first_text_s``
  (arrival to the first text handed to the response), ``queue_s``,
  ``prefill_s``, ``e2e_s``, ``tpot_s``, ``output_tokens``, ``steps``,
  ``batch_size`` (requests sharing the forward pass: 1 for ``fifo``), and the engine's ``ttft_s``,
  ``itl_s``, ``decode_tps``, ``engine``, ``prefill_note``. They are
  sent in the response headers ``X-Engine-TTFT-S`` / ``X-Engine-Queue-S`` (a
  streaming response starts once the first token exists, so its headers can
  carry its TTFT) and in an ``engine`` field of the body or of the final
  chunk (the one with ``finish_reason``).
- **A client that disconnects stops its generation**, streaming or not, before or after the first byte:
  until its response starts a task awaits the connection's ``http.disconnect``
  (:class:`workbench.serving.chat.DisconnectWatch`), after it the stream's cleanup does; either stops
  the engine request (:meth:`workbench.serving.engines.EngineRequest.stop`, reason ``cancelled``), which the
  engine checks after every decode step; a request stopped while queued never starts.
- Malformed or deeply nested JSON, schema violations, out-of-range seeds,
  unsupported OpenAI options (``n`` > 1, ``logprobs``, ``tools``, penalties, ...;
  :data:`workbench.serving.http.UNSUPPORTED`), prompts over the context and bodies over ``max_body_bytes``
  get a 4xx JSON error naming the field, in the OpenAI shape
  ``{"error": {"message", "type", "param", "code"}}``; an unexpected failure is a
  JSON 500, never a plain-text one.
- ``stop`` (a string or up to 4) is honoured: generation ends once the text
  contains one, the reply stops before it (text that might start a stop string
  is held back until it cannot), ``finish_reason`` is ``stop``.
- **Bounded**: at most ``max_queue`` requests wait behind the one being served
  (more get 429 with ``Retry-After``: the engine queue's backlog estimate in seconds, rounded up,
  :mod:`workbench.serving.scheduling`); ``max_tokens`` is capped at
  ``max_tokens_limit``; a request not finished within ``request_timeout_s`` is
  stopped (504 before its response started, ``finish_reason`` ``timeout`` after).
  Prompts are templated and tokenised in a worker thread, off the event loop.
- **Scheduling** (``--policy``, :mod:`workbench.serving.scheduling`): the engine's queue serves ``fcfs``,
  ``priority`` (the request's integer ``priority`` field, lower first, in [-1000, 1000]; another value is a
  400 naming ``priority``), ``sjf`` (aging bound ``--aging-s``; ``--sjf-predictor``: the plain proxy or a fit on
  the engine's own history) or ``lanes`` (``--lane-threshold``,
  ``--long-cap``); the ``continuous`` engine admits in the library's FIFO order only. A streaming request with
  ``stream_options.queue_events: true`` starts its response at once and, while it waits, receives
  ``{"object": "queue.status", "queue_position", "eta_s", "admitted"}`` events, the last one ``admitted: true``.
- **Not for other sites**: a POST needs ``Content-Type: application/json``
  (415 otherwise); a loopback-bound server answers only requests whose ``Host``
  is a loopback name (421 otherwise: DNS rebinding); binding a non-loopback
  address needs an API key, which every ``/v1`` request then sends as
  ``Authorization: Bearer KEY`` (401 otherwise).
- SSE ``data:`` lines escape U+2028, U+2029 and U+0085 (``\\u2028`` ...), so a
  client splitting lines with ``str.splitlines`` still gets whole JSON lines.
- **Bounded connections** (issue 23, :class:`ServerLimits`): at most ``limit_concurrency`` open connections
  and running requests (uvicorn's ``limit_concurrency``: past it uvicorn answers **503** ``Service
  Unavailable`` at once, before the app runs; a client retries later), idle keep-alive connections closed
  after ``timeout_keep_alive_s``, request heads larger than ``max_header_bytes`` refused by h11 (400), and
  request bodies not received within ``body_read_timeout_s`` answered 408
  (:func:`workbench.serving.http.read_json_object`), and a connection that sends no whole request head
  within ``header_read_timeout_s`` closed (:func:`head_timeout_protocol`: uvicorn itself times nothing
  while a head arrives).
- **The model field** names the served model or one of ``model_aliases`` (404 ``NotFoundError`` otherwise,
  400 past :data:`workbench.serving.http.MAX_MODEL_NAME` characters).

- **A dead engine is not healthy** (issue 36): ``GET /health`` answers 503 ``{"status": "unhealthy", "reason"}``
  when the engine's thread has stopped or it is stuck (requests running, no token for
  :data:`workbench.serving.engines.STALL_S`); a request reaching a dead engine gets 503; :func:`serve` stops and
  exits with status 1 once the engine is dead (:class:`EngineWatch`). A failing callback fails its own request only
  (:meth:`workbench.serving.engines.EngineRequest.finish`).

This module assembles the app (:func:`create_app`: the engine, the routes of
:mod:`~workbench.serving.chat`, :mod:`~workbench.serving.events`, :mod:`~workbench.serving.job_routes` and
:mod:`~workbench.serving.monitoring`, the guard and the JSON error handlers of
:mod:`~workbench.serving.http`) and runs it. The client side (the ``openai`` client, per-request
timing) is :mod:`workbench.load.client`. Run from the command line with
``python -m workbench.serving.server [--model M] [--host H] [--port P]``
(:func:`main`; ``--api-key``, ``--max-queue``, ``--max-tokens-limit``,
``--request-timeout``, ``--engine``, ``--prefix-sharing``, ``--served-model-name``, ``--model-alias``,
``--jobs`` / ``--jobs-db``, ``--limit-concurrency``, ``--timeout-keep-alive``, ``--max-header-bytes``,
``--body-read-timeout``, ``--shutdown-timeout``). A missing model or an unavailable device is a one-line
error (exit 2) before anything loads.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

from workbench.checks import check_float, check_int
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings
from workbench.serving import chat, engine_kinds, engines, events, http, monitoring, options
from workbench.serving.options import SHUTDOWN_TIMEOUT_S, EngineOptions, PolicyOptions, ServerOptions
from workbench.serving.protocol import API_KEY_ENV, DEFAULT_HOST, DEFAULT_PORT

_shutdown_lock = threading.Lock()


def shutdown_app(app, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Stop an app's work within about ``timeout_s`` seconds; once (later calls return at once).

    Closes the resumable streams, stops every running job (``interrupted``, with what it stored) and closes the job
    store (its lock released), stops every engine request still in flight (reason ``shutdown``), then the engine.
    Run by the app's lifespan and again by :func:`serve` after uvicorn returns, so a second Ctrl+C (uvicorn's force
    exit skips the lifespan's shutdown) still closes the store and stops the engine."""
    with _shutdown_lock:
        if getattr(app.state, "shut_down", False):
            return
        app.state.shut_down = True
    end = time.monotonic() + timeout_s
    try:
        app.state.streams.close()
    finally:
        try:
            if getattr(app.state, "jobs", None) is not None:
                app.state.jobs.close(timeout=max(0.5, timeout_s / 2))
        finally:
            app.state.engine.interrupt("shutdown")
            app.state.engine.stop(timeout=max(0.5, end - time.monotonic()))


@dataclasses.dataclass
class ServerLimits:
    """uvicorn's connection limits (see the module docstring).

    Attributes:
        limit_concurrency: open connections / running requests at most; past it uvicorn answers 503.
        timeout_keep_alive_s: an idle keep-alive connection is closed after this many seconds.
        max_header_bytes: the largest request head h11 accepts (``h11_max_incomplete_event_size``).
        header_read_timeout_s: a connection that has not sent a whole request head this long after it opened
            (or after its last response) is closed (:func:`head_timeout_protocol`).

    Raises:
        ParameterError: a value out of range (one line).
    """

    limit_concurrency: int = 256
    timeout_keep_alive_s: float = 5.0
    max_header_bytes: int = 16 * 1024
    header_read_timeout_s: float = 10.0

    def __post_init__(self):
        check_int("limit_concurrency", self.limit_concurrency, lo=1)
        check_float("timeout_keep_alive_s", self.timeout_keep_alive_s, lo=0, lo_open=True)
        check_int("max_header_bytes", self.max_header_bytes, lo=1024)
        check_float("header_read_timeout_s", self.header_read_timeout_s, lo=0, lo_open=True)

    def uvicorn_kwargs(self) -> dict:
        """The ``uvicorn.Config`` keywords (uvicorn's h11 protocol with a head timeout, so the head limits apply)."""
        return {"http": head_timeout_protocol(self.header_read_timeout_s), "limit_concurrency": self.limit_concurrency,
                "timeout_keep_alive": self.timeout_keep_alive_s,
                "h11_max_incomplete_event_size": self.max_header_bytes}


def head_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol class, closing a connection that sends no whole request head within
    ``timeout_s`` seconds of opening or of its last response (uvicorn itself times nothing while a head
    arrives, so a client sending a head byte by byte would hold its connection forever). A request in
    progress (head received) is never closed by it; its body has :data:`workbench.serving.http.BODY_READ_TIMEOUT_S`."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._waiting_since = self.loop.time()
            self._head_timer = self.loop.call_later(timeout_s, self._check_head)

        def _check_head(self) -> None:
            if self.transport.is_closing():
                return
            waiting = self.cycle is None or self.cycle.response_complete
            left = self._waiting_since + timeout_s - self.loop.time()
            if waiting and left <= 0:
                self.transport.close()
                return
            self._head_timer = self.loop.call_later(left if waiting else timeout_s, self._check_head)

        def on_response_complete(self) -> None:
            self._waiting_since = self.loop.time()
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._head_timer.cancel()
            super().connection_lost(exc)

    return HeadTimeoutH11Protocol


def make_server_engine(loaded, engine: EngineOptions, policy: PolicyOptions | None = None) -> engines.BaseEngine:
    """The engine behind an app: :func:`workbench.serving.engine_kinds.make_engine`, with the ``continuous`` manager sized
    for the model's context (``engine.max_seq_tokens`` when given: requests up to it, per-request sampling) and its
    KV pool to the context and the memory (``engine.kv_cache_tokens`` when given, else
    :func:`workbench.serving.engine_kinds.kv_cache_tokens_for`)."""
    ctx = int(engine.max_seq_tokens or getattr(getattr(loaded, "info", None), "max_context_tokens", 0) or 2048)
    if engine.max_seq_tokens is None:
        engine = dataclasses.replace(engine, max_seq_tokens=ctx)
    if engine.engine == "continuous" and engine.kv_cache_tokens is None:  # sized to the context and the memory
        engine = dataclasses.replace(engine, kv_cache_tokens=engine_kinds.kv_cache_tokens_for(loaded, engine.max_batch_size,
                                                                                         ctx))
    return engine_kinds.make_engine(engine, loaded, policy, GenerationSettings(max_new_tokens=ctx))


def create_app(loaded, engine: EngineOptions | None = None, policy: PolicyOptions | None = None,
               server: ServerOptions | None = None, host: str = DEFAULT_HOST, api_key: str | None = None,
               jobs: dict | None = None, server_id: str | None = None):
    """Build the FastAPI app around one engine.

    Streams, jobs, metrics (issue 14): the SSE events of a client that asks to resume or reads SSE as such carry
    an ``id:`` (:func:`workbench.serving.events.wants_event_ids`; plain ``data:`` events otherwise, as line-based
    clients parse them) and ``GET /v1/streams/{id}`` with ``Last-Event-ID`` replays the missed ones (:mod:`workbench.serving.events`; ``stream_options.resumable``
    keeps a stream generating ``server.resume_timeout_s`` after its reader left; finished streams stay replayable
    ``server.stream_retention_s``); ``server.keepalive_s`` starts streaming responses at once and sends
    ``: keep-alive`` comments while idle. ``jobs``: keyword arguments of :class:`workbench.serving.jobs.JobStore`
    (``path``, ``max_jobs``, ``retention_s``, ``max_bytes``, ...) enabling ``/v1/jobs``. ``GET /metrics`` is the
    Prometheus exposition (:mod:`workbench.serving.monitoring`).

    Every final chunk carries its ``queue_s``, ``ttft_s``, ``itl_s``, ``tpot_s``, ``e2e_s`` and ``batch_size``.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        engine: :class:`~workbench.serving.options.EngineOptions` (default: fifo).
        policy: :class:`~workbench.serving.options.PolicyOptions` of the engine's queue (default: fcfs).
        server: :class:`~workbench.serving.options.ServerOptions` (caps, timeouts, served names).
        host: the address the server binds: a loopback one makes the app accept only loopback
            ``Host`` headers; any other needs ``api_key``.
        api_key: when given, ``/v1`` requests need ``Authorization: Bearer <api_key>``.
        server_id: names this server's default job store (its ``host:port``; default: this process).

    Returns:
        The app; ``app.state.engine`` is its engine (stopped on shutdown), ``app.state.chat`` its
        :class:`~workbench.serving.chat.ChatConfig`, ``app.state.streams``, ``app.state.monitor`` and
        (with ``jobs``) ``app.state.jobs``.

    Raises:
        ParameterError: a non-loopback ``host`` without ``api_key``, a policy the engine cannot apply, a bad
            served name; :class:`workbench.serving.job_store.StoreLockedError`: another server owns the job store.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    engine, policy, server = engine or EngineOptions(), policy or PolicyOptions(), server or ServerOptions()
    aliases = server.model_aliases
    for a in (server.model_name, *aliases):
        if not isinstance(a, str) or not a or len(a) > http.MAX_MODEL_NAME:
            raise ParameterError(f"model_aliases: names of 1 to {http.MAX_MODEL_NAME} characters (got {a!r:.80})")
    http.check_bind(host, api_key)
    options.check_compatible(engine, policy)
    context = int(getattr(loaded.info, "max_context_tokens", 0) or 8192)
    streams = events.StreamRegistry(server.resume_timeout_s, server.stream_retention_s, keepalive_s=server.keepalive_s)
    eng = make_server_engine(loaded, engine, policy)

    @asynccontextmanager
    async def lifespan(app):
        yield
        import asyncio

        await asyncio.to_thread(shutdown_app, app, getattr(app.state, "shutdown_timeout_s", SHUTDOWN_TIMEOUT_S))

    app = FastAPI(title="workbench OpenAI-compatible server", lifespan=lifespan)
    app.state.loaded, app.state.engine, app.state.streams = loaded, eng, streams
    app.state.max_body_bytes = server.max_body_bytes  # every route's JSON body cap
    app.state.body_read_timeout_s = server.body_read_timeout_s
    app.state.options = {"engine": engine, "policy": policy, "server": server}
    app.state.shutdown_timeout_s = server.shutdown_timeout_s
    app.state.chat = chat.ChatConfig(model_name=server.model_name, model_aliases=aliases, context=context,
                                     max_tokens_limit=server.max_tokens_limit or context,
                                     max_queue=server.max_queue,
                                     request_timeout_s=server.request_timeout_s, early_headers=server.early_headers,
                                     keepalive_s=server.keepalive_s)
    http.install_error_handlers(app)
    app.add_middleware(http.Guard, allowed_hosts=http.Guard.allowed_hosts_for(host), api_key=api_key or None)
    chat.install(app)
    events.install(app)
    monitoring.install(app, eng)
    if jobs is not None:
        from workbench.serving import job_routes

        try:
            # jobs count against the chat route's admission limit (max_queue waiting + the one being served)
            job_routes.install(app, eng, context=context, max_tokens_limit=server.max_tokens_limit or context,
                               **{"server_id": server_id, "max_pending": server.max_queue + 1, **jobs})
        except BaseException:
            eng.stop()
            raise
    return app


# --------------------------------------------------------------------------- running it


def _app_options(kwargs: dict) -> dict:
    """:func:`create_app`'s keywords from flat ones (``options.split``) or from option objects given whole."""
    given = {k: kwargs.pop(k) for k in ("engine", "policy", "server") if not isinstance(kwargs.get(k, ""), str)}
    eng, pol, srv, rest = options.split(**kwargs)
    return {"engine": given.get("engine", eng), "policy": given.get("policy", pol),
            "server": given.get("server", srv), **rest}


class ServerThread:
    """Run the app with uvicorn in a background thread (for notebooks and tests).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        host: bind address (loopback by default).
        port: 0 picks a free port.
        limits: :class:`ServerLimits` (default: its defaults).
        **app_kwargs: :func:`create_app`'s ``api_key``, ``jobs``, ``server_id``, and the fields of the three option
            objects as flat keywords (``engine="static", max_batch_size=4, policy="sjf", max_queue=0``), routed to
            them by :func:`workbench.serving.options.split`; or the objects themselves (``engine=EngineOptions(...)``).

    Use as a context manager, or call :meth:`start` / :meth:`stop`.
    ``base_url`` is ``http://host:port``; ``engine`` the app's engine
    (:class:`workbench.serving.engines.BaseEngine`).
    """

    def __init__(self, loaded, host: str = DEFAULT_HOST, port: int = 0, limits: ServerLimits | None = None,
                 **app_kwargs):
        import uvicorn

        limits = limits or ServerLimits()
        if port:
            app_kwargs.setdefault("server_id", f"{host}:{port}")
        self.app = create_app(loaded, host=host, **_app_options(app_kwargs))
        self.engine: engines.BaseEngine = self.app.state.engine
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                   lifespan="on", timeout_graceful_shutdown=2,
                                                   **limits.uvicorn_kwargs()))
        self.host = host
        self.port = port
        self._thread = threading.Thread(target=self.server.run, name="workbench-uvicorn", daemon=True)

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self._thread.start()
        end = time.perf_counter() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.perf_counter() > end:
                raise RuntimeError(f"server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        shutdown_app(self.app, getattr(self.app.state, "shutdown_timeout_s", SHUTDOWN_TIMEOUT_S))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve(model: str = "default", host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, device: str = "auto",
          dtype: str = "auto", limits: ServerLimits | None = None, engine: EngineOptions | None = None,
          policy: PolicyOptions | None = None, server: ServerOptions | None = None, api_key: str | None = None,
          jobs: dict | None = None, rung=None) -> None:
    """Load a model and serve it until interrupted (blocking).

    The model spec, device, dtype, the options (already validated objects: engine, policy, server), the bind /
    API-key rule and the job store's owner are checked before the model loads (:class:`ParameterError`, one
    line); ``limits`` (:class:`ServerLimits`) go to uvicorn. ``server.shutdown_timeout_s`` bounds a shutdown: open
    connections get that long to finish (uvicorn's ``timeout_graceful_shutdown``), then :func:`shutdown_app` as long
    again; a second Ctrl+C skips the wait, never the store's close. The process exits with status 1 once the engine
    is dead (:class:`EngineWatch`). ``rung`` (:class:`workbench.techniques.rungs.Rung`,
    optional): the speed ladder's quantization and static cache + compile applied to the served model (engine
    tuning's recommendation).
    """
    import uvicorn

    from workbench.measure.models import load_model, pick_device, pick_dtype, resolve_model_path
    from workbench.serving import job_store

    limits = limits or ServerLimits()
    engine, policy, server = engine or EngineOptions(), policy or PolicyOptions(), server or ServerOptions()
    check_int("port", port, lo=0, hi=65535)
    http.check_bind(host, api_key)
    http.check_port_free(host, port)
    options.check_compatible(engine, policy)
    if rung is not None:
        from workbench.techniques import rungs

        rungs.check_device(rung.quantization, pick_device(device))
        options.check_compile(engine, rung.compile)
    server_id = f"{host}:{port}"
    if jobs is not None:  # another server owns it: say so before the model loads
        job_store.check_store_free(jobs.get("path") or job_store.default_path(server_id))
    pick_dtype(dtype, pick_device(device))
    resolve_model_path(model)
    loaded = load_model(model, device=device, dtype=dtype)
    if rung is not None:
        from workbench.techniques import rungs

        loaded = rungs.build(loaded, rung).loaded
        rungs.set_generation_defaults(loaded, rung.cache_implementation, rung.compile)
    app = create_app(loaded, engine, policy, server, host=host, api_key=api_key, jobs=jobs, server_id=server_id)
    timeout_s = server.shutdown_timeout_s
    uv = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                                       timeout_graceful_shutdown=timeout_s, **limits.uvicorn_kwargs()))
    watch = EngineWatch(app.state.engine, uv).start()
    try:
        uv.run()
    finally:
        watch.stop()
        shutdown_app(app, timeout_s)  # done already unless a second Ctrl+C skipped the lifespan's
    if watch.reason is not None:  # the engine cannot recover: a supervisor restarts the process
        print(f"workbench serve: error: {watch.reason}; the server stopped", file=sys.stderr)
        raise SystemExit(1)
    if not uv.started:
        raise SystemExit(3)  # uvicorn's own startup failure code


class EngineWatch:
    """Watch an engine every ``interval_s`` seconds and stop the uvicorn ``server`` once the engine is dead
    (:attr:`workbench.serving.engines.BaseEngine.dead`: a worker thread stopped, nothing can serve again); its
    ``reason`` is then the engine's health reason and :func:`serve` exits with status 1. A stuck (not dead) engine
    is only reported by ``/health`` (503): it may recover, and the supervisor decides."""

    def __init__(self, engine, server, interval_s: float = 1.0):
        self.engine, self.server = engine, server
        self.interval_s = check_float("interval_s", interval_s, lo=0, lo_open=True)
        self.reason: str | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-engine-watch", daemon=True)

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            if self.engine.dead:
                self.reason = self.engine.health()[1]
                self.server.should_exit = True
                return

    def start(self) -> "EngineWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()


def main(argv=None, prog: str | None = None) -> None:
    """``workbench serve`` / ``python -m workbench.serving.server [--model M] [--host H] [--port P]``.

    The engine, policy and server flags are those of the option objects' fields
    (:func:`workbench.serving.options.add_arguments`): ``--engine``, ``--max-batch-size``, ``--batch-window``,
    ``--prefix-sharing``, ``--policy``, ``--aging-s``, ``--lane-threshold``, ``--long-cap``, ``--sjf-predictor``,
    ``--max-queue``, ``--request-timeout``, ``--served-model-name``, ``--model-alias``, ...

    Args:
        argv: the arguments after the command (default ``sys.argv[1:]``).
        prog: the program name shown in ``--help`` (e.g. ``workbench serve``).
    """
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default",
                   help="default (the embedded SmolLM2-135M-Instruct), a local model folder or a cached hub id "
                        "(default: %(default)s)")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (default: %(default)s, loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind; 0: a free one (default: %(default)s)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"Bearer key every /v1 request must send; required for a non-loopback --host "
                        f"(default: ${API_KEY_ENV})")
    for cls in (EngineOptions, PolicyOptions, ServerOptions):
        options.add_arguments(p.add_argument_group(cls.__name__), cls)
    p.add_argument("--jobs", action="store_true",
                   help="enable /v1/jobs with this server's own store (results/serving_jobs/<host>_<port>.sqlite3)")
    p.add_argument("--jobs-db", default=None, help="enable /v1/jobs with the store at this path (one server per store)")
    limits = ServerLimits()
    p.add_argument("--limit-concurrency", type=int, default=limits.limit_concurrency,
                   help="open connections / running requests at most; past it the server answers 503")
    p.add_argument("--timeout-keep-alive", type=float, default=limits.timeout_keep_alive_s,
                   help="seconds an idle keep-alive connection stays open")
    p.add_argument("--max-header-bytes", type=int, default=limits.max_header_bytes,
                   help="largest request head accepted (h11)")
    p.add_argument("--header-read-timeout", type=float, default=limits.header_read_timeout_s,
                   help="seconds a connection may take to send a request head (closed past it)")
    p.add_argument("--quantization", default="none",
                   help="weights: none, int8_weight_only, int4_weight_only (torchao), int8_dynamic (torch.ao reference)")
    p.add_argument("--group-size", type=int, default=64, help="int4 weights per scale group (32, 64, 128, 256)")
    p.add_argument("--lm-head", default="float", help="float (head kept in float) or quantize")
    p.add_argument("--compile", action="store_true",
                   help="static KV cache + torch.compile of the decode step (fifo / static engines)")
    a = p.parse_args(argv)
    try:
        limits = ServerLimits(a.limit_concurrency, a.timeout_keep_alive, a.max_header_bytes, a.header_read_timeout)
        jobs = {"path": a.jobs_db} if a.jobs_db else ({} if a.jobs else None)
        engine, policy, server = (options.from_args(cls, a) for cls in (EngineOptions, PolicyOptions, ServerOptions))
        from workbench.techniques.rungs import Rung

        rung = Rung(quantization=a.quantization, group_size=a.group_size, lm_head=a.lm_head,
                    cache_implementation="static" if a.compile else "dynamic", compile=a.compile)
        serve(a.model, a.host, a.port, a.device, a.dtype, limits=limits, engine=engine, policy=policy, server=server,
              api_key=a.api_key, jobs=jobs, rung=rung)
    except ParameterError as exc:  # one line, before anything loads
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
