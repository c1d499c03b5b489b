"""The old review's small serving faults (issue 51): a cancelled plain stream ends with its final event, a stream of
an earlier server run is 410 (not 404), ``Bearer`` is accepted in any case, a 500 body never echoes the exception's
text (engine failures included), and the server's API key can come from the environment instead of argv."""

import json
import time

import httpx
import pytest

from workbench.serving import events, http
from workbench.serving.server import ServerThread

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]
SECRET = "sk-the-detail-that-must-stay-in-the-log"


def _body(max_tokens, **kw):
    return {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True, **kw}


def _data(evs):
    return [e.data for e in evs if e.data is not None]


@pytest.mark.model
def test_a_cancelled_plain_stream_ends_with_its_final_event(loaded):
    """A plain stream whose reader left is cancelled; its log, read again, ended where decoding stopped with no
    finish chunk and no [DONE]: a reader could not tell a cut stream from a stalled one."""
    with ServerThread(loaded) as srv:
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=_body(400, ignore_eos=True),
                          timeout=120) as r:
            sid = r.headers["x-stream-id"]
            for n, _ in enumerate(events.iter_sse(r.iter_lines())):
                if n >= 3:
                    break
        assert srv.engine.wait_idle(60)
        time.sleep(0.2)
        with httpx.stream("GET", f"{srv.base_url}/v1/streams/{sid}", timeout=60) as again:
            assert again.status_code == 200
            got = _data(list(events.iter_sse(again.iter_lines())))
    assert got[-1] == "[DONE]", got[-3:]
    assert json.loads(got[-2])["choices"][0]["finish_reason"] == "cancelled"
    assert srv.engine.history[-1]["finish_reason"] == "cancelled"


@pytest.mark.model
def test_a_stream_of_an_earlier_server_run_is_410(loaded):
    """Streams live in memory: after a restart an old stream id was 404 (unknown), as if never sent; it is gone."""
    with ServerThread(loaded) as a:
        with httpx.stream("POST", a.base_url + "/v1/chat/completions", json=_body(2), timeout=120) as r:
            sid = r.headers["x-stream-id"]
            list(r.iter_lines())
    with ServerThread(loaded) as b:
        gone = httpx.get(f"{b.base_url}/v1/streams/{sid}", timeout=30)
        assert gone.status_code == 410, gone.text
        msg = gone.json()["error"]["message"]
        assert "earlier run" in msg and "\n" not in msg
        assert httpx.get(f"{b.base_url}/v1/streams/chatcmpl-nope", timeout=30).status_code == 404


@pytest.mark.model
def test_an_engine_failure_500_does_not_echo_its_cause(loaded, monkeypatch, caplog):
    import logging

    with ServerThread(loaded, engine="fifo") as srv:
        def broken(batch):
            raise RuntimeError(SECRET)

        monkeypatch.setattr(srv.engine, "_serve", broken)
        with caplog.at_level(logging.ERROR, logger="workbench.serving"):
            r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60,
                           json={"messages": MESSAGES, "max_tokens": 2})
            with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=_body(2), timeout=60) as s:
                streamed = "".join(s.iter_lines())
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert SECRET not in r.text and SECRET not in streamed
    assert any(SECRET in rec.getMessage() for rec in caplog.records)   # the cause is in the log


def _guarded_app(api_key=None):
    from fastapi import FastAPI

    app = FastAPI()
    http.install_error_handlers(app)

    async def boom():
        raise RuntimeError(f"cannot open /srv/private/{SECRET}")

    async def ok():
        return {"ok": True}

    app.add_api_route("/boom", boom, methods=["GET"])
    app.add_api_route("/v1/ok", ok, methods=["GET"])
    app.add_middleware(http.Guard, allowed_hosts=None, api_key=api_key)
    return app


def test_a_500_body_does_not_echo_the_exception_text(caplog):
    import logging

    from fastapi.testclient import TestClient

    with caplog.at_level(logging.ERROR, logger="workbench.serving"):
        r = TestClient(_guarded_app(), raise_server_exceptions=False).get("/boom")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert SECRET not in r.text and "/srv/private" not in r.text
    assert any(SECRET in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize("header,status", [
    ("Bearer k3y", 200), ("bearer k3y", 200), ("BEARER k3y", 200), ("Bearer   k3y", 200),
    ("Bearer wrong", 401), ("Basic k3y", 401), ("k3y", 401), ("", 401), ("Bearer", 401),
])
def test_the_bearer_scheme_is_case_insensitive(header, status):
    """RFC 9110: an authentication scheme's name is case-insensitive; ``bearer KEY`` was refused with 401."""
    from fastapi.testclient import TestClient

    client = TestClient(_guarded_app(api_key="k3y"))
    assert client.get("/v1/ok", headers={"Authorization": header} if header else {}).status_code == status


def test_the_api_key_can_come_from_the_environment(monkeypatch):
    """``workbench serve`` reads the key from ``$WORKBENCH_API_KEY`` when ``--api-key`` is not given, so the key
    need not appear in argv (``ps``, shell history, a run's recorded command line)."""
    from workbench.serving import server

    seen = {}
    monkeypatch.setattr(server, "serve", lambda *a, **k: seen.update(k))
    monkeypatch.setenv("WORKBENCH_API_KEY", "from-env")
    server.main(["--host", "0.0.0.0"])
    assert seen["api_key"] == "from-env"
    server.main(["--host", "0.0.0.0", "--api-key", "given"])
    assert seen["api_key"] == "given"
