"""Background generation jobs stored in SQLite: post, poll, stream resumably, survive a restart.

A job is one long chat generation run off the request path by a worker thread of its own (one job at a
time; :func:`workbench.generation.generate_measured` holds the model lock, so jobs and chat requests take
turns on the model). Everything a job emits is written to one SQLite file (Python's ``sqlite3``; default
``<results root>/serving_jobs.sqlite3``) as it is produced, in one transaction per flush: the job's output
token ids, its text so far and its numbered text events. So:

- a **server restart loses no finished output** (the row and its events are on disk);
- an **unfinished job** (the server stopped or crashed while it ran) is marked ``interrupted`` when the
  store opens (or at a clean shutdown); ``POST /v1/jobs/{id}/continue`` runs it again with its stored
  tokens as a prefix of the prompt ("resume from breakpoint"). For a greedy job (``temperature`` 0) the
  continuation is the one an uninterrupted greedy run produces (the model is a function of the prefix);
  a sampled job continues with fresh randomness (``exact_resume`` false in its status).

HTTP (installed by :func:`install`; JSON errors in the OpenAI shape):

- ``POST /v1/jobs`` with ``{"messages": [...], "max_tokens": N, "temperature", "top_p", "seed",
  "ignore_eos", "min_tokens", "model"}`` -> 202 ``{"id", "status": "queued", ...}``. A malformed request
  (not JSON, unknown field, bad value, prompt over the context) gets 400 / 413 / 415 and stores nothing.
- Long outputs: ``"strategy"`` names one of :data:`workbench.long_form.STRATEGIES` instead of ``messages``,
  with ``"topic"`` (required), ``"n_sections"`` (default 4), ``"language"`` (``en`` / ``zh``) and, for the
  outline strategies, ``"outline_tokens"``; ``max_tokens`` is the whole budget (split by
  :class:`workbench.long_form.LongOutputPlan`; a budget too small for the sections is a 400 naming
  ``max_tokens``). ``one_shot`` is one chat request with the strategy's prompt: streamed token by token and
  continued from its stored tokens like any job. ``outline_batch`` / ``outline_sequential`` run
  :func:`workbench.long_form.run_long_output`; each finished generation (the outline, the batch of sections,
  or one section) is stored as a stage with its token ids, each section as one text event as soon as it is
  written (the events concatenate to the merged text), and a continued job reuses its stored stages and
  redoes only the generation that was cut (greedy: equal to the uninterrupted run).
- ``GET /v1/jobs/{id}`` (status), ``GET /v1/jobs/{id}/result`` (text so far, ``complete``),
  ``GET /v1/jobs/{id}/events`` (SSE, ``id: <job>:<n>``, resumable with ``Last-Event-ID``; after the text
  events one ``{"status": ...}`` event without an id, then ``[DONE]``), ``POST /v1/jobs/{id}/continue``,
  ``DELETE /v1/jobs/{id}``, ``GET /v1/jobs`` (list). Unknown id: 404; expired id (deleted by retention): 410.

Bounded: at most ``max_jobs`` stored jobs and ``max_bytes`` stored bytes (text + token ids + events); a new
job beyond either gets 429 naming the limit; a running job that reaches ``max_bytes`` stops (status
``failed``, its output kept). Finished and interrupted jobs are deleted ``retention_s`` after their last
update.
"""

from __future__ import annotations

import asyncio
import json
import queue
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from ..checks import check_float, check_int
from ..errors import ParameterError

MAX_JOBS = 100
RETENTION_S = 7 * 24 * 3600.0
MAX_BYTES = 256 << 20
FLUSH_S = 0.2           # a running job's new tokens and text are written at least this often
MAX_BODY_BYTES = 1 << 20
DB_NAME = "serving_jobs.sqlite3"
FINISHED = ("done", "failed", "cancelled")
#: ``chat`` (the request's ``messages``) and the long-output strategies of :mod:`workbench.long_form`.
STRATEGIES = ("chat", "one_shot", "outline_batch", "outline_sequential")
LANGUAGES = ("en", "zh")
LONG_FORM_FIELDS = ("topic", "n_sections", "language", "outline_tokens")
N_SECTIONS = 4


class _Stopped(Exception):
    """A long-output job stopped between or inside its generations (cancelled, deleted, server closing)."""

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
    stages TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS job_events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS expired (id TEXT PRIMARY KEY, at REAL NOT NULL);
"""


class JobError(Exception):
    """A job request that cannot be served: ``status`` (4xx), ``message``, ``param``, ``etype``."""

    def __init__(self, status: int, message: str, param: str | None = None, etype: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.etype = status, message, param, etype


def default_path() -> Path:
    """``<results root>/serving_jobs.sqlite3``."""
    from ..results import results_root

    return results_root() / DB_NAME


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
        seed: int = Field(default=0, ge=0, le=2**63 - 1)
        ignore_eos: bool = False
        min_tokens: int = Field(default=0, ge=0)

    return JobRequest


class JobStore:
    """The SQLite job table, its limits, and the worker that runs jobs (see the module docstring).

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        path: the SQLite file (default :func:`default_path`); its folder is created.
        max_jobs: stored jobs at most.
        retention_s: finished / interrupted jobs are deleted this long after their last update.
        max_bytes: stored bytes at most (text, token ids and events of every job).
        context: the model's context in tokens (prompt + ``max_tokens`` must fit).
        max_tokens_limit: ceiling on a job's ``max_tokens``.
        monitor: a :class:`workbench.serving.monitoring.Monitor` to report finished runs to.
        flush_s: write a running job's progress at least this often.
    """

    def __init__(self, loaded, path=None, max_jobs: int = MAX_JOBS, retention_s: float = RETENTION_S,
                 max_bytes: int = MAX_BYTES, context: int | None = None, max_tokens_limit: int | None = None,
                 monitor=None, flush_s: float = FLUSH_S):
        self.loaded = loaded
        self.path = Path(path) if path is not None else default_path()
        self.max_jobs = check_int("max_jobs", max_jobs, lo=1)
        self.retention_s = check_float("retention_s", retention_s, lo=0)
        self.max_bytes = check_int("max_bytes", max_bytes, lo=1)
        self.flush_s = check_float("flush_s", flush_s, lo=0)
        self.context = int(context or getattr(getattr(loaded, "info", None), "max_context_tokens", 0) or 8192)
        self.max_tokens_limit = max_tokens_limit or self.context
        self.monitor = monitor
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            if "stages" not in {c[1] for c in self._db.execute("PRAGMA table_info(jobs)")}:  # a store from before
                self._db.execute("ALTER TABLE jobs ADD COLUMN stages TEXT NOT NULL DEFAULT '[]'")
            # jobs a previous server left unfinished (stopped or crashed mid-run) are interrupted, not lost
            self._db.execute("UPDATE jobs SET status='interrupted', updated=? WHERE status IN ('queued','running')",
                             (time.time(),))
        self.JobRequest = _schema()
        self._queue: queue.Queue = queue.Queue()
        self._cancel: dict[str, threading.Event] = {}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name="workbench-jobs", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ storage

    def _q(self, sql: str, args=()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._db.execute(sql, args)
            return cur.fetchall()

    def _row(self, jid: str) -> dict:
        with self._lock:
            self._purge()
            cur = self._db.execute("SELECT * FROM jobs WHERE id=?", (jid,))
            r = cur.fetchone()
            names = [d[0] for d in cur.description]
            if r is None:
                gone = self._db.execute("SELECT 1 FROM expired WHERE id=?", (jid,)).fetchone()
        if r is None:
            if gone:
                raise JobError(410, f"job {jid!r:.80}: expired (finished jobs are kept {self.retention_s:g} s)",
                               param="job_id", etype="not_found")
            raise JobError(404, f"job {jid!r:.80}: unknown", param="job_id", etype="not_found")
        return dict(zip(names, r))

    def _purge(self) -> None:
        """Delete finished / interrupted jobs past their retention (remembered as expired)."""
        cutoff = time.time() - self.retention_s
        with self._lock:
            old = [r[0] for r in self._db.execute(
                "SELECT id FROM jobs WHERE status NOT IN ('queued','running') AND updated < ?", (cutoff,))]
            for jid in old:
                self._delete(jid, expired=True)

    def _delete(self, jid: str, expired: bool = False) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM job_events WHERE job_id=?", (jid,))
            self._db.execute("DELETE FROM jobs WHERE id=?", (jid,))
            if expired:
                self._db.execute("INSERT OR REPLACE INTO expired VALUES (?, ?)", (jid, time.time()))
                self._db.execute("DELETE FROM expired WHERE id NOT IN (SELECT id FROM expired ORDER BY at DESC LIMIT 10000)")
            self._db.execute("COMMIT")

    def stored_bytes(self) -> int:
        return int(self._q("SELECT COALESCE(SUM(bytes), 0) FROM jobs")[0][0])

    # ------------------------------------------------------------------ API

    def submit(self, payload) -> dict:
        """Validate a job request, store it queued, start it; its status dict.

        Raises:
            JobError: malformed request (400, nothing stored) or a limit reached (429).
        """
        from pydantic import ValidationError

        from ..generation import encode_prompts

        if not isinstance(payload, dict):
            raise JobError(400, "request body: must be a JSON object")
        try:
            req = self.JobRequest.model_validate(payload)
        except ValidationError as exc:
            e = exc.errors()[0]
            param = ".".join(str(x) for x in e.get("loc", ()))
            raise JobError(400, f"{param}: {e.get('msg')}", param=param or None) from None
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
            enc = encode_prompts(self.loaded.tokenizer, [messages])
        except Exception as exc:  # noqa: BLE001 - a template that refuses these messages
            raise JobError(400, f"messages: cannot apply the chat template ({exc})", "messages") from None
        prompt_ids = enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()
        if len(prompt_ids) + req.max_tokens > self.context:
            field = "topic" if req.strategy.startswith("outline") else "messages"
            raise JobError(400, f"{field}: prompt ({len(prompt_ids)} tokens) + max_tokens ({req.max_tokens}) "
                                f"exceeds the context ({self.context})", field)
        if req.strategy.startswith("outline"):
            messages = None  # it writes its own prompts (workbench.long_form)
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
            self._db.execute("INSERT INTO jobs (id, created, updated, status, request, prompt_ids, bytes) "
                             "VALUES (?, ?, ?, 'queued', ?, ?, ?)", (jid, now, now, request, json.dumps(prompt_ids), size))
        self._enqueue(jid)
        return self.status(jid)

    def _long_form(self, req) -> list[dict]:
        """Check a long-output job (``strategy``, ``topic``, ``n_sections``, ``language``, ``outline_tokens``,
        ``max_tokens`` the whole budget) and fill its defaults in ``req``; the messages of its first request.

        Raises:
            JobError: 400 naming the field.
        """
        from ..long_form import LongOutputPlan, one_shot_prompt

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

    def _enqueue(self, jid: str) -> None:
        self._cancel[jid] = threading.Event()
        self._queue.put(jid)

    def status(self, jid: str) -> dict:
        r = self._row(jid)
        req = json.loads(r["request"])
        out = json.loads(r["output_ids"])
        return {"id": jid, "object": "job", "status": r["status"], "created": r["created"], "updated": r["updated"],
                "prompt_tokens": len(json.loads(r["prompt_ids"])), "output_tokens": len(out),
                "max_tokens": req["max_tokens"], "finish_reason": r["finish_reason"], "error": r["error"],
                "events": r["events"], "runs": r["runs"], "bytes": r["bytes"],
                "strategy": req.get("strategy", "chat"), "stages": len(json.loads(r["stages"])),
                "exact_resume": req["temperature"] == 0}

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
        self._q("UPDATE jobs SET status='queued', error=NULL, updated=? WHERE id=?", (time.time(), jid))
        self._enqueue(jid)
        return self.status(jid)

    def delete(self, jid: str) -> dict:
        self._row(jid)
        ev = self._cancel.get(jid)
        if ev is not None:
            ev.set()
        self._delete(jid)
        return {"id": jid, "object": "job", "deleted": True}

    def events_after(self, jid: str, after: int) -> tuple[list[tuple[int, str]], dict]:
        """Stored text events after number ``after`` and the job's current row (404/410 as :meth:`status`)."""
        r = self._row(jid)
        rows = self._q("SELECT seq, data FROM job_events WHERE job_id=? AND seq>? ORDER BY seq", (jid, after))
        return [(int(s), d) for s, d in rows], r

    def close(self) -> None:
        """Stop the worker; a job running now is left ``interrupted`` with what it stored."""
        self._closing.set()
        for ev in list(self._cancel.values()):
            ev.set()
        self._queue.put(None)
        self._thread.join(timeout=60)
        with self._lock:
            self._db.execute("UPDATE jobs SET status='interrupted', updated=? WHERE status IN ('queued','running')",
                             (time.time(),))
            self._db.close()

    def wait(self, jid: str, timeout: float = 120.0, statuses=FINISHED + ("interrupted",)) -> dict:
        """Block until the job reaches one of ``statuses`` (tests, notebooks)."""
        end = time.monotonic() + timeout
        while True:
            st = self.status(jid)
            if st["status"] in statuses or time.monotonic() > end:
                return st
            time.sleep(0.05)

    # ------------------------------------------------------------------ worker

    def _work(self) -> None:
        while True:
            jid = self._queue.get()
            if jid is None:
                return
            if self._closing.is_set():
                continue
            try:
                self._run(jid)
            except JobError:  # deleted meanwhile
                pass
            except Exception as exc:  # noqa: BLE001 - recorded on the job
                try:
                    self._q("UPDATE jobs SET status='failed', error=?, updated=? WHERE id=?",
                            (f"{type(exc).__name__}: {exc}"[:500], time.time(), jid))
                except sqlite3.Error:
                    pass
            finally:
                self._cancel.pop(jid, None)

    def _run(self, jid: str) -> None:
        from ..detokenize import IncrementalDetokenizer
        from ..generation import GenerationSettings, eos_token_ids, generate_measured
        from .server import _stopping

        r = self._row(jid)
        if r["status"] != "queued":
            return
        cancel = self._cancel.get(jid) or threading.Event()
        req = json.loads(r["request"])
        if req.get("strategy", "chat").startswith("outline"):
            self._q("UPDATE jobs SET status='running', runs=runs+1, updated=? WHERE id=?", (time.time(), jid))
            self._run_long_form(jid, r, req, cancel)
            return
        prompt_ids = json.loads(r["prompt_ids"])
        stored = json.loads(r["output_ids"])
        eos = eos_token_ids(self.loaded)
        detok = IncrementalDetokenizer(self.loaded.tokenizer)
        for tok in stored:  # the detokeniser's state at the breakpoint (its text is what was stored)
            detok.push(tok)
        remaining = req["max_tokens"] - len(stored)
        now = time.time()
        self._q("UPDATE jobs SET status='running', runs=runs+1, updated=? WHERE id=?", (now, jid))
        if remaining <= 0 or (stored and stored[-1] in eos):
            self._finish(jid, "done", "stop" if stored and stored[-1] in eos else "length")
            return
        state = {"ids": [], "pieces": [], "events": r["events"], "t_flush": time.perf_counter(),
                 "bytes": r["bytes"], "over": False, "stamps": []}

        def flush():
            if not state["ids"] and not state["pieces"]:
                return
            new_ids, pieces = state["ids"], state["pieces"]
            state["ids"], state["pieces"] = [], []
            if not self._append(jid, new_ids, pieces):
                cancel.set()
            state["over"] = state["over"] or self.stored_bytes() > self.max_bytes
            if state["over"]:
                cancel.set()
            state["t_flush"] = time.perf_counter()

        def on_step(ids, t):
            tok = int(ids[0])
            if state.get("ended"):
                return
            state["ids"].append(tok)
            state["stamps"].append(t)
            piece = detok.push(tok)
            if tok in eos:
                piece += detok.finish()
                state["ended"] = True
            state["pieces"].append(piece)
            if t - state["t_flush"] >= self.flush_s:
                flush()

        settings = GenerationSettings(
            max_new_tokens=remaining, ignore_eos=bool(req["ignore_eos"]),
            min_new_tokens=max(0, min(req["min_tokens"] - len(stored), remaining)),
            temperature=float(req["temperature"]), top_p=float(req["top_p"]), seed=int(req["seed"]) + len(stored))
        t_start = time.perf_counter()
        batch = generate_measured(self.loaded, [""], settings, input_ids=[prompt_ids + stored], on_step=on_step,
                                  stopping_criteria=_stopping(cancel, lambda: self._closing.is_set()),
                                  t_submit=t_start)
        rec = batch.records[0]
        if not state.get("ended") and not cancel.is_set() and not self._closing.is_set():
            state["pieces"].append(detok.finish(cut=rec["finish_reason"] == "length"))
        flush()
        if self.monitor is not None and state["stamps"]:
            from .. import metrics

            tm = metrics.request_timing(state["stamps"], t_start)
            self.monitor.observe(tm["ttft_s"], tm["itl_s"], tm["e2e_s"], tm["output_tokens"], rec["finish_reason"],
                                 endpoint="jobs")
        if state["over"]:
            self._finish(jid, "failed", "storage_limit",
                         f"max_bytes: the store reached its limit of {self.max_bytes} bytes; the output so far is kept")
        elif self._closing.is_set():
            self._finish(jid, "interrupted", None)
        elif cancel.is_set():
            self._finish(jid, "cancelled", "cancelled")
        else:
            self._finish(jid, "done", rec["finish_reason"])

    def _append(self, jid: str, new_ids: list[int], pieces: list[str], stage: dict | None = None) -> bool:
        """Store a job's new token ids, text pieces (one numbered event each) and finished ``stage`` in one
        transaction; False when the job was deleted meanwhile."""
        pieces = [p for p in pieces if p]
        with self._lock:
            row = self._db.execute("SELECT output_ids, text, events, stages FROM jobs WHERE id=?", (jid,)).fetchone()
            if row is None:
                return False
            ids, text, seq = json.loads(row[0]) + list(new_ids), row[1] + "".join(pieces), row[2]
            stages = row[3] if stage is None else json.dumps(json.loads(row[3]) + [stage])
            add = sum(len(p.encode()) * 2 + 16 for p in pieces) + 8 * len(new_ids) + len(stages) - len(row[3])
            self._db.execute("BEGIN")
            for p in pieces:
                seq += 1
                self._db.execute("INSERT INTO job_events VALUES (?, ?, ?)", (jid, seq, p))
            self._db.execute("UPDATE jobs SET output_ids=?, text=?, events=?, stages=?, bytes=bytes+?, updated=? "
                             "WHERE id=?", (json.dumps(ids), text, seq, stages, add, time.time(), jid))
            self._db.execute("COMMIT")
        return True

    def _run_long_form(self, jid: str, r: dict, req: dict, cancel: threading.Event) -> None:
        """An outline job: :func:`workbench.long_form.run_long_output` with every finished generation stored as a
        stage (a continued job reuses its stages and redoes the one cut) and every section as a text event."""
        from ..generation import BatchResult, GenerationSettings, generate_measured
        from ..long_form import LongOutputPlan, run_long_output
        from .server import _stopping

        stages = json.loads(r["stages"])
        sections_stored = r["events"]
        calls = [0]

        def generate(loaded, prompts, settings: GenerationSettings):
            k = calls[0]
            calls[0] += 1
            if k < len(stages):  # done before the breakpoint
                return BatchResult(**stages[k])
            batch = generate_measured(loaded, prompts, settings,
                                      stopping_criteria=_stopping(cancel, lambda: self._closing.is_set()))
            if cancel.is_set() or self._closing.is_set():
                raise _Stopped()
            stage = {"records": [{k2: v for k2, v in rec.items() if k2 != "sequences"} for rec in batch.records],
                     "t_submit": batch.t_submit, "wall_s": batch.wall_s, "preprocess_s": batch.preprocess_s,
                     "prefill_s": batch.prefill_s}
            ids = [t for rec in stage["records"] for t in rec["output_ids"]]
            if not self._append(jid, ids, [], json.loads(json.dumps(stage, default=float))):
                raise _Stopped()
            if self.stored_bytes() > self.max_bytes:
                raise _Stopped("storage_limit")
            return batch

        def on_section(k: int, piece: str) -> None:
            if k >= sections_stored and not self._append(jid, [], [piece]):
                raise _Stopped()

        plan = LongOutputPlan.make(req["max_tokens"], req["n_sections"], req["outline_tokens"])
        try:
            res = run_long_output(self.loaded, req["strategy"], req["topic"], plan, req["language"],
                                  float(req["temperature"]), int(req["seed"]), generate=generate, on_section=on_section)
        except _Stopped as exc:
            if str(exc) == "storage_limit":
                self._finish(jid, "failed", "storage_limit",
                             f"max_bytes: the store reached its limit of {self.max_bytes} bytes; the output so far is kept")
            else:
                self._finish(jid, "interrupted" if self._closing.is_set() else "cancelled",
                             None if self._closing.is_set() else "cancelled")
            return
        reasons = {rec["finish_reason"] for st in json.loads(self._row(jid)["stages"])[1:] for rec in st["records"]}
        self._finish(jid, "done", "length" if "length" in reasons else "stop")
        del res  # its merged text is the stored one: the sections' pieces concatenate to it

    def _finish(self, jid: str, status: str, finish_reason: str | None, error: str | None = None) -> None:
        self._q("UPDATE jobs SET status=?, finish_reason=?, error=?, updated=? WHERE id=?",
                (status, finish_reason, error, time.time(), jid))


def install(app, loaded, error, keepalive_s: float = 15.0, **store_kwargs) -> JobStore:
    """Open the store and add the ``/v1/jobs`` routes to ``app``; ``error(status, msg, param, etype)``."""
    from fastapi.responses import JSONResponse, StreamingResponse
    from .events import StreamError, event_number
    from .server import sse_data

    try:
        store = JobStore(loaded, **store_kwargs)
    except TypeError as exc:
        raise ParameterError(f"jobs: {exc}") from None

    def fail(exc: JobError):
        return error(exc.status, exc.message, param=exc.param, etype=exc.etype)

    @app.post("/v1/jobs")
    async def post_job(request: Request):
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return error(415, f"Content-Type: must be application/json (got {ctype or 'none'!r})",
                         param="Content-Type", etype="unsupported_media_type")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > MAX_BODY_BYTES:
                return error(413, f"request body: must be at most {MAX_BODY_BYTES} bytes", etype="request_too_large")
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return error(400, f"request body: must be JSON ({str(exc)[:200]})")
        try:
            st = await asyncio.to_thread(store.submit, payload)
        except JobError as exc:
            return fail(exc)
        return JSONResponse(st, status_code=202, headers={"Location": f"/v1/jobs/{st['id']}"})

    @app.get("/v1/jobs")
    async def list_jobs():
        return {"object": "list", "data": store.list()}

    def route(fn):
        async def handler(job_id: str):
            try:
                return fn(job_id)
            except JobError as exc:
                return fail(exc)
        return handler

    app.get("/v1/jobs/{job_id}")(route(store.status))
    app.get("/v1/jobs/{job_id}/result")(route(store.result))
    app.post("/v1/jobs/{job_id}/continue")(route(store.continue_job))
    app.delete("/v1/jobs/{job_id}")(route(store.delete))

    @app.get("/v1/jobs/{job_id}/events")
    async def job_events(job_id: str, request: Request):
        last = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        try:
            rows, r = store.events_after(job_id, 0)
            after = 0
            if last:
                sid, after = event_number(last)
                if sid != job_id:
                    raise StreamError(400, f"Last-Event-ID: names {sid!r:.80}, not job {job_id!r:.80}", "Last-Event-ID")
                if after > r["events"]:
                    raise StreamError(400, f"Last-Event-ID: event {after} of {job_id} was never sent", "Last-Event-ID")
        except JobError as exc:
            return fail(exc)
        except StreamError as exc:
            return error(exc.status, exc.message, param=exc.param)

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
                    yield f"id: {job_id}:{seq}\n" + sse_data({"text": data})
                if r["status"] not in ("queued", "running") and seen >= r["events"]:
                    # no id: a job continued later numbers its next text event r["events"] + 1
                    yield sse_data({"status": r["status"], "finish_reason": r["finish_reason"], "error": r["error"]})
                    yield "data: [DONE]\n\n"
                    return
                if time.monotonic() - idle > keepalive_s:
                    idle = time.monotonic()
                    yield ": keep-alive\n\n"
                await asyncio.sleep(0.05)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return store
