"""Tests for workbench.serving.server: the OpenAI-compatible server with the real model over loopback HTTP."""

import json

import httpx
import pytest

from workbench.serving.server import DEFAULT_HOST, ServerThread

pytestmark = pytest.mark.model

PROMPT = "Name one colour."


@pytest.fixture(scope="module")
def server(loaded):
    with ServerThread(loaded, max_body_bytes=64 * 1024) as srv:
        yield srv


def _post(server, body, **kw):
    return httpx.post(server.base_url + "/v1/chat/completions", timeout=120, **kw,
                      **({"json": body} if not isinstance(body, (bytes, str)) else {"content": body}))


def test_binds_loopback_by_default(server):
    assert DEFAULT_HOST == "127.0.0.1" and server.host == "127.0.0.1" and server.port > 0


def test_sse_format(server):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert float(r.headers["x-engine-ttft-s"]) > 0
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["engine"]["engine_ttft_s"] > 0
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == finish[0]["engine"]["output_tokens"]


def test_non_stream_body_and_seeded_sampling(server):
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
            "max_tokens": 5, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    a, b = _post(server, body), _post(server, body)
    assert a.status_code == 200 and a.headers["cache-control"] == "no-cache" and "x-engine-ttft-s" in a.headers
    ja, jb = a.json(), b.json()
    assert ja["object"] == "chat.completion" and ja["choices"][0]["message"]["role"] == "assistant"
    assert ja["choices"][0]["message"]["content"] == jb["choices"][0]["message"]["content"]  # same seed
    u = ja["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and 1 <= u["completion_tokens"] <= 5
    assert ja["engine"]["output_tokens"] == u["completion_tokens"]


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x" * 70_000}]}, 413, None),
])
def test_malformed_requests_get_4xx_json(server, body, status, param):
    r = _post(server, body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert err["param"] == param


def test_server_still_serves_after_bad_requests(server):
    _post(server, b"\xff\xfe garbage", headers={"content-type": "application/json"})
    assert _post(server, {"messages": [{"role": "user", "content": "ok"}], "max_tokens": 1}).status_code == 200


def test_unknown_route_is_json_404(server):
    r = httpx.get(server.base_url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_disconnect_stops_generation(server):
    body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 400,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        content = 0
        for line in r.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                content += 1
            if content >= 2:
                break  # leaving the block closes the connection mid-stream
    assert server.engine.wait_idle(timeout=60)
    info = server.engine.history[-1]
    assert info["cancelled"] is True and info["finish_reason"] == "cancelled"
    assert 2 <= info["steps"] < 400
