"""The load generator (issue 13): schedules, open loop under a stalled server, windows, saturation, bad input."""
import json
import threading
import time

import numpy as np
import pandas as pd
import pytest

from workbench import ParameterError, metrics, slo
from workbench.serving import load
from workbench.serving.load import RequestSpec

SPECS = [RequestSpec("hi", 4) for _ in range(12)]


def _one_line(exc, name):
    assert str(exc.value).startswith(name) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize("kwargs,name", [
    ({"profile": "bursty"}, "profile:"),
    ({"profile": "poisson", "rate": 0}, "rate:"),
    ({"profile": "constant", "rate": -1.0}, "rate:"),
    ({"profile": "poisson"}, "rate:"),
    ({"profile": "gamma", "rate": 1.0, "burstiness": 0}, "burstiness:"),
    ({"profile": "gamma", "rate": 1.0, "burstiness": -2.0}, "burstiness:"),
    ({"profile": "concurrency", "concurrency": 0}, "concurrency:"),
])
def test_bad_profile_input_is_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        load.check_profile(**kwargs)
    _one_line(err, name)


def test_unknown_slo_preset_is_one_line():
    with pytest.raises(ParameterError) as err:
        slo.get("chatbot_gold")
    _one_line(err, "slo:")
    with pytest.raises(ParameterError) as err:
        slo.get("custom", ttft_s=-1.0)
    _one_line(err, "slo_ttft_s:")


@pytest.mark.parametrize("lines,match", [
    ([{"offset_s": 0, "prompt_tokens": 8, "output_tokens": 4}, {"offset_s": 2, "prompt_tokens": 8, "output_tokens": 4},
      {"offset_s": 1, "prompt_tokens": 8, "output_tokens": 4}], "trace: line 3: offset_s 1"),
    ([{"offset_s": 0, "prompt_tokens": 8}], "trace: line 1: missing field output_tokens"),
    ([{"offset_s": 0, "prompt_tokens": 0, "output_tokens": 4}], "trace: line 1: prompt_tokens"),
])
def test_bad_trace_is_one_line(tmp_path, lines, match):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ParameterError) as err:
        load.read_trace(p)
    assert str(err.value).startswith(match) and "\n" not in str(err.value)


def test_sample_trace_reads():
    rows = load.read_trace(load.Path(__file__).resolve().parents[2] / "data" / "traces" / "sample_trace.jsonl")
    assert len(rows) >= 10 and all(set(r) == set(load.TRACE_FIELDS) for r in rows)
    offs = [r["offset_s"] for r in rows]
    assert offs == sorted(offs) and offs[0] == 0


@pytest.mark.parametrize("profile", ["constant", "poisson", "gamma"])
def test_schedule_mean_rate(profile):
    off = load.arrival_offsets(profile, 4001, rate=5.0, burstiness=0.5, seed=1)
    assert off[0] == 0 and np.all(np.diff(off) >= 0)
    assert abs(4000 / off[-1] - 5.0) / 5.0 < 0.08


def test_gamma_burstiness_one_matches_poisson_cv_and_seed_repeats():
    n = 20001
    cv = lambda off: np.std(np.diff(off)) / np.mean(np.diff(off))  # noqa: E731
    pois = load.arrival_offsets("poisson", n, rate=3.0, seed=2)
    gam1 = load.arrival_offsets("gamma", n, rate=3.0, burstiness=1.0, seed=3)
    assert abs(cv(pois) - 1.0) < 0.05 and abs(cv(gam1) - cv(pois)) < 0.05
    bursty = load.arrival_offsets("gamma", n, rate=3.0, burstiness=0.25, seed=3)
    assert abs(cv(bursty) - 2.0) < 0.15  # CV = 1 / sqrt(shape)
    assert cv(load.arrival_offsets("constant", 50, rate=3.0)) < 1e-9
    assert np.array_equal(load.arrival_offsets("gamma", 100, 2.0, 0.5, seed=7),
                          load.arrival_offsets("gamma", 100, 2.0, 0.5, seed=7))
    assert not np.array_equal(load.arrival_offsets("poisson", 100, 2.0, seed=7),
                              load.arrival_offsets("poisson", 100, 2.0, seed=8))


def _fake_server(service_s, stall_until=None):
    """A fake single-worker server: requests queue behind one another, each takes ``service_s``; optionally
    the server stalls (serves nothing) until ``stall_until`` seconds after the first call."""
    lock = threading.Lock()
    state = {"free_at": None, "t0": None}

    def send(spec, t_sched):
        t_sent = time.perf_counter()
        with lock:
            if state["t0"] is None:
                state["t0"] = t_sent
            start = max(t_sent, state["free_at"] or t_sent)
            if stall_until is not None:
                start = max(start, state["t0"] + stall_until)
            state["free_at"] = start + service_s
        time.sleep(max(0.0, start + service_s - time.perf_counter()))
        t_done = time.perf_counter()
        timing = metrics.request_timing([t_done], t_sched)
        return {"t_sent": t_sent, "t_done": t_done, "ttft_s": timing["ttft_s"], "e2e_s": timing["e2e_s"],
                "tpot_s": float("nan"), "output_tokens": spec.max_tokens, "itl_s": []}

    return send


def test_open_loop_keeps_schedule_while_server_stalls():
    """The server serves nothing for 0.6 s: arrivals still go out on time, and latency counts from the schedule."""
    specs = [RequestSpec("x", 2) for _ in range(8)]
    res = load.run_load(_fake_server(0.01, stall_until=0.6), specs, "constant", rate=20.0)
    df = pd.DataFrame(res.rows).sort_values("request_id")
    assert len(df) == 8
    assert (df["late_s"] < 0.05).all()  # every request sent within 50 ms of its scheduled time
    assert np.allclose(df["t_scheduled_s"], np.arange(8) / 20.0, atol=1e-6)
    # the first request waited out the stall: its TTFT counts from its scheduled time (~0.6 s)
    assert df["ttft_s"].iloc[0] > 0.55
    assert df["ttft_s"].iloc[-1] > 0.55 - 7 / 20.0 - 0.02


def test_closed_loop_waits_for_the_server():
    specs = [RequestSpec("x", 2) for _ in range(4)]
    res = load.run_load(_fake_server(0.05), specs, "synchronous")
    df = pd.DataFrame(res.rows).sort_values("request_id")
    assert np.all(np.diff(df["t_start_s"]) >= 0.045)  # each starts after the previous finished
    assert res.summary["saturation_rule"].startswith("none")


def test_warmup_and_cooldown_exclusion_by_start_and_finish():
    rows = [{"t_start_s": s, "t_end_s": e} for s, e in [(0.0, 1.0), (0.5, 1.5), (1.0, 2.0), (2.0, 3.0), (2.5, 4.0)]]
    w = load.apply_window(rows, warmup_s=0.6, cooldown_s=1.5)
    assert [r["kept"] for r in rows] == [False, False, True, False, False]
    assert w["window_start_s"] == 0.6 and w["window_end_s"] == 2.5
    assert w["excluded_warmup"] == 2 and w["excluded_cooldown"] == 2 and w["wall_s"] == 1.0


def test_oversaturation_stops_early_with_recorded_rule():
    specs = [RequestSpec("x", 2) for _ in range(40)]
    res = load.run_load(_fake_server(0.2), specs, "constant", rate=50.0, max_in_flight=5)
    assert res.summary["stopped_early"] and "max_in_flight 5" in res.summary["stop_reason"]
    assert res.summary["requests_sent"] < 40 and "in flight > 5" in res.summary["saturation_rule"]


def test_time_slices_count_completions():
    rows = [{"t_start_s": i * 0.5, "t_end_s": i * 0.5 + 0.4, "output_tokens": 3, "ttft_s": 0.1} for i in range(8)]
    sl = load.time_slices(rows, slice_s=1.0)
    assert list(sl["completed"]) == [2, 2, 2, 2] and sl["output_tokens"].sum() == 24


def test_attainment_counts_failed_requests_as_misses():
    req = pd.DataFrame({"ttft_s": [0.1, 0.2, 5.0, float("nan")], "tpot_s": [0.01, 0.02, 0.01, float("nan")],
                        "output_tokens": [4, 4, 4, 0], "error": [None, None, None, "HTTP 500"]})
    assert metrics.slo_attainment(req, 1.0, 0.05) == 0.5
    ev = slo.evaluate(req, slo.get("custom", 1.0, 0.05), wall_s=2.0)
    assert ev["slo_attainment"] == 0.5 and ev["goodput_rps"] == 1.0 and ev["percentiles_ok"] is False
    assert slo.evaluate(req.iloc[:2], slo.get("batch_offline"), 1.0)["slo_attainment"] == 1.0


def test_search_brackets_a_synthetic_knee():
    knee = 3.7
    calls = []

    def attainment(rate):
        calls.append(rate)
        return 1.0 if rate <= knee else 0.5

    out = slo.search_rate(attainment, 0.5, 10.0, target=0.99, tolerance=0.02, max_steps=20)
    good, bad = out["bracket"]
    assert out["bracketed"] and good <= knee < bad and (bad - good) <= 0.02 * good
    assert out["rate"] == good and out["steps"] == len(calls)
    assert slo.search_rate(lambda r: 1.0, 1.0, 2.0)["rate"] == 2.0
    assert slo.search_rate(lambda r: 0.0, 1.0, 2.0)["rate"] == 0.0


def test_knee_and_sweep_rates():
    assert metrics.saturation_knee([1, 2, 3, 4], [1, 1.95, 2.5, 2.6]) == 2
    rates = load.sweep_rates(1.0, 4.0, 2)
    assert rates == [2.0, 3.0]


class _FakeSSE:
    """A stdlib HTTP server answering ``POST /v1/chat/completions`` with a fixed SSE stream (no model): two
    content chunks, a final chunk with the engine's figures, a usage chunk counting 3 tokens, ``[DONE]``."""

    def __enter__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = [{"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
                          {"choices": [{"delta": {"content": "lo"}, "finish_reason": None}]},
                          {"choices": [{"delta": {}, "finish_reason": "length"}],
                           "engine": {"queue_s": 0.01, "prefill_s": 0.02, "tpot_s": 0.03, "itl_s": [0.03, 0.03],
                                      "engine_ttft_s": 0.05}},
                          {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}]
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_http_sender_ignores_a_dead_proxy_in_the_environment(monkeypatch):
    """HTTP_PROXY / ALL_PROXY point at a port nothing listens on: a client trusting the environment fails, the
    load generator's sender (trust_env=False) still reaches the loopback server; counts come from usage."""
    import httpx

    for k in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(k, "http://127.0.0.1:9")
    with _FakeSSE() as srv:
        with pytest.raises(httpx.HTTPError):
            httpx.post(srv.base_url + "/v1/chat/completions", json={}, timeout=5)
        row = load.http_sender(srv.base_url, timeout=10)(RequestSpec("hi", 3), time.perf_counter())
    assert row["error"] is None, row["error"]
    assert row["text"] == "Hello" and row["chunks"] == 2 and row["output_tokens"] == 3  # usage, not chunks
    assert row["prefill_s"] == 0.02 and row["queue_s"] == 0.01 and row["tpot_s"] == 0.03


def test_flow_rates_tell_keeping_up_from_falling_behind():
    """Arrivals every 0.5 s; a server that keeps up finishes every 0.5 s, a saturated one every 1 s."""
    up = [{"t_scheduled_s": i * 0.5, "t_end_s": i * 0.5 + 0.3} for i in range(6)]
    behind = [{"t_scheduled_s": i * 0.5, "t_end_s": 1.0 + i * 1.0} for i in range(6)]
    assert load.flow_rates(up) == pytest.approx({"arrival_rps": 2.0, "completion_rps": 2.0})
    assert load.flow_rates(behind) == pytest.approx({"arrival_rps": 2.0, "completion_rps": 1.0})
    rows = [dict(r, error="HTTP 500" if i == 5 else None) for i, r in enumerate(behind)]
    assert load.flow_rates(rows)["completion_rps"] == pytest.approx(1.0)  # failed requests did not complete
    one = load.flow_rates(up[:1])
    assert one["arrival_rps"] != one["arrival_rps"] and one["completion_rps"] != one["completion_rps"]  # NaN
    assert metrics.saturation_knee([1.0, 2.0], [load.flow_rates(up)["completion_rps"] / 2,
                                                load.flow_rates(behind)["completion_rps"]]) == 1.0
