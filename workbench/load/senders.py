"""Senders for the load generator: how one request of a load run is sent and timed, over HTTP or straight into an engine.

Each builds a ``send(spec, t_scheduled) -> row`` for :func:`workbench.load.load.run_load`:
:func:`http_sender` (an OpenAI-compatible streaming endpoint over ``httpx``, with the client's patience
:class:`_Patience`), :func:`engine_sender` (a :mod:`workbench.serving.engines` engine in process, no HTTP),
:func:`retrying_sender` (honours ``Retry-After`` on a refused row), and :func:`with_patience` (specs whose clients
abandon their request). Latencies count from the scheduled time (no coordinated omission; see
:mod:`workbench.load.load`); token counts come from the server's ``usage`` or the engine's token ids.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from typing import Callable, Sequence

import numpy as np

from workbench import checks
from workbench.load.load import RequestSpec
from workbench.stats import metrics


def http_sender(base_url: str, model: str | None = None, timeout: float = 600.0, temperature: float = 0.0,
                ignore_eos: bool = True, client=None, headers: dict | None = None,
                extra_body: dict | None = None) -> Callable:
    """A ``send(spec, t_scheduled) -> row`` over an OpenAI-compatible streaming endpoint (``httpx``, the reply read by
    :func:`workbench.load.client.stream_reply`, the one stream loop).

    Client-side ``ttft_s`` / ``e2e_s`` are from the scheduled time to the first / last content chunk
    (:func:`workbench.stats.metrics.request_timing` over chunk arrival times); ``chunk_itl_s`` are chunk gaps
    (a chunk is not a token). ``output_tokens`` is the server's ``usage.completion_tokens``; ``tpot_s``,
    ``itl_s``, ``queue_s`` and ``prefill_s`` are the engine's per-token-id figures from the final chunk's
    ``engine`` field when the server sends them (NaN when it does not; ``tpot_s`` is then the client's, over the
    same decode steps as ``decode_tps``). ``decode_tps`` (the user's decode
    speed) is the ``usage`` tokens after the first over the client's first-to-last content chunk time. ``text``
    is the streamed content joined. ``t_headers`` is when the response headers arrived.

    The ``httpx`` client ignores ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` (``trust_env=False``):
    a proxy in the environment must not reroute or time loopback traffic. ``client``: an ``httpx.Client``
    to use instead (its own settings apply). ``headers``: sent with every request (an external endpoint's
    ``Authorization``, :mod:`workbench.load.endpoint`); ``extra_body``: fields merged into every request body.

    A server whose stream carries no ``usage`` (it ignores ``stream_options``): ``output_tokens`` falls back to
    the number of content chunks and ``token_count_source`` says ``chunks`` (else ``usage``). ``cached_tokens`` is
    ``usage.prompt_tokens_details.cached_tokens`` (None when the server sends none).

    **Abandonment** (a spec's ``patience_s``, :func:`with_patience`; AIPerf's request cancellation): when no content
    token has arrived ``patience_s`` seconds after the request's scheduled time, the client gives up and closes its
    connection (:class:`_Patience`: the socket is shut down, which wakes the blocked read and tells the server, whose
    disconnect watch cancels the request and frees its place). The row then has ``abandoned`` True,
    ``finish_reason`` ``abandoned``, no error and no output tokens, as :func:`engine_sender` writes it (``abandoned``
    is False on every other row). Such a request goes over a connection of its own (a client without keep-alive,
    built like the default one), so exactly that connection is closed; with a caller's ``client`` a pooled
    connection may be reused, and then it is closed at the first byte after the deadline instead.
    """
    import httpx

    from workbench.load.client import http_client, stream_reply
    from workbench.serving.protocol import SERVED_MODEL

    http = client or http_client(timeout, limits=httpx.Limits(max_connections=1024, max_keepalive_connections=64))
    # a patient request's own connection: opened for it (the trace sees it), closed when it gives up
    patient_http = client or http_client(timeout, limits=httpx.Limits(max_connections=1024,
                                                                      max_keepalive_connections=0))
    url = base_url.rstrip("/") + "/v1/chat/completions"

    def send(spec: RequestSpec, t_scheduled: float) -> dict:
        messages = [{"role": "user", "content": spec.prompt}] if isinstance(spec.prompt, str) else list(spec.prompt)
        body = {"model": model or SERVED_MODEL, "messages": messages, "max_tokens": spec.max_tokens,
                "temperature": temperature, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": ignore_eos, **(extra_body or {})}
        if getattr(spec, "priority", 0):
            body["priority"] = spec.priority
        patience = getattr(spec, "patience_s", None)
        give_up = _Patience(t_scheduled + patience) if patience is not None else None
        reply = stream_reply(patient_http if give_up else http, url, body, headers, patience=give_up)
        row = {"t_sent": reply.t_send}
        if reply.t_headers is not None:
            row["t_headers"] = reply.t_headers
        if reply.status not in (None, 200):
            row.update(_refusal(reply.status, reply.retry_after))
        if reply.error:
            row["error"] = reply.error
        row["t_done"] = reply.t_end
        stamps, parts, engine, usage, finish = reply.stamps, reply.texts, reply.engine, reply.usage, reply.finish_reason
        row["abandoned"] = bool(give_up and give_up.finish())
        if row["abandoned"]:  # the client closed the connection: no error, nothing to retry, nothing received
            row["error"], finish, usage, engine, stamps, parts = None, "abandoned", None, {}, [], []
            for k in ("http_status", "retry_after_s"):
                row.pop(k, None)
        row.setdefault("error", None)
        timing = metrics.request_timing(stamps, t_scheduled)
        n_out = usage.get("completion_tokens") if usage else None
        row["token_count_source"] = "usage" if n_out is not None else "chunks"
        if n_out is None and stamps and not row.get("error"):  # no usage in the stream: count content chunks
            n_out = len(stamps)
        nan = float("nan")
        # the user's decode speed: tokens after the first (usage) over the client's first-to-last chunk time
        per_user = metrics.request_timing(stamps, t_scheduled, decode_steps=int(n_out) - 1) \
            if n_out and stamps and not row.get("error") else {"decode_tps": nan, "tpot_s": nan}
        row["decode_tps"] = per_user["decode_tps"]
        # a server without engine figures (an external endpoint): TPOT from the client, the usage tokens after the
        # first over the first-to-last chunk time (the same decode steps as decode_tps)
        client_tpot = per_user["tpot_s"]
        row.update(ttft_s=timing["ttft_s"], e2e_s=row["t_done"] - t_scheduled, chunk_itl_s=timing["itl_s"],
                   chunks=len(stamps), output_tokens=int(n_out) if n_out is not None else 0,
                   prompt_tokens=usage.get("prompt_tokens") if usage else spec.prompt_tokens, finish_reason=finish,
                   tpot_s=engine.get("tpot_s", nan) if engine else client_tpot, itl_s=engine.get("itl_s") or [],
                   queue_s=engine.get("queue_s", nan) if engine else nan, text="".join(parts),
                   prefill_s=engine.get("prefill_s", nan) if engine else nan,
                   engine_ttft_s=engine.get("engine_ttft_s", engine.get("ttft_s", nan)) if engine else nan,
                   cached_tokens=((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens"))
        if row.get("error") or n_out is None:
            row["output_tokens"] = 0 if row.get("error") else row["output_tokens"]
        for k in ("tpot_s", "queue_s", "engine_ttft_s", "prefill_s"):
            row[k] = nan if row[k] is None else row[k]
        return row

    return send


class _Patience:
    """A client's patience for one HTTP request (:func:`http_sender`): at ``deadline`` (``perf_counter``), unless a
    content token came first, the client gives up: :attr:`abandoned` is set and the request's connection is shut
    down (``socket.shutdown``: the blocked read wakes with an error and the server sees the disconnect).

    The connection comes from ``httpcore``'s ``trace`` extension (:meth:`trace`, when the connection is opened) or
    the response's ``network_stream`` (:meth:`attach`, when the headers came); one that is not known yet at the
    deadline is shut down the moment it is. :meth:`finish` ends the wait (no abandonment after it).
    """

    def __init__(self, deadline: float):
        self.abandoned = False
        self._content = self._finished = False
        self._stream = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.perf_counter()), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def trace(self, event: str, info: dict) -> None:
        """``httpcore``'s trace callback: keeps the network stream of a connection opened for the request."""
        if event == "connection.connect_tcp.complete":
            self.attach(info.get("return_value"))

    def attach(self, stream) -> None:
        """The request's network stream (shut down at once when the client already gave up)."""
        with self._lock:
            if stream is not None:
                self._stream = stream
            cut = self.abandoned
        if cut:
            self._cut()

    def got_content(self) -> bool:
        """A content token arrived: True when it counts (the client still waited), False when it came too late."""
        with self._lock:
            self._content = not self.abandoned
            return self._content

    def finish(self) -> bool:
        """The request ended (answer, error or abandonment); True when the client gave up."""
        self._timer.cancel()
        with self._lock:
            self._finished = True
            return self.abandoned

    def _expire(self) -> None:
        with self._lock:
            if self._content or self._finished:
                return
            self.abandoned = True
        self._cut()

    def _cut(self) -> None:
        import socket

        sock = self._stream.get_extra_info("socket") if self._stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


def _refusal(status: int, retry_after) -> dict:
    """``http_status`` and, for a 429 / 503 with a ``Retry-After`` in seconds, ``retry_after_s``."""
    out = {"http_status": int(status)}
    try:
        if status in (429, 503) and retry_after is not None:
            out["retry_after_s"] = max(0.0, float(retry_after))
    except ValueError:  # an HTTP-date Retry-After: not honoured (bounded retries would still stop)
        pass
    return out


def engine_sender(engine, tokenizer, settings, max_pending: int | None = None) -> Callable:
    """A ``send(spec, t_scheduled) -> row`` straight into a :mod:`workbench.serving.engines` engine (no HTTP).

    ``settings``: the :class:`~workbench.measure.generation.GenerationSettings` of every request (its
    ``max_new_tokens`` is replaced by the spec's ``max_tokens``). Latencies count from the scheduled time
    through per-token-id stamps (``ttft_s``, ``itl_s``, ``tpot_s``, ``decode_tps``); ``queue_s`` is the engine's.

    ``max_pending``: the engine's admission limit (a full engine answers like a 429: an error row with
    ``retry_after_s`` from the engine queue's backlog estimate, which :func:`retrying_sender` honours). A spec's
    ``priority`` goes on the engine request; its ``patience_s``: with no token by then the client gives up
    (:meth:`~workbench.serving.engines.BaseEngine.withdraw` with reason ``abandoned``: a waiting request frees its
    place at once) and the row has ``abandoned`` True.
    """
    from workbench.serving.engines import EngineRequest, prompt_ids

    def send(spec: RequestSpec, t_scheduled: float) -> dict:
        row = {"t_sent": time.perf_counter()}
        if isinstance(spec.prompt, (list, tuple)) and spec.prompt and isinstance(spec.prompt[0], int):
            ids = list(spec.prompt)
        else:
            ids = prompt_ids(tokenizer, spec.prompt)
        first = threading.Event()
        req = EngineRequest(ids, dataclasses.replace(settings, max_new_tokens=spec.max_tokens),
                            t_arrival=row["t_sent"], endpoint="load", priority=getattr(spec, "priority", 0),
                            on_token=lambda tok, t: first.set())
        row["t_headers"] = row["t_sent"]
        patience = getattr(spec, "patience_s", None)
        try:
            engine.submit(req, max_pending=max_pending)
            if patience is not None and not first.wait(max(0.0, t_scheduled + patience - time.perf_counter())) \
                    and not req.done.is_set():
                engine.withdraw(req, "abandoned")
                row["abandoned"] = True
            req.done.wait()
            res = req.result()
        except Exception as exc:
            res = {"error": f"{type(exc).__name__}: {exc}", "output_tokens": 0}
            if type(exc).__name__ == "EngineFull":
                backlog = getattr(getattr(engine, "queue", None), "backlog_s", None)
                est = backlog() if callable(backlog) else float("nan")
                row.update(http_status=429, retry_after_s=float(math.ceil(est)) if est == est and est > 0 else 1.0)
        row["t_done"] = time.perf_counter()
        stamps = list(req.stamps)
        timing = metrics.request_timing(stamps, t_scheduled)
        err = res.get("error")
        row.update(ttft_s=timing["ttft_s"], e2e_s=(stamps[-1] if stamps else row["t_done"]) - t_scheduled,
                   itl_s=timing["itl_s"], tpot_s=timing["tpot_s"], decode_tps=timing["decode_tps"],
                   output_tokens=0 if err else len(stamps),
                   prompt_tokens=len(ids), finish_reason=res.get("finish_reason"), queue_s=res.get("queue_s"),
                   prefill_s=res.get("prefill_s", float("nan")),
                   batch_size=res.get("batch_size"), chunks=len(stamps), error=err)
        row.setdefault("abandoned", False)
        row.update(queue_position=req.queue_position, eta_s=float("nan") if req.eta_s is None else req.eta_s,
                   cached_tokens=res.get("cached_tokens"))  # None where the engine does not report a prefix cache
        return row

    return send


def retrying_sender(send: Callable, max_retries: int = 3, max_retry_wait_s: float = 60.0,
                    sleep: Callable[[float], None] = time.sleep) -> Callable:
    """``send`` that honours ``Retry-After``: a refused row (``retry_after_s`` set: a 429 / 503, or a full engine)
    is sent again after that many seconds (capped at ``max_retry_wait_s``), at most ``max_retries`` times.

    The latency of the request still counts from its first scheduled time (the retries are part of what the user
    waits: no coordinated omission). The row records ``retries`` (resends), ``retry_wait_s`` (seconds slept on
    ``Retry-After``) and, when the last try was refused too, its error.

    Raises:
        ParameterError: ``max_retries`` < 0 or ``max_retry_wait_s`` < 0 (one line).
    """
    checks.check_int("max_retries", max_retries, lo=0)
    checks.check_float("max_retry_wait_s", max_retry_wait_s, lo=0)

    def send_retrying(spec: RequestSpec, t_scheduled: float) -> dict:
        retries, waited = 0, 0.0
        while True:
            row = send(spec, t_scheduled)
            after = row.get("retry_after_s")
            if after is None or after != after or retries >= max_retries:
                break
            pause = min(float(after), max_retry_wait_s)
            sleep(pause)
            retries, waited = retries + 1, waited + pause
        t_sent = row.get("t_sent")
        row.update(retries=retries, retry_wait_s=waited)
        if retries and t_sent is not None:  # e2e counts from the first scheduled time: the send() row already does
            row["t_sent_last"] = t_sent
        return row

    return send_retrying


def with_patience(specs: Sequence[RequestSpec], share: float, patience_s: float, seed: int = 0) -> list[RequestSpec]:
    """Copies of ``specs`` where a random ``share`` of clients (a fixed ``seed`` picks them) abandon their request
    when no token arrived ``patience_s`` seconds after its scheduled time (AIPerf's request cancellation). Both
    senders honour it: :func:`engine_sender` withdraws the request from the engine, :func:`http_sender` closes its
    connection (the server then withdraws it); either row has ``abandoned`` True.

    Raises:
        ParameterError: ``share`` outside [0, 1] or ``patience_s`` <= 0 (one line).
    """
    checks.check_float("share", share, lo=0, hi=1)
    checks.check_float("patience_s", patience_s, lo=0, lo_open=True)
    rng = np.random.default_rng(seed)
    pick = rng.random(len(specs)) < share
    return [dataclasses.replace(s, patience_s=patience_s if p else None) for s, p in zip(specs, pick)]
