"""One failure fails one request (issue 36): a callback that raises inside an engine ends its own request with
``error`` and the reason, the engine goes on; a dead engine is not healthy (``/health`` 503, the server exits);
a job store locked by another process delays job events, never generation."""

import sqlite3
import subprocess
import sys
import textwrap
import time
import types

import httpx
import pytest

from workbench.measure.generation import GenerationSettings
from workbench.serving import engine_kinds, engines
from workbench.serving.options import EngineOptions
from workbench.serving.server import EngineWatch, ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _req(loaded, n=4, **kw):
    ids = engines.prompt_ids(loaded.tokenizer, MESSAGES)
    return engines.EngineRequest(ids, GenerationSettings(max_new_tokens=n, ignore_eos=True), **kw)


def _raise(*_):
    raise sqlite3.OperationalError("database is locked")


@pytest.mark.parametrize("name", ["fifo", "continuous"])
def test_a_raising_token_callback_fails_its_request_only(loaded, name):
    """The continuous engine's router had no guard: a raising on_token killed it and every later request hung."""
    eng = engine_kinds.make_engine(EngineOptions(engine=name, max_batch_size=2, max_seq_tokens=256), loaded,
                              settings=GenerationSettings(max_new_tokens=8))
    try:
        bad = eng.submit(_req(loaded, 6, on_token=_raise))
        assert bad.done.wait(120)
        res = bad.result()
        assert res["finish_reason"] == "error" and "database is locked" in res["error"] and "on_token" in res["error"]
        good = eng.submit(_req(loaded, 3))
        assert good.done.wait(120), "the engine stopped serving after one request's callback failed"
        assert good.result()["finish_reason"] == "length" and good.result()["output_tokens"] == 3
        assert eng.health() == (True, "ok")
    finally:
        eng.stop()


@pytest.mark.parametrize("name", ["fifo", "static", "continuous"])
def test_a_raising_done_callback_of_a_request_stopped_while_queued_fails_only_it(loaded, name):
    """BaseEngine._loop called r.finish() of a request stopped while queued outside any guard: a raising on_done
    (the job store's write) killed the fifo / static worker."""
    eng = engine_kinds.make_engine(EngineOptions(engine=name, max_batch_size=1, max_seq_tokens=256, batch_window_s=0.0), loaded,
                              settings=GenerationSettings(max_new_tokens=8))
    try:
        first = eng.submit(_req(loaded, 6))
        victim = _req(loaded, 4, on_done=_raise)
        victim.stop("cancelled")
        eng.submit(victim)
        assert victim.done.wait(120)
        assert victim.finish_reason == "error" and "on_done" in victim.error and "locked" in victim.error
        after = eng.submit(_req(loaded, 2))
        assert first.done.wait(120) and after.done.wait(120), "the engine died with the victim's callback"
        assert after.finish_reason == "length"
        assert [h for h in eng.history if h["id"] == victim.id][0]["finish_reason"] == "error"
    finally:
        eng.stop()


def _kill_worker(eng, loaded):
    """Make the engine's worker die outside any request's callbacks (a fault that escapes every guard)."""
    def broken(first):
        raise SystemExit("queue corrupted")

    eng._collect = broken
    r = eng.submit(_req(loaded, 2))
    end = time.monotonic() + 30
    while eng._thread.is_alive() and time.monotonic() < end:
        time.sleep(0.02)
    assert r.done.wait(10) and r.finish_reason == "error" and "queue corrupted" in r.error  # not left hanging


def test_a_dead_engine_is_503_on_health_and_on_requests(loaded):
    with ServerThread(loaded, engine="fifo") as srv:
        assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
        _kill_worker(srv.engine, loaded)
        h = httpx.get(srv.base_url + "/health", timeout=30)
        assert h.status_code == 503, h.text
        assert h.json()["status"] == "unhealthy" and "queue corrupted" in h.json()["reason"]
        r = httpx.post(srv.base_url + "/v1/chat/completions", timeout=30,
                       json={"model": "workbench-default", "messages": MESSAGES, "max_tokens": 2})
        assert r.status_code == 503 and "queue corrupted" in r.json()["error"]["message"]


def test_engine_watch_stops_the_server_when_the_engine_is_dead(loaded):
    eng = engine_kinds.make_engine(EngineOptions(engine="fifo"), loaded)
    server = types.SimpleNamespace(should_exit=False)
    watch = EngineWatch(eng, server, interval_s=0.05).start()
    try:
        time.sleep(0.2)
        assert not server.should_exit and watch.reason is None
        _kill_worker(eng, loaded)
        end = time.monotonic() + 10
        while not server.should_exit and time.monotonic() < end:
            time.sleep(0.02)
        assert server.should_exit and "queue corrupted" in watch.reason
    finally:
        watch.stop()


def test_a_stuck_engine_is_unhealthy(loaded):
    eng = engine_kinds.make_engine(EngineOptions(engine="fifo"), loaded)
    try:
        eng.stall_s = 0.0
        assert eng.health()[0]  # idle: not stuck
        eng._running = 1        # a batch that delivers nothing
        ok, why = eng.health()
        assert not ok and "stuck" in why
        eng._running = 0
    finally:
        eng.stop()


_LOCKER = textwrap.dedent('''
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    db.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.readline()
    db.execute("COMMIT")
''')


def test_a_store_locked_by_another_process_delays_job_events_never_generation(loaded, tmp_path):
    """The issue's reproduction: while another process holds the store's write lock (BEGIN EXCLUSIVE) a job runs to
    its end and a chat request is served; /health stays 200; once unlocked the job is done with all its output."""
    db = tmp_path / "jobs.sqlite3"
    with ServerThread(loaded, engine="fifo", jobs={"path": db, "flush_s": 0.0}) as srv:
        jid = httpx.post(srv.base_url + "/v1/jobs", timeout=60,
                         json={"messages": MESSAGES, "max_tokens": 24, "ignore_eos": True}).json()["id"]
        end = time.monotonic() + 120
        while httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30).json()["output_tokens"] < 2:
            assert time.monotonic() < end
            time.sleep(0.02)
        locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(db)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout.readline().strip() == "locked"
            chat = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60,
                              json={"model": "workbench-default", "messages": MESSAGES, "max_tokens": 3})
            assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 3
            assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
            # the job's generation ended while the store was locked (its request left the engine)
            assert srv.engine.wait_idle(60)
            assert locker.poll() is None, "the lock was released before the engine finished"
            st = httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30).json()  # reads are not blocked either
            assert st["status"] == "running"
        finally:
            locker.stdin.write("\n")
            locker.stdin.close()
            locker.wait(60)
        end = time.monotonic() + 120
        while (st := httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30).json())["status"] == "running":
            assert time.monotonic() < end
            time.sleep(0.05)
        assert st["status"] == "done" and st["output_tokens"] == 24, st
        res = httpx.get(f"{srv.base_url}/v1/jobs/{jid}/result", timeout=30).json()
        assert len(res["output_ids"]) == 24
