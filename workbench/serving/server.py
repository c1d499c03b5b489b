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
  handler to the first generated token, queueing included), ``queue_s``,
  ``prefill_s``, ``e2e_s``, ``tpot_s``, ``output_tokens``, ``steps``. They are
  sent in the response headers ``X-Engine-TTFT-S`` / ``X-Engine-Queue-S`` (a
  streaming response starts once the first token exists, so its headers can
  carry its TTFT) and in an ``engine`` field of the body or of the final
  chunk (the one with ``finish_reason``).
- **A client that disconnects stops its generation**: the stream's cleanup sets
  the request's cancel flag, and a ``transformers`` ``StoppingCriteria``
  (:class:`CancelCriteria`) checked after every decode step ends ``generate``;
  a request cancelled while queued never starts.
- Malformed JSON, schema violations, unsupported options (``n`` > 1),
  prompts over the context and bodies over ``max_body_bytes`` get a 4xx JSON
  error in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``.

The client side (the ``openai`` client, per-request timing) is
:mod:`workbench.serving.client`. Run from the command line with
``python -m workbench.serving.server [--model M] [--host H] [--port P]``
(:func:`main`).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from ..detokenize import StreamTap
from ..errors import ParameterError
from ..generation import GenerationSettings, count_prompt_tokens, eos_token_ids, generate_measured

DEFAULT_HOST = "127.0.0.1"
MAX_BODY_BYTES = 1 << 20
SERVED_MODEL = "workbench-default"


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

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        messages: list[Message] = Field(min_length=1)
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1)
        max_completion_tokens: int | None = Field(default=None, ge=1)
        temperature: float | None = Field(default=None, ge=0, le=2)
        top_p: float | None = Field(default=None, gt=0, le=1)
        seed: int | None = None
        n: int | None = Field(default=None, ge=1)
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

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores=None, **kwargs):
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def _stopping(event):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Cancel(CancelCriteria, StoppingCriteria):
        pass

    return StoppingCriteriaList([_Cancel(event)])


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

    def emit(self, kind, payload):
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.cancel.set()


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
        self._thread = threading.Thread(target=self._work, name="workbench-engine", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self.queue.put(job)

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
                self.busy.clear()

    def _run(self, job: Job) -> None:
        t_start = time.perf_counter()
        if job.cancel.is_set():  # the client left while queued
            info = {"id": job.id, "steps": 0, "cancelled": True, "output_tokens": 0, "queue_s": t_start - job.t_arrival}
            self.history.append(info)
            job.emit("done", info)
            return
        tok = self.loaded.tokenizer
        tap = StreamTap(tok, 1, ["token"], eos_token_ids(self.loaded),
                        on_update=lambda row, lab, text, t: job.emit("text", text))

        def on_step(ids, t):
            job.steps += 1
            if job.t_first is None:
                job.t_first = t
            tap(ids, t)

        batch = generate_measured(self.loaded, [job.messages], job.settings, on_step=on_step,
                                  stopping_criteria=_stopping(job.cancel))
        tap.close()
        rec = batch.records[0]
        cancelled = job.cancel.is_set()
        info = {
            "id": job.id,
            "steps": job.steps,
            "cancelled": cancelled,
            "finish_reason": "cancelled" if cancelled else rec["finish_reason"],
            "prompt_tokens": rec["prompt_tokens"],
            "output_tokens": rec["output_tokens"],
            "engine_ttft_s": (job.t_first - job.t_arrival) if job.t_first else float("nan"),
            "queue_s": t_start - job.t_arrival,
            "prefill_s": rec["prefill_s"],
            "e2e_s": (batch.t_submit + rec["e2e_s"]) - job.t_arrival,
            "tpot_s": rec["tpot_s"],
            "text": rec["text"],
            "output_ids": rec["output_ids"],
        }
        self.history.append(info)
        job.emit("done", info)


# --------------------------------------------------------------------------- app


class _ClientGone(Exception):
    """The client disconnected before its response started."""


def _error(status: int, message: str, param: str | None = None, etype: str = "invalid_request_error"):
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": etype, "param": param, "code": None}},
        status_code=status, headers={"Cache-Control": "no-cache"},
    )


def _public(info: dict) -> dict:
    keys = ("engine_ttft_s", "queue_s", "prefill_s", "e2e_s", "tpot_s", "output_tokens", "steps")
    out = {}
    for k in keys:
        v = info.get(k)
        out[k] = None if isinstance(v, float) and v != v else v  # NaN is not JSON
    return out


def create_app(loaded, model_name: str = SERVED_MODEL, max_body_bytes: int = MAX_BODY_BYTES,
               max_tokens_limit: int | None = None):
    """Build the FastAPI app around one :class:`Engine`.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        model_name: the id reported in responses and ``/v1/models``.
        max_body_bytes: larger request bodies get 413.
        max_tokens_limit: cap on ``max_tokens`` (default: the model's context).

    Returns:
        The app; ``app.state.engine`` is its :class:`Engine` (stopped on shutdown).
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    ChatRequest = _schema()
    context = int(getattr(loaded.info, "max_context_tokens", 0) or 8192)
    cap = max_tokens_limit or context
    engine = Engine(loaded)

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.stop()

    app = FastAPI(title="workbench OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return _error(exc.status_code, str(exc.detail), etype="not_found" if exc.status_code == 404 else "invalid_request_error")

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
        """The job's next event; cancels the job if the client goes away while we wait."""
        while True:
            try:
                return await asyncio.wait_for(job.events.get(), timeout=0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    job.cancel.set()
                    raise _ClientGone()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        t_arrival = time.perf_counter()
        raw = await read_body(request)
        if raw is None:
            return _error(413, f"request body: must be at most {max_body_bytes} bytes", etype="request_too_large")
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"request body: must be JSON ({exc})")
        if not isinstance(payload, dict):
            return _error(400, "request body: must be a JSON object")
        try:
            req = ChatRequest.model_validate(payload)
        except ValidationError as exc:
            e = exc.errors()[0]
            param = ".".join(str(x) for x in e.get("loc", ()))
            return _error(400, f"{param}: {e.get('msg')}", param=param or None)
        if req.n not in (None, 1):
            return _error(400, f"n: only 1 is supported (got {req.n})", param="n")
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        if max_tokens > cap:
            return _error(400, f"max_tokens: must be <= {cap} (got {max_tokens})", param="max_tokens")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            prompt_tokens = count_prompt_tokens(loaded.tokenizer, messages)
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
        job = Job(cid, messages, settings, asyncio.get_running_loop(), asyncio.Queue(), t_arrival)
        engine.submit(job)
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
            try:
                while True:
                    kind, data = await next_event(job, request)
                    if kind == "text":
                        parts.append(data)
                    elif kind == "error":
                        return _error(500, data, etype="server_error")
                    else:
                        info = data
                        break
            except _ClientGone:
                return _error(499, "client closed the request")
            except BaseException:
                job.cancel.set()
                raise
            body = {
                "id": cid, "object": "chat.completion", "created": created, "model": name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(parts)},
                             "finish_reason": info.get("finish_reason", "stop"), "logprobs": None}],
                "usage": usage(info), "engine": _public(info),
            }
            return JSONResponse(body, headers=headers(info))

        def chunk(delta, finish=None, **extra):
            return "data: " + json.dumps({
                "id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra,
            }, ensure_ascii=False) + "\n\n"

        # Start the response once the first text (or the end) exists, so headers carry the engine TTFT.
        try:
            first = await next_event(job, request)
        except _ClientGone:
            return _error(499, "client closed the request")
        except BaseException:
            job.cancel.set()
            raise
        if first[0] == "error":
            return _error(500, first[1], etype="server_error")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events():
            finished = False
            try:
                yield chunk({"role": "assistant", "content": ""})
                kind, data = first
                while True:
                    if kind == "text":
                        yield chunk({"content": data})
                    elif kind == "error":
                        yield "data: " + json.dumps({"error": {"message": data, "type": "server_error"}}) + "\n\n"
                        break
                    else:
                        yield chunk({}, data.get("finish_reason", "stop"), engine=_public(data))
                        if include_usage:
                            yield "data: " + json.dumps({
                                "id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                                "choices": [], "usage": usage(data), "engine": _public(data)}) + "\n\n"
                        break
                    kind, data = await job.events.get()
                yield "data: [DONE]\n\n"
                finished = True
            finally:
                if not finished:  # client went away (or the server is shutting down): stop decoding
                    job.cancel.set()

        return StreamingResponse(events(), media_type="text/event-stream",
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

        self.app = create_app(loaded, **app_kwargs)
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
          dtype: str = "auto") -> None:
    """Load a model and serve it until interrupted (blocking)."""
    import uvicorn

    from ..models import load_model

    loaded = load_model(model, device=device, dtype=dtype)
    uvicorn.run(create_app(loaded), host=host, port=port, log_level="info")


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
    a = p.parse_args(argv)
    serve(a.model, a.host, a.port, a.device, a.dtype)


if __name__ == "__main__":
    main()
