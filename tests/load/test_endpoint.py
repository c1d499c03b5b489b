"""An external OpenAI-compatible endpoint as a load target (issue 23), against a SECOND REAL SERVER PROCESS.

``workbench serve`` runs as a subprocess on a free loopback port with an API key; the load generator and the
serving-load experiment point their ``endpoint`` at it. The bad-input errors are checked against real
processes too: a port nobody listens on, a wrong key, a model the server does not serve, and Python's
``http.server`` (a plain HTTP server that is not OpenAI-compatible).
"""

import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from workbench.errors import ParameterError
from workbench.load import endpoint, load, senders
from workbench.measure import contention
from workbench.serving.protocol import SERVED_MODEL

REPO = Path(__file__).resolve().parents[2]
KEY_ENV = "WORKBENCH_KEY_EXT23_TEST"
KEY = "test-key-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc, seconds: float = 240.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return  # it answers (with an error status): it is up
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the server process exited with {proc.returncode}")
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {seconds:.0f} s")


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``workbench serve`` (fifo engine, real default model, an API key) in its own process: its base URL."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = dict(os.environ, WORKBENCH_API_KEY=KEY, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               WORKBENCH_RESULTS=str(log_path.parent / "results"))
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "serve", "--port", str(port),
                                 "--device", "cpu", "--dtype", "float32"],
                                cwd=log_path.parent, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            _wait_http(url + "/health", proc)
        except RuntimeError as exc:
            pytest.fail(f"{exc}: {log_path.read_text()[-2000:]}")
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def _ep(url, **kw):
    return endpoint.Endpoint.from_param({"url": url, "model": SERVED_MODEL, "api_key_env": KEY_ENV, **kw})


def test_check_passes_against_a_real_server(served, keyed):
    info = endpoint.check_endpoint(_ep(served))
    assert SERVED_MODEL in info["models"] and info["usage_in_stream"] is True


def test_load_generator_drives_the_second_server(served, keyed):
    specs = [load.RequestSpec("Count to five.", 3, None) for _ in range(2)]
    res = load.run_load(endpoint.sender(_ep(served)), specs, "synchronous")
    df = res.kept()
    assert len(df) == 2 and df["error"].isna().all(), df.get("error")
    assert (df["output_tokens"] == 3).all() and (df["token_count_source"] == "usage").all()
    # extra_body reaches the server: the workbench server refuses a field it does not support (one line, 4xx)
    bad = load.run_load(endpoint.sender(_ep(served, extra_body={"logprobs": True})), specs[:1], "synchronous").kept()
    assert bad["error"].notna().all() and "logprobs" in bad["error"].iloc[0]
    assert (df["ttft_s"] > 0).all() and (df["e2e_s"] >= df["ttft_s"]).all()
    # the second server is a workbench server: it sends its engine figures in the final chunk
    assert (df["server_side_note"] == endpoint.REPORTED_NOTE).all() and df["queue_s"].notna().all()


def test_serving_load_experiment_against_the_endpoint(served, keyed, tmp_path):
    """The experiment's grid, columns and figures for an endpoint-only run (the tokenizer alone loads)."""
    from workbench.experiments import serving_load
    from workbench.run import results

    cfg = serving_load.Config(engines=["endpoint"], endpoint={"url": served + "/v1", "model": SERVED_MODEL,
                                                              "api_key_env": KEY_ENV, "name": "second-server"},
                              requests_per_point=2, prompt_tokens=32, max_new_tokens=2, sweep_points=1,
                              warmup=0, slo_presets=[], device="cpu")
    assert not cfg.needs_model()
    loaded = serving_load.load_for(cfg)
    assert loaded.model is None and loaded.tokenizer is not None
    run = results.open_run("")
    points = serving_load.run(cfg, run, loaded)
    assert list(points["engine"].unique()) == ["second-server"] and (points["status"] == "ok").all()
    assert set(points["profile"]) == {"synchronous", "throughput", cfg.arrival}
    assert (points["server_side_note"] == endpoint.REPORTED_NOTE).all()
    assert points["engine_batch_mean"].isna().all() and points["queue_s_p50"].notna().all()
    assert (points["endpoint_url"] == served).all() and (points["endpoint_api_key_env"] == KEY_ENV).all()
    assert not points.astype(str).apply(lambda c: c.str.contains(KEY)).any().any()  # the key is never written
    requests = results.read_requests(run, experiment=serving_load.EXPERIMENT)
    assert (requests["output_tokens"] == 2).all()
    figs = serving_load.figures(points, requests, cfg.attainment_target)
    assert {"load_latency_vs_throughput", "load_goodput_vs_rate", "load_gantt"} <= set(figs)
    assert any("second-server" in (t.name or "") for t in figs["load_latency_vs_throughput"].data)


# ----------------------------------------------------------------------------- bad input, one line each


def _one_line(exc_info, word):
    msg = str(exc_info.value)
    assert "\n" not in msg and word in msg, msg


def test_unreachable_endpoint(keyed):
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(f"http://127.0.0.1:{_free_port()}"), timeout=5)
    _one_line(exc, "endpoint.url: cannot reach")


def test_wrong_api_key(served, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(served))
    _one_line(exc, "endpoint.api_key_env")
    assert "401" in str(exc.value) and "not-the-key" not in str(exc.value)


def test_no_key_against_a_keyed_server(served):
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(endpoint.Endpoint.from_param({"url": served, "model": SERVED_MODEL}))
    _one_line(exc, "endpoint.api_key_env")


def test_unset_key_variable(served, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(served))
    _one_line(exc, f"{KEY_ENV} is not set")


def test_unknown_model(served, keyed):
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(served, model="no-such-model"))
    _one_line(exc, "endpoint.model")
    assert SERVED_MODEL in str(exc.value)  # says what it does serve


@pytest.fixture
def plain_http(tmp_path):
    """``python -m http.server``: answers HTTP, but 404 on /v1/models and 501 on POST."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/", proc, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def test_not_openai_compatible(plain_http, keyed):
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(plain_http), timeout=10)
    _one_line(exc, "not OpenAI-compatible")


def test_models_list_but_no_openai_chat(plain_http, keyed, tmp_path):
    """A /v1/models file that lists the model, but POST is not a chat completion (http.server: 501)."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"object": "list", "data": [{"id": "%s"}]}' % SERVED_MODEL)
    with pytest.raises(ParameterError) as exc:
        endpoint.check_endpoint(_ep(plain_http), timeout=10)
    _one_line(exc, "streamed chat completion")


def test_experiment_checks_the_endpoint_before_any_point(keyed, tmp_path, monkeypatch):
    """An unreachable endpoint stops serving_load.run before the first point is measured."""
    from workbench.experiments import serving_load
    from workbench.run import results

    cfg = serving_load.Config(engines=["endpoint"], requests_per_point=2, prompt_tokens=32, max_new_tokens=2,
                              endpoint={"url": f"http://127.0.0.1:{_free_port()}", "model": "m"})
    monkeypatch.setattr(serving_load, "measure_point", lambda *a, **k: pytest.fail("a point ran"))
    with pytest.raises(ParameterError, match="endpoint.url: cannot reach"):
        serving_load.run(cfg, results.open_run(""), loaded=None)


@pytest.mark.parametrize("param,word", [
    ({"url": "127.0.0.1:8000", "model": "m"}, "endpoint.url"),
    ({"url": "http://h", "model": ""}, "endpoint.model"),
    ({"url": "http://h", "model": "m", "api_key_env": "not a name"}, "endpoint.api_key_env"),
    ({"url": "http://h", "model": "m", "name": "static"}, "endpoint.name"),
    ({"url": "http://h", "model": "m", "key": "secret"}, "unknown key"),
    ("http://h", "must be a mapping"),
    ({"url": "http://h", "model": "m", "extra_body": ["min_tokens"]}, "endpoint.extra_body"),
])
def test_endpoint_parameter_errors(param, word):
    from workbench.experiments import serving_load

    with pytest.raises(ParameterError) as exc:
        serving_load.Config(engines=["static", "endpoint"], endpoint=param)
    _one_line(exc, word)


def test_endpoint_listed_and_given_together():
    from workbench.experiments import serving_load

    with pytest.raises(ParameterError, match="no endpoint"):
        serving_load.Config(engines=["endpoint"])
    with pytest.raises(ParameterError, match="does not list 'endpoint'"):
        serving_load.Config(engines=["static"], endpoint={"url": "http://h", "model": "m"})
    cfg = serving_load.Config(engines=["static", "endpoint"], endpoint={"url": "http://h/v1/", "model": "m",
                                                                        "name": "llama.cpp"})
    assert cfg.engine_names() == ["static", "llama.cpp"] and cfg.target().url == "http://h"
    assert [p["engine"] for p in cfg.grid()].count("llama.cpp") == 2 + cfg.sweep_points
    assert cfg.needs_model()


def test_endpoint_imports_nothing_from_the_server_side():
    import ast

    tree = ast.parse(Path(endpoint.__file__).read_text(encoding="utf-8"))
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
    assert not mods & {"server", "chat", "jobs", "http", "monitoring", "engines"}, mods


def test_sender_counts_chunks_when_the_stream_has_no_usage():
    """A server that ignores stream_options (no usage): output_tokens falls back to content chunks, said so."""
    import httpx

    sse = "".join(f'data: {{"choices": [{{"delta": {{"content": "t{i}"}}}}]}}\n\n' for i in range(3)) + \
        "data: [DONE]\n\n"
    transport = httpx.MockTransport(lambda req: httpx.Response(200, text=sse,
                                                               headers={"content-type": "text/event-stream"}))
    send = senders.http_sender("http://x", client=httpx.Client(transport=transport))
    row = send(load.RequestSpec("hi", 3), time.perf_counter())
    assert row["error"] is None and row["output_tokens"] == 3 and row["token_count_source"] == "chunks"
    assert math.isnan(row["queue_s"]) and endpoint.server_side_note(row) == endpoint.SERVER_SIDE_NOTE
    # no engine TPOT: the client's, over the 2 decode steps between the 3 chunks (the SLO needs one)
    assert row["tpot_s"] >= 0 and row["decode_tps"] > 0


def test_local_server_pid_finds_the_listener(served):
    proc_pid = endpoint.local_server_pid(endpoint.Endpoint.from_param({"url": served, "model": "m"}))
    assert proc_pid is not None and proc_pid != os.getpid()
    assert endpoint.local_server_pid(endpoint.Endpoint.from_param({"url": "http://10.255.255.1:9", "model": "m"})) \
        is None


def test_load_monitor_counts_a_served_by_process_as_own(monkeypatch):
    """A loopback endpoint's server (contention.SERVED_BY_PIDS) is the point's own work, not other load."""
    import psutil


    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"  # it has burned 0.3 CPU s and now sleeps
        plain = contention.LoadMonitor()
        monkeypatch.setattr(contention, "SERVED_BY_PIDS", {child.pid})
        served = contention.LoadMonitor()
        burned = sum(psutil.Process(child.pid).cpu_times()[:2])
        assert burned >= 0.3
        assert served._own() - plain._own() >= burned - 0.05  # less only by this process's own time between reads
    finally:
        child.kill()
        child.wait()


def test_streaming_reader_proxy_part_against_the_endpoint(served, keyed):
    """Notebook 10's proxy part streams from the external endpoint (direct), token counts from its usage."""
    from workbench.experiments import serving_load, streaming_reader
    from workbench.run import results

    ep = {"url": served, "model": SERVED_MODEL, "api_key_env": KEY_ENV, "name": "second-server"}
    cfg = streaming_reader.Config(languages=[], proxy_modes=["direct"], blocker_tokens=0, max_new_tokens=3,
                                  repeats=1, warmup=0, endpoint=ep)
    loaded = serving_load.load_for(serving_load.Config(engines=["endpoint"], endpoint=ep))
    run = results.open_run("")
    points = streaming_reader.run(cfg, run, loaded)
    assert (points["status"] == "ok").all() and list(points["proxy"]) == ["direct"]
    req = results.read_requests(run, experiment=streaming_reader.EXPERIMENT)
    assert (req["output_tokens"] == 3).all() and (req["target"] == "second-server").all()
    assert (req["server_side_note"] == endpoint.REPORTED_NOTE).all()


def test_streaming_reader_reader_and_keepalive_parts_against_the_endpoint(served, keyed):
    """Notebook 10's reader and keep-alive parts run against the external endpoint, with no weights loaded here.

    Reader: the greedy answers are streamed from the second server and their chunk arrivals are the timeline
    (``chunk`` shows every chunk, so as many updates as chunks; ``2 chunks`` at most half of them plus one).
    Keep-alive: the probe with a 0.3 s read timeout waits behind a 48-token blocker on the second server (fifo,
    no keep-alive comments), measured once as that server is; the built-in on / off pair is left out."""
    from workbench.experiments import streaming_reader
    from workbench.run import results

    ep = {"url": served, "model": SERVED_MODEL, "api_key_env": KEY_ENV, "name": "second-server"}
    cfg = streaming_reader.Config(languages=["en", "zh"], granularities=["token", "2 tokens", "100 ms"],
                                  proxy_modes=[], blocker_tokens=48, client_timeout_s=0.3, keepalive_s=0.1,
                                  max_new_tokens=6, repeats=1, warmup=0, endpoint=ep)
    loaded = streaming_reader.load_for(cfg)
    assert loaded.model is None  # every point below ran on the second server
    run = results.open_run("")
    points = streaming_reader.run(cfg, run, loaded)
    assert (points["status"] == "ok").all(), points["status"].tolist()
    assert sorted(points["part"]) == ["keepalive", "reader", "reader"]
    req = results.read_requests(run, experiment=streaming_reader.EXPERIMENT)
    rd = req[req["part"] == "reader"]
    assert len(rd) == 2 * 3 and set(rd["granularity"]) == {"chunk", "2 chunks", "100 ms"}
    assert (rd["target"] == "second-server").all() and (rd["output_tokens"] == 6).all()
    assert (rd["token_count_source"] == "usage").all() and rd["first_word_s"].notna().all()
    by = rd.set_index(["language", "granularity"])
    for lang in ("en", "zh"):
        n = by.loc[(lang, "chunk"), "chunks"]
        assert by.loc[(lang, "chunk"), "updates"] == n and by.loc[(lang, "2 chunks"), "updates"] <= n // 2 + 1
    assert (rd["ttft_s"] > 0).all() and (rd["e2e_s"] >= rd["ttft_s"]).all()
    assert (rd["decode_steps"] == 5).all() and (rd["tpot_s"] > 0).all() and (rd["decode_tps"] > 0).all()
    assert rd["itl_s"].map(len).eq(0).all()  # no per-token-id stamps leave the server: chunk gaps only
    # a workbench server reports its engine figures in the final chunk
    assert (rd["server_side_note"] == endpoint.REPORTED_NOTE).all() and rd["engine_ttft_s"].notna().all()
    ka = req[req["part"] == "keepalive"]
    assert len(ka) == 1 and ka["keepalive"].isna().all() and (ka["target"] == "second-server").all()
    assert (ka["keepalive_note"] == streaming_reader.ENDPOINT_KEEPALIVE_NOTE).all()
    # fifo without keep-alive comments: the probe gets nothing while 47 decode steps run ahead of it
    assert (ka["outcome"] == "timeout").all() and (ka["keepalives"] == 0).all()
    figs = streaming_reader.figures(points, req)
    assert {x for tr in figs["reader_keepalive"].data for x in tr.x} == {"second-server as it is"}


def test_streaming_reader_notebook_against_the_endpoint_loads_no_weights(served, keyed, tmp_path, monkeypatch):
    """Notebook 10's cells with ``endpoint`` set run end to end against the second server without loading the
    model's weights here (``models.load_model`` is made to fail), and write its rows, figures and finding."""
    from tests.conftest import execute_in_process
    from workbench.experiments import streaming_reader
    from workbench.measure import models
    from workbench.run import notebooks, results

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("notebook 10 loaded the model's weights"))
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    nb = REPO / "notebooks" / "10_streaming_reader.ipynb"
    params = {"languages": ["en"], "granularities": ["token"], "proxy_modes": ["direct"], "blocker_tokens": 0,
              "max_new_tokens": 3, "repeats": 1, "warmup": 0,
              "endpoint": {"url": served, "model": SERVED_MODEL, "api_key_env": KEY_ENV, "name": "second-server"}}
    run = results.open_run("", label="nb10")
    execute_in_process(nb, notebooks.validate_parameters(nb, params), run)
    req = results.read_requests(run, experiment=streaming_reader.EXPERIMENT)
    assert set(req["part"]) == {"reader", "proxy"} and (req["target"] == "second-server").all()
    assert (run / "figures").is_dir() and any((run / "figures").iterdir())


def test_streaming_reader_checks_the_endpoint_first(keyed):
    from workbench.experiments import streaming_reader
    from workbench.run import results

    cfg = streaming_reader.Config(languages=[], proxy_modes=["direct"], blocker_tokens=0,
                                  endpoint={"url": f"http://127.0.0.1:{_free_port()}", "model": "m"})
    with pytest.raises(ParameterError, match="endpoint.url: cannot reach"):
        streaming_reader.run(cfg, results.open_run(""), loaded=None)
    with pytest.raises(ParameterError, match="nginx modes need an http://"):
        streaming_reader.Config(proxy_modes=["direct", "buffering_off"], endpoint={"url": "https://h", "model": "m"})


def test_nginx_config_proxies_to_an_endpoint_host():
    from workbench.load import proxy

    conf = proxy.nginx_config("buffering_off", 9000, "10.0.0.5:8080", "/tmp/x")
    assert "proxy_pass http://10.0.0.5:8080;" in conf
    assert "proxy_pass http://127.0.0.1:7000;" in proxy.nginx_config("buffering_off", 9000, 7000, "/tmp/x")


def test_llamacpp_suite_validates():
    """suites/llamacpp.yaml's parameters pass notebook 08's config (no network: the endpoint's shape only)."""
    from workbench.run import notebooks

    suite = notebooks.load_suite(str(REPO / "suites" / "llamacpp.yaml"))
    for e in suite["notebooks"]:
        notebooks.validate_parameters(e["notebook"], e["parameters"])
        assert "endpoint" in e["parameters"]["engines"]


def test_slo_search_against_the_endpoint(served, keyed):
    """The SLO search (bisection over the offered rate) runs against the external endpoint unchanged."""
    from workbench.experiments import serving_load

    cfg = serving_load.Config(engines=["endpoint"], endpoint={"url": served, "model": SERVED_MODEL,
                                                              "api_key_env": KEY_ENV, "name": "second-server"},
                              requests_per_point=2, prompt_tokens=32, max_new_tokens=2, warmup=0, slo_presets=[],
                              search_steps=2, slo_ttft_s=60.0, slo_tpot_s=10.0, attainment_target=0.4)
    table = serving_load.search_engines(cfg, serving_load.load_for(cfg))
    assert list(table["engine"]) == ["second-server"] and table["measurements"].iloc[0] >= 1
    # limits no request can miss, at a target 2 of 2 can show (one-sided 95% lower bound 0.42)
    assert table["sync_rps"].iloc[0] > 0 and table["max_rate_rps"].iloc[0] > 0


def test_slo_search_checks_the_endpoint_first(keyed):
    from workbench.experiments import serving_load

    cfg = serving_load.Config(engines=["endpoint"], endpoint={"url": f"http://127.0.0.1:{_free_port()}", "model": "m"})
    with pytest.raises(ParameterError, match="endpoint.url: cannot reach"):
        serving_load.search_engines(cfg, loaded=None)
