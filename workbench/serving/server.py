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
- **A client that disconnects stops its generation**: the stream's cleanup stops
  the engine request (:meth:`workbench.serving.engines.EngineRequest.stop`), which the
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
  400 naming ``priority``), ``sjf`` (aging bound ``--aging-s``) or ``lanes`` (``--lane-threshold``,
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

This module assembles the app (:func:`create_app`: the engine, the routes of
:mod:`~workbench.serving.chat`, :mod:`~workbench.serving.events`, :mod:`~workbench.serving.jobs` and
:mod:`~workbench.serving.monitoring`, the guard and the JSON error handlers of
:mod:`~workbench.serving.http`) and runs it. The client side (the ``openai`` client, per-request
timing) is :mod:`workbench.serving.client`. Run from the command line with
``python -m workbench.serving.server [--model M] [--host H] [--port P]``
(:func:`main`; ``--api-key``, ``--max-queue``, ``--max-tokens-limit``,
``--request-timeout``). A missing model or an unavailable device is a one-line
error (exit 2) before anything loads.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from ..checks import check_float, check_int
from ..errors import ParameterError
from ..generation import GenerationSettings
from . import chat, engines, events, http, monitoring, scheduling
from .chat import MAX_QUEUE, REQUEST_TIMEOUT_S
from .http import MAX_BODY_BYTES
from .protocol import API_KEY_ENV, DEFAULT_HOST, DEFAULT_PORT, SERVED_MODEL


def make_server_engine(loaded, name: str, max_batch_size: int = 8, batch_window_s: float = 0.05,
                       context: int | None = None, policy: "str | scheduling.PolicyQueue" = "fcfs") -> engines.BaseEngine:
    """The engine behind an app: :func:`workbench.serving.engines.make_engine`, with the ``continuous``
    manager sized for the model's context (one greedy setting, requests up to the context); ``policy`` its
    waiting queue's scheduling policy (:mod:`workbench.serving.scheduling`)."""
    ctx = int(context or getattr(getattr(loaded, "info", None), "max_context_tokens", 0) or 2048)
    return engines.make_engine(name, loaded, max_batch_size, batch_window_s, GenerationSettings(max_new_tokens=ctx),
                               ctx, policy=policy)


def create_app(loaded, model_name: str = SERVED_MODEL, max_body_bytes: int = MAX_BODY_BYTES,
               max_tokens_limit: int | None = None, max_queue: int = MAX_QUEUE,
               request_timeout_s: float = REQUEST_TIMEOUT_S, host: str = DEFAULT_HOST, api_key: str | None = None,
               engine: str = "fifo", max_batch_size: int = 8, batch_window_s: float = 0.05,
               early_headers: bool = False, keepalive_s: float | None = None,
               resume_timeout_s: float = 60.0, stream_retention_s: float = 300.0, jobs: dict | None = None,
               policy: str = "fcfs", policy_options: dict | None = None):
    """Build the FastAPI app around one engine.

    Streams, jobs, metrics (issue 14): every SSE event carries an ``id:`` and ``GET /v1/streams/{id}`` with
    ``Last-Event-ID`` replays the missed ones (:mod:`workbench.serving.events`; ``stream_options.resumable``
    keeps a stream generating ``resume_timeout_s`` after its reader left; finished streams stay replayable
    ``stream_retention_s``); ``keepalive_s`` starts streaming responses at once and sends ``: keep-alive``
    comments while idle. ``jobs``: keyword arguments of :class:`workbench.serving.jobs.JobStore` (``path``,
    ``max_jobs``, ``retention_s``, ``max_bytes``, ...) enabling ``/v1/jobs``. ``GET /metrics`` is the
    Prometheus exposition (:mod:`workbench.serving.monitoring`).

    ``engine`` (``fifo``, ``static`` or ``continuous``) names the engine of :mod:`workbench.serving.engines`
    behind the app (``max_batch_size`` and ``batch_window_s`` are its limits); every final chunk carries its
    ``queue_s``, ``ttft_s``, ``itl_s``, ``tpot_s``, ``e2e_s`` and ``batch_size``. ``early_headers``: a
    streaming response starts (headers out) as soon as the request is accepted, without the engine TTFT
    header, so a client with a first-byte timeout is not dropped while its request is queued.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        model_name: the id reported in responses and ``/v1/models``.
        max_body_bytes: larger request bodies (chat and jobs) get 413.
        max_tokens_limit: cap on ``max_tokens`` (default: the model's context).
        max_queue: requests that may wait behind the one being served; more get 429 with ``Retry-After``.
        request_timeout_s: a request still unfinished this long after arrival is stopped.
        host: the address the server binds: a loopback one makes the app accept only loopback
            ``Host`` headers; any other needs ``api_key``.
        api_key: when given, ``/v1`` requests need ``Authorization: Bearer <api_key>``.
        policy: the engine's scheduling policy (:data:`workbench.serving.scheduling.POLICIES`; a request's
            ``priority`` field matters under ``priority``); ``policy_options``: keyword arguments of
            :class:`~workbench.serving.scheduling.PolicyQueue` (``aging_s``, ``lane_threshold_tokens``, ``long_cap``).

    Returns:
        The app; ``app.state.engine`` is its engine (stopped on shutdown), ``app.state.chat`` its
        :class:`~workbench.serving.chat.ChatConfig`, ``app.state.streams``, ``app.state.monitor`` and
        (with ``jobs``) ``app.state.jobs``.

    Raises:
        ParameterError: a non-loopback ``host`` without ``api_key``, an unknown engine, or a bad limit.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    check_int("max_queue", max_queue, lo=0)
    check_float("request_timeout_s", request_timeout_s, lo=0, lo_open=True)
    if max_tokens_limit is not None:
        check_int("max_tokens_limit", max_tokens_limit, lo=1)
    http.check_bind(host, api_key)
    engines.check_name(engine)
    queue = scheduling.make_queue(policy, engine, **(policy_options or {}))
    context = int(getattr(loaded.info, "max_context_tokens", 0) or 8192)
    streams = events.StreamRegistry(resume_timeout_s, stream_retention_s, keepalive_s=keepalive_s)
    eng = make_server_engine(loaded, engine, max_batch_size, batch_window_s, policy=queue)

    @asynccontextmanager
    async def lifespan(app):
        yield
        app.state.streams.close()
        if getattr(app.state, "jobs", None) is not None:
            app.state.jobs.close()
        app.state.engine.stop()

    app = FastAPI(title="workbench OpenAI-compatible server", lifespan=lifespan)
    app.state.loaded, app.state.engine, app.state.streams = loaded, eng, streams
    app.state.max_body_bytes = check_int("max_body_bytes", max_body_bytes, lo=1)  # every route's JSON body cap
    app.state.chat = chat.ChatConfig(model_name=model_name, context=context, max_tokens_limit=max_tokens_limit or context,
                                     max_queue=max_queue,
                                     request_timeout_s=request_timeout_s, early_headers=early_headers,
                                     keepalive_s=keepalive_s)
    http.install_error_handlers(app)
    app.add_middleware(http.Guard, allowed_hosts=http.Guard.allowed_hosts_for(host), api_key=api_key or None)
    chat.install(app)
    events.install(app)
    monitoring.install(app, eng)
    if jobs is not None:
        from . import jobs as jobs_mod

        jobs_mod.install(app, eng, context=context, max_tokens_limit=max_tokens_limit or context, **jobs)
    return app


# --------------------------------------------------------------------------- running it


class ServerThread:
    """Run the app with uvicorn in a background thread (for notebooks and tests).

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        host: bind address (loopback by default).
        port: 0 picks a free port.
        **app_kwargs: passed to :func:`create_app`.

    Use as a context manager, or call :meth:`start` / :meth:`stop`.
    ``base_url`` is ``http://host:port``; ``engine`` the app's engine
    (:class:`workbench.serving.engines.BaseEngine`).
    """

    def __init__(self, loaded, host: str = DEFAULT_HOST, port: int = 0, **app_kwargs):
        import uvicorn

        self.app = create_app(loaded, host=host, **app_kwargs)
        self.engine: engines.BaseEngine = self.app.state.engine
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                                   lifespan="on", timeout_graceful_shutdown=2))
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def serve(model: str = "default", host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, device: str = "auto",
          dtype: str = "auto", **app_kwargs) -> None:
    """Load a model and serve it until interrupted (blocking).

    The model spec, device, dtype and the bind / API-key rule are checked before the model loads
    (:class:`ParameterError`, one line). ``app_kwargs`` go to :func:`create_app`.
    """
    import uvicorn

    from ..models import load_model, pick_device, pick_dtype, resolve_model_path

    check_int("port", port, lo=0, hi=65535)
    http.check_bind(host, app_kwargs.get("api_key"))
    engines.check_name(app_kwargs.get("engine", "fifo"))
    scheduling.make_queue(app_kwargs.get("policy", "fcfs"), app_kwargs.get("engine", "fifo"),
                          **(app_kwargs.get("policy_options") or {}))  # bad policy options: before the model loads
    pick_dtype(dtype, pick_device(device))
    resolve_model_path(model)
    loaded = load_model(model, device=device, dtype=dtype)
    uvicorn.run(create_app(loaded, host=host, **app_kwargs), host=host, port=port, log_level="info")


def main(argv=None, prog: str | None = None) -> None:
    """``workbench serve`` / ``python -m workbench.serving.server [--model M] [--host H] [--port P]``.

    Args:
        argv: the arguments after the command (default ``sys.argv[1:]``).
        prog: the program name shown in ``--help`` (e.g. ``workbench serve``).
    """
    import argparse

    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"Bearer key every /v1 request must send; required for a non-loopback --host "
                        f"(default: ${API_KEY_ENV})")
    p.add_argument("--max-queue", type=int, default=MAX_QUEUE,
                   help="requests that may wait behind the one being served (more get 429)")
    p.add_argument("--max-tokens-limit", type=int, default=None, help="ceiling on max_tokens (default: the context)")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                   help="seconds after which an unfinished request is stopped")
    p.add_argument("--engine", choices=engines.ENGINES, default="fifo",
                   help="scheduler behind the app (workbench.serving.engines; default: fifo, one request at a time)")
    p.add_argument("--max-batch-size", type=int, default=8, help="batch limit of the static and continuous engines")
    p.add_argument("--batch-window", type=float, default=0.05, help="the static engine's batching window (s)")
    p.add_argument("--early-headers", action="store_true",
                   help="start streaming responses (headers) as soon as a request is accepted")
    p.add_argument("--policy", default="fcfs",
                   help=f"scheduling policy of the engine's queue ({', '.join(scheduling.POLICIES)}; continuous: fcfs)")
    p.add_argument("--aging-s", type=float, default=scheduling.AGING_S,
                   help="sjf / lanes: a request waiting this long is served in arrival order (the wait bound)")
    p.add_argument("--lane-threshold", type=int, default=scheduling.LANE_THRESHOLD_TOKENS,
                   help="lanes: max_tokens at or above this is a long request")
    p.add_argument("--long-cap", type=int, default=scheduling.LONG_CAP, help="lanes: long requests running at once")
    a = p.parse_args(argv)
    try:
        serve(a.model, a.host, a.port, a.device, a.dtype, api_key=a.api_key, max_queue=a.max_queue,
              max_tokens_limit=a.max_tokens_limit, request_timeout_s=a.request_timeout,
              early_headers=a.early_headers, engine=a.engine, max_batch_size=a.max_batch_size,
              batch_window_s=a.batch_window, policy=a.policy,
              policy_options={"aging_s": a.aging_s, "lane_threshold_tokens": a.lane_threshold, "long_cap": a.long_cap})
    except ParameterError as exc:  # one line, before anything loads
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
