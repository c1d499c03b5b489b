"""The OpenAI-compatible routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (a prompt continued as it
is: :func:`completions`), ``GET /v1/models``, ``GET /health``.

Route handlers live at module level and read the app's shared state from ``request.app.state`` (as
nanochat's ``scripts/chat_web.py`` does): ``engine`` (the :class:`workbench.serving.engines.BaseEngine`),
``chat`` (:class:`ChatConfig`), ``streams`` (:class:`workbench.serving.events.StreamRegistry`) and
``loaded`` (the model). :func:`install` adds them to an app; :mod:`workbench.serving.server` assembles it.

A served request is one :class:`~workbench.serving.engines.EngineRequest` whose token callback feeds a
:class:`Reply`: the display tap (:class:`workbench.measure.detokenize.StreamTap`), the stop filter
(:class:`StopFilter`) and the asyncio queue the handler reads. Its completion callback sends the final
figures. A stop string seen, the client gone or the request's deadline passed stop the engine request
(:meth:`~workbench.serving.engines.EngineRequest.stop` with ``stop`` / ``cancelled`` / ``timeout``).

**Cancellation on every path** (issue 23; as vLLM's server does, ``listen_for_disconnect``): from the moment
the request is submitted until its response starts (the whole request when not streaming), a task of its own
(:class:`DisconnectWatch`) awaits the connection's ``http.disconnect`` message and stops the engine request
the moment it comes, whether tokens are flowing or not; the engines check the stop after every decode step,
so the slot is free within one step, and the engine history records ``cancelled``. Once a stream's
response has started, the stream's reader notices the disconnect and cancels it (:mod:`workbench.serving.events`).
Either way a request that still waits in the engine's queue (a client that gave up while queued, issue 24) is
taken out of it at once (:func:`client_gone`: :meth:`~workbench.serving.engines.BaseEngine.withdraw`), so its place
(``pending``, the 429 limit) is free before the worker would have reached it.

**The model field**: a request naming a model must name the served one or an alias
(:func:`workbench.serving.http.check_model`: 404 ``NotFoundError``, 400 when too long).

The response: ``stream: true`` answers with Server-Sent Events (numbered and resumable, see
:mod:`workbench.serving.events`), one ``data: {chunk}`` per display piece, ending with ``data: [DONE]``;
``stream: false`` answers with one JSON body. With ``stream_options.queue_events`` the stream starts at once
and, while the request waits, carries ``queue.status`` events (:func:`workbench.serving.events.queue_event`:
its queue position and ETA from the engine's policy queue, at most one per ``queue_event_s``, sent when they
change), the last one ``admitted: true``. Under ``fcfs`` the position only falls; under ``priority`` / ``sjf`` /
``lanes`` a later, more urgent arrival can move ahead, and the event says so. A full engine answers 429 with a
``Retry-After`` from the queue's backlog estimate. Engine-side figures (:func:`public_figures`) go in an
``engine`` field of the body or of the final chunk, and in the headers ``X-Engine-TTFT-S`` /
``X-Engine-Queue-S``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from workbench.errors import ParameterError
from workbench.measure.detokenize import StreamTap
from workbench.measure.generation import GenerationSettings
from workbench.serving import engines, scheduling
from workbench.serving.events import DONE, queue_event, sse_data, wants_event_ids
from workbench.serving.http import (
    MAX_STOP,
    UNSUPPORTED,
    ApiError,
    chat_schema,
    check_model,
    completion_schema,
    parameter_error,
    read_json_object,
    validate,
)
from workbench.serving.options import MAX_QUEUE, REQUEST_TIMEOUT_S
from workbench.serving.protocol import SERVED_MODEL

log = logging.getLogger(__name__)


#: what a client is told when the engine fails its request (the cause, an exception's text, is logged only)
ENGINE_FAILED = "the engine failed on this request (the server's log has the cause)"

#: the engine figures a response carries (``engine`` field), NaN sent as null
PUBLIC_FIGURES = ("engine_ttft_s", "engine_first_text_s", "queue_s", "prefill_s", "e2e_s", "tpot_s", "output_tokens",
                  "steps", "batch_size", "ttft_s", "itl_s", "decode_tps", "engine", "prefill_note")


@dataclasses.dataclass
class ChatConfig:
    """The chat route's limits (``app.state.chat``); see :func:`workbench.serving.server.create_app`."""

    model_name: str = SERVED_MODEL
    model_aliases: tuple = ()
    context: int = 8192
    max_tokens_limit: int = 8192
    max_queue: int = MAX_QUEUE
    request_timeout_s: float = REQUEST_TIMEOUT_S
    early_headers: bool = False
    keepalive_s: float | None = None
    queue_event_s: float = 0.5   # stream_options.queue_events: a status event at most this often while waiting
    ChatRequest: type | None = dataclasses.field(default_factory=chat_schema, repr=False)
    CompletionRequest: type | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.CompletionRequest is None:
            self.CompletionRequest = completion_schema(self.ChatRequest)

    @property
    def model_names(self) -> tuple:
        """The names a request's ``model`` may give: the served id, then its aliases."""
        return (self.model_name, *self.model_aliases)


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


def public_figures(info: dict) -> dict:
    """The :data:`PUBLIC_FIGURES` of a reply's final ``info`` (NaN as None: NaN is not JSON)."""
    out = {}
    for k in PUBLIC_FIGURES:
        v = info.get(k)
        out[k] = None if isinstance(v, float) and v != v else v
    return out


class Reply:
    """The bridge from one engine request (its thread) to its handler (the event loop).

    ``events`` (an ``asyncio.Queue``) receives ``("text", str)`` (display text after the stop filter),
    then ``("done", info)`` or ``("error", message)``. ``t_first`` / ``t_first_text``: ``perf_counter``
    of the first token id and of the first text handed to the response.

    Args:
        loaded: the model (its tokenizer detokenises).
        eos: the engine's end-of-sequence ids.
        stop: the request's stop strings.
        loop: the handler's event loop.
    """

    def __init__(self, loaded, eos, stop: list[str], loop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.filter = StopFilter(stop)
        self.tap = StreamTap(loaded.tokenizer, 1, ["token"], eos, on_update=lambda row, lab, text, t: self.text(text))
        self.t_first: float | None = None
        self.t_first_text: float | None = None
        self.request: engines.EngineRequest | None = None

    def emit(self, kind: str, payload) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shut down): nobody is listening
            self.request.stop("cancelled")

    def text(self, piece: str) -> None:
        """Emit display text through the stop filter; a stop string seen stops the engine request."""
        out = self.filter.feed(piece)
        if out:
            if self.t_first_text is None:
                self.t_first_text = time.perf_counter()
            self.emit("text", out)
        if self.filter.hit:
            self.request.stop("stop")

    def on_token(self, tok: int, t: float) -> None:
        import numpy as np

        if self.t_first is None:
            self.t_first = t
        self.tap(np.asarray([tok]), t)

    def on_done(self, res: dict) -> None:
        try:
            self.tap.close()
            rest = self.filter.flush()
            if rest:
                self.text(rest)  # held back in case it began a stop string; it did not
        except Exception:  # noqa: BLE001 - the figures still go out
            pass
        info = {k: res[k] for k in ("id", "queue_s", "ttft_s", "itl_s", "tpot_s", "e2e_s", "decode_tps", "output_tokens",
                                     "prompt_tokens", "batch_size", "prefill_s", "prefill_note", "engine",
                                     "finish_reason", "cached_tokens")}
        t0 = self.request.t_arrival
        info.update(steps=res["output_tokens"], engine_ttft_s=res["ttft_s"],
                    engine_first_text_s=(self.t_first_text - t0) if self.t_first_text else float("nan"))
        if res.get("error") and res["finish_reason"] == "error":  # a server fault: logged with its cause
            log.error("chat request %s: the engine failed: %s", res.get("id"), res["error"])
            self.emit("error", res["error"])
        else:
            self.emit("done", info)


def client_gone(engine, req: engines.EngineRequest) -> None:
    """The client of ``req`` left: stop it with ``cancelled`` and, while it still waits in ``engine``'s queue,
    take it out and finish it now (:meth:`~workbench.serving.engines.BaseEngine.withdraw`), freeing its place."""
    engine.withdraw(req, "cancelled")


class DisconnectWatch:
    """Stop an engine request the moment its client disconnects (a task awaiting ``http.disconnect``).

    While it runs it is the connection's only reader of ASGI messages (the body is read already), so it is
    stopped (:meth:`close`) before a streaming response starts (the response listens itself). On a disconnect
    it puts ``("gone", None)`` in the reply's events, waking the handler, and withdraws the request
    (:func:`client_gone`: stopped with ``cancelled``, out of the queue at once if it still waits there).
    """

    def __init__(self, request: Request, reply: Reply):
        self.gone = False
        self._request, self._reply = request, reply
        self.task = asyncio.get_running_loop().create_task(self._watch(), name=f"disconnect-{reply.request.id}")

    async def _watch(self) -> None:
        while True:
            message = await self._request.receive()
            if message.get("type") == "http.disconnect":
                break
        self.gone = True
        self._reply.events.put_nowait(("gone", None))  # before the "done" a withdrawn request's end emits
        client_gone(self._request.app.state.engine, self._reply.request)

    def close(self) -> None:
        if not self.task.done():
            self.task.cancel()


async def queue_updates(queue, reply: Reply, cid: str, interval_s: float, got: list):
    """The SSE ``queue.status`` events of a waiting request (:func:`workbench.serving.events.queue_event`): its
    position and ETA from ``queue.status`` (:class:`workbench.serving.scheduling.PolicyQueue`) whenever they
    change, checked every ``interval_s``, then one ``admitted`` event once it leaves the queue. A reply event
    arriving meanwhile (the first text, the end, an error) also ends the wait and is appended to ``got``."""
    last = None
    while True:
        status = queue.status(reply.request)
        if status is None or got:
            yield queue_event(cid, 0, 0.0, True)
            return
        if status != last:
            yield queue_event(cid, status["queue_position"], status["eta_s"], False)
            last = status
        try:
            got.append(await asyncio.wait_for(reply.events.get(), timeout=interval_s))
        except asyncio.TimeoutError:
            pass


def _too_busy(cfg: ChatConfig, engine=None) -> ApiError:
    """429 with ``Retry-After`` from the backlog: the engine queue's estimate of the seconds until everything
    waiting now is admitted, rounded up (:func:`workbench.serving.scheduling.retry_after_s`; 1 when unknown)."""
    backlog = getattr(getattr(engine, "queue", None), "backlog_s", None)
    wait = scheduling.retry_after_s(backlog() if callable(backlog) else float("nan"))
    return ApiError(429, f"server busy: {cfg.max_queue} requests already wait; retry in {wait} s",
                    etype="rate_limit_exceeded", headers={"Retry-After": str(wait)})


def _timed_out(cfg: ChatConfig) -> ApiError:
    return ApiError(504, f"request: not finished within the server's timeout ({cfg.request_timeout_s:g} s)",
                    etype="timeout")


async def _next_event(reply: Reply, cfg: ChatConfig):
    """The reply's next event before its response started (a :class:`DisconnectWatch` runs meanwhile); stops
    the engine request and raises 499 (the client left) or 504 (past the request timeout) while it waits. Any
    other exception stops it too."""
    req = reply.request
    try:
        left = req.deadline - time.perf_counter()
        if left <= 0:
            raise asyncio.TimeoutError
        event = await asyncio.wait_for(reply.events.get(), timeout=left)
    except asyncio.TimeoutError:
        req.stop("timeout")
        raise _timed_out(cfg) from None
    except BaseException:
        req.stop("cancelled")
        raise
    if event[0] == "gone":
        raise ApiError(499, "client closed the request")
    return event


#: ``max_tokens`` of a ``/v1/completions`` request that gives none: OpenAI's legacy default (and vLLM's)
COMPLETION_MAX_TOKENS = 16


def _chat_prompt_ids(tokenizer, req) -> list[int]:
    """A chat request's prompt: the chat template over its messages."""
    return engines.prompt_ids(tokenizer, [{"role": m.role, "content": m.text()} for m in req.messages])


def _completion_prompt_ids(tokenizer, req) -> list[int]:
    """A completion request's prompt tokenized as it is (the tokenizer's special tokens added, as vLLM does), or its
    token ids.

    Raises:
        ApiError: 400: several prompts in one request, or token ids outside the vocabulary.
    """
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, f"prompt: one prompt a request (got {len(prompt)})", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    vocab = len(tokenizer)
    if not prompt or any(not 0 <= t < vocab for t in prompt):
        raise ApiError(400, f"prompt: token ids must be in [0, {vocab}) and at least one", param="prompt")
    return list(prompt)


@dataclasses.dataclass(frozen=True)
class Route:
    """What tells ``/v1/chat/completions`` and ``/v1/completions`` apart (OpenAI's two formats); the rest - limits,
    engine, streaming, cancellation, engine figures - is one code path (:func:`_complete`).

    Attributes:
        field: the prompt's field (``messages`` / ``prompt``), named by a 400 about it.
        schema: the :class:`ChatConfig` attribute holding the request model.
        prompt_ids: ``(tokenizer, request) -> token ids``.
        untokenizable: the words of a 400 for a prompt the tokenizer refuses.
        default_max_tokens: ``max_tokens`` when the request gives none (capped by the server's limit).
        id_prefix: of the response's ``id``.
        endpoint: the label of its engine figures (``/metrics``, observers).
        body_object / chunk_object: ``object`` of the JSON body / of each stream chunk.
        body_text: ``text -> choice fields`` of the JSON body.
        chunk_text: ``delta -> choice fields`` of a stream chunk.
        role_chunk: a stream opens with a chunk carrying the assistant role (chat only).
    """

    field: str
    schema: str
    prompt_ids: Callable
    untokenizable: str
    default_max_tokens: int
    id_prefix: str
    endpoint: str
    body_object: str
    chunk_object: str
    body_text: Callable[[str], dict]
    chunk_text: Callable[[dict], dict]
    role_chunk: bool


#: ``max_tokens`` of a ``/v1/chat/completions`` request that gives none
CHAT_MAX_TOKENS = 256
CHAT = Route(field="messages", schema="ChatRequest", prompt_ids=_chat_prompt_ids,
             untokenizable="cannot apply the chat template", default_max_tokens=CHAT_MAX_TOKENS, id_prefix="chatcmpl-",
             endpoint="chat", body_object="chat.completion", chunk_object="chat.completion.chunk",
             body_text=lambda text: {"message": {"role": "assistant", "content": text}},
             chunk_text=lambda delta: {"delta": delta}, role_chunk=True)
COMPLETION = Route(field="prompt", schema="CompletionRequest", prompt_ids=_completion_prompt_ids,
                   untokenizable="cannot be tokenized", default_max_tokens=COMPLETION_MAX_TOKENS, id_prefix="cmpl-",
                   endpoint="completions", body_object="text_completion", chunk_object="text_completion",
                   body_text=lambda text: {"text": text},
                   chunk_text=lambda delta: {"text": delta.get("content", "")},   # the delta's content as its text
                   role_chunk=False)


def parse_chat_request(payload: dict, cfg: ChatConfig, route: Route = CHAT):
    """The validated request, its stop strings and its ``max_tokens`` (the ``route``'s default when none is given:
    :data:`CHAT_MAX_TOKENS`, or :data:`COMPLETION_MAX_TOKENS` for ``/v1/completions``).

    Raises:
        ApiError: 400 naming the field (schema, ``n``, :data:`~workbench.serving.http.UNSUPPORTED` options,
            ``stop``, ``max_tokens`` over the limit).
    """
    req = validate(getattr(cfg, route.schema), payload)
    if req.n not in (None, 1):
        raise ApiError(400, f"n: only 1 is supported (got {req.n})", param="n")
    for key, neutral in UNSUPPORTED.items():
        if key in payload and payload[key] not in neutral:
            raise ApiError(400, f"{key}: not supported by this server (got {payload[key]!r:.80})", param=key)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP or any(not x for x in stop):
        raise ApiError(400, f"stop: at most {MAX_STOP} non-empty strings (got {req.stop!r:.80})", param="stop")
    cap = cfg.max_tokens_limit
    max_tokens = req.max_completion_tokens or req.max_tokens or min(route.default_max_tokens, cap)
    if max_tokens > cap:
        raise ApiError(400, f"max_tokens: must be <= {cap} (got {max_tokens})", param="max_tokens")
    return req, stop, max_tokens


async def chat_completions(request: Request):
    """``POST /v1/chat/completions`` (see the module docstring and :mod:`workbench.serving.server`)."""
    return await _complete(request, CHAT)


async def completions(request: Request):
    """``POST /v1/completions``: OpenAI's legacy completions format, what ``vllm bench serve`` sends by default
    (its ``vllm`` / ``openai`` backends): a ``prompt`` (a string, or token ids; one a request) continued as it is,
    no chat template; ``max_tokens`` defaults to :data:`COMPLETION_MAX_TOKENS`. The same engine, limits, streaming,
    cancellation and engine figures as the chat route; the body's choices carry ``text`` (``object``
    ``text_completion``), each stream chunk its ``choices[0].text``."""
    return await _complete(request, COMPLETION)


async def _complete(request: Request, route: Route):
    """A chat or completion request (``route``): parsed, checked, submitted to the engine and answered."""
    t_arrival = time.perf_counter()
    state = request.app.state
    cfg: ChatConfig = state.chat
    engine: engines.BaseEngine = state.engine
    field = route.field
    payload = await read_json_object(request)
    req, stop, max_tokens = parse_chat_request(payload, cfg, route)
    check_model(payload.get("model"), cfg.model_names)
    if engine.pending > cfg.max_queue:  # cheap early refusal; submit() below decides atomically
        with engine._count_lock:
            engine.rejected += 1  # every 429 counts (workbench_requests_rejected_total)
        raise _too_busy(cfg, engine)
    try:  # templating a huge prompt takes a while: a worker thread keeps every other stream flowing
        ids = await asyncio.to_thread(route.prompt_ids, state.loaded.tokenizer, req)
    except ApiError:
        raise
    except Exception as exc:
        raise ApiError(400, f"{field}: {route.untokenizable} ({exc})", param=field) from None
    prompt_tokens = len(ids)
    if prompt_tokens + max_tokens > cfg.context:
        raise ApiError(400, f"{field}: prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                            f"the context ({cfg.context})", param=field)
    try:
        settings = GenerationSettings(
            max_new_tokens=max_tokens, ignore_eos=req.ignore_eos, min_new_tokens=min(req.min_tokens, max_tokens),
            temperature=1.0 if req.temperature is None else float(req.temperature),
            top_p=1.0 if req.top_p is None else float(req.top_p), seed=0 if req.seed is None else int(req.seed),
        )
    except ParameterError as exc:
        raise parameter_error(exc) from None
    prefix = route.id_prefix
    cid = state.streams.new_id(prefix) if hasattr(state.streams, "new_id") else prefix + uuid.uuid4().hex[:24]
    reply = Reply(state.loaded, engine.eos, stop, asyncio.get_running_loop())
    ereq = reply.request = engines.EngineRequest(
        ids, settings, t_arrival=t_arrival, on_token=reply.on_token, on_done=reply.on_done, id=cid,
        deadline=t_arrival + cfg.request_timeout_s, endpoint=route.endpoint,
        priority=req.priority)
    try:
        engine.submit(ereq, max_pending=cfg.max_queue + 1)  # the one being served + max_queue waiting
    except engines.EngineFull:
        raise _too_busy(cfg, engine) from None
    except engines.EngineDead as exc:  # nothing will ever serve it: say so (the process is about to exit)
        raise ApiError(503, str(exc), etype="server_error") from None
    except ParameterError as exc:  # this engine cannot serve these settings (e.g. continuous: a per-request seed)
        raise parameter_error(exc) from None
    watch = DisconnectWatch(request, reply)
    try:
        return await _respond(request, req, reply, watch, cfg, cid, prompt_tokens, t_arrival, route)
    finally:
        watch.close()


async def _respond(request: Request, req, reply: Reply, watch: DisconnectWatch, cfg: ChatConfig, cid: str,
                   prompt_tokens: int, t_arrival: float, route: Route = CHAT):
    """The response of a submitted request of ``route`` (JSON body or SSE stream); ``watch`` runs until it
    starts."""
    ereq = reply.request
    created = int(time.time())
    name = req.model or cfg.model_name

    def usage(info):
        n_out = info.get("output_tokens", 0)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out,
                "prompt_tokens_details": {"cached_tokens": int(info.get("cached_tokens") or 0)}}

    def headers(info=None):
        h = {"Cache-Control": "no-cache", "X-Request-Id": cid}
        if reply.t_first is not None:
            h["X-Engine-TTFT-S"] = f"{reply.t_first - t_arrival:.6f}"
        if info and info.get("queue_s") is not None:
            h["X-Engine-Queue-S"] = f"{info['queue_s']:.6f}"
        return h

    if not req.stream:
        from fastapi.responses import JSONResponse

        parts = []
        while True:
            kind, data = await _next_event(reply, cfg)
            if kind == "text":
                parts.append(data)
            elif kind == "error":
                raise ApiError(500, ENGINE_FAILED, etype="server_error")  # the cause is logged (Reply.on_done)
            else:
                info = data
                break
        if info.get("finish_reason") == "timeout":
            raise _timed_out(cfg)
        body = {
            "id": cid, "object": route.body_object, "created": created, "model": name,
            "choices": [{"index": 0, **route.body_text("".join(parts)), "finish_reason": info.get("finish_reason", "stop"),
                                        "logprobs": None}],
            "usage": usage(info), "engine": public_figures(info),
        }
        return JSONResponse(body, headers=headers(info))

    chunk_object = route.chunk_object

    def chunk(delta, finish=None, **extra):
        return sse_data({
            "id": cid, "object": chunk_object, "created": created, "model": name,
            "choices": [{"index": 0, **route.chunk_text(delta), "finish_reason": finish, "logprobs": None}], **extra,
        })

    # Start the response once the first text (or the end) exists, so headers carry the engine TTFT; a client
    # asking for queue events gets its response at once (the events are what it waits for).
    engine = request.app.state.engine
    watch_queue = bool(req.stream_options and req.stream_options.queue_events) and hasattr(engine.queue, "status")
    first = None if (cfg.early_headers or cfg.keepalive_s or watch_queue) else await _next_event(reply, cfg)
    if first is not None and first[0] == "error":
        raise ApiError(500, ENGINE_FAILED, etype="server_error")
    watch.close()  # the streaming response listens for the disconnect from here on
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def events():
        finished = False
        try:
            if route.role_chunk:
                yield chunk({"role": "assistant", "content": ""})
            got = [first] if first is not None else []
            if watch_queue and not got:  # queue position / ETA while waiting, then one "admitted" event
                async for text in queue_updates(engine.queue, reply, cid, cfg.queue_event_s, got):
                    yield text
            kind, data = got[0] if got else await reply.events.get()
            while True:
                if kind == "gone":  # the client left just before the response started
                    return
                if kind == "text":
                    yield chunk({"content": data})
                elif kind == "error":
                    yield sse_data({"error": {"message": ENGINE_FAILED, "type": "server_error"}})
                    break
                else:
                    yield chunk({}, data.get("finish_reason", "stop"), engine=public_figures(data))
                    if include_usage:
                        yield sse_data({
                            "id": cid, "object": chunk_object, "created": created, "model": name,
                            "choices": [], "usage": usage(data), "engine": public_figures(data)})
                    break
                kind, data = await reply.events.get()
            yield DONE
            finished = True
        finally:
            if not finished:  # client went away (or the server is shutting down): stop decoding, free its place
                client_gone(engine, ereq)

    resumable = bool(req.stream_options and req.stream_options.resumable)  # outlive the connection
    streams = request.app.state.streams
    # a stream cancelled before its end (its last reader left, the resume window passed, the server stopping) still
    # ends with a final chunk (finish_reason "cancelled") and [DONE] for whoever reads its log
    closing = lambda: [chunk({}, "cancelled"), DONE]  # noqa: E731
    return streams.respond(streams.start(cid, events(), ereq.stop, resumable, closing=closing),
                           headers={**headers(), "X-Accel-Buffering": "no"},
                           numbered_ids=wants_event_ids(request, resumable))


async def health(request: Request):
    """``GET /health``: 200 ``{"status": "ok"}`` while the engine serves; 503 ``{"status": "unhealthy", "reason"}``
    when its thread has stopped, it is stuck past its bound or it is stopping
    (:meth:`workbench.serving.engines.BaseEngine.health`), so a supervisor can restart the server."""
    from fastapi.responses import JSONResponse

    engine = getattr(request.app.state, "engine", None)
    ok, reason = engine.health() if engine is not None else (True, "ok")
    if ok:
        return {"status": "ok"}
    return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)


def _model_object(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "workbench"}


async def list_models(request: Request):
    """``GET /v1/models``: the served model (its aliases are accepted names, not listed)."""
    return {"object": "list", "data": [_model_object(request.app.state.chat.model_name)]}


async def retrieve_model(model_id: str, request: Request):
    """``GET /v1/models/{model}`` (the ``openai`` SDK's ``models.retrieve``): the model under the name asked for
    when it is the served one or an alias; 404 ``NotFoundError`` naming the served ones otherwise."""
    return _model_object(check_model(model_id, request.app.state.chat.model_names))


def install(app) -> None:
    """Add the chat routes to ``app`` (their state: ``app.state.engine``, ``chat``, ``streams``, ``loaded``)."""
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", retrieve_model, methods=["GET"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
