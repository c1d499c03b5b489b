"""Serving engines: how queued requests share the model (issue 13; docs/design.md section 7, item 8).

**One engine interface** (:class:`BaseEngine`) for everything that generates: the chat route
(:mod:`workbench.serving.chat`), the job store (:mod:`workbench.serving.jobs`) and the load study
(:func:`workbench.load.senders.engine_sender`) all hand it :class:`EngineRequest` s, and nothing else in
``serving/`` runs a generation thread.

- A request is its templated prompt ids, its own :class:`~workbench.measure.generation.GenerationSettings`
  (per-request sampling: the engine decides what may share a batch, see :func:`batch_key`), an optional
  ``deadline``, and two callbacks: ``on_token(token_id, t)`` for each generated id and ``on_done(result)``
  once at the end. :meth:`EngineRequest.stop` stops it with a reason (``cancelled``: the client left;
  ``stop``: a stop string was seen; ``timeout``; any other word a caller needs), while queued or running;
  the reason becomes its ``finish_reason``.
- :meth:`BaseEngine.submit` queues one request (``max_pending``: refuse with :class:`EngineFull` when that
  many are already pending, the server's 429); :meth:`BaseEngine.submit_group` queues requests that must
  share one batch (the sections of a long output). ``observers``: callables ``(request, result)`` run on
  every completion (Prometheus monitoring subscribes here); ``in_flight``, ``pending``, ``rejected`` and
  ``history`` (the last results) describe the engine's state. :meth:`BaseEngine.wait_idle`,
  :meth:`BaseEngine.stop`.
- The waiting queue is a :class:`~.scheduling.PolicyQueue` (``policy``: ``fcfs``, ``priority``, ``sjf`` with
  aging, ``lanes``; :mod:`.scheduling`): ``_loop`` asks it for the next request, ``_collect`` for the batch's
  companions; its :meth:`~.scheduling.PolicyQueue.status` is a waiting request's queue position and ETA.
- A new batching scheme is a subclass choosing the next batch (``_collect``) or serving it (``_serve``);
  an external endpoint is a subclass whose ``_serve`` sends the request elsewhere and feeds
  :meth:`EngineRequest.token` / :meth:`EngineRequest.finish` from the reply.

The three schedulers behind the interface (``fifo``, ``static``, ``continuous``), their KV pool sizing and
:func:`~workbench.serving.engine_kinds.make_engine` are in :mod:`workbench.serving.engine_kinds`.

Per request (:meth:`EngineRequest.result`): ``id``, ``endpoint``, ``queue_s`` (arrival to admission into a batch), and
:func:`workbench.stats.metrics.request_timing` over the per-token stamps from the arrival time (``ttft_s``,
``itl_s``, ``tpot_s``, ``e2e_s``, ``decode_tps``, ``output_tokens``), ``prompt_tokens``,
``output_ids``, ``cached_tokens`` (prompt tokens served from a shared prefix cache: ``continuous`` with
``prefix_sharing``; 0 otherwise), ``finish_reason`` (``stop`` / ``length`` / ``error`` / the reason the request was
stopped with, e.g. ``cancelled``), ``error``, ``batch_size`` (rows that
shared the request's batch; for ``continuous`` the most requests the manager held at once while it ran)
and ``engine``.

Running requests: :meth:`BaseEngine.running_requests` (the batch being served; for ``continuous`` the
manager's running batch) and :class:`RunningSampler`, which samples it in a thread so a load point reports
the mean and max batch over its own window (``engine_batch_mean`` / ``engine_batch_max``), not the engine's
lifetime peak.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
from collections import deque
from typing import Callable

from workbench import checks
from workbench.errors import exception_line
from workbench.measure.generation import GenerationSettings, encode_prompts, eos_token_ids
from workbench.serving import scheduling
from workbench.serving.options import ENGINES, EngineOptions, check_compatible
from workbench.stats import metrics

HISTORY = 1024   # results kept in ``BaseEngine.history``
#: a busy engine (requests running) that delivers no token for this many seconds is reported stuck (``health``)
STALL_S = 300.0
_ids = itertools.count()
log = logging.getLogger(__name__)


class EngineFull(RuntimeError):
    """:meth:`BaseEngine.submit` refused a request: ``max_pending`` requests are already pending."""


class EngineDead(RuntimeError):
    """:meth:`BaseEngine.submit` refused a request: the engine's thread has stopped (the server's 503)."""


def prompt_ids(tokenizer, prompt) -> list[int]:
    """The templated, tokenised ids of one chat prompt (a user string or a list of messages), as engines take
    them: :func:`~workbench.measure.generation.encode_prompts` without the padding."""
    enc = encode_prompts(tokenizer, [prompt])
    return enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()


@dataclasses.dataclass
class EngineRequest:
    """One request handed to an engine.

    Attributes:
        input_ids: the templated, tokenised prompt.
        settings: its :class:`~workbench.measure.generation.GenerationSettings`.
        t_arrival: ``perf_counter`` when the request reached the engine (or the server's handler).
        on_token: ``callable(token_id, t)`` called from the engine's thread for each generated id.
        on_done: ``callable(result_dict)`` called once at the end (also on error or stop).
        cancel: set once the request is stopped (:meth:`stop`; while queued: it never starts).
        id: the request's id (the chat completion or job id).
        deadline: ``perf_counter`` time after which it stops with reason ``timeout`` (None: never).
        endpoint: who sent it (``chat``, ``jobs``, ``load``...), for the observers' labels.
        priority: integer, lower is served first under the ``priority`` policy (:mod:`.scheduling`).
        queue_position, eta_s: what the engine's queue told at arrival (requests ahead, estimated wait in
            seconds; NaN: no estimate yet), set by :meth:`.scheduling.PolicyQueue.put`; the ETA's error is
            ``eta_s - queue_s``.
    """

    input_ids: list
    settings: GenerationSettings
    t_arrival: float = dataclasses.field(default_factory=time.perf_counter)
    on_token: Callable | None = None
    on_done: Callable | None = None
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    id: str = dataclasses.field(default_factory=lambda: f"r{next(_ids)}")
    deadline: float | None = None
    endpoint: str = ""
    priority: int = 0
    queue_position: int | None = None
    eta_s: float | None = None
    stop_reason: str | None = None
    t_admit: float | None = None
    stamps: list = dataclasses.field(default_factory=list)
    output_ids: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    batch_size: int = 1
    engine: str = ""
    prefill_s: float | None = None
    prefill_note: str = ""
    cached_tokens: int = 0
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    callback_error: str | None = None
    _completed: Callable | None = dataclasses.field(default=None, repr=False)  # the engine's bookkeeping
    _finishing: bool = dataclasses.field(default=False, repr=False)

    def stop(self, reason: str = "cancelled") -> None:
        """Stop generating (thread-safe; the first reason given wins and becomes the ``finish_reason``)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.cancel.set()

    def stopped(self) -> bool:
        """Stopped, or past its deadline (then stopped with reason ``timeout``): engines check this each step."""
        if not self.cancel.is_set() and self.deadline is not None and time.perf_counter() > self.deadline:
            self.stop("timeout")
        return self.cancel.is_set()

    def token(self, tok: int, t: float) -> None:
        """Record one generated id at ``t`` and call ``on_token``. A raising ``on_token`` fails this request only:
        it is stopped and finishes ``error`` with the reason (``callback_error``); the engine goes on."""
        self.output_ids.append(int(tok))
        self.stamps.append(t)
        if self.on_token is not None and self.callback_error is None:
            try:
                self.on_token(int(tok), t)
            except Exception as exc:  # noqa: BLE001 - one failure fails one request (the engine boundary)
                self.callback_error = f"on_token: {exception_line(exc)}"
                log.error("request %s: its token callback failed (%s); the request stops", self.id, self.callback_error)
                self.stop("error")

    def result(self) -> dict:
        """The request's engine-side figures (see the module docstring)."""
        timing = metrics.request_timing(self.stamps, self.t_arrival)
        return {"id": self.id, "engine": self.engine, "endpoint": self.endpoint, "t_arrival": self.t_arrival,
                "t_admit": self.t_admit,
                "queue_s": (self.t_admit - self.t_arrival) if self.t_admit is not None else float("nan"),
                **timing, "prompt_tokens": len(self.input_ids), "output_ids": list(self.output_ids),
                "prefill_s": float("nan") if self.prefill_s is None else self.prefill_s,
                "prefill_note": self.prefill_note, "cached_tokens": int(self.cached_tokens),
                "finish_reason": self.finish_reason, "batch_size": self.batch_size, "error": self.error}

    def finish(self, reason: str | None = None, error: str | None = None) -> None:
        """End the request once: ``reason`` (the stop reason when it was stopped), ``on_done``, the engine's
        bookkeeping and observers; then ``done`` is set. Never raises: a failed callback (``on_token`` earlier,
        or ``on_done`` now) makes the request's ``finish_reason`` ``error`` with the reason, and the engine that
        called it goes on."""
        if self._finishing:
            return
        self._finishing = True
        if self.callback_error is not None and error is None:
            reason, error = "error", self.callback_error
        elif self.cancel.is_set() and error is None:
            reason = self.stop_reason or "cancelled"
        self.finish_reason, self.error = reason, error
        try:
            result = self.result()
            if self.on_done is not None:
                self.on_done(result)
        except Exception as exc:  # noqa: BLE001 - one failure fails one request (the engine boundary)
            self.callback_error = f"on_done: {exception_line(exc)}"
            log.error("request %s: its completion callback failed (%s)", self.id, self.callback_error)
            self.finish_reason, self.error = "error", self.callback_error
            try:
                result = self.result()
            except Exception:  # noqa: BLE001
                result = {"id": self.id, "engine": self.engine, "endpoint": self.endpoint,
                          "finish_reason": "error", "error": self.error}
        try:
            if self._completed is not None:
                self._completed(self, result)
        except Exception as exc:  # noqa: BLE001 - bookkeeping must not take the engine down either
            log.error("request %s: engine bookkeeping failed (%s)", self.id, exception_line(exc))
        finally:
            self.done.set()


def batch_key(s: GenerationSettings) -> tuple:
    """Settings that must agree within one ``generate`` batch (``max_new_tokens`` may differ per row)."""
    return (s.do_sample, s.temperature if s.do_sample else 0.0, s.top_p if s.do_sample else 1.0, s.ignore_eos,
            s.min_new_tokens, s.seed)


def may_join(queue: "scheduling.PolicyQueue", batch: list, req) -> bool:
    """Whether waiting ``req`` may join the ``static`` batch ``batch`` (its first request taken): the same
    :func:`batch_key` and the queue's policy lets it (``lanes``: same lane, long ones up to the cap). The one home
    of the static window's companion rule: :class:`~workbench.serving.engine_kinds.StaticEngine` and the serving twin (:mod:`workbench.predict.twin`)."""
    return batch_key(req.settings) == batch_key(batch[0].settings) and queue.joins(batch, req)


def is_full(pending: int, adding: int, max_pending: int | None) -> bool:
    """Whether an engine with ``pending`` requests refuses ``adding`` more under ``max_pending`` (None: never): the
    admission rule behind :class:`EngineFull` (the server's 429), shared with the serving twin."""
    return max_pending is not None and pending + adding > max_pending


class BaseEngine:
    """The engine interface (see the module docstring): a queue of :class:`EngineRequest` s served by a worker
    thread; subclasses choose a batch (:meth:`_collect`) and serve it (:meth:`_serve`).

    Args:
        loaded: the model.
        policy: the waiting queue's scheduling policy (:data:`.scheduling.POLICIES`) or a ready
            :class:`.scheduling.PolicyQueue` (its aging, lane threshold and long cap); ``queue`` is it.

    Attributes:
        observers: callables ``(request, result)`` run after each request's ``on_done`` (from the engine's
            thread; an observer's exception is swallowed: observing never breaks serving).
        history: the results of the last :data:`HISTORY` finished requests, newest last.
        in_flight: ``{id: request}`` of the requests submitted and not finished.
        rejected: requests refused with :class:`EngineFull`.
    """

    name = "base"

    def __init__(self, loaded, policy: "str | scheduling.PolicyQueue" = "fcfs"):
        self.loaded = loaded
        self.eos = eos_token_ids(loaded)
        self.queue = policy if isinstance(policy, scheduling.PolicyQueue) else scheduling.PolicyQueue(policy)
        check_compatible(EngineOptions(engine=self.name) if self.name in ENGINES else EngineOptions(), self.queue.policy)
        self.options = EngineOptions(engine=self.name) if self.name in ENGINES else EngineOptions()
        self.policy = self.queue.policy
        self.history: deque = deque(maxlen=HISTORY)
        # the service-rate estimate behind queue ETAs, and the service-time fit of sjf's fitted predictor
        self.observers: list[Callable] = [self.queue.rate, self.queue.fit]
        self.in_flight: dict[str, EngineRequest] = {}
        self.rejected = 0
        self.stall_s = STALL_S
        self.fatal: str | None = None  # why the engine's thread stopped, when it did (health)
        self._shutting_down = False
        self._count_lock = threading.Lock()
        self._running = 0  # requests in the batch being served (read by running_requests / RunningSampler)
        self._t_progress = time.perf_counter()  # the last batch start or generated token (health's stall check)
        self._thread = threading.Thread(target=self._guarded_loop, args=(self._loop,), name=f"workbench-{self.name}",
                                        daemon=True)
        self._thread.start()
        threading.Thread(target=self._reap, name=f"workbench-{self.name}-deadlines", daemon=True).start()

    REAP_S = 0.1  # how often waiting requests' deadlines are checked

    def _reap(self) -> None:
        """A request whose deadline passes while it waits leaves the queue then (finished ``timeout``), not when the
        worker reaches it: it no longer holds a place (``max_pending``: no spurious 429s behind it)."""
        while not self._shutting_down:
            time.sleep(self.REAP_S)
            try:
                now = time.perf_counter()
                for r in self.queue.waiting():
                    if r.deadline is not None and now > r.deadline:
                        self.withdraw(r, "timeout")
            except Exception as exc:  # noqa: BLE001 - never stop checking
                log.error("%s engine: deadline check failed (%s)", self.name, exception_line(exc))

    def _guarded_loop(self, loop) -> None:
        """Run a worker loop; if it ever ends by an exception (a fault outside any one request: every request's own
        failure is caught inside), say why in ``fatal`` (``health`` reports it) and fail what is in flight."""
        try:
            loop()
        except BaseException as exc:  # noqa: BLE001 - recorded; the server's watchdog exits non-zero
            self.fatal = f"{threading.current_thread().name}: {exception_line(exc)}"
            log.critical("%s engine: its worker stopped (%s)", self.name, self.fatal)
            for r in list(self.in_flight.values()):
                r.stop("error")
                r.finish("error", f"{self.name} engine: its worker stopped ({self.fatal})")

    def _threads(self) -> list:
        """The engine's worker threads (all must be alive)."""
        return [self._thread]

    def _busy(self) -> bool:
        return self._running > 0

    def health(self) -> tuple[bool, str]:
        """Is the engine serving? ``(True, "ok")``, or ``(False, reason)`` when it is stopping, a worker thread has
        stopped (``fatal`` says why), or it has requests running and delivered no token for ``stall_s`` seconds.
        The server answers ``GET /health`` from it (503 with the reason; vLLM does the same for a dead engine)."""
        if self._shutting_down:
            return False, f"{self.name} engine: stopping"
        for t in self._threads():
            if not t.is_alive():
                return False, f"{self.name} engine: its thread {t.name} has stopped ({self.fatal or 'no reason recorded'})"
        idle = time.perf_counter() - self._t_progress
        if self._busy() and idle > self.stall_s:
            return False, (f"{self.name} engine: stuck (requests running, no token for {idle:.0f} s; "
                           f"bound {self.stall_s:g} s)")
        return True, "ok"

    @property
    def dead(self) -> bool:
        """A worker thread has stopped while the engine was not stopping: it cannot recover (the process exits)."""
        return not self._shutting_down and any(not t.is_alive() for t in self._threads())

    @property
    def pending(self) -> int:
        """Requests submitted and not finished (queued or running)."""
        return len(self.in_flight)

    def submit(self, req: EngineRequest, max_pending: int | None = None) -> EngineRequest:
        """Queue one request (returns at once; its callbacks report from the engine's thread).

        Raises:
            EngineFull: ``max_pending`` requests are already pending (the request is not queued).
            RuntimeError: the engine is stopped.
            ParameterError: the engine cannot serve these settings (e.g. ``continuous``: other sampling).
        """
        self._admit([req], max_pending)
        self.queue.put(req)
        return req

    def withdraw(self, req: EngineRequest, reason: str = "abandoned") -> bool:
        """Stop ``req`` with ``reason`` and, while it still waits in the queue, take it out and finish it now,
        so it frees its place (``pending``, ``max_pending``) at once instead of when the worker reaches it.
        Returns True when it was taken out of the queue (a running request stops at its next step)."""
        req.stop(reason)
        if not self.queue.remove(req):
            return False
        req.t_admit = time.perf_counter()
        req.finish()
        return True

    def submit_group(self, reqs: list, max_pending: int | None = None) -> list:
        """Queue requests that must share one batch (one padded ``generate`` for ``fifo`` / ``static``; the
        ``continuous`` manager admits them together). Raises as :meth:`submit` (:class:`EngineFull` only with
        ``max_pending``). A member withdrawn while the group waits (:meth:`withdraw`) leaves the group at once."""
        self._admit(reqs, max_pending)
        self.queue.put(list(reqs))
        return reqs

    def _admit(self, reqs: list, max_pending: int | None) -> None:
        if self._shutting_down:
            raise RuntimeError(f"{self.name} engine: stopped")
        if self.dead:
            raise EngineDead(self.health()[1])
        for r in reqs:
            self._prepare(r)
        with self._count_lock:
            if is_full(len(self.in_flight), len(reqs), max_pending):
                self.rejected += len(reqs)
                raise EngineFull(f"{self.name} engine: {len(self.in_flight)} requests pending (limit {max_pending})")
            for r in reqs:
                r.engine, r._completed = self.name, self._completed
                self.in_flight[r.id] = r

    def _prepare(self, req: EngineRequest) -> None:
        """Refuse a request this engine cannot serve (:class:`ParameterError`, one line) or fill in what the
        engine sets on every request; by default nothing."""

    #: a sampled request's own ``seed`` is honoured (``continuous``: one generator, the engine's ``seed_default``)
    per_request_seed = True

    def check_settings(self, settings: GenerationSettings) -> None:
        """Refuse settings this engine cannot serve, before any work (:class:`ParameterError`, one line naming the
        field), as :meth:`submit` would."""
        self._prepare(EngineRequest([0], settings))

    @property
    def seed_default(self) -> int | None:
        """The seed every sampled request gets when the engine cannot take one per request (None: it can)."""
        return None

    def _completed(self, req: EngineRequest, result: dict) -> None:
        self.history.append(result)
        for obs in list(self.observers):
            try:
                obs(req, result)
            except Exception:  # noqa: BLE001 - observing never breaks serving
                pass
        with self._count_lock:
            self.in_flight.pop(req.id, None)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the worker after the requests already queued (daemon threads: never blocks past ``timeout`` s)."""
        self._shutting_down = True
        self.queue.put(None)
        self._thread.join(timeout=timeout)

    def interrupt(self, reason: str = "shutdown") -> int:
        """Stop every request in flight with ``reason`` (queued ones leave the queue at once); how many."""
        reqs = list(self.in_flight.values())
        for r in reqs:
            self.withdraw(r, reason)
        return len(reqs)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until no request is pending (every ``on_done`` and observer has run); False on timeout."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            if not self.in_flight:
                return True
            time.sleep(0.01)
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def _loop(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            batch = list(first) if isinstance(first, list) else [first]
            try:
                if not isinstance(first, list):
                    batch = self._collect(first)
                live = [r for r in batch if not r.stopped()]
                for r in batch:
                    if r.cancel.is_set():  # stopped while queued: it never starts
                        r.t_admit = time.perf_counter()
                        r.finish()
            except Exception as exc:  # noqa: BLE001 - a fault choosing the batch fails that batch, not the engine
                for r in batch:
                    r.finish("error", f"{self.name} engine: {exception_line(exc)}")
                continue
            if live:
                self._running, self.queue.running = len(live), live
                self._t_progress = time.perf_counter()
                try:
                    self._serve(live)
                except Exception as exc:  # every request of the batch not finished yet fails with the reason
                    for r in live:
                        r.finish("error", exception_line(exc))
                finally:
                    self._running, self.queue.running = 0, []

    def _collect(self, first: EngineRequest) -> list:
        return [first]

    def running_requests(self) -> int:
        """Requests the engine is running now (admitted, not finished): the batch being served."""
        return self._running

    def _serve(self, batch: list) -> None:
        raise NotImplementedError


class RunningSampler:
    """Samples an engine's running requests (:meth:`BaseEngine.running_requests`) every ``interval_s`` seconds
    in a daemon thread, so a load point can report the batch it actually ran (mean and max over its window)
    rather than the engine's lifetime peak.

    Use: ``with RunningSampler(engine) as s: ...`` (or :meth:`start` / :meth:`stop`), then :meth:`stats`.
    ``samples`` holds ``(perf_counter, running)`` pairs.

    Raises:
        ParameterError: ``interval_s`` not > 0.
    """

    def __init__(self, engine, interval_s: float = 0.01):
        self.engine = engine
        self.interval_s = checks.check_float("interval_s", interval_s, lo=0, lo_open=True)
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.perf_counter(), int(self.engine.running_requests())))
            self._halt.wait(self.interval_s)

    def start(self) -> "RunningSampler":
        self._thread = threading.Thread(target=self._run, name="workbench-running-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "RunningSampler":
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.samples.append((time.perf_counter(), int(self.engine.running_requests())))
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def stats(self, t_from: float = -math.inf, t_to: float = math.inf) -> dict:
        """``engine_batch_mean`` (time-weighted mean running requests: each sample holds until the next) and
        ``engine_batch_max`` over ``[t_from, t_to]`` (``perf_counter`` seconds); NaN without samples in it."""
        pts = [(t, n) for t, n in self.samples if t_from <= t <= t_to]
        if not pts:
            return {"engine_batch_mean": float("nan"), "engine_batch_max": float("nan")}
        if len(pts) == 1:
            return {"engine_batch_mean": float(pts[0][1]), "engine_batch_max": float(pts[0][1])}
        area = sum(n * (t2 - t1) for (t1, n), (t2, _) in zip(pts, pts[1:]))
        span = pts[-1][0] - pts[0][0]
        return {"engine_batch_mean": area / span if span > 0 else float(pts[0][1]),
                "engine_batch_max": float(max(n for _, n in pts))}


def run_requests(engine: BaseEngine, requests: list, timeout: float = 600.0) -> list[dict]:
    """Submit ``requests`` together and wait for all; their results in order (a test and warm-up helper)."""
    for r in requests:
        engine.submit(r)
    for r in requests:
        if not r.done.wait(timeout):
            raise TimeoutError(f"{engine.name} engine: request {r.id} not finished within {timeout} s")
    return [r.result() for r in requests]
