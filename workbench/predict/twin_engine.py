"""One engine replica of the serving twin (issue 34) on its virtual clock: :class:`EngineTwin` admits requests
through the real engines' rules (:func:`workbench.serving.engines.is_full`, :func:`~workbench.serving.engines.may_join`),
takes them from its policy queue (:class:`workbench.serving.scheduling.PolicyQueue`) and times ``fifo`` / ``static``
batches and ``continuous`` steps (chunked prefill, prefix sharing) with a :class:`~workbench.predict.twin_cost.StepCost`;
the clock, the requests, the router and the runs are :mod:`workbench.predict.twin`'s, whose docstring states what
the replica models in place of the engines it cannot run without a model.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable

import numpy as np

from workbench.predict.twin_cost import StepCost
from workbench.serving import engines, scheduling


class EngineTwin:
    """One engine replica on the virtual clock (the :mod:`workbench.predict.twin` module docstring).

    Args:
        clock: the :class:`workbench.predict.twin.Clock`.
        engine: one of :data:`workbench.serving.engines.ENGINES`.
        cost: the :class:`~workbench.predict.twin_cost.StepCost`.
        queue: the replica's :class:`~workbench.serving.scheduling.PolicyQueue` (its clock is ``clock``).
        max_batch_size, batch_window_s, max_pending, prefix_sharing, page_size, max_batch_tokens: as the engines'.
        on_done: ``callable(request)`` when a request ends (served, abandoned).
    """

    bulk_decode = True   # take a run of decode-only steps as one event (the same times; tests compare both)

    def __init__(self, clock, engine: str, cost: StepCost, queue: scheduling.PolicyQueue,
                 max_batch_size: int = 8,
                 batch_window_s: float = 0.05, max_pending: int | None = None, prefix_sharing: bool = False,
                 page_size: int = 32, max_batch_tokens: int = 512, on_done: Callable | None = None):
        self.clock, self.name, self.cost, self.queue = clock, engine, cost, queue
        self.max_batch_size = 1 if engine == "fifo" else max_batch_size
        self.batch_window_s = batch_window_s
        self.max_pending, self.prefix_sharing = max_pending, prefix_sharing
        self.page_size, self.max_batch_tokens = page_size, max_batch_tokens
        self.on_done = on_done
        self.observers = [queue.rate, queue.fit]   # as BaseEngine: the ETA's rate and sjf's fit see completions
        self.in_flight: dict = {}
        self.rejected = 0
        self.busy = False
        self._collecting: list | None = None
        self._deadline = 0.0
        self._batch: list = []
        self._version = 0
        self._waiting: list = []      # continuous: the manager's own FIFO queue
        self._running: list = []
        self._cache: dict = {}        # prefix_key -> cached tokens
        self._segment = None          # continuous: a run of decode steps taken at once (rows, stamps, start)
        self.busy_s = 0.0

    @property
    def pending(self) -> int:
        return len(self.in_flight)

    # ------------------------------------------------------------------ admission

    def submit(self, req) -> bool:
        """Queue ``req`` (its ``t_arrival`` now); False when the engine is full (:func:`engines.is_full`)."""
        if engines.is_full(len(self.in_flight), 1, self.max_pending):
            self.rejected += 1
            return False
        req.t_arrival = self.clock.now
        self.in_flight[req.id] = req
        self.queue.put(req)
        self._wake()
        return True

    def withdraw(self, req) -> None:
        """The client gave up: a waiting request leaves at once, a running one gets no more tokens."""
        req.stopped = True
        if self.queue.remove(req):
            req.t_admit = self.clock.now
            self._finish(req)
        elif req in self._waiting:
            self._waiting.remove(req)
            req.t_admit = self.clock.now
            self._finish(req)
        elif self.name != "continuous" and req in self._batch:
            now = self.clock.now
            req.stamps = [t for t in req.stamps if t <= now]
            self._reschedule_end()

    def _finish(self, req) -> None:
        req.done, req.t_done = True, self.clock.now
        self.in_flight.pop(req.id, None)
        if req.stamps:
            res = req.result()
            for obs in self.observers:
                obs(req, res)
        if self.on_done is not None:
            self.on_done(req)

    # ------------------------------------------------------------------ fifo / static

    def _wake(self) -> None:
        if self.name == "continuous":
            while True:   # the feeder hands every queued request to the manager at once
                r = self.queue.get(timeout=0)
                if r is None:
                    break
                self._waiting.append(r)
            if not self.busy:
                self._step()
            elif self._segment is not None and self._waiting and len(self._running) < self.max_batch_size:
                self._cut_segment()
            return
        if self.busy:
            return
        if self._collecting is not None:
            self._fill()
            return
        first = self.queue.get(timeout=0)
        if first is None:
            return
        self._collecting = [first]
        self._deadline = self.clock.now + (self.batch_window_s if self.name == "static" else 0.0)
        self._fill()
        if self._collecting is not None:
            if self.clock.now >= self._deadline:
                self._serve()
            else:
                self.clock.at(self._deadline, self._window_closes, self._collecting)

    def _fill(self) -> None:
        batch = self._collecting
        while len(batch) < self.max_batch_size and self.clock.now < self._deadline:
            r = self.queue.get(timeout=0, accept=lambda r: engines.may_join(self.queue, batch, r))
            if r is None:
                return
            batch.append(r)
        if len(batch) >= self.max_batch_size:
            self._serve()

    def _window_closes(self, batch) -> None:
        if self._collecting is batch:
            self._serve()

    def _serve(self) -> None:
        batch, self._collecting = self._collecting, None
        now = self.clock.now
        self.busy, self._batch = True, batch
        B = len(batch)
        L = max(r.spec.prompt_tokens for r in batch)
        N = max(r.spec.max_tokens for r in batch)
        for r in batch:
            r.t_admit, r.batch_size = now, B
        self.queue.running = batch
        t1 = now + self.cost.prefill_s(B, L) + self.cost.first_token_overhead_s
        times = np.concatenate([[t1], t1 + np.cumsum(self.cost.steps_s(B, L, N - 1))]) if N > 1 else np.array([t1])
        for r in batch:
            r.stamps = [] if r.stopped else times[: r.spec.max_tokens].tolist()
        self._times = times
        self._end_at = math.inf
        self._reschedule_end()

    def _reschedule_end(self) -> None:
        live = [len(r.stamps) for r in self._batch if r.stamps]
        end = float(self._times[max(live) - 1]) if live else float(self._times[0])
        if end < self._end_at:
            self._end_at = end
            self._version += 1
            self.clock.at(end, self._batch_ends, self._version)

    def _batch_ends(self, version: int) -> None:
        if version != self._version:
            return
        batch, self._batch = self._batch, []
        self.busy_s += self.clock.now - batch[0].t_admit
        self.queue.running = []
        self.busy = False
        for r in batch:
            self._finish(r)
        self._wake()

    # ------------------------------------------------------------------ continuous

    def _prefix_hit(self, r) -> int:
        if not self.prefix_sharing or r.spec.prefix_key is None:
            return 0
        match = min(r.spec.prefix_tokens, self._cache.get(r.spec.prefix_key, 0), r.spec.prompt_tokens - 1)
        return max(0, match // self.page_size * self.page_size)

    def _step(self) -> None:
        while self._waiting and len(self._running) < self.max_batch_size:
            r = self._waiting.pop(0)
            r.t_admit = self.clock.now
            r.cached_tokens = self._prefix_hit(r)
            r.prefill_left = r.spec.prompt_tokens - r.cached_tokens
            self._running.append(r)
        if not self._running:
            self.busy = False
            return
        self.busy = True
        budget = self.max_batch_tokens
        decode = [r for r in self._running if r.prefill_left == 0 and not r.stopped]
        budget -= len(decode)
        chunks = []
        for r in self._running:
            if r.prefill_left > 0 and not r.stopped and budget > 0:
                c = min(r.prefill_left, budget)
                chunks.append((r, c))
                budget -= c
        ctx = sum(r.spec.prompt_tokens + len(r.stamps) for r in decode)
        n = len(self._running)
        for r in self._running:
            r.batch_size = max(r.batch_size, n)
        if self.bulk_decode and not chunks and len(decode) == n:
            # decode only: the steps until a row finishes or the next event (an arrival may join the step after
            # it) are known in advance: take them at once (the same step times, one event)
            k_max = min(r.spec.max_tokens - len(r.stamps) for r in decode)
            dts = self.cost.steps_s(n, 0, k_max) + self.cost.b2 * (ctx - n)  # step j: context ctx + (j - 1) n
            stamps = (self.clock.now + np.cumsum(dts)).tolist()
            lag = self.cost.serving_first_s
            for r in decode:
                r.stamps.extend([t + lag for t in stamps])
            self._segment = (decode, stamps, self.clock.now)
            self._version += 1
            self.clock.at(stamps[-1], self._step_ends, [], chunks, self._version)
            return
        self._segment = None
        ctok = sum(c for _, c in chunks)
        pairs = sum(c * (r.spec.prompt_tokens - r.prefill_left + c) for r, c in chunks)
        dt = self.cost.mixed_step_s(len(decode), ctx, ctok, pairs)
        self.busy_s += dt
        self._version += 1
        self.clock.at(self.clock.now + dt, self._step_ends, decode, chunks, self._version)

    def _cut_segment(self) -> None:
        """A request arrived during a run of decode steps taken at once: the run ends with the step in progress
        (the manager admits the newcomer at the next step), its later steps are taken back."""
        decode, stamps, start = self._segment
        j = bisect.bisect_left(stamps, self.clock.now)   # the step in progress ends at stamps[j]
        drop = len(stamps) - (j + 1)
        if drop > 0:
            for r in decode:
                del r.stamps[-drop:]
            self._segment = (decode, stamps[: j + 1], start)
            self._version += 1
            self.clock.at(stamps[j], self._step_ends, [], [], self._version)

    def _step_ends(self, decode, chunks, version) -> None:
        if version != self._version:
            return
        now = self.clock.now
        if self._segment is not None:
            self.busy_s += now - self._segment[2]
            self._segment = None
        # every token reaches the client the served request's own cost later (template, tokenisation, the HTTP /
        # SSE path: twin_cost.with_serving); the engine goes on meanwhile
        lag = self.cost.serving_first_s
        for r in decode:
            if not r.stopped:
                r.stamps.append(now + lag)
        for r, c in chunks:
            if r.stopped:
                continue
            r.prefill_left -= c
            if r.prefill_left == 0:
                r.stamps.append(now + lag)
                if self.prefix_sharing and r.spec.prefix_key is not None:
                    key = r.spec.prefix_key
                    self._cache[key] = max(self._cache.get(key, 0), r.spec.store_tokens or r.spec.prompt_tokens)
        left = []
        for r in self._running:
            if r.stopped or len(r.stamps) >= r.spec.max_tokens:
                self._finish(r)
            else:
                left.append(r)
        self._running = left
        self._step()

