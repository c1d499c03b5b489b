"""Tests for workbench.serving.events: SSE ids, Last-Event-ID replay, resumable streams (real model, loopback)."""

import asyncio
import json
import random
import time

import httpx
import pytest

from workbench.serving import events
from workbench.serving.server import ServerThread

PROMPTS = {
    "en": "Write two sentences about the sea.",
    "zh": "请用中文写两句关于大海的话。",
    "emoji": "Reply only with emoji: 🌊🐟🌞🎉 and describe the sea with more emoji.",
}


@pytest.fixture(scope="module")
def server(loaded):
    with ServerThread(loaded, resume_timeout_s=30.0) as srv:
        yield srv


#: what a client reading SSE as such sends (a browser EventSource): its events come numbered (events.wants_event_ids)
SSE = {"Accept": "text/event-stream"}


def _body(prompt, max_tokens=24, **kw):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, **kw}


def _content(evs):
    out = []
    for e in evs:
        if e.data and e.data != "[DONE]":
            for c in json.loads(e.data).get("choices", []):
                out.append(c["delta"].get("content") or "")
    return "".join(out)


def _read(resp, limit=None):
    got = []
    for e in events.iter_sse(resp.iter_lines()):
        got.append(e)
        if limit is not None and len(got) >= limit:
            break
    return got


@pytest.mark.model
def test_every_event_has_a_consecutive_id(server):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=_body(PROMPTS["en"], 6), headers=SSE,
                      timeout=120) as r:
        assert r.status_code == 200
        evs = [e for e in _read(r) if not e.comment]
    sid = r.headers["x-stream-id"]
    assert [e.id for e in evs] == [f"{sid}:{n}" for n in range(1, len(evs) + 1)]
    assert evs[-1].data == "[DONE]"


@pytest.mark.model
@pytest.mark.parametrize("lang", sorted(PROMPTS))
def test_cut_stream_resumed_with_last_event_id_is_exactly_the_uninterrupted_text(server, lang):
    ref = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                     json={**_body(PROMPTS[lang]), "stream": False}).json()["choices"][0]["message"]["content"]
    body = _body(PROMPTS[lang], stream_options={"resumable": True})
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        total = 27  # role chunk + up to 24 content chunks + finish chunk + [DONE]
        cut = random.Random(f"{lang}-cut").randint(1, 8)
        first = _read(r, limit=cut)  # the client drops the connection here
    assert first and all(e.id for e in first)
    last = first[-1].id
    sid = events.event_number(last)[0]
    time.sleep(0.3)  # decoding goes on while nobody reads
    with httpx.stream("GET", f"{server.base_url}/v1/streams/{sid}", headers={"Last-Event-ID": last}, timeout=120) as r2:
        assert r2.status_code == 200
        rest = _read(r2)
    nums = [events.event_number(e.id)[1] for e in first + rest if e.id]
    assert nums == list(range(1, len(nums) + 1))  # nothing lost, nothing repeated
    assert len(nums) <= total and rest[-1].data == "[DONE]"
    assert _content(first + rest) == ref
    finish = [json.loads(e.data) for e in rest if e.data and e.data != "[DONE]"][-1]
    assert finish["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.model
def test_plain_stream_disconnect_still_stops_decoding(server):
    body = _body(PROMPTS["en"], max_tokens=400, ignore_eos=True)
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as r:
        _read(r, limit=3)
    assert server.engine.wait_idle(60)
    info = server.engine.history[-1]
    assert info["finish_reason"] == "cancelled" and info["output_tokens"] < 400


@pytest.mark.model
def test_bad_resume_requests_get_4xx_json(server):
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=_body(PROMPTS["en"], 3), headers=SSE,
                      timeout=120) as r:
        evs = _read(r)
    sid = events.event_number(evs[0].id)[0]
    url = f"{server.base_url}/v1/streams/"
    cases = [
        (url + "chatcmpl-nope", {}, 404),
        (url + sid, {"Last-Event-ID": "garbage"}, 400),
        (url + sid, {"Last-Event-ID": "chatcmpl-other:1"}, 400),
        (url + sid, {"Last-Event-ID": f"{sid}:{len(evs) + 5}"}, 400),
    ]
    for u, h, status in cases:
        resp = httpx.get(u, headers=h, timeout=30)
        assert resp.status_code == status, (u, h, resp.text)
        assert resp.json()["error"]["message"]
    full = httpx.get(url + sid, headers={"Last-Event-ID": f"{sid}:{len(evs)}"}, timeout=30)
    assert full.status_code == 200 and "data:" not in full.text  # caught up: nothing more to send


@pytest.mark.model
def test_expired_stream_is_410(loaded):
    with ServerThread(loaded, stream_retention_s=0.0) as srv:
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=_body(PROMPTS["en"], 2), headers=SSE,
                          timeout=120) as r:
            evs = _read(r)
        sid = events.event_number(evs[0].id)[0]
        time.sleep(0.05)
        httpx.post(srv.base_url + "/v1/chat/completions", json={**_body(PROMPTS["en"], 1), "stream": False}, timeout=120)
        resp = httpx.get(f"{srv.base_url}/v1/streams/{sid}", headers={"Last-Event-ID": evs[0].id}, timeout=30)
        assert resp.status_code == 410 and "expired" in resp.json()["error"]["message"]


def test_keepalive_comments_while_idle_and_resumable_timeout():
    async def scenario():
        reg = events.StreamRegistry(resume_timeout_s=0.2, keepalive_s=0.05)
        cancelled = []

        async def slow():
            yield "data: 1\n\n"
            await asyncio.sleep(0.2)
            yield "data: 2\n\n"

        log = reg.start("s1", slow(), resumable=False)
        got = [x async for x in reg.read(log)]
        assert got[0] == "id: s1:1\ndata: 1\n\n" and events.KEEPALIVE_COMMENT in got and got[-1] == "id: s1:2\ndata: 2\n\n"

        async def endless():
            i = 0
            while True:
                i += 1
                yield f"data: {i}\n\n"
                await asyncio.sleep(0.01)

        log2 = reg.start("s2", endless(), cancel=lambda: cancelled.append(1), resumable=True)
        reader = reg.read(log2)
        await reader.__anext__()
        await reader.aclose()  # the client left; a resumable stream keeps going ...
        await asyncio.sleep(0.1)
        n = len(log2.events)
        assert not log2.done and n > 2
        await asyncio.sleep(0.3)  # ... until resume_timeout_s passes with nobody back
        assert log2.done and cancelled
        with pytest.raises(events.StreamError) as exc:
            reg.lookup("s2", "s2:999999")
        assert exc.value.status == 400

    asyncio.run(scenario())


def test_iter_sse_parses_ids_comments_and_multiline_data():
    lines = ["id: a:1", "data: x", "data: y", "", ": keep-alive", "", "data: [DONE]", ""]
    evs = list(events.iter_sse(lines))
    assert [(e.id, e.data, e.comment) for e in evs] == [("a:1", "x\ny", False), (None, None, True), (None, "[DONE]", False)]


@pytest.mark.parametrize("bad", ["s:\u0663", "s:\u00b2", "s:\uff11", "s:1\u0660", "s:-1", "s:", ":3", "s3"])
def test_last_event_id_needs_ascii_digits(bad):
    """str.isdigit() accepts Arabic-Indic, superscript and full-width digits; an event number is ASCII only."""
    with pytest.raises(events.StreamError) as exc:
        events.event_number(bad)
    assert exc.value.status == 400 and exc.value.param == "Last-Event-ID"


def test_check_last_event_id_names_the_stream_and_a_sent_event():
    assert events.check_last_event_id(None, "s", 3) == 0 and events.check_last_event_id("s:3", "s", 3) == 3
    for bad in ("t:1", "s:4", "s:\u0663"):
        with pytest.raises(events.StreamError) as exc:
            events.check_last_event_id(bad, "s", 3)
        assert exc.value.status == 400 and exc.value.param == "Last-Event-ID"
