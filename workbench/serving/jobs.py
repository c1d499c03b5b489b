"""Background generation jobs stored in SQLite: post, poll, stream resumably, survive a restart.

A job is one long chat generation run off the request path: the store submits it to the app's engine (the
same :class:`workbench.serving.engines.BaseEngine` the chat route uses, so jobs and chat requests share its
queue and its scheduling) and writes what the engine's token and completion callbacks report; the store runs
no generation of its own. Everything a job emits is written to one SQLite file (Python's ``sqlite3``; default
:func:`~workbench.serving.job_store.default_path`: ``<results root>/serving_jobs/<server id>.sqlite3``, one file per server address, so two
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

HTTP: the ``/v1/jobs`` routes (:mod:`workbench.serving.job_routes`, installed by
:func:`~workbench.serving.job_routes.install`) over a :class:`JobStore` (``app.state.jobs``); the request fields,
the routes and their answers are listed there.

**Nothing is lost** (issue 23):

- Every write is one transaction (:meth:`~workbench.serving.job_store.JobTable._write`: ``BEGIN IMMEDIATE`` ... ``COMMIT``, ``ROLLBACK`` on
  any error, so a failed write never leaves the connection inside an open transaction that would swallow
  every later write). A write that fails with a transient error (``database is locked``, I/O) is retried
  (:data:`~workbench.serving.job_store.WRITE_RETRIES` times, backing off); a job whose output still cannot be written keeps its unwritten
  tokens in memory for the next flush, stops, and is marked ``failed`` with the reason.
- Journal and sync: ``journal_mode=WAL`` with ``synchronous=FULL``. WAL lets the event readers (SSE
  streams in other threads) read while a job writes; ``FULL`` makes every commit ``fsync`` the WAL, so an
  event is on disk before any client can read it (events are served from the file, after their commit):
  what a client has seen survives a process kill and a power loss. ``NORMAL`` (the old setting) survives a
  kill but may lose the last commits on power loss. The cost is one ``fsync`` per flush (at most one per
  ``flush_s`` per running job).
- **Writes leave the engine's thread** (issue 36): the engine's token and completion callbacks only buffer a job's
  tokens and text and hand the write to the store's writer thread (:class:`~workbench.serving.job_store.StoreWriter`, one per store, in order; a
  job has at most one flush waiting, which writes everything buffered when it runs). A slow or locked store
  (another process holding its write lock, a full disk) delays the job's events, never generation. Reads (status,
  results, event streams) use a connection of their own and never wait behind a write; an event stream reads only
  the events after the last one it sent (:meth:`JobStore.events_after`), and only when the store reports a change
  (:class:`~workbench.serving.job_store.Changes`, bumped by every committed write; at least every
  :data:`~workbench.serving.job_routes.RECHECK_S`), so an idle reader of a queued job costs nothing; every route
  runs its store work in the store's own worker threads (``JobStore.pool``), off the event loop and apart from the
  default executor chat's templating uses.
- One server owns a store: ``<store>.lock`` (:func:`workbench.run.locks.take_owner_lock`, the run folders'
  lock) names the owner's pid and host; a second store opened on the same file, in this process or
  another, is refused with a one-line :class:`~workbench.serving.job_store.StoreLockedError`. A killed owner's lock is released by the
  kernel, so a restarted server takes its store back.

**Races and outages** (issue 51):

- **A job is continued once.** The status change that starts a continuation is conditional on the resumable states
  (``UPDATE ... WHERE id = ? AND status IN ('interrupted', 'failed', 'cancelled')``; 409 when no row changed), and
  the store's run registry (``_runs``) takes at most one live run per job (409 while one is queued, running or still
  writing its end): of 16 continues sent at once exactly one is 200.
- **An outage strands nothing.** A job's end (its last output and final status) that the store refuses past the
  writer's retries stays pending in the writer thread and is tried again, backing off to
  :data:`~workbench.serving.job_runs.FINAL_RETRY_MAX_S`, until it lands; the run stays registered meanwhile (the
  job reads running, its events stream stays open). A job whose row says queued or running with no run (its start
  or its end's writes lost) reads ``interrupted`` from the next read on (the writer marks it so in the file): it
  continues, and its event stream ends. A route whose store work the store refuses answers 503 with
  ``Retry-After``, nothing changed.
- **A deleted queued job frees its place at once**: its requests leave the engine's queue
  (:meth:`~workbench.serving.engines.BaseEngine.withdraw`, also a member of a group). **Jobs count against the
  chat route's admission limit** (``max_pending``: ``max_queue`` + 1, passed by the server): a job or continuation
  that finds the engine full is a 429 with ``Retry-After`` and stores nothing, so queued jobs never starve chat of
  its places. An outline job is admitted once; its later generations are part of it.

Bounded: at most ``max_jobs`` stored jobs and ``max_bytes`` stored bytes (text + token ids + events); a new
job beyond either gets 429 naming the limit; a running job that reaches ``max_bytes`` stops (status
``failed``, its output kept). Finished and interrupted jobs are deleted ``retention_s`` after their last
update.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from workbench.checks import check_float, check_int
from workbench.errors import ParameterError
from workbench.serving import engines
from workbench.serving.http import SEED_MAX, validate
from workbench.serving.job_runs import JobRun, JobRuns
from workbench.serving.job_store import JobError, JobTable, StoreWriter, default_path

log = logging.getLogger(__name__)

MAX_JOBS = 100

RETENTION_S = 7 * 24 * 3600.0
MAX_BYTES = 256 << 20
FLUSH_S = 0.2           # a running job's new tokens and text are written at least this often
STORE_THREADS = 16      # the job routes' own worker threads (never the default executor chat's templating uses)
FINISHED = ("done", "failed", "cancelled")
RESUMABLE = ("interrupted", "failed", "cancelled")   # the states ``continue`` takes a job from
#: ``chat`` (the request's ``messages``) and the long-output strategies of :mod:`workbench.techniques.long_form`.
STRATEGIES = ("chat", "one_shot", "outline_batch", "outline_sequential")
LANGUAGES = ("en", "zh")
LONG_FORM_FIELDS = ("topic", "n_sections", "language", "outline_tokens")
N_SECTIONS = 4


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
        n_sections: int | None = Field(default=None, ge=1, le=64, strict=True)
        language: Literal[LANGUAGES] | None = None
        outline_tokens: int | None = Field(default=None, ge=1, strict=True)
        max_tokens: int = Field(default=256, ge=1, strict=True)
        temperature: float = Field(default=0.0, ge=0, le=2, allow_inf_nan=False, strict=True)
        top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False, strict=True)
        seed: int = Field(default=0, ge=0, le=SEED_MAX, strict=True)
        ignore_eos: bool = False
        min_tokens: int = Field(default=0, ge=0, strict=True)

    return JobRequest


class JobStore(JobTable, JobRuns):
    """The SQLite job table and its limits; jobs run on ``engine`` (see the module docstring).

    Args:
        engine: the :class:`workbench.serving.engines.BaseEngine` that generates (its ``loaded`` model is the
            jobs' model); finished runs reach its observers with ``endpoint="jobs"``.
        path: the SQLite file (default :func:`~workbench.serving.job_store.default_path` of ``server_id``); its folder is created; the store
            owns it (``<path>.lock``) until :meth:`close`.
        server_id: names the default file (the server's ``host:port``; default: this process).
        max_jobs: stored jobs at most.
        retention_s: finished / interrupted jobs are deleted this long after their last update.
        max_bytes: stored bytes at most (text, token ids and events of every job).
        context: the model's context in tokens (prompt + ``max_tokens`` must fit).
        max_tokens_limit: ceiling on a job's ``max_tokens``.
        flush_s: write a running job's progress at least this often.
        max_pending: the engine's admission limit for a job's request (the chat route's: ``max_queue`` waiting
            + the one being served; the server passes it): a job that finds that many requests pending is a 429,
            as a chat request is (None: no limit, a store on its own).

    Raises:
        ParameterError: a bad limit; :class:`~workbench.serving.job_store.StoreLockedError`: another server owns the file.
    """

    def __init__(self, engine, path=None, max_jobs: int = MAX_JOBS, retention_s: float = RETENTION_S,
                 max_bytes: int = MAX_BYTES, context: int | None = None, max_tokens_limit: int | None = None,
                 flush_s: float = FLUSH_S, server_id: str | None = None, max_pending: int | None = None):
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
        self.max_pending = None if max_pending is None else check_int("max_pending", max_pending, lo=1)
        self._open()  # before touching the file: one server per store
        self.JobRequest = _schema()
        self.identity = model_identity(loaded, engine)
        from concurrent.futures import ThreadPoolExecutor

        # the routes' store work runs here, never in the event loop's default executor: a store that blocks (a lock
        # held by another process, SQLite's busy wait) can tie up these threads, never chat's templating
        self.pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix=f"workbench-jobs-{self.path.name}")
        self._runs: dict[str, JobRun] = {}   # the registry: at most one live run per job (job_runs.JobRun)
        self._runs_lock = threading.Lock()
        self._marking: set[str] = set()    # stranded jobs whose "interrupted" mark waits in the writer
        self._closing = threading.Event()
        self._writer = StoreWriter(f"workbench-jobs-writer-{self.path.name}")

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
        self._check_admission()
        run = self._register(jid)  # before the row: a reader never sees it queued without its run
        try:
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
        except BaseException:
            self._ended(jid, run)
            raise
        try:
            self._start(jid, run, self.max_pending)
        except engines.EngineFull:  # the engine filled up meanwhile: nothing of the job is kept
            self._delete(jid)
            raise self._full() from None
        except sqlite3.Error:  # the store refused the start (the route's 503): nothing of the job is kept either
            try:
                self._delete(jid)
            except sqlite3.Error:  # still refused: the row reads interrupted (no run) and can be continued
                pass
            raise
        return self.status(jid)

    def _full(self) -> JobError:
        """429 with ``Retry-After`` (the engine queue's backlog estimate, as the chat route's): the engine holds
        :attr:`max_pending` requests."""
        from workbench.serving import scheduling

        backlog = getattr(getattr(self.engine, "queue", None), "backlog_s", None)
        wait = scheduling.retry_after_s(backlog() if callable(backlog) else float("nan"))
        return JobError(429, f"jobs: the engine holds {getattr(self.engine, 'pending', '?')} requests, the admission "
                             f"limit jobs share with chat requests (max_queue + 1 = {self.max_pending}); retry in "
                             f"{wait} s", etype="rate_limit_exceeded", headers={"Retry-After": str(wait)})

    def _check_admission(self) -> None:
        """Refuse (429) a job, or a continuation, while the engine is full: jobs count against the same admission
        limit as chat requests (:attr:`max_pending`), so queued jobs can never starve chat of its places. The
        engine's own check at submission is the atomic one; this one keeps an outline job (whose driver submits
        later) and a refused job from storing anything."""
        if self.max_pending is not None and engines.is_full(getattr(self.engine, "pending", 0), 1, self.max_pending):
            with self.engine._count_lock:
                self.engine.rejected += 1  # every 429 counts (workbench_requests_rejected_total)
            raise self._full()

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
        r = self._view(jid, self._row(jid))
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
        r = self._view(jid, self._row(jid))
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
        """Queue an interrupted, failed or cancelled job again; it resumes from its stored tokens. Exactly one of
        concurrent continues wins: the status change is conditional on the resumable states (``UPDATE ... WHERE
        id = ? AND status IN (...)``, 409 when no row changed) and the run registry takes one run per job (409
        while one is live). A job stranded by an outage (queued or running with no run) is marked interrupted
        first, so it continues too.

        Raises:
            JobError: unknown (404) / expired (410); a run in progress, or already done (409); the engine full
                (429, nothing changed).
        """
        r = self._view(jid, self._row(jid))
        if r["status"] == "done":
            raise JobError(409, f"job {jid}: already finished ({r['finish_reason']})", "job_id", "conflict")
        self._check_model(jid, r["model"])
        self._check_engine(json.loads(r["request"]), len(json.loads(r["output_ids"])))
        self._check_admission()
        run = self._register(jid)  # 409 while a run is live: one run per job
        try:
            def claim(db) -> str | None:
                # a stranded job (no run: we hold the registry's only entry) is interrupted first
                db.execute("UPDATE jobs SET status='interrupted', updated=? WHERE id=? "
                           "AND status IN ('queued','running')", (time.time(), jid))
                prev = db.execute("SELECT status FROM jobs WHERE id=?", (jid,)).fetchone()
                changed = db.execute("UPDATE jobs SET status='queued', error=NULL, updated=? WHERE id=? AND status IN "
                                     f"({', '.join('?' * len(RESUMABLE))})", (time.time(), jid, *RESUMABLE)).rowcount
                return prev[0] if changed else None

            was = self._write(claim)
            if was is None:
                now = self._row(jid, "status, finish_reason")
                raise JobError(409, f"job {jid}: is {now['status']}, nothing to continue", "job_id", "conflict")
        except BaseException:
            self._ended(jid, run)
            raise
        try:
            self._start(jid, run, self.max_pending)
        except engines.EngineFull:  # the engine filled up meanwhile: the job is as it was
            self._q("UPDATE jobs SET status=?, runs=MAX(runs-1, 0), updated=? WHERE id=? AND status='queued'",
                    (was, time.time(), jid))
            raise self._full() from None
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
        """Delete a job; a run of it stops (``cancelled``), and its requests still waiting in the engine's queue
        leave it at once (their places are free for the next request, chat or job).

        Raises:
            JobError: unknown (404) / expired (410)."""
        self._row(jid)
        with self._runs_lock:
            run = self._runs.get(jid)
        if run is not None:
            run.stop("cancelled")
        self._delete(jid)
        return {"id": jid, "object": "job", "deleted": True}

    def events_after(self, jid: str, after: int) -> tuple[list[tuple[int, str]], dict]:
        """Stored text events after number ``after`` and the job's ``status``, ``events``, ``finish_reason`` and
        ``error`` (404/410 as :meth:`status`): reads only the new events by their index, never the job's text or
        token ids (an SSE reader polls this)."""
        r = self._view(jid, self._row(jid, "status, events, finish_reason, error, updated", purge=False))
        rows = self._q("SELECT seq, data FROM job_events WHERE job_id=? AND seq>? ORDER BY seq", (jid, after))
        return [(int(s), d) for s, d in rows], r

    def close(self, timeout: float = 60.0) -> None:
        """Stop every running job (left ``interrupted`` with what it stored) and close the file.

        Waits up to ``timeout`` seconds for their engine requests to end (the engine must still run).
        """
        self._closing.set()
        with self._runs_lock:
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
                self.pool.shutdown(wait=False)
                self.changes.bump()   # readers still waiting look again (and end)

    def wait(self, jid: str, timeout: float = 120.0, statuses=FINISHED + ("interrupted",)) -> dict:
        """Block until the job reaches one of ``statuses`` (tests, notebooks)."""
        end = time.monotonic() + timeout
        while True:
            st = self.status(jid)
            if st["status"] in statuses or time.monotonic() > end:
                return st
            time.sleep(0.05)


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
