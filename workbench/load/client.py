"""The client side of serving: the official ``openai`` client, and per-request timing over HTTP.

:func:`stream_chat` streams one chat completion from an OpenAI-compatible
server (:mod:`workbench.serving.server`, or any other) and stamps each content
chunk with ``perf_counter`` on arrival (vLLM's request functions in
``vllm/benchmarks/lib/endpoint_request_func.py`` stamp the same way); the
timing columns come from :func:`workbench.stats.metrics.request_timing` over those
stamps. **A chunk is not a token**: a character split across tokens arrives as
one chunk, a first token that makes no visible text (common in Chinese) sends
none, and an end-of-sequence id sends none. So the gaps between chunks are
``chunk_itl_s`` (never ``itl_s``, which is per token id), ``output_tokens`` is
the server's ``usage`` count, and the client's ``tpot_s`` divides the first-to-
last chunk time by the decode steps actually between them: ``usage`` tokens,
minus the end-of-sequence id when the reply stopped on it, minus the tokens the
first chunk carries (counted with the tokenizer). The server's own figures
(``engine_*``) come back in the final chunk; ``transport_ttft_s`` is the
client's first chunk minus the engine's first *text* (``engine_first_text_s``),
so decode steps that made no text are not charged to HTTP.

Loopback measurement traffic ignores ``HTTP_PROXY`` / ``HTTPS_PROXY`` (every
``httpx`` client is built by :func:`http_client`, with ``trust_env=False``), and
every client of the process shares one TLS context (:func:`ssl_context`).

:func:`measure_http` sends ``concurrency`` streaming requests together from
threads and returns the measure dict of :func:`workbench.run.sweeps.run_sweep`.

:func:`stream_request` reads one streaming chat reply over raw SSE with ``httpx`` instead (no ``openai``
client): every content chunk's arrival, ``: keep-alive`` comments, the socket reads that brought the first
chunk, a read timeout as an outcome, and :func:`workbench.measure.reading.reader_metrics` of the chunks; what
a reader sees through a proxy or a client timeout (notebook ``10_streaming_reader``).

**One streamed reply, one loop.** Every streaming client path of the workbench (:func:`stream_chat`,
:func:`stream_request`, the load generator's :func:`workbench.load.senders.http_sender`, the endpoint checks of
:mod:`workbench.load.endpoint`) receives its reply as a :class:`StreamedReply` (the request, each content chunk's
arrival and text, ``usage``, the server's reported figures, the error; the shape of vLLM's ``RequestFuncOutput`` in
``vllm/benchmarks/lib/endpoint_request_func.py``), filled by the one loop :func:`fill_reply`: over raw SSE
(:func:`stream_reply`: ``httpx``, parsed by :func:`workbench.serving.events.iter_sse`) or over the chunks the
official ``openai`` client parsed (:func:`stream_chat`). Each caller then derives its own columns from it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from workbench.checks import check_int
from workbench.errors import ParameterError, exception_line
from workbench.measure import reading
from workbench.serving.protocol import SERVED_MODEL
from workbench.stats import metrics

if TYPE_CHECKING:
    from workbench.load.endpoint import Endpoint


@functools.cache
def ssl_context():
    """The one TLS context every client of this process uses (``httpx.create_ssl_context()``: certifi's CA bundle).

    ``httpx`` otherwise builds a context for each client it opens, loading the CA bundle each time: CPU time a
    per-request client then spent inside the request's clock (results/LOG.md, 2026-12-06: the figure).
    """
    import httpx

    return httpx.create_ssl_context()


def http_client(timeout: float = 600.0, **kwargs):
    """An ``httpx.Client`` for measurement traffic: ``timeout`` (seconds, or an ``httpx.Timeout``), proxies from
    the environment ignored (``trust_env=False``: ``HTTP_PROXY`` must not reroute or time loopback traffic), the
    shared :func:`ssl_context`; ``kwargs`` go to ``httpx.Client`` (``limits``, ``headers``...). Build it before
    starting a request's clock."""
    import httpx

    return httpx.Client(timeout=timeout, trust_env=False, verify=ssl_context(), **kwargs)


def openai_client(base_url: str, timeout: float = 600.0, api_key: str = "workbench"):
    """The official ``openai`` client pointed at ``base_url`` (no retries; proxies from the environment ignored).

    Args:
        base_url: ``http://host:port`` of the server.
        timeout: seconds per request.
        api_key: sent as ``Authorization: Bearer <api_key>`` (a loopback workbench server needs none).
    """
    import openai

    http = http_client(timeout)
    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0, timeout=timeout,
                         http_client=http)


@dataclasses.dataclass
class StreamedReply:
    """One streamed chat completion as the client received it (vLLM's ``RequestFuncOutput``, with what the
    workbench reads besides). Times are ``time.perf_counter`` stamps (s).

    Attributes:
        request: the request body sent.
        t_send: when the request was sent; ``t_headers``: when the response headers came (None: none came, or the
            ``openai`` client read them); ``t_end``: when the reply ended (answer, error, timeout or abandonment).
        stamps, texts: each content chunk's arrival and text (a chunk is not a token).
        finish_reason: the last ``finish_reason`` the chunks gave.
        usage: the server's ``usage`` (None when the stream carried none).
        engine: the server's own figures (its ``engine`` field: ``engine_ttft_s``, ``queue_s``, ``e2e_s``, ...;
            empty from a server that sends none).
        status: the HTTP status (None: no response, or the ``openai`` client's request); ``retry_after`` and
            ``refusal_text`` (its first 200 characters) of a non-200 answer.
        error: ``"Type: first line"`` of what ended the reply early (None when it completed); ``exception`` the
            exception itself, ``timed_out`` whether it was a client timeout.
        events: data events received (any chunk); ``keepalives``: SSE comments (``: keep-alive``).
        reads: the byte size of each read of the response (raw SSE); ``read_of``: per content chunk, the reads
            received when it arrived.
    """

    request: dict
    t_send: float = 0.0
    t_headers: float | None = None
    t_end: float = 0.0
    stamps: list = dataclasses.field(default_factory=list)
    texts: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    engine: dict = dataclasses.field(default_factory=dict)
    status: int | None = None
    retry_after: str | None = None
    refusal_text: str = ""
    error: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, repr=False, compare=False)
    timed_out: bool = False
    events: int = 0
    keepalives: int = 0
    reads: list = dataclasses.field(default_factory=list)
    read_of: list = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        """The streamed content, joined."""
        return "".join(self.texts)

    @property
    def output_tokens(self) -> int | None:
        """``usage.completion_tokens`` (None when the stream carried no ``usage``)."""
        return (self.usage or {}).get("completion_tokens")

    @property
    def prompt_tokens(self) -> int | None:
        """``usage.prompt_tokens`` (None when the stream carried no ``usage``)."""
        return (self.usage or {}).get("prompt_tokens")

    @property
    def cached_tokens(self) -> int | None:
        """``usage.prompt_tokens_details.cached_tokens`` (None when the server sends none)."""
        return ((self.usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def fill_reply(reply: StreamedReply, chunks: Iterable, patience=None, on_content: Callable[[], None] | None = None,
               strict: bool = False) -> StreamedReply:
    """THE loop over a streamed chat completion's chunks: each ``(arrival, chunk)`` (``chunk`` a parsed JSON object,
    None for an SSE comment) goes into ``reply``: content chunks with their arrival, ``finish_reason``, ``usage``, the
    server's ``engine`` figures.

    Args:
        chunks: ``(perf_counter, dict | None)`` pairs, from raw SSE (:func:`stream_reply`) or the ``openai`` client.
        patience: a client's patience (``abandoned``, ``got_content()``: :func:`workbench.load.senders.http_sender`):
            the loop stops once the client gave up, or at a content chunk that came after it did.
        on_content: called at each content chunk (e.g. to tell a waiting thread the request reached the engine).
        strict: every data event must be of the OpenAI chunk shape (a ``choices`` list of objects with a
            ``delta`` object), as the endpoint check demands; otherwise a chunk without ``choices`` counts as none.

    Raises:
        RuntimeError: the server sent an error event (``server error: <message>``).
        ValueError: a chunk that is not a JSON object (or, ``strict``, not of the chunk shape).
    """
    for t, obj in chunks:
        if patience is not None and patience.abandoned:
            break  # the caller's connection closes when it leaves the request
        if obj is None:
            reply.keepalives += 1
            continue
        if not isinstance(obj, dict):
            raise ValueError("a data: event that is not a JSON object")
        if "error" in obj:
            err = obj["error"]
            raise RuntimeError(f"server error: {err.get('message') if isinstance(err, dict) else err}")
        reply.events += 1
        reply.engine = obj.get("engine") or reply.engine
        reply.usage = obj.get("usage") or reply.usage
        choices = obj.get("choices", None if strict else [])
        if strict and (not isinstance(choices, list) or not all(
                isinstance(c, dict) and isinstance(c.get("delta", {}), dict) for c in choices)):
            raise ValueError("a data: event without choices" if not isinstance(choices, list)
                             else "a choice without delta")
        contents = [(c.get("delta") or {}).get("content") for c in choices]
        if patience is not None and any(contents) and not patience.got_content():
            break  # it came after the client gave up
        for c, content in zip(choices, contents):
            if content:
                reply.stamps.append(t)
                reply.texts.append(content)
                reply.read_of.append(len(reply.reads))
                if on_content is not None:
                    on_content()
            reply.finish_reason = c.get("finish_reason") or reply.finish_reason
    return reply


def _sse_chunks(resp, reads: list) -> Iterator:
    """``(arrival, chunk | None)`` of a raw SSE response for :func:`fill_reply`: its bytes as lines (each read's size
    into ``reads``), parsed by :func:`workbench.serving.events.iter_sse`; ``[DONE]`` and empty events skipped."""
    from workbench.serving.events import iter_sse

    for ev in iter_sse(_counted_lines(resp.iter_bytes(), reads)):
        if ev.comment:
            yield ev.t, None
        elif ev.data and ev.data.strip() != "[DONE]":
            yield ev.t, json.loads(ev.data)


def stream_reply(http, url: str, body: dict, headers: dict | None = None, patience=None,
                 on_content: Callable[[], None] | None = None, strict: bool = False) -> StreamedReply:
    """POST ``body`` to ``url`` (a chat completions route) with ``stream`` on and read its SSE reply through
    :func:`fill_reply`: the one raw-SSE request of the workbench.

    Args:
        http: an ``httpx.Client`` (:func:`http_client`).
        headers: extra request headers (an endpoint's ``Authorization``).
        patience, on_content, strict: as :func:`fill_reply`; ``patience`` also gets the connection
            (its ``trace`` callback and ``attach``) so that it can close it.

    Returns:
        The reply; a failed request (a non-200 status, a broken stream, a timeout) is a reply with ``error`` set,
        never an exception.
    """
    import httpx

    reply = StreamedReply(request=body)
    reply.t_send = time.perf_counter()
    try:
        with http.stream("POST", url, json=body, headers=headers or None,
                         extensions={"trace": patience.trace} if patience is not None else None) as resp:
            reply.t_headers = time.perf_counter()
            reply.status = resp.status_code
            if patience is not None:
                patience.attach(resp.extensions.get("network_stream"))
            if resp.status_code != 200:
                resp.read()
                reply.retry_after, reply.refusal_text = resp.headers.get("retry-after"), resp.text[:200]
                raise RuntimeError(f"HTTP {resp.status_code}: {reply.refusal_text}")
            fill_reply(reply, _sse_chunks(resp, reply.reads), patience, on_content, strict)
    except Exception as exc:  # a failed request is a reply with an error (an SLO miss), never a crash of the run
        reply.exception, reply.timed_out = exc, isinstance(exc, httpx.TimeoutException)
        reply.error = exception_line(exc)
    finally:
        reply.t_end = time.perf_counter()
    return reply


def client_decode_steps(output_tokens: int, finish_reason: str | None, first_chunk: str, tokenizer=None) -> int:
    """Decode steps between a reply's first and last text chunk, from ``usage`` and the tokenizer.

    ``output_tokens`` (``usage.completion_tokens``) minus the end-of-sequence id when the reply
    stopped on it (``finish_reason == "stop"``: it makes no text), minus the tokens of the first
    chunk (``len(tokenizer.encode(first_chunk))``, at least 1; 1 without a tokenizer). Never below 0.
    """
    text_tokens = max(0, int(output_tokens) - (1 if finish_reason == "stop" else 0))
    first = len(tokenizer.encode(first_chunk, add_special_tokens=False)) if tokenizer is not None and first_chunk else 1
    first = min(max(first, 1), max(text_tokens, 1))
    return max(0, text_tokens - first)


def stream_chat(client, prompt, max_tokens: int, temperature: float = 0.0, seed: int = 0,
                ignore_eos: bool = False, model: str = SERVED_MODEL, tokenizer=None) -> dict:
    """Stream one chat completion with the ``openai`` client and time it on the client side.

    Args:
        client: from :func:`openai_client`.
        prompt: a user message string or a list of messages.
        max_tokens, temperature, seed: request fields; ``ignore_eos`` is the vLLM extension.
        model: the ``model`` field of the request.
        tokenizer: the served model's tokenizer, to count the tokens of the first chunk
            (:func:`client_decode_steps`); without it the first chunk counts as one token.

    Returns:
        A row: ``t_send`` (perf_counter), ``ttft_s`` (send to first content
        chunk), ``chunk_itl_s`` (gaps between content chunks), ``e2e_s`` (send to
        last chunk), ``tpot_s`` and ``decode_tps`` (over the decode steps between
        the first and last chunk), ``decode_steps``, ``chunks``, ``text``,
        ``prompt_tokens``, ``output_tokens`` (``usage``), ``finish_reason``,
        ``batch_size`` (as the server reports it, 1 when it does not),
        ``engine_*`` (the server's figures) and ``transport_ttft_s`` /
        ``transport_e2e_s``. No ``itl_s``: a chunk is not a token.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    body = dict(model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": ignore_eos})
    reply = StreamedReply(request=body)
    reply.t_send = t_send = time.perf_counter()
    stream = client.chat.completions.create(**body)
    # the chunks the openai client parsed, stamped as they come, through the one loop
    fill_reply(reply, ((time.perf_counter(), ch.model_dump()) for ch in stream))
    reply.t_end = t_end = time.perf_counter()
    stamps, parts, engine, usage, finish = reply.stamps, reply.texts, reply.engine, reply.usage, reply.finish_reason
    n_out = reply.output_tokens if usage else len(stamps)
    steps = client_decode_steps(n_out, finish, parts[0] if parts else "", tokenizer)
    timing = metrics.request_timing(stamps, t_send, decode_steps=steps)
    if not stamps:  # no visible text: the request still took this long
        timing["e2e_s"] = t_end - t_send
    nan = float("nan")

    def eng(key):
        v = engine.get(key)
        return nan if v is None else v

    return {
        "t_send": t_send,
        "ttft_s": timing["ttft_s"],
        "chunk_itl_s": timing["itl_s"],
        "e2e_s": timing["e2e_s"],
        "tpot_s": timing["tpot_s"],
        "decode_tps": timing["decode_tps"],
        "decode_steps": steps,
        "chunks": len(stamps),
        "text": reply.text,
        "prompt_tokens": reply.prompt_tokens,
        "output_tokens": n_out,
        "finish_reason": finish,
        "batch_size": int(engine.get("batch_size") or 1),
        "engine_ttft_s": eng("engine_ttft_s"),
        "engine_first_text_s": eng("engine_first_text_s"),
        "engine_queue_s": eng("queue_s"),
        "engine_prefill_s": eng("prefill_s"),
        "engine_e2e_s": eng("e2e_s"),
        "engine_tpot_s": eng("tpot_s"),
        "transport_ttft_s": timing["ttft_s"] - eng("engine_first_text_s"),
        "transport_e2e_s": (t_end - t_send) - eng("e2e_s"),
    }


def measure_http(base_url: str, prompts: Sequence, concurrency: int, max_tokens: int, repeats: int = 1,
                 warmup: int = 1, temperature: float = 0.0, seed: int = 0, ignore_eos: bool = True,
                 tokenizer=None) -> dict:
    """``run_sweep`` measure dict: ``concurrency`` streaming requests sent together, per repeat.

    Requests start together (a thread barrier) and the server queues them, so
    later requests' TTFT includes waiting for earlier ones; the engine's TTFT
    includes the same wait, leaving ``transport_ttft_s`` as the HTTP cost. ``tokenizer``: the served
    model's, for the client TPOT (:func:`stream_chat`). Each row's ``batch_size`` is what shared a
    forward pass on the server (1: it serves one request at a time), not ``concurrency``.

    Returns:
        ``{"requests": rows (see :func:`stream_chat`) with ``repeat``,
        ``request_id``, ``concurrency``, ``t_start_s`` (send time after the
        repeat's first send); "wall_s": first send to last completion, summed
        over repeats; "warmup_s"; "extra": ``transport_ttft_s_p50``,
        ``engine_ttft_s_p50``, ``engine_queue_s_p50``}``.

    Raises:
        ParameterError: ``concurrency`` < 1 or no prompts.
    """
    check_int("concurrency", concurrency, lo=1)
    if not prompts:
        raise ParameterError("prompts: need at least one prompt")
    client = openai_client(base_url)
    t = time.perf_counter()
    for _ in range(warmup):
        stream_chat(client, prompts[0], max_tokens, temperature, seed, ignore_eos, tokenizer=tokenizer)
    warmup_s = time.perf_counter() - t
    rows, wall = [], 0.0
    for r in range(repeats):
        barrier = threading.Barrier(concurrency)
        out: list = [None] * concurrency

        def one(i):
            barrier.wait()
            try:
                out[i] = stream_chat(client, prompts[i % len(prompts)], max_tokens, temperature, seed + r, ignore_eos,
                                     tokenizer=tokenizer)
            except Exception as exc:
                out[i] = {"error": f"{type(exc).__name__}: {exc}"}

        threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        ok = [o for o in out if "error" not in o]
        if len(ok) < len(out):
            raise RuntimeError(next(o["error"] for o in out if "error" in o))
        t0 = min(o["t_send"] for o in ok)
        t1 = max(o["t_send"] + o["e2e_s"] for o in ok)
        wall += t1 - t0
        for i, o in enumerate(out):
            rows.append(dict(o, repeat=r, request_id=i, concurrency=concurrency, t_start_s=o["t_send"] - t0,
                             max_new_tokens=max_tokens, temperature=temperature))
    extra = {f"{col}_p50": metrics.percentiles([q[col] for q in rows], (50,))["p50"]
             for col in ("transport_ttft_s", "engine_ttft_s", "engine_queue_s")}
    return {"requests": rows, "wall_s": wall, "warmup_s": warmup_s, "extra": extra}


def _counted_lines(byte_chunks, reads: list) -> Iterator[str]:
    """Text lines of a byte stream; ``reads`` gets each socket read's size as it is consumed (SSE uses ``\\n``)."""
    import codecs

    dec, buf = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    for b in byte_chunks:
        reads.append(len(b))
        buf += dec.decode(b)
        *lines, buf = buf.split("\n")
        for ln in lines:
            yield ln.rstrip("\r")
    buf += dec.decode(b"", final=True)
    if buf:
        yield buf.rstrip("\r")


def table_row(row: dict) -> dict:
    """A :func:`stream_request` row without the caller-only fields (chunk stamps, chunk texts, send time)."""
    return {k: v for k, v in row.items() if k not in ("chunk_stamps", "chunk_texts", "t_send")}


def stream_request(base_url: str, prompt: str, max_tokens: int, timeout: float = 600.0, stall_s: float = reading.STALL_S,
                   read_timeout: float | None = None, path: str = "/v1/chat/completions",
                   ep: Endpoint | None = None, first_chunk: threading.Event | None = None) -> dict:
    """One streaming chat request over raw SSE; client timing of its content chunks and their reader metrics.

    ``ep``: an external endpoint (its model and key are sent, ``usage`` asked for; ``base_url`` is still where
    the request goes: the endpoint itself or nginx in front of it). ``first_chunk``: set when the first content
    chunk arrives (the request is then in the server's engine), or when the request ends without one.

    Returns:
        ``ttft_s``, ``e2e_s``, ``chunk_itl_s``, ``chunk_offsets_s`` (each content chunk's arrival after the
        send), ``chunk_stamps`` (their ``perf_counter`` stamps), ``chunks``, ``keepalives`` (comments
        received), ``text``, ``engine_ttft_s`` and ``engine_e2e_s`` (the server's arrival to its first / last
        token), ``first_after_last`` (client TTFT >= engine e2e: the first chunk reached the client only
        after the last token was generated), ``first_read_bytes`` / ``first_read_chunks`` (response bytes
        received up to and including the socket read that brought the first content chunk, and the content
        chunks that read brought), ``response_bytes``, ``outcome`` (``ok`` or ``timeout``), ``error``,
        ``finish_reason`` and ``prompt_tokens`` (``usage``; None when absent), ``t_send`` (``perf_counter`` at the
        send) and ``chunk_texts`` (each content chunk's text), and :func:`workbench.measure.reading.reader_metrics` of the
        chunks. ``chunk_stamps``, ``chunk_texts`` and ``t_send`` are for the caller, not for a table.
    """
    import httpx

    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    headers = None
    if ep is not None:
        body.update(model=ep.model, stream_options={"include_usage": True}, **ep.extra_body)
        headers = ep.headers() or None
    tmo = httpx.Timeout(timeout, read=read_timeout) if read_timeout else httpx.Timeout(timeout)
    client = http_client(tmo)  # built before the clock starts: the send is what is timed, not the client
    try:
        with client:
            reply = stream_reply(client, base_url + path, body, headers,
                                 on_content=first_chunk.set if first_chunk is not None else None)
    finally:
        if first_chunk is not None:
            first_chunk.set()
    if reply.error and not reply.timed_out:   # refused, or broken: the caller's error, as before
        raise reply.exception
    outcome = "timeout" if reply.timed_out else "ok"
    error = f"{type(reply.exception).__name__} after {reply.t_end - reply.t_send:.2f} s" if reply.timed_out else None
    stamps, parts, reads, read_of, engine = reply.stamps, reply.texts, reply.reads, reply.read_of, reply.engine
    t_send, t_end, finish = reply.t_send, reply.t_end, reply.finish_reason
    tm = metrics.request_timing(stamps, t_send)
    nan = float("nan")
    e2e_engine = (engine or {}).get("e2e_s") or nan
    out_tok = (engine or {}).get("output_tokens")
    if out_tok is None and reply.usage:
        out_tok = reply.output_tokens
    return {
        "ttft_s": tm["ttft_s"], "e2e_s": tm["e2e_s"] if stamps else t_end - t_send, "chunk_itl_s": tm["itl_s"],
        "chunk_offsets_s": [t - t_send for t in stamps], "chunk_stamps": stamps, "chunks": len(stamps),
        "keepalives": reply.keepalives, "text": reply.text, "output_tokens": out_tok,
        "engine_ttft_s": (engine or {}).get("engine_ttft_s") or nan, "engine_e2e_s": e2e_engine,
        "first_after_last": bool(stamps) and tm["ttft_s"] >= e2e_engine if e2e_engine == e2e_engine else None,
        "first_read_bytes": sum(reads[:read_of[0]]) if stamps else 0,
        "first_read_chunks": read_of.count(read_of[0]) if stamps else 0, "response_bytes": sum(reads),
        "outcome": outcome, "error": error, "finish_reason": finish,
        "prompt_tokens": reply.prompt_tokens, "t_send": t_send, "chunk_texts": parts,
        **reading.reader_metrics(list(zip(stamps, parts)), t_send, stall_s),
    }
