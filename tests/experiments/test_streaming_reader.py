"""Experiment 10 (streaming to a reader): config, the generated nginx config, and a tiny real run (nginx or skip)."""
import pytest

from workbench import ParameterError
from workbench.experiments import streaming_reader as sr
from workbench.load import client
from workbench.load.proxy import NGINX_MODES, Nginx, nginx_config, nginx_status
from workbench.run import results


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
                    client_timeout_s=0.3, keepalive_s=0.1, blocker_tokens=16, repeats=1)
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
    figs = sr.figures(points, req, run)
    assert set(figs) == {"reader_proxy_ttft", "reader_chunk_arrival", "reader_metrics", "reader_keepalive"}
    assert "buffering_on" in sr.headline(req)
    f = sr.finding(req, points)
    assert f"buffering_on {cfg.repeats}" in f.evidence
    if cfg.repeats < 2:  # one round pairs nothing: each path on its own, the comparison undecided
        assert not f.supported and f.verdict == "undecided" and "one round pairs nothing" in f.text


# ------------------------------------------------------------------ the proxy points as one design (issue 49)

#: each path's client TTFT (s) in the fake: buffering on holds the first chunk until the end, the others do not
_TTFT = {"direct": 0.10, "buffering_default": 0.40, "buffering_on": 0.90, "buffering_off": 0.10, "header": 0.10}
#: the design columns every proxy point of a design carries (workbench.run.design.DesignResult.point_columns)
_DESIGN_COLUMNS = {"design", "rounds", "margin", "aa_ratio", "aa_low", "aa_high", "aa_verdict", "time_ratio",
                   "time_ratio_low", "time_ratio_high", "time_ratio_level", "time_ratio_method", "time_ratio_verdict",
                   "time_ratio_direction", "rounds_needed", "seconds_needed", "design_seconds", "design_stopped"}


def _fake_proxy_run(monkeypatch, aa_shift=1.0, repeats=6, modes=sr.PROXY_MODES, max_rounds=8):
    """:func:`sr.run` over the proxy part alone with nginx faked present and a fake client: whole rounds 10% slow or
    fast (machine drift), each path's TTFT from :data:`_TTFT`, and the A/A arm's request (direct measured again)
    ``aa_shift`` times slower. Returns (cfg, timed calls as (round, path), points, requests)."""
    import random
    import types

    from workbench.measure import reading
    from workbench.run import design

    cfg = sr.Config(languages=[], blocker_tokens=0, proxy_modes=list(modes), repeats=repeats, warmup=1,
                    max_new_tokens=8, max_rounds=max_rounds)
    rng, drift, calls, order = random.Random(5), {}, [], []
    real_order = design._order

    def recorded_order(d, rnd):  # the arms in measuring order, so the fake knows which request is the A/A arm's
        got = real_order(d, rnd)
        order.extend((rnd, a) for a in got)
        return got

    def fake_stream(base, prompt, max_tokens, **kw):
        mode = base.split("//", 1)[1]
        if max_tokens == 2:  # a warm-up
            return {}
        if order:
            rnd, arm = order[len(calls)]
        else:  # measured point by point: no design
            rnd, arm = sum(m == mode for _, m in calls), mode
        calls.append((rnd, mode))
        drift.setdefault(rnd, rng.choice((0.9, 1.1)))
        ttft = _TTFT[mode] * drift[rnd] * rng.uniform(0.99, 1.01) * (aa_shift if arm == design.AA else 1)
        e2e = max(ttft, 0.9 * drift[rnd])
        return {"ttft_s": ttft, "e2e_s": e2e, "chunk_itl_s": [e2e - ttft], "chunk_offsets_s": [ttft, e2e],
                "chunk_stamps": [ttft, e2e], "chunks": 2, "keepalives": 0, "text": "Hello world.", "output_tokens": 2,
                "engine_ttft_s": 0.05, "engine_e2e_s": 0.85, "first_after_last": ttft >= 0.85,
                "first_read_bytes": 300, "first_read_chunks": 1, "response_bytes": 600, "outcome": "ok",
                "error": None, "finish_reason": "length", "prompt_tokens": 12, "t_send": 0.0,
                "chunk_texts": ["Hello", " world."], **reading.reader_metrics([(ttft, "Hello"), (e2e, " world.")], 0.0)}

    paths = types.SimpleNamespace(base=lambda mode: f"http://{mode}", close=lambda: None, loaded=None)
    monkeypatch.setattr(design, "_order", recorded_order)
    monkeypatch.setattr(sr, "stream_request", fake_stream)
    monkeypatch.setattr(sr, "_paths", lambda cfg, loaded: paths)
    monkeypatch.setattr(sr, "nginx_status", lambda: ("/usr/sbin/nginx", ""))
    run = results.create_run()
    points = sr.run(cfg, run, types.SimpleNamespace(info=None))
    req = results.read_requests(run, experiment=sr.EXPERIMENT)
    # (valid forced: a loaded test machine may mark points invalid for other load, and the finding uses valid ones)
    return cfg, calls, points.assign(valid=True), req, run


def test_proxy_points_are_one_design_with_the_aa_control_and_the_finding_carries_its_verdict(monkeypatch):
    """Every round streams along every path once and direct a second time (the A/A arm), in a shuffled order; the
    design stops at its first look once buffering on (the leading mode) is decided; the proxy points carry the TTFT
    ratio over direct (the marked control) from one block analysis and the A/A columns; the finding leads with
    buffering on's verdict and names every mode's; the ratio figure draws the A/A band and each round faint."""
    from workbench.stats import evidence

    cfg, calls, pts, req, run = _fake_proxy_run(monkeypatch)
    rounds = [r for r, _ in calls]
    assert rounds == sorted(rounds) and set(rounds) == set(range(cfg.repeats))  # round after round, stopped at 6
    for r in range(cfg.repeats):
        assert sorted(m for rr, m in calls if rr == r) == sorted([*sr.PROXY_MODES, "direct"])  # direct twice
    assert len({tuple(m for rr, m in calls if rr == r) for r in range(cfg.repeats)}) > 1  # shuffled per round
    assert (pts["part"] == "proxy").all() and len(pts) == len(sr.PROXY_MODES)
    assert _DESIGN_COLUMNS <= set(pts.columns)
    assert (pts["design"] == "interleaved").all() and (pts["rounds"] == cfg.repeats).all()
    assert (pts["design_stopped"] == "decided").all() and pts["aa_low"].notna().all()
    by = pts.set_index("proxy")
    assert by.loc["direct", "time_ratio"] == 1 and by.loc["direct", "time_ratio_method"] == "the control"
    assert by.loc["buffering_on", "time_ratio_low"] > 1 and by.loc["buffering_on", "time_ratio_verdict"] == "direction"
    assert "Dunnett over 5" in by.loc["buffering_on", "time_ratio_method"]   # 4 nginx modes and the A/A arm
    assert by.loc["buffering_on", "time_ratio_low"] < 9 < by.loc["buffering_on", "time_ratio_high"]
    # the A/A requests are kept apart (in the design's table), not in the points: each path's requests, one per round
    assert len(req) == len(sr.PROXY_MODES) * cfg.repeats and set(req["repeat"]) == set(range(cfg.repeats))
    f = sr.finding(req, pts)
    assert f.text.startswith("Client TTFT through nginx buffering_on vs direct: slower, ") and f.supported
    assert f.verdict == "direction" and f.rounds == cfg.repeats and f.margin == 1.05
    assert all(f"{m} vs direct: " in f.text for m in sr.NGINX_MODES) and "A/A control moved" not in f.text
    assert f.supported == evidence.headline_supported(f.text)
    assert f"{cfg.repeats} interleaved rounds (stopped: decided)" in f.evidence and "A/A control" in f.evidence
    assert set(f.point_ids) == set(pts["point_id"]) and f.text.startswith(sr.headline(req, pts)[:60])
    figs = sr.figures(pts, req, run)
    names = [t.name or "" for t in figs["reader_proxy_ttft_ratio"].data]
    assert any(n.startswith("A/A control") for n in names) and "each round" in names


def test_a_finding_quotes_no_figure_of_an_invalid_point(monkeypatch):
    """A new user's quick run: every proxy point invalid (CPU steal), yet the finding gave each path's TTFT and "first
    chunk only after the last token: buffering_default, buffering_on"; only valid points' requests are quoted."""
    cfg, calls, pts, req, run = _fake_proxy_run(monkeypatch)
    f = sr.finding(req, pts.assign(valid=False, invalid_reason="hypervisor stole 11% of CPU time (limit 5%)"))
    assert "left out: no proxy point is valid" in f.text and "Client TTFT p50 by path" not in f.text
    assert "First chunk only after" not in f.text and f.verdict == "undecided"
    one = pts.assign(valid=pts["proxy"] != "buffering_on")
    assert "buffering_on: TTFT" not in sr.headline(req, one) and "direct: TTFT" in sr.headline(req, one)


def test_an_equivalent_path_and_an_undecided_lead_say_so_with_the_rounds_they_need(monkeypatch):
    """Synthetic design columns: a path within the margin is "equivalent within +-5%"; a lead mode whose interval
    straddles 1 is undecided and names the rounds (and seconds) that would decide it; the finding's verdict follows
    the lead."""
    import pandas as pd

    base = {"part": "proxy", "status": "ok", "valid": True, "design": "interleaved", "rounds": 3, "margin": 1.05,
            "aa_ratio": 1.0, "aa_low": 0.97, "aa_high": 1.03, "aa_verdict": "equivalent", "design_seconds": 30.0,
            "seconds_per_round": 10.0, "design_stopped": "max rounds"}

    def row(mode, est, lo, hi, verdict, direction="", need=0):
        return {**base, "point_id": f"streaming_reader/proxy={mode}", "proxy": mode, "time_ratio": est,
                "time_ratio_low": lo, "time_ratio_high": hi, "time_ratio_level": 0.95, "time_ratio_verdict": verdict,
                "time_ratio_direction": direction, "time_ratio_method": "pooled block model, 6 dof, Dunnett over 3",
                "rounds_needed": need}

    direct = {**row("direct", 1.0, float("nan"), float("nan"), ""), "time_ratio_method": "the control"}
    req = pd.DataFrame([{"part": "proxy", "proxy": m, "ttft_s": 0.1, "e2e_s": 1.0, "engine_ttft_s": 0.05, "chunks": 2,
                         "first_word_s": 0.1, "first_read_bytes": 300, "first_read_chunks": 1,
                         "first_after_last": False, "longest_stall_s": 0.1} for m in ("direct", "buffering_on",
                                                                                     "buffering_off")])
    pts = pd.DataFrame([direct, row("buffering_on", 1.2, 0.9, 1.6, "undecided", need=9),
                        row("buffering_off", 1.01, 0.98, 1.04, "equivalent")])
    f = sr.finding(req, pts)
    assert f.verdict == "undecided" and not f.supported and f.rounds_needed == 9 and f.seconds_needed == 60.0
    assert "buffering_on vs direct: undecided: 1.20x" in f.text and "about 9 rounds (~60 s more)" in f.text
    assert "buffering_off vs direct: equivalent within +-5%: 1.01x" in f.text
    pts.loc[1, ["time_ratio", "time_ratio_low", "time_ratio_high", "time_ratio_verdict", "time_ratio_direction",
                "rounds_needed"]] = [0.97, 0.96, 0.99, "direction", "lower", 0]
    faster = sr.finding(req, pts)
    assert faster.verdict == "direction" and "buffering_on vs direct: faster, 0.97x" in faster.text


def test_finding_says_the_aa_control_moved(monkeypatch):
    """direct's second request (the A/A arm) 30% slower in every round: the A/A control shows a direction, the
    points say so, and the finding says the control moved and leaves its verdict undecided."""
    _, _, pts, req, _ = _fake_proxy_run(monkeypatch, aa_shift=1.3, max_rounds=6)
    assert (pts["aa_verdict"] == "direction").all() and (pts["aa_low"] > 1).all()
    f = sr.finding(req, pts)
    assert f.text.startswith("Client TTFT through nginx buffering_on vs direct: slower")
    assert "The A/A control moved" in f.text and f.verdict == "undecided" and not f.supported


def test_one_round_measures_each_path_on_its_own_and_claims_nothing(monkeypatch):
    """One repeat pairs nothing: each path measured on its own, back to back, no A/A control, and the finding says
    the comparison is undecided because of it."""
    cfg, calls, pts, req, _ = _fake_proxy_run(monkeypatch, repeats=1)
    assert [m for _, m in calls] == list(sr.PROXY_MODES)  # each path once, in grid order, no second direct
    assert "design" not in pts or pts["design"].isna().all()
    f = sr.finding(req, pts)
    assert not f.supported and f.verdict == "undecided" and "undecided: one round pairs nothing" in f.text
    assert "reader_proxy_ttft_ratio" not in sr.figures(pts, req)


@pytest.mark.model
def test_tiny_run_measures_the_real_paths_as_one_design_or_skips(loaded):
    """Two rounds through the real server and nginx: the design's table in the run folder holds every path and the
    A/A arm in both rounds; every proxy point carries the design's columns and the finding a verdict (no figure or
    direction asserted: two rounds on a shared machine)."""
    import pandas as pd

    binary, reason = nginx_status()
    if binary is None:
        pytest.skip(f"nginx part skipped: {reason}")
    cfg = sr.Config(max_new_tokens=6, languages=[], blocker_tokens=0, repeats=2, max_rounds=2, warmup=0,
                    proxy_modes=["direct", "buffering_on", "header"])
    run = results.create_run()
    points = sr.run(cfg, run, loaded)
    assert (points["status"] == "ok").all() and (points["design"] == "interleaved").all()
    assert (points["rounds"] == 2).all() and points["time_ratio"].notna().all() and _DESIGN_COLUMNS <= set(points)
    table = pd.read_parquet(run / "design" / f"{sr.EXPERIMENT}.parquet")
    assert len(table) == 2 * 4 and set(table["arm"]) == {*points["point_id"], "A/A"} and (table["ttft_s"] > 0).all()
    req = results.read_requests(run, experiment=sr.EXPERIMENT)
    assert req.groupby("proxy").size().to_dict() == {"direct": 2, "buffering_on": 2, "header": 2}
    f = sr.finding(req, points.assign(valid=True))
    assert f.text.startswith("Client TTFT through nginx buffering_on vs direct: ") and "header vs direct: " in f.text
    assert f.verdict in ("direction", "equivalent", "undecided") and f.rounds == 2


def test_finding_without_interleaved_points_is_not_supported_with_the_reason(monkeypatch):
    """Without the interleaved columns the comparison is not supported: nginx absent (direct alone), one round, or
    the paths measured point by point (an older blocked run, no points given)."""
    import pandas as pd

    def req(modes, n):
        return pd.DataFrame([{"part": "proxy", "proxy": m, "ttft_s": _TTFT[m], "e2e_s": 1.0, "engine_ttft_s": 0.05,
                              "chunks": 2, "first_word_s": 0.1, "first_read_bytes": 300, "first_read_chunks": 1,
                              "first_after_last": False, "longest_stall_s": 0.1} for m in modes for _ in range(n)])

    monkeypatch.setattr(sr, "nginx_status", lambda: (None, "nginx is not installed"))
    direct = sr.finding(req(["direct"], 3))
    assert not direct.supported and "nginx modes not measured (nginx is not installed)" in direct.text
    assert direct.verdict == "undecided"
    one = sr.finding(req(sr.PROXY_MODES, 1))
    assert not one.supported and "one round pairs nothing" in one.text
    blocked = sr.finding(req(sr.PROXY_MODES, 3))
    assert not blocked.supported and "measured point by point" in blocked.text


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

    from workbench.load import endpoint

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
    import time

    import httpx

    from tests.conftest import FakeSSE

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

    from workbench.load import client

    client.ssl_context()
    loads = []
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda self, *a, **k: loads.append(a))
    for _ in range(3):
        with client.http_client(5.0):
            pass
    assert loads == []
