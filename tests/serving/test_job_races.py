"""Jobs that hold under races and outages (issue 51): a job is continued once however many continues arrive at once,
an outage of the store strands no job (its final status lands once the store is back; a job left without its run
reads as interrupted, continues, and its event stream ends), and deleting a queued job frees its place in the
engine's queue at once, jobs counting against the chat route's admission limit.

Stand-in and gated engines over the real default model's tokenizer; the real model and server in the last test."""

import json
import sqlite3
import threading
import time
import types

import pytest

from tests.serving.test_jobs_store import (  # the store tests' engine stand-in (records, never generates)
    StandIn,
    default_tokenizer,
)
from workbench.measure.generation import GenerationSettings
from workbench.serving import engine_kinds, engines, job_routes, job_store, jobs, options, scheduling

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


class GatedEngine(engine_kinds.StaticEngine):
    """A real static engine (batch 1) whose batches "generate" only when the test releases them."""

    def __init__(self, tokenizer):
        self.gate = threading.Semaphore(0)
        self.batches: list = []
        loaded = types.SimpleNamespace(model=types.SimpleNamespace(generation_config=types.SimpleNamespace(
            eos_token_id=tokenizer.eos_token_id)), tokenizer=tokenizer, info=None)
        super().__init__(loaded, 1, 0.0, options.PolicyOptions().make_queue("static"))

    def _serve(self, batch):
        for r in batch:
            r.t_admit = time.perf_counter()
        self.batches.append(list(batch))
        assert self.gate.acquire(timeout=30), "the test never released this batch"
        for r in batch:
            for _ in range(r.settings.max_new_tokens):
                if r.stopped():
                    break
                r.token(1, time.perf_counter())
            r.finish("length")


def _wait(cond, timeout=20.0, what="condition"):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"{what} not reached within {timeout} s"
        time.sleep(0.01)


def _interrupted_job(store, eng, max_tokens=8):
    """A job whose run ended interrupted (as after a restart): queued, then stopped with reason interrupted."""
    jid = store.submit({"messages": MESSAGES, "max_tokens": max_tokens})["id"]
    (req,) = eng.groups[-1]
    req.on_token(42, time.perf_counter() + 10)
    store._runs[jid].stop("interrupted")
    req.on_done({"finish_reason": "interrupted", "error": None})
    assert store.drain(30)
    _wait(lambda: store.status(jid)["status"] == "interrupted", what="interrupted")
    return jid


def test_sixteen_concurrent_continues_start_exactly_one_run(tmp_path, tokenizer, monkeypatch):
    """The issue's race: the status check and the update that starts a continuation were separate statements, so
    two of 16 continues sent at once both answered 200 and the job ran twice (462 tokens of 300). The checks
    between them are slowed here so that every continue passes the check before any updates."""
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        jid = _interrupted_job(store, eng)
        groups_before = len(eng.groups)
        real = store._check_engine

        def slow_check(*a, **k):
            time.sleep(0.2)
            return real(*a, **k)

        monkeypatch.setattr(store, "_check_engine", slow_check)
        barrier, codes = threading.Barrier(16), []

        def one():
            barrier.wait()
            try:
                store.continue_job(jid)
                codes.append(200)
            except job_store.JobError as exc:
                codes.append(exc.status)

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(codes) == [200] + [409] * 15, codes
        assert len(eng.groups) == groups_before + 1   # one run submitted to the engine, not two
        assert store.status(jid)["runs"] == 2
    finally:
        store.close(timeout=1)


def test_a_continue_while_a_run_is_live_is_refused(tmp_path, tokenizer):
    """The run registry takes one run per job: a job whose row reads failed while its run still writes its end
    (or any live run) is not started a second time."""
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 8})["id"]
        store._q("UPDATE jobs SET status='failed' WHERE id=?", (jid,))   # its run is still live
        with pytest.raises(job_store.JobError) as exc:
            store.continue_job(jid)
        assert exc.value.status == 409 and "\n" not in exc.value.message
        assert len(eng.groups) == 1
    finally:
        store.close(timeout=1)


class _Outage:
    """Every store write fails (``database or disk is full``, at once, as a full disk does) while ``on``."""

    def __init__(self, store, monkeypatch):
        self.on = False
        real = store._transaction

        def transaction():
            if self.on:
                raise sqlite3.OperationalError("database or disk is full")
            return real()

        monkeypatch.setattr(store, "_transaction", transaction)


def test_an_outage_longer_than_the_retries_strands_no_job(tmp_path, tokenizer, monkeypatch):
    """The issue's outage: every write fails while a job finishes. Before, the job stayed queued for good (continue
    409 "is queued", its event stream never ended, nothing purged it). Now its end waits in the writer and lands
    once the store is back: the job is final, keeps the output written before, continues, and its stream ends."""
    monkeypatch.setattr(job_store, "WRITE_RETRIES", 1)
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    outage = _Outage(store, monkeypatch)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 8})["id"]
        (req,) = eng.groups[-1]
        req.on_token(42, time.perf_counter() + 10)
        assert store.drain(30) and store.result(jid)["output_ids"] == [42]
        outage.on = True
        req.on_token(43, time.perf_counter() + 20)
        assert store.drain(30) and req.stop_reason == "write_failed"   # the failed write stopped the run
        req.on_done({"finish_reason": "write_failed", "error": None})
        assert store.drain(30)
        time.sleep(1.0)   # longer than the writer's retries
        during = store.status(jid)
        assert during["status"] in ("queued", "running")   # its end is pending, not lost
        with pytest.raises(job_store.JobError) as exc:      # and its run is live: not continued twice
            store.continue_job(jid)
        assert exc.value.status == 409
        outage.on = False
        _wait(lambda: store.status(jid)["status"] not in ("queued", "running"), 15, "the job's final status")
        st = store.status(jid)
        assert st["status"] == "failed" and "continue" in st["error"]
        assert store.result(jid)["output_ids"] == [42, 43]   # what was kept in memory is written too
        rows, r = store.events_after(jid, 0)
        assert r["status"] == "failed"                       # an event stream polling this ends
        assert store.continue_job(jid)["status"] in ("queued", "running")
        assert len(eng.groups) == 2
    finally:
        outage.on = False
        store.close(timeout=1)


def test_a_job_that_ended_during_an_outage_is_done_once_its_end_lands(tmp_path, tokenizer, monkeypatch):
    """A job whose engine request ended by itself while the store refused its writes: all its tokens are kept in
    memory and written when the store is back, and it is done (not failed: nothing of it is missing)."""
    monkeypatch.setattr(job_store, "WRITE_RETRIES", 0)
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    outage = _Outage(store, monkeypatch)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 3})["id"]
        (req,) = eng.groups[-1]
        outage.on = True
        for i, tok in enumerate((7, 8, 9)):
            req.on_token(tok, time.perf_counter() + 10 * (i + 1))
        req.on_done({"finish_reason": "length", "error": None})
        assert store.drain(30)
        time.sleep(0.6)
        assert store.status(jid)["status"] in ("queued", "running")
        outage.on = False
        _wait(lambda: store.status(jid)["status"] not in ("queued", "running"), 15, "the job's final status")
        st = store.status(jid)
        assert st["status"] == "done" and st["finish_reason"] == "length" and st["output_tokens"] == 3
    finally:
        outage.on = False
        store.close(timeout=1)


def test_a_job_whose_run_is_gone_reads_interrupted_and_continues(tmp_path, tokenizer):
    """A job left queued with no run (its end's writes lost) is interrupted on the next read, written so by the
    writer, and continues; before it read queued and 409 for good."""
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 8})["id"]
        store._ended(jid, store._runs[jid])   # its run is gone; the row still says queued
        assert store.status(jid)["status"] == "interrupted"
        assert store.events_after(jid, 0)[1]["status"] == "interrupted"
        assert store.drain(30)
        with sqlite3.connect(str(tmp_path / "j.sqlite3")) as db:
            assert db.execute("SELECT status FROM jobs WHERE id=?", (jid,)).fetchone()[0] == "interrupted"
        assert store.continue_job(jid)["status"] in ("queued", "running")
        assert len(eng.groups) == 2
    finally:
        store.close(timeout=1)


def test_the_event_stream_of_a_stranded_job_ends(tmp_path, tokenizer):
    """``GET /v1/jobs/{id}/events`` of a job whose run is gone ends with its status and ``[DONE]`` (before it
    polled a queued job forever)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from workbench.serving import http

    app = FastAPI()
    http.install_error_handlers(app)
    store = job_routes.install(app, StandIn(tokenizer), path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 8})["id"]
        store._ended(jid, store._runs[jid])
        got = []

        def read():
            with TestClient(app) as client, client.stream("GET", f"/v1/jobs/{jid}/events") as r:
                got.extend(r.iter_lines())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(20)
        assert not t.is_alive(), "the event stream of a stranded job never ended"
        data = [x[len("data: "):] for x in got if x.startswith("data: ")]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["status"] == "interrupted"
    finally:
        store.close(timeout=1)


def test_a_withdrawn_group_member_leaves_the_queue():
    """A job's request is queued as a group: withdrawing it took nothing out (the queue compared whole items)."""
    q = scheduling.PolicyQueue()
    a, b = (engines.EngineRequest([1], GenerationSettings(max_new_tokens=2)) for _ in range(2))
    q.put([a, b])
    assert q.remove(a) and q.qsize() == 1
    assert q.get(timeout=1) == [b]
    q.put([a])
    assert q.remove(a) and q.qsize() == 0 and q.get(timeout=0.05) is None


def test_deleting_a_queued_job_frees_its_place_at_once(tmp_path, tokenizer):
    """The issue's case with ``--max-queue 1`` (2 pending at most): one chat request running, a job queued behind
    it and deleted: the next chat request is admitted (before: 429, the deleted job's request kept its place)."""
    eng = GatedEngine(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    chat = lambda: engines.EngineRequest([5] * 8, GenerationSettings(max_new_tokens=2), endpoint="chat")  # noqa: E731
    try:
        eng.submit(chat(), max_pending=2)
        _wait(lambda: len(eng.batches) == 1, what="the chat request running")
        jid = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
        assert eng.pending == 2 and eng.queue.qsize() == 1
        with pytest.raises(engines.EngineFull):
            eng.submit(chat(), max_pending=2)
        store.delete(jid)
        assert eng.pending == 1 and eng.queue.qsize() == 0     # at once, not when the worker reaches it
        eng.submit(chat(), max_pending=2)                      # admitted
        for _ in range(3):
            eng.gate.release()
        assert eng.wait_idle(20)
        assert [r.endpoint for b in eng.batches for r in b] == ["chat", "chat"]   # the deleted job never ran
    finally:
        for _ in range(3):
            eng.gate.release()
        store.close(timeout=1)
        eng.stop(5)


def test_jobs_count_against_the_chat_admission_limit(tmp_path, tokenizer):
    """Queued jobs cannot starve chat: a job that finds the engine full is a 429 with Retry-After and stores
    nothing, as a chat request would be refused; a continuation too."""
    eng = GatedEngine(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0, max_pending=2)
    try:
        eng.submit(engines.EngineRequest([5] * 8, GenerationSettings(max_new_tokens=2)), max_pending=2)
        _wait(lambda: len(eng.batches) == 1, what="the chat request running")
        eng.submit(engines.EngineRequest([5] * 8, GenerationSettings(max_new_tokens=2)), max_pending=2)
        with pytest.raises(job_store.JobError) as exc:
            store.submit({"messages": MESSAGES, "max_tokens": 4})
        assert exc.value.status == 429 and int(exc.value.headers["Retry-After"]) >= 1
        assert "max_queue" in exc.value.message and store.list() == []
    finally:
        for _ in range(3):
            eng.gate.release()
        store.close(timeout=1)
        eng.stop(5)


@pytest.mark.model
def test_a_job_cut_by_a_restart_is_continued_once_on_the_real_server(loaded, tmp_path):
    """End to end on the real server: a job interrupted by a restart, 16 continues at once: one 200, 15 409, and
    the job ends with exactly ``max_tokens`` output tokens in two runs."""
    import httpx

    from workbench.serving.server import ServerThread

    db, n = tmp_path / "jobs.sqlite3", 40
    with ServerThread(loaded, jobs={"path": db, "flush_s": 0.0}) as a:
        jid = httpx.post(a.base_url + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": n, "ignore_eos": True},
                         timeout=60).json()["id"]
        _wait(lambda: httpx.get(f"{a.base_url}/v1/jobs/{jid}", timeout=30).json()["output_tokens"] >= 4, 120,
              "the job's first tokens")
    with ServerThread(loaded, jobs={"path": db, "flush_s": 0.0}) as b:
        assert httpx.get(f"{b.base_url}/v1/jobs/{jid}", timeout=30).json()["status"] == "interrupted"
        barrier, codes = threading.Barrier(16), []

        def one():
            barrier.wait()
            codes.append(httpx.post(f"{b.base_url}/v1/jobs/{jid}/continue", timeout=60).status_code)

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert sorted(codes) == [200] + [409] * 15, codes
        st = {}

        def final():
            st.update(httpx.get(f"{b.base_url}/v1/jobs/{jid}", timeout=30).json())
            return st["status"] not in ("queued", "running")

        _wait(final, 180, "the continued job's end")
        assert st["status"] == "done" and st["output_tokens"] == n and st["runs"] == 2, st
