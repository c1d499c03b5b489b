"""The job store loses nothing (issue 23): failed writes roll back, later writes survive a kill, one server
per store. A stand-in engine (nothing generates) over the real default model's tokenizer."""

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import types

import pytest

from workbench.errors import ParameterError
from workbench.serving import job_store, jobs

MESSAGES = [{"role": "user", "content": "Hi"}]


def default_tokenizer():
    from transformers import AutoTokenizer

    from workbench.measure.models import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("default")))


class StandIn:
    """An engine that records what it is given and never generates."""

    def __init__(self, tokenizer):
        self.loaded = types.SimpleNamespace(tokenizer=tokenizer, info=None)
        self.eos = {tokenizer.eos_token_id}
        self.groups = []

    def submit_group(self, reqs):
        self.groups.append(reqs)
        return reqs


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def _ids_in_file(path) -> set:
    with sqlite3.connect(str(path)) as db:
        return {r[0] for r in db.execute("SELECT id FROM jobs")}


_CHILD = textwrap.dedent('''
    import os, signal, sqlite3, sys
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_jobs_store import StandIn, default_tokenizer, MESSAGES
    from workbench.serving import jobs

    store = jobs.JobStore(StandIn(default_tokenizer()), path=sys.argv[1], flush_s=0.0)
    a = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
    store._q("INSERT INTO job_events VALUES (?, 1, 'x')", (a,))   # the next event number of a is taken
    try:
        store._append(a, [5], ["piece"])                            # fails in the middle of its transaction
        raise SystemExit("the forced failure did not happen")
    except sqlite3.IntegrityError:
        pass
    b = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
    print(a, b, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)                          # no clean close
''')


def test_a_failed_write_loses_no_later_write_even_after_a_kill(tmp_path):
    """The issue's reproduction: job a, a UNIQUE violation inside _append, job b, then the process is killed:
    both jobs are in the file (before the fix the connection stayed inside the failed transaction and b was
    never committed)."""
    db = tmp_path / "jobs.sqlite3"
    env = {**os.environ, "TEST_DIR": os.path.dirname(__file__)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(db)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == -9, out.stderr[-2000:]
    a, b = out.stdout.split()
    assert _ids_in_file(db) == {a, b}


def test_a_failed_write_rolls_back_and_the_store_keeps_working(tmp_path, tokenizer):
    store = jobs.JobStore(StandIn(tokenizer), path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        a = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
        store._q("INSERT INTO job_events VALUES (?, 1, 'x')", (a,))
        with pytest.raises(sqlite3.IntegrityError):
            store._append(a, [5, 6], ["p", "q"])
        assert not store._db.in_transaction
        assert store.result(a)["output_ids"] == []  # nothing of the failed write is half-stored
        b = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
    finally:
        store.close(timeout=1)
    assert _ids_in_file(tmp_path / "j.sqlite3") == {a, b}


def test_a_transient_write_failure_is_retried(tmp_path, tokenizer, monkeypatch):
    store = jobs.JobStore(StandIn(tokenizer), path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        a = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
        real, calls = store._transaction, []

        def flaky():
            calls.append(1)
            if len(calls) == 1:
                raise sqlite3.OperationalError("database is locked")
            return real()

        monkeypatch.setattr(store, "_transaction", flaky)
        assert store._append(a, [5], ["p"])
        assert len(calls) == 2 and store.result(a)["text"] == "p"
    finally:
        store.close(timeout=1)


def test_a_job_whose_output_cannot_be_written_fails_with_the_reason(tmp_path, tokenizer, monkeypatch):
    """Writes that keep failing: the run stops and the job is failed with the reason, not silently short."""
    eng = StandIn(tokenizer)
    store = jobs.JobStore(eng, path=tmp_path / "j.sqlite3", flush_s=0.0)
    try:
        jid = store.submit({"messages": MESSAGES, "max_tokens": 4})["id"]
        (req,) = eng.groups[-1]
        monkeypatch.setattr(job_store, "WRITE_RETRIES", 0)
        real = store._append
        monkeypatch.setattr(store, "_append", lambda *a, **k: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error")))
        req.on_token(42, time.perf_counter() + 1)
        assert store.drain(30)  # the engine's callback only hands the write to the store's writer thread
        assert req.cancel.is_set() and req.stop_reason == "write_failed"
        req.on_done({"finish_reason": "write_failed", "error": None})
        assert store.drain(30)
        st = store.status(jid)
        assert st["status"] == "failed" and "disk I/O error" in st["error"]
        monkeypatch.setattr(store, "_append", real)
    finally:
        store.close(timeout=1)


def test_a_second_server_refuses_an_owned_store(tmp_path, tokenizer):
    path = tmp_path / "j.sqlite3"
    first = jobs.JobStore(StandIn(tokenizer), path=path)
    try:
        with pytest.raises(job_store.StoreLockedError) as err:
            jobs.JobStore(StandIn(tokenizer), path=path)
        msg = str(err.value)
        assert isinstance(err.value, ParameterError) and "\n" not in msg
        assert msg.startswith("jobs_db:") and f"pid {os.getpid()}" in msg
        with pytest.raises(job_store.StoreLockedError):
            job_store.check_store_free(path)
    finally:
        first.close(timeout=1)
    job_store.check_store_free(path)  # released at close: a restarted server takes it back
    jobs.JobStore(StandIn(tokenizer), path=path).close(timeout=1)


def test_default_store_is_per_server(tmp_path):
    a, b = job_store.default_path("127.0.0.1:8000"), job_store.default_path("127.0.0.1:8001")
    assert a != b and a.parent == b.parent and a.name == "127.0.0.1_8000.sqlite3"


def test_sqlite_settings_are_durable(tmp_path, tokenizer):
    store = jobs.JobStore(StandIn(tokenizer), path=tmp_path / "j.sqlite3")
    try:
        assert store._q("PRAGMA journal_mode")[0][0] == "wal"
        assert store._q("PRAGMA synchronous")[0][0] == 2  # FULL
    finally:
        store.close(timeout=1)
