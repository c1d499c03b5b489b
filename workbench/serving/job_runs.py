"""How a stored job runs on the engine: the run of a job (:class:`JobRun`: its stop reason and its engine requests)
and :class:`JobRuns`, the half of :class:`workbench.serving.jobs.JobStore` that submits a job's generations to the
engine and stores what its callbacks report: a chat (or ``one_shot``) job as one engine request whose tokens and
text the store's writer thread writes every ``flush_s``, an outline job as a driver thread running
:func:`workbench.techniques.long_form.run_long_output` with each generation one engine group stored as a stage; and
how a run ends (done, failed, cancelled, interrupted, ``storage_limit``).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time

from workbench.serving import engines
from workbench.serving.job_store import JobError

log = logging.getLogger(__name__)

UNFINISHED = ("queued", "running")
FINAL_RETRY_S = 0.5       # a final status the store refused is tried again after this long, doubling ...
FINAL_RETRY_MAX_S = 5.0   # ... up to this, until it lands
STRANDED = ("its run ended while the store could not record it (an outage or a failed start); "
            "POST /v1/jobs/<id>/continue resumes it from its stored tokens")


class _Stopped(Exception):
    """A long-output job stopped between or inside its generations (cancelled, deleted, server closing)."""


class JobRun:
    """One run of a job: its stop reason (``cancelled``: deleted; ``interrupted``: the store is closing;
    ``storage_limit``) and the engine requests it has in flight (stopped with it).

    A job has at most one run (the store's registry, ``JobStore._runs``): registered before the job's row says
    ``queued`` and unregistered only once its final status is written (issue 51), so a job whose row says queued
    or running without a run in the registry was stranded (see :meth:`JobRuns._view`)."""

    def __init__(self):
        self.reason: str | None = None
        self.requests: list = []
        self.engine = None
        self.ended = threading.Event()

    def stop(self, reason: str) -> None:
        """Stop the run with ``reason`` (the first one given wins). Its requests still waiting in the engine's
        queue leave it at once (:meth:`workbench.serving.engines.BaseEngine.withdraw`: their places are free for
        the next request); a running one stops at its next step."""
        if self.reason is None:
            self.reason = reason
        withdraw = getattr(self.engine, "withdraw", None)
        for r in list(self.requests):
            if withdraw is not None:
                withdraw(r, self.reason)
            else:
                r.stop(self.reason)

    def submit(self, engine, reqs: list, max_pending: int | None = None) -> None:
        """Hand ``reqs`` to ``engine`` as one group; already stopped: they stop at once.

        Raises:
            workbench.serving.engines.EngineFull: ``max_pending`` requests already pending (nothing queued).
        """
        self.engine = engine
        self.requests = list(reqs)
        if self.reason is not None:
            for r in reqs:
                r.stop(self.reason)
        if max_pending is None:
            engine.submit_group(reqs)
        else:
            engine.submit_group(reqs, max_pending=max_pending)


class JobRuns:
    """The running half of :class:`workbench.serving.jobs.JobStore` (see the module docstring): it uses the store's
    engine, limits and tables (:class:`workbench.serving.job_store.JobTable`)."""

    # ------------------------------------------------------------------ the registry of runs

    def _register(self, jid: str) -> JobRun:
        """A new run of ``jid`` in the registry, before its row says ``queued`` (a reader never sees a queued job
        without its run).

        Raises:
            JobError: 409, the job already has a live run (a second run would write into the same job twice).
        """
        with self._runs_lock:
            live = self._runs.get(jid)
            if live is not None:
                raise JobError(409, f"job {jid}: a run of it is in progress (queued, running or writing its final "
                                    "status); nothing to continue", "job_id", "conflict")
            run = self._runs[jid] = JobRun()
        return run

    def _ended(self, jid: str, run: JobRun) -> None:
        """The run is over and its final status written (or the job deleted): out of the registry."""
        with self._runs_lock:
            if self._runs.get(jid) is run:
                self._runs.pop(jid, None)
        run.ended.set()
        self.changes.bump()   # how the job reads may change with its run gone (_view)

    def _view(self, jid: str, row: dict) -> dict:
        """``row`` as a reader may show it: a job whose row says ``queued`` or ``running`` with no run in the
        registry was stranded (an outage lost the writes that would have ended it, or its start failed): it is
        ``interrupted`` (continuable) from this read on, and the writer thread marks it so in the file (one mark
        waiting per job; a failing store leaves it to the next read)."""
        if row.get("status") not in UNFINISHED or self._closing.is_set():
            return row
        with self._runs_lock:
            if jid in self._runs:
                return row
            marking = jid in self._marking or "updated" not in row
            self._marking.add(jid)
        if not marking:
            self._writer.put(lambda: self._mark_stranded(jid, row["updated"]))
        return {**row, "status": "interrupted", "error": row.get("error") or STRANDED}

    def _mark_stranded(self, jid: str, updated: float) -> None:
        """The writer thread: write ``interrupted`` on a stranded job, unless a run started meanwhile: it is not in
        the registry and its row is untouched since it was read (``updated``: a continuation's claim changes it), so
        the registry's lock is never held over a write (a slow store would hold every reader behind it)."""
        try:
            with self._runs_lock:
                started = jid in self._runs
            if not started:
                self._q("UPDATE jobs SET status='interrupted', error=COALESCE(error, ?), updated=? "
                        "WHERE id=? AND status IN ('queued','running') AND updated=?", (STRANDED, time.time(), jid,
                                                                                         updated))
        except sqlite3.Error as exc:
            log.warning("job store %s: could not mark stranded job %s interrupted (%s); the next read retries",
                        self.path, jid, exc)
        finally:
            with self._runs_lock:
                self._marking.discard(jid)

    def _settle(self, jid: str, run: JobRun, write, delay: float | None = None) -> None:
        """Write how a run ended (``write()``: its last output and final status), then take it out of the registry.
        A write the store refuses (disk full, a lock held past the writer's retries) is kept pending and tried
        again by the writer thread, backing off from :data:`FINAL_RETRY_S` to :data:`FINAL_RETRY_MAX_S`, until it
        lands: the run stays registered meanwhile (the job reads as queued or running, its event stream stays
        open, ``continue`` answers 409), so no outage leaves a job without its end. A closing store stops trying
        (:meth:`~workbench.serving.jobs.JobStore.close` marks it ``interrupted``)."""
        try:
            write()
        except sqlite3.Error as exc:
            if not self._closing.is_set():
                wait = FINAL_RETRY_S if delay is None else delay
                log.warning("job store %s: job %s: its final status could not be written (%s); retrying in %g s",
                            self.path, jid, exc, wait)
                self._writer.later(wait, lambda: self._settle(jid, run, write, min(2 * wait, FINAL_RETRY_MAX_S)))
                return
            log.error("job store %s: job %s: its final status was not written before the store closed (%s)",
                      self.path, jid, exc)
        except Exception:  # noqa: BLE001 - a bug: logged; the job reads as interrupted (stranded) from now on
            log.exception("job store %s: job %s: recording its end failed", self.path, jid)
        self._ended(jid, run)

    # ------------------------------------------------------------------ running on the engine

    def _start(self, jid: str, run: JobRun, max_pending: int | None = None) -> None:
        """Submit a queued job's (next) run, registered as ``run``, to the engine; an outline job gets a driver
        thread that submits its generations one after the other (it waits on the engine; it generates nothing
        itself).

        Raises:
            workbench.serving.engines.EngineFull: a chat job's request found ``max_pending`` requests pending (the
                run is out of the registry; the caller undoes the row's change).
            sqlite3.Error: the store refused the run's first write (the run is out of the registry).
        """
        if self._closing.is_set():
            self._ended(jid, run)
            return
        try:
            r = self._row(jid)
            if r["status"] != "queued":
                self._ended(jid, run)
                return
            req = json.loads(r["request"])
            self._q("UPDATE jobs SET runs=runs+1, updated=? WHERE id=?", (time.time(), jid))
        except BaseException:
            self._ended(jid, run)
            raise
        if req.get("strategy", "chat").startswith("outline"):
            threading.Thread(target=self._guarded, args=(jid, run, self._run_long_form, r, req),
                             name=f"workbench-job-{jid}", daemon=True).start()
        else:
            self._guarded(jid, run, self._submit_chat, r, req, max_pending)

    def _guarded(self, jid: str, run: JobRun, fn, *args) -> None:
        """``fn(jid, run, *args)``; an exception marks the job failed (a deleted job is left alone); a full engine
        (:class:`~workbench.serving.engines.EngineFull`) is the caller's to answer (429)."""
        try:
            fn(jid, run, *args)
        except engines.EngineFull:
            self._ended(jid, run)
            raise
        except JobError:  # deleted meanwhile
            self._ended(jid, run)
        except Exception as exc:  # noqa: BLE001 - recorded on the job
            error = f"{type(exc).__name__}: {exc}"
            self._settle(jid, run, lambda: self._fail(jid, error))

    def _fail(self, jid: str, error: str) -> None:
        """Mark the job failed with ``error``.

        Raises:
            sqlite3.Error: the store refused the write (:meth:`_settle` tries again)."""
        self._q("UPDATE jobs SET status='failed', error=?, updated=? WHERE id=?", (error[:500], time.time(), jid))

    def _submit_chat(self, jid: str, run: JobRun, r: dict, req: dict, max_pending: int | None = None) -> None:
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
            reason = "stop" if stored and stored[-1] in eos else "length"
            self._settle(jid, run, lambda: self._finish(jid, "done", reason))
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

        def finish_job(res):  # the writer thread; tried again until it lands (_settle)
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
            # every token the engine generated is stored now: a run that ended by itself is done, even when a write
            # failed on the way (an outage) and stopped it after its end
            self._end_run(jid, run, res["finish_reason"], complete=res["finish_reason"] in ("stop", "length"))

        def on_done(res):  # the engine's thread: the last piece, then the writer ends the job
            if not (res.get("error") and res["finish_reason"] == "error") and not state["ended"] \
                    and run.reason is None:
                with buf:
                    state["pieces"].append(detok.finish(cut=res["finish_reason"] == "length"))
            self._writer.put(lambda: self._settle(jid, run, lambda: finish_job(res)))

        settings = self._settings(req, len(stored), remaining)
        run.submit(self.engine, [engines.EngineRequest(prompt_ids + stored, settings, on_token=on_token,
                                                       on_done=on_done, id=jid, endpoint="jobs")], max_pending)

    def _end_run(self, jid: str, run: JobRun, finish_reason: str | None, complete: bool = False) -> None:
        """Record how a run ended: ``done`` with ``finish_reason`` when it ended by itself (``complete``: its engine
        request ended ``stop`` / ``length``, all of it stored) or was never stopped, else its stop reason."""
        if complete or run.reason is None:
            self._finish(jid, "done", finish_reason)
        elif run.reason == "storage_limit":
            self._finish(jid, "failed", "storage_limit",
                         f"max_bytes: the store reached its limit of {self.max_bytes} bytes; the output so far is kept")
        elif run.reason == "write_failed":
            self._finish(jid, "failed", "error", "store: a write failed and was retried; the job stopped with its "
                                                 "output so far stored (POST /v1/jobs/<id>/continue resumes it)")
        elif run.reason == "interrupted":
            self._finish(jid, "interrupted", None)
        else:
            self._finish(jid, "cancelled", "cancelled")

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

    def _run_long_form(self, jid: str, run: JobRun, r: dict, req: dict) -> None:
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
            self._settle(jid, run, lambda: self._end_run(jid, run, None))
            return
        reasons = {rec["finish_reason"] for st in json.loads(self._row(jid)["stages"])[1:] for rec in st["records"]}
        # the merged text is the stored one: the sections' pieces concatenate to it
        self._settle(jid, run, lambda: self._end_run(jid, run, "length" if "length" in reasons else "stop"))

    def _finish(self, jid: str, status: str, finish_reason: str | None, error: str | None = None) -> None:
        """Write the job's final ``status``.

        Raises:
            sqlite3.Error: the store refused the write (:meth:`_settle` tries again)."""
        self._q("UPDATE jobs SET status=?, finish_reason=?, error=?, updated=? WHERE id=?",
                (status, finish_reason, error, time.time(), jid))


def _batch_result(tokenizer, reqs: list):
    """A :class:`workbench.measure.generation.BatchResult` (without ``sequences``) of engine requests run as one group:
    per-request records with the text (decoded as :func:`~workbench.measure.generation.generate_measured` does)."""
    from workbench.measure.generation import BatchResult, decode_output

    t_submit = min(q.t_arrival for q in reqs)
    records = []
    for i, q in enumerate(reqs):
        res = q.result()
        rec = {k: res[k] for k in ("prompt_tokens", "output_tokens", "ttft_s", "prefill_s", "e2e_s", "tpot_s",
                                   "decode_tps", "itl_s", "finish_reason", "output_ids")}
        rec.update(request_id=i, text=decode_output(tokenizer, res["output_ids"], res["finish_reason"]),
                   ttft_s=(q.t_arrival + res["ttft_s"]) - t_submit if res["output_tokens"] else float("nan"))
        records.append(rec)
    t_end = max([q.stamps[-1] for q in reqs if q.stamps] or [t_submit])
    prefill = [q.prefill_s for q in reqs if q.prefill_s is not None]
    return BatchResult(records=records, t_submit=t_submit, wall_s=t_end - t_submit, preprocess_s=0.0,
                       prefill_s=max(prefill) if prefill else float("nan"))
