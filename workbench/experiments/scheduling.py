"""Experiment 11: scheduling policies and what a waiting user sees (notebook ``11_scheduling``; issue 24,
DESIGN.md section 7 item 11).

**Workload** (:func:`mixed_trace`, or a JSONL trace with :func:`read_mixed_trace`): a mix of interactive short
chats and background long reports. Stated distributions: each request is ``interactive`` with probability
``short_share`` (else ``background``); its prompt length is drawn uniformly from the class's
``*_prompt_tokens`` list; its output is fixed at the class's ``*_max_tokens`` (greedy, ``ignore_eos``);
interactive requests have priority 0, background ones priority 1; arrivals are a Poisson process (exponential
gaps, :func:`workbench.serving.load.arrival_offsets`) at ``load_factor`` times the engine's one-at-a-time
capacity on this mix (``1 / E[service alone]``, the service alone of each class measured once per run on an
idle engine: :func:`calibrate`). Every policy replays the same requests at the same times (a paired
comparison). A share ``abandon_share`` of clients gives up when no token came ``patience_s`` after arrival
(the request is withdrawn and frees its place); a full engine (``max_pending``) answers with a Retry-After from
its backlog, which the load generator honours (``max_retries``).

**Points**: per policy (``fcfs``, ``priority``, ``sjf``, ``lanes``: :mod:`workbench.serving.scheduling`) one run of
the mixed workload on ``engine`` (``fifo`` or ``static``; the ``continuous`` engine's admission is the library's
own FIFO); with ``turns`` > 0 one ``multiturn`` point per ``multiturn_prefix_sharing`` value
(``conversations`` concurrent conversations whose context grows turn by turn: each turn's prompt is the whole
history); with ``prefix_group_requests`` > 0 one ``shared_prefix`` point per value (a group of requests that open
with the same system document of ``shared_prefix_tokens`` tokens, one after another: many users of one system
prompt or document). With ``shared_prefix_tokens`` > 0 the conversations open with that document too, so they
share a prefix as well as their own growing history. With prefix sharing in the list, these points run on the
``continuous`` engine with its prefix cache on / off (:func:`prefix_sharing_available`: an engines module with
``make_engine(prefix_sharing=...)``), and :func:`prefix_savings` puts the cache hit rate (cached over prompt
tokens, from the rows' ``cached_tokens``) next to the TTFT it saved (off - on, paired by conversation and turn,
with its interval; "not supported" when the interval straddles 0); without it the hit rate is NaN, "not
available".

**Which engine shows a policy** (``engine``): ``fifo`` serves one request at a time, so near its knee a queue
forms and the order is what the short requests wait for (``benchmarks/scheduling.py --engine fifo``,
results/LOG.md: short TTFT p90 0.22x of fcfs under ``sjf`` and ``lanes``). A ``static`` engine at the same load
factor (of the one-at-a-time capacity) shows no difference between policies: its batches of up to
``max_batch_size`` raise its capacity above the offered rate, so the queue rarely holds more than one batch
when a batch forms, every waiting request joins it whatever the order, and a short row admitted next still waits
for the running batch's longest row. A policy reorders a static engine's queue only at loads where more requests
wait than a batch holds.

**Per request**: ``request_class``, ``priority``, ``max_tokens``, ``slowdown`` (``e2e_s`` over the class's
service alone), ``queue_position`` / ``eta_s`` (what the queue told at arrival) and ``eta_error_s``
(``eta_s - queue_s``), ``abandoned``, ``retries``. **Per point** (:func:`class_columns`): per class the TTFT
p50/p90, queue p50/p90, e2e p50, SLO attainment and goodput under the class's TTFT SLO (``class_slo_ttft_s``),
the longest wait (``queue_s_max``: starvation), the median absolute ETA error, abandoned and retried requests.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import checks
from workbench.stats import evidence, metrics, slo
from workbench.run import sweeps
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings
from workbench.share.plots import ok_points, split_by_device
from workbench.run.point_result import PointResult
from workbench.serving import engines as engines_mod
from workbench.serving import load, scheduling

EXPERIMENT = "scheduling"
CLASSES = ("interactive", "background")
WORKLOADS = ("mixed", "multiturn", "shared_prefix")
PREFIX_WORKLOADS = ("multiturn", "shared_prefix")
ENGINES = ("fifo", "static")
TRACE_FIELDS = ("offset_s", "prompt_tokens", "output_tokens", "request_class")


@dataclasses.dataclass
class Config(sweeps.SweepConfig):
    """The scheduling study (notebook ``11_scheduling``).

    Attributes:
        policies: subset of :data:`workbench.serving.scheduling.POLICIES`.
        engine: ``fifo`` (default: one request at a time, where the order shows) or ``static`` (see the module
            docstring: at the same load factor its batches leave the policies nothing to reorder).
        requests_per_point: requests of the mixed workload (>= 4).
        short_share: share of interactive requests (0, 1).
        short_prompt_tokens, long_prompt_tokens: prompt lengths drawn uniformly per class (>= 32 each).
        short_max_tokens, long_max_tokens: output tokens per class (fixed, ``ignore_eos``; short < long).
        load_factor: offered rate over the one-at-a-time capacity on the mix (> 0; near 1: the knee).
        max_batch_size, batch_window_s: the ``static`` engine's batch limit and window.
        aging_s: ``sjf`` / ``lanes`` wait bound base (> 0); lane_threshold_tokens: ``lanes`` long threshold (> 0);
            long_cap: ``lanes`` long requests at once (>= 1); sjf_predictor: ``sjf``'s job size, ``proxy``
            (``max_tokens`` and prompt length) or ``fitted`` (a fit of the service time on them from the engine's own
            finished requests: :class:`workbench.serving.scheduling.ServiceFit`).
        class_slo_ttft_s: per class TTFT limit in seconds (every class of the workload needs one).
        abandon_share, patience_s: share of clients that give up, and after how long without a token.
        max_pending: the engine's admission limit (None: unbounded), max_retries: Retry-After resends.
        turns, conversations: the multi-turn points (turns 0: none).
        shared_prefix_tokens: a system message of this many tokens shared by every conversation and by every
            request of the shared-prefix group (0: none).
        prefix_group_requests: the shared-prefix group: requests sharing the ``shared_prefix_tokens`` document, one
            after another (0: no such points; else >= 2, and ``shared_prefix_tokens`` >= 32).
        multiturn_prefix_sharing: one multi-turn (and one shared-prefix) point per value; any True runs them all on
            the ``continuous`` engine with its prefix sharing on / off (needs an engines module with that switch:
            ParameterError otherwise), reporting ``cache_hit_rate`` next to the TTFT it saved (:func:`prefix_savings`).
        trace: a mixed trace JSONL (:func:`read_mixed_trace`); empty: generated (:func:`mixed_trace`).
        max_wait_s: over-saturation stop rule (seconds a request may be in flight).
    """

    policies: list = dataclasses.field(default_factory=lambda: list(scheduling.POLICIES))
    engine: str = "fifo"
    requests_per_point: int = 16
    short_share: float = 0.7
    short_prompt_tokens: list = dataclasses.field(default_factory=lambda: [32, 48])
    long_prompt_tokens: list = dataclasses.field(default_factory=lambda: [64, 96])
    short_max_tokens: int = 6
    long_max_tokens: int = 32
    load_factor: float = 0.9
    max_batch_size: int = 4
    batch_window_s: float = 0.05
    aging_s: float = 20.0
    lane_threshold_tokens: int = 16
    long_cap: int = 1
    sjf_predictor: str = "proxy"
    class_slo_ttft_s: dict = dataclasses.field(default_factory=lambda: {"interactive": 2.0, "background": 30.0})
    abandon_share: float = 0.0
    patience_s: float = 30.0
    max_pending: int | None = None
    max_retries: int = 3
    turns: int = 3
    conversations: int = 2
    multiturn_prefix_sharing: list = dataclasses.field(default_factory=lambda: [False])
    shared_prefix_tokens: int = 0
    prefix_group_requests: int = 0
    trace: str = ""
    max_wait_s: float = 120.0

    def __post_init__(self):
        super().__post_init__()
        checks.check_choice_list("policies", self.policies, scheduling.POLICIES)
        checks.check_choice("engine", self.engine, ENGINES)
        checks.check_int("requests_per_point", self.requests_per_point, lo=4)
        checks.check_float("short_share", self.short_share, lo=0, hi=1, lo_open=True)
        if self.short_share >= 1:
            raise ParameterError(f"short_share: must be in (0, 1): both classes present (got {self.short_share})")
        checks.check_int_list("short_prompt_tokens", self.short_prompt_tokens, lo=32)
        checks.check_int_list("long_prompt_tokens", self.long_prompt_tokens, lo=32)
        checks.check_int("short_max_tokens", self.short_max_tokens, lo=1)
        checks.check_int("long_max_tokens", self.long_max_tokens, lo=self.short_max_tokens + 1)
        checks.check_float("load_factor", self.load_factor, lo=0, lo_open=True)
        checks.check_int("max_batch_size", self.max_batch_size, lo=1)
        checks.check_float("batch_window_s", self.batch_window_s, lo=0)
        checks.check_choice("sjf_predictor", self.sjf_predictor, scheduling.PREDICTORS)
        scheduling.make_queue("fcfs", self.engine, aging_s=self.aging_s, lane_threshold_tokens=self.lane_threshold_tokens,
                              long_cap=self.long_cap, predictor=self.sjf_predictor)  # the options' one-line errors
        check_class_slos(self.class_slo_ttft_s, CLASSES)
        checks.check_float("abandon_share", self.abandon_share, lo=0, hi=1)
        checks.check_float("patience_s", self.patience_s, lo=0, lo_open=True)
        if self.max_pending is not None:
            checks.check_int("max_pending", self.max_pending, lo=1)
        checks.check_int("max_retries", self.max_retries, lo=0)
        checks.check_int("turns", self.turns, lo=0)
        checks.check_int("conversations", self.conversations, lo=1)
        checks.check_int("shared_prefix_tokens", self.shared_prefix_tokens, lo=0)
        checks.check_int("prefix_group_requests", self.prefix_group_requests, lo=0)
        if self.prefix_group_requests == 1:
            raise ParameterError("prefix_group_requests: 0 (none) or at least 2 requests sharing the document (got 1)")
        if self.prefix_group_requests and self.shared_prefix_tokens < 32:
            raise ParameterError(f"prefix_group_requests: the shared-prefix group needs shared_prefix_tokens >= 32 "
                                 f"(the document its requests share; got {self.shared_prefix_tokens})")
        if not isinstance(self.multiturn_prefix_sharing, list) or not self.multiturn_prefix_sharing or \
                len(set(map(bool, self.multiturn_prefix_sharing))) != len(self.multiturn_prefix_sharing):
            raise ParameterError(f"multiturn_prefix_sharing: a non-empty list of distinct booleans "
                                 f"(got {self.multiturn_prefix_sharing!r:.80})")
        for v in self.multiturn_prefix_sharing:
            checks.check_bool("multiturn_prefix_sharing", v)
        if any(self.multiturn_prefix_sharing) and not prefix_sharing_available():
            raise ParameterError("multiturn_prefix_sharing: this version's engines have no prefix-sharing switch "
                                 "(make_engine(prefix_sharing=...)); use [false]")
        checks.check_float("max_wait_s", self.max_wait_s, lo=0, lo_open=True)
        if self.trace:
            read_mixed_trace(self.trace, self.class_slo_ttft_s)

    def settings(self) -> GenerationSettings:
        """Every request: greedy, fixed length (its class's ``max_tokens``)."""
        return GenerationSettings(max_new_tokens=self.long_max_tokens, ignore_eos=True, seed=self.seed)

    def grid(self) -> list[dict]:
        """One ``mixed`` point per policy, then one ``multiturn`` point (``fcfs``) per ``multiturn_prefix_sharing``
        value when ``turns`` > 0, then one ``shared_prefix`` point per value when ``prefix_group_requests`` > 0."""
        pts = [{"workload": "mixed", "policy": p, "prefix_sharing": False} for p in self.policies]
        for workload, on in (("multiturn", self.turns > 0), ("shared_prefix", self.prefix_group_requests > 0)):
            pts += [{"workload": workload, "policy": "fcfs", "prefix_sharing": bool(v)}
                    for v in self.multiturn_prefix_sharing] if on else []
        return pts

    def queue(self, policy: str) -> scheduling.PolicyQueue:
        return scheduling.make_queue(policy, self.engine, aging_s=self.aging_s,
                                     lane_threshold_tokens=self.lane_threshold_tokens, long_cap=self.long_cap,
                                     predictor=self.sjf_predictor)


# ----------------------------------------------------------------------------- workloads


def prefix_sharing_available() -> bool:
    """Whether :func:`workbench.serving.engines.make_engine` has the ``continuous`` engine's ``prefix_sharing``
    switch (added by issue 23's prefix sharing)."""
    import inspect

    return "prefix_sharing" in inspect.signature(engines_mod.make_engine).parameters


def check_class_slos(class_slo_ttft_s, classes) -> dict:
    """Every class in ``classes`` has a TTFT SLO in ``class_slo_ttft_s`` (seconds > 0); one-line ParameterError."""
    if not isinstance(class_slo_ttft_s, dict):
        raise ParameterError(f"class_slo_ttft_s: must be a mapping class -> seconds (got {class_slo_ttft_s!r:.80})")
    for c in classes:
        if c not in class_slo_ttft_s:
            raise ParameterError(f"class_slo_ttft_s: class {c!r} has no SLO (classes with one: "
                                 f"{', '.join(map(str, class_slo_ttft_s)) or 'none'})")
        checks.check_float(f"class_slo_ttft_s[{c}]", class_slo_ttft_s[c], lo=0, lo_open=True)
    return class_slo_ttft_s


def mixed_trace(n: int, short_share: float, short_prompt_tokens, long_prompt_tokens, short_max_tokens: int,
                long_max_tokens: int, rate_rps: float, seed: int = 0) -> list[dict]:
    """``n`` rows of a mixed trace (module docstring's distributions): ``offset_s`` (Poisson arrivals at
    ``rate_rps``), ``prompt_tokens``, ``output_tokens``, ``request_class`` and ``priority`` (0 interactive, 1
    background). A fixed ``seed`` gives the same trace."""
    rng = np.random.default_rng(seed)
    offs = load.arrival_offsets("poisson", n, rate_rps, seed=seed)
    rows = []
    for off in offs:
        short = bool(rng.random() < short_share)
        rows.append({"offset_s": round(float(off), 3),
                     "prompt_tokens": int(rng.choice(short_prompt_tokens if short else long_prompt_tokens)),
                     "output_tokens": int(short_max_tokens if short else long_max_tokens),
                     "request_class": "interactive" if short else "background", "priority": 0 if short else 1})
    return rows


def read_mixed_trace(path, class_slo_ttft_s: dict) -> list[dict]:
    """A mixed trace: the :func:`workbench.serving.load.read_trace` fields plus ``request_class`` (one with a
    TTFT SLO in ``class_slo_ttft_s``) and an integer ``priority`` (default 0).

    Raises:
        ParameterError: what ``read_trace`` refuses, a missing class, a class with no SLO, a bad priority (one line).
    """
    base = load.read_trace(path)
    lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    out = []
    for i, (row, obj) in enumerate(zip(base, lines), 1):
        c = obj.get("request_class")
        if not isinstance(c, str) or not c:
            raise ParameterError(f"trace: line {i}: missing field request_class")
        if c not in class_slo_ttft_s:
            raise ParameterError(f"trace: line {i}: request_class {c!r} has no SLO in class_slo_ttft_s "
                                 f"({', '.join(map(str, class_slo_ttft_s))})")
        prio = obj.get("priority", 0)
        try:
            scheduling.check_priority(prio)
        except ParameterError as exc:
            raise ParameterError(f"trace: line {i}: {exc}") from None
        out.append(dict(row, request_class=c, priority=int(prio)))
    return out


def specs_of(tokenizer, rows: list[dict]) -> list[load.RequestSpec]:
    """Request specs of trace rows: prompts of exactly ``prompt_tokens`` (chat template included), disjoint
    source windows."""
    from workbench.inputs.prompts import build_prompt

    return [load.RequestSpec(build_prompt(tokenizer, r["prompt_tokens"], offset=i * 128), r["output_tokens"],
                             r["prompt_tokens"], r["offset_s"], priority=r.get("priority", 0),
                             request_class=r["request_class"]) for i, r in enumerate(rows)]


# ----------------------------------------------------------------------------- measuring


def _engine(loaded, cfg: Config, policy: str):
    max_seq = max(cfg.long_prompt_tokens + cfg.short_prompt_tokens) + cfg.long_max_tokens + 8
    return engines_mod.make_engine(cfg.engine, loaded, cfg.max_batch_size, cfg.batch_window_s, cfg.settings(),
                                   max_seq, policy=cfg.queue(policy))


def calibrate(loaded, cfg: Config) -> dict:
    """The service alone of each class on an idle ``cfg.engine``: ``{class: seconds}`` (median e2e of two
    requests one at a time, after ``cfg.warmup`` untimed ones), and ``rate_rps``, ``load_factor / E[service]``
    over the mix."""
    from workbench.inputs.prompts import build_prompt

    eng = _engine(loaded, cfg, "fcfs")
    tok = loaded.tokenizer
    send = load.engine_sender(eng, tok, cfg.settings())
    alone = {}
    try:
        for c, p, m in (("interactive", cfg.short_prompt_tokens[0], cfg.short_max_tokens),
                        ("background", cfg.long_prompt_tokens[0], cfg.long_max_tokens)):
            spec = load.RequestSpec(build_prompt(tok, p), m, p)
            for _ in range(cfg.warmup):
                send(spec, time.perf_counter())
            alone[c] = float(np.median([send(spec, time.perf_counter())["e2e_s"] for _ in range(2)]))
    finally:
        eng.stop()
    mean = cfg.short_share * alone["interactive"] + (1 - cfg.short_share) * alone["background"]
    return {"alone_s": alone, "rate_rps": cfg.load_factor / mean}


def trace_rows(cfg: Config, rate: float) -> list[dict]:
    """The mixed workload of ``cfg``: its ``trace`` file (first ``requests_per_point`` rows) or :func:`mixed_trace`
    at ``rate`` requests/s."""
    if cfg.trace:
        return read_mixed_trace(cfg.trace, cfg.class_slo_ttft_s)[: cfg.requests_per_point]
    return mixed_trace(cfg.requests_per_point, cfg.short_share, cfg.short_prompt_tokens, cfg.long_prompt_tokens,
                       cfg.short_max_tokens, cfg.long_max_tokens, rate, cfg.seed)


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One point: the mixed workload under ``point["policy"]``, or the multi-turn conversations.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the study's config.
        point: ``{"workload", "policy", "prefix_sharing"}``.
        state: shared by the points of a run: ``calibration`` (:func:`calibrate`, measured on the first point).

    Returns:
        :class:`workbench.run.point_result.PointResult` with the request rows (module docstring) and ``extra``
        (:func:`class_columns`, the load run's summary, ``offered_rps``, ``alone_s_<class>``).
    """
    if "calibration" not in state:
        state["calibration"] = calibrate(loaded, cfg)
    cal = state["calibration"]
    if point["workload"] == "multiturn":
        return _multiturn(loaded, cfg, bool(point.get("prefix_sharing")))
    if point["workload"] == "shared_prefix":
        return _shared_prefix(loaded, cfg, bool(point.get("prefix_sharing")))
    rows_in = trace_rows(cfg, cal["rate_rps"])
    rows, res, warmup_s = run_policy(loaded, cfg, point["policy"], rows_in, cal["alone_s"])
    extra = {k: v for k, v in res.summary.items() if k not in ("wall_s", "rate", "concurrency")}
    extra.update(offered_rps=cal["rate_rps"], **{f"alone_s_{c}": v for c, v in cal["alone_s"].items()},
                 **class_columns(pd.DataFrame(rows), cfg.class_slo_ttft_s, res.summary["window_s"]))
    return PointResult(requests=rows, wall_s=res.summary["wall_s"], warmup_s=warmup_s, extra=extra)


def run_policy(loaded, cfg: Config, policy: str, rows_in: list[dict], alone_s: dict):
    """Replay the trace rows ``rows_in`` (offsets, classes, priorities) on a fresh ``cfg.engine`` under ``policy``.

    ``cfg.warmup`` x 2 of the requests run first, untimed (the service-rate estimate's first history); the
    senders honour Retry-After (``max_retries``) and ``abandon_share`` of the clients have ``patience_s``.

    Returns:
        ``(rows, load_result, warmup_s)``: :func:`request_rows` of the run, its
        :class:`~workbench.serving.load.LoadResult`, the warm-up seconds.
    """
    specs = specs_of(loaded.tokenizer, rows_in)
    if cfg.abandon_share > 0:
        specs = load.with_patience(specs, cfg.abandon_share, cfg.patience_s, cfg.seed)
    t0 = time.perf_counter()
    eng = _engine(loaded, cfg, policy)
    try:
        warm = load.engine_sender(eng, loaded.tokenizer, cfg.settings())
        for s in specs[: cfg.warmup * 2]:
            warm(dataclasses.replace(s, patience_s=None), time.perf_counter())
        warmup_s = time.perf_counter() - t0
        send = load.retrying_sender(load.engine_sender(eng, loaded.tokenizer, cfg.settings(), cfg.max_pending),
                                    cfg.max_retries)
        res = load.run_load(send, specs, "replay", max_wait_s=cfg.max_wait_s)
    finally:
        eng.stop()
    return request_rows(res.rows, rows_in, alone_s), res, warmup_s


def request_rows(rows: list[dict], trace_rows: list[dict], alone_s: dict) -> list[dict]:
    """The load rows with their trace fields (``request_class``, ``priority``, ``max_tokens``), ``slowdown``
    (``e2e_s`` over the class's service alone) and ``eta_error_s`` (``eta_s - queue_s``); bookkeeping stamps
    dropped."""
    out = []
    for r in rows:
        t = trace_rows[r["request_id"]]
        r = {k: v for k, v in r.items() if k not in ("t_scheduled", "t_sent", "t_done", "t_headers", "t_sent_last")}
        r["engine_batch"] = r.pop("batch_size", None)
        a = alone_s.get(t["request_class"], float("nan"))
        e2e, q, eta = r.get("e2e_s"), r.get("queue_s"), r.get("eta_s")
        r.update(request_class=t["request_class"], priority=t.get("priority", 0), max_tokens=t["output_tokens"],
                 max_new_tokens=t["output_tokens"], context_tokens=t["prompt_tokens"], temperature=0.0,
                 slowdown=e2e / a if e2e is not None and a and a == a and not r.get("error") else float("nan"),
                 eta_error_s=(eta - q) if eta is not None and q is not None else float("nan"))
        out.append(r)
    return out


def class_columns(rows: pd.DataFrame, class_slo_ttft_s: dict, window_s: float) -> dict:
    """A point's per-class columns: ``ttft_s_p50_<c>``, ``ttft_s_p90_<c>``, ``queue_s_p50_<c>``, ``queue_s_p90_<c>``,
    ``e2e_s_p50_<c>``, ``requests_<c>``, ``slo_attainment_<c>`` and ``goodput_rps_<c>`` (the class's TTFT SLO,
    :func:`workbench.stats.slo.evaluate` over its rows and the window); and ``queue_s_max`` (the longest wait),
    ``eta_abs_error_s_p50``, ``abandoned`` and ``retried`` over all rows."""
    out = {}
    for c, g in rows.groupby("request_class") if not rows.empty else []:
        for col in ("ttft_s", "queue_s"):
            for k, v in metrics.percentiles(g[col], (50, 90)).items():
                out[f"{col}_{k}_{c}"] = v
        out[f"e2e_s_p50_{c}"] = metrics.percentiles(g["e2e_s"], (50,))["p50"]
        out[f"requests_{c}"] = int(len(g))
        if c in class_slo_ttft_s:
            ev = slo.evaluate(g, slo.get("custom", class_slo_ttft_s[c], None), window_s, len(g))
            out[f"slo_attainment_{c}"], out[f"goodput_rps_{c}"] = ev["slo_attainment"], ev["goodput_rps"]
    q = pd.to_numeric(rows.get("queue_s", pd.Series(dtype=float)), errors="coerce")
    err = pd.to_numeric(rows.get("eta_error_s", pd.Series(dtype=float)), errors="coerce").abs()
    out.update(queue_s_max=float(q.max()) if q.notna().any() else float("nan"),
               eta_abs_error_s_p50=metrics.percentiles(err, (50,))["p50"],
               abandoned=int(rows.get("abandoned", pd.Series(dtype=bool)).fillna(False).astype(bool).sum()),
               retried=int((pd.to_numeric(rows.get("retries", pd.Series(dtype=float)), errors="coerce") > 0).sum()))
    return out


def _prefix_engine(loaded, cfg: Config, prefix_sharing: bool, max_seq_tokens: int):
    """The engine of the multi-turn and shared-prefix points: with prefix sharing in ``multiturn_prefix_sharing`` the
    ``continuous`` engine with its prefix cache on / off (the same engine both ways, so only the cache differs);
    otherwise ``cfg.engine`` under ``fcfs``."""
    if any(cfg.multiturn_prefix_sharing):
        return engines_mod.make_engine("continuous", loaded, cfg.max_batch_size, cfg.batch_window_s, cfg.settings(),
                                       max_seq_tokens, prefix_sharing=prefix_sharing)
    return _engine(loaded, cfg, "fcfs")


def _prime_engine(send, tokenizer, cfg: Config) -> None:
    """``cfg.warmup`` untimed requests that share no cache page with the measured ones (a system message and a
    source window of their own), so a fresh engine's first-call costs stay out of the first turn."""
    from workbench.inputs.prompts import build_prompt

    for i in range(cfg.warmup):
        user = build_prompt(tokenizer, cfg.short_prompt_tokens[0], offset=20_000 + 128 * i, chat=False)
        send(load.RequestSpec([{"role": "system", "content": "Warm-up."}, {"role": "user", "content": user}],
                              cfg.short_max_tokens), time.perf_counter())


def _turn_row(row: dict, cfg: Config, conversation: int, turn: int) -> dict:
    """A multi-turn or shared-prefix row: the engine sender's figures (bookkeeping stamps dropped) with its
    ``conversation`` and ``turn`` (the pairing key between prefix sharing on and off)."""
    out = dict({k: v for k, v in row.items() if k not in ("t_sent", "t_done", "t_headers")},
               conversation=conversation, turn=turn, request_class="interactive", priority=0,
               max_tokens=cfg.short_max_tokens, max_new_tokens=cfg.short_max_tokens, temperature=0.0,
               context_tokens=row.get("prompt_tokens"))
    out["engine_batch"] = out.pop("batch_size", None)
    return out


def _multiturn(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """``conversations`` conversations at once, ``turns`` turns each: turn ``k`` sends the whole history (each
    earlier user message and a fixed assistant reply of ``short_max_tokens`` words), so its prompt grows turn
    by turn. Rows: ``conversation``, ``turn`` (from 1), the engine sender's figures."""
    from workbench.inputs.prompts import build_prompt

    tok = loaded.tokenizer
    ctx = (max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 16) * (cfg.turns + 1) + cfg.shared_prefix_tokens + 64
    eng = _prefix_engine(loaded, cfg, prefix_sharing, ctx)
    rows, lock = [], threading.Lock()
    send = load.engine_sender(eng, tok, cfg.settings())
    reply = " ".join(["ok"] * cfg.short_max_tokens)
    shared = build_prompt(tok, cfg.shared_prefix_tokens, offset=10_000, chat=False) if cfg.shared_prefix_tokens else ""

    def talk(conv):
        history = [{"role": "system", "content": shared}] if shared else []
        for turn in range(1, cfg.turns + 1):
            user = build_prompt(tok, cfg.short_prompt_tokens[0], offset=(conv * cfg.turns + turn) * 128, chat=False)
            history.append({"role": "user", "content": user})
            row = send(load.RequestSpec(list(history), cfg.short_max_tokens), time.perf_counter())
            history.append({"role": "assistant", "content": reply})
            with lock:
                rows.append(_turn_row(row, cfg, conv, turn))

    try:
        t = time.perf_counter()
        _prime_engine(send, tok, cfg)
        t0 = time.perf_counter()
        warmup_s = t0 - t
        threads = [threading.Thread(target=talk, args=(c,), daemon=True) for c in range(cfg.conversations)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=cfg.max_wait_s * cfg.turns)
    finally:
        eng.stop()
    wall = time.perf_counter() - t0
    extra = {"profile": "multiturn", "stopped_early": False, "offered_rps": float("nan"),
             **cache_columns(pd.DataFrame(rows), prefix_sharing)}
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s if cfg.warmup else None, extra=extra)


def _shared_prefix(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """A shared-prefix group: ``prefix_group_requests`` requests, one after another (each sent when the previous
    one ended: a closed loop, so a request's prefix pages are complete before the next one looks for them), each
    opening with the same system document of ``shared_prefix_tokens`` tokens and asking its own question of
    ``short_prompt_tokens[0]`` tokens (many users of one system prompt or one document). Rows: ``conversation``
    (the request's index) and ``turn`` 1, the engine sender's figures."""
    from workbench.inputs.prompts import build_prompt

    tok = loaded.tokenizer
    eng = _prefix_engine(loaded, cfg, prefix_sharing,
                         cfg.shared_prefix_tokens + max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 64)
    doc = build_prompt(tok, cfg.shared_prefix_tokens, offset=10_000, chat=False)
    send = load.engine_sender(eng, tok, cfg.settings())
    rows = []
    try:
        t = time.perf_counter()
        _prime_engine(send, tok, cfg)
        t0 = time.perf_counter()
        warmup_s = t0 - t
        for i in range(cfg.prefix_group_requests):
            user = build_prompt(tok, cfg.short_prompt_tokens[0], offset=30_000 + 128 * i, chat=False)
            spec = load.RequestSpec([{"role": "system", "content": doc}, {"role": "user", "content": user}],
                                    cfg.short_max_tokens)
            rows.append(_turn_row(send(spec, time.perf_counter()), cfg, i, 1))
    finally:
        eng.stop()
    extra = {"profile": "shared_prefix", "stopped_early": False, "offered_rps": float("nan"),
             **cache_columns(pd.DataFrame(rows), prefix_sharing)}
    return PointResult(requests=rows, wall_s=time.perf_counter() - t0, warmup_s=warmup_s if cfg.warmup else None,
                       extra=extra)


def cache_columns(rows: pd.DataFrame, prefix_sharing: bool) -> dict:
    """``cache_hit_rate`` (prompt tokens served from the prefix cache over all prompt tokens of the rows, from their
    ``cached_tokens``) and ``cache_note``; NaN with the reason when the engine does not report cached tokens."""
    cached = pd.to_numeric(rows.get("cached_tokens", pd.Series(dtype=float)), errors="coerce")
    prompt = pd.to_numeric(rows.get("prompt_tokens", pd.Series(dtype=float)), errors="coerce")
    if not cached.notna().any() or not prompt.sum() > 0:
        return {"cache_hit_rate": float("nan"), "prefix_sharing": prefix_sharing,
                "cache_note": "not available: the engine reports no cached_tokens"}
    return {"cache_hit_rate": float(cached.fillna(0).sum() / prompt.sum()), "prefix_sharing": prefix_sharing,
            "cache_note": "prefix sharing on" if prefix_sharing else "prefix sharing off"}


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every point of ``cfg.grid()`` (:func:`workbench.run.sweeps.run_sweep`); the points DataFrame."""
    state: dict = {}
    return sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_point(loaded, cfg, p, state),
                            resume=resume, slo_ttft_s=cfg.class_slo_ttft_s.get("interactive"), info=loaded.info,
                            loaded=loaded, config=cfg)


# ----------------------------------------------------------------------------- tables


def class_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per policy and class of the ``mixed`` rows: ``requests``, ``ttft_s_p50``, ``ttft_s_p90``, ``queue_s_p50``,
    ``queue_s_p90``, ``e2e_s_p50`` and ``queue_s_max`` (failed and abandoned rows left out of the latencies)."""
    df = _mixed(requests)
    out = []
    for (p, c), g in df.groupby(["policy", "request_class"]):
        ok = g[g["error"].isna() & (pd.to_numeric(g["output_tokens"], errors="coerce") >= 1)]
        row = {"policy": p, "request_class": c, "requests": int(len(g))}
        for col in ("ttft_s", "queue_s"):
            row.update({f"{col}_{k}": v for k, v in metrics.percentiles(ok[col], (50, 90)).items()})
        row["e2e_s_p50"] = metrics.percentiles(ok["e2e_s"], (50,))["p50"]
        row["queue_s_max"] = float(pd.to_numeric(g["queue_s"], errors="coerce").max())
        out.append(row)
    return pd.DataFrame(out)


def bucket_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per policy and length bucket (``max_tokens``) of the ``mixed`` rows: ``requests``, ``slowdown_p50`` and
    ``slowdown_p90``."""
    df = _mixed(requests)
    out = []
    for (p, m), g in df.groupby(["policy", "max_tokens"]):
        row = {"policy": p, "max_tokens": int(m), "requests": int(len(g))}
        row.update({f"slowdown_{k}": v for k, v in metrics.percentiles(g["slowdown"], (50, 90)).items()})
        out.append(row)
    return pd.DataFrame(out)


def _mixed(requests: pd.DataFrame) -> pd.DataFrame:
    if requests is None or requests.empty or "workload" not in requests:
        return pd.DataFrame(columns=["policy", "request_class", "max_tokens", "ttft_s", "queue_s", "e2e_s",
                                     "slowdown", "error", "output_tokens", "request_id"])
    return requests[requests["workload"] == "mixed"]


def _served(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that produced at least one token without error (failed and abandoned ones left out)."""
    err = rows["error"].isna() if "error" in rows else pd.Series(True, index=rows.index)
    return rows[err & (pd.to_numeric(rows.get("output_tokens"), errors="coerce") >= 1)]


def prefix_savings(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What prefix sharing saved, per prefix workload (``multiturn``, ``shared_prefix``) measured with sharing off
    and on (usable points only: :func:`workbench.stats.evidence.usable_points`).

    Requests are paired across the two points by ``conversation`` and ``turn`` (the same prompt both ways); failed
    and abandoned ones are left out.

    Returns:
        One row per workload: ``workload``, ``pairs``, ``cache_hit_rate_off`` / ``cache_hit_rate_on`` (cached over
        prompt tokens of the paired requests, :func:`cache_columns`), ``ttft_s_p50_off`` / ``ttft_s_p50_on``,
        ``ttft_saved_s`` (the mean of the paired differences TTFT off - on, seconds) with ``ttft_saved_s_low`` /
        ``ttft_saved_s_high`` (Student-t 95% interval over the pairs, :func:`workbench.stats.evidence.t_interval`; the
        pairs of one run share an engine, so it is a guide) and ``method``, and ``verdict``: ``saves`` / ``costs``
        when the interval excludes 0, ``not supported: the interval straddles 0`` when it does not, ``not
        supported: <reason>`` without an interval. Empty when no workload has both sides.
    """
    cols = ["workload", "pairs", "cache_hit_rate_off", "cache_hit_rate_on", "ttft_s_p50_off", "ttft_s_p50_on",
            "ttft_saved_s", "ttft_saved_s_low", "ttft_saved_s_high", "method", "verdict"]
    if points is None or points.empty or requests is None or requests.empty or "workload" not in requests:
        return pd.DataFrame(columns=cols)
    use = evidence.usable_points(points)
    req = requests[requests["point_id"].isin(use.get("point_id", [])) & requests["workload"].isin(PREFIX_WORKLOADS)]
    out = []
    for w, g in _served(req).groupby("workload", sort=False):
        share = g["prefix_sharing"].fillna(False).astype(bool)
        on, off = (g[share].set_index(["conversation", "turn"]), g[~share].set_index(["conversation", "turn"]))
        both = on.index.intersection(off.index)
        if not len(both):
            continue
        on, off = on.loc[both], off.loc[both]
        diff = (pd.to_numeric(off["ttft_s"], errors="coerce").to_numpy()
                - pd.to_numeric(on["ttft_s"], errors="coerce").to_numpy())
        iv = evidence.t_interval(diff, unit="request pairs")
        verdict = evidence.difference_verdict(iv)
        word = {"higher": "saves", "lower": "costs",
                "no difference beyond noise": "not supported: the interval straddles 0"}.get(
                    verdict, f"not supported: {iv.reason or 'no interval'}")
        out.append({"workload": w, "pairs": int(len(both)),
                    "cache_hit_rate_off": cache_columns(off.reset_index(), False)["cache_hit_rate"],
                    "cache_hit_rate_on": cache_columns(on.reset_index(), True)["cache_hit_rate"],
                    "ttft_s_p50_off": metrics.percentiles(off["ttft_s"], (50,))["p50"],
                    "ttft_s_p50_on": metrics.percentiles(on["ttft_s"], (50,))["p50"],
                    "ttft_saved_s": iv.estimate, "ttft_saved_s_low": iv.low, "ttft_saved_s_high": iv.high,
                    "method": iv.method, "verdict": word})
    return pd.DataFrame(out, columns=cols)


def prefix_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding | None:
    """The prefix-sharing part of the finding: per workload the cache hit rate next to the TTFT it saved, with its
    interval and the number of request pairs, "not supported" where the interval straddles 0 (:func:`prefix_savings`);
    "not supported" when sharing was measured off and on but no such pair of points is usable (invalid points);
    None when no workload was measured both ways."""
    sav = prefix_savings(points, requests)
    if sav.empty:
        if not _measured_both_ways(points):
            return None
        return evidence.Finding("Prefix sharing: not supported: no usable pair of points with sharing off and on.",
                                "the prefix points are invalid or failed", False, ())
    parts = []
    for r in sav.itertuples():
        iv = evidence.Interval(r.ttft_saved_s, r.ttft_saved_s_low, r.ttft_saved_s_high, r.pairs, r.method)
        hit = "n/a" if r.cache_hit_rate_on != r.cache_hit_rate_on else f"{r.cache_hit_rate_on:.0%}"
        tail = "" if r.verdict in ("saves", "costs") else f": {r.verdict}"
        parts.append(f"{r.workload.replace('_', '-')}: cache hit rate {hit} with sharing on, TTFT saved per request "
                     f"{iv.describe('{:+.3f}', ' s')}{tail}")
    use = evidence.usable_points(points)
    ids = evidence.point_ids(use[use.get("workload", pd.Series(dtype=str)).isin(PREFIX_WORKLOADS)])
    return evidence.Finding("Prefix sharing (continuous engine, on vs off, paired by request): "
                            + "; ".join(parts) + ".",
                            ", ".join(f"{r.workload}: {r.pairs} request pairs" for r in sav.itertuples()),
                            bool(sav["verdict"].isin(["saves", "costs"]).any()), ids)


def paired_ratio(requests: pd.DataFrame, policy: str, column: str, request_class: str,
                 base: str = "fcfs") -> evidence.Interval:
    """``column`` under ``policy`` over ``base`` for the class's requests, matched by ``request_id`` (the same
    request at the same arrival time): :func:`workbench.stats.evidence.paired_ratio_interval`. Requests within one run
    share the engine, so they are not fully independent: the interval is a guide, the method says so."""
    df = _mixed(requests)
    df = df[df["request_class"] == request_class]
    a = df[df["policy"] == policy].set_index("request_id")[column]
    b = df[df["policy"] == base].set_index("request_id")[column]
    both = a.index.intersection(b.index)
    return evidence.paired_ratio_interval(a.loc[both], b.loc[both], unit="requests of one run (not independent)")


def recommend(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The closing table: per policy the interactive TTFT p90 and the background e2e p50 as ratios over
    ``fcfs`` (paired by request), the longest wait, and a verdict: a policy is recommended for the mixed
    workload when its interactive TTFT interval is below 1 (it helps the short requests); its cost is the
    background e2e ratio. Usable points only (:func:`workbench.stats.evidence.usable_points`, serving rules)."""
    use = evidence.usable_points(points, serving=True)
    use = use[use.get("workload", pd.Series(dtype=str)) == "mixed"] if not use.empty else use
    ok = requests[requests["point_id"].isin(use["point_id"])] if not use.empty else requests.iloc[0:0]
    summ = class_summary(ok)
    out = []
    for p in [p for p in use.get("policy", []) if p != "fcfs"]:
        short = paired_ratio(ok, p, "ttft_s", "interactive")
        long = paired_ratio(ok, p, "e2e_s", "background")
        s = summ[(summ["policy"] == p) & (summ["request_class"] == "interactive")]
        f = summ[(summ["policy"] == "fcfs") & (summ["request_class"] == "interactive")]
        p90 = float(s["ttft_s_p90"].iloc[0] / f["ttft_s_p90"].iloc[0]) if len(s) and len(f) else float("nan")
        verdict = evidence.ratio_verdict(short)
        out.append({"policy": p, "interactive_ttft_p90_ratio": p90, "interactive_ttft_ratio": short.estimate,
                    "interactive_ttft_ratio_low": short.low, "interactive_ttft_ratio_high": short.high,
                    "background_e2e_ratio": long.estimate, "background_e2e_ratio_low": long.low,
                    "background_e2e_ratio_high": long.high,
                    "queue_s_max": float(summ[summ["policy"] == p]["queue_s_max"].max()) if len(summ) else float("nan"),
                    "recommended": verdict == "lower", "verdict": evidence.effect_word(verdict, False)})
    return pd.DataFrame(out)


def finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding:
    """The headline: which policy helps the interactive requests' TTFT over ``fcfs`` (paired ratio with its
    interval) and what it costs the background requests' e2e, "not supported" where no interval excludes 1; then,
    where sharing was measured off and on, what prefix sharing saved (:func:`prefix_finding`)."""
    main = _policy_finding(points, requests)
    prefix = prefix_finding(points, requests)
    return main if prefix is None else evidence.join([main, prefix])


def _policy_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding:
    rec = recommend(points, requests)
    use = evidence.usable_points(points, serving=True)
    ids = evidence.point_ids(use)
    if rec.empty:
        return evidence.Finding("Scheduling: not supported: no usable fcfs and policy points to compare.",
                                f"{len(use)} usable points", False, ids)
    parts, ev = [], []
    for r in rec.itertuples():
        short = evidence.Interval(r.interactive_ttft_ratio, r.interactive_ttft_ratio_low,
                                  r.interactive_ttft_ratio_high, 0, "paired t on log ratios")
        long = evidence.Interval(r.background_e2e_ratio, r.background_e2e_ratio_low, r.background_e2e_ratio_high,
                                 0, "paired t on log ratios")
        parts.append(f"{r.policy}: {evidence.describe_ratio(short, 'interactive TTFT vs fcfs')}; "
                     f"{evidence.describe_ratio(long, 'background e2e vs fcfs')}")
        ev.append(f"{r.policy}: longest wait {r.queue_s_max:.2f} s")
    best = rec[rec["recommended"]].sort_values("interactive_ttft_ratio")
    lead = (f"For interactive traffic mixed with long reports, {best.iloc[0]['policy']} lowers the short requests' "
            f"TTFT (x{best.iloc[0]['interactive_ttft_ratio']:.2f} of fcfs) at x{best.iloc[0]['background_e2e_ratio']:.2f} "
            "background e2e." if not best.empty else
            "Scheduling: not supported: no policy's interactive TTFT interval is below fcfs here.")
    n = int(len(requests[requests["point_id"].isin(use["point_id"])])) if "point_id" in requests else 0
    return evidence.Finding(lead + " " + "; ".join(parts) + ".",
                            f"{len(use)} usable points, {n} requests (paired by request across policies); "
                            + "; ".join(ev), not best.empty, ids)


# ----------------------------------------------------------------------------- figures


def _policy_colours():
    import plotly.express as px

    return dict(zip(scheduling.POLICIES, px.colors.qualitative.Safe))


def class_latency(requests: pd.DataFrame) -> go.Figure:
    """TTFT p50 / p90 and queue time p50 per class (panels) and policy (bars)."""
    summ = class_summary(requests)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT p50", "TTFT p90", "queue time p50"))
    col = _policy_colours()
    for p, g in summ.groupby("policy", sort=False):
        for i, c in enumerate(("ttft_s_p50", "ttft_s_p90", "queue_s_p50"), 1):
            fig.add_trace(go.Bar(x=g["request_class"], y=g[c], name=p, marker_color=col.get(p), showlegend=i == 1,
                                 legendgroup=p), row=1, col=i)
    fig.update_yaxes(title_text="seconds")
    fig.update_layout(barmode="group", title="Latency per class and policy (mixed workload)")
    return fig


def slowdown_vs_length(requests: pd.DataFrame) -> go.Figure:
    """Median slowdown (e2e over the service alone) per output-length bucket, one line per policy."""
    b = bucket_summary(requests)
    fig = go.Figure()
    col = _policy_colours()
    for p, g in b.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(x=g["max_tokens"], y=g["slowdown_p50"], mode="lines+markers", name=p,
                                 line=dict(color=col.get(p))))
    fig.update_layout(title="Slowdown vs request length (1 = as fast as alone)", xaxis_title="output tokens",
                      yaxis_title="slowdown p50 (e2e / service alone)")
    return fig


def longest_wait(points: pd.DataFrame) -> go.Figure:
    """The longest queue wait per policy (starvation)."""
    df = ok_points(points)
    df = df[df.get("workload", pd.Series(dtype=str)) == "mixed"] if not df.empty else df
    fig = go.Figure(go.Bar(x=df.get("policy", []), y=df.get("queue_s_max", []),
                           marker_color=[_policy_colours().get(p) for p in df.get("policy", [])]))
    fig.update_layout(title="Longest wait in the queue per policy", yaxis_title="queue time max (s)")
    return fig


def eta_error(requests: pd.DataFrame) -> go.Figure:
    """The ETA told at arrival against the actual wait, per policy (the diagonal: an exact ETA)."""
    df = _mixed(requests)
    fig = go.Figure()
    col = _policy_colours()
    for p, g in df.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(x=g["queue_s"], y=g.get("eta_s"), mode="markers", name=p, marker_color=col.get(p)))
    hi = float(pd.to_numeric(df.get("queue_s", pd.Series(dtype=float)), errors="coerce").max() or 1.0) if len(df) else 1.0
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="exact", line=dict(color="grey", dash="dot")))
    fig.update_layout(title="ETA told at arrival vs actual wait", xaxis_title="actual queue time (s)",
                      yaxis_title="ETA at arrival (s)")
    return fig


def goodput_per_class(points: pd.DataFrame) -> go.Figure:
    """Goodput per class under the class's TTFT SLO, per policy."""
    df = ok_points(points)
    df = df[df.get("workload", pd.Series(dtype=str)) == "mixed"] if not df.empty else df
    fig = go.Figure()
    col = _policy_colours()
    for r in df.itertuples():
        ys = [getattr(r, f"goodput_rps_{c}", float("nan")) for c in CLASSES]
        fig.add_trace(go.Bar(x=list(CLASSES), y=ys, name=r.policy, marker_color=col.get(r.policy)))
    fig.update_layout(barmode="group", title="Goodput per class under its TTFT SLO", yaxis_title="goodput (requests/s)")
    return fig


def ttft_by_turn(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """TTFT p50 by turn index of the multi-turn conversations (the prompt grows with the history), one line per
    prefix-sharing setting, its cache hit rate in the legend ("n/a" where the engine reports none)."""
    df = requests[requests.get("workload", pd.Series(dtype=str)) == "multiturn"] if not requests.empty else requests
    fig = go.Figure()
    hit = {}
    if not points.empty and "cache_hit_rate" in points and "prefix_sharing" in points:
        hit = {bool(r.prefix_sharing): r.cache_hit_rate for r in points.itertuples() if r.workload == "multiturn"}
    if not df.empty and "turn" in df:
        share = df["prefix_sharing"].fillna(False).astype(bool) if "prefix_sharing" in df else pd.Series(False, df.index)
        for v, g in df.groupby(share):
            med = g.groupby("turn")["ttft_s"].median()
            h = hit.get(bool(v), float("nan"))
            name = f"prefix sharing {'on' if v else 'off'} (hit rate {'n/a' if h != h else f'{h:.0%}'})"
            fig.add_trace(go.Scatter(x=med.index, y=med.values, mode="lines+markers", name=name))
    fig.update_layout(title="Multi-turn: TTFT by turn", xaxis_title="turn", yaxis_title="TTFT p50 (s)",
                      xaxis=dict(dtick=1, tick0=1))  # turns are whole numbers
    return fig


def _measured_both_ways(points: pd.DataFrame) -> bool:
    """Whether some prefix workload has points with sharing off and on (usable or not)."""
    if points is None or points.empty or not {"workload", "prefix_sharing"} <= set(points.columns):
        return False
    pre = points[points["workload"].isin(PREFIX_WORKLOADS)]
    return any(g["prefix_sharing"].fillna(False).astype(bool).nunique() == 2 for _, g in pre.groupby("workload"))


def prefix_cache_savings(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Cache hit rate with prefix sharing on against the TTFT it saved per request (off - on, paired; the bar is the
    95% interval), one marker per prefix workload, its verdict and pairs in the label (:func:`prefix_savings`)."""
    sav = prefix_savings(points, requests)
    fig = go.Figure()
    for r in sav.itertuples():
        shown = r.ttft_saved_s_low == r.ttft_saved_s_low
        fig.add_trace(go.Scatter(
            x=[r.cache_hit_rate_on], y=[r.ttft_saved_s], mode="markers+text", text=[r.verdict],
            textposition="top center",
            name=f"{r.workload} ({r.pairs} pairs)",
            error_y=dict(type="data", symmetric=False, array=[r.ttft_saved_s_high - r.ttft_saved_s if shown else 0],
                         arrayminus=[r.ttft_saved_s - r.ttft_saved_s_low if shown else 0])))
    fig.add_hline(y=0, line=dict(color="grey", dash="dot"))
    if sav.empty:
        fig.add_annotation(text="no usable pair of points with sharing off and on" if _measured_both_ways(points)
                           else "prefix sharing was not measured both ways", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=0.5)
    fig.update_layout(title="Prefix sharing: cache hit rate vs TTFT saved (sharing on vs off, paired by request)",
                      xaxis_title="cache hit rate with sharing on (cached / prompt tokens)",
                      yaxis_title="TTFT saved per request (s, off - on)", xaxis=dict(tickformat=".0%", range=[0, 1.02]))  # the whole 0-100% scale
    return fig


def recommendation_table(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """The :func:`recommend` table as a figure."""
    rec = recommend(points, requests)
    cols = list(rec.columns) if not rec.empty else ["policy"]
    cells = [rec[c].map(lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)) for c in cols] if not rec.empty else [[]]
    fig = go.Figure(go.Table(header=dict(values=cols), cells=dict(values=cells)))
    fig.update_layout(title="Policy per workload: interactive TTFT and its cost to background requests (vs fcfs)")
    return fig


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame) -> dict[str, go.Figure]:
    """All figures of the scheduling notebook, by file name."""
    return {
        "sched_class_latency": class_latency(requests),
        "sched_slowdown_vs_length": slowdown_vs_length(requests),
        "sched_longest_wait": longest_wait(points),
        "sched_eta_error": eta_error(requests),
        "sched_goodput_per_class": goodput_per_class(points),
        "sched_ttft_by_turn": ttft_by_turn(points, requests),
        "sched_prefix_savings": prefix_cache_savings(points, requests),
        "sched_recommendation": recommendation_table(points, requests),
    }
