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
    # plain data: events, as a line-based client reads them (vllm bench serve's request functions: every stripped,
    # non-empty line that is not a ": comment" is "data: <json>" or "data: [DONE]")
    lines = [ln.strip() for ln in raw.splitlines() if ln.strip() and not ln.startswith(":")]
    assert all(ln.startswith("data: ") for ln in lines), lines[:3]
    assert [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]] and lines[-1] == "data: [DONE]"
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0]["engine"]["engine_ttft_s"] > 0
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == finish[0]["engine"]["output_tokens"]


def test_an_sse_reader_gets_numbered_events(server):
    """A client that reads SSE as such (``Accept: text/event-stream``, a browser EventSource) or asks to resume
    gets each event with its ``id:`` (issue 14's resumable streams); a plain client gets data lines only."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "temperature": 0, "stream": True}
    for headers, extra in (({"Accept": "text/event-stream"}, {}), ({}, {"stream_options": {"resumable": True}})):
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**body, **extra},
                          headers=headers, timeout=120) as r:
            raw = r.read().decode()
            sid = r.headers["x-stream-id"]
        blocks = [e for e in raw.split("\n\n") if e and not e.startswith(":")]
        assert [b.split("\n", 1)[0] for b in blocks] == [f"id: {sid}:{n}" for n in range(1, len(blocks) + 1)]
        assert blocks[-1].endswith("data: [DONE]")


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
    # OpenAI's types, not pydantic's lax coercions: true is not 1 token, "7" is not a seed, NaN is no temperature
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "seed": "7"}, 400, "seed"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": True}, 400, "top_p"),
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
    info = server.engine.history[-1]  # the engine's result of the request
    assert info["finish_reason"] == "cancelled"
    assert 2 <= info["output_tokens"] < 400


# ------------------------------------------------------------------ SSE framing (issue 11, fault 12)


def _split_sse(raw: str) -> list[str]:
    """A strict line-splitting client: str.splitlines() cuts on U+2028, U+2029, U+0085 too."""
    return [ln for ln in raw.splitlines() if ln and not ln.startswith("id: ")]  # ids: workbench.serving.events


def test_sse_data_escapes_line_separators():
    from workbench.serving.events import sse_data

    text = "a\u2028b\u2029c\x85d\ne"
    raw = sse_data({"choices": [{"delta": {"content": text}}]}) + sse_data({"x": "\u2028"})
    lines = _split_sse(raw)
    assert len(lines) == 2 and all(ln.startswith("data: ") for ln in lines)
    parsed = [json.loads(ln[len("data: "):]) for ln in lines]  # every line parses on its own
    assert parsed[0]["choices"][0]["delta"]["content"] == text and parsed[1]["x"] == "\u2028"


def test_sse_stream_parses_under_splitlines(server, loaded):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        raw = r.read().decode()
        assert r.headers["x-accel-buffering"] == "no"  # what nginx's header mode honours (notebook 10)
    lines = _split_sse(raw)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    server.engine.wait_idle()
    assert text == loaded.tokenizer.decode(server.engine.history[-1]["output_ids"], skip_special_tokens=True)


# ------------------------------------------------------------------ hostile input and limits (issue 12)


def test_wrong_content_type_is_415(server):
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        r = _post(server, body, headers={"content-type": ctype} if ctype else {})
        assert r.status_code == 415 and r.json()["error"]["param"] == "Content-Type"
    ok = _post(server, body, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "192.168.1.10"])
def test_foreign_host_is_refused_on_loopback(server, host):
    r = _post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, headers={"Host": host})
    assert r.status_code in (403, 421) and r.json()["error"]["param"] == "Host"
    assert httpx.get(server.base_url + "/v1/models", headers={"Host": host}, timeout=10).status_code in (403, 421)
    assert httpx.get(server.base_url + "/v1/models", headers={"Host": f"localhost:{server.port}"},
                     timeout=10).status_code == 200


@pytest.mark.parametrize("body", [
    b'{"messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",  # past Python's recursion limit, under 64 KiB
    json.dumps({"messages": [{"role": "user", "content": "hi"}], "metadata": json.loads("[" * 200 + "]" * 200)}),
])
def test_deeply_nested_json_is_400_json(server, body):
    server_big = _post(server, body, headers={"content-type": "application/json"})
    assert server_big.status_code == 400
    assert server_big.headers["content-type"].startswith("application/json") and server_big.json()["error"]["message"]


@pytest.mark.parametrize("body,param", [
    ({"seed": 2**64}, "seed"),
    ({"seed": -1}, "seed"),
    ({"n": 2}, "n"),
    ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop"),
])
def test_out_of_range_and_unsupported_options_are_400_naming_the_field(server, body, param):
    r = _post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param)


def test_neutral_values_of_unsupported_options_pass(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "logprobs": False, "n": 1,
            "presence_penalty": 0, "seed": 2**63 - 1}
    assert _post(server, body).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_stop_is_honoured(server, stream):
    base = {"messages": [{"role": "user", "content": "Write two sentences about the sea."}], "max_tokens": 40,
            "temperature": 0, "ignore_eos": True}
    full = _post(server, base).json()
    text = full["choices"][0]["message"]["content"]
    assert len(text) > 20
    stop = text[10:14]
    want = text[:text.index(stop)]
    body = dict(base, stop=[stop, "\u0000never"])
    if not stream:
        r = _post(server, body).json()
        got, finish, used = r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"], \
            r["usage"]["completion_tokens"]
    else:
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=dict(body, stream=True),
                          timeout=120) as resp:
            chunks = [json.loads(ln[6:]) for ln in resp.iter_lines() if ln.startswith("data: {")]
        got = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        finish = next(c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
        used = next(c["engine"]["output_tokens"] for c in chunks if c.get("engine"))
    assert got == want and finish == "stop"
    assert used < full["usage"]["completion_tokens"]  # generation ended at the stop string, not at max_tokens


@pytest.fixture(scope="module")
def bounded(loaded):
    with ServerThread(loaded, max_queue=0, max_tokens_limit=64) as srv:
        yield srv


def test_queue_full_is_429_with_retry_after(bounded):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 64, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", bounded.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200  # running: the one request the engine serves
        busy = _post(bounded, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
        assert busy.json()["error"]["type"] == "rate_limit_exceeded"
    assert bounded.engine.wait_idle(timeout=60)
    assert _post(bounded, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).status_code == 200


def test_max_tokens_ceiling_is_configurable(bounded):
    r = _post(bounded, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "64" in r.json()["error"]["message"]


def test_request_timeout_stops_generation(loaded):
    with ServerThread(loaded, request_timeout_s=0.5) as srv:
        body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2000,
                "ignore_eos": True, "temperature": 0}
        r = _post(srv, body)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        assert srv.engine.wait_idle(timeout=60)
        info = srv.engine.history[-1]
        assert info["output_tokens"] < 2000 and info["finish_reason"] in ("timeout", "cancelled")


def test_tokenisation_runs_off_the_event_loop(server, monkeypatch):
    import threading
    import time as _time

    from workbench.serving import engines as engines_mod

    real = engines_mod.prompt_ids

    def slow(tok, messages):
        _time.sleep(2.0)  # a huge prompt's templating
        return real(tok, messages)

    monkeypatch.setattr(engines_mod, "prompt_ids", slow)
    out = {}
    th = threading.Thread(target=lambda: out.update(r=_post(server, {"messages": [{"role": "user", "content": "hi"}],
                                                                      "max_tokens": 1})))
    th.start()
    _time.sleep(0.3)
    t = _time.perf_counter()
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert _time.perf_counter() - t < 1.0  # the loop was free while the prompt was tokenised
    th.join(timeout=60)
    assert out["r"].status_code == 200


def test_non_loopback_bind_needs_an_api_key(loaded):
    from workbench.errors import ParameterError
    from workbench.serving.server import create_app

    with pytest.raises(ParameterError, match="API key") as e:
        create_app(loaded, host="0.0.0.0")
    assert "\n" not in str(e.value) and "--api-key" in str(e.value)


def test_api_key_is_required_when_set(loaded):
    with ServerThread(loaded, api_key="s3cret") as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert _post(srv, body).status_code == 401
        assert _post(srv, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert _post(srv, body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200


# ----------------------------------------------------------------------------- /v1/completions


def _vllm_bench_request(base_url: str, prompt: str, output_len: int) -> dict:
    """What ``vllm bench serve`` does for one request with its default backend (``vllm`` / ``openai``: its
    ``async_request_openai_completions``): the payload it sends and its line-by-line reading of the stream
    (strip, skip blanks and ``:`` comments, remove ``data: ``, ``json.loads`` all but ``[DONE]``)."""
    payload = {"model": "workbench-default", "prompt": prompt, "temperature": 0.0, "repetition_penalty": 1.0,
               "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
               "max_tokens": output_len, "ignore_eos": True}
    out = {"text": "", "chunks": 0, "output_tokens": None}
    with httpx.stream("POST", base_url + "/v1/completions", json=payload, timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            line = line.strip()
            if not line or line.startswith(":"):
                continue
            chunk = line.removeprefix("data: ")
            if chunk == "[DONE]":
                continue
            data = json.loads(chunk)                  # an "id:" line or any other shape fails here
            if choices := data.get("choices"):
                out["chunks"] += 1
                out["text"] += choices[0].get("text") or ""
            elif usage := data.get("usage"):
                out["output_tokens"] = usage.get("completion_tokens")
    return out


def test_vllm_bench_serves_default_backend_reads_the_completions_stream(server, loaded):
    """``vllm bench serve`` at its defaults posts to /v1/completions (a fresh user found a 404): every line of the
    stream parses, the usage gives the output tokens, and the streamed text is the non-streamed completion's."""
    got = _vllm_bench_request(server.base_url, "The capital of France is", 6)
    assert got["status"] == 200 and got["chunks"] >= 1 and got["output_tokens"] == 6
    plain = httpx.post(server.base_url + "/v1/completions", timeout=120,
                       json={"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
                             "ignore_eos": True}).json()
    assert plain["object"] == "text_completion" and plain["choices"][0]["text"] == got["text"]
    assert plain["usage"]["completion_tokens"] == 6 and plain["id"].startswith("cmpl-")
    ids = loaded.tokenizer("The capital of France is")["input_ids"]
    assert plain["usage"]["prompt_tokens"] == len(ids)                       # no chat template around it
    by_ids = httpx.post(server.base_url + "/v1/completions", timeout=120,
                        json={"prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True}).json()
    assert by_ids["choices"][0]["text"] == got["text"]                        # token ids: the same prompt
    assert 'endpoint="completions"' in httpx.get(server.base_url + "/metrics", timeout=30).text   # its own label


def test_the_openai_sdk_completions_and_its_default_length(server):
    """The ``openai`` SDK's legacy completions: 16 tokens when ``max_tokens`` is not given (OpenAI's default)."""
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    done = client.completions.create(model="workbench-default", prompt="Once upon a time",
                                     extra_body={"ignore_eos": True}, temperature=0)
    assert done.usage.completion_tokens == 16 and done.choices[0].text
    stream = client.completions.create(model="workbench-default", prompt="Once upon a time", max_tokens=5,
                                       temperature=0, stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) and chunks[-1].usage.completion_tokens == 5


@pytest.mark.parametrize("prompt,word", [(["a", "b"], "one prompt a request"), ([10 ** 9], "token ids must be"),
                                         ({"a": 1}, "prompt:")])
def test_a_bad_completion_prompt_is_400_naming_it(server, prompt, word):
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "prompt"


def test_the_openai_sdk_retrieves_the_served_model_and_gets_404_for_another(server):
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    assert client.models.retrieve("workbench-default").id == "workbench-default"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")
