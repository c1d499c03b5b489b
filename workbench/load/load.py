"""The load generator: arrival processes, coordinated-omission-free timing, windows, slices, saturation.

Profiles (:data:`PROFILES`; vLLM ``bench serve``, GuideLLM and AIPerf use the same names and meanings):

Closed loop (the next request waits for a previous one to finish; the client's pace follows the server):
    ``synchronous``  one request at a time.
    ``concurrency``  ``concurrency`` requests in flight at all times (N workers, each sending its next request
                     when its previous one ends).
    ``throughput``   every request at once (concurrency = number of requests): the maximum throughput.

Open loop (requests are sent at their scheduled times whatever the server does):
    ``constant``     a fixed gap of ``1 / rate`` seconds.
    ``poisson``      exponential gaps with mean ``1 / rate`` (a Poisson process).
    ``gamma``        gamma gaps with shape ``burstiness`` and scale ``1 / (rate * burstiness)`` (vLLM's
                     definition): mean rate ``rate`` whatever the burstiness; burstiness 1 is Poisson,
                     below 1 burstier (coefficient of variation ``1 / sqrt(burstiness)``), above 1 steadier.
    ``replay``       the arrival offsets of a JSONL trace (:func:`read_trace`), each with its own prompt and
                     output length.
    ``sweep``        not one run but a plan (:func:`sweep_rates`): ``synchronous`` and ``throughput`` first,
                     then ``k`` open-loop rates evenly between the two measured request rates.

Coordinated omission: in open loop every latency (``ttft_s``, ``e2e_s``) counts from the **scheduled**
time, not from when the client managed to send, and a request is sent at its time even while earlier ones
are still waiting (one thread per request), so a stalled server cannot slow the arrivals and hide its
queue. ``late_s`` (send minus scheduled time) records how far the client itself fell behind.

Warm-up and cool-down, by send time: requests sent before ``warmup_s`` (after the first scheduled arrival)
or in the last ``cooldown_s`` seconds before the last send are excluded from the kept rows, whatever their
latency (a slow request sent inside the window stays in it); the send window (``window_start_s``,
``window_end_s``) and the excluded counts are recorded. Requests planned inside the send window but never sent
(the over-saturation rule stopped the run) or still in flight when the run gave up waiting
(``join_timeout_s``) are :attr:`LoadResult.missing`: they count as misses in SLO attainment
(``requests_planned_window``, ``requests_unsent``, ``requests_incomplete``), never vanish.

Rates over a measured window (:func:`apply_window`, :func:`window_figures`): completions inside the window
divided by its length. Open loop: the window runs from the first to the last completion of the kept requests
and counts the completions after its opening one (``n - 1`` intervals between ``n`` events: at a steady rate
``r`` this is ``r``, whatever the run's length; ``requests / (first send .. last finish)`` would be
``N / ((N - 1) / r + one latency)``, low for short runs). Closed loop: the next request leaves as one ends,
so there is no arrival gap to bias the span: the window is the first kept send to the last kept finish and
every kept completion counts (vLLM's ``request_throughput``). ``window_s`` is the window's length.
Per-time-slice figures (:func:`time_slices`) credit each output token to the slice it was produced in and
show whether the run reached a steady state.

Over-saturation (open loop): the run stops sending when the requests in flight exceed ``max_in_flight``
or the oldest one has been in flight longer than ``max_wait_s``: past the knee the queue grows without
bound and every later request only measures the backlog. The rule and whether it fired are recorded
(``stopped_early``, ``stop_reason``, ``saturation_rule``); requests never sent are not rows but
:attr:`LoadResult.missing` entries (misses in attainment).

Keeping up (:func:`flow_rates`): ``arrival_rps`` (requests scheduled per second over the arrival span) and
``completion_rps`` (requests completed per second over the completion span), over the same number of
intervals. A server that keeps up completes at the rate requests arrive; past the knee completions fall to its
capacity. Unlike requests / wall time, neither is biased low by a short run's last service time. The same
question from the timing of every request (:func:`backlog_growth`): the slope of the backlog each arrival finds,
which decides with far fewer requests than the two counts.

Token counts come from the server's ``usage`` (or the engine's token ids in process), never from the
number of streamed chunks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.stats import evidence, metrics

PROFILES = ("synchronous", "concurrency", "throughput", "constant", "poisson", "gamma", "replay", "sweep")
OPEN_LOOP = ("constant", "poisson", "gamma", "replay")
ARRIVALS = ("constant", "poisson", "gamma")  # the open-loop arrival processes drawn at a rate (not a replay)
CLOSED_LOOP = ("synchronous", "concurrency", "throughput")
TRACE_FIELDS = ("offset_s", "prompt_tokens", "output_tokens")
MAX_SPAN_S = 86400.0     # a schedule (trace offsets, n / rate) longer than a day is a mistake, not a load test
MIN_SLICE_S = 1e-3       # narrower time slices are noise (and millions of rows)
MAX_SLICES = 100_000     # slices of one run at most


@dataclasses.dataclass
class RequestSpec:
    """One request to send: a prompt (text or messages), its output cap, and its trace offset if replayed.

    Scheduling workloads (issue 24) add ``priority`` (integer, lower first; sent as the request's ``priority``),
    ``request_class`` (its class in a mixed trace, copied to the row) and ``patience_s`` (the client abandons the
    request when no token has arrived this many seconds after its scheduled time; None: never).
    """

    prompt: object
    max_tokens: int
    prompt_tokens: int | None = None
    offset_s: float | None = None
    priority: int = 0
    request_class: str | None = None
    patience_s: float | None = None


def check_profile(profile: str, rate: float | None = None, concurrency: int | None = None,
                  burstiness: float = 1.0) -> None:
    """One-line errors for a profile and its parameters (before anything loads or is sent)."""
    checks.check_choice("profile", profile, PROFILES)
    if profile in ("constant", "poisson", "gamma"):
        if rate is None:
            raise ParameterError(f"rate: the {profile} profile needs a rate in requests/s (got None)")
        checks.check_float("rate", rate, lo=0, lo_open=True)
    if profile == "gamma":
        checks.check_float("burstiness", burstiness, lo=0, lo_open=True)
    if profile == "concurrency":
        checks.check_int("concurrency", concurrency, lo=1)


def arrival_offsets(profile: str, n: int, rate: float | None = None, burstiness: float = 1.0, seed: int = 0,
                    trace_offsets: Sequence[float] | None = None, max_span_s: float = MAX_SPAN_S) -> np.ndarray:
    """Scheduled send times (seconds after the first) of ``n`` open-loop requests; the first is at 0.

    ``constant``: ``i / rate``; ``poisson``: exponential gaps (mean ``1 / rate``); ``gamma``: gamma gaps of
    shape ``burstiness`` and scale ``1 / (rate * burstiness)``; ``replay``: the trace's offsets, shifted to
    start at 0. A fixed ``seed`` gives the same schedule. A schedule longer than ``max_span_s`` (a day: a run that
    would hang) is a one-line error; the serving twin, which simulates it in seconds, passes ``math.inf``.
    """
    check_profile(profile, rate, None, burstiness)
    checks.check_int("n", n, lo=1)
    if profile not in OPEN_LOOP:
        raise ParameterError(f"profile: {profile} is closed loop and has no schedule")
    if profile == "replay":
        if trace_offsets is None:
            raise ParameterError("trace: the replay profile needs a trace")
        off = np.asarray(trace_offsets[:n], dtype=float)
        off = off - off[0]
        if len(off) and off[-1] > max_span_s:
            raise ParameterError(f"trace: its offsets span {off[-1]:.3g} s, over the {max_span_s:g} s a run may take")
        return off
    rng = np.random.default_rng(seed)
    if profile == "constant":
        gaps = np.full(n - 1, 1.0 / rate)
    elif profile == "poisson":
        gaps = rng.exponential(1.0 / rate, n - 1)
    else:
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n - 1)
    out = np.concatenate([[0.0], np.cumsum(gaps)])
    if not np.isfinite(out[-1]) or out[-1] > max_span_s:  # a vanishing rate would schedule requests days apart
        raise ParameterError(f"rate: {n} requests at {rate:.3g}/s span {out[-1]:.3g} s, over the {max_span_s:g} s "
                             f"a run may take; use a rate of at least {n / max_span_s:.3g}/s")
    return out


def sweep_rates(sync_rps: float, max_rps: float, k: int) -> list[float]:
    """``k`` rates evenly between the synchronous and the maximum request rate, both ends excluded
    (GuideLLM's sweep). When the maximum is not above the synchronous rate the k rates spread from
    half to twice it, so the plan still brackets the knee."""
    checks.check_int("k", k, lo=1)
    checks.check_float("sync_rps", sync_rps, lo=0, lo_open=True)
    checks.check_float("max_rps", max_rps, lo=0, lo_open=True)
    lo, hi = (sync_rps, max_rps) if max_rps > sync_rps * 1.05 else (sync_rps * 0.5, sync_rps * 2.0)
    return [lo + (hi - lo) * (i + 1) / (k + 1) for i in range(k)]


def read_trace(path) -> list[dict]:
    """A JSONL trace: one object per line with ``offset_s`` (seconds, non-decreasing), ``prompt_tokens`` and
    ``output_tokens`` (integers >= 1). Blank lines are skipped.

    Raises:
        ParameterError: a missing file or field, a bad value, or an offset before the previous one (one line).
    """
    p = Path(path)
    if not p.is_file():
        raise ParameterError(f"trace: no such file {str(p)!r}")
    checks.check_file_size("trace", p)   # shared between people: bounded (workbench.checks.MAX_INPUT_BYTES ...)
    rows, last = [], -math.inf
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ParameterError(f"trace: line {i}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ParameterError(f"trace: line {i}: must be a JSON object")
        missing = [f for f in TRACE_FIELDS if f not in obj]
        if missing:
            raise ParameterError(f"trace: line {i}: missing field {', '.join(missing)}")
        off = checks.check_float(f"trace: line {i}: offset_s", obj["offset_s"], lo=0, hi=MAX_SPAN_S)
        checks.check_int(f"trace: line {i}: prompt_tokens", obj["prompt_tokens"], lo=1, hi=checks.MAX_REQUEST_TOKENS)
        checks.check_int(f"trace: line {i}: output_tokens", obj["output_tokens"], lo=1, hi=checks.MAX_REQUEST_TOKENS)
        if len(rows) >= checks.MAX_REQUESTS:
            raise ParameterError(f"trace: line {i}: more than {checks.MAX_REQUESTS} requests")
        if off < last:
            raise ParameterError(f"trace: line {i}: offset_s {off} is before the previous one ({last}); "
                                 "arrival times must not decrease")
        last = off
        rows.append({f: obj[f] for f in TRACE_FIELDS})
    if not rows:
        raise ParameterError(f"trace: {str(p)!r} has no requests")
    return rows


# ----------------------------------------------------------------------------- running a profile


@dataclasses.dataclass
class LoadResult:
    """One profile run: ``rows`` (one dict per sent request), ``summary`` (dict), ``slices`` (DataFrame),
    ``missing`` (one dict per planned request without a row: ``request_id``, ``reason`` ``unsent`` /
    ``incomplete``, ``t_scheduled_s`` (NaN when never scheduled) and ``in_window``) and ``t0`` (the
    ``perf_counter`` reading that row times count from)."""

    rows: list
    summary: dict
    slices: pd.DataFrame
    missing: list = dataclasses.field(default_factory=list)
    t0: float = float("nan")

    def kept(self) -> pd.DataFrame:
        """The rows inside the kept window (warm-up and cool-down excluded, by send time)."""
        df = pd.DataFrame(self.rows)
        return df[df["kept"]].copy() if not df.empty else df


def run_load(send: Callable, specs: Sequence[RequestSpec], profile: str, rate: float | None = None,
             concurrency: int | None = None, burstiness: float = 1.0, seed: int = 0, warmup_s: float = 0.0,
             cooldown_s: float = 0.0, slice_s: float = 5.0, max_in_flight: int | None = None,
             max_wait_s: float | None = None, join_timeout_s: float = 600.0) -> LoadResult:
    """Send ``specs`` under ``profile`` and collect one row per sent request.

    Args:
        send: ``send(spec, t_scheduled) -> row`` (:func:`~workbench.load.senders.http_sender`, :func:`~workbench.load.senders.engine_sender` or a fake).
        specs: the requests, in order; ``replay`` uses their ``offset_s``.
        profile: one of :data:`PROFILES` except ``sweep`` (a plan of several runs, see :func:`sweep_rates`).
        rate, concurrency, burstiness, seed: the profile's parameters.
        warmup_s, cooldown_s: excluded windows (seconds), see the module docstring.
        slice_s: width of the per-time-slice figures.
        max_in_flight, max_wait_s: the over-saturation stop rule (open loop); None disables a part.

    Returns:
        :class:`LoadResult`. Row times ``t_scheduled_s``, ``t_start_s`` (sent), ``t_end_s`` are seconds after
        the first scheduled arrival; ``late_s`` is send minus scheduled time; ``kept`` marks the window.
    """
    check_profile(profile, rate, concurrency, burstiness)
    if profile == "sweep":
        raise ParameterError("profile: sweep is a plan of several runs; run synchronous, throughput and the "
                             "rates of sweep_rates() one by one")
    if not specs:
        raise ParameterError("specs: need at least one request")
    checks.check_float("warmup_s", warmup_s, lo=0)
    checks.check_float("cooldown_s", cooldown_s, lo=0)
    checks.check_float("slice_s", slice_s, lo=MIN_SLICE_S)
    if max_in_flight is not None:
        checks.check_int("max_in_flight", max_in_flight, lo=1)
    if max_wait_s is not None:
        checks.check_float("max_wait_s", max_wait_s, lo=0, lo_open=True)
    rows: list = [None] * len(specs)
    in_flight: dict[int, float] = {}
    lock = threading.Lock()
    stop = {"reason": ""}
    t0 = time.perf_counter() + 0.01

    def one(i, t_sched):
        try:
            row = send(specs[i], t_sched)
        except Exception as exc:  # the sender should not raise; if it does, the request failed
            row = {"error": f"{type(exc).__name__}: {exc}", "output_tokens": 0, "t_sent": t_sched,
                   "t_done": time.perf_counter(), "ttft_s": float("nan"), "e2e_s": time.perf_counter() - t_sched}
        row.update(request_id=i, t_scheduled=t_sched)
        rows[i] = row
        with lock:
            in_flight.pop(i, None)

    threads = []
    if profile in OPEN_LOOP:
        offs = arrival_offsets(profile, len(specs), rate, burstiness, seed,
                               [s.offset_s for s in specs] if profile == "replay" else None)
        rule = []
        if max_in_flight is not None:
            rule.append(f"in flight > {max_in_flight}")
        if max_wait_s is not None:
            rule.append(f"oldest in flight > {max_wait_s:g} s")
        for i, off in enumerate(offs):
            t_sched = t0 + float(off)
            while True:  # sleep until the scheduled time, checking the saturation rule meanwhile
                now = time.perf_counter()
                with lock:
                    n_fly = len(in_flight)
                    oldest = min(in_flight.values()) if in_flight else None
                if max_in_flight is not None and n_fly > max_in_flight:
                    stop["reason"] = f"{n_fly} requests in flight > max_in_flight {max_in_flight}"
                elif max_wait_s is not None and oldest is not None and now - oldest > max_wait_s:
                    stop["reason"] = f"a request in flight for {now - oldest:.1f} s > max_wait_s {max_wait_s:g}"
                if stop["reason"] or now >= t_sched:
                    break
                time.sleep(min(0.005, t_sched - now))
            if stop["reason"]:
                break
            with lock:
                in_flight[i] = t_sched
            th = threading.Thread(target=one, args=(i, t_sched), daemon=True)
            th.start()
            threads.append(th)
        saturation_rule = " or ".join(rule) or "none"
    else:
        n_workers = {"synchronous": 1, "throughput": len(specs)}.get(profile, concurrency)
        n_workers = min(n_workers, len(specs))
        it = iter(range(len(specs)))
        it_lock = threading.Lock()

        def worker():
            while True:
                with it_lock:
                    i = next(it, None)
                if i is None:
                    return
                t_sched = max(t0, time.perf_counter())  # closed loop: scheduled when the worker is free
                while time.perf_counter() < t_sched:
                    time.sleep(0.001)
                with lock:
                    in_flight[i] = t_sched
                one(i, t_sched)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_workers)]
        for th in threads:
            th.start()
        saturation_rule = "none (closed loop)"
    end = time.perf_counter() + join_timeout_s
    for th in threads:
        th.join(timeout=max(0.0, end - time.perf_counter()))
    with lock:  # a request still in flight now is incomplete (its late row, if any, is not read)
        snapshot, flying = list(rows), dict(in_flight)
    sent = [r for r in snapshot if r is not None]
    missing = []
    for i, r in enumerate(snapshot):
        if r is not None:
            continue
        if i in flying:
            missing.append({"request_id": i, "reason": "incomplete", "t_scheduled_s": flying[i] - t0})
        else:
            planned = float(offs[i]) if profile in OPEN_LOOP else float("nan")
            missing.append({"request_id": i, "reason": "unsent", "t_scheduled_s": planned})
    for r in sent:
        r["t_scheduled_s"] = r["t_scheduled"] - t0
        r["t_start_s"] = r.get("t_sent", r["t_scheduled"]) - t0
        r["t_end_s"] = r.get("t_done", r["t_scheduled"]) - t0
        r["late_s"] = r.get("t_sent", r["t_scheduled"]) - r["t_scheduled"]
        r.setdefault("error", None)
    summary = dict(profile=profile, rate=rate, concurrency=concurrency, burstiness=burstiness if profile == "gamma"
                   else None, requests_planned=len(specs), requests_sent=len(sent), stopped_early=bool(stop["reason"]),
                   stop_reason=stop["reason"], saturation_rule=saturation_rule,
                   client_late_s_max=max((r["late_s"] for r in sent), default=float("nan")))
    summary.update(apply_window(sent, warmup_s, cooldown_s, open_loop=profile in OPEN_LOOP, missing=missing))
    summary.update(flow_rates(sent))
    return LoadResult(sent, summary, time_slices(sent, slice_s), missing, t0)


def flow_rates(rows: list) -> dict:
    """``arrival_rps``: ``(sent - 1) / (last - first scheduled time)``; ``completion_rps``: ``(completed - 1) /
    (last - first finish)`` over the requests that completed without error; ``arrival_count`` /
    ``completion_count`` the timestamps behind each (their noise band: :mod:`workbench.load.saturation`). NaN
    rates with fewer than two requests or a zero span. In closed loop arrivals follow completions, so the two agree
    by construction. With them the in-flight growth test's ``backlog_growth``, ``backlog_growth_low`` and
    ``backlog_growth_high`` (:func:`backlog_growth`, over every sent request's ``t_scheduled_s`` / ``t_end_s``)."""
    def rate(times):
        times = sorted(times)
        span = times[-1] - times[0] if len(times) >= 2 else 0.0
        return (len(times) - 1) / span if span > 0 else float("nan")

    arrivals = [r["t_scheduled_s"] for r in rows]
    completions = [r["t_end_s"] for r in rows if not failed(r)]
    out = {"arrival_rps": rate(arrivals), "completion_rps": rate(completions),
           "arrival_count": len(arrivals), "completion_count": len(completions)}
    out.update(backlog_growth(arrivals, [r.get("t_end_s", float("nan")) for r in rows]))
    return out


def failed(row: dict) -> bool:
    """Whether a request row failed: its ``error`` is set (a message). ``None``, NaN and ``""`` are no error: a row
    that went through a DataFrame (the twin's rows, a table read back) holds NaN where it held None, and NaN is true
    in Python, so ``not row.get("error")`` called every such row failed (the twin counted 0 of 8 completions in a
    run with refusals: throughput 0 / NaN)."""
    e = row.get("error")
    return e is not None and e == e and str(e) != ""


BACKLOG_BATCHES = 5      # batch means for the backlog's slope (:func:`backlog_growth`)
BACKLOG_CONFIDENCE = 0.95


def backlog_growth(arrivals: Sequence[float], ends: Sequence[float], batches: int = BACKLOG_BATCHES,
                   confidence: float = BACKLOG_CONFIDENCE) -> dict:
    """How fast the backlog grows per request arrived, with one-sided bounds: the in-flight growth test.

    The backlog a request finds on arrival is the earlier requests still in flight. A server that keeps up has a
    stationary backlog; one past its capacity gains ``1 - completion/arrival`` requests of backlog per request
    that arrives. The slope of the backlog against arrival time, over the arrival rate, estimates that share.
    Consecutive backlogs are correlated (a queue), so the interval comes from batch means: the arrivals split
    into ``batches`` consecutive groups, the mean backlog of each regressed on its mean arrival time
    (``scipy.stats.linregress``), Student t with ``batches - 2`` degrees of freedom (the method of batch means:
    Schmeiser 1982, "Batch size effects in the analysis of simulation output", Operations Research 30(3);
    GuideLLM's over-saturation detector tests the same slope of concurrent requests).

    Args:
        arrivals: scheduled arrival times (seconds), one per sent request.
        ends: their finish times (seconds; NaN: never finished, in flight to the end), same order.
        batches: consecutive groups (>= 3).
        confidence: one-sided coverage of each bound.

    Returns:
        ``backlog_growth`` (backlog gained per request arrived: 0 when keeping up, ``1 - completion_rps /
        arrival_rps`` past the knee), ``backlog_growth_low`` / ``backlog_growth_high`` (its one-sided bounds);
        NaN each with fewer than ``2 * batches`` arrivals or a zero arrival span.
    """
    from scipy import stats

    nan = {"backlog_growth": float("nan"), "backlog_growth_low": float("nan"), "backlog_growth_high": float("nan")}
    a = np.asarray(arrivals, dtype=float)
    c = np.asarray(ends, dtype=float)
    order = np.argsort(a, kind="stable")
    a, c = a[order], np.where(np.isnan(c[order]), np.inf, c[order])
    if len(a) < 2 * batches or not a[-1] > a[0]:
        return nan
    # earlier requests still in flight at each arrival: the i earlier ones less those finished by then
    # (a later request cannot finish before an earlier arrival, so counting every finish up to a[i] is exact)
    backlog = np.arange(len(a)) - np.searchsorted(np.sort(c), a, side="right")
    groups = np.array_split(np.arange(len(a)), batches)
    x = np.array([a[g].mean() for g in groups])
    y = np.array([backlog[g].mean() for g in groups], dtype=float)
    fit = stats.linregress(x, y)
    arrival_rps = (len(a) - 1) / (a[-1] - a[0])
    iv = evidence.estimate_interval(fit.slope, fit.stderr, batches - 2, "batch means",
                                    confidence=1 - 2 * (1 - confidence))   # two-sided at 90%: one-sided 95% each
    return {"backlog_growth": fit.slope / arrival_rps, "backlog_growth_low": iv.low / arrival_rps,
            "backlog_growth_high": iv.high / arrival_rps}


def apply_window(rows: list, warmup_s: float, cooldown_s: float, open_loop: bool = True,
                 missing: list | None = None) -> dict:
    """Mark ``kept`` and ``in_window`` on each row and return the windows and counts (module docstring).

    Args:
        rows: sent requests with ``t_start_s`` (sent), ``t_end_s`` (finished), ``output_tokens`` and ``error``
            (seconds after the first scheduled arrival).
        warmup_s, cooldown_s: requests sent before ``warmup_s`` or after the last send minus ``cooldown_s``
            are not kept (send time decides, never latency).
        open_loop: the arrival process has its own schedule (opens the counting window at the first
            completion); closed loop counts from the first kept send.
        missing: :attr:`LoadResult.missing` (unsent: their planned time decides; NaN times count as inside).
            Each gets ``in_window``.

    Returns:
        ``window_start_s`` / ``window_end_s`` (the send window), ``measure_start_s`` / ``measure_end_s`` and
        ``window_s`` (the counting window and its length, NaN when it has no length), ``requests_in_window``
        (completions counted), ``requests_planned_window`` (kept rows plus missing requests in the send
        window: the denominator of SLO attainment), ``requests_unsent``, ``requests_incomplete``,
        ``excluded_warmup``, ``excluded_cooldown`` and ``wall_s`` (first kept send to last kept finish).
    """
    missing = missing or []
    nan = float("nan")
    sends = [r["t_start_s"] for r in rows] + [m["t_scheduled_s"] for m in missing if m["t_scheduled_s"] == m["t_scheduled_s"]]
    if not sends:
        for m in missing:
            m["in_window"] = True
        return dict(window_start_s=nan, window_end_s=nan, measure_start_s=nan, measure_end_s=nan, window_s=nan,
                    requests_in_window=0, requests_planned_window=len(missing),
                    requests_unsent=sum(m["reason"] == "unsent" for m in missing),
                    requests_incomplete=sum(m["reason"] == "incomplete" for m in missing),
                    excluded_warmup=0, excluded_cooldown=0, wall_s=nan)
    lo, hi = warmup_s, max(sends) - cooldown_s
    n_w = n_c = 0
    for r in rows:
        early, late = r["t_start_s"] < lo - 1e-9, r["t_start_s"] > hi + 1e-9
        r["kept"] = not (early or late)
        r["in_window"] = False
        n_w += early
        n_c += late and not early
    for m in missing:
        t = m["t_scheduled_s"]
        m["in_window"] = not (t == t) or lo - 1e-9 <= t <= hi + 1e-9
    kept = [r for r in rows if r["kept"]]
    done = [r for r in kept if not failed(r) and (r.get("output_tokens") or 0) >= 1]
    wall = (max(r["t_end_s"] for r in kept) - min(r["t_start_s"] for r in kept)) if kept else nan
    if open_loop:
        a = min((r["t_end_s"] for r in done), default=nan)
        b = max((r["t_end_s"] for r in done), default=nan)
        for r in done:
            r["in_window"] = a < r["t_end_s"] <= b
    else:
        a = min((r["t_start_s"] for r in kept), default=nan)
        b = max((r["t_end_s"] for r in kept), default=nan)
        for r in done:
            r["in_window"] = True
    span = b - a
    return dict(window_start_s=lo, window_end_s=hi, measure_start_s=a, measure_end_s=b,
                window_s=span if span == span and span > 0 else nan,
                requests_in_window=sum(r["in_window"] for r in done),
                requests_planned_window=len(kept) + sum(m["in_window"] for m in missing),
                requests_unsent=sum(m["reason"] == "unsent" for m in missing),
                requests_incomplete=sum(m["reason"] == "incomplete" for m in missing),
                excluded_warmup=int(n_w), excluded_cooldown=int(n_c), wall_s=wall)


def window_figures(rows, summary: dict) -> dict:
    """Throughput and concurrency of one run over its counting window (:func:`apply_window`).

    Args:
        rows: the run's sent rows (list of dicts or a DataFrame) after :func:`apply_window` (``in_window``,
            ``t_scheduled_s``, ``t_end_s``, ``e2e_s``, ``output_tokens``, ``prompt_tokens``).
        summary: its ``measure_start_s``, ``measure_end_s`` and ``window_s``.

    Returns:
        ``request_throughput_rps``, ``output_throughput_tps``, ``input_throughput_tps`` and
        ``total_throughput_tps`` (counted completions, their output / prompt / both token counts, per second of
        the window); ``mean_concurrency`` (requests in the system, scheduled arrival to finish, averaged over
        the window: the time integral of the in-system count over its length) and ``littles_law_ratio``
        (``mean_concurrency / (request_throughput_rps * mean e2e_s of the counted requests)``: Little's law
        L = lambda W says 1 in a steady state; far from 1, the window did not hold one). NaN without a window.
    """
    df = pd.DataFrame(rows)
    nan = float("nan")
    w, a, b = summary.get("window_s", nan), summary.get("measure_start_s", nan), summary.get("measure_end_s", nan)
    out = dict(request_throughput_rps=nan, output_throughput_tps=nan, input_throughput_tps=nan,
               total_throughput_tps=nan, mean_concurrency=nan, littles_law_ratio=nan)
    if df.empty or not (w == w and w > 0) or "in_window" not in df:
        return out
    c = df[df["in_window"].fillna(False).astype(bool)]
    out_tok = float(pd.to_numeric(c.get("output_tokens"), errors="coerce").fillna(0).sum()) if len(c) else 0.0
    in_tok = float(pd.to_numeric(c.get("prompt_tokens"), errors="coerce").fillna(0).sum()) if len(c) else 0.0
    lam = len(c) / w
    start = pd.to_numeric(df.get("t_scheduled_s", df.get("t_start_s")), errors="coerce")
    end = pd.to_numeric(df["t_end_s"], errors="coerce")
    busy = float((np.minimum(end, b) - np.maximum(start, a)).clip(lower=0).fillna(0).sum())
    conc = busy / w
    e2e = float(pd.to_numeric(c.get("e2e_s"), errors="coerce").mean()) if len(c) else nan
    out.update(request_throughput_rps=lam, output_throughput_tps=out_tok / w, input_throughput_tps=in_tok / w,
               total_throughput_tps=(out_tok + in_tok) / w, mean_concurrency=conc,
               littles_law_ratio=conc / (lam * e2e) if lam > 0 and e2e == e2e and e2e > 0 else nan)
    return out


def token_times(row: dict) -> list[float]:
    """When each output token of a row was produced (seconds after the first scheduled arrival).

    From the row's own stamps: ``t_scheduled_s`` (else ``t_start_s``) ``+ ttft_s`` for the first token, then the per-token gaps
    ``itl_s`` when they cover every token (``output_tokens - 1`` of them); otherwise (an HTTP row whose server
    sent no per-token gaps) the remaining tokens spread evenly up to ``t_scheduled_s + e2e_s``. Empty for a
    failed row or one without a first token.
    """
    n = int(row.get("output_tokens") or 0)
    t_sched, ttft = row.get("t_scheduled_s", row.get("t_start_s")), row.get("ttft_s")
    if n < 1 or failed(row) or t_sched is None or ttft is None or not (ttft == ttft):
        return []
    first = float(t_sched) + float(ttft)
    gaps = row.get("itl_s")
    gaps = list(gaps) if isinstance(gaps, (list, tuple, np.ndarray)) else []
    if len(gaps) == n - 1:
        return (first + np.concatenate([[0.0], np.cumsum(np.asarray(gaps, dtype=float))])).tolist()
    e2e = row.get("e2e_s")
    last = float(t_sched) + float(e2e) if e2e is not None and e2e == e2e else first
    return np.linspace(first, max(first, last), n).tolist()


def time_slices(rows: list, slice_s: float = 5.0) -> pd.DataFrame:
    """Per ``slice_s`` window after the first arrival: ``started``, ``completed``, ``failed`` (requests that
    finished in it), ``in_flight`` (at the slice's end), ``output_tokens`` produced in it (each token credited
    to the slice it was produced in, :func:`token_times`), ``output_throughput_tps`` (those tokens per second of
    the slice) and ``ttft_s_p50`` of the requests completed in it."""
    cols = ["slice_start_s", "started", "completed", "failed", "in_flight", "output_tokens", "output_throughput_tps",
            "ttft_s_p50"]
    checks.check_float("slice_s", slice_s, lo=MIN_SLICE_S)
    if not rows:
        return pd.DataFrame(columns=cols)
    last = max(r["t_end_s"] for r in rows)
    times = np.asarray([t for r in rows for t in token_times(r)], dtype=float)
    last = max(last, float(times.max()) if times.size else last)
    n_slices = int(math.floor(max(last, 0.0) / slice_s)) + 1  # the last finish falls inside the last slice
    if n_slices > MAX_SLICES:
        raise ParameterError(f"slice_s: {slice_s:g} s makes {n_slices} slices of this run's {last:.3g} s; "
                             f"at most {MAX_SLICES} (slice_s >= {last / MAX_SLICES:.3g})")
    tokens = np.bincount(np.clip((times // slice_s).astype(int), 0, n_slices - 1), minlength=n_slices) \
        if times.size else np.zeros(n_slices, dtype=int)
    out = []
    for k in range(n_slices):
        a, b = k * slice_s, (k + 1) * slice_s
        done = [r for r in rows if a <= r["t_end_s"] < b or (k == 0 and r["t_end_s"] < a)]
        out.append({"slice_start_s": a, "started": sum(a <= r["t_start_s"] < b for r in rows),
                    "completed": sum(not failed(r) for r in done),
                    "failed": sum(failed(r) for r in done),
                    "in_flight": sum(r["t_start_s"] < b <= r["t_end_s"] for r in rows),
                    "output_tokens": int(tokens[k]), "output_throughput_tps": int(tokens[k]) / slice_s,
                    "ttft_s_p50": metrics.percentiles([r.get("ttft_s") for r in done if not failed(r)],
                                                      (50,))["p50"]})
    return pd.DataFrame(out)
