"""Experiment 11: scheduling policies and what a waiting user sees (notebook ``11_scheduling``; issue 24,
docs/design.md section 7 item 11).

**Workload** (:func:`workbench.load.traces.mixed_trace`, or a JSONL trace with
:func:`workbench.load.traces.read_mixed_trace`): a mix of interactive short
chats and background long reports. Stated distributions: each request is ``interactive`` with probability
``short_share`` (else ``background``); its prompt length is drawn uniformly from the class's
``*_prompt_tokens`` list; its output is fixed at the class's ``*_max_tokens`` (greedy, ``ignore_eos``);
interactive requests have priority 0, background ones priority 1; arrivals are a Poisson process (exponential
gaps, :func:`workbench.load.load.arrival_offsets`) at ``load_factor`` times the engine's one-at-a-time
capacity on this mix (``1 / E[service alone]``, the service alone of each class measured once per run on an
idle engine: :func:`calibrate`). Every policy replays the same requests at the same times.

**The run is the unit** (issue 32): under a queue one request's delay carries into every later request of the run,
so requests paired across two runs are not independent samples (an A/A of the same trace twice claimed a direction
in 22-80% of simulated designs: ``benchmarks/aa_queue.py``). With ``rounds`` > 1 every arm runs once per round on
arrival seed ``seed + k`` with a fresh engine (the arm order rotated by round), one statistic is taken per run
(:func:`run_statistics`: the interactive class's TTFT p90, the background class's e2e p50) and runs are paired by
round (:func:`workbench.stats.replicates.compare_runs`, :func:`workbench.stats.replicates.paired_log_ratio`); a best-of-m choice uses Bonferroni
intervals over the m policies. ``aa_control`` runs ``fcfs`` a second time per round (:data:`AA_ARM`): its ratio
interval (:func:`aa_control`: ``aa_ratio``, ``aa_low``, ``aa_high``, ``design``, ``rounds``) is the noise floor, and
when it moved no policy is recommended. One round: "one run: not supported". A share ``abandon_share`` of clients gives up when no token came ``patience_s`` after arrival
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
``EngineOptions(prefix_sharing=...)``), and :func:`prefix_savings` puts the cache hit rate (cached over prompt
tokens, from the rows' ``cached_tokens``) next to the TTFT it saved (the run TTFT p50 off and on, runs paired by
round, with its interval; "not supported" when the interval straddles 1, "one run" with one round); without it the
hit rate is NaN, "not available".

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
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.stats import evidence, metrics, replicates
from workbench.stats.replicates import compare_runs
from workbench.run import sweeps
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings
from workbench.share.plots import split_by_device, table_figure
from workbench.run.point_result import PointResult
from workbench.serving import engine_kinds, options, scheduling
from workbench.load import senders
from workbench.load.conversations import multiturn, shared_prefix_group
from workbench.load.traces import calibrate, check_class_slos, policy_engine, read_mixed_trace, run_policy, trace_rows
from workbench.share.figures_serving import (class_latency, eta_error, goodput_per_class, longest_wait,
                                             prefix_savings_figure, slowdown_vs_length, ttft_by_turn)
from workbench.stats.classes import (CLASSES, bucket_summary, cache_columns, class_columns, class_summary,
                                     mixed_rows, served_rows, sharing_savings)

EXPERIMENT = "scheduling"
AA_ARM = "fcfs_aa"           # the A/A control's second fcfs arm
DESIGN = "replicates"        # one run per arm and arrival seed, paired by seed (docs/design.md section 10)
PREFIX_WORKLOADS = ("multiturn", "shared_prefix")
#: the engines that can apply every policy (:func:`workbench.serving.options.engines_taking`)
ENGINES = options.engines_taking("sjf")
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
        trace: a mixed trace JSONL (:func:`workbench.load.traces.read_mixed_trace`); empty: generated
            (:func:`workbench.load.traces.mixed_trace`).
        max_wait_s: over-saturation stop rule (seconds a request may be in flight).
        engine_options, policy_options: any other field of :class:`workbench.serving.options.EngineOptions` /
            :class:`~workbench.serving.options.PolicyOptions` (a field with a parameter of its own here is refused).
        rounds: replicate runs per arm (>= 1): round ``k`` replays the trace of arrival seed ``seed + k`` under every
            arm (a fresh engine each, the arm order rotated by round), and the prefix points run once per round;
            comparisons pair runs by round (:mod:`workbench.stats.replicates`). 1: "one run: not supported".
        aa_control: run the baseline ``fcfs`` twice per round (arm :data:`AA_ARM`, the same seeds): the A/A control,
            whose ratio interval is the experiment's noise floor (``aa_ratio``, ``aa_low``, ``aa_high``).
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
    engine_options: dict = dataclasses.field(default_factory=dict)
    policy_options: dict = dataclasses.field(default_factory=dict)
    rounds: int = 1
    aa_control: bool = False

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
        self.policy_options_for("fcfs").make_queue(self.engine_options_for(self.engine))  # the options' one-line errors
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
                                 "(EngineOptions.prefix_sharing); use [false]")
        checks.check_float("max_wait_s", self.max_wait_s, lo=0, lo_open=True)
        checks.check_int("rounds", self.rounds, lo=1)
        checks.check_bool("aa_control", self.aa_control)
        if self.trace:
            read_mixed_trace(self.trace, self.class_slo_ttft_s)

    def settings(self) -> GenerationSettings:
        """Every request: greedy, fixed length (its class's ``max_tokens``)."""
        return GenerationSettings(max_new_tokens=self.long_max_tokens, ignore_eos=True, seed=self.seed)

    def arms(self) -> list[str]:
        """The mixed workload's arms: the policies, then :data:`AA_ARM` (``fcfs`` again) with ``aa_control``."""
        return list(self.policies) + ([AA_ARM] if self.aa_control else [])

    def grid(self) -> list[dict]:
        """Per round ``k`` (``replicate``): one ``mixed`` point per arm (the order rotated by ``k``), then one
        ``multiturn`` point (``fcfs``) per ``multiturn_prefix_sharing`` value when ``turns`` > 0, then one
        ``shared_prefix`` point per value when ``prefix_group_requests`` > 0 (their order reversed in odd rounds)."""
        pts = []
        arms = self.arms()
        for k in range(self.rounds):
            r = k % len(arms)
            pts += [{"workload": "mixed", "policy": _policy_of(a), "prefix_sharing": False, "replicate": k, "arm": a}
                    for a in arms[r:] + arms[:r]]
            values = list(self.multiturn_prefix_sharing)[:: -1 if k % 2 else 1]
            for workload, on in (("multiturn", self.turns > 0), ("shared_prefix", self.prefix_group_requests > 0)):
                pts += [{"workload": workload, "policy": "fcfs", "prefix_sharing": bool(v), "replicate": k,
                         "arm": "on" if v else "off"} for v in values] if on else []
        return pts

    def engine_options_for(self, engine: str, **fixed) -> options.EngineOptions:
        """The engine's options: ``engine_options`` with this notebook's own engine fields."""
        return options.from_mapping(options.EngineOptions, self.engine_options, "engine_options", engine=engine,
                                    max_batch_size=self.max_batch_size, batch_window_s=self.batch_window_s, **fixed)

    def policy_options_for(self, policy: str) -> options.PolicyOptions:
        """The queue's options: ``policy_options`` with this notebook's own policy fields."""
        return options.from_mapping(options.PolicyOptions, self.policy_options, "policy_options", policy=policy,
                                    aging_s=self.aging_s, lane_threshold_tokens=self.lane_threshold_tokens,
                                    long_cap=self.long_cap, predictor=self.sjf_predictor)

    def queue(self, policy: str) -> scheduling.PolicyQueue:
        return self.policy_options_for(policy).make_queue(self.engine_options_for(self.engine))


def _policy_of(arm: str) -> str:
    """The policy an arm runs (:data:`AA_ARM` runs ``fcfs``)."""
    return "fcfs" if arm == AA_ARM else arm


# ----------------------------------------------------------------------------- workloads


def prefix_sharing_available() -> bool:
    """Whether the engine options have the ``continuous`` engine's ``prefix_sharing`` switch
    (:class:`workbench.serving.options.EngineOptions`; added by issue 23's prefix sharing)."""
    return "prefix_sharing" in {f.name for f in dataclasses.fields(options.EngineOptions)}


# ----------------------------------------------------------------------------- measuring


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
    rows_in = trace_rows(cfg, cal["rate_rps"], int(point.get("replicate", 0)))
    rows, res, warmup_s = run_policy(loaded, cfg, point["policy"], rows_in, cal["alone_s"])
    extra = {k: v for k, v in res.summary.items() if k not in ("wall_s", "rate", "concurrency")}
    extra.update(offered_rps=cal["rate_rps"], **{f"alone_s_{c}": v for c, v in cal["alone_s"].items()},
                 **class_columns(pd.DataFrame(rows), cfg.class_slo_ttft_s, res.summary["window_s"]))
    return PointResult(requests=rows, wall_s=res.summary["wall_s"], warmup_s=warmup_s, extra=extra)


def _prefix_engine(loaded, cfg: Config, prefix_sharing: bool, max_seq_tokens: int):
    """The engine of the multi-turn and shared-prefix points: with prefix sharing in ``multiturn_prefix_sharing`` the
    ``continuous`` engine with its prefix cache on / off (the same engine both ways, so only the cache differs);
    otherwise ``cfg.engine`` under ``fcfs``."""
    if any(cfg.multiturn_prefix_sharing):
        return engine_kinds.make_engine(cfg.engine_options_for("continuous", max_seq_tokens=max_seq_tokens,
                                                              prefix_sharing=prefix_sharing), loaded, None, cfg.settings())
    return policy_engine(loaded, cfg, "fcfs")


def _multiturn(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """``conversations`` conversations at once, ``turns`` turns each: turn ``k`` sends the whole history (each
    earlier user message and a fixed assistant reply of ``short_max_tokens`` words), so its prompt grows turn
    by turn (:func:`workbench.load.conversations.multiturn`). Rows: ``conversation``, ``turn`` (from 1), the
    engine sender's figures."""
    ctx = (max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 16) * (cfg.turns + 1) + cfg.shared_prefix_tokens + 64
    eng = _prefix_engine(loaded, cfg, prefix_sharing, ctx)
    send = senders.engine_sender(eng, loaded.tokenizer, cfg.settings())
    try:
        rows, warmup_s, t0 = multiturn(send, loaded.tokenizer, conversations=cfg.conversations, turns=cfg.turns,
                                       prompt_tokens=cfg.short_prompt_tokens[0], max_tokens=cfg.short_max_tokens,
                                       shared_prefix_tokens=cfg.shared_prefix_tokens, warmup=cfg.warmup,
                                       max_wait_s=cfg.max_wait_s)
    finally:
        eng.stop()
    return _prefix_point("multiturn", cfg, prefix_sharing, rows, warmup_s, t0)


def _shared_prefix(loaded, cfg: Config, prefix_sharing: bool = False) -> PointResult:
    """A shared-prefix group: ``prefix_group_requests`` requests, one after another (each sent when the previous
    one ended: a closed loop, so a request's prefix pages are complete before the next one looks for them), each
    opening with the same system document of ``shared_prefix_tokens`` tokens and asking its own question of
    ``short_prompt_tokens[0]`` tokens (many users of one system prompt or one document;
    :func:`workbench.load.conversations.shared_prefix_group`). Rows: ``conversation`` (the request's index) and
    ``turn`` 1, the engine sender's figures."""
    eng = _prefix_engine(loaded, cfg, prefix_sharing,
                         cfg.shared_prefix_tokens + max(cfg.short_prompt_tokens) + cfg.short_max_tokens + 64)
    send = senders.engine_sender(eng, loaded.tokenizer, cfg.settings())
    try:
        rows, warmup_s, t0 = shared_prefix_group(send, loaded.tokenizer, requests=cfg.prefix_group_requests,
                                                 prefix_tokens=cfg.shared_prefix_tokens,
                                                 prompt_tokens=cfg.short_prompt_tokens[0],
                                                 max_tokens=cfg.short_max_tokens, warmup=cfg.warmup)
    finally:
        eng.stop()
    return _prefix_point("shared_prefix", cfg, prefix_sharing, rows, warmup_s, t0)


def _prefix_point(profile: str, cfg: Config, prefix_sharing: bool, rows: list, warmup_s: float,
                  t0: float) -> PointResult:
    """A multi-turn or shared-prefix point: its rows, the wall time since ``t0`` and the cache columns."""
    wall = time.perf_counter() - t0
    extra = {"profile": profile, "stopped_early": False, "offered_rps": float("nan"),
             **cache_columns(pd.DataFrame(rows), prefix_sharing)}
    return PointResult(requests=rows, wall_s=wall, warmup_s=warmup_s if cfg.warmup else None, extra=extra)


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every point of ``cfg.grid()`` (:func:`workbench.run.sweeps.run_sweep`); the points DataFrame. With the A/A
    control its columns (:func:`aa_control`) are saved as ``scheduling_aa.json`` in the run folder."""
    from workbench.run import results

    state: dict = {}
    points = sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_point(loaded, cfg, p, state),
                              resume=resume, slo_ttft_s=cfg.class_slo_ttft_s.get("interactive"), info=loaded.info,
                              loaded=loaded, config=cfg, speed_probe=True)  # the twin predicts at each point's speed
    if cfg.aa_control:
        aa = aa_control(points, results.read_requests(run_dir, experiment=EXPERIMENT))
        if aa is not None:
            results.save_text(run_dir, f"{EXPERIMENT}_aa.json", json.dumps(aa, default=float))
    return points


# ----------------------------------------------------------------------------- tables


def _p(values, pct: int) -> float:
    return metrics.percentiles(pd.to_numeric(values, errors="coerce"), (pct,))[f"p{pct}"]


def run_statistics(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per usable run (point; :func:`workbench.stats.evidence.usable_points`, serving rules for the mixed
    workload): ``point_id``, ``workload``, ``arm`` (the policy, :data:`AA_ARM`, or ``off`` / ``on`` for prefix
    sharing), ``replicate`` (its round, 0 in runs before rounds), ``prefix_sharing`` and the per-run statistics the
    comparisons pair: ``ttft_s_p90_interactive``, ``e2e_s_p50_background`` and ``ttft_s_p50`` (over the run's
    requests that produced a token without error)."""
    cols = ["point_id", "workload", "arm", "replicate", "prefix_sharing", "ttft_s_p90_interactive",
            "e2e_s_p50_background", "ttft_s_p50"]
    if points is None or points.empty or requests is None or requests.empty or "point_id" not in requests:
        return pd.DataFrame(columns=cols)
    use = evidence.usable_points(points)
    mixed = use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"
    use = pd.concat([evidence.usable_points(use[mixed], serving=True), use[~mixed]])
    out = []
    for r in use.to_dict("records"):
        g = served_rows(requests[requests["point_id"] == r["point_id"]])
        cls = g["request_class"] if "request_class" in g else pd.Series("interactive", index=g.index)
        share = bool(r.get("prefix_sharing") or False) if r.get("prefix_sharing") == r.get("prefix_sharing") else False
        arm = r.get("arm")
        if not isinstance(arm, str) or not arm:
            arm = ("on" if share else "off") if r.get("workload") in PREFIX_WORKLOADS else r.get("policy")
        rep = r.get("replicate")
        out.append({"point_id": r["point_id"], "workload": r.get("workload", "mixed"), "arm": arm,
                    "replicate": int(rep) if rep is not None and rep == rep else 0, "prefix_sharing": share,
                    "ttft_s_p90_interactive": _p(g.loc[cls == "interactive", "ttft_s"], 90) if "ttft_s" in g else np.nan,
                    "e2e_s_p50_background": _p(g.loc[cls == "background", "e2e_s"], 50) if "e2e_s" in g else np.nan,
                    "ttft_s_p50": _p(g["ttft_s"], 50) if "ttft_s" in g else np.nan})
    return pd.DataFrame(out, columns=cols)


def aa_control(points: pd.DataFrame, requests: pd.DataFrame, stats: pd.DataFrame | None = None) -> dict | None:
    """The A/A control of the mixed workload: :data:`AA_ARM` over ``fcfs`` on the interactive TTFT p90, paired by
    round (:func:`workbench.stats.replicates.aa_columns`: ``aa_ratio``, ``aa_low``, ``aa_high``, ``design``, ``rounds``);
    None when the run had no A/A arm."""
    stats = run_statistics(points, requests) if stats is None else stats
    m = stats[stats["workload"] == "mixed"]
    if not (m["arm"] == AA_ARM).any():
        return None
    a = m[m["arm"] == AA_ARM].groupby("replicate")["ttft_s_p90_interactive"].first().dropna()
    b = m[m["arm"] == "fcfs"].groupby("replicate")["ttft_s_p90_interactive"].first().dropna()
    both = a.index.intersection(b.index)
    return replicates.aa_columns(a.loc[both], b.loc[both], DESIGN)


def prefix_savings(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What prefix sharing saved, per prefix workload (``multiturn``, ``shared_prefix``) measured with sharing off
    and on (usable points only: :func:`workbench.stats.evidence.usable_points`).

    The run is the unit: each round runs the workload once with sharing off and once on (a fresh engine each), the
    per-run statistic is the TTFT p50 of its requests (failed and abandoned ones left out), and the two runs of a
    round are paired (:func:`workbench.stats.replicates.paired_log_ratio`; :func:`workbench.stats.classes.sharing_savings`).

    Returns:
        One row per workload: ``workload``, ``pairs`` and ``rounds`` (paired rounds), ``cache_hit_rate_off`` /
        ``cache_hit_rate_on`` (cached over prompt tokens of all its runs, :func:`cache_columns`), ``ttft_s_p50_off``
        / ``ttft_s_p50_on`` (median over the rounds' run statistics), ``ttft_saved_s`` (mean over rounds of p50 off
        - p50 on, seconds) with ``ttft_saved_s_low`` / ``ttft_saved_s_high`` (Student-t 95% over rounds),
        ``ttft_ratio`` (on / off) with ``ttft_ratio_low`` / ``ttft_ratio_high``, ``method``, ``design`` and
        ``verdict``: ``saves`` / ``costs`` when the ratio's interval excludes 1, ``not supported: the interval
        straddles 1``, or ``one run: not supported``. Empty when no workload has both sides.
    """
    stats = run_statistics(points, requests)
    return sharing_savings(stats[stats["workload"].isin(PREFIX_WORKLOADS)], requests, DESIGN)


def prefix_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding | None:
    """The prefix-sharing part of the finding: per workload the cache hit rate next to the run TTFT p50 ratio (on /
    off, runs paired by round) with its interval, "not supported" where it straddles 1 and "one run: not supported"
    with one round (:func:`prefix_savings`); "not supported" when sharing was measured off and on but no such pair
    of points is usable (invalid points); None when no workload was measured both ways."""
    sav = prefix_savings(points, requests)
    if sav.empty:
        if not _measured_both_ways(points):
            return None
        return evidence.Finding("Prefix sharing: not supported: no usable pair of points with sharing off and on.",
                                "the prefix points are invalid or failed", False, ())
    parts = []
    for r in sav.itertuples():
        hit = "n/a" if r.cache_hit_rate_on != r.cache_hit_rate_on else f"{r.cache_hit_rate_on:.0%}"
        tail = "" if r.verdict in ("saves", "costs") else f": {r.verdict}"
        parts.append(f"{r.workload.replace('_', '-')}: cache hit rate {hit} with sharing on, run TTFT p50 on/off "
                     f"{replicates.describe(r.ttft_ratio, r.ttft_ratio_low, r.ttft_ratio_high)}{tail}")
    use = evidence.usable_points(points)
    ids = evidence.point_ids(use[use.get("workload", pd.Series(dtype=str)).isin(PREFIX_WORKLOADS)])
    supported = bool(sav["verdict"].isin(["saves", "costs"]).any())
    return evidence.Finding(("Prefix sharing (continuous engine, on vs off, runs paired by round): " if supported else
                             "Prefix sharing: not supported (continuous engine, on vs off, runs paired by round): ")
                            + "; ".join(parts) + ".",
                            ", ".join(f"{r.workload}: {r.rounds} rounds (one run per side each, t over the rounds)"
                                      for r in sav.itertuples()), supported, ids)


def recommend(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The closing table: per policy the interactive requests' TTFT p90 and the background requests' e2e p50 as
    ratios over ``fcfs``, the run as the unit (one statistic per run, runs paired by round: arrival seed; a fresh
    engine each), the longest wait, the A/A control and a verdict. A policy is recommended when its interactive
    ratio's interval lies below 1 at the Bonferroni level over the m policies compared (``1 - 0.05 / m``: a best
    of m is not tested as if it were one) and the A/A control did not move. One round: "one run: not supported".
    Usable points only (:func:`workbench.stats.evidence.usable_points`, serving rules).

    Returns:
        One row per policy: ``policy``, ``interactive_ttft_p90_ratio`` / ``interactive_ttft_ratio`` (the
        geometric-mean ratio over rounds) with ``_low`` / ``_high``, ``background_e2e_ratio`` with ``_low`` /
        ``_high``, ``queue_s_max``, ``rounds``, ``confidence``, ``recommended``, ``verdict`` and the A/A columns
        ``aa_ratio``, ``aa_low``, ``aa_high``, ``design``.
    """
    stats = run_statistics(points, requests)
    mixed = stats[stats["workload"] == "mixed"]
    policies = [a for a in dict.fromkeys(mixed["arm"]) if a not in ("fcfs", AA_ARM)]
    if "fcfs" not in set(mixed["arm"]):
        policies = []
    conf = 1 - (1 - replicates.CONFIDENCE) / max(1, len(policies))
    aa = aa_control(points, requests, stats) or {"aa_ratio": np.nan, "aa_low": np.nan, "aa_high": np.nan,
                                                 "design": DESIGN, "rounds": 0}
    moved = replicates.aa_moved(aa)
    use = evidence.usable_points(points, serving=True)
    out = []
    for p in policies:
        short = compare_runs(stats, p, "fcfs", "ttft_s_p90_interactive", confidence=conf)
        long = compare_runs(stats, p, "fcfs", "e2e_s_p50_background", confidence=conf)
        verdict = replicates.verdict(short["low"], short["high"])
        if moved:
            verdict = "not supported: the A/A control moved"
        qmax = pd.to_numeric(use[use.get("policy", pd.Series(dtype=str)) == p].get("queue_s_max"), errors="coerce")
        out.append({"policy": p, "interactive_ttft_p90_ratio": short["ratio"], "interactive_ttft_ratio": short["ratio"],
                    "interactive_ttft_ratio_low": short["low"], "interactive_ttft_ratio_high": short["high"],
                    "background_e2e_ratio": long["ratio"], "background_e2e_ratio_low": long["low"],
                    "background_e2e_ratio_high": long["high"],
                    "queue_s_max": float(qmax.max()) if qmax is not None and qmax.notna().any() else float("nan"),
                    "rounds": short["rounds"], "confidence": conf, "recommended": verdict == "faster",
                    "verdict": verdict, "aa_ratio": aa["aa_ratio"], "aa_low": aa["aa_low"], "aa_high": aa["aa_high"],
                    "design": DESIGN})
    return pd.DataFrame(out)


def finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding:
    """The headline: which policy helps the interactive requests' TTFT p90 over ``fcfs`` (runs paired by round, with
    its interval) and what it costs the background requests' e2e p50, "not supported" where no interval lies below
    1, with one round, or when the A/A control moved; then, where sharing was measured off and on, what prefix
    sharing saved (:func:`prefix_finding`)."""
    main = _policy_finding(points, requests)
    prefix = prefix_finding(points, requests)
    return main if prefix is None else evidence.join([main, prefix])


def _policy_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding:
    rec = recommend(points, requests)
    use = evidence.usable_points(points, serving=True)
    use = use[use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"] if not use.empty else use
    ids = evidence.point_ids(use)
    if rec.empty:
        return evidence.Finding("Scheduling: not supported: no usable fcfs and policy points to compare.",
                                f"{len(use)} usable points", False, ids)
    conf = float(rec["confidence"].iloc[0])
    parts, ev = [], []
    for r in rec.itertuples():
        parts.append(f"{r.policy}: interactive TTFT p90 vs fcfs "
                     f"{replicates.describe(r.interactive_ttft_ratio, r.interactive_ttft_ratio_low, r.interactive_ttft_ratio_high)}"
                     f", {r.verdict}; background e2e p50 vs fcfs "
                     f"{replicates.describe(r.background_e2e_ratio, r.background_e2e_ratio_low, r.background_e2e_ratio_high)}")
        if r.queue_s_max == r.queue_s_max:
            ev.append(f"{r.policy}: longest wait {r.queue_s_max:.2f} s")
    aa = rec.iloc[0]
    aa_text = (f"A/A control (fcfs twice, the same seeds): {replicates.describe(aa.aa_ratio, aa.aa_low, aa.aa_high)}"
               + (" - moved" if replicates.aa_moved(aa) else "") if aa.aa_ratio == aa.aa_ratio else "no A/A control")
    rounds = int(rec["rounds"].max())
    best = rec[rec["recommended"]].sort_values("interactive_ttft_ratio")
    if not best.empty:
        b = best.iloc[0]
        lead = (f"For interactive traffic mixed with long reports, {b['policy']} lowers the short requests' TTFT p90 "
                f"(x{b['interactive_ttft_ratio']:.2f} of fcfs over {rounds} rounds) at "
                f"x{b['background_e2e_ratio']:.2f} background e2e.")
    elif rounds < 2:
        lead = "Scheduling: one run: not supported (each policy ran once; the run is the unit under a queue)."
    elif replicates.aa_moved(aa):
        lead = "Scheduling: not supported: the A/A control moved."
    else:
        lead = "Scheduling: not supported: no policy's interactive TTFT p90 interval is below fcfs here."
    n = int(len(requests[requests["point_id"].isin(use["point_id"])])) if "point_id" in requests else 0
    return evidence.Finding(lead + " " + "; ".join(parts) + ".",
                            f"{len(use)} usable runs, {n} requests; {rounds} rounds (arrival seeds) per arm, a fresh "
                            f"engine per run, runs paired by round (t over the rounds' log ratios of the run "
                            f"statistic, {conf:.1%} intervals: Bonferroni over {len(rec)} "
                            f"{'policy' if len(rec) == 1 else 'policies'}); {aa_text}"
                            + ("; " + "; ".join(ev) if ev else ""), not best.empty, ids)


# ----------------------------------------------------------------------------- figures


def _measured_both_ways(points: pd.DataFrame) -> bool:
    """Whether some prefix workload has points with sharing off and on (usable or not)."""
    if points is None or points.empty or not {"workload", "prefix_sharing"} <= set(points.columns):
        return False
    pre = points[points["workload"].isin(PREFIX_WORKLOADS)]
    return any(g["prefix_sharing"].fillna(False).astype(bool).nunique() == 2 for _, g in pre.groupby("workload"))


def prefix_cache_savings(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Cache hit rate with prefix sharing on against the run TTFT p50 it saved (off - on, runs paired by round; the bar
    is the 95% t interval over rounds), one marker per prefix workload, its verdict and rounds in the label
    (:func:`prefix_savings`)."""
    return prefix_savings_figure(prefix_savings(points, requests), _measured_both_ways(points))


def recommendation_table(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """The :func:`recommend` table as a figure."""
    rec = recommend(points, requests)
    why = ""
    if rec.empty:
        mixed = points[points.get("workload", pd.Series(dtype=str)) == "mixed"] if not points.empty else points
        usable = evidence.usable_points(mixed, serving=True) if not mixed.empty else mixed
        arms = set(usable.get("policy", pd.Series(dtype=str)).dropna())
        why = ("no mixed-workload point measured" if mixed.empty else
               f"no usable fcfs run of the mixed workload to compare with ({len(mixed) - len(usable)} of {len(mixed)} "
               "mixed points invalid or stopped early)" if "fcfs" not in arms else
               "only fcfs measured: no policy to compare with it")
    return table_figure(rec, "Policy per workload: interactive TTFT and its cost to background requests (vs fcfs)",
                        empty_reason=why)


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
