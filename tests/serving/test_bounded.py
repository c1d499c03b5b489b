"""Serving that standard clients can use (issue 23): client-caused errors are 4xx on every engine, the model
field is checked, per-request sampling on the continuous engine over HTTP, disconnects cancel, limits."""

import json
import socket
import threading

import httpx
import pytest

from workbench.serving import engines
from workbench.serving.server import ServerLimits, ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Name one colour."}]


def _post(srv, body, timeout=120):
    return httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=timeout)


@pytest.fixture(scope="module", params=engines.ENGINES)
def server(request, loaded):
    with ServerThread(loaded, engine=request.param, max_batch_size=4, model_aliases=("smol",)) as srv:
        yield srv


def _error(r, status, param):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param), err
    return err


def test_client_errors_are_4xx_naming_the_field_on_every_engine(server):
    name = server.engine.name
    err = _error(_post(server, {"messages": MESSAGES, "model": "gpt-4o", "max_tokens": 2}), 404, "model")
    assert err["type"] == "NotFoundError" and "gpt-4o" in err["message"]
    _error(_post(server, {"messages": MESSAGES, "model": "x" * 100_000, "max_tokens": 2}), 400, "model")
    _error(_post(server, {"messages": MESSAGES, "max_tokens": 2, "temperature": 5}), 400, "temperature")
    _error(_post(server, {"messages": MESSAGES, "max_tokens": 10**9}), 400, "max_tokens")
    r = httpx.get(server.base_url + "/v1/streams/abc", headers={"Last-Event-ID": "abc:\u0663".encode("utf-8")},
                  timeout=30)
    assert r.status_code in (400, 404), r.text
    if name == "continuous":  # what one shared batch truly cannot do: 400 naming the parameter, never 500
        _error(_post(server, {"messages": MESSAGES, "max_tokens": 2, "temperature": 0.8, "seed": 7}), 400, "seed")
        _error(_post(server, {"messages": MESSAGES, "max_tokens": 4, "min_tokens": 2}), 400, "min_tokens")


def test_default_client_request_and_aliases_are_served_on_every_engine(server):
    """What the openai SDK and benchmark clients send by default (no temperature: 1.0), by an alias too."""
    for model in (None, "workbench-default", "smol"):
        body = {"messages": MESSAGES, "max_tokens": 3, **({"model": model} if model else {})}
        r = _post(server, body)
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["model"] == (model or "workbench-default")
        assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_continuous_server_serves_concurrent_requests_with_different_temperatures(loaded):
    with ServerThread(loaded, engine="continuous", max_batch_size=4) as srv:
        out = {}

        def send(t):
            out[t] = _post(srv, {"messages": MESSAGES, "max_tokens": 8, "temperature": t, "ignore_eos": True})

        threads = [threading.Thread(target=send, args=(t,)) for t in (0.0, 0.7, 1.0, 1.5)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        greedy_again = _post(srv, {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert all(r.status_code == 200 for r in out.values()), {t: r.text for t, r in out.items()}
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in out.values())
    assert max(r.json()["engine"]["batch_size"] for r in out.values()) >= 2
    # the greedy row in the mixed batch equals the same request alone
    assert out[0.0].json()["choices"][0]["message"]["content"] == greedy_again.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("engine", ["fifo", "continuous"])
def test_a_disconnected_non_streaming_request_stops_decoding(loaded, engine):
    """The client gives up after its first tokens; the engine stops the request (history: cancelled) long
    before max_tokens, while tokens were flowing (before: checked only after 0.25 s without a token)."""
    with ServerThread(loaded, engine=engine) as srv:
        assert _post(srv, {"messages": MESSAGES, "max_tokens": 2}).status_code == 200  # warm (continuous: its cache)
        body = {"messages": MESSAGES, "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.base_url + "/v1/chat/completions", json=body,
                       timeout=httpx.Timeout(60, read=1.0))
        assert srv.engine.wait_idle(120)
        res = srv.engine.history[-1]
    assert res["finish_reason"] == "cancelled" and 0 < res["output_tokens"] < 2000, res["output_tokens"]


def test_overload_is_503_and_a_slow_body_is_408(loaded):
    with ServerThread(loaded, limits=ServerLimits(limit_concurrency=2), body_read_timeout_s=0.5) as srv:
        with socket.create_connection((srv.host, srv.port)) as slow:  # a body that never arrives
            slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            slow.settimeout(30)
            head = b""
            while b"}}" not in head:  # the whole JSON answer
                part = slow.recv(4096)
                if not part:
                    break
                head += part
        assert head.split(b"\r\n")[0].endswith(b"408 Request Timeout"), head[:200]
        assert json.loads(head.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "request_timeout"
        body = {"messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=body, timeout=120) as busy:
            assert busy.status_code == 200
            lines = busy.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)  # the stream runs: its connection is held
            with socket.create_connection((srv.host, srv.port)) as other:  # one connection too many
                other.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                other.settimeout(30)
                assert other.recv(4096).split(b"\r\n")[0].endswith(b"503 Service Unavailable")
        assert srv.engine.wait_idle(120)
        assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200


def test_a_server_fault_is_a_logged_json_500(loaded, caplog, monkeypatch):
    import logging

    with ServerThread(loaded) as srv:
        def broken(req, max_pending=None):
            raise RuntimeError("the engine's disk is on fire")

        monkeypatch.setattr(srv.engine, "submit", broken)
        with caplog.at_level(logging.ERROR, logger="workbench.serving"):
            r = _post(srv, {"messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert any("disk is on fire" in rec.getMessage() and rec.exc_info for rec in caplog.records)


def test_a_slow_request_head_is_closed(loaded):
    """A client sending its request head and never finishing it loses the connection; the server serves on."""
    with ServerThread(loaded, limits=ServerLimits(header_read_timeout_s=0.3)) as srv:
        with socket.create_connection((srv.host, srv.port)) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
            slow.settimeout(30)
            assert slow.recv(4096) == b""  # closed by the server
        with httpx.Client(timeout=30) as c:  # a kept-alive connection between requests is not cut mid-request
            assert c.get(srv.base_url + "/health").status_code == 200
            assert c.post(srv.base_url + "/v1/chat/completions",
                          json={"messages": MESSAGES, "max_tokens": 40, "ignore_eos": True}).status_code == 200


def test_job_routes_check_the_model_and_last_event_id(loaded, tmp_path):
    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3"}) as srv:
        r = httpx.post(srv.base_url + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": 2, "model": "nope"},
                       timeout=60)
        _error(r, 404, "model")
        r = httpx.post(srv.base_url + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": 2}, timeout=60)
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        r = httpx.get(f"{srv.base_url}/v1/jobs/{jid}/events", headers={"Last-Event-ID": f"{jid}:\u0663".encode()},
                      timeout=60)
        _error(r, 400, "Last-Event-ID")
