"""Scheduling policies for the built-in engines, and the service-rate estimate behind queue ETAs (issue 24;
docs/design.md section 7 item 11).

The waiting queue of a ``fifo`` or ``static`` engine (:class:`workbench.serving.engines.BaseEngine`) is a
:class:`PolicyQueue`: the engine's worker asks it for the next request (:meth:`PolicyQueue.get`), and the
``static`` engine's batching window asks it for the best waiting request that may join the batch
(``accept``). The policy decides the order (:data:`POLICIES`):

- ``fcfs``: arrival order (the engines' historical behaviour).
- ``priority``: the request's integer ``priority``, lower first (vLLM's convention); ties by arrival.
- ``sjf``: shortest predicted job first. The prediction (``predictor``) is either the plain proxy
  (``proxy``, :func:`predicted_tokens`): the request's ``max_new_tokens`` plus ``prefill_weight`` times its
  prompt tokens (a prompt token costs a fraction of a decode step; the default 1/32 is a stated assumption, not a
  fit), or a fit on the engine's own history (``fitted``, :class:`ServiceFit`): a least-squares line of the
  service time of the last finished requests on their prompt tokens and ``max_new_tokens``, used once
  ``min_history`` requests over at least two prompt lengths and two output caps have finished (the proxy until
  then). The fit learns what the proxy assumes (the cost of a prompt token relative to a decode step, here and
  now) and a fixed cost per request. **Aging**: a request that has waited
  ``aging_s`` or longer is *overdue*; overdue requests go first, in arrival order. The bound: a request
  waits at most ``aging_s`` plus the service of the batch running when it became overdue plus the service of
  the requests that arrived before it and are still waiting then. Requests arriving after it can never pass
  it once it is overdue, so a stream of short jobs cannot starve a long one beyond that bound.
- ``lanes``: two lanes by predicted output tokens (``max_new_tokens`` < ``lane_threshold_tokens``: short,
  else long), each in arrival order. A batch draws from one lane only (a short batch is never held by a long
  row), and a long batch holds at most ``long_cap`` requests: the fifo/static engines run one batch at a
  time, so this is the cap on concurrent long requests; the others wait. The short lane goes first unless
  the long lane's head is overdue (waited ``aging_s``), the same aging bound as ``sjf``.

The ``continuous`` engine's admission is ``transformers``' ``ContinuousBatchingManager`` (its own FIFO
scheduler over its own waiting queue): only ``fcfs`` is offered there (:func:`workbench.serving.options.check_compatible`).

**ETA** (:class:`ServiceRate`): an observer of the engine's completions keeps, over the last ``window``
finished requests, seconds per generated token of service (admission to last token, summed over requests,
divided by their tokens) and the mean batch size. A waiting request's ETA is the remaining work of the
running batch (its largest remaining token count times seconds per token) plus the predicted tokens of the
requests ahead of it times seconds per token divided by the mean batch size. With no history yet the ETA is
NaN (unknown, sent as null). :meth:`PolicyQueue.backlog_s` is the same estimate for the whole queue: the
server's ``Retry-After`` on a 429.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from typing import Callable

from workbench import checks

POLICIES = ("fcfs", "priority", "sjf", "lanes")
PREDICTORS = ("proxy", "fitted")           # sjf: the plain proxy, or a fit on the engine's own history
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000   # the range a request's priority may take
AGING_S = 30.0                              # sjf / lanes: a request waiting this long is served in arrival order
LANE_THRESHOLD_TOKENS = 64                  # lanes: max_new_tokens at or above this is a long request
LONG_CAP = 1                                # lanes: long requests running at once
PREFILL_WEIGHT = 1 / 32                     # sjf: a prompt token's cost in decode steps (assumption)


def check_policy(policy: str) -> str:
    """``policy`` when it is one of :data:`POLICIES` (one-line ParameterError); which engine can apply it is
    :func:`workbench.serving.options.check_compatible`'s rule."""
    return checks.check_choice("policy", policy, POLICIES)


def check_priority(priority) -> int:
    """An integer priority in [:data:`PRIORITY_MIN`, :data:`PRIORITY_MAX`] (one-line ParameterError)."""
    return checks.check_int("priority", priority, lo=PRIORITY_MIN, hi=PRIORITY_MAX)


def predicted_tokens(req, prefill_weight: float = PREFILL_WEIGHT) -> float:
    """The ``sjf`` prediction of a request's cost in decode steps: ``max_new_tokens + prefill_weight *
    prompt_tokens`` (a list of requests, a group: the sum)."""
    if isinstance(req, list):
        return sum(predicted_tokens(r, prefill_weight) for r in req)
    return req.settings.max_new_tokens + prefill_weight * len(req.input_ids)


class ServiceFit:
    """Least squares of a request's service time on its size, over the engine's own recent history (an observer:
    ``engine.observers.append(fit)``): ``service_s = c0 + c1 * prompt_tokens + c2 * max_new_tokens``.

    The service time is admission to the last token (``stamps[-1] - t_admit``); requests without a token are not
    used. The fit (``numpy.linalg.lstsq``) is made only when it is determined: at least ``min_history`` of the last
    ``window`` finished requests, and their design matrix of full rank (two prompt lengths and two output caps at
    least, not all in proportion); otherwise :meth:`coefficients` is None and ``sjf`` keeps the proxy.

    Raises:
        ParameterError: ``window`` < 1 or ``min_history`` < 4 (three parameters need a residual).
    """

    def __init__(self, window: int = 64, min_history: int = 8):
        self.window = checks.check_int("window", window, lo=1)
        self.min_history = checks.check_int("min_history", min_history, lo=4)
        self._rows: deque = deque(maxlen=window)
        self._lock = threading.Lock()

    def __call__(self, req, result: dict) -> None:
        if int(result.get("output_tokens") or 0) < 1 or req.t_admit is None or not req.stamps:
            return
        with self._lock:
            self._rows.append((len(req.input_ids), req.settings.max_new_tokens, req.stamps[-1] - req.t_admit))

    def coefficients(self):
        """``numpy`` array ``[c0, c1, c2]`` (seconds, seconds per prompt token, seconds per output token of the cap),
        or None while the fit is not determined (see the class docstring)."""
        import numpy as np

        with self._lock:
            rows = list(self._rows)
        if len(rows) < self.min_history:
            return None
        data = np.asarray(rows, dtype=float)
        design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
        coef, _, rank, _ = np.linalg.lstsq(design, data[:, 2], rcond=None)
        return coef if rank == 3 else None

    @staticmethod
    def predict_s(req, coef) -> float:
        """The fitted service time of a request (a group: the sum) under coefficients ``coef``."""
        if isinstance(req, list):
            return sum(ServiceFit.predict_s(r, coef) for r in req)
        return float(coef[0] + coef[1] * len(req.input_ids) + coef[2] * req.settings.max_new_tokens)


def _first(item):
    return item[0] if isinstance(item, list) else item


class ServiceRate:
    """The engine's own service-rate estimate (an observer: ``engine.observers.append(rate)``).

    Attributes:
        s_per_token: seconds of service per generated token over the last ``window`` finished requests
            (sum of admission-to-last-token times over sum of tokens); NaN before any.
        batch_mean: their mean batch size (1 before any).
    """

    def __init__(self, window: int = 64):
        self.window = checks.check_int("window", window, lo=1)
        self._rows: deque = deque(maxlen=window)
        self._lock = threading.Lock()

    def __call__(self, req, result: dict) -> None:
        n = int(result.get("output_tokens") or 0)
        if n < 1 or req.t_admit is None or not req.stamps:
            return
        with self._lock:
            self._rows.append((req.stamps[-1] - req.t_admit, n, max(1, int(result.get("batch_size") or 1))))

    @property
    def s_per_token(self) -> float:
        with self._lock:
            rows = list(self._rows)
        toks = sum(n for _, n, _ in rows)
        return sum(s for s, _, _ in rows) / toks if toks else float("nan")

    @property
    def batch_mean(self) -> float:
        with self._lock:
            rows = list(self._rows)
        return sum(b for _, _, b in rows) / len(rows) if rows else 1.0

    def eta_s(self, ahead_tokens: float, running_left_tokens: float) -> float:
        """Seconds until a request is admitted: ``running_left_tokens * s_per_token + ahead_tokens * s_per_token /
        batch_mean`` (NaN without history)."""
        spt = self.s_per_token
        return running_left_tokens * spt + ahead_tokens * spt / self.batch_mean if spt == spt else float("nan")


class PolicyQueue:
    """An engine's waiting queue under a policy (module docstring); thread-safe.

    Items are :class:`~workbench.serving.engines.EngineRequest` s, lists of them (a group that shares one batch:
    ordered by its first request, ``sjf`` by its summed cost) or ``None`` (stop: returned once nothing waits).

    Args:
        policy: one of :data:`POLICIES`.
        aging_s: ``sjf`` / ``lanes``: the wait after which a request goes in arrival order (> 0).
        lane_threshold_tokens: ``lanes``: ``max_new_tokens`` at or above this is long (> 0).
        long_cap: ``lanes``: long requests per batch (>= 1).
        predictor: ``sjf``'s prediction: ``proxy`` (:func:`predicted_tokens`) or ``fitted`` (:class:`ServiceFit`
            on the engine's own history, the proxy until the fit is determined).
        fit_window: the finished requests :class:`ServiceFit` fits on (the newest; >= 1).
        clock: the time source (``time.perf_counter``; tests pass a fake).

    Attributes:
        rate: the :class:`ServiceRate` the ETAs use (the engine subscribes it to its completions).
        fit: the :class:`ServiceFit` of ``predictor="fitted"`` (the engine subscribes it too).
        running: the requests being served now (the engine sets it; their remaining tokens enter ETAs).

    Raises:
        ParameterError: a bad policy or parameter (one line).
    """

    def __init__(self, policy: str = "fcfs", aging_s: float = AGING_S,
                 lane_threshold_tokens: int = LANE_THRESHOLD_TOKENS, long_cap: int = LONG_CAP,
                 predictor: str = "proxy", fit_window: int = 64, clock: Callable[[], float] = time.perf_counter):
        self.policy = check_policy(policy)
        self.aging_s = checks.check_float("aging_s", aging_s, lo=0, lo_open=True)
        self.lane_threshold_tokens = checks.check_int("lane_threshold_tokens", lane_threshold_tokens, lo=1)
        self.long_cap = checks.check_int("long_cap", long_cap, lo=1)
        self.predictor = checks.check_choice("predictor", predictor, PREDICTORS)
        self.clock = clock
        self.rate = ServiceRate()
        self.fit = ServiceFit(window=fit_window)
        self.running: list = []
        self._items: list = []          # (seq, item), arrival order
        self._seq = itertools.count()
        self._stop = False
        self._cv = threading.Condition()

    # ------------------------------------------------------------------ the policy

    def is_long(self, req) -> bool:
        """``lanes``: a request whose ``max_new_tokens`` reaches the lane threshold (a group: any member)."""
        if isinstance(req, list):
            return any(self.is_long(r) for r in req)
        return req.settings.max_new_tokens >= self.lane_threshold_tokens

    def _overdue(self, item, now: float) -> bool:
        return now - _first(item).t_arrival >= self.aging_s

    def _key(self, seq: int, item, now: float, coef=None) -> tuple:
        r = _first(item)
        if self.policy == "priority":
            return (getattr(r, "priority", 0), r.t_arrival, seq)
        if self.policy == "sjf":
            if self._overdue(item, now):
                return (0, r.t_arrival, seq)
            size = predicted_tokens(item) if coef is None else ServiceFit.predict_s(item, coef)
            return (1, size, r.t_arrival, seq)
        if self.policy == "lanes":  # overdue first (arrival order), then the short lane, then the long lane
            if self._overdue(item, now):
                return (0, r.t_arrival, seq)
            return (2 if self.is_long(item) else 1, r.t_arrival, seq)
        return (r.t_arrival, seq)

    def joins(self, batch: list, req) -> bool:
        """Whether ``req`` may join ``batch`` under the policy (``lanes``: same lane, long batches up to
        ``long_cap``); other policies: always."""
        if self.policy != "lanes" or not batch:
            return True
        long = self.is_long(req)
        if long != self.is_long(batch[0]):
            return False
        return not long or sum(self.is_long(r) for r in batch) < self.long_cap

    def _order(self, now: float, accept=None) -> list:
        pool = [(s, it) for s, it in self._items if accept is None or (not isinstance(it, list) and accept(it))]
        # one fit for the whole ordering (a completion may refit meanwhile): every item sized the same way
        coef = self.fit.coefficients() if self.policy == "sjf" and self.predictor == "fitted" else None
        return [it for s, it in sorted(pool, key=lambda p: self._key(p[0], p[1], now, coef))]

    # ------------------------------------------------------------------ queue interface

    def put(self, item) -> None:
        """Queue a request, a group, or ``None`` (stop once nothing waits). A single request's
        ``queue_position`` and ``eta_s`` are set to what :meth:`status` tells at that moment."""
        with self._cv:
            if item is None:
                self._stop = True
            else:
                self._items.append((next(self._seq), item))
                if not isinstance(item, list):
                    told = self.status(item)
                    if told is not None:
                        item.queue_position, item.eta_s = told["queue_position"], told["eta_s"]
            self._cv.notify_all()

    def get(self, timeout: float | None = None, accept: Callable | None = None):
        """The next item under the policy, blocking until one waits.

        Args:
            timeout: seconds to wait at most (None: until an item or stop).
            accept: only a single request for which ``accept(req)`` is true (a batch's companions); then
                groups and the stop mark are never returned.

        Returns:
            The item; ``None`` on stop (nothing waiting, ``accept`` not given) or on timeout.
        """
        end = None if timeout is None else time.perf_counter() + timeout
        with self._cv:
            while True:
                order = self._order(self.clock(), accept)
                if order:
                    pick = order[0]
                    self._items = [(s, it) for s, it in self._items if it is not pick]
                    return pick
                if accept is None and self._stop:
                    return None
                left = None if end is None else end - time.perf_counter()
                if left is not None and left <= 0:
                    return None
                self._cv.wait(timeout=0.05 if left is None else min(0.05, left))

    def waiting(self) -> list:
        """The single requests waiting now (groups excluded: their members share one batch), in arrival order."""
        with self._cv:
            return [it for _, it in self._items if it is not None and not isinstance(it, list)]

    def remove(self, req) -> bool:
        """Take a waiting request out of the queue, a single one or a member of a waiting group (the group keeps
        its other members; an emptied group leaves); False when it is not waiting (running, or gone)."""
        with self._cv:
            kept, found = [], False
            for s, it in self._items:
                if it is req:
                    found = True
                elif isinstance(it, list) and any(x is req for x in it):
                    found = True
                    rest = [x for x in it if x is not req]
                    if rest:
                        kept.append((s, rest))
                else:
                    kept.append((s, it))
            self._items = kept
            return found

    def qsize(self) -> int:
        """Requests waiting (a group counts its members)."""
        with self._cv:
            return sum(len(it) if isinstance(it, list) else 1 for _, it in self._items)

    def empty(self) -> bool:
        return self.qsize() == 0

    # ------------------------------------------------------------------ what a waiting client is told

    def _running_left(self) -> float:
        return max((r.settings.max_new_tokens - len(r.output_ids) for r in list(self.running)), default=0)

    def status(self, req) -> dict | None:
        """``{"queue_position", "eta_s"}`` of a waiting request: requests the policy serves before it now
        (0: next) and the ETA (module docstring; NaN without history); None once it is no longer waiting."""
        with self._cv:
            order = self._order(self.clock())
        for i, it in enumerate(order):
            if it is req or (isinstance(it, list) and req in it):
                ahead = sum(predicted_tokens(x, 0.0) for x in order[:i])
                return {"queue_position": i, "eta_s": self.rate.eta_s(ahead, self._running_left())}
        return None

    def backlog_s(self) -> float:
        """The estimated seconds until everything waiting now is admitted (NaN without history)."""
        with self._cv:
            ahead = sum(predicted_tokens(it, 0.0) for _, it in self._items)
        return self.rate.eta_s(ahead, self._running_left())


def retry_after_s(backlog_s: float, floor_s: int = 1) -> int:
    """The ``Retry-After`` seconds for a full queue: the backlog estimate rounded up, at least ``floor_s``
    (``floor_s`` when the estimate is unknown)."""
    if not (backlog_s == backlog_s) or backlog_s <= 0:
        return floor_s
    return max(floor_s, int(math.ceil(backlog_s)))
