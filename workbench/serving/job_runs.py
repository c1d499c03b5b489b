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


class _Stopped(Exception):
    """A long-output job stopped between or inside its generations (cancelled, deleted, server closing)."""


class JobRun:
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


class JobRuns:
    """The running half of :class:`workbench.serving.jobs.JobStore` (see the module docstring): it uses the store's
    engine, limits and tables (:class:`workbench.serving.job_store.JobTable`)."""

    # ------------------------------------------------------------------ running on the engine

    def _start(self, jid: str) -> None:
        """Submit a queued job's (next) run to the engine; an outline job gets a driver thread that submits its
        generations one after the other (it waits on the engine; it generates nothing itself)."""
        if self._closing.is_set():
            return
        r = self._row(jid)
        if r["status"] != "queued":
            return
        run = self._runs[jid] = JobRun()
        req = json.loads(r["request"])
        self._q("UPDATE jobs SET runs=runs+1, updated=? WHERE id=?", (time.time(), jid))
        if req.get("strategy", "chat").startswith("outline"):
            threading.Thread(target=self._guarded, args=(jid, run, self._run_long_form, r, req),
                             name=f"workbench-job-{jid}", daemon=True).start()
        else:
            self._guarded(jid, run, self._submit_chat, r, req)

    def _guarded(self, jid: str, run: JobRun, fn, *args) -> None:
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

    def _ended(self, jid: str, run: JobRun) -> None:
        if self._runs.get(jid) is run:
            self._runs.pop(jid, None)
        run.ended.set()

    def _submit_chat(self, jid: str, run: JobRun, r: dict, req: dict) -> None:
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

    def _end_run(self, jid: str, run: JobRun, finish_reason: str | None) -> None:
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
            self._end_run(jid, run, None)
            self._ended(jid, run)
            return
        reasons = {rec["finish_reason"] for st in json.loads(self._row(jid)["stages"])[1:] for rec in st["records"]}
        self._end_run(jid, run, "length" if "length" in reasons else "stop")
        self._ended(jid, run)  # the merged text is the stored one: the sections' pieces concatenate to it

    def _finish(self, jid: str, status: str, finish_reason: str | None, error: str | None = None) -> None:
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
