"""Experiment 10 (streaming to a reader): config, the generated nginx config, and a tiny real run (nginx or skip)."""
import pytest

from workbench import ParameterError
from workbench.run import results
from workbench.experiments import streaming_reader as sr
from workbench.serving import client
from workbench.serving.proxy import NGINX_MODES, Nginx, nginx_config, nginx_status


@pytest.mark.parametrize("kwargs,name", [
    ({"languages": ["fr"]}, "languages"),
    ({"proxy_modes": ["squid"]}, "proxy_modes"),
    ({"granularities": ["sometimes"]}, "granularity"),
    ({"keepalive_s": 2.0, "client_timeout_s": 1.0}, "keepalive_s"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"nginx_buffer_kb": 2}, "nginx_buffer_kb"),
    ({"nginx_upstream_http": "2"}, "nginx_upstream_http"),
])
def test_invalid_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        sr.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_nginx_config_per_mode_is_loopback_only():
    confs = {m: nginx_config(m, 18080, 18000, "/tmp/x") for m in NGINX_MODES}
    assert all("listen 127.0.0.1:18080;" in c and "proxy_pass http://127.0.0.1:18000;" in c for c in confs.values())
    assert "proxy_buffering off;" in confs["buffering_off"]
    assert "proxy_buffering on;" in confs["header"] and "proxy_ignore_headers" not in confs["header"]
    assert "proxy_ignore_headers X-Accel-Buffering;" in confs["buffering_on"]
    assert "proxy_ignore_headers X-Accel-Buffering;" in confs["buffering_default"]
    assert all("proxy_buffers 8 64k;" in confs[m] for m in ("buffering_on", "buffering_off", "header"))
    assert "proxy_buffers" not in confs["buffering_default"] and "proxy_buffer_size" not in confs["buffering_default"]
    assert all("proxy_http_version 1.0;" in c for c in confs.values())
    assert "proxy_http_version 1.1;" in nginx_config("header", 1, 2, "/tmp/x", upstream_http="1.1")


@pytest.mark.model
def test_tiny_run_measures_through_nginx_or_skips_with_the_reason(loaded):
    cfg = sr.Config(max_new_tokens=6, languages=["en"], granularities=["token", "100 ms"], warmup=0,
                    client_timeout_s=0.3, keepalive_s=0.1, blocker_tokens=16)
    binary, reason = nginx_status()
    run = results.create_run()
    points = sr.run(cfg, run, loaded)
    assert (points["status"] == "ok").all(), points["status"].tolist()
    reader = points[points["part"] == "reader"]
    assert (reader["requests"] == cfg.repeats).all()  # each generation once, not once per granularity
    req = results.read_requests(run, experiment=sr.EXPERIMENT)
    proxied = set(req.loc[req["part"] == "proxy", "proxy"])
    note = (run / f"{sr.EXPERIMENT}_nginx.txt").read_text()
    if binary is None:
        assert proxied == {"direct"} and reason in note
        pytest.skip(f"nginx part skipped: {reason}")
    assert proxied == set(sr.PROXY_MODES)
    px = req[req["part"] == "proxy"]
    assert (px["chunks"] > 0).all() and (px["ttft_s"] > 0).all()
    assert px["text"].nunique() == 1  # the same greedy text through every path
    rd = req[req["part"] == "reader"]
    assert set(rd["granularity"]) == {"token", "100 ms"} and rd["first_word_s"].notna().all()
    ka = req[req["part"] == "keepalive"]
    assert set(ka["outcome"]) <= {"ok", "timeout"} and len(ka) == 2
    assert (ka.loc[ka["keepalive"], "outcome"] == "ok").all()  # comments keep the waiting client alive
    figs = sr.figures(points, req)
    assert set(figs) == {"reader_proxy_ttft", "reader_chunk_arrival", "reader_metrics", "reader_keepalive"}
    assert "buffering_on" in sr.headline(req)
    f = sr.finding(req)
    assert "buffering on / off" in f.evidence and f"buffering_on {cfg.repeats}" in f.evidence


def test_reader_finding_claims_the_buffering_cost_only_beyond_noise(monkeypatch):
    """Client TTFT with buffering on vs off, over the proxy requests: supported when the ratio's interval excludes
    1; equal spreads around one mean are no difference; without nginx's modes it is not supported."""
    import pandas as pd

    monkeypatch.setattr(sr, "headline", lambda requests: "the headline")  # its table has a test of its own

    def req(on, off):
        rows = [{"part": "proxy", "proxy": m, "ttft_s": t, "e2e_s": t, "transport_ttft_s": 0.0,
                 "first_after_last": m == "buffering_on"} for m, ts in (("buffering_on", on), ("buffering_off", off))
                for t in ts]
        return pd.DataFrame(rows)

    assert sr.finding(req([0.80, 0.82, 0.81], [0.25, 0.26, 0.24])).supported
    same = sr.finding(req([0.30, 0.20, 0.25], [0.26, 0.24, 0.29]))
    assert not same.supported and "no difference beyond noise" in same.evidence
    direct = pd.DataFrame([{"part": "proxy", "proxy": "direct", "ttft_s": 0.3}] * 3)
    assert not sr.finding(direct).supported


# ------------------------------------------------------------------ nginx buffering, shown (no model, no timed assertions)

class _FakeChatSSE:
    """A loopback HTTP/1.1 upstream streaming ``n`` chat chunks (~200 bytes each) ``gap_s`` apart, as the server does
    (``X-Accel-Buffering: no``, chunked); ``emitted`` holds each content chunk's ``perf_counter`` write stamp."""

    def __init__(self, n: int = 40, gap_s: float = 0.02):
        import http.server
        import json
        import threading
        import time

        fake = self
        self.emitted: list[float] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                chunked = self.request_version == "HTTP/1.1"  # an HTTP/1.0 client gets a close-delimited body
                self.send_response(200)
                for k, v in (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"),
                             ("X-Accel-Buffering", "no")):
                    self.send_header(k, v)
                self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Connection", "close")))
                self.end_headers()

                def send(obj):
                    data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                    self.wfile.flush()

                pad = "x" * 120  # the real chunk's id / model / created fields
                for i in range(n):
                    time.sleep(gap_s)
                    send({"id": pad, "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]})
                    fake.emitted.append(time.perf_counter())
                send({"id": pad, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "engine": {}})
                send("[DONE]")
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                else:
                    self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def nginx_binary():
    binary, reason = nginx_status()
    if binary is None:
        pytest.skip(f"nginx part skipped: {reason}")
    return binary


def _through_nginx(binary, upstream_http="1.0", modes=NGINX_MODES):
    """Per mode: (first chunk arrived after the upstream wrote its last one, chunks in that read, bytes by then)."""
    seen = {}
    with _FakeChatSSE(n=40) as up:
        direct = client.stream_request(f"http://127.0.0.1:{up.port}", "hi", 40)
        assert direct["chunks"] == 40
        for mode in modes:
            up.emitted.clear()
            with Nginx(mode, up.port, binary=binary, upstream_http=upstream_http) as proxy:
                row = client.stream_request(proxy.base_url, "hi", 40)
            assert row["chunks"] == 40 and row["text"] == direct["text"], mode
            seen[mode] = (row["chunk_stamps"][0] > up.emitted[-1], row["first_read_chunks"], row["first_read_bytes"])
    return seen


def test_nginx_buffering_holds_the_first_chunk_until_the_last_and_the_header_restores_it(nginx_binary):
    seen = _through_nginx(nginx_binary)
    # buffering on, the header ignored, buffers (64 KiB) larger than the answer (~9 KB): nothing before the end
    assert seen["buffering_on"][0] and seen["buffering_on"][1] == 40, seen
    # the same buffers with the server's X-Accel-Buffering: no honoured, or buffering off: the first chunk first
    assert not seen["header"][0] and not seen["buffering_off"][0], seen
    assert seen["header"][1] < 40 and seen["buffering_off"][1] < 40, seen
    # nginx's default one-page buffers: a page is sent when full, so the first read carries many chunks at once
    assert seen["buffering_default"][1] > 1 and seen["buffering_default"][2] >= 2048, seen


def test_nginx_http11_upstream_passes_each_chunk_on_even_when_buffering(nginx_binary):
    # proxy_http_version 1.1: every SSE event is one HTTP chunk, which nginx hands on complete (see the module doc)
    seen = _through_nginx(nginx_binary, "1.1", ("buffering_on",))
    assert not seen["buffering_on"][0], seen


def test_reader_point_counts_each_generation_once():
    """Two generations shown at three display granularities: 2 requests and their tokens once, not 6."""
    rows = [{"repeat": r, "request_id": g, "granularity": gran, "output_tokens": 10, "ttft_s": 0.1 + r, "e2e_s": 1.0 + r,
             "tpot_s": 0.1, "decode_tps": 10.0, "itl_s": [0.1] * 9}
            for r in range(2) for g, gran in enumerate(["token", "4 tokens", "100 ms"])]
    cols = sr.generation_columns(rows, wall_s=4.0)
    assert cols["requests"] == 2 and cols["output_tokens"] == 20 and cols["output_throughput_tps"] == 5.0
    assert cols["request_throughput_rps"] == 0.5 and cols["n_samples"] == 2


def test_endpoint_grid_measures_the_server_as_it_is_and_needs_no_weights():
    """With an endpoint every part runs against it: the keep-alive part is one point with ``keepalive`` empty (the
    built-in server's on / off knob does not exist there), and the model's weights are not needed."""
    ep = {"url": "http://127.0.0.1:9", "model": "m", "name": "ext"}
    cfg = sr.Config(endpoint=ep, proxy_modes=["direct"])
    ka = [p for p in cfg.grid() if p["part"] == "keepalive"]
    assert ka == [{"part": "keepalive", "language": "en", "proxy": "direct", "keepalive": None}]
    assert not cfg.needs_model() and sr.Config().needs_model()
    assert [p["keepalive"] for p in sr.Config().grid() if p["part"] == "keepalive"] == [False, True]


def test_keepalive_figure_labels_an_endpoint_measured_as_it_is():
    import pandas as pd

    req = pd.DataFrame([{"part": "keepalive", "keepalive": k, "outcome": o, "target": t}
                        for k, o, t in ((False, "timeout", None), (True, "ok", None), (None, "timeout", "ext"))])
    fig = sr.keepalive_figure(req)
    settings = {x for tr in fig.data for x in tr.x}
    assert settings == {"no keep-alive", "keep-alive comments", "ext as it is"}


def test_headline_says_when_an_endpoint_reports_no_engine_ttft():
    """An external server without engine figures: the path's share of TTFT is unknown, said so, never 'nan s'."""
    import pandas as pd

    nan = float("nan")
    req = pd.DataFrame([{"part": "proxy", "proxy": "direct", "ttft_s": t, "e2e_s": 2 * t, "engine_ttft_s": nan,
                         "engine_e2e_s": nan, "first_after_last": None, "chunks": 8, "first_word_s": t,
                         "first_read_bytes": 300, "first_read_chunks": 1, "longest_stall_s": 0.1} for t in (0.2, 0.3)])
    text = sr.headline(req)
    assert "nan" not in text and "no engine TTFT reported" in text and "direct: TTFT 0.250 s" in text


def test_endpoint_reader_point_without_engine_figures_or_usage():
    """An OpenAI-compatible stream with no engine figures and no usage (the fake upstream): the reader part's rows
    count content chunks as tokens (said so), leave the server-side columns empty with the note, and show the
    chunk timeline at each granularity."""
    import math

    from workbench.serving import endpoint

    with _FakeChatSSE(n=12, gap_s=0.005) as up:
        cfg = sr.Config(languages=["en"], granularities=["token", "4 tokens"], proxy_modes=[], blocker_tokens=0,
                        max_new_tokens=12, repeats=1, endpoint={"url": f"http://127.0.0.1:{up.port}", "model": "m",
                                                                "name": "fake"})
        state = {}
        try:
            res = sr.measure_point(None, cfg, {"part": "reader", "language": "en", "proxy": "none",
                                               "keepalive": False}, state)
        finally:
            state["bench"].close()
    rows = {r["granularity"]: r for r in res.requests}
    assert set(rows) == {"chunk", "4 chunks"} and rows["4 chunks"]["updates"] == 3
    r = rows["chunk"]
    assert r["updates"] == r["chunks"] == r["output_tokens"] == 12 and r["token_count_source"] == "chunks"
    assert r["finish_reason"] == "length" and r["decode_steps"] == 11 and r["itl_s"] == []
    assert len(r["chunk_itl_s"]) == 11 and r["target"] == "fake"
    assert r["server_side_note"] == endpoint.SERVER_SIDE_NOTE and math.isnan(r["engine_ttft_s"])
    assert res.extra["requests"] == 1  # one generation, shown at two granularities


def test_the_request_clock_starts_after_the_client_is_built(monkeypatch):
    """TTFT is the send to the first content chunk: building the HTTP client (httpx loads the CA bundle for each
    new client, ~35 ms of CPU here) happens before the clock starts. A client that takes 1 s to build must not
    show in TTFT against a fake server that answers at once."""
    import httpx
    import time

    from conftest import FakeSSE

    real_init = httpx.Client.__init__

    def slow_init(self, *a, **k):
        time.sleep(1.0)
        real_init(self, *a, **k)

    monkeypatch.setattr(httpx.Client, "__init__", slow_init)
    with FakeSSE() as srv:
        row = client.stream_request(srv.base_url, "hi", 3, timeout=10)
    assert row["outcome"] == "ok" and row["text"] == "Hello" and row["chunks"] == 2
    assert row["ttft_s"] < 1.0 and row["e2e_s"] < 1.0, row


def test_clients_share_one_tls_context(monkeypatch):
    """Every measurement client of a process uses the one TLS context (no CA bundle loaded per client)."""
    import ssl

    from workbench.serving import client

    client.ssl_context()
    loads = []
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *a, **k: loads.append(a))
    for _ in range(3):
        with client.http_client(5.0):
            pass
    assert loads == []
