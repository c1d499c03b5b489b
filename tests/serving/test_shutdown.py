"""Clean exits (issue 36): a shutdown is bounded, leaves running jobs interrupted, and a second Ctrl+C (uvicorn's
force exit, which skips the app's lifespan shutdown) still closes the job store and stops the engine."""

import sqlite3
import threading
import time

import httpx
import pytest

from workbench.serving import job_store
from workbench.serving.server import ServerThread, shutdown_app

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _running_job(srv, n=400):
    jid = httpx.post(srv.base_url + "/v1/jobs", timeout=60,
                     json={"messages": MESSAGES, "max_tokens": n, "ignore_eos": True}).json()["id"]
    end = time.monotonic() + 120
    while httpx.get(f"{srv.base_url}/v1/jobs/{jid}", timeout=30).json()["output_tokens"] < 2:
        assert time.monotonic() < end
        time.sleep(0.02)
    return jid


def _read_events(url):
    try:
        httpx.get(url, timeout=120)
    except httpx.HTTPError:  # the server closes it at shutdown
        pass


def _status_in_file(db, jid):
    with sqlite3.connect(str(db)) as con:
        return con.execute("SELECT status FROM jobs WHERE id=?", (jid,)).fetchone()[0]


def test_a_forced_exit_still_closes_the_store_and_stops_the_engine(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    srv = ServerThread(loaded, jobs={"path": db, "flush_s": 0.0}).start()
    jid = _running_job(srv)
    reader = threading.Thread(target=_read_events, args=(f"{srv.base_url}/v1/jobs/{jid}/events",), daemon=True)
    reader.start()  # an open event stream of a job that would run for minutes
    time.sleep(0.3)
    srv.server.should_exit = srv.server.force_exit = True  # what a second Ctrl+C sets: no lifespan shutdown
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 60
    job_store.check_store_free(db)  # the store's lock is released: a restarted server takes it
    assert _status_in_file(db, jid) == "interrupted"
    assert not srv.engine._thread.is_alive()
    shutdown_app(srv.app)  # once only: a second call returns at once


def test_a_graceful_shutdown_is_bounded_with_an_open_job_stream(loaded, tmp_path):
    db = tmp_path / "jobs.sqlite3"
    srv = ServerThread(loaded, jobs={"path": db, "flush_s": 0.0}).start()
    srv.app.state.shutdown_timeout_s = 3.0
    jid = _running_job(srv)
    reader = threading.Thread(target=_read_events, args=(f"{srv.base_url}/v1/jobs/{jid}/events",), daemon=True)
    reader.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 30, "the shutdown waited for the job's stream"
    assert _status_in_file(db, jid) == "interrupted"
    job_store.check_store_free(db)
