"""The job store's SQLite side: where a server's store lives and who owns it, its tables, and how it writes.

:func:`default_path` (one file per server address), :func:`lock_store` / :func:`check_store_free` (one server per
store: :class:`StoreLockedError`), the tables (jobs, their numbered text events, the expired ids), :class:`JobError`
(a job request that cannot be served), :class:`JobTable` (the storage half of
:class:`workbench.serving.jobs.JobStore`: opening the file, reads on their own connection, every write one
transaction retried :data:`WRITE_RETRIES` times, retention) and :class:`StoreWriter` (the store's writer thread). The
guarantees these give are in :mod:`workbench.serving.jobs`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import sqlite3
import threading
import time
from pathlib import Path

from workbench.errors import ParameterError
from workbench.serving.http import ApiError

log = logging.getLogger(__name__)

WRITE_RETRIES = 3       # a write failing with a transient error is tried this many more times
DB_DIR = "serving_jobs"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    prompt_ids TEXT NOT NULL,
    output_ids TEXT NOT NULL DEFAULT '[]',
    text TEXT NOT NULL DEFAULT '',
    events INTEGER NOT NULL DEFAULT 0,
    finish_reason TEXT,
    error TEXT,
    runs INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,
    stages TEXT NOT NULL DEFAULT '[]',
    model TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS expired (id TEXT PRIMARY KEY, at REAL NOT NULL);
"""


class Changes:
    """What an event stream waits on instead of polling the file (issue 51): a counter the store bumps after every
    committed write and every change of its run registry (:meth:`bump`, from any thread), and an awaitable wait for
    the next bump (:meth:`wait`, on an event loop). An idle reader of a queued job then costs nothing until something
    changes (100 of them beside a chat stream), and a new event reaches it at once instead of at its next poll."""

    def __init__(self):
        self.version = 0
        self._waiters: set = set()
        self._lock = threading.Lock()

    def bump(self) -> None:
        with self._lock:
            self.version += 1
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: its reader is gone
                pass

    async def wait(self, seen: int, timeout: float) -> None:
        """Return once :attr:`version` differs from ``seen`` or after ``timeout`` seconds."""
        import asyncio

        event = asyncio.Event()
        item = (asyncio.get_running_loop(), event)
        with self._lock:
            if self.version != seen:
                return
            self._waiters.add(item)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(item)


class JobError(ApiError):
    """A job request that cannot be served: ``status`` (4xx), ``message``, ``param``, ``etype``."""


class StoreLockedError(ParameterError):
    """Another live server (this process or another) owns the job store (the message names its pid)."""


def default_path(server_id: str) -> Path:
    """``<results root>/serving_jobs/<server id>.sqlite3``: one store per server (``server_id``: e.g. its
    ``host:port``; characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_``)."""
    from workbench.run.results import results_root

    return results_root() / DB_DIR / (re.sub(r"[^A-Za-z0-9._-]", "_", str(server_id)) + ".sqlite3")


def lock_store(path) -> int:
    """Own the store at ``path`` (its ``<path>.lock``); the lock's descriptor.

    Raises:
        StoreLockedError: another server owns it (one line naming its pid).
    """
    from workbench.run.locks import take_owner_lock

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, _, _ = take_owner_lock(path.with_name(path.name + ".lock"), lambda owner: StoreLockedError(
        f"jobs_db: the job store {path} is in use by another server ({owner}); give this server its own "
        "store (--jobs-db PATH) or stop the other one"))
    return fd


def check_store_free(path) -> None:
    """Refuse (one line, before a model loads) a store another server owns.

    Raises:
        StoreLockedError: as :func:`lock_store`.
    """
    from workbench.run.locks import release_owner_lock

    if Path(path).exists() or Path(str(path) + ".lock").exists():
        release_owner_lock(lock_store(path))


class JobTable:
    """The storage half of :class:`workbench.serving.jobs.JobStore`: its SQLite file (``path``, owned until
    :meth:`~workbench.serving.jobs.JobStore.close`), a write connection under ``_lock`` and a read connection of its
    own, and the jobs' retention (``retention_s``)."""

    path: Path
    retention_s: float

    def _open(self) -> None:
        """Own ``self.path`` (``<path>.lock``), open it (WAL, ``synchronous=FULL``, the tables, an older store's
        missing columns), mark jobs a previous server left unfinished ``interrupted``, and open the read connection.

        Raises:
            StoreLockedError: another server owns the file.
        """
        self.changes = Changes()
        self._owner_fd = lock_store(self.path)  # before touching the file: one server per store
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
            self._lock = threading.RLock()  # the write connection's (writes, and reads that must be atomic with one)
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")  # see the module docstring
                self._db.executescript(_SCHEMA)
                columns = {c[1] for c in self._db.execute("PRAGMA table_info(jobs)")}
                if "stages" not in columns:  # an older store
                    self._db.execute("ALTER TABLE jobs ADD COLUMN stages TEXT NOT NULL DEFAULT '[]'")
                if "model" not in columns:  # a store from before model identities (issue 36)
                    self._db.execute("ALTER TABLE jobs ADD COLUMN model TEXT NOT NULL DEFAULT ''")
                # jobs a previous server left unfinished (stopped or crashed mid-run) are interrupted, not lost
                self._db.execute("UPDATE jobs SET status='interrupted', updated=? "
                                 "WHERE status IN ('queued','running')", (time.time(),))
        except BaseException:
            from workbench.run.locks import release_owner_lock

            release_owner_lock(self._owner_fd)
            raise
        # Reads go through a connection of their own (WAL: never blocked by a write, nor by another process
        # holding the file's write lock), so status and event readers never wait behind a slow write.
        self._rdb = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=10)
        self._rlock = threading.Lock()

    # ------------------------------------------------------------------ storage

    def _q(self, sql: str, args=()) -> list[sqlite3.Row]:
        """One statement: a read, or a write in its own transaction (:meth:`_write`)."""
        if sql.lstrip().upper().startswith("SELECT"):
            with self._rlock:
                return self._rdb.execute(sql, args).fetchall()
        return self._write(lambda db: db.execute(sql, args).fetchall())

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until the writer thread has written everything handed to it so far; False on timeout."""
        return self._writer.drain(timeout)

    @contextlib.contextmanager
    def _transaction(self):
        """``BEGIN IMMEDIATE`` ... ``COMMIT``; any error (the commit's included) rolls back and propagates."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _write(self, fn):
        """``fn(db)`` in one transaction, retried :data:`WRITE_RETRIES` times on a transient error (locked,
        busy, I/O); its result. A constraint violation (a bug) is not retried.

        Raises:
            sqlite3.Error: the last failure (the transaction rolled back: nothing of it was written).
        """
        for attempt in range(WRITE_RETRIES + 1):
            try:
                with self._transaction() as db:
                    out = fn(db)
                self.changes.bump()   # committed: an event stream waiting on this store looks again
                return out
            except sqlite3.OperationalError as exc:
                if attempt == WRITE_RETRIES:
                    raise
                log.warning("job store %s: write failed (%s); retrying", self.path, exc)
                time.sleep(0.05 * 2 ** attempt)

    def _row(self, jid: str, columns: str = "*", purge: bool = True) -> dict:
        """The job's row (``columns``: an SQL column list), after deleting expired jobs (``purge``).

        Raises:
            JobError: 404 unknown, 410 expired."""
        if purge:
            self._purge()
        with self._rlock:
            cur = self._rdb.execute(f"SELECT {columns} FROM jobs WHERE id=?", (jid,))
            r = cur.fetchone()
            names = [d[0] for d in cur.description]
            if r is None:
                gone = self._rdb.execute("SELECT 1 FROM expired WHERE id=?", (jid,)).fetchone()
        if r is None:
            if gone:
                raise JobError(410, f"job {jid!r:.80}: expired (finished jobs are kept {self.retention_s:g} s)",
                               param="job_id", etype="not_found")
            raise JobError(404, f"job {jid!r:.80}: unknown", param="job_id", etype="not_found")
        return dict(zip(names, r))

    def _purge(self) -> None:
        """Delete finished / interrupted jobs past their retention (remembered as expired)."""
        cutoff = time.time() - self.retention_s
        old = [r[0] for r in self._q(
            "SELECT id FROM jobs WHERE status NOT IN ('queued','running') AND updated < ?", (cutoff,))]
        for jid in old:
            self._delete(jid, expired=True)

    def _delete(self, jid: str, expired: bool = False) -> None:
        def delete(db):
            db.execute("DELETE FROM job_events WHERE job_id=?", (jid,))
            db.execute("DELETE FROM jobs WHERE id=?", (jid,))
            if expired:
                db.execute("INSERT OR REPLACE INTO expired VALUES (?, ?)", (jid, time.time()))
                db.execute("DELETE FROM expired WHERE id NOT IN (SELECT id FROM expired ORDER BY at DESC LIMIT 10000)")

        self._write(delete)

    def stored_bytes(self) -> int:
        return int(self._q("SELECT COALESCE(SUM(bytes), 0) FROM jobs")[0][0])


class StoreWriter:
    """A store's writer thread: the job writes the engine's callbacks hand it (:meth:`put`), in order, one at a time.
    Batched: a running job has at most one flush waiting, which writes every token and text piece buffered when it
    runs, so while the store is slow or locked the job's tokens accumulate and go out in one transaction after it.
    A write that raises is logged (the job's own code records failures on the job); a job's final status that the
    store refuses comes back later (:meth:`later`) until it lands."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, fn) -> None:
        self._q.put(fn)

    def later(self, delay_s: float, fn) -> None:
        """Hand ``fn`` to the writer after ``delay_s`` seconds (a pending final status tried again)."""
        t = threading.Timer(delay_s, self._q.put, args=(fn,))
        t.daemon = True
        t.start()

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # noqa: BLE001 - never stop writing the other jobs
                log.exception("job store writer: a write failed")

    def drain(self, timeout: float) -> bool:
        """Block until what was put before this call is written (False after ``timeout`` seconds)."""
        if not self._thread.is_alive():
            return True
        done = threading.Event()
        self._q.put(done.set)
        return done.wait(timeout)

    def stop(self, timeout: float) -> None:
        """Write what is queued, then end the thread (waits ``timeout`` seconds at most)."""
        self._q.put(None)
        self._thread.join(timeout)
