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
- **Concurrency: requests are queued, not batched.** Requests arriving together
  wait in a FIFO queue served by one worker thread that runs one
  :func:`workbench.generation.generate_measured` call at a time, so every
  request is served correctly and its queueing time is part of its TTFT.
- **Engine-side figures per request**: ``engine_ttft_s`` (request arrival at the
  handler to the first generated token, queueing included), ``engine_first_text_s``
  (arrival to the first text handed to the response), ``queue_s``,
  ``prefill_s``, ``e2e_s``, ``tpot_s``, ``output_tokens``, ``steps``,
  ``batch_size`` (requests sharing the forward pass: 1). They are
  sent in the response headers ``X-Engine-TTFT-S`` / ``X-Engine-Queue-S`` (a
  streaming response starts once the first token exists, so its headers can
  carry its TTFT) and in an ``engine`` field of the body or of the final
  chunk (the one with ``finish_reason``).
- **A client that disconnects stops its generation**: the stream's cleanup sets
  the request's cancel flag, and a ``transformers`` ``StoppingCriteria``
  (:class:`CancelCriteria`) checked after every decode step ends ``generate``;
  a request cancelled while queued never starts.
- Malformed or deeply nested JSON, schema violations, out-of-range seeds,
  unsupported OpenAI options (``n`` > 1, ``logprobs``, ``tools``, penalties, ...;
  :data:`UNSUPPORTED`), prompts over the context and bodies over ``max_body_bytes``
  get a 4xx JSON error naming the field, in the OpenAI shape
  ``{"error": {"message", "type", "param", "code"}}``; an unexpected failure is a
  JSON 500, never a plain-text one.
- ``stop`` (a string or up to 4) is honoured: generation ends once the text
  contains one, the reply stops before it (text that might start a stop string
  is held back until it cannot), ``finish_reason`` is ``stop``.
- **Bounded**: at most ``max_queue`` requests wait behind the one being served
  (more get 429 with ``Retry-After``); ``max_tokens`` is capped at
  ``max_tokens_limit``; a request not finished within ``request_timeout_s`` is
  stopped (504 before its response started, ``finish_reason`` ``timeout`` after).
  Prompts are templated and tokenised in a worker thread, off the event loop.
- **Not for other sites**: a POST needs ``Content-Type: application/json``
  (415 otherwise); a loopback-bound server answers only requests whose ``Host``
  is a loopback name (421 otherwise: DNS rebinding); binding a non-loopback
  address needs an API key, which every ``/v1`` request then sends as
  ``Authorization: Bearer KEY`` (401 otherwise).
- SSE ``data:`` lines escape U+2028, U+2029 and U+0085 (``\\u2028`` ...), so a
  client splitting lines with ``str.splitlines`` still gets whole JSON lines.

The client side (the ``openai`` client, per-request timing) is
:mod:`workbench.serving.client`. Run from the command line with
``python -m workbench.serving.server [--model M] [--host H] [--port P]``
(:func:`main`; ``--api-key``, ``--max-queue``, ``--max-tokens-limit``,
``--request-timeout``). A missing model or an unavailable device is a one-line
error (exit 2) before anything loads.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import queue
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from ..checks import check_float, check_int
from ..detokenize import StreamTap
from ..errors import ParameterError
from ..generation import GenerationSettings, count_prompt_tokens, eos_token_ids, generate_measured

DEFAULT_HOST = "127.0.0.1"
MAX_BODY_BYTES = 1 << 20
SERVED_MODEL = "workbench-default"
MAX_QUEUE = 64               # requests waiting behind the one being served; more get 429
REQUEST_TIMEOUT_S = 600.0    # a request still running after this is stopped
MAX_JSON_DEPTH = 32          # deeper request bodies get 400
MAX_STOP = 4                 # stop strings per request (OpenAI's limit)
API_KEY_ENV = "WORKBENCH_API_KEY"
SEED_MAX = 2**63 - 1         # torch.manual_seed accepts [0, 2**63 - 1] here (workbench.checks.check_seed)

#: OpenAI / vLLM request options this server does not implement, with the values that mean "not used";
#: any other value gets 400 naming the field (never silently ignored).
UNSUPPORTED = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "best_of": (None, 1),
    "echo": (None, False), "suffix": (None,), "prediction": (None,), "audio": (None,),
    "modalities": (None, ["text"]), "response_format": (None, {"type": "text"}), "use_beam_search": (None, False),
    "repetition_penalty": (None, 1, 1.0), "top_k": (None, 0, -1), "min_p": (None, 0, 0.0),
    "stop_token_ids": (None, []), "parallel_tool_calls": (None, True, False), "include_stop_str_in_output": (None, False),
}

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address or ``localhost``."""
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8000`` -> ``::1``, ``127.0.0.1:80`` -> ``127.0.0.1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def sse_data(obj) -> str:
    """One SSE event ``data: <json>\\n\\n``; U+2028, U+2029 and U+0085 are escaped (``\\u2028`` ...).

    JSON allows them raw, but ``str.splitlines`` (and some SSE clients) split lines on them, which
    would cut a ``data:`` line in two. Inside JSON they can only occur in strings, where the escape
    decodes to the same character, so the reassembled text is unchanged.
    """
    text = json.dumps(obj, ensure_ascii=False)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
    return "data: " + text + "\n\n"


def _json_depth(obj) -> int:
    """Nesting depth of a parsed JSON value (iterative: a deep value cannot overflow the stack here)."""
    depth, stack = 0, [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            depth = max(depth, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return depth


class StopFilter:
    """Cut a text stream at the first of some stop strings, holding back text that may start one.

    :meth:`feed` returns the text safe to show now; once a stop string appears, ``hit`` is True and
    nothing after the text before it is shown. :meth:`flush` returns what was held back (the end).
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def feed(self, piece: str) -> str:
        if self.hit:
            return ""
        if not self.stops:
            return piece
        s = self.held + piece
        found = [i for i in (s.find(x) for x in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return s[:min(found)]
        keep = 0
        for x in self.stops:  # the longest tail of s that is a proper prefix of a stop string
            for k in range(min(len(x) - 1, len(s)), keep, -1):
                if s.endswith(x[:k]):
                    keep = k
                    break
        self.held = s[len(s) - keep:] if keep else ""
        return s[:len(s) - keep]

    def flush(self) -> str:
        out, self.held = ("" if self.hit else self.held), ""
        return out


def _cut_at_stop(text: str, stops: list[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    found = [i for i in (text.find(x) for x in stops if x) if i >= 0]
    return text[:min(found)] if found else text


# --------------------------------------------------------------------------- request schema

def _schema():
    """Pydantic models, built lazily so importing this module stays cheap."""
    from pydantic import BaseModel, ConfigDict, Field

    class TextPart(BaseModel):
        type: Literal["text"]
        text: str

    class Message(BaseModel):
        model_config = ConfigDict(extra="ignore")
        role: Literal["system", "user", "assistant"]
        content: str | list[TextPart]

        def text(self) -> str:
            return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    class StreamOptions(BaseModel):
        include_usage: bool = False
        resumable: bool = False  # keep generating after a disconnect (workbench.serving.events)

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        messages: list[Message] = Field(min_length=1)
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1)
        max_completion_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0, le=2)
        top_p: float | None = Field(default=None, gt=0, le=1)
        seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
        n: int | None = Field(default=None, ge=1)
        stop: str | list[str] | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        ignore_eos: bool = False
        min_tokens: int = Field(default=0, ge=0)

    return ChatRequest


# --------------------------------------------------------------------------- engine


class CancelCriteria:
    """``transformers`` stopping criterion: stop every row once ``event`` is set.

    ``generate`` calls it after each decode step with ``input_ids`` of shape
    ``(batch, seq)``; it returns a bool tensor of shape ``(batch,)``.
    """

    def __init__(self, event: threading.Event, also=None):
        self.event = event
        self.also = also  # optional zero-argument callable: True also stops (stop string seen, deadline passed)

    def __call__(self, input_ids, scores=None, **kwargs):
        import torch

        stop = self.event.is_set() or bool(self.also and self.also())
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def _stopping(event, also=None):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Cancel(CancelCriteria, StoppingCriteria):
        pass

    return StoppingCriteriaList([_Cancel(event, also)])


@dataclass
class Job:
    """One queued request. ``events`` receives ``("text", str)``, ``("done", info)`` or ``("error", msg)``."""

    id: str
    messages: list
    settings: GenerationSettings
    loop: Any
    events: Any
    t_arrival: float
    cancel: threading.Event = field(default_factory=threading.Event)
    steps: int = 0
    t_first: float | None = None
    stop: list = field(default_factory=list)
    deadline: float | None = None
    t_first_text: float | None = None
    timed_out: bool = False
    stop_filter: StopFilter | None = None
    stamps: list = field(default_factory=list)  # perf_counter of each generated token id (ITL for /metrics)

    def emit(self, kind, payload):
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.cancel.set()

    def text(self, piece: str) -> None:
        """Emit display text through the stop filter; the first non-empty emission stamps ``t_first_text``."""
        if self.stop_filter is None:
            self.stop_filter = StopFilter(self.stop)
        out = self.stop_filter.feed(piece)
        if out:
            if self.t_first_text is None:
                self.t_first_text = time.perf_counter()
            self.emit("text", out)

    def halted(self) -> bool:
        """A stop string was seen, or the deadline passed (then ``timed_out``): stop generating."""
        if self.stop_filter is not None and self.stop_filter.hit:
            return True
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.timed_out = True
            return True
        return False


class Engine:
    """One worker thread serving queued :class:`Job` s one at a time (FIFO, no batching).

    Attributes:
        history: info dicts of the last 256 finished jobs (``id``, ``steps``,
            ``cancelled``, ``output_tokens``, ``engine_ttft_s``, ...), newest last.
    """

    def __init__(self, loaded):
        self.loaded = loaded
        self.queue: queue.Queue = queue.Queue()
        self.history: deque = deque(maxlen=256)
        self.busy = threading.Event()
        self.pending = 0  # submitted and not finished (queued + the one running)
        self._pending_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="workbench-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job, max_pending: int | None = None) -> bool:
        """Queue ``job``; False (not queued) when ``max_pending`` jobs are already pending."""
        with self._pending_lock:
            if max_pending is not None and self.pending >= max_pending:
                return False
            self.pending += 1
        self.queue.put(job)
        return True

    def stop(self) -> None:
        self.queue.put(None)
        self._thread.join(timeout=30)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until the queue is empty and no job runs (for tests)."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            if self.queue.empty() and not self.busy.is_set():
                return True
            time.sleep(0.02)
        return False

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            self.busy.set()
            try:
                self._run(job)
            except Exception as exc:  # reported to the client as a 500
                job.emit("error", f"{type(exc).__name__}: {exc}")
                self.history.append({"id": job.id, "error": str(exc), "steps": job.steps, "cancelled": job.cancel.is_set()})
            finally:
                with self._pending_lock:
                    self.pending -= 1
                self.busy.clear()

    def _run(self, job: Job) -> None:
        t_start = time.perf_counter()
        if job.cancel.is_set() or job.halted():  # the client left, or the deadline passed, while queued
            reason = "timeout" if job.timed_out else "cancelled"
            info = {"id": job.id, "steps": 0, "cancelled": True, "finish_reason": reason, "output_tokens": 0,
                    "queue_s": t_start - job.t_arrival}
            self.history.append(info)
            job.emit("done", info)
            return
        tok = self.loaded.tokenizer
        tap = StreamTap(tok, 1, ["token"], eos_token_ids(self.loaded),
                        on_update=lambda row, lab, text, t: job.text(text))

        def on_step(ids, t):
            job.steps += 1
            job.stamps.append(t)
            if job.t_first is None:
                job.t_first = t
            tap(ids, t)

        batch = generate_measured(self.loaded, [job.messages], job.settings, on_step=on_step,
                                  stopping_criteria=_stopping(job.cancel, job.halted))
        tap.close()
        rest = job.stop_filter.flush() if job.stop_filter is not None else ""
        if rest:
            job.text(rest)  # held back in case it began a stop string; it did not
        rec = batch.records[0]
        cancelled = job.cancel.is_set()
        stopped = job.stop_filter is not None and job.stop_filter.hit
        finish = "cancelled" if cancelled else "stop" if stopped else "timeout" if job.timed_out else rec["finish_reason"]
        info = {
            "id": job.id,
            "steps": job.steps,
            "cancelled": cancelled,
            "finish_reason": finish,
            "prompt_tokens": rec["prompt_tokens"],
            "output_tokens": rec["output_tokens"],
            "engine_ttft_s": (job.t_first - job.t_arrival) if job.t_first else float("nan"),
            "engine_first_text_s": (job.t_first_text - job.t_arrival) if job.t_first_text else float("nan"),
            "batch_size": 1,  # served alone: one request per forward pass
            "queue_s": t_start - job.t_arrival,
            "prefill_s": rec["prefill_s"],
            "e2e_s": (batch.t_submit + rec["e2e_s"]) - job.t_arrival,
            "tpot_s": rec["tpot_s"],
            "text": rec["text"] if not stopped else _cut_at_stop(rec["text"], job.stop),
            "output_ids": rec["output_ids"],
        }
        self.history.append(info)
        job.emit("done", info)


# --------------------------------------------------------------------------- app


class _ClientGone(Exception):
    """The client disconnected before its response started."""


class _TimedOut(Exception):
    """The request's deadline passed before its response started."""


def _error(status: int, message: str, param: str | None = None, etype: str = "invalid_request_error",
           headers: dict | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": etype, "param": param, "code": None}},
        status_code=status, headers={"Cache-Control": "no-cache", **(headers or {})},
    )


def _public(info: dict) -> dict:
    keys = ("engine_ttft_s", "engine_first_text_s", "queue_s", "prefill_s", "e2e_s", "tpot_s", "output_tokens",
            "steps", "batch_size", "ttft_s", "itl_s", "decode_tps", "engine", "prefill_note")
    out = {}
    for k in keys:
        v = info.get(k)
        out[k] = None if isinstance(v, float) and v != v else v  # NaN is not JSON
    return out


class _Guard:
    """ASGI middleware refusing other sites' requests before any route runs.

    Loopback binds (``allowed_hosts`` set): a ``Host`` header naming anything but a loopback name
    gets 421 (a DNS-rebinding page reaching 127.0.0.1 sends its own host name). With ``api_key``:
    every path except ``/health`` needs ``Authorization: Bearer <key>`` (401 otherwise).
    Pure ASGI (not ``BaseHTTPMiddleware``), so streaming and disconnect detection are untouched.
    """

    def __init__(self, app, allowed_hosts: set | None = None, api_key: str | None = None):
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.api_key = api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if self.allowed_hosts is not None and _host_name(headers.get("host", "")) not in self.allowed_hosts:
                resp = _error(421, f"Host: {headers.get('host', '')!r} is not this loopback server's address "
                                   "(requests from other sites are refused)", param="Host", etype="misdirected_request")
                return await resp(scope, receive, send)
            if self.api_key is not None and scope.get("path") != "/health":
                given = headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                    resp = _error(401, "Authorization: this server needs 'Authorization: Bearer <API key>'",
                                  param="Authorization", etype="authentication_error")
                    return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(loaded, model_name: str = SERVED_MODEL, max_body_bytes: int = MAX_BODY_BYTES,
               max_tokens_limit: int | None = None, max_queue: int = MAX_QUEUE,
               request_timeout_s: float = REQUEST_TIMEOUT_S, host: str = DEFAULT_HOST, api_key: str | None = None,
               engine: str | None = None, max_batch_size: int = 8, batch_window_s: float = 0.05,
               early_headers: bool = False, keepalive_s: float | None = None,
               resume_timeout_s: float = 60.0, stream_retention_s: float = 300.0, jobs: dict | None = None):
    """Build the FastAPI app around one :class:`Engine`.

    Streams, jobs, metrics (issue 14): every SSE event carries an ``id:`` and ``GET /v1/streams/{id}`` with
    ``Last-Event-ID`` replays the missed ones (:mod:`workbench.serving.events`; ``stream_options.resumable``
    keeps a stream generating ``resume_timeout_s`` after its reader left; finished streams stay replayable
    ``stream_retention_s``); ``keepalive_s`` starts streaming responses at once and sends ``: keep-alive``
    comments while idle. ``jobs``: keyword arguments of :class:`workbench.serving.jobs.JobStore` (``path``,
    ``max_jobs``, ``retention_s``, ``max_bytes``, ...) enabling ``/v1/jobs``. ``GET /metrics`` is the
    Prometheus exposition (:mod:`workbench.serving.monitoring`).

    ``engine`` (``fifo``, ``static`` or ``continuous``) puts an engine of :mod:`workbench.serving.engines`
    behind the app instead (:class:`~workbench.serving.engines.ServerEngine`; ``max_batch_size`` and
    ``batch_window_s`` are its limits), whose final chunk carries ``queue_s``, ``ttft_s``, ``itl_s``,
    ``tpot_s``, ``e2e_s`` and ``batch_size``. ``early_headers``: a streaming response starts (headers out)
    as soon as the request is accepted, without the engine TTFT header, so a client with a first-byte
    timeout is not dropped while its request is queued.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        model_name: the id reported in responses and ``/v1/models``.
        max_body_bytes: larger request bodies get 413.
        max_tokens_limit: cap on ``max_tokens`` (default: the model's context).
        max_queue: requests that may wait behind the one being served; more get 429 with ``Retry-After``.
        request_timeout_s: a request still unfinished this long after arrival is stopped.
        host: the address the server binds: a loopback one makes the app accept only loopback
            ``Host`` headers; any other needs ``api_key``.
        api_key: when given, ``/v1`` requests need ``Authorization: Bearer <api_key>``.

    Returns:
        The app; ``app.state.engine`` is its :class:`Engine` (stopped on shutdown).

    Raises:
        ParameterError: a non-loopback ``host`` without ``api_key``, or a bad limit.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    check_int("max_queue", max_queue, lo=0)
    check_float("request_timeout_s", request_timeout_s, lo=0, lo_open=True)
    if max_tokens_limit is not None:
        check_int("max_tokens_limit", max_tokens_limit, lo=1)
    loopback = is_loopback(host)
    if not loopback and not api_key:
        raise ParameterError(f"host: binding the non-loopback address {host!r} needs an API key "
                             f"(--api-key KEY or {API_KEY_ENV}=KEY); clients then send 'Authorization: Bearer KEY'")
    ChatRequest = _schema()
    context = int(getattr(loaded.info, "max_context_tokens", 0) or 8192)
    cap = max_tokens_limit or context
    if engine is None:
        engine = Engine(loaded)
    else:
        from .engines import ServerEngine

        engine = ServerEngine(loaded, engine, max_batch_size, batch_window_s)

    @asynccontextmanager
    async def lifespan(app):
        yield
        app.state.streams.close()
        if getattr(app.state, "jobs", None) is not None:
            app.state.jobs.close()
        engine.stop()

    app = FastAPI(title="workbench OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine
    from . import events as _events, monitoring as _monitoring

    streams = app.state.streams = _events.StreamRegistry(resume_timeout_s, stream_retention_s, keepalive_s=keepalive_s)
    _events.install(app, streams, _error)
    app.state.monitor = _monitoring.install(app, engine)
    if jobs is not None:
        from . import jobs as _jobs

        app.state.jobs = _jobs.install(app, loaded, _error, context=context, max_tokens_limit=cap,
                                       monitor=app.state.monitor, **jobs)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return _error(exc.status_code, str(exc.detail), etype="not_found" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(Exception)
    async def server_error(request, exc):  # a JSON 500, never starlette's plain-text one
        return _error(500, f"{type(exc).__name__}: {exc}"[:500], etype="server_error")

    app.add_middleware(_Guard, allowed_hosts=(_LOOPBACK_NAMES | {host.strip("[]").lower()}) if loopback else None,
                       api_key=api_key or None)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "workbench"}]}

    async def read_body(request: Request) -> bytes | None:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return None
        chunks, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > max_body_bytes:
                return None
            chunks.append(part)
        return b"".join(chunks)

    async def next_event(job: Job, request: Request):
        """The job's next event; cancels the job if the client goes away (or its deadline passes) while we wait."""
        while True:
            left = job.deadline - time.perf_counter()
            if left <= 0:
                job.cancel.set()
                raise _TimedOut()
            try:
                return await asyncio.wait_for(job.events.get(), timeout=min(0.25, left))
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel.set()
                    raise _ClientGone()

    async def guarded_event(job: Job, request: Request):
        """``(next event, None)`` or ``(None, error response)``: 499 when the client left, 504 past the request
        timeout (the job is cancelled either way); any other exception cancels the job and propagates."""
        try:
            return await next_event(job, request), None
        except _ClientGone:
            return None, _error(499, "client closed the request")
        except _TimedOut:
            return None, timed_out()
        except BaseException:
            job.cancel.set()
            raise

    def too_busy():
        return _error(429, f"server busy: {max_queue} requests already wait; retry later",
                      etype="rate_limit_exceeded", headers={"Retry-After": "1"})

    def timed_out():
        return _error(504, f"request: not finished within the server's timeout ({request_timeout_s:g} s)",
                      etype="timeout")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        t_arrival = time.perf_counter()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return _error(415, f"Content-Type: must be application/json (got {ctype or 'none'!r})",
                          param="Content-Type", etype="unsupported_media_type")
        raw = await read_body(request)
        if raw is None:
            return _error(413, f"request body: must be at most {max_body_bytes} bytes", etype="request_too_large")
        try:
            payload = json.loads(raw)
        except RecursionError:
            return _error(400, f"request body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"request body: must be JSON ({exc})")
        if not isinstance(payload, dict):
            return _error(400, "request body: must be a JSON object")
        if _json_depth(payload) > MAX_JSON_DEPTH:
            return _error(400, f"request body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        try:
            req = ChatRequest.model_validate(payload)
        except ValidationError as exc:
            e = exc.errors()[0]
            param = ".".join(str(x) for x in e.get("loc", ()))
            return _error(400, f"{param}: {e.get('msg')}", param=param or None)
        except RecursionError:
            return _error(400, f"request body: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if req.n not in (None, 1):
            return _error(400, f"n: only 1 is supported (got {req.n})", param="n")
        for key, neutral in UNSUPPORTED.items():
            if key in payload and payload[key] not in neutral:
                return _error(400, f"{key}: not supported by this server (got {payload[key]!r:.80})", param=key)
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if len(stop) > MAX_STOP or any(not x for x in stop):
            return _error(400, f"stop: at most {MAX_STOP} non-empty strings (got {req.stop!r:.80})", param="stop")
        max_tokens = req.max_completion_tokens or req.max_tokens or min(256, cap)
        if max_tokens > cap:
            return _error(400, f"max_tokens: must be <= {cap} (got {max_tokens})", param="max_tokens")
        if engine.pending > max_queue:  # cheap early refusal; submit() below decides atomically
            return too_busy()
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:  # templating a huge prompt takes a while: a worker thread keeps every other stream flowing
            prompt_tokens = await asyncio.to_thread(count_prompt_tokens, loaded.tokenizer, messages)
        except Exception as exc:
            return _error(400, f"messages: cannot apply the chat template ({exc})", param="messages")
        if prompt_tokens + max_tokens > context:
            return _error(400, f"messages: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                               f"the context ({context})", param="messages")
        try:
            settings = GenerationSettings(
                max_new_tokens=max_tokens, ignore_eos=req.ignore_eos, min_new_tokens=min(req.min_tokens, max_tokens),
                temperature=1.0 if req.temperature is None else float(req.temperature),
                top_p=1.0 if req.top_p is None else float(req.top_p), seed=0 if req.seed is None else int(req.seed),
            )
        except ParameterError as exc:
            return _error(400, str(exc))
        cid = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        job = Job(cid, messages, settings, asyncio.get_running_loop(), asyncio.Queue(), t_arrival, stop=stop,
                  deadline=t_arrival + request_timeout_s)
        if not engine.submit(job, max_pending=max_queue + 1):  # the one being served + max_queue waiting
            return too_busy()
        name = req.model or model_name

        def usage(info):
            n_out = info.get("output_tokens", 0)
            return {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out}

        def headers(info=None):
            h = {"Cache-Control": "no-cache", "X-Request-Id": cid}
            if job.t_first is not None:
                h["X-Engine-TTFT-S"] = f"{job.t_first - t_arrival:.6f}"
            if info and info.get("queue_s") is not None:
                h["X-Engine-Queue-S"] = f"{info['queue_s']:.6f}"
            return h

        if not req.stream:
            parts = []
            while True:
                ev, failed = await guarded_event(job, request)
                if failed is not None:
                    return failed
                kind, data = ev
                if kind == "text":
                    parts.append(data)
                elif kind == "error":
                    return _error(500, data, etype="server_error")
                else:
                    info = data
                    break
            if info.get("finish_reason") == "timeout":
                return timed_out()
            body = {
                "id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                             "finish_reason": info.get("finish_reason", "stop"), "logprobs": None}],
                "usage": usage(info), "engine": _public(info),
            }
            return JSONResponse(body, headers=headers(info))

        def chunk(delta, finish=None, **extra):
            return sse_data({
                "id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra,
            })

        # Start the response once the first text (or the end) exists, so headers carry the engine TTFT.
        first, failed = (None, None) if (early_headers or keepalive_s) else await guarded_event(job, request)
        if failed is not None:
            return failed
        if first is not None and first[0] == "error":
            return _error(500, first[1], etype="server_error")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events():
            finished = False
            try:
                yield chunk({"role": "assistant", "content": ""})
                kind, data = first if first is not None else await job.events.get()
                while True:
                    if kind == "text":
                        yield chunk({"content": data})
                    elif kind == "error":
                        yield sse_data({"error": {"message": data, "type": "server_error"}})
                        break
                    else:
                        yield chunk({}, data.get("finish_reason", "stop"), engine=_public(data))
                        if include_usage:
                            yield sse_data({
                                "id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                                "choices": [], "usage": usage(data), "engine": _public(data)})
                        break
                    kind, data = await job.events.get()
                yield "data: [DONE]\n\n"
                finished = True
            finally:
                if not finished:  # client went away (or the server is shutting down): stop decoding
                    job.cancel.set()

        resumable = bool(req.stream_options and req.stream_options.resumable)  # outlive the connection
        return streams.respond(streams.start(cid, events(), job.cancel.set, resumable),
                               headers={**headers(), "X-Accel-Buffering": "no"})

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
    ``base_url`` is ``http://host:port``; ``engine`` the app's :class:`Engine`.
    """

    def __init__(self, loaded, host: str = DEFAULT_HOST, port: int = 0, **app_kwargs):
        import uvicorn

        self.app = create_app(loaded, host=host, **app_kwargs)
        self.engine: Engine = self.app.state.engine
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


def serve(model: str = "default", host: str = DEFAULT_HOST, port: int = 8000, device: str = "auto",
          dtype: str = "auto", **app_kwargs) -> None:
    """Load a model and serve it until interrupted (blocking).

    The model spec, device, dtype and the bind / API-key rule are checked before the model loads
    (:class:`ParameterError`, one line). ``app_kwargs`` go to :func:`create_app`.
    """
    import uvicorn

    from ..models import load_model, pick_device, pick_dtype, resolve_model_path

    check_int("port", port, lo=0, hi=65535)
    if not is_loopback(host) and not app_kwargs.get("api_key"):
        raise ParameterError(f"host: binding the non-loopback address {host!r} needs an API key "
                             f"(--api-key KEY or {API_KEY_ENV}=KEY); clients then send 'Authorization: Bearer KEY'")
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
    p.add_argument("--port", type=int, default=8000)
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
    p.add_argument("--engine", choices=("fifo", "static", "continuous"), default=None,
                   help="scheduler behind the app (workbench.serving.engines; default: the built-in one-at-a-time worker)")
    p.add_argument("--max-batch-size", type=int, default=8, help="batch limit of the static and continuous engines")
    p.add_argument("--batch-window", type=float, default=0.05, help="the static engine's batching window (s)")
    p.add_argument("--early-headers", action="store_true",
                   help="start streaming responses (headers) as soon as a request is accepted")
    a = p.parse_args(argv)
    try:
        extra = {} if a.engine is None else {"engine": a.engine, "max_batch_size": a.max_batch_size,
                                             "batch_window_s": a.batch_window}
        serve(a.model, a.host, a.port, a.device, a.dtype, api_key=a.api_key, max_queue=a.max_queue,
              max_tokens_limit=a.max_tokens_limit, request_timeout_s=a.request_timeout,
              early_headers=a.early_headers, **extra)
    except ParameterError as exc:  # one line, before anything loads
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
