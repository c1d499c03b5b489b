"""A/A designs for queue experiments on a virtual clock: how often identical arms "differ" (issue 32).

A fake one-at-a-time engine (the ``fifo`` engine's shape: one request served at a time) whose waiting queue is the
real :class:`workbench.serving.scheduling.PolicyQueue`, driven on a virtual clock (its ``clock`` argument): the
policy code decides the order exactly as in a live engine, while service times are drawn instead of measured.
Service times are measured-like: a request's service is its prefill (``prefill_s_per_token`` x prompt tokens) plus
its decode steps (``tpot_s`` x output tokens), scaled by a per-request jitter (lognormal, ``jitter``: the spread of
one request's e2e on a loaded CPU) and by a per-run speed factor (lognormal, ``drift``: the machine's speed moving
between runs, as back-to-back drift references show it).

Two designs judge the same question, "does arm B change the interactive class's TTFT p90 against arm A?", with
identical arms (an A/A test: every claimed direction is a false one):

- ``old``: one trace, each arm run once, requests paired across the two runs and a t interval over the request
  pairs' log TTFT ratios (the request-pair method notebook 11 used before the rounds): a queue carries one
  request's delay into every later one, and the run's speed factor moves them all, so the pairs are not
  independent.
- ``new``: ``rounds`` arrival seeds, each arm run once per seed (a fresh engine each; the arm order alternating
  between seeds), one statistic per run (the interactive TTFT p90), runs paired by seed:
  :func:`workbench.stats.replicates.paired_log_ratio`.

:func:`aa_share` runs many such trials and returns the share that claimed a direction for each design
(``benchmarks/aa_queue.py`` prints it; ``tests/stats/test_replicates.py`` asserts new <= 10%, old far above).
"""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np

from workbench import checks
from workbench.serving import options
from workbench.stats import evidence, metrics, replicates


@dataclasses.dataclass(frozen=True)
class Workload:
    """A mixed trace and its measured-like service times.

    Attributes:
        requests: requests per run (>= 2).
        short_share: share of interactive requests (0-1).
        short_tokens, long_tokens: output tokens of the interactive and background class.
        short_prompt, long_prompt: their prompt tokens.
        load_factor: offered rate over the one-at-a-time capacity on the mix (> 0).
        tpot_s: seconds per decode step; prefill_s_per_token: seconds per prompt token.
        jitter: per-request lognormal sd of the service time; drift: per-run lognormal sd of the speed.
        exact_mix: exactly ``round(short_share * requests)`` interactive requests per trace (at least one of each
            class), in a random order, as notebook 11's rounds draw them (:func:`workbench.load.traces.mixed_trace`).
    """

    requests: int = 24
    short_share: float = 0.6
    short_tokens: int = 6
    long_tokens: int = 32
    short_prompt: int = 32
    long_prompt: int = 96
    load_factor: float = 0.9
    tpot_s: float = 0.06
    prefill_s_per_token: float = 0.0025
    jitter: float = 0.15
    drift: float = 0.05
    exact_mix: bool = False

    def __post_init__(self):
        checks.check_int("requests", self.requests, lo=2)
        checks.check_float("short_share", self.short_share, lo=0, hi=1)
        checks.check_float("load_factor", self.load_factor, lo=0, lo_open=True)
        checks.check_float("jitter", self.jitter, lo=0)
        checks.check_float("drift", self.drift, lo=0)

    def service_s(self, prompt: int, tokens: int) -> float:
        """The mean service time alone (seconds) of a request."""
        return self.prefill_s_per_token * prompt + self.tpot_s * tokens

    def trace(self, seed: int) -> list[dict]:
        """One arrival trace: ``offset_s``, ``request_class``, ``prompt_tokens``, ``output_tokens``, ``priority``
        per request, Poisson arrivals at ``load_factor`` x the one-at-a-time capacity."""
        rng = np.random.default_rng(seed)
        mean = (self.short_share * self.service_s(self.short_prompt, self.short_tokens)
                + (1 - self.short_share) * self.service_s(self.long_prompt, self.long_tokens))
        gaps = rng.exponential(mean / self.load_factor, self.requests)
        gaps[0] = 0.0
        short = rng.random(self.requests) < self.short_share
        if self.exact_mix:
            k = min(max(int(round(self.short_share * self.requests)), 1), self.requests - 1)
            short = np.array([True] * k + [False] * (self.requests - k))
            rng.shuffle(short)
        return [{"offset_s": float(t), "request_class": "interactive" if s else "background",
                 "prompt_tokens": self.short_prompt if s else self.long_prompt,
                 "output_tokens": self.short_tokens if s else self.long_tokens, "priority": 0 if s else 1}
                for t, s in zip(np.cumsum(gaps), short)]


def run(trace: list[dict], policy: str, workload: Workload, seed: int, **policy_options) -> list[dict]:
    """One run of ``trace`` on a one-at-a-time engine whose queue is the real :class:`PolicyQueue` under
    ``policy``, on a virtual clock.

    Args:
        trace: :meth:`Workload.trace`.
        policy: one of :data:`workbench.serving.scheduling.POLICIES`.
        workload: the service-time model.
        seed: the run's noise (its speed factor and per-request jitter).
        policy_options: other :class:`workbench.serving.options.PolicyOptions` fields (``lane_threshold_tokens`` ...).

    Returns:
        One row per request: ``request_id``, ``request_class``, ``ttft_s``, ``queue_s``, ``e2e_s`` (seconds).
    """
    rng = np.random.default_rng(seed)
    speed = math.exp(rng.normal(0.0, workload.drift))
    now = [0.0]
    q = options.PolicyOptions(policy=policy, **policy_options).make_queue("fifo")
    q.clock = lambda: now[0]
    reqs = []
    for i, r in enumerate(trace):
        jit = math.exp(rng.normal(0.0, workload.jitter))
        reqs.append(types.SimpleNamespace(
            request_id=i, t_arrival=r["offset_s"], priority=r["priority"], request_class=r["request_class"],
            input_ids=[0] * r["prompt_tokens"], output_ids=[],
            settings=types.SimpleNamespace(max_new_tokens=r["output_tokens"]),
            prefill_s=workload.prefill_s_per_token * r["prompt_tokens"] * jit * speed,
            step_s=workload.tpot_s * jit * speed, queue_position=None, eta_s=None))
    out, nxt, free_at = [], 0, 0.0
    while len(out) < len(reqs):
        while nxt < len(reqs) and reqs[nxt].t_arrival <= free_at:   # every arrival up to now joins the queue
            now[0] = reqs[nxt].t_arrival
            q.put(reqs[nxt])
            nxt += 1
        now[0] = free_at
        pick = q.get(timeout=0) if not q.empty() else None
        if pick is None:                                            # idle until the next arrival
            free_at = max(free_at, reqs[nxt].t_arrival)
            continue
        start = max(free_at, pick.t_arrival)
        ttft = start - pick.t_arrival + pick.prefill_s + pick.step_s
        service = pick.prefill_s + pick.step_s * pick.settings.max_new_tokens
        free_at = start + service
        out.append({"request_id": pick.request_id, "request_class": pick.request_class, "ttft_s": ttft,
                    "queue_s": start - pick.t_arrival, "e2e_s": free_at - pick.t_arrival})
    return sorted(out, key=lambda r: r["request_id"])


def statistic(rows: list[dict], request_class: str = "interactive", column: str = "ttft_s", pct: int = 90) -> float:
    """A run's statistic: the ``pct`` percentile of ``column`` over ``request_class`` (NaN without such rows)."""
    vals = [r[column] for r in rows if r["request_class"] == request_class]
    return metrics.percentiles(vals, (pct,))[f"p{pct}"] if vals else float("nan")


def old_design(workload: Workload, policy: str, seed: int, request_class: str = "interactive",
               **policy_options) -> bool:
    """One A/A trial of the old design (module docstring): True when it claims a direction."""
    trace = workload.trace(seed)
    a = run(trace, policy, workload, 2 * seed, **policy_options)
    b = run(trace, policy, workload, 2 * seed + 1, **policy_options)
    pick = [i for i, r in enumerate(a) if r["request_class"] == request_class]
    iv = evidence.paired_ratio_interval([b[i]["ttft_s"] for i in pick], [a[i]["ttft_s"] for i in pick])
    return replicates.claims_direction(iv.low, iv.high)


def new_design(workload: Workload, policy: str, seed: int, rounds: int = 5,
               request_class: str = "interactive", **policy_options) -> bool:
    """One A/A trial of the new design (module docstring): ``rounds`` seeds, True when it claims a direction."""
    checks.check_int("rounds", rounds, lo=2)
    a, b = [], []
    for k in range(rounds):
        s = seed * 1000 + k
        trace = workload.trace(s)
        first = run(trace, policy, workload, 2 * s, **policy_options)
        second = run(trace, policy, workload, 2 * s + 1, **policy_options)
        if k % 2:  # alternate the arm order between seeds
            first, second = second, first
        a.append(statistic(first, request_class))
        b.append(statistic(second, request_class))
    _, low, high = replicates.paired_log_ratio(b, a)
    return replicates.claims_direction(low, high)


def aa_share(workload: Workload, policy: str = "fcfs", trials: int = 50, rounds: int = 5, seed: int = 0,
             **policy_options) -> dict:
    """The share of A/A trials claiming a direction, per design (``policy_options``: :func:`run`'s).

    Returns:
        ``{"old": share, "new": share, "trials": trials, "rounds": rounds}``.
    """
    checks.check_int("trials", trials, lo=1)
    old = sum(old_design(workload, policy, seed + t, **policy_options) for t in range(trials))
    new = sum(new_design(workload, policy, seed + t, rounds, **policy_options) for t in range(trials))
    return {"old": old / trials, "new": new / trials, "trials": trials, "rounds": rounds}
