"""Tests for workbench.serving.monitoring: the Prometheus /metrics endpoint, scraped after known requests."""

import httpx
import pytest

from workbench.serving.monitoring import scrape
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model


def test_metrics_counts_match_the_requests_sent(loaded):
    sizes = [3, 5, 4, 2]
    with ServerThread(loaded) as srv:
        url = srv.base_url + "/v1/chat/completions"
        for i, n in enumerate(sizes):
            body = {"messages": [{"role": "user", "content": f"Count to {i + 3}."}], "max_tokens": n,
                    "ignore_eos": True, "temperature": 0, "stream": i % 2 == 0}
            r = httpx.post(url, json=body, timeout=120)
            assert r.status_code == 200
        assert srv.engine.wait_idle(60)
        resp = httpx.get(srv.base_url + "/metrics", timeout=30)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    m = scrape(resp.text)
    chat = 'endpoint="chat"'
    assert m[f"workbench_requests_total{{{chat},finish_reason=\"length\"}}"] == len(sizes)
    assert m[f"workbench_time_to_first_token_seconds_count{{{chat}}}"] == len(sizes)
    assert m[f"workbench_e2e_request_latency_seconds_count{{{chat}}}"] == len(sizes)
    assert m[f"workbench_inter_token_latency_seconds_count{{{chat}}}"] == sum(n - 1 for n in sizes)
    assert m[f"workbench_generation_tokens_total{{{chat}}}"] == sum(sizes)
    assert m[f"workbench_time_to_first_token_seconds_sum{{{chat}}}"] > 0
    assert m["workbench_num_requests_running"] == 0 and m["workbench_num_requests_waiting"] == 0
    assert m["workbench_queue_length"] == 0
    inf = m[f'workbench_e2e_request_latency_seconds_bucket{{{chat},le="+Inf"}}']
    assert inf == len(sizes)
