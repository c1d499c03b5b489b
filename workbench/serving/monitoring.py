"""Prometheus monitoring of the serving app: ``GET /metrics`` (the ``prometheus-client`` library).

Each app has its own :class:`Monitor` with its own ``CollectorRegistry`` (two servers in one process never
share counts). Metric names follow vLLM's (``vllm:time_to_first_token_seconds`` ...) with the prefix
``workbench_``:

- ``workbench_time_to_first_token_seconds`` (histogram): request arrival at the handler to the first
  generated token id (the engine TTFT, queueing included);
- ``workbench_inter_token_latency_seconds`` (histogram): every gap between consecutive generated token ids
  (:func:`workbench.stats.metrics.request_timing` over the request's token stamps);
- ``workbench_e2e_request_latency_seconds`` (histogram): arrival to the last token;
- ``workbench_generation_tokens_total`` (counter): generated token ids, EOS included;
- ``workbench_requests_total{finish_reason}`` (counter): finished requests by finish reason (``length``,
  ``stop``, ``cancelled``, ``timeout``, ``error``); ``workbench_requests_rejected_total`` (counter): 429s
  from a full queue;
- ``workbench_num_requests_running`` / ``workbench_num_requests_waiting`` (gauges, read at scrape time):
  accepted requests that have produced a token / that have not yet (queued or in prefill);
  ``workbench_queue_length`` (gauge): requests in the engine's queue, not yet taken by its worker.

The monitor subscribes to the engine's completions (an observer in
:attr:`workbench.serving.engines.BaseEngine.observers`): every finished engine request is counted once, under
its ``endpoint`` label (``chat`` for ``/v1/chat/completions``, ``jobs`` for :mod:`workbench.serving.jobs`).
The gauges and the rejected count are read from the engine at scrape time (``in_flight``, ``queue``,
``rejected``).
"""

from __future__ import annotations

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

# seconds; TTFT and e2e buckets span loopback CPU runs to long generations, ITL buckets decode steps
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


class Monitor:
    """The Prometheus metrics of one app (see the module docstring).

    Args:
        engine: the app's :class:`workbench.serving.engines.BaseEngine`; the monitor adds itself to its
            ``observers``.
    """

    def __init__(self, engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client.core import CounterMetricFamily

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
        self.engine = engine

        class _Rejected:  # a counter owned by the engine, read at scrape time
            def collect(self_inner):
                yield CounterMetricFamily("workbench_requests_rejected", "Requests refused with 429 (queue full)",
                                          value=engine.rejected)

            def describe(self_inner):
                return list(self_inner.collect())

        r.register(_Rejected())
        running = Gauge("workbench_num_requests_running", "Accepted requests that have produced a token",
                        registry=r)
        waiting = Gauge("workbench_num_requests_waiting", "Accepted requests without a token yet (queued or prefill)",
                        registry=r)
        qlen = Gauge("workbench_queue_length", "Requests in the engine queue, not yet taken by its worker",
                     registry=r)
        running.set_function(lambda: self._count(True))
        waiting.set_function(lambda: self._count(False))
        qlen.set_function(lambda: self.engine.queue.qsize())
        engine.observers.append(self.on_complete)

    def _count(self, started: bool) -> int:
        reqs = list(self.engine.in_flight.values())
        return sum(1 for q in reqs if bool(q.stamps) == started)

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

    def on_complete(self, req, result: dict) -> None:
        """The engine observer: count one finished engine request (``result``: its
        :meth:`~workbench.serving.engines.EngineRequest.result`)."""
        endpoint = req.endpoint or "chat"
        if result.get("finish_reason") == "error":
            self.requests.labels(endpoint, "error").inc()
            return
        n = result.get("output_tokens") or 0
        ttft, e2e = (result.get("ttft_s"), result.get("e2e_s")) if n else (None, None)  # no token: nothing to time
        self.observe(ttft, result.get("itl_s") or [], e2e, n, result.get("finish_reason") or "stop", endpoint)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


async def prometheus_metrics(request: Request):
    """``GET /metrics``: the exposition of ``request.app.state.monitor``."""
    from fastapi.responses import Response

    body, ctype = request.app.state.monitor.exposition()
    return Response(body, media_type=ctype.split(";")[0], headers={"Content-Type": ctype, "Cache-Control": "no-cache"})


def install(app, engine) -> Monitor:
    """Subscribe a :class:`Monitor` to ``engine`` (``app.state.monitor``) and add ``GET /metrics`` to ``app``."""
    app.state.monitor = Monitor(engine)
    app.add_api_route("/metrics", prometheus_metrics, methods=["GET"])
    return app.state.monitor


def scrape(text: str) -> dict[str, float]:
    """Parse a Prometheus text exposition into ``{"name{labels}": value}`` (samples as written)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
