"""Prometheus monitoring of the serving app: ``GET /metrics`` (the ``prometheus-client`` library).

Each app has its own :class:`Monitor` with its own ``CollectorRegistry`` (two servers in one process never
share counts). Metric names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) with the prefix
``workbench_``:

- ``workbench_time_to_first_token_seconds`` (histogram): request arrival at the handler to the first
  generated token id (the engine TTFT, queueing included);
- ``workbench_inter_token_latency_seconds`` (histogram): every gap between consecutive generated token ids
  (:func:`workbench.metrics.request_timing` over the request's token stamps);
- ``workbench_e2e_request_latency_seconds`` (histogram): arrival to the last token;
- ``workbench_generation_tokens_total`` (counter): generated token ids, EOS included;
- ``workbench_requests_total{finish_reason}`` (counter): finished requests by finish reason (``length``,
  ``stop``, ``cancelled``, ``timeout``, ``error``); ``workbench_requests_rejected_total`` (counter): 429s
  from a full queue;
- ``workbench_num_requests_running`` / ``workbench_num_requests_waiting`` (gauges, read at scrape time):
  accepted requests that have produced a token / that have not yet (queued or in prefill);
  ``workbench_queue_length`` (gauge): requests in the engine's queue, not yet taken by its worker.

Chat requests are observed by wrapping the engine's ``submit`` (every engine of the server has one):
the wrapped job's final ``done`` event is counted once. Background jobs (:mod:`workbench.serving.jobs`)
report through :meth:`Monitor.observe` with ``endpoint="jobs"``; chat requests are ``endpoint="chat"``.
"""

from __future__ import annotations

import threading

from .. import metrics

# seconds; TTFT and e2e buckets span loopback CPU runs to long generations, ITL buckets decode steps
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class Monitor:
    """The Prometheus metrics of one app (see the module docstring).

    Args:
        engine: the app's engine (``submit``; ``queue`` when it has one).
    """

    def __init__(self, engine=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram("workbench_time_to_first_token_seconds", "Arrival to the first generated token id",
                              ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("workbench_inter_token_latency_seconds", "Gaps between consecutive generated token ids",
                             ["endpoint"], buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("workbench_e2e_request_latency_seconds", "Arrival to the last generated token id",
                             ["endpoint"], buckets=E2E_BUCKETS, registry=r)
        self.tokens = Counter("workbench_generation_tokens", "Generated token ids (EOS included)", ["endpoint"],
                              registry=r)
        self.requests = Counter("workbench_requests", "Finished requests by finish reason",
                                ["endpoint", "finish_reason"], registry=r)
        self.rejected = Counter("workbench_requests_rejected", "Requests refused with 429 (queue full)", registry=r)
        self._lock = threading.Lock()
        self._in_flight: dict[str, object] = {}
        self.engine = engine
        running = Gauge("workbench_num_requests_running", "Accepted requests that have produced a token",
                        registry=r)
        waiting = Gauge("workbench_num_requests_waiting", "Accepted requests without a token yet (queued or prefill)",
                        registry=r)
        qlen = Gauge("workbench_queue_length", "Requests in the engine queue, not yet taken by its worker",
                     registry=r)
        running.set_function(lambda: self._count(True))
        waiting.set_function(lambda: self._count(False))
        qlen.set_function(self._queue_length)

    def _count(self, started: bool) -> int:
        with self._lock:
            jobs = list(self._in_flight.values())
        return sum(1 for j in jobs if (getattr(j, "t_first", None) is not None) == started)

    def _queue_length(self) -> int:
        q = getattr(self.engine, "queue", None)
        if q is not None and hasattr(q, "qsize"):
            return q.qsize()
        return self._count(False)

    def observe(self, ttft_s: float | None, itl_s, e2e_s: float | None, output_tokens: int, finish_reason: str,
                endpoint: str = "chat") -> None:
        """Count one finished request (NaN / None times are not observed)."""
        if ttft_s is not None and ttft_s == ttft_s:
            self.ttft.labels(endpoint).observe(ttft_s)
        for gap in itl_s or ():
            self.itl.labels(endpoint).observe(gap)
        if e2e_s is not None and e2e_s == e2e_s:
            self.e2e.labels(endpoint).observe(e2e_s)
        self.tokens.labels(endpoint).inc(int(output_tokens or 0))
        self.requests.labels(endpoint, finish_reason or "unknown").inc()

    def track(self, job) -> None:
        """Watch a server job (:class:`workbench.serving.server.Job`) until its ``done`` / ``error`` event."""
        emit = job.emit
        seen = threading.Event()

        def watched(kind, payload):
            if kind in ("done", "error") and not seen.is_set():
                seen.set()
                with self._lock:
                    self._in_flight.pop(job.id, None)
                try:
                    self._observe_job(job, kind, payload)
                except Exception:  # noqa: BLE001 - monitoring never breaks a response
                    pass
            return emit(kind, payload)

        job.emit = watched
        with self._lock:
            self._in_flight[job.id] = job

    def untrack(self, job) -> None:
        with self._lock:
            self._in_flight.pop(job.id, None)

    def _observe_job(self, job, kind, info) -> None:
        if kind == "error":
            self.requests.labels("chat", "error").inc()
            return
        stamps = list(getattr(job, "stamps", None) or [])
        timing = metrics.request_timing(stamps, job.t_arrival) if stamps else None
        itl = info.get("itl_s") if isinstance(info.get("itl_s"), list) else (timing["itl_s"] if timing else [])
        ttft = info.get("engine_ttft_s")
        if ttft is None or ttft != ttft:
            ttft = timing["ttft_s"] if timing else None
        e2e = timing["e2e_s"] if timing else info.get("e2e_s")
        if not info.get("output_tokens"):
            ttft = e2e = None  # no token: nothing to time
        self.observe(ttft, itl, e2e, info.get("output_tokens") or 0, info.get("finish_reason") or "stop", "chat")

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def install(app, engine) -> Monitor:
    """Wrap ``engine.submit`` to observe every chat request and add ``GET /metrics`` to ``app``."""
    from fastapi.responses import Response

    mon = Monitor(engine)
    submit = engine.submit

    def monitored_submit(job, max_pending=None):
        mon.track(job)
        ok = submit(job, max_pending)
        if not ok:
            mon.untrack(job)
            mon.rejected.inc()
        return ok

    engine.submit = monitored_submit

    @app.get("/metrics")
    async def prometheus_metrics():
        body, ctype = mon.exposition()
        return Response(body, media_type=ctype.split(";")[0], headers={"Content-Type": ctype, "Cache-Control": "no-cache"})

    return mon


def scrape(text: str) -> dict[str, float]:
    """Parse a Prometheus text exposition into ``{"name{labels}": value}`` (samples as written)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
