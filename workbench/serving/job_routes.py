"""The ``/v1/jobs`` routes over the job store (:class:`workbench.serving.jobs.JobStore`, ``app.state.jobs``).

:func:`install` opens the store on the app's engine and adds the routes; each route runs its store work in the
store's own worker threads (``JobStore.pool``), off the event loop, and answers 503 with ``Retry-After`` when the
store refuses it now. The event stream reads the store only when it reports a change, and at least every
:data:`RECHECK_S` (a keep-alive comment after :data:`KEEPALIVE_S` without news).

The routes (JSON errors in the OpenAI shape):

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
"""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import time

from starlette.requests import Request  # module level: FastAPI resolves string annotations here

from workbench.errors import ParameterError
from workbench.serving.events import (
    DONE,
    KEEPALIVE_COMMENT,
    check_last_event_id,
    last_event_id,
    numbered,
    sse_data,
    sse_response,
)
from workbench.serving.http import check_model, read_json_object
from workbench.serving.job_store import JobError
from workbench.serving.jobs import JobStore

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0      # an event stream with nothing new for this long sends ``: keep-alive``
RECHECK_S = 5.0         # an event stream reads the file at least this often even when the store reports no change


def _store(request: Request) -> JobStore:
    return request.app.state.jobs


async def post_job(request: Request):
    """``POST /v1/jobs``: 202 with the new job's status (the body checks of :mod:`workbench.serving.http`)."""
    from fastapi.responses import JSONResponse

    payload = await read_json_object(request)
    chat_cfg = getattr(request.app.state, "chat", None)
    if chat_cfg is not None:
        check_model(payload.get("model"), chat_cfg.model_names)
    st = await _off_loop(_store(request).submit, payload)
    return JSONResponse(st, status_code=202, headers={"Location": f"/v1/jobs/{st['id']}"})


async def _off_loop(fn, *args):
    """``fn(*args)`` in one of the store's own worker threads (``JobStore.pool``): a slow store never holds the event
    loop (the chat streams) nor the default executor (chat's templating). A store that refuses the work now (disk
    full, its lock held by another process past the retries) is a 503 with ``Retry-After``, never a 500: nothing of
    the request was written."""
    import functools

    pool = getattr(getattr(fn, "__self__", None), "pool", None)
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))
    except sqlite3.Error as exc:
        log.warning("job store: %s failed: %s", getattr(fn, "__name__", "a request"), exc)
        raise JobError(503, "jobs: the job store cannot be written now (disk full, or its file locked by another "
                            "process); nothing was changed, retry later", etype="store_unavailable",
                       headers={"Retry-After": "1"}) from None


async def list_jobs(request: Request):
    return {"object": "list", "data": await _off_loop(_store(request).list)}


async def job_status(job_id: str, request: Request):
    return await _off_loop(_store(request).status, job_id)


async def job_result(job_id: str, request: Request):
    return await _off_loop(_store(request).result, job_id)


async def continue_job(job_id: str, request: Request):
    return await _off_loop(_store(request).continue_job, job_id)


async def delete_job(job_id: str, request: Request):
    return await _off_loop(_store(request).delete, job_id)


async def job_events(job_id: str, request: Request):
    """``GET /v1/jobs/{id}/events``: the job's stored text events as SSE (``id: <job>:<n>``), resumable with
    ``Last-Event-ID``; after them one ``{"status": ...}`` event without an id, then ``[DONE]``."""
    store = _store(request)
    _, r = await _off_loop(store.events_after, job_id, 0)
    after = check_last_event_id(last_event_id(request), job_id, r["events"])

    async def stream():
        # The stream reads the file only when the store reports a change (JobStore.changes: every committed write and
        # every run's end bump it), and at least every RECHECK_S: an idle reader of a queued job costs nothing.
        # Each stream's recheck interval is its own, drawn in [RECHECK_S / 2, RECHECK_S]: readers that connected
        # together would otherwise all read the store in the same instant every RECHECK_S (100 idle readers of one
        # queued job: one burst of 100 reads, a 20 ms gap in a running chat stream; benchmarks/idle_sse_readers.py).
        recheck_s = RECHECK_S * random.uniform(0.5, 1.0)
        seen, idle, version, t_read = after, time.monotonic(), None, 0.0
        while True:
            now_version = store.changes.version
            now = time.monotonic()
            if now_version == version and now - t_read < recheck_s:
                await store.changes.wait(version, max(0.05, min(recheck_s - (now - t_read), KEEPALIVE_S - (now - idle))))
                if time.monotonic() - idle > KEEPALIVE_S:
                    idle = time.monotonic()
                    yield KEEPALIVE_COMMENT
                continue
            version, t_read = now_version, time.monotonic()
            try:
                rows, r = await _off_loop(store.events_after, job_id, seen)
            except JobError as exc:
                if exc.status == 503:  # the store cannot be read this moment: look again soon
                    await asyncio.sleep(0.2)
                    version = None
                    continue
                return
            except RuntimeError:  # the store closed (its worker threads are gone): the server is stopping
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

    return sse_response(stream())


def install(app, engine, **store_kwargs) -> JobStore:
    """Open the store on ``engine`` (``app.state.jobs``) and add the ``/v1/jobs`` routes to ``app``.

    Raises:
        ParameterError: an unknown store keyword (one line); :class:`~workbench.serving.job_store.StoreLockedError`: another server owns
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
