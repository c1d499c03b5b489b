"""Tests for workbench.serving.jobs: SQLite background jobs, restart, resume from breakpoint, limits, bad input."""

import json
import sqlite3
import time

import httpx
import pytest

from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.serving import events
from workbench.serving.engine_kinds import FifoEngine
from workbench.serving.jobs import JobStore
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _post(srv, body, **kw):
    return httpx.post(srv.base_url + "/v1/jobs", timeout=60, **kw,
                      **({"json": body} if not isinstance(body, (bytes, str)) else {"content": body}))


def _wait(srv, jid, statuses=("done", "failed", "cancelled", "interrupted"), timeout=180, until=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30).json()
        if st["status"] in statuses or (until and until(st)):
            return st
        time.sleep(0.05)
    raise AssertionError(f"job {jid} still {st}")


def _events(srv, jid, last=None):
    h = {"Last-Event-ID": last} if last else {}
    with httpx.stream("GET", f"{srv.base_url}/v1/jobs/{jid}/events", headers=h, timeout=120) as r:
        assert r.status_code == 200
        return list(events.iter_sse(r.iter_lines()))


def _text(evs):
    return "".join(json.loads(e.data)["text"] for e in evs if e.id)


def test_job_survives_restart_and_continues_from_its_breakpoint(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    n = 40
    ref = generate_measured(loaded, [MESSAGES], GenerationSettings(max_new_tokens=n, ignore_eos=True)).records[0]
    with ServerThread(loaded, jobs={"path": db, "flush_s": 0.0}) as a:
        short = _post(a, {"messages": MESSAGES, "max_tokens": 5})
        assert short.status_code == 202, short.text
        sid = short.json()["id"]
        _wait(a, sid)
        long = _post(a, {"messages": MESSAGES, "max_tokens": n, "ignore_eos": True}).json()["id"]
        st = _wait(a, long, until=lambda s: s["output_tokens"] >= 4)
        assert st["status"] in ("running", "done")
    # restarted: the finished job is intact, the cut one is interrupted with its prefix stored
    with ServerThread(loaded, jobs={"path": db}) as b:
        done = httpx.get(f"{b.base_url}/v1/jobs/{sid}/result", timeout=30).json()
        assert done["complete"] and done["status"] == "done" and len(done["output_ids"]) >= 1
        assert _text(_events(b, sid)) == done["text"]
        st = httpx.get(f"{b.base_url}/v1/jobs/{long}", timeout=30).json()
        assert st["status"] == "interrupted" and 4 <= st["output_tokens"] < n, st
        prefix = httpx.get(f"{b.base_url}/v1/jobs/{long}/result", timeout=30).json()
        assert prefix["output_ids"] == ref["output_ids"][:len(prefix["output_ids"])]
        seen = _events(b, long)  # the interrupted job's events so far, then its status
        assert json.loads(seen[-2].data)["status"] == "interrupted" and seen[-1].data == "[DONE]"
        cont = httpx.post(f"{b.base_url}/v1/jobs/{long}/continue", timeout=30)
        assert cont.status_code == 200 and cont.json()["status"] in ("queued", "running")
        st = _wait(b, long)
        assert st["status"] == "done" and st["runs"] == 2
        res = httpx.get(f"{b.base_url}/v1/jobs/{long}/result", timeout=30).json()
        assert res["output_ids"] == ref["output_ids"]  # equal to the uninterrupted greedy run
        assert res["text"] == ref["text"]
        # its event stream, resumed after the last event seen before the restart: the rest, exactly once
        last = [e for e in seen if e.id][-1].id
        rest = _events(b, long, last)
        assert _text([e for e in seen if e.id]) + _text(rest) == ref["text"]
        again = httpx.post(f"{b.base_url}/v1/jobs/{long}/continue", timeout=30)
        assert again.status_code == 409 and "already finished" in again.json()["error"]["message"]


def test_jobs_run_on_the_servers_engine_and_reach_its_observers(loaded, tmp_path):
    """One engine behind chat and jobs: a job's generation is an engine request (endpoint "jobs"), counted by
    /metrics through the engine's completion observers."""
    from workbench.serving.monitoring import scrape

    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3"}) as srv:
        jid = _post(srv, {"messages": MESSAGES, "max_tokens": 3, "ignore_eos": True}).json()["id"]
        assert _wait(srv, jid)["status"] == "done"
        assert srv.engine.wait_idle(60)
        mine = [h for h in srv.engine.history if h["id"] == jid]
        assert len(mine) == 1 and mine[0]["endpoint"] == "jobs" and mine[0]["output_tokens"] == 3
        m = scrape(httpx.get(srv.base_url + "/metrics", timeout=30).text)
    assert m['workbench_requests_total{endpoint="jobs",finish_reason="length"}'] == 1
    assert m['workbench_generation_tokens_total{endpoint="jobs"}'] == 3


def test_crashed_store_marks_running_jobs_interrupted(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    with FifoEngine(loaded) as engine:
        store = JobStore(engine, path=db)
        st = store.submit({"messages": MESSAGES, "max_tokens": 3})
        store.wait(st["id"])
        store.close()
        con = sqlite3.connect(db)  # what a killed server leaves behind
        con.execute("UPDATE jobs SET status='running' WHERE id=?", (st["id"],))
        con.commit()
        con.close()
        store = JobStore(engine, path=db)
        try:
            assert store.status(st["id"])["status"] == "interrupted"
            store.continue_job(st["id"])
            assert store.wait(st["id"])["status"] == "done"
        finally:
            store.close()


def test_limits_give_clear_errors(loaded, tmp_path):
    with ServerThread(loaded, jobs={"path": tmp_path / "a.sqlite3", "max_jobs": 2}) as srv:
        ids = [_post(srv, {"messages": MESSAGES, "max_tokens": 2}).json()["id"] for _ in range(2)]
        r = _post(srv, {"messages": MESSAGES, "max_tokens": 2})
        assert r.status_code == 429 and "max_jobs = 2" in r.json()["error"]["message"]
        for jid in ids:
            _wait(srv, jid)
        assert httpx.delete(f"{srv.base_url}/v1/jobs/{ids[0]}", timeout=30).json()["deleted"]
        assert _post(srv, {"messages": MESSAGES, "max_tokens": 2}).status_code == 202
    with ServerThread(loaded, jobs={"path": tmp_path / "b.sqlite3", "max_bytes": 100}) as srv:
        r = _post(srv, {"messages": MESSAGES, "max_tokens": 2})
        assert r.status_code == 429 and "max_bytes = 100" in r.json()["error"]["message"]
        assert httpx.get(srv.base_url + "/v1/jobs", timeout=30).json()["data"] == []
    with ServerThread(loaded, jobs={"path": tmp_path / "c.sqlite3", "max_bytes": 2000, "flush_s": 0.0}) as srv:
        jid = _post(srv, {"messages": MESSAGES, "max_tokens": 200, "ignore_eos": True}).json()["id"]
        st = _wait(srv, jid)
        assert st["status"] == "failed" and "max_bytes" in st["error"] and 0 < st["output_tokens"] < 200
    with ServerThread(loaded, jobs={"path": tmp_path / "d.sqlite3", "retention_s": 0.0}) as srv:
        jid = _post(srv, {"messages": MESSAGES, "max_tokens": 1}).json()["id"]
        end = time.monotonic() + 60
        while (r := httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30)).status_code == 200 and time.monotonic() < end:
            time.sleep(0.05)
        assert r.status_code == 410 and "expired" in r.json()["error"]["message"]


@pytest.mark.parametrize("body,headers,status,param", [
    (b"{not json", {"content-type": "application/json"}, 400, None),
    (b"[1]", {"content-type": "application/json"}, 400, None),
    ({"messages": []}, {}, 400, "messages"),
    ({"messages": MESSAGES, "max_tokens": 0}, {}, 400, "max_tokens"),
    ({"messages": MESSAGES, "max_tokens": 10**7}, {}, 400, "max_tokens"),
    ({"messages": MESSAGES, "temperature": "hot"}, {}, 400, "temperature"),
    ({"messages": MESSAGES, "bogus": 1}, {}, 400, "bogus"),
    ({"messages": [{"role": "robot", "content": "x"}]}, {}, 400, "messages.0.role"),
    (b'{"messages": []}', {"content-type": "text/plain"}, 415, "Content-Type"),
])
def test_malformed_job_requests_get_4xx_and_store_nothing(loaded, tmp_path, body, headers, status, param):
    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3"}) as srv:
        r = _post(srv, body, headers=headers)
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
        assert httpx.get(srv.base_url + "/v1/jobs", timeout=30).json()["data"] == []


def test_unknown_job_id_is_404_json(loaded, tmp_path):
    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3"}) as srv:
        for method, path in [("GET", ""), ("GET", "/result"), ("GET", "/events"), ("POST", "/continue"), ("DELETE", "")]:
            r = httpx.request(method, f"{srv.base_url}/v1/jobs/job-nope{path}", timeout=30)
            assert r.status_code == 404 and "unknown" in r.json()["error"]["message"], (method, path)
        jid = _post(srv, {"messages": MESSAGES, "max_tokens": 2}).json()["id"]
        _wait(srv, jid)
        r = httpx.get(f"{srv.base_url}/v1/jobs/{jid}/events", headers={"Last-Event-ID": f"{jid}:999"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "Last-Event-ID"
        r = httpx.get(f"{srv.base_url}/v1/jobs/{jid}/events", params={"last_event_id": f"{jid}:\u0661"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "Last-Event-ID"  # '١' is no ASCII digit


# ------------------------------------------------------------------ long-output strategies as jobs

TOPIC = "Heat waves"


@pytest.mark.parametrize("body,param", [
    ({"strategy": "outline_batch"}, "topic"),
    ({"strategy": "saga", "topic": TOPIC}, "strategy"),
    ({"strategy": "outline_batch", "topic": TOPIC, "max_tokens": 20, "n_sections": 4}, "max_tokens"),
    ({"strategy": "one_shot", "topic": TOPIC, "messages": MESSAGES}, "messages"),
    ({"messages": MESSAGES, "topic": TOPIC}, "topic"),
    ({"strategy": "outline_sequential", "topic": TOPIC, "n_sections": 0}, "n_sections"),
    ({"strategy": "one_shot", "topic": TOPIC, "ignore_eos": True}, "ignore_eos"),
    ({"strategy": "one_shot", "topic": TOPIC, "language": "fr"}, "language"),
    ({"strategy": "one_shot", "topic": TOPIC, "outline_tokens": 8}, "outline_tokens"),
    ({"strategy": "outline_batch", "topic": "   "}, "topic"),
    ({"strategy": "one_shot", "topic": TOPIC, "max_tokens": True}, "max_tokens"),
])
def test_malformed_long_output_jobs_name_the_field_and_store_nothing(loaded, tmp_path, body, param):
    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3"}) as srv:
        r = _post(srv, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert httpx.get(srv.base_url + "/v1/jobs", timeout=30).json()["data"] == []


def test_one_shot_job_is_the_strategy_prompt_streamed_token_by_token(loaded, tmp_path):
    from workbench.techniques.long_form import one_shot_prompt

    ref = generate_measured(loaded, [one_shot_prompt(TOPIC, 2, "zh")], GenerationSettings(max_new_tokens=4)).records[0]
    with ServerThread(loaded, jobs={"path": tmp_path / "j.sqlite3", "flush_s": 0.0}) as srv:
        jid = _post(srv, {"strategy": "one_shot", "topic": TOPIC, "n_sections": 2, "language": "zh",
                          "max_tokens": 4}).json()["id"]
        st = _wait(srv, jid)
        assert st["status"] == "done" and st["strategy"] == "one_shot", st
        res = httpx.get(f"{srv.base_url}/v1/jobs/{jid}/result", timeout=30).json()
        assert res["output_ids"] == ref["output_ids"] and res["text"] == ref["text"]
        assert _text(_events(srv, jid)) == ref["text"]


@pytest.mark.parametrize("strategy", ["outline_batch", "outline_sequential"])
def test_outline_job_streams_sections_survives_restart_and_equals_the_direct_run(loaded, tmp_path, strategy):
    from workbench.techniques.long_form import LongOutputPlan, run_long_output

    plan = LongOutputPlan.make(20, 2, outline_tokens=4)  # the smallest budget: 4 outline + 2 x 8 section tokens
    ref = run_long_output(loaded, strategy, TOPIC, plan)
    db = tmp_path / "j.sqlite3"
    body = {"strategy": strategy, "topic": TOPIC, "n_sections": 2, "outline_tokens": 4, "max_tokens": 20}
    with ServerThread(loaded, jobs={"path": db}) as a:
        jid = _post(a, body).json()["id"]
        st = _wait(a, jid, until=lambda s: s["stages"] >= 1)  # the outline is stored: stop the server now
    with ServerThread(loaded, jobs={"path": db}) as b:
        st = httpx.get(f"{b.base_url}/v1/jobs/{jid}", timeout=30).json()
        assert st["status"] in ("interrupted", "done") and st["stages"] >= 1, st
        if st["status"] == "interrupted":  # continued: the stored stages are reused, the cut one redone
            assert httpx.post(f"{b.base_url}/v1/jobs/{jid}/continue", timeout=30).status_code == 200
        st = _wait(b, jid)
        assert st["status"] == "done" and st["strategy"] == strategy, st
        res = httpx.get(f"{b.base_url}/v1/jobs/{jid}/result", timeout=30).json()
        assert res["text"] == ref.text and res["outline"] == ref.outline
        evs = [e for e in _events(b, jid) if e.id]
        assert len(evs) == 2 and _text(evs) == ref.text  # one event per section, concatenating to the text
        assert st["output_tokens"] == ref.row["output_tokens"]
