"""Resumable Server-Sent Events: numbered events, ``Last-Event-ID`` replay, streams that outlive a connection.

The one home of SSE framing (:func:`sse_data`, :func:`event_id`, :data:`DONE`, :func:`sse_response`) and of
``Last-Event-ID`` parsing and checks (:func:`event_number`, :func:`check_last_event_id`): the chat stream, the
stream resume route and the job event route (:mod:`workbench.serving.jobs`) all use them.

Server side (:class:`StreamRegistry`, one per app): every streaming response of
:mod:`workbench.serving.chat` is *pumped* by a task of its own into an :class:`EventLog`, and each HTTP
connection is only a *reader* of that log. Each event goes out as ``id: <stream>:<n>`` (``n`` counts from 1)
followed by its ``data:`` line when the client asked to resume (``stream_options.resumable``) or reads SSE as such
(``Accept: text/event-stream``), and as its ``data:`` line alone otherwise (:func:`wants_event_ids`: what OpenAI's
and vLLM's servers send, and what line-based benchmark clients parse); comments (``: keep-alive``) carry no id (the
SSE standard gives comments no fields). The stream id is in the ``X-Stream-Id`` header either way. A client that lost its connection sends ``GET /v1/streams/<stream>`` with the header
``Last-Event-ID: <stream>:<n>`` (what the browser ``EventSource`` sends by itself) and receives events
``n+1 ...`` from the log, then the live ones: nothing lost, nothing repeated.

- **Without** ``stream_options.resumable`` a stream whose last reader disconnects is stopped at once (the
  pump is cancelled, which sets the request's cancel flag: decoding stops, as before). Its log stays
  readable for ``retention_s``; it ends where decoding stopped, with a final chunk whose ``finish_reason`` is
  ``cancelled`` and ``[DONE]`` (the ``closing`` events of :meth:`StreamRegistry.start`), so a reader knows it ended.
- **With** ``resumable: true`` the pump keeps generating while no reader is attached, for at most
  ``resume_timeout_s`` after the last reader left; a reader that comes back within that time resets it.
  Past it, the stream is cancelled as above. The server's ``request_timeout_s`` still bounds the request.
- Bounded: a finished stream's log is kept ``retention_s`` seconds, then dropped (its id is remembered as
  expired: 410); at most ``max_streams`` logs are kept (the oldest finished ones go first).
- Bad resume requests get a 4xx JSON error: an unknown stream (404), an expired one (410), one of an earlier run
  of the server (410: every stream id carries its server process's mark, :meth:`StreamRegistry.new_id`), a
  ``Last-Event-ID`` that is malformed, names another stream, or names an event never sent (400).
- ``keepalive_s``: while no event arrives for that long, a reader sends the comment ``: keep-alive``, so a
  client (or proxy) read timeout does not fire on a request that waits in the queue or decodes slowly.

Client side: :func:`iter_sse` parses an SSE byte/line stream into :class:`SSEEvent` s (``id``, ``data``,
``comment``); :func:`event_number` splits an id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterable, Iterator

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from workbench.checks import check_float, check_int
from workbench.serving.http import ApiError

_log = logging.getLogger(__name__)

RESUME_TIMEOUT_S = 60.0   # a resumable stream keeps generating this long with no reader attached
RETENTION_S = 300.0       # a finished stream's events stay replayable this long
MAX_STREAMS = 256         # event logs kept at most (finished ones are dropped oldest first)
KEEPALIVE_COMMENT = ": keep-alive\n\n"
_ID_RE = re.compile(r"^(?:chat)?cmpl-([0-9a-f]{8})[0-9a-f]{16}$")   # StreamRegistry.new_id's form (chat, completions)
DONE = "data: [DONE]\n\n"   # the OpenAI stream's last event


class StreamError(ApiError):
    """A resume request that cannot be served: ``status`` (4xx), ``message``, ``param``."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(status, message, param=param)


def sse_data(obj) -> str:
    """One SSE event ``data: <json>\\n\\n``; U+2028, U+2029 and U+0085 are escaped (``\\u2028`` ...).

    JSON allows them raw, but ``str.splitlines`` (and some SSE clients) split lines on them, which
    would cut a ``data:`` line in two. Inside JSON they can only occur in strings, where the escape
    decodes to the same character, so the reassembled text is unchanged.
    """
    text = json.dumps(obj, ensure_ascii=False)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
    return "data: " + text + "\n\n"


def queue_event(sid: str, queue_position: int | None, eta_s: float | None, admitted: bool) -> str:
    """The SSE event telling a waiting client where it stands (``stream_options.queue_events``):
    ``data: {"id", "object": "queue.status", "queue_position", "eta_s", "admitted"}``. ``queue_position``:
    requests the engine's policy serves before this one (0 once admitted); ``eta_s``: the engine's estimate of
    the wait left in seconds (null when unknown). The last one of a request has ``admitted: true``."""
    eta = None if eta_s is None or eta_s != eta_s else round(float(eta_s), 3)
    return sse_data({"id": sid, "object": "queue.status", "queue_position": queue_position, "eta_s": eta,
                     "admitted": bool(admitted)})


def wants_event_ids(request, resumable: bool) -> bool:
    """Whether a new stream's events go out numbered (``id:`` lines): when the client asked to resume it
    (``stream_options.resumable``) or reads Server-Sent Events as such (``Accept: text/event-stream``, what a
    browser ``EventSource`` and SSE libraries send). Otherwise plain ``data:`` events, as OpenAI's and vLLM's servers
    send them: line-based clients (``vllm bench serve``'s request functions parse every non-comment line as
    ``data: <json>``) fail on an ``id:`` line. The events are logged either way; ``GET /v1/streams/<stream>``
    numbers them."""
    return bool(resumable) or "text/event-stream" in request.headers.get("accept", "").lower()


def numbered(sid: str, n: int, text: str) -> str:
    """The SSE block ``text`` (``data: ...\\n\\n``) as event ``n`` of stream ``sid`` (an ``id:`` line first)."""
    return f"id: {event_id(sid, n)}\n" + text


WRITE_TIMEOUT_S = 30.0   # a stream whose client takes no bytes for this long is closed (it never reads)


class _NotReading(Exception):
    """A write to the client did not complete within :data:`WRITE_TIMEOUT_S`."""


def _contains(exc: BaseException, kind) -> bool:
    if isinstance(exc, kind):
        return True
    return any(_contains(e, kind) for e in getattr(exc, "exceptions", ()) or ())


def _bounded_streaming_response():
    from fastapi.responses import StreamingResponse

    class BoundedStreamingResponse(StreamingResponse):
        """A ``StreamingResponse`` with a write-side timeout: a client that takes no bytes for
        :data:`WRITE_TIMEOUT_S` (its socket buffers full: it never reads) is dropped, its source closed (so a
        stream reader detaches and a plain stream stops generating), instead of pinning its connection and its
        event log forever. The source is closed however the response ends."""

        async def __call__(self, scope, receive, send):
            async def timed_send(message):
                try:
                    await asyncio.wait_for(send(message), WRITE_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise _NotReading() from None

            try:
                await super().__call__(scope, receive, timed_send)
            except Exception as exc:  # noqa: BLE001 - only the write timeout is ours to swallow
                if not _contains(exc, _NotReading):
                    raise
                _log.warning("SSE client took no bytes for %g s: dropped", WRITE_TIMEOUT_S)
            finally:
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()

    return BoundedStreamingResponse


def sse_response(source, headers: dict | None = None):
    """A ``text/event-stream`` streaming response over ``source`` with ``Cache-Control: no-cache`` and
    ``X-Accel-Buffering: no`` (what nginx's header mode honours), bounded on the write side
    (:data:`WRITE_TIMEOUT_S`: a client that never reads is dropped)."""
    h = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
    return _bounded_streaming_response()(source, media_type="text/event-stream", headers=h)


def last_event_id(request) -> str | None:
    """The ``Last-Event-ID`` a resuming client sent: the header (what ``EventSource`` sends) or the
    ``last_event_id`` query parameter."""
    return request.headers.get("last-event-id") or request.query_params.get("last_event_id")


def event_id(sid: str, n: int) -> str:
    """The SSE id of event ``n`` (from 1) of stream ``sid``."""
    return f"{sid}:{n}"


def event_number(last_event_id: str) -> tuple[str, int]:
    """``"<stream>:<n>"`` -> ``(stream, n)``.

    Raises:
        StreamError: (400) anything else.
    """
    sid, sep, n = (last_event_id or "").strip().rpartition(":")
    if not sep or not sid or not (n.isascii() and n.isdigit()) or len(n) > 12:  # str.isdigit() alone takes '٣'
        raise StreamError(400, f"Last-Event-ID: must be '<stream id>:<event number>' (got {last_event_id!r:.80})",
                          param="Last-Event-ID")
    return sid, int(n)


def check_last_event_id(last_event_id: str | None, sid: str, sent: int) -> int:
    """The number of the last event a client resuming stream ``sid`` saw (0: none, from the start).

    Args:
        last_event_id: what the client sent (None or empty: from the start).
        sid: the stream (or job) being resumed.
        sent: events of that stream sent so far.

    Raises:
        StreamError: (400) malformed, naming another stream, or naming an event never sent.
    """
    if not last_event_id:
        return 0
    other, n = event_number(last_event_id)
    if other != sid:
        raise StreamError(400, f"Last-Event-ID: names stream {other!r:.80}, not {sid!r:.80}", param="Last-Event-ID")
    if n > sent:
        raise StreamError(400, f"Last-Event-ID: event {n} of {sid!r:.80} was never sent ({sent} so far)",
                          param="Last-Event-ID")
    return n


class EventLog:
    """The numbered events of one stream (SSE text blocks without their ``id:`` line), in order.

    Attributes:
        sid: the stream id (the chat completion id).
        events: every event so far; event ``n`` is ``events[n - 1]``.
        done: the stream ended (finished, failed or cancelled); no event follows.
        resumable: keeps generating without a reader (for ``resume_timeout_s``).
        readers: connections reading it now.
    """

    def __init__(self, sid: str, resumable: bool, cancel: Callable[[], None] | None = None):
        self.sid = sid
        self.resumable = resumable
        self.events: list[str] = []
        self.done = False
        self.t_done: float | None = None
        self.t_detached: float | None = None
        self.readers = 0
        self.cancelled = False
        self._cancel = cancel
        self._changed = asyncio.Event()
        self.task: asyncio.Task | None = None

    def append(self, text: str) -> None:
        self.events.append(text)
        self._changed.set()

    def finish(self) -> None:
        if not self.done:
            self.done, self.t_done = True, time.monotonic()
            self._changed.set()

    def cancel(self) -> None:
        """Stop generating: cancel the pump and set the request's cancel flag."""
        self.cancelled = True
        if self._cancel is not None:
            self._cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def wait(self, seen: int, timeout: float | None) -> bool:
        """Wait until there is an event after ``seen`` or the stream ended; False on timeout."""
        while len(self.events) <= seen and not self.done:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                return False
        return True


class StreamRegistry:
    """Every stream of one app: pumps, event logs, readers, resume look-ups (see the module docstring).

    Args:
        resume_timeout_s: how long a resumable stream generates with no reader attached.
        retention_s: how long a finished stream stays replayable.
        max_streams: event logs kept at most.
        keepalive_s: send ``: keep-alive`` after this many idle seconds (None: never).
    """

    def __init__(self, resume_timeout_s: float = RESUME_TIMEOUT_S, retention_s: float = RETENTION_S,
                 max_streams: int = MAX_STREAMS, keepalive_s: float | None = None):
        self.resume_timeout_s = check_float("resume_timeout_s", resume_timeout_s, lo=0, lo_open=True)
        self.retention_s = check_float("retention_s", retention_s, lo=0)
        self.max_streams = check_int("max_streams", max_streams, lo=1)
        self.keepalive_s = None if keepalive_s is None else check_float("keepalive_s", keepalive_s, lo=0, lo_open=True)
        self.logs: OrderedDict[str, EventLog] = OrderedDict()
        self.expired: deque = deque(maxlen=4096)
        self.boot = secrets.token_hex(4)   # this server process's mark in every stream id (new_id)

    def new_id(self, prefix: str = "chatcmpl-") -> str:
        """A new stream id: ``prefix``, this registry's ``boot`` mark (8 hex digits), 16 random hex digits. A
        well-formed id with another boot mark names a stream of an earlier server process: :meth:`lookup`
        answers it 410 (gone with the restart), not 404."""
        return f"{prefix}{self.boot}{uuid.uuid4().hex[:16]}"

    def _earlier_process(self, sid: str) -> bool:
        m = _ID_RE.match(sid)
        return bool(m) and m.group(1) != self.boot

    # ------------------------------------------------------------------ bookkeeping

    def _evict(self) -> None:
        now = time.monotonic()
        for sid, log in list(self.logs.items()):
            if log.done and log.readers == 0 and now - log.t_done > self.retention_s:
                self._drop(sid)
        finished = [sid for sid, log in self.logs.items() if log.done and log.readers == 0]
        while len(self.logs) >= self.max_streams and finished:
            self._drop(finished.pop(0))

    def _drop(self, sid: str) -> None:
        self.logs.pop(sid, None)
        self.expired.append(sid)

    def start(self, sid: str, source: AsyncIterator[str], cancel: Callable[[], None] | None = None,
              resumable: bool = False, closing: Callable[[], list] | None = None) -> EventLog:
        """Pump ``source`` (SSE text blocks) into a new log in a task of its own; return the log. ``closing()``:
        the events that end a stream cancelled before its source ended (its final chunk and ``[DONE]``), so every
        reader of its log, now or resuming later, sees it end."""
        self._evict()
        log = EventLog(sid, resumable, cancel)
        self.logs[sid] = log

        async def pump():
            try:
                async for text in source:
                    log.append(text)
            finally:
                if log.cancelled and closing is not None and (not log.events or log.events[-1] != DONE):
                    for text in closing():
                        log.append(text)
                log.finish()
                await source.aclose()

        log.task = asyncio.get_running_loop().create_task(pump(), name=f"sse-pump-{sid}")
        return log

    def lookup(self, sid: str, last_event_id: str | None) -> tuple[EventLog, int]:
        """The log of ``sid`` and the number of the last event its client saw (0: from the start).

        Raises:
            StreamError: unknown (404) or expired (410) stream; a bad ``Last-Event-ID`` (400).
        """
        self._evict()
        log = self.logs.get(sid)
        if log is None:
            if sid in self.expired:
                raise StreamError(410, f"stream {sid!r:.80}: expired (finished streams are kept {self.retention_s:g} s)",
                                  param="stream")
            if self._earlier_process(sid):
                raise StreamError(410, f"stream {sid!r:.80}: gone (it belonged to an earlier run of this server; "
                                       "streams live in the server's memory and end with a restart)", param="stream")
            raise StreamError(404, f"stream {sid!r:.80}: unknown", param="stream")
        return log, check_last_event_id(last_event_id, sid, len(log.events))

    # ------------------------------------------------------------------ readers

    def _detach(self, log: EventLog) -> None:
        log.readers -= 1
        if log.done or log.readers > 0:
            return
        if not log.resumable:
            log.cancel()  # no reader, not resumable: stop decoding, as a plain stream does
            return
        log.t_detached = t = time.monotonic()

        def check():
            if not log.done and log.readers == 0 and log.t_detached == t:
                log.cancel()

        asyncio.get_running_loop().call_later(self.resume_timeout_s, check)

    async def read(self, log: EventLog, after: int = 0, numbered_ids: bool = True) -> AsyncIterator[str]:
        """The SSE text of events ``after + 1 ...``, live ones included, each with its ``id:`` line unless
        ``numbered_ids`` is False (plain ``data:`` events, :func:`wants_event_ids`); keep-alive comments."""
        log.readers += 1
        log.t_detached = None
        seen = after
        try:
            while True:
                while seen < len(log.events):
                    seen += 1
                    yield (numbered(log.sid, seen, log.events[seen - 1]) if numbered_ids
                           else log.events[seen - 1])
                if log.done:
                    return
                if not await log.wait(seen, self.keepalive_s):
                    yield KEEPALIVE_COMMENT
        finally:
            self._detach(log)

    def respond(self, log: EventLog, after: int = 0, headers: dict | None = None, numbered_ids: bool = True):
        """A ``StreamingResponse`` reading ``log`` from event ``after + 1`` (its events numbered unless
        ``numbered_ids`` is False: :meth:`read`).

        A client that leaves before the response starts reading (between its first token and the response start)
        never starts the reader, whose ``finally`` would detach it: the response detaches it when it ends, so a
        stream nobody reads stops decoding (unless resumable) instead of generating to ``max_tokens``."""
        started = []

        async def reader():
            started.append(True)
            inner = self.read(log, after, numbered_ids)
            try:
                async for text in inner:
                    yield text
            finally:
                await inner.aclose()  # its reader detaches now, not when the generator is collected

        response = sse_response(reader(), {"X-Stream-Id": log.sid, **(headers or {})})
        registry = self

        class _DetachingResponse(type(response)):
            async def __call__(self, scope, receive, send):
                try:
                    await super().__call__(scope, receive, send)
                finally:
                    if not started:  # never read: as if its reader had come and gone
                        log.readers += 1
                        registry._detach(log)

        response.__class__ = _DetachingResponse
        return response

    def close(self) -> None:
        """Cancel every stream still generating (server shutdown)."""
        for log in self.logs.values():
            if not log.done:
                log.cancel()


async def resume_stream(sid: str, request: Request):
    """``GET /v1/streams/{sid}``: the stream's events after the client's ``Last-Event-ID`` (all without one),
    then the live ones (``request.app.state.streams``: the app's :class:`StreamRegistry`)."""
    registry: StreamRegistry = request.app.state.streams
    log, after = registry.lookup(sid, last_event_id(request))
    return registry.respond(log, after)


def install(app) -> None:
    """Add ``GET /v1/streams/{sid}`` (resume with ``Last-Event-ID``) to ``app``."""
    app.add_api_route("/v1/streams/{sid}", resume_stream, methods=["GET"])


# --------------------------------------------------------------------------- client side


@dataclass
class SSEEvent:
    """One parsed SSE block: ``id`` (None when the block set none), ``data`` (lines joined by ``\\n``),
    ``comment`` (True for a comment-only block such as ``: keep-alive``); ``t`` (perf_counter on arrival)."""

    id: str | None
    data: str | None
    comment: bool = False
    t: float = 0.0


def iter_sse(lines: Iterable[str]) -> Iterator[SSEEvent]:
    """Parse SSE lines (e.g. ``httpx.Response.iter_lines()``) into events, stamped on arrival of their end.

    Follows the WHATWG event-stream rules for ``id``, ``data`` and comments; ``event`` and ``retry`` fields
    are ignored. A comment-only block yields an event with ``comment=True``.
    """
    eid, data, comment = None, [], False
    for line in lines:
        if line == "":
            if data or eid is not None:
                yield SSEEvent(eid, "\n".join(data) if data else None, False, time.perf_counter())
            elif comment:
                yield SSEEvent(None, None, True, time.perf_counter())
            eid, data, comment = None, [], False
            continue
        if line.startswith(":"):
            comment = True
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "id" and "\x00" not in value:
            eid = value
    if data or eid is not None:
        yield SSEEvent(eid, "\n".join(data) if data else None, False, time.perf_counter())
