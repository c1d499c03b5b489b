"""Background generation jobs stored in SQLite: post, poll, stream resumably, survive a restart.

A job is one long chat generation run off the request path: the store submits it to the app's engine (the
same :class:`workbench.serving.engines.BaseEngine` the chat route uses, so jobs and chat requests share its
queue and its scheduling) and writes what the engine's token and completion callbacks report; the store runs
no generation of its own. Everything a job emits is written to one SQLite file (Python's ``sqlite3``; default
:func:`default_path`: ``<results root>/serving_jobs/<server id>.sqlite3``, one file per server address, so two
servers never share one by accident) as it is produced, in one transaction per flush: the job's output
token ids, its text so far and its numbered text events. So:

- a **server restart loses no finished output** (the row and its events are on disk);
- an **unfinished job** (the server stopped or crashed while it ran) is marked ``interrupted`` when the
  store opens (or at a clean shutdown); ``POST /v1/jobs/{id}/continue`` runs it again with its stored
  tokens as a prefix of the prompt ("resume from breakpoint"). For a greedy job (``temperature`` 0) the
  continuation is the one an uninterrupted greedy run produces (the model is a function of the prefix);
  a sampled job continues with fresh randomness (``exact_resume`` false in its status).
- **A job continues only on the model that wrote it** (issue 36): each job records the server's
  :func:`model_identity` (model path, weights hash, tokenizer, dtype, engine); ``continue`` on a server with any
  other answers 409 naming each difference (``weights_sha256 'ab..' -> 'cd..'``), and a job written before
  identities were recorded is 409 too. Settings the engine cannot honour (the ``continuous`` engine's one random
  generator: a per-request ``seed``, a sampled ``outline_sequential``) are a 400 naming the field at ``POST`` or
  ``continue``, before anything is stored or queued; a sampled continuation draws with ``seed + stored tokens``, or
  with the engine's seed where it has only one.

HTTP (installed by :func:`install`; JSON errors in the OpenAI shape):

- ``POST /v1/jobs`` with ``{"messages": [...], "max_tokens": N, "temperature", "top_p", "seed",
  "ignore_eos", "min_tokens", "model"}`` -> 202 ``{"id", "status": "queued", ...}``. A malformed request
  (not JSON, unknown field, bad value, prompt over the context) gets 400 / 413 / 415 and stores nothing.
- Long outputs: ``"strategy"`` names one of :data:`workbench.techniques.long_form.STRATEGIES` instead of ``messages``,
  with ``"topic"`` (required), ``"n_sections"`` (default 4), ``"language"`` (``en`` / ``zh``) and, for the
  outline strategies, ``"outline_tokens"``; ``max_tokens`` is the whole budget (split by
  :class:`workbench.techniques.long_form.LongOutputPlan`; a budget too small for the sections is a 400 naming
  ``max_tokens``). ``one_shot`` is one chat request with the strategy's prompt: streamed token by token and
  continued from its stored tokens like any job. ``outline_batch`` / ``outline_sequential`` run
  :func:`workbench.techniques.long_form.run_long_output`; each finished generation (the outline, the batch of sections,
  or one section) is stored as a stage with its token ids, each section as one text event as soon as it is
  written (the events concatenate to the merged text), and a continued job reuses its stored stages and
  redoes only the generation that was cut (greedy: equal to the uninterrupted run).
- ``GET /v1/jobs/{id}`` (status), ``GET /v1/jobs/{id}/result`` (text so far, ``complete``),
  ``GET /v1/jobs/{id}/events`` (SSE, ``id: <job>:<n>``, resumable with ``Last-Event-ID``; after the text
  events one ``{"status": ...}`` event without an id, then ``[DONE]``), ``POST /v1/jobs/{id}/continue``,
  ``DELETE /v1/jobs/{id}``, ``GET /v1/jobs`` (list). Unknown id: 404; expired id (deleted by retention): 410.

**Nothing is lost** (issue 23):

- Every write is one transaction (:meth:`JobStore._write`: ``BEGIN IMMEDIATE`` ... ``COMMIT``, ``ROLLBACK`` on
  any error, so a failed write never leaves the connection inside an open transaction that would swallow
  every later write). A write that fails with a transient error (``database is locked``, I/O) is retried
  (:data:`WRITE_RETRIES` times, backing off); a job whose output still cannot be written keeps its unwritten
  tokens in memory for the next flush, stops, and is marked ``failed`` with the reason.
- Journal and sync: ``journal_mode=WAL`` with ``synchronous=FULL``. WAL lets the event readers (SSE
  streams in other threads) read while a job writes; ``FULL`` makes every commit ``fsync`` the WAL, so an
  event is on disk before any client can read it (events are served from the file, after their commit):
  what a client has seen survives a process kill and a power loss. ``NORMAL`` (the old setting) survives a
  kill but may lose the last commits on power loss. The cost is one ``fsync`` per flush (at most one per
  ``flush_s`` per running job).
- **Writes leave the engine's thread** (issue 36): the engine's token and completion callbacks only buffer a job's
  tokens and text and hand the write to the store's writer thread (:class:`_Writer`, one per store, in order; a
  job has at most one flush waiting, which writes everything buffered when it runs). A slow or locked store
  (another process holding its write lock, a full disk) delays the job's events, never generation. Reads (status,
  results, event streams) use a connection of their own and never wait behind a write; an event stream reads only
  the events after the last one it sent (:meth:`JobStore.events_after`), and every route runs its store work in a
  worker thread, off the event loop.
- One server owns a store: ``<store>.lock`` (:func:`workbench.run.locks.take_owner_lock`, the run folders'
  lock) names the owner's pid and host; a second store opened on the same file, in this process or
  another, is refused with a one-line :class:`StoreLockedError`. A killed owner's lock is released by the
  kernel, so a restarted server takes its store back.

Bounded: at most ``max_jobs`` stored jobs and ``max_bytes`` stored bytes (text + token ids + events); a new
job beyond either gets 429 naming the limit; a running job that reaches ``max_bytes`` stops (status
``failed``, its output kept). Finished and interrupted jobs are deleted ``retention_s`` after their last
update.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import re
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from workbench.checks import check_float, check_int
from workbench.errors import ParameterError
from workbench.serving import engines
from workbench.serving.events import DONE, KEEPALIVE_COMMENT, check_last_event_id, last_event_id, numbered, sse_data, sse_response
from workbench.serving.http import SEED_MAX, ApiError, check_model, read_json_object, validate

log = logging.getLogger(__name__)

MAX_JOBS = 100
WRITE_RETRIES = 3       # a write failing with a transient error is tried this many more times

RETENTION_S = 7 * 24 * 3600.0
MAX_BYTES = 256 << 20
FLUSH_S = 0.2           # a running job's new tokens and text are written at least this often
KEEPALIVE_S = 15.0      # an event stream with nothing new for this long sends ``: keep-alive``
DB_DIR = "serving_jobs"
FINISHED = ("done", "failed", "cancelled")
#: ``chat`` (the request's ``messages``) and the long-output strategies of :mod:`workbench.techniques.long_form`.
STRATEGIES = ("chat", "one_shot", "outline_batch", "outline_sequential")
LANGUAGES = ("en", "zh")
LONG_FORM_FIELDS = ("topic", "n_sections", "language", "outline_tokens")
N_SECTIONS = 4


class _Stopped(Exception):
    """A long-output job stopped between or inside its generations (cancelled, deleted, server closing)."""


class _Run:
    """One run of a job: its stop reason (``cancelled``: deleted; ``interrupted``: the store is closing;
    ``storage_limit``) and the engine requests it has in flight (stopped with it)."""

    def __init__(self):
        self.reason: str | None = None
        self.requests: list = []
        self.ended = threading.Event()

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        for r in list(self.requests):
            r.stop(self.reason)

    def submit(self, engine, reqs: list) -> None:
        """Hand ``reqs`` to ``engine`` as one group; already stopped: they stop at once."""
        self.requests = list(reqs)
        if self.reason is not None:
            for r in reqs:
                r.stop(self.reason)
        engine.submit_group(reqs)

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


def _schema():
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field

    class Message(BaseModel):
        model_config = ConfigDict(extra="forbid")
        role: str = Field(pattern="^(system|user|assistant)$")
        content: str

    class JobRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        messages: list[Message] | None = Field(default=None, min_length=1)
        model: str | None = None
        strategy: Literal[STRATEGIES] = "chat"
        topic: str | None = Field(default=None, min_length=1, max_length=2000)
        n_sections: int | None = Field(default=None, ge=1, le=64)
        language: Literal[LANGUAGES] | None = None
        outline_tokens: int | None = Field(default=None, ge=1)
        max_tokens: int = Field(default=256, ge=1)
        temperature: float = Field(default=0.0, ge=0, le=2)
        top_p: float = Field(default=1.0, gt=0, le=1)
        seed: int = Field(default=0, ge=0, le=SEED_MAX)
        ignore_eos: bool = False
        min_tokens: int = Field(default=0, ge=0)

    return JobRequest


class JobStore:
    """The SQLite job table and its limits; jobs run on ``engine`` (see the module docstring).

    Args:
        engine: the :class:`workbench.serving.engines.BaseEngine` that generates (its ``loaded`` model is the
            jobs' model); finished runs reach its observers with ``endpoint="jobs"``.
        path: the SQLite file (default :func:`default_path` of ``server_id``); its folder is created; the store
            owns it (``<path>.lock``) until :meth:`close`.
        server_id: names the default file (the server's ``host:port``; default: this process).
        max_jobs: stored jobs at most.
        retention_s: finished / interrupted jobs are deleted this long after their last update.
        max_bytes: stored bytes at most (text, token ids and events of every job).
        context: the model's context in tokens (prompt + ``max_tokens`` must fit).
        max_tokens_limit: ceiling on a job's ``max_tokens``.
        flush_s: write a running job's progress at least this often.

    Raises:
        ParameterError: a bad limit; :class:`StoreLockedError`: another server owns the file.
    """

    def __init__(self, engine, path=None, max_jobs: int = MAX_JOBS, retention_s: float = RETENTION_S,
                 max_bytes: int = MAX_BYTES, context: int | None = None, max_tokens_limit: int | None = None,
                 flush_s: float = FLUSH_S, server_id: str | None = None):
        import os

        self.engine = engine
        self.loaded = loaded = engine.loaded
        self.path = Path(path) if path is not None else default_path(server_id or f"pid{os.getpid()}")
        self.max_jobs = check_int("max_jobs", max_jobs, lo=1)
        self.retention_s = check_float("retention_s", retention_s, lo=0)
        self.max_bytes = check_int("max_bytes", max_bytes, lo=1)
        self.flush_s = check_float("flush_s", flush_s, lo=0)
        self.context = int(context or getattr(getattr(loaded, "info", None), "max_context_tokens", 0) or 8192)
        self.max_tokens_limit = max_tokens_limit or self.context
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
        self.JobRequest = _schema()
        self.identity = model_identity(loaded, engine)
        self._runs: dict[str, _Run] = {}
        self._closing = threading.Event()
        self._writer = _Writer(f"workbench-jobs-writer-{self.path.name}")

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
                    return fn(db)
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

    # ------------------------------------------------------------------ API

    def submit(self, payload) -> dict:
        """Validate a job request, store it queued, start it; its status dict.

        Raises:
            JobError: malformed request (400, nothing stored) or a limit reached (429).
        """
        if not isinstance(payload, dict):
            raise JobError(400, "request body: must be a JSON object")
        req = validate(self.JobRequest, payload)
        if req.max_tokens > self.max_tokens_limit:
            raise JobError(400, f"max_tokens: must be <= {self.max_tokens_limit} (got {req.max_tokens})", "max_tokens")
        if req.min_tokens > req.max_tokens:
            raise JobError(400, f"min_tokens: must be <= max_tokens ({req.max_tokens})", "min_tokens")
        messages = self._long_form(req) if req.strategy != "chat" else None
        if req.strategy == "chat":
            for f in LONG_FORM_FIELDS:
                if f in req.model_fields_set:
                    raise JobError(400, f"{f}: only with a long-output strategy ({', '.join(STRATEGIES[1:])})", f)
            if req.messages is None:
                raise JobError(400, "messages: required (or a long-output strategy with a topic)", "messages")
            messages = [m.model_dump() for m in req.messages]
        try:
            prompt_ids = engines.prompt_ids(self.loaded.tokenizer, messages)
        except Exception as exc:  # noqa: BLE001 - a template that refuses these messages
            raise JobError(400, f"messages: cannot apply the chat template ({exc})", "messages") from None
        if len(prompt_ids) + req.max_tokens > self.context:
            field = "topic" if req.strategy.startswith("outline") else "messages"
            raise JobError(400, f"{field}: prompt ({len(prompt_ids)} tokens) + max_tokens ({req.max_tokens}) "
                                f"exceeds the context ({self.context})", field)
        self._check_engine(req.model_dump(), 0)  # 400 naming the field the engine cannot honour: nothing stored
        if req.strategy.startswith("outline"):
            messages = None  # it writes its own prompts (workbench.techniques.long_form)
        request = json.dumps({**req.model_dump(), "messages": messages}, ensure_ascii=False)
        size = len(request.encode()) + len(json.dumps(prompt_ids))
        jid = "job-" + uuid.uuid4().hex[:24]
        now = time.time()
        with self._lock:
            self._purge()
            n = self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
            if n >= self.max_jobs:
                raise JobError(429, f"jobs: the store holds {n} jobs, its limit (max_jobs = {self.max_jobs}); "
                                    f"delete finished ones (DELETE /v1/jobs/<id>) or wait for their retention "
                                    f"({self.retention_s:g} s)", etype="job_limit")
            used = self.stored_bytes()
            if used + size > self.max_bytes:
                raise JobError(429, f"jobs: stored output would exceed max_bytes = {self.max_bytes} "
                                    f"({used} bytes stored); delete finished jobs first", etype="job_limit")
            self._q("INSERT INTO jobs (id, created, updated, status, request, prompt_ids, bytes, model) "
                    "VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)",
                    (jid, now, now, request, json.dumps(prompt_ids), size, json.dumps(self.identity)))
        self._start(jid)
        return self.status(jid)

    def _long_form(self, req) -> list[dict]:
        """Check a long-output job (``strategy``, ``topic``, ``n_sections``, ``language``, ``outline_tokens``,
        ``max_tokens`` the whole budget) and fill its defaults in ``req``; the messages of its first request.

        Raises:
            JobError: 400 naming the field.
        """
        from workbench.techniques.long_form import LongOutputPlan, one_shot_prompt

        s = req.strategy
        if req.messages is not None:
            raise JobError(400, f"messages: not with strategy {s!r} (it writes its own prompts from topic)", "messages")
        if not req.topic or not req.topic.strip():
            raise JobError(400, f"topic: required with strategy {s!r}", "topic")
        for f, default in (("ignore_eos", False), ("min_tokens", 0), ("top_p", 1.0)):
            if getattr(req, f) != default:
                raise JobError(400, f"{f}: not supported with strategy {s!r}", f)
        req.n_sections = req.n_sections or N_SECTIONS
        req.language = req.language or "en"
        if s == "one_shot":
            if req.outline_tokens is not None:
                raise JobError(400, "outline_tokens: only with the outline strategies", "outline_tokens")
            return [{"role": "user", "content": one_shot_prompt(req.topic, req.n_sections, req.language)}]
        try:
            plan = LongOutputPlan.make(req.max_tokens, req.n_sections, req.outline_tokens)
        except ParameterError as exc:
            msg = str(exc).replace("budget_tokens:", "max_tokens:", 1)
            raise JobError(400, msg, msg.split(":", 1)[0]) from None
        req.outline_tokens = plan.outline_tokens
        return [{"role": "user", "content": req.topic}]  # for the context check; the job writes its own prompts

    def status(self, jid: str) -> dict:
        r = self._row(jid)
        req = json.loads(r["request"])
        out = json.loads(r["output_ids"])
        return {"id": jid, "object": "job", "status": r["status"], "created": r["created"], "updated": r["updated"],
                "prompt_tokens": len(json.loads(r["prompt_ids"])), "output_tokens": len(out),
                "max_tokens": req["max_tokens"], "finish_reason": r["finish_reason"], "error": r["error"],
                "events": r["events"], "runs": r["runs"], "bytes": r["bytes"],
                "strategy": req.get("strategy", "chat"), "stages": len(json.loads(r["stages"])),
                "model": json.loads(r["model"]) if r["model"] else None,
                # greedy on the model that wrote it (a continuation on another is refused): the uninterrupted run
                # exactly; a sampled job continues with other random draws than the uninterrupted run would take
                "exact_resume": req["temperature"] == 0 and r["model"] == json.dumps(self.identity)}

    def result(self, jid: str) -> dict:
        r = self._row(jid)
        req, stages = json.loads(r["request"]), json.loads(r["stages"])
        out = {"id": jid, "object": "job.result", "status": r["status"], "complete": r["status"] == "done",
               "text": r["text"], "output_ids": json.loads(r["output_ids"]), "finish_reason": r["finish_reason"],
               "strategy": req.get("strategy", "chat")}
        if req.get("strategy", "chat").startswith("outline"):
            out["outline"] = stages[0]["records"][0]["text"] if stages else None
        return out

    def list(self) -> list[dict]:
        self._purge()
        return [self.status(r[0]) for r in self._q("SELECT id FROM jobs ORDER BY created")]

    def continue_job(self, jid: str) -> dict:
        """Queue an interrupted (or failed) job again; it resumes from its stored tokens.

        Raises:
            JobError: unknown (404) / expired (410); still queued or running, or already done (409).
        """
        r = self._row(jid)
        if r["status"] in ("queued", "running"):
            raise JobError(409, f"job {jid}: is {r['status']}, nothing to continue", "job_id", "conflict")
        if r["status"] == "done":
            raise JobError(409, f"job {jid}: already finished ({r['finish_reason']})", "job_id", "conflict")
        self._check_model(jid, r["model"])
        self._check_engine(json.loads(r["request"]), len(json.loads(r["output_ids"])))
        self._q("UPDATE jobs SET status='queued', error=NULL, updated=? WHERE id=?", (time.time(), jid))
        self._start(jid)
        return self.status(jid)

    def _check_model(self, jid: str, stored: str) -> None:
        """Refuse (409 naming each difference) continuing a job on another model, tokenizer, dtype or engine than
        the one that wrote its stored token ids: they would be fed to a model they do not belong to."""
        if not stored:
            raise JobError(409, f"job {jid}: written before the store recorded each job's model; it cannot be "
                                "checked to continue on the model that wrote it", "job_id", "conflict")
        old = json.loads(stored)
        diff = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in self.identity.items() if old.get(k) != v]
        if diff:
            raise JobError(409, f"job {jid}: written by another model than this server's ({'; '.join(diff)}); "
                                "continue it on a server running the model that wrote it", "job_id", "conflict")

    def _check_engine(self, req: dict, n_stored: int) -> None:
        """Refuse, before any work, settings of a job (its first run, or a continuation after ``n_stored`` tokens)
        that the engine cannot honour: 400 naming the field."""
        check = getattr(self.engine, "check_settings", None)
        if check is None:
            return
        strategy = req.get("strategy", "chat")
        if strategy == "outline_sequential" and req["temperature"] > 0 and not self.engine.per_request_seed:
            raise JobError(400, f"temperature: a sampled outline_sequential job draws each section with its own seed; "
                                f"the {self.engine.name} engine samples every request from one generator "
                                "(use temperature 0, outline_batch, or another engine)", "temperature")
        remaining = max(1, req["max_tokens"] - n_stored)
        try:
            check(self._settings(req, n_stored, remaining))
        except ParameterError as exc:
            field = str(exc).split(":", 1)[0]
            raise JobError(400, str(exc), field) from None

    def _settings(self, req: dict, n_stored: int, remaining: int):
        """The generation settings of a chat job's run after ``n_stored`` stored tokens. A sampled continuation
        draws with the seed ``seed + n_stored`` where the engine takes a seed per request, else with the engine's
        own (``continuous``); either way not the draws of the uninterrupted run (``exact_resume`` false)."""
        from workbench.measure.generation import GenerationSettings

        seed = int(req["seed"])
        if n_stored and float(req["temperature"]) > 0:
            seed = seed + n_stored if self.engine.per_request_seed else self.engine.seed_default
        return GenerationSettings(
            max_new_tokens=remaining, ignore_eos=bool(req["ignore_eos"]),
            min_new_tokens=max(0, min(req["min_tokens"] - n_stored, remaining)),
            temperature=float(req["temperature"]), top_p=float(req["top_p"]), seed=seed)

    def delete(self, jid: str) -> dict:
        self._row(jid)
        run = self._runs.get(jid)
        if run is not None:
            run.stop("cancelled")
        self._delete(jid)
        return {"id": jid, "object": "job", "deleted": True}

    def events_after(self, jid: str, after: int) -> tuple[list[tuple[int, str]], dict]:
        """Stored text events after number ``after`` and the job's ``status``, ``events``, ``finish_reason`` and
        ``error`` (404/410 as :meth:`status`): reads only the new events by their index, never the job's text or
        token ids (an SSE reader polls this)."""
        r = self._row(jid, "status, events, finish_reason, error", purge=False)
        rows = self._q("SELECT seq, data FROM job_events WHERE job_id=? AND seq>? ORDER BY seq", (jid, after))
        return [(int(s), d) for s, d in rows], r

    def close(self, timeout: float = 60.0) -> None:
        """Stop every running job (left ``interrupted`` with what it stored) and close the file.

        Waits up to ``timeout`` seconds for their engine requests to end (the engine must still run).
        """
        self._closing.set()
        runs = list(self._runs.values())
        for run in runs:
            run.stop("interrupted")
        end = time.monotonic() + timeout
        for run in runs:
            run.ended.wait(max(0.0, end - time.monotonic()))
        self._writer.stop(max(1.0, end - time.monotonic()))
        from workbench.run.locks import release_owner_lock

        with self._lock:
            try:
                self._q("UPDATE jobs SET status='interrupted', updated=? WHERE status IN ('queued','running')",
                        (time.time(),))
            except sqlite3.Error as exc:  # the next server marks them interrupted when it opens the store
                log.error("job store %s: could not mark unfinished jobs interrupted at close (%s)", self.path, exc)
            finally:
                self._db.close()
                with self._rlock:
                    self._rdb.close()
                release_owner_lock(self._owner_fd)

    def wait(self, jid: str, timeout: float = 120.0, statuses=FINISHED + ("interrupted",)) -> dict:
        """Block until the job reaches one of ``statuses`` (tests, notebooks)."""
        end = time.monotonic() + timeout
        while True:
            st = self.status(jid)
            if st["status"] in statuses or time.monotonic() > end:
                return st
            time.sleep(0.05)

    # ------------------------------------------------------------------ running on the engine

    def _start(self, jid: str) -> None:
        """Submit a queued job's (next) run to the engine; an outline job gets a driver thread that submits its
        generations one after the other (it waits on the engine; it generates nothing itself)."""
        if self._closing.is_set():
            return
        r = self._row(jid)
        if r["status"] != "queued":
            return
        run = self._runs[jid] = _Run()
        req = json.loads(r["request"])
        self._q("UPDATE jobs SET runs=runs+1, updated=? WHERE id=?", (time.time(), jid))
        if req.get("strategy", "chat").startswith("outline"):
            threading.Thread(target=self._guarded, args=(jid, run, self._run_long_form, r, req),
                             name=f"workbench-job-{jid}", daemon=True).start()
        else:
            self._guarded(jid, run, self._submit_chat, r, req)

    def _guarded(self, jid: str, run: _Run, fn, *args) -> None:
        """``fn(jid, run, *args)``; an exception marks the job failed (a deleted job is left alone)."""
        try:
            fn(jid, run, *args)
        except JobError:  # deleted meanwhile
            self._ended(jid, run)
        except Exception as exc:  # noqa: BLE001 - recorded on the job
            self._fail(jid, f"{type(exc).__name__}: {exc}")
            self._ended(jid, run)

    def _fail(self, jid: str, error: str) -> None:
        try:
            self._q("UPDATE jobs SET status='failed', error=?, updated=? WHERE id=?", (error[:500], time.time(), jid))
        except sqlite3.Error as exc:  # the store itself fails: logged; the next open marks the job interrupted
            log.error("job store %s: could not mark job %s failed (%s; its error: %s)", self.path, jid, exc, error)

    def _ended(self, jid: str, run: _Run) -> None:
        if self._runs.get(jid) is run:
            self._runs.pop(jid, None)
        run.ended.set()

    def _submit_chat(self, jid: str, run: _Run, r: dict, req: dict) -> None:
        """A chat (or ``one_shot``) job: its stored tokens are a prefix of the prompt; the engine's token
        callback stores new tokens and text every ``flush_s``; the completion callback ends the job."""
        from workbench.measure.detokenize import IncrementalDetokenizer

        prompt_ids = json.loads(r["prompt_ids"])
        stored = json.loads(r["output_ids"])
        eos = self.engine.eos
        detok = IncrementalDetokenizer(self.loaded.tokenizer)
        for tok in stored:  # the detokeniser's state at the breakpoint (its text is what was stored)
            detok.push(tok)
        remaining = req["max_tokens"] - len(stored)
        if remaining <= 0 or (stored and stored[-1] in eos):
            self._q("UPDATE jobs SET status='running', updated=? WHERE id=?", (time.time(), jid))
            self._finish(jid, "done", "stop" if stored and stored[-1] in eos else "length")
            self._ended(jid, run)
            return
        # The engine's callbacks (its thread) only buffer and hand writes to the store's writer thread: a slow or
        # locked store delays the job's events, never generation (issue 36).
        state = {"ids": [], "pieces": [], "events": r["events"], "t_flush": time.perf_counter(), "ended": False,
                 "started": False, "queued": False}
        buf = threading.Lock()

        def flush():  # the writer thread
            with buf:
                new_ids, pieces = state["ids"], state["pieces"]
                state["ids"], state["pieces"], state["queued"] = [], [], False
            if not new_ids and not pieces:
                return
            try:
                appended = self._append(jid, new_ids, pieces)
            except sqlite3.Error as exc:  # kept in memory for the next flush; the job stops and fails
                log.error("job store %s: job %s: writing its output failed (%s)", self.path, jid, exc)
                with buf:
                    state["ids"], state["pieces"] = new_ids + state["ids"], pieces + state["pieces"]
                state["write_error"] = f"{type(exc).__name__}: {exc}"
                run.stop("write_failed")
                return
            if not appended:
                run.stop("cancelled")  # deleted meanwhile
            if self.stored_bytes() > self.max_bytes:
                run.stop("storage_limit")

        def mark_running():  # the writer thread
            self._q("UPDATE jobs SET status='running', updated=? WHERE id=? AND status='queued'", (time.time(), jid))

        def on_token(tok, t):  # the engine's thread: no store access
            if not state["started"]:
                state["started"] = True
                self._writer.put(mark_running)
            if state["ended"]:
                return
            piece = detok.push(tok)
            if tok in eos:
                piece += detok.finish()
                state["ended"] = True
            with buf:
                state["ids"].append(tok)
                state["pieces"].append(piece)
                due = not state["queued"] and t - state["t_flush"] >= self.flush_s
                if due:
                    state["queued"], state["t_flush"] = True, t
            if due:
                self._writer.put(flush)

        def finish_job(res):  # the writer thread
            try:
                if res.get("error") and res["finish_reason"] == "error":
                    flush()
                    self._fail(jid, res["error"])
                    return
                state.pop("write_error", None)
                flush()  # also retries what an earlier failed write kept in memory
                if state.get("write_error"):
                    run.stop("write_failed")
                    self._fail(jid, f"store: writing the job's output failed ({state['write_error']}); "
                                    "the output stored before it is kept")
                    return
                self._end_run(jid, run, res["finish_reason"])
            finally:
                self._ended(jid, run)

        def on_done(res):  # the engine's thread: the last piece, then the writer ends the job
            if not (res.get("error") and res["finish_reason"] == "error") and not state["ended"] \
                    and run.reason is None:
                with buf:
                    state["pieces"].append(detok.finish(cut=res["finish_reason"] == "length"))
            self._writer.put(lambda: finish_job(res))

        settings = self._settings(req, len(stored), remaining)
        run.submit(self.engine, [engines.EngineRequest(prompt_ids + stored, settings, on_token=on_token,
                                                       on_done=on_done, id=jid, endpoint="jobs")])

    def _end_run(self, jid: str, run: _Run, finish_reason: str | None) -> None:
        """Record how a run ended: its stop reason if it was stopped, else ``done`` with ``finish_reason``."""
        if run.reason == "storage_limit":
            self._finish(jid, "failed", "storage_limit",
                         f"max_bytes: the store reached its limit of {self.max_bytes} bytes; the output so far is kept")
        elif run.reason == "write_failed":
            self._finish(jid, "failed", "error", "store: a write failed and was retried; the job stopped with its "
                                                 "output so far stored (POST /v1/jobs/<id>/continue resumes it)")
        elif run.reason == "interrupted":
            self._finish(jid, "interrupted", None)
        elif run.reason is not None:
            self._finish(jid, "cancelled", "cancelled")
        else:
            self._finish(jid, "done", finish_reason)

    def _append(self, jid: str, new_ids: list[int], pieces: list[str], stage: dict | None = None) -> bool:
        """Store a job's new token ids, text pieces (one numbered event each) and finished ``stage`` in one
        transaction; False when the job was deleted meanwhile."""
        pieces = [p for p in pieces if p]

        def append(db) -> bool:
            row = db.execute("SELECT output_ids, text, events, stages FROM jobs WHERE id=?", (jid,)).fetchone()
            if row is None:
                return False
            ids, text, seq = json.loads(row[0]) + list(new_ids), row[1] + "".join(pieces), row[2]
            stages = row[3] if stage is None else json.dumps(json.loads(row[3]) + [stage])
            add = sum(len(p.encode()) * 2 + 16 for p in pieces) + 8 * len(new_ids) + len(stages) - len(row[3])
            for p in pieces:
                seq += 1
                db.execute("INSERT INTO job_events VALUES (?, ?, ?)", (jid, seq, p))
            db.execute("UPDATE jobs SET output_ids=?, text=?, events=?, stages=?, bytes=bytes+?, updated=? "
                       "WHERE id=?", (json.dumps(ids), text, seq, stages, add, time.time(), jid))
            return True

        return self._write(append)

    def _run_long_form(self, jid: str, run: _Run, r: dict, req: dict) -> None:
        """An outline job: :func:`workbench.techniques.long_form.run_long_output` with every generation submitted to the
        engine as one group (the sections of ``outline_batch`` share a batch) and stored as a stage (a continued
        job reuses its stages and redoes the one cut), and every section stored as a text event."""
        from workbench.measure.generation import BatchResult
        from workbench.techniques.long_form import LongOutputPlan, run_long_output

        self._q("UPDATE jobs SET status='running', updated=? WHERE id=?", (time.time(), jid))
        stages = json.loads(r["stages"])
        sections_stored = r["events"]
        calls = [0]

        def generate(loaded, prompts, settings):
            k = calls[0]
            calls[0] += 1
            if k < len(stages):  # done before the breakpoint
                return BatchResult(**stages[k])
            if run.reason is not None:
                raise _Stopped()
            reqs = [engines.EngineRequest(engines.prompt_ids(loaded.tokenizer, p), settings, endpoint="jobs")
                    for p in prompts]
            run.submit(self.engine, reqs)
            for q in reqs:
                q.done.wait()
            if run.reason is not None:
                raise _Stopped()
            failed = next((q.error for q in reqs if q.error), None)
            if failed:
                raise RuntimeError(failed)
            batch = _batch_result(loaded.tokenizer, reqs)
            stage = {"records": batch.records, "t_submit": batch.t_submit, "wall_s": batch.wall_s,
                     "preprocess_s": batch.preprocess_s, "prefill_s": batch.prefill_s}
            ids = [t for rec in stage["records"] for t in rec["output_ids"]]
            if not self._append(jid, ids, [], json.loads(json.dumps(stage, default=float))):
                run.stop("cancelled")
                raise _Stopped()
            if self.stored_bytes() > self.max_bytes:
                run.stop("storage_limit")
                raise _Stopped()
            return batch

        def on_section(k: int, piece: str) -> None:
            if k >= sections_stored and not self._append(jid, [], [piece]):
                run.stop("cancelled")
                raise _Stopped()

        plan = LongOutputPlan.make(req["max_tokens"], req["n_sections"], req["outline_tokens"])
        try:
            run_long_output(self.loaded, req["strategy"], req["topic"], plan, req["language"],
                            float(req["temperature"]), int(req["seed"]), generate=generate, on_section=on_section)
        except _Stopped:
            self._end_run(jid, run, None)
            self._ended(jid, run)
            return
        reasons = {rec["finish_reason"] for st in json.loads(self._row(jid)["stages"])[1:] for rec in st["records"]}
        self._end_run(jid, run, "length" if "length" in reasons else "stop")
        self._ended(jid, run)  # the merged text is the stored one: the sections' pieces concatenate to it

    def _finish(self, jid: str, status: str, finish_reason: str | None, error: str | None = None) -> None:
        self._q("UPDATE jobs SET status=?, finish_reason=?, error=?, updated=? WHERE id=?",
                (status, finish_reason, error, time.time(), jid))



class _Writer:
    """A store's writer thread: the job writes the engine's callbacks hand it (:meth:`put`), in order, one at a time.
    Batched: a running job has at most one flush waiting, which writes every token and text piece buffered when it
    runs, so while the store is slow or locked the job's tokens accumulate and go out in one transaction after it.
    A write that raises is logged (the job's own code records failures on the job)."""

    def __init__(self, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, fn) -> None:
        self._q.put(fn)

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


def model_identity(loaded, engine) -> dict:
    """What a job's stored token ids belong to: ``model_path``, ``weights_sha256`` (:class:`workbench.measure.models.ModelInfo`),
    ``tokenizer`` (its class, size and the first 16 hex digits of SHA-256 over its vocabulary, added tokens
    included), ``dtype`` and ``engine`` (its name). Empty strings where ``loaded`` does not say."""
    import hashlib

    info = getattr(loaded, "info", None)
    tok = loaded.tokenizer
    try:
        vocab = sorted(tok.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
        digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]
        tokenizer = f"{type(tok).__name__}:{len(tok)}:{digest}"
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing: its class and size
        tokenizer = f"{type(tok).__name__}:{getattr(tok, 'vocab_size', '')}"
    return {"model_path": str(getattr(info, "path", "") or ""), "weights_sha256": str(getattr(info, "weights_sha256", "") or ""),
            "tokenizer": tokenizer, "dtype": str(getattr(info, "dtype", "") or ""),
            "engine": str(getattr(engine, "name", "") or "")}


def _batch_result(tokenizer, reqs: list):
    """A :class:`workbench.measure.generation.BatchResult` (without ``sequences``) of engine requests run as one group:
    per-request records with the text (decoded as :func:`~workbench.measure.generation.generate_measured` does)."""
    from workbench.measure.generation import BatchResult, _decode

    t_submit = min(q.t_arrival for q in reqs)
    records = []
    for i, q in enumerate(reqs):
        res = q.result()
        rec = {k: res[k] for k in ("prompt_tokens", "output_tokens", "ttft_s", "prefill_s", "e2e_s", "tpot_s",
                                   "decode_tps", "itl_s", "finish_reason", "output_ids")}
        rec.update(request_id=i, text=_decode(tokenizer, res["output_ids"], res["finish_reason"]),
                   ttft_s=(q.t_arrival + res["ttft_s"]) - t_submit if res["output_tokens"] else float("nan"))
        records.append(rec)
    t_end = max([q.stamps[-1] for q in reqs if q.stamps] or [t_submit])
    prefill = [q.prefill_s for q in reqs if q.prefill_s is not None]
    return BatchResult(records=records, t_submit=t_submit, wall_s=t_end - t_submit, preprocess_s=0.0,
                       prefill_s=max(prefill) if prefill else float("nan"))


# --------------------------------------------------------------------------- routes (state: app.state.jobs)


def _store(request: Request) -> JobStore:
    return request.app.state.jobs


async def post_job(request: Request):
    """``POST /v1/jobs``: 202 with the new job's status (the body checks of :mod:`workbench.serving.http`)."""
    from fastapi.responses import JSONResponse

    payload = await read_json_object(request)
    chat_cfg = getattr(request.app.state, "chat", None)
    if chat_cfg is not None:
        check_model(payload.get("model"), chat_cfg.model_names)
    st = await asyncio.to_thread(_store(request).submit, payload)
    return JSONResponse(st, status_code=202, headers={"Location": f"/v1/jobs/{st['id']}"})


# Every route's store work runs in a worker thread: a slow store never holds the event loop (the chat streams).
async def list_jobs(request: Request):
    return {"object": "list", "data": await asyncio.to_thread(_store(request).list)}


async def job_status(job_id: str, request: Request):
    return await asyncio.to_thread(_store(request).status, job_id)


async def job_result(job_id: str, request: Request):
    return await asyncio.to_thread(_store(request).result, job_id)


async def continue_job(job_id: str, request: Request):
    return await asyncio.to_thread(_store(request).continue_job, job_id)


async def delete_job(job_id: str, request: Request):
    return await asyncio.to_thread(_store(request).delete, job_id)


async def job_events(job_id: str, request: Request):
    """``GET /v1/jobs/{id}/events``: the job's stored text events as SSE (``id: <job>:<n>``), resumable with
    ``Last-Event-ID``; after them one ``{"status": ...}`` event without an id, then ``[DONE]``."""
    store = _store(request)
    _, r = await asyncio.to_thread(store.events_after, job_id, 0)
    after = check_last_event_id(last_event_id(request), job_id, r["events"])

    async def stream():
        seen, idle = after, time.monotonic()
        while True:
            try:
                rows, r = await asyncio.to_thread(store.events_after, job_id, seen)
            except JobError:
                return
            for seq, data in rows:
                seen = seq
                idle = time.monotonic()
                yield numbered(job_id, seq, sse_data({"text": data}))
            if r["status"] not in ("queued", "running") and seen >= r["events"]:
                # no id: a job continued later numbers its next text event r["events"] + 1
                yield sse_data({"status": r["status"], "finish_reason": r["finish_reason"], "error": r["error"]})
                yield DONE
                return
            if time.monotonic() - idle > KEEPALIVE_S:
                idle = time.monotonic()
                yield KEEPALIVE_COMMENT
            await asyncio.sleep(0.05)

    return sse_response(stream())


def install(app, engine, **store_kwargs) -> JobStore:
    """Open the store on ``engine`` (``app.state.jobs``) and add the ``/v1/jobs`` routes to ``app``.

    Raises:
        ParameterError: an unknown store keyword (one line); :class:`StoreLockedError`: another server owns
            the store.
    """
    try:
        app.state.jobs = JobStore(engine, **store_kwargs)
    except TypeError as exc:
        raise ParameterError(f"jobs: {exc}") from None
    app.add_api_route("/v1/jobs", post_job, methods=["POST"])
    app.add_api_route("/v1/jobs", list_jobs, methods=["GET"])
    app.add_api_route("/v1/jobs/{job_id}", job_status, methods=["GET"])
    app.add_api_route("/v1/jobs/{job_id}/result", job_result, methods=["GET"])
    app.add_api_route("/v1/jobs/{job_id}/continue", continue_job, methods=["POST"])
    app.add_api_route("/v1/jobs/{job_id}", delete_job, methods=["DELETE"])
    app.add_api_route("/v1/jobs/{job_id}/events", job_events, methods=["GET"])
    return app.state.jobs
