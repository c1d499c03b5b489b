"""The serving twin (issue 34): the workbench's own engines' decisions on a virtual clock, a cost model in place
of the model.

**The decisions are the real ones.** Each replica's waiting queue is a
:class:`workbench.serving.scheduling.PolicyQueue` (``fcfs``, ``priority``, ``sjf`` with aging and its ``proxy`` /
``fitted`` predictor, ``lanes`` with the long cap) whose clock is the simulation's; the worker asks it for the next
request (``get``), a ``static`` window asks it for companions through
:func:`workbench.serving.engines.may_join`, admission is :func:`workbench.serving.engines.is_full` (``max_pending``:
a 429), the Retry-After is :meth:`~workbench.serving.scheduling.PolicyQueue.backlog_s` through
:func:`~workbench.serving.scheduling.retry_after_s`, and the queue's own observers (the ETA's
:class:`~workbench.serving.scheduling.ServiceRate`, ``sjf``'s :class:`~workbench.serving.scheduling.ServiceFit`) see
every completion. A policy changed in ``serving/scheduling.py`` changes the twin with it.

What the twin models in place of code it cannot run without a model:

- ``fifo`` / ``static`` serving (:class:`workbench.serving.engine_kinds.FifoEngine`): one left-padded ``generate`` of the
  batch: a prefill of ``B`` rows of the longest prompt, then one decode step per token up to the longest
  ``max_new_tokens`` (rows keep their place until the whole batch ends); each request finishes when the batch does.
- ``continuous``: ``transformers``' ``ContinuousBatchingManager``, whose scheduler is the library's: here FIFO
  admission up to ``max_batch_size`` running requests, steps of at most ``max_batch_tokens`` tokens (each decoding
  row one token, prompt chunks in admission order with the rest), a request's first token at the end of the step
  that finishes its prompt, leaving at its ``max_new_tokens``. **Prefix sharing**: a request whose leading
  ``prefix_tokens`` equal those cached under its ``prefix_key`` (a conversation's history, a shared document)
  reuses the full pages of them (``page_size``; at least one prompt token is computed); no eviction.
- clients (:func:`workbench.load.senders.engine_sender` and :func:`~workbench.load.senders.retrying_sender`):
  latencies from the scheduled time; a refused request is resent after ``min(Retry-After, max_retry_wait_s)`` up
  to ``max_retries`` times; ``patience_s`` with no token withdraws it (a waiting request frees its place at once,
  a running one gets no more tokens); closed loops (``synchronous``, ``concurrency``, ``throughput``) and
  multi-turn conversations send the next request when the previous one ends.
- replicas behind a router (:data:`ROUTERS`): ``round_robin``, ``least_outstanding`` (fewest pending requests,
  lowest index on ties), ``prefix_affinity`` (a request's ``prefix_key`` hashed to a replica; without a key, least
  outstanding).

The event loop is a heap of ``(time, sequence, callback)`` (the whole model is three kinds of event: an arrival, a
batch or step end, a patience deadline), small enough that a library (SimPy) would add more than it saves.

Every row and point the twin writes has ``source = "simulated"``; what it predicts rests on the cost model's
calibration (:mod:`workbench.predict.twin_cost`, ``cost_source`` on each point).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import zlib
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import load, saturation
from workbench.measure.generation import GenerationSettings
from workbench.predict.twin_cost import StepCost
from workbench.predict.twin_engine import EngineTwin
from workbench.serving import options, scheduling
from workbench.stats import metrics, slo

ROUTERS = ("round_robin", "least_outstanding", "prefix_affinity")
SOURCE = "simulated"
VALIDATION_FILE = "twin_validation.csv"


# ----------------------------------------------------------------------------- the virtual clock


class Clock:
    """A discrete-event loop on virtual seconds: :meth:`at` schedules ``fn(*args)`` at time ``t``; :meth:`run` runs
    the events in time order (ties in scheduling order) until none is left."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()

    def __call__(self) -> float:  # the PolicyQueue's clock
        return self.now

    def at(self, t: float, fn: Callable, *args) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def run(self) -> None:
        while self._heap:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)


# ----------------------------------------------------------------------------- requests


@dataclasses.dataclass
class TwinSpec:
    """One request to simulate.

    Attributes:
        offset_s: scheduled arrival (seconds after the first); closed loops and later turns ignore it.
        prompt_tokens, max_tokens: prompt length and output length (fixed, as the workbench's ``ignore_eos`` loads).
        priority, request_class, patience_s: as :class:`workbench.load.load.RequestSpec`.
        prefix_key, prefix_tokens: the leading ``prefix_tokens`` of the prompt equal those cached under
            ``prefix_key`` (prefix sharing); ``store_tokens``: what this request leaves cached under that key.
        after: index of the request whose end sends this one (a conversation's previous turn); None: on schedule.
        conversation, turn: multi-turn labels (None outside).
    """

    offset_s: float
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    request_class: str | None = None
    patience_s: float | None = None
    prefix_key: str | None = None
    prefix_tokens: int = 0
    store_tokens: int = 0
    after: int | None = None
    conversation: int | None = None
    turn: int | None = None


class _Produced:
    """``len()`` = tokens produced by now (the queue's ETA reads a running request's ``len(output_ids)``)."""

    __slots__ = ("req",)

    def __init__(self, req):
        self.req = req

    def __len__(self):
        return bisect.bisect_right(self.req.stamps, self.req.clock.now)


_SETTINGS: dict = {}


def _settings(max_tokens: int) -> GenerationSettings:
    s = _SETTINGS.get(max_tokens)
    if s is None:
        s = _SETTINGS[max_tokens] = GenerationSettings(max_new_tokens=max_tokens, ignore_eos=True)
    return s


class TwinRequest:
    """What an engine's queue and observers read of a request (the attributes of
    :class:`workbench.serving.engines.EngineRequest` they use), plus the twin's bookkeeping."""

    def __init__(self, index: int, spec: TwinSpec, clock: Clock):
        self.index, self.id, self.spec, self.clock = index, f"t{index}", spec, clock
        self.input_ids = range(spec.prompt_tokens)
        self.settings = _settings(spec.max_tokens)
        self.priority = spec.priority
        self.t_arrival = self.t_scheduled = self.t_first_sent = math.nan
        self.t_admit = None
        self.t_done = math.nan
        self.stamps: list = []
        self.output_ids = _Produced(self)
        self.queue_position = self.eta_s = None
        self.batch_size = 1
        self.cached_tokens = 0
        self.replica = -1
        self.retries, self.retry_wait_s = 0, 0.0
        self.abandoned = self.stopped = self.done = self.refused = False
        self.http_status = None
        self.retry_after_s = math.nan
        self.error = None
        self.prefill_left = 0

    def result(self) -> dict:
        """What the engine's observers receive (``output_tokens``, ``batch_size``)."""
        return {"output_tokens": len(self.stamps), "batch_size": self.batch_size}


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass
class TwinConfig:
    """The simulated deployment (the parameters of notebooks 08 and 11, plus the what-ifs).

    Attributes:
        engine: ``fifo``, ``static`` or ``continuous``.
        policy: :data:`workbench.serving.scheduling.POLICIES` (``continuous``: ``fcfs``, as the real engine).
        aging_s, lane_threshold_tokens, long_cap, predictor, fit_window: the policy's options
            (:class:`workbench.serving.options.PolicyOptions`).
        max_batch_size, batch_window_s: the batch limit and the ``static`` window (seconds).
        max_pending: admission limit per replica (None: unbounded); max_retries, max_retry_wait_s: the client's
            Retry-After resends.
        prefix_sharing, page_size, max_batch_tokens: the ``continuous`` engine's.
        replicas: engines behind the router (>= 1); router: :data:`ROUTERS`.
    """

    engine: str = "fifo"
    policy: str = "fcfs"
    aging_s: float = scheduling.AGING_S
    lane_threshold_tokens: int = scheduling.LANE_THRESHOLD_TOKENS
    long_cap: int = scheduling.LONG_CAP
    predictor: str = "proxy"
    fit_window: int = 64
    max_batch_size: int = 8
    batch_window_s: float = 0.05
    max_pending: int | None = None
    max_retries: int = 3
    max_retry_wait_s: float = 60.0
    prefix_sharing: bool = False
    page_size: int = 32
    max_batch_tokens: int = 512
    replicas: int = 1
    router: str = "round_robin"

    def __post_init__(self):
        checks.check_int("max_batch_size", self.max_batch_size, lo=1, hi=checks.MAX_BATCH_SIZE)
        checks.check_int("max_batch_tokens", self.max_batch_tokens, lo=1, hi=checks.MAX_REQUEST_TOKENS)
        checks.check_int("replicas", self.replicas, lo=1, hi=checks.MAX_BATCH_SIZE)
        checks.check_choice("router", self.router, ROUTERS)
        if self.max_pending is not None:
            checks.check_int("max_pending", self.max_pending, lo=1)
        checks.check_int("max_retries", self.max_retries, lo=0)
        checks.check_float("max_retry_wait_s", self.max_retry_wait_s, lo=0)
        checks.check_int("page_size", self.page_size, lo=1, hi=checks.MAX_REQUEST_TOKENS)
        self.queue(None)  # the engine, the policy and their options: one-line errors now (serving.options' rules)

    def engine_options(self) -> options.EngineOptions:
        """The real engine's options (:class:`workbench.serving.options.EngineOptions`): its checks and rules."""
        return options.EngineOptions(engine=self.engine, max_batch_size=self.max_batch_size,
                                     batch_window_s=self.batch_window_s, prefix_sharing=self.prefix_sharing,
                                     max_batch_tokens=self.max_batch_tokens)

    def policy_options(self) -> options.PolicyOptions:
        """The real queue's options (:class:`workbench.serving.options.PolicyOptions`)."""
        return options.PolicyOptions(policy=self.policy, aging_s=self.aging_s,
                                     lane_threshold_tokens=self.lane_threshold_tokens, long_cap=self.long_cap,
                                     predictor=self.predictor, fit_window=self.fit_window)

    def queue(self, clock) -> scheduling.PolicyQueue:
        """A fresh waiting queue under the policy (the real one, :meth:`PolicyOptions.make_queue`), on ``clock``."""
        q = self.policy_options().make_queue(self.engine_options())
        if clock is not None:
            q.clock = clock
        return q


# ----------------------------------------------------------------------------- workloads


def check_specs(specs: Sequence[TwinSpec]) -> list:
    """``specs`` when every offset is finite and >= 0 and sizes are >= 1 (one-line ParameterError)."""
    if not specs:
        raise ParameterError("requests: need at least one request")
    if len(specs) > checks.MAX_REQUESTS:
        raise ParameterError(f"requests: at most {checks.MAX_REQUESTS} requests are simulated (got {len(specs)})")
    top = checks.MAX_REQUEST_TOKENS   # bounded: a request's sizes set the twin's arrays (2e9 tokens: 15 GiB)
    for i, s in enumerate(specs):
        if not (s.offset_s == s.offset_s) or s.offset_s < 0 or math.isinf(s.offset_s):
            raise ParameterError(f"trace: request {i}: offset_s must be finite and >= 0 (got {s.offset_s})")
        checks.check_int(f"trace: request {i}: prompt_tokens", s.prompt_tokens, lo=1, hi=top)
        checks.check_int(f"trace: request {i}: output_tokens", s.max_tokens, lo=1, hi=top)
        checks.check_int(f"trace: request {i}: prefix_tokens", s.prefix_tokens, lo=0, hi=top)
        if s.patience_s is not None:
            checks.check_float(f"trace: request {i}: patience_s", s.patience_s, lo=0, lo_open=True)
    return list(specs)


def open_loop(profile: str, n: int, rate: float | None, prompt_tokens: int, max_tokens: int, burstiness: float = 1.0,
              seed: int = 0) -> list[TwinSpec]:
    """``n`` identical requests on the schedule of :func:`workbench.load.load.arrival_offsets` (``constant``,
    ``poisson``, ``gamma``; the same seed, the same schedule)."""
    checks.check_int("prompt_tokens", prompt_tokens, lo=1, hi=checks.MAX_REQUEST_TOKENS)
    checks.check_int("max_new_tokens", max_tokens, lo=1, hi=checks.MAX_REQUEST_TOKENS)
    checks.check_int("requests", n, lo=1, hi=checks.MAX_REQUESTS)
    offs = load.arrival_offsets(profile, n, rate, burstiness, seed, max_span_s=math.inf)  # virtual time: no day cap
    return [TwinSpec(float(o), prompt_tokens, max_tokens) for o in offs]


def trace_specs(rows: Sequence[dict]) -> list[TwinSpec]:
    """Specs from trace rows (:func:`workbench.load.load.read_trace` fields, plus the optional ``priority``,
    ``request_class``, ``patience_s``, ``prefix_key``, ``prefix_tokens``); offsets shifted to start at 0."""
    if not rows:
        raise ParameterError("trace: has no requests")
    for i, r in enumerate(rows):
        off = r.get("offset_s")
        if not isinstance(off, (int, float)) or isinstance(off, bool) or not (off == off) or off < 0:
            raise ParameterError(f"trace: request {i}: offset_s must be a number >= 0 (got {off!r})")
    t0 = min(float(r["offset_s"]) for r in rows)
    return check_specs([TwinSpec(float(r["offset_s"]) - t0, int(r["prompt_tokens"]), int(r["output_tokens"]),
                                 int(r.get("priority", 0) or 0), r.get("request_class"), r.get("patience_s"),
                                 r.get("prefix_key"), int(r.get("prefix_tokens", 0) or 0)) for r in rows])


def multiturn(conversations: int, turns: int, user_tokens: int, reply_tokens: int, shared_prefix_tokens: int = 0,
              template_tokens: int = 16) -> list[TwinSpec]:
    """Multi-turn conversations as notebook 11 runs them: all start at 0; turn ``k`` is sent when turn ``k - 1``
    ends and carries the whole history (the shared document, each earlier user message and reply); its leading
    tokens are the previous turn's prompt (prefix key ``conv<c>``)."""
    checks.check_int("conversations", conversations, lo=1)
    checks.check_int("turns", turns, lo=1)
    specs = []
    for c in range(conversations):
        prev, prompt = None, shared_prefix_tokens
        for t in range(1, turns + 1):
            shared = prompt
            prompt = prompt + user_tokens + template_tokens + (reply_tokens if t > 1 else 0)
            specs.append(TwinSpec(0.0, prompt, reply_tokens, prefix_key=f"conv{c}", prefix_tokens=shared,
                                  store_tokens=prompt, after=prev, conversation=c, turn=t))
            prev = len(specs) - 1
    return specs


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass
class TwinResult:
    """One simulated point: ``rows`` (one per request, the columns of a measured load row plus ``replica`` and
    ``source``), ``summary`` (the point's columns) and ``simulated_s`` (virtual seconds simulated, first arrival
    to last event)."""

    rows: pd.DataFrame
    summary: dict
    simulated_s: float


def simulate(cost: StepCost, specs: Sequence[TwinSpec], cfg: TwinConfig | None = None, profile: str = "replay",
             concurrency: int | None = None, slos: Sequence | None = None, rate: float | None = None) -> TwinResult:
    """Simulate ``specs`` on ``cfg``'s replicas with ``cost`` (module docstring).

    Args:
        cost: the per-step :class:`~workbench.predict.twin_cost.StepCost`.
        specs: the requests (:func:`open_loop`, :func:`trace_specs`, :func:`multiturn`, :func:`shared_prefix`).
        cfg: the deployment (default :class:`TwinConfig`).
        profile: ``replay`` / ``constant`` / ``poisson`` / ``gamma`` (open loop: each spec at its ``offset_s``, or
            after the request it follows), or ``synchronous``, ``concurrency``, ``throughput`` (closed loop).
        concurrency: the ``concurrency`` profile's workers.
        slos: :class:`workbench.stats.slo.SLO` s evaluated per point (default: every preset).
        rate: the offered rate recorded as ``offered_rps`` / ``rate_rps`` (open loop).

    Returns:
        :class:`TwinResult`; its summary has the columns of a measured serving point (:func:`summarize`).

    Raises:
        ParameterError: a bad profile, concurrency or request (one line, before anything runs).
    """
    cfg = cfg or TwinConfig()
    specs = check_specs(specs)
    checks.check_choice("profile", profile, load.PROFILES)
    if profile == "sweep":
        raise ParameterError("profile: sweep is a plan of several points (workbench simulate --rates)")
    if profile == "concurrency":
        checks.check_int("concurrency", concurrency, lo=1)
    clock = Clock()
    reqs = [TwinRequest(i, s, clock) for i, s in enumerate(specs)]
    followers: dict = {}
    for r in reqs:
        if r.spec.after is not None:
            followers.setdefault(r.spec.after, []).append(r)
    closed = profile in load.CLOSED_LOOP
    workers = {"synchronous": 1, "concurrency": concurrency, "throughput": len(reqs)}.get(profile)
    nxt = itertools.count(workers or 0)

    def done(req: TwinRequest) -> None:
        if closed:
            i = next(nxt)
            if i < len(reqs):
                send(reqs[i], clock.now)
        for f in followers.get(req.index, []):
            send(f, clock.now)

    replicas = [EngineTwin(clock, cfg.engine, cost, cfg.queue(clock), cfg.max_batch_size, cfg.batch_window_s,
                           cfg.max_pending, cfg.prefix_sharing, cfg.page_size, cfg.max_batch_tokens, done)
                for _ in range(cfg.replicas)]
    rr = itertools.count()

    def route(req: TwinRequest) -> EngineTwin:
        if cfg.replicas == 1:
            return replicas[0]
        if cfg.router == "round_robin":
            return replicas[next(rr) % cfg.replicas]
        if cfg.router == "prefix_affinity" and req.spec.prefix_key is not None:
            return replicas[zlib.crc32(req.spec.prefix_key.encode()) % cfg.replicas]
        return min(replicas, key=lambda e: e.pending)

    def attempt(req: TwinRequest) -> None:
        if req.abandoned:
            return
        eng = route(req) if req.replica < 0 or cfg.router != "prefix_affinity" else replicas[req.replica]
        req.replica = replicas.index(eng)
        if eng.submit(req):
            return
        # refused: a 429 whose Retry-After is the queue's backlog estimate (senders.engine_sender's)
        after = float(scheduling.retry_after_s(eng.queue.backlog_s()))
        req.http_status, req.retry_after_s = 429, after
        if req.retries >= cfg.max_retries:
            req.refused, req.error = True, f"EngineFull: {eng.name} engine: {eng.pending} requests pending " \
                                           f"(limit {cfg.max_pending})"
            req.done, req.t_done = True, clock.now
            done(req)
            return
        pause = min(after, cfg.max_retry_wait_s)
        req.retries += 1
        req.retry_wait_s += pause
        clock.at(clock.now + pause, attempt, req)

    def patience(req: TwinRequest) -> None:
        if req.done or (req.stamps and req.stamps[0] <= clock.now):
            return
        req.abandoned = True
        if req.t_arrival == req.t_arrival and req.replica >= 0 and req.id in replicas[req.replica].in_flight:
            replicas[req.replica].withdraw(req)
        elif not req.done:  # between retries: the client stops trying
            req.done, req.t_done = True, clock.now
            done(req)

    def send(req: TwinRequest, t: float) -> None:
        req.t_scheduled = req.t_first_sent = t
        if req.spec.patience_s is not None:
            clock.at(t + req.spec.patience_s, patience, req)
        clock.at(t, attempt, req)

    if closed:
        for r in reqs[:workers]:
            send(r, 0.0)
    else:
        for r in reqs:
            if r.spec.after is None:
                send(r, r.spec.offset_s)
    clock.run()
    rows = _rows(reqs)
    summary = summarize(rows, profile, slos, rate=rate)
    summary.update(busy_share=float(np.mean([e.busy_s for e in replicas]) / clock.now) if clock.now > 0 else math.nan,
                   rejected=int(sum(e.rejected for e in replicas)), replicas=cfg.replicas, n_devices=cfg.replicas,
                   router=cfg.router,
                   engine=cfg.engine, policy=cfg.policy, cost_source=cost.source, source=SOURCE)
    return TwinResult(rows, summary, clock.now)


def _rows(reqs: list) -> pd.DataFrame:
    out = []
    for r in reqs:
        s = r.stamps
        n = len(s)
        t0 = r.t_scheduled
        ttft = s[0] - t0 if n else math.nan
        e2e = (s[-1] if n else r.t_done) - t0
        tpot = (s[-1] - s[0]) / (n - 1) if n > 1 else math.nan
        served = n > 0 and r.error is None
        out.append({"request_id": r.index, "replica": r.replica, "t_scheduled_s": t0, "t_start_s": r.t_first_sent,
                    "t_end_s": r.t_done, "ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot,
                    "decode_tps": metrics.decode_tps_of(tpot),
                    "queue_s": (r.t_admit - r.t_arrival) if r.t_admit is not None else math.nan,
                    "output_tokens": n if served else 0, "prompt_tokens": r.spec.prompt_tokens,
                    "max_new_tokens": r.spec.max_tokens, "max_tokens": r.spec.max_tokens,
                    "cached_tokens": r.cached_tokens, "batch_size": r.batch_size, "abandoned": r.abandoned,
                    "retries": r.retries, "retry_wait_s": r.retry_wait_s, "http_status": r.http_status,
                    "error": r.error if r.error else ("abandoned" if r.abandoned and not n else None),
                    "finish_reason": "abandoned" if r.abandoned else ("length" if n else None),
                    "request_class": r.spec.request_class, "priority": r.spec.priority,
                    "conversation": r.spec.conversation, "turn": r.spec.turn,
                    "queue_position": r.queue_position,
                    "eta_s": math.nan if r.eta_s is None else r.eta_s, "source": SOURCE})
    df = pd.DataFrame(out)
    df["eta_error_s"] = df["eta_s"] - df["queue_s"]
    return df


def summarize(rows: pd.DataFrame, profile: str, slos: Sequence | None = None, rate: float | None = None) -> dict:
    """A simulated point's columns, with the workbench's own definitions: the window and throughputs
    (:func:`workbench.load.load.apply_window`, :func:`~workbench.load.load.window_figures`,
    :func:`~workbench.load.load.flow_rates`), TTFT / TPOT / e2e / queue percentiles
    (:func:`workbench.stats.metrics.percentiles`), the counts ``requests``, ``abandoned``, ``retried``, ``refused``
    (a 429 at least once) and ``not_served`` (no token), per SLO ``slo_attainment_<name>`` and ``goodput_rps_<name>``
    (:func:`workbench.stats.slo.evaluate`), ``kept_up`` (:func:`workbench.load.saturation.kept_up`)."""
    from workbench.load.saturation import kept_up

    recs = rows.to_dict("records")
    summ = {"profile": profile}
    summ.update(load.apply_window(recs, 0.0, 0.0, open_loop=profile not in load.CLOSED_LOOP))
    summ.update(load.flow_rates(recs))
    df = pd.DataFrame(recs)
    summ.update(load.window_figures(df, summ))
    done = df[df["output_tokens"] >= 1]
    for col in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        for k, v in metrics.percentiles(done[col].tolist(), (50, 90, 99)).items():
            summ[f"{col}_{k}"] = v
    summ.update(offered_rps=rate if rate is not None else summ.get("request_throughput_rps"), rate_rps=rate,
                requests=int(len(df)), abandoned=int(df["abandoned"].sum()), retried=int((df["retries"] > 0).sum()),
                refused=int((df["http_status"] == 429).sum()), not_served=int((df["output_tokens"] < 1).sum()),
                cache_hit_rate=float(df["cached_tokens"].sum() / df["prompt_tokens"].sum()))
    for s in (list(slos) if slos is not None else list(slo.PRESETS.values())):
        ev = slo.evaluate(df, s, summ["window_s"], summ["requests_planned_window"])
        summ.update({f"slo_attainment_{s.name}": ev["slo_attainment"], f"goodput_rps_{s.name}": ev["goodput_rps"],
                     f"percentiles_ok_{s.name}": ev["percentiles_ok"]})
    summ["stopped_early"] = False
    summ["kept_up"] = kept_up(summ)
    return summ


# ----------------------------------------------------------------------------- sweeps and the capacity search


def capacity(cost: StepCost, cfg: TwinConfig, objective: "slo.SLO", prompt_tokens: int, max_tokens: int,
             n: int = 200, arrival: str = "poisson", target: float = 0.9, seed: int = 0,
             tolerance: float = 0.02, max_steps: int = 14) -> dict:
    """The highest offered rate whose simulated attainment of ``objective`` reaches ``target`` and that keeps up
    (:func:`workbench.stats.slo.search_rate`'s bisection, each step one simulation of ``n`` requests): seconds, not the
    minutes per step of a measured search. The bracket starts at ``[0.05, 2] x`` the simulated ``throughput``
    (every request at once) rate. A rate above that throughput fails: past the engine's most completions a second
    the backlog grows by the difference every second, however good the first ``n`` requests' attainment looks (at
    200 requests the in-flight test can still say "undetermined" there: the search recommended 5.25 req/s on an
    engine that completes 3.95).

    Returns:
        :func:`workbench.stats.slo.search_rate`'s dict plus ``slo`` and ``throughput_rps``.
    """
    checks.check_int("n", n, lo=2)
    burst = simulate(cost, open_loop("constant", n, 1.0, prompt_tokens, max_tokens), cfg, "throughput",
                     slos=[objective])
    top = burst.summary["request_throughput_rps"]
    if not (top == top and top > 0):
        top = n / max(burst.simulated_s, 1e-9)

    def attainment_at(rate: float) -> float:
        if rate > top:
            return 0.0
        res = simulate(cost, open_loop(arrival, n, rate, prompt_tokens, max_tokens, seed=seed), cfg, arrival,
                       slos=[objective], rate=rate)
        a = res.summary[f"slo_attainment_{objective.name}"]
        return a if res.summary["kept_up"] != saturation.FELL_BEHIND else 0.0

    out = slo.search_rate(attainment_at, 0.05 * top, 2.0 * top, target, tolerance, max_steps)
    out.update(slo=objective.name, throughput_rps=top)
    return out

