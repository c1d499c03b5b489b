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

**The run is the unit** (issues 32, 49): under a queue one request's delay carries into every later request of the
run, so requests paired across two runs are not independent samples (an A/A of the same trace twice claimed a
direction in 22-80% of simulated designs: ``benchmarks/aa_queue.py``). With ``rounds`` >= 2 the policies are the arms
of one design (:func:`policy_design`, :mod:`workbench.run.design`): every round replays the trace of arrival seed
``seed + k`` under every policy and ``fcfs`` again (the A/A control, ``aa_control``), each run on a fresh engine in
a shuffled order, each run one point; ``rounds`` rounds first, up to ``max_rounds`` while a policy's comparison is
undecided and ``budget_s`` allows. The outcome is one statistic per run that its requests can estimate: the
interactive class's mean TTFT (primary) and the background class's mean e2e (secondary), each run holding the
trace's exact class mix; ``fcfs`` is the marked control, and one block analysis of the rounds (rounds as blocks, a
residual variance pooled over the arms, Dunnett's simultaneous intervals) gives each policy three verdicts: faster /
slower, equivalent within ``margin``, or undecided with the rounds it would take. The pick (the policy with the
lowest interactive TTFT) is compared with fcfs and with its runner-up (:func:`workbench.stats.blocks.pick_versus`);
fcfs kept is a verdict only when every policy is slower beyond noise or equivalent. One round: undecided. A share
``abandon_share`` of clients gives up when no token came ``patience_s`` after arrival (the request is withdrawn and
frees its place); a full engine (``max_pending``) answers with a Retry-After from its backlog, which the load
generator honours (``max_retries``).

**Points**: per policy (``fcfs``, ``priority``, ``sjf``, ``lanes``: :mod:`workbench.serving.scheduling`) one run of
the mixed workload on ``engine`` (``fifo`` or ``static``; the ``continuous`` engine's admission is the library's
own FIFO); with ``turns`` > 0 one ``multiturn`` point per ``multiturn_prefix_sharing`` value
(``conversations`` concurrent conversations whose context grows turn by turn: each turn's prompt is the whole
history); with ``prefix_group_requests`` > 0 one ``shared_prefix`` point per value (a group of requests that open
with the same system document of ``shared_prefix_tokens`` tokens, one after another: many users of one system
prompt or document). With ``shared_prefix_tokens`` > 0 the conversations open with that document too, so they
share a prefix as well as their own growing history. With prefix sharing in the list, these points run on the
``continuous`` engine with its prefix cache on / off (:func:`prefix_sharing_available`: an engines module with
``EngineOptions(prefix_sharing=...)``). Measured both ways with ``rounds`` >= 2 they are a design of their own
(:func:`prefix_design`, ``design/scheduling_prefix.parquet``): per workload sharing off (its control) and on, off
again as the A/A arm, one run each per round; the run's mean TTFT its statistic, the on / off ratio decided as
above (``sharing_ttft_ratio``); :func:`prefix_savings` puts the cache hit rate (cached over prompt tokens, from the
rows' ``cached_tokens``) next to it. Without prefix sharing the hit rate is NaN, "not available".

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
from workbench.errors import ParameterError
from workbench.load import senders
from workbench.load.conversations import multiturn, shared_prefix_group
from workbench.load.traces import calibrate, check_class_slos, policy_engine, read_mixed_trace, run_policy, trace_rows
from workbench.measure.generation import GenerationSettings
from workbench.run import design, sweeps
from workbench.run.point_result import PointResult
from workbench.serving import engine_kinds, options, scheduling
from workbench.share import figures_design
from workbench.share.figures_serving import (
    class_latency,
    eta_error,
    goodput_per_class,
    longest_wait,
    prefix_savings_figure,
    slowdown_vs_length,
    ttft_by_turn,
)
from workbench.share.plots import split_by_device, table_figure
from workbench.stats import blocks, evidence, metrics
from workbench.stats.classes import (
    CLASSES,
    cache_columns,
    class_columns,
    class_summary,  # noqa: F401  (notebook 11's per-class table: scheduling.class_summary)
    served_rows,
)

EXPERIMENT = "scheduling"
PREFIX_DESIGN = "scheduling_prefix"   # the prefix-sharing design's name (design/scheduling_prefix.parquet)
CONTROL = "fcfs"             # the policies' marked control
AA_ARM = "fcfs_aa"           # the A/A control's second fcfs arm (its runs' points)
PREFIX_AA_ARM = "off_aa"     # the prefix design's A/A arm: sharing off again (its runs' points)
#: the policies' per-run outcomes: the interactive class's mean TTFT (primary) and the background class's mean e2e
INTERACTIVE = design.Outcome("ttft_s_mean_interactive", False, "interactive TTFT (the class's mean per run)",
                             "interactive_ttft_ratio")
BACKGROUND = design.Outcome("e2e_s_mean_background", False, "background e2e (the class's mean per run)",
                            "background_e2e_ratio")
#: the prefix design's per-run outcome: the mean TTFT of the run's served requests (sharing on over off)
SHARING = design.Outcome("ttft_s_mean", False, "run TTFT (the mean of its requests)", "sharing_ttft_ratio")
WORKLOADS = ("mixed", "multiturn", "shared_prefix")
PREFIX_WORKLOADS = ("multiturn", "shared_prefix")
#: the engines that can apply every policy (:func:`workbench.serving.options.engines_taking`)
ENGINES = options.engines_taking("sjf")
TRACE_FIELDS = ("offset_s", "prompt_tokens", "output_tokens", "request_class")


@dataclasses.dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """The scheduling study (notebook ``11_scheduling``).

    With ``rounds`` >= 2 the policies (``fcfs`` among them) are one design and the prefix points measured both ways
    another (module docstring): ``rounds`` rounds first, up to ``max_rounds`` while undecided and ``budget_s``
    (each design's own) allows; ``margin`` their equivalence margin.

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
        rounds: replicate runs per arm (>= 1), the designs' rounds before their first look: round ``k`` replays
            the trace of arrival seed ``seed + k`` under every arm (a fresh engine each), and the prefix points run
            once per round. 1: one run per arm, nothing decided.
        prefix_rounds: the prefix design's rounds before its first look (None: ``rounds``; at most
            ``max_rounds``): a large effect of cheap runs needs fewer than the policies' comparison.
        aa_control: run the control twice per round (arm :data:`AA_ARM`, the same seeds; the prefix design: sharing
            off again, :data:`PREFIX_AA_ARM`): the A/A control (``aa_ratio``, ``aa_low``, ``aa_high``,
            ``aa_verdict``).
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
    prefix_rounds: int | None = None
    aa_control: bool = False

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
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
        checks.check_int("max_rounds", self.max_rounds, lo=max(2, self.rounds), hi=1000)
        if self.prefix_rounds is not None:
            checks.check_int("prefix_rounds", self.prefix_rounds, lo=2, hi=self.max_rounds)
        checks.check_bool("aa_control", self.aa_control)
        if self.trace:
            rows = read_mixed_trace(self.trace, self.class_slo_ttft_s)
            got = {r["request_class"] for r in rows[: self.requests_per_point]}
            if self.policy_design() and not set(CLASSES) <= got:
                raise ParameterError(f"trace: the first {self.requests_per_point} requests (requests_per_point) "
                                     f"hold no {' or '.join(sorted(set(CLASSES) - got))} request: each run needs both "
                                     f"classes for its per-class statistics")

    def settings(self) -> GenerationSettings:
        """Every request: greedy, fixed length (its class's ``max_tokens``)."""
        return GenerationSettings(max_new_tokens=self.long_max_tokens, ignore_eos=True, seed=self.seed)

    def design_kwargs(self, prefix: bool = False) -> dict:
        """The designs' rounds (``rounds`` first, the prefix design's ``prefix_rounds``; up to ``max_rounds``),
        budget, margin and seed."""
        first = self.prefix_rounds if prefix and self.prefix_rounds is not None else self.rounds
        return {**super().design_kwargs(), "min_rounds": int(first)}

    def arms(self) -> list[str]:
        """The mixed workload's arms: the policies, then :data:`AA_ARM` (``fcfs`` again) with ``aa_control`` when
        the policies are a design (:meth:`policy_design`: an A/A arm outside a design has nothing to calibrate)."""
        return list(self.policies) + ([AA_ARM] if self.aa_control and self.policy_design() else [])

    def prefix_workloads(self) -> list[str]:
        """The prefix workloads measured: ``multiturn`` (``turns`` > 0), ``shared_prefix`` (``prefix_group_requests``
        > 0)."""
        return [w for w, on in (("multiturn", self.turns > 0), ("shared_prefix", self.prefix_group_requests > 0)) if on]

    def policy_design(self) -> bool:
        """Whether the policies are one design (:func:`policy_design`): 2+ rounds, ``fcfs`` and another policy."""
        return self.rounds >= 2 and CONTROL in self.policies and len(self.policies) >= 2

    def prefix_design(self) -> bool:
        """Whether the prefix points are one design (:func:`prefix_design`): 2+ rounds, sharing off and on."""
        return self.rounds >= 2 and set(map(bool, self.multiturn_prefix_sharing)) == {False, True} and \
            bool(self.prefix_workloads())

    def grid(self) -> list[dict]:
        """Per round ``k`` (``replicate``): one ``mixed`` point per arm, then one ``multiturn`` point (``fcfs``) per
        ``multiturn_prefix_sharing`` value when ``turns`` > 0, then one ``shared_prefix`` point per value when
        ``prefix_group_requests`` > 0 (and sharing off again, arm :data:`PREFIX_AA_ARM`, for the prefix design's
        A/A control). A design's points run to ``max_rounds`` rounds (it records those it takes: each run a point);
        points outside a design run ``rounds`` rounds, the arm order rotated by round (the sharing values reversed
        in odd rounds)."""
        pts = []
        arms = self.arms()
        mixed_rounds = self.max_rounds if self.policy_design() else self.rounds
        prefix_rounds = self.max_rounds if self.prefix_design() else self.rounds
        for k in range(max(mixed_rounds, prefix_rounds)):
            if k < mixed_rounds:
                r = 0 if self.policy_design() else k % len(arms)   # a design shuffles its own order per round
                pts += [{"workload": "mixed", "policy": _policy_of(a), "prefix_sharing": False, "replicate": k,
                         "arm": a} for a in arms[r:] + arms[:r]]
            if k >= prefix_rounds:
                continue
            values = list(self.multiturn_prefix_sharing)[:: -1 if k % 2 and not self.prefix_design() else 1]
            for i, workload in enumerate(self.prefix_workloads()):
                pts += [{"workload": workload, "policy": "fcfs", "prefix_sharing": bool(v), "replicate": k,
                         "arm": "on" if v else "off"} for v in values]
                if i == 0 and self.prefix_design() and self.aa_control:
                    pts.append({"workload": workload, "policy": "fcfs", "prefix_sharing": False, "replicate": k,
                                "arm": PREFIX_AA_ARM})
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
    """One point outside the designs (one round): the mixed workload under ``point["policy"]``, or the multi-turn
    conversations, or the shared-prefix group.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the study's config.
        point: ``{"workload", "policy", "prefix_sharing"}``.
        state: shared by the points of a run: ``calibration`` (:func:`calibrate`, measured on the first point).

    Returns:
        :class:`workbench.run.point_result.PointResult` with the request rows (module docstring) and ``extra``
        (:func:`class_columns`, the load run's summary, ``offered_rps``, ``alone_s_<class>``).
    """
    if point["workload"] == "multiturn":
        return _multiturn(loaded, cfg, bool(point.get("prefix_sharing")))
    if point["workload"] == "shared_prefix":
        return _shared_prefix(loaded, cfg, bool(point.get("prefix_sharing")))
    cal = _calibration(loaded, cfg, state)
    rows_in = trace_rows(cfg, cal["rate_rps"], int(point.get("replicate", 0)))
    rows, res, warmup_s = run_policy(loaded, cfg, point["policy"], rows_in, cal["alone_s"])
    return PointResult(requests=rows, wall_s=res.summary["wall_s"], warmup_s=warmup_s,
                       extra=_mixed_columns(cfg, cal, rows, res))


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


def _calibration(loaded, cfg: Config, state: dict) -> dict:
    """The run's calibration (:func:`calibrate`), measured once and kept in ``state``."""
    if "calibration" not in state:
        state["calibration"] = calibrate(loaded, cfg)
    return state["calibration"]


def _mean(values) -> float:
    v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").dropna()
    return float(v.mean()) if len(v) else float("nan")


def run_values(rows) -> dict:
    """A mixed run's statistics (the policy design's outcomes): the interactive class's mean TTFT and the background
    class's mean e2e over the run's served requests (:func:`workbench.stats.classes.served_rows`), seconds; NaN for a
    class without a served request."""
    g = served_rows(pd.DataFrame(rows))
    cls = g["request_class"] if "request_class" in g else pd.Series("interactive", index=g.index)
    return {INTERACTIVE.name: _mean(g.loc[cls == "interactive", "ttft_s"]) if "ttft_s" in g else float("nan"),
            BACKGROUND.name: _mean(g.loc[cls == "background", "e2e_s"]) if "e2e_s" in g else float("nan")}


def _positive(values: dict, what: str) -> dict:
    """``values`` when each is a positive number, else a one-line error naming the run (a design needs a value of
    each outcome from every run)."""
    bad = [k for k, v in values.items() if not (v == v and v > 0)]
    if bad:
        raise RuntimeError(f"{what}: no served request for {', '.join(bad)} (every request failed or was abandoned)")
    return values


def policy_design(loaded, cfg: Config, state: dict) -> design.SweepDesign:
    """The policies as one design (:mod:`workbench.run.design`, module docstring): the arms are ``cfg.policies``,
    ``fcfs`` the marked control and, with ``aa_control``, the A/A arm; arm ``a`` in round ``k`` replays the trace of
    arrival seed ``seed + k`` (:func:`workbench.load.traces.trace_rows`, its class mix exact) on a fresh engine
    under policy ``a`` (:func:`workbench.load.traces.run_policy`), one point per run (``unit_of``: the ``mixed``
    points' ``(arm, replicate)``). Outcomes per run: :data:`INTERACTIVE` (primary), :data:`BACKGROUND`.

    Returns:
        :class:`workbench.run.design.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    def measure(policy, rnd):
        cal = _calibration(loaded, cfg, state)
        rows, res, warmup_s = run_policy(loaded, cfg, policy, trace_rows(cfg, cal["rate_rps"], rnd), cal["alone_s"])
        values = _positive(run_values(rows), f"{policy} round {rnd}")
        return design.Measured(values, rows, res.summary["wall_s"],
                               {**_mixed_columns(cfg, cal, rows, res), "warmup_s": warmup_s})

    def unit_of(p):
        if p.get("workload") != "mixed":
            return None
        return (design.AA if p["arm"] == AA_ARM else p["arm"]), int(p["replicate"])

    d = design.Design(EXPERIMENT, list(cfg.policies), CONTROL, INTERACTIVE, (BACKGROUND,), aa=cfg.aa_control,
                      **cfg.design_kwargs())
    return design.SweepDesign(d, measure, unit_of=unit_of)


def prefix_design(loaded, cfg: Config) -> design.SweepDesign:
    """The prefix points as one design: per prefix workload (``multiturn``, ``shared_prefix``) the arms
    ``<workload>_off`` (its control) and ``<workload>_on``, the first workload's ``off`` again as the A/A arm (with
    ``aa_control``); one run of the workload per arm and round on a fresh ``continuous`` engine with its prefix cache
    off / on (:func:`_multiturn`, :func:`_shared_prefix`), one point per run. Outcome: :data:`SHARING` (the run's
    mean TTFT).

    Returns:
        :class:`workbench.run.design.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    workloads = cfg.prefix_workloads()
    arms = [f"{w}_{side}" for w in workloads for side in ("off", "on")]

    def measure(arm, rnd):
        workload, side = arm.rsplit("_", 1)
        res = (_multiturn if workload == "multiturn" else _shared_prefix)(loaded, cfg, side == "on")
        served = served_rows(pd.DataFrame(res.requests))
        values = _positive({SHARING.name: _mean(served.get("ttft_s", []))}, f"{arm} round {rnd}")
        return design.Measured(values, res.requests, res.wall_s, {**res.extra, "warmup_s": res.warmup_s})

    def unit_of(p):
        if p.get("workload") not in PREFIX_WORKLOADS:
            return None
        return (design.AA if p["arm"] == PREFIX_AA_ARM else f"{p['workload']}_{p['arm']}"), int(p["replicate"])

    d = design.Design(PREFIX_DESIGN, arms, arms[0], SHARING, groups={f"{w}_off": [f"{w}_on"] for w in workloads},
                      aa=cfg.aa_control, **cfg.design_kwargs(prefix=True))
    return design.SweepDesign(d, measure, unit_of=unit_of)


def _mixed_columns(cfg: Config, cal: dict, rows: list, res) -> dict:
    """A mixed run's point columns: its load summary, the offered rate, each class's service alone and the class
    columns (:func:`workbench.stats.classes.class_columns`)."""
    extra = {k: v for k, v in res.summary.items() if k not in ("wall_s", "rate", "concurrency")}
    extra.update(offered_rps=cal["rate_rps"], **{f"alone_s_{c}": v for c, v in cal["alone_s"].items()},
                 **class_columns(pd.DataFrame(rows), cfg.class_slo_ttft_s, res.summary["window_s"]))
    return extra


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """Every point of ``cfg.grid()`` (:func:`workbench.run.sweeps.run_sweep`), the policies and the prefix points as
    their designs where ``cfg`` makes them (:func:`policy_design`, :func:`prefix_design`; each finished round on disk,
    a resume continues from the last); the points DataFrame. With the A/A control its columns (:func:`aa_control`)
    are saved as ``scheduling_aa.json`` in the run folder."""
    from workbench.run import results

    state: dict = {}
    designs = ([policy_design(loaded, cfg, state)] if cfg.policy_design() else []) + \
              ([prefix_design(loaded, cfg)] if cfg.prefix_design() else [])
    points = sweeps.run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_point(loaded, cfg, p, state),
                              resume=resume, slo_ttft_s=cfg.class_slo_ttft_s.get("interactive"), info=loaded.info,
                              loaded=loaded, config=cfg, speed_probe=True,  # the twin predicts at each point's speed
                              design=designs or None)
    if cfg.aa_control:
        aa = aa_control(points)
        if aa is not None:
            results.save_text(run_dir, f"{EXPERIMENT}_aa.json", json.dumps(aa, default=float))
    return points


# ----------------------------------------------------------------------------- tables

TIME_WORDS = ("slower", "faster")   # a ratio of times above / below 1


def _p(values, pct: int) -> float:
    return metrics.percentiles(pd.to_numeric(values, errors="coerce"), (pct,))[f"p{pct}"]


def _usable(points: pd.DataFrame) -> pd.DataFrame:
    """The usable points (:func:`workbench.stats.evidence.usable_points`; serving rules for the mixed workload)."""
    if points is None or points.empty:
        return pd.DataFrame()
    use = evidence.usable_points(points)
    mixed = use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"
    return pd.concat([evidence.usable_points(use[mixed], serving=True), use[~mixed]])


def _arm_of(r: dict) -> str:
    arm = r.get("arm")
    if isinstance(arm, str) and arm:
        return arm
    share = bool(r.get("prefix_sharing") or False) if r.get("prefix_sharing") == r.get("prefix_sharing") else False
    return ("on" if share else "off") if r.get("workload") in PREFIX_WORKLOADS else str(r.get("policy"))


def run_statistics(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per usable run (point; :func:`_usable`): ``point_id``, ``workload``, ``arm`` (the policy, :data:`AA_ARM`,
    or ``off`` / ``on`` / :data:`PREFIX_AA_ARM` for prefix sharing), ``replicate`` (its round, 0 in runs before
    rounds), ``prefix_sharing`` and the per-run statistics the designs judge, over the run's served requests: the
    interactive class's mean TTFT and the background class's mean e2e (:func:`run_values`) and the mean TTFT of all
    of them (``ttft_s_mean``), seconds."""
    cols = ["point_id", "workload", "arm", "replicate", "prefix_sharing", INTERACTIVE.name, BACKGROUND.name,
            SHARING.name]
    use = _usable(points)
    if use.empty or requests is None or requests.empty or "point_id" not in requests:
        return pd.DataFrame(columns=cols)
    out = []
    for r in use.to_dict("records"):
        rows = requests[requests["point_id"] == r["point_id"]]
        g = served_rows(rows)
        rep = r.get("replicate")
        share = r.get("prefix_sharing")
        out.append({"point_id": r["point_id"], "workload": r.get("workload", "mixed"), "arm": _arm_of(r),
                    "replicate": int(rep) if rep is not None and rep == rep else 0,
                    "prefix_sharing": bool(share) if share == share and share is not None else False,
                    **run_values(rows), SHARING.name: _mean(g.get("ttft_s", []))})
    return pd.DataFrame(out, columns=cols)


def _designed(points: pd.DataFrame, outcome: design.Outcome, workloads, usable: bool = True) -> pd.DataFrame:
    """Usable points of ``workloads`` that carry a design's decision columns of ``outcome``, one row per arm (its
    runs carry the same decision), indexed by the arm: the policy (or :data:`AA_ARM`) for the mixed workload,
    ``<workload>_<arm>`` (``multiturn_on``, ``multiturn_off_aa``, ...) for a prefix workload. ``usable``: usable
    points only (:func:`_usable`), else every finished one."""
    use = _usable(points) if usable else (points[points["status"].eq("ok")] if points is not None and len(points)
                                          and "status" in points else pd.DataFrame())
    if use.empty or "design" not in use or f"{outcome.prefix}_verdict" not in use:
        return pd.DataFrame()
    use = use[use.get("workload", pd.Series("mixed", index=use.index)).isin(workloads) & use["design"].notna()]
    if use.empty:
        return use
    keys = [_arm_of(r) if r.get("workload", "mixed") == "mixed" else f"{r['workload']}_{_arm_of(r)}"
            for r in use.to_dict("records")]
    return use.assign(_arm=keys).drop_duplicates("_arm").set_index("_arm")


def aa_control(points: pd.DataFrame, requests: pd.DataFrame | None = None) -> dict | None:
    """The policy design's A/A control (fcfs against itself): ``aa_ratio``, ``aa_low``, ``aa_high``, ``aa_verdict``,
    ``design`` and ``rounds`` from its points (every finished one: the design's record, whatever a point's
    validity); None when the run had no such design (one round, no A/A arm)."""
    rows = _designed(points, INTERACTIVE, ("mixed",), usable=False)
    if rows.empty or AA_ARM not in rows.index:
        return None
    r = rows.loc[AA_ARM]
    return {"aa_ratio": float(r["aa_ratio"]), "aa_low": float(r["aa_low"]), "aa_high": float(r["aa_high"]),
            "aa_verdict": str(r.get("aa_verdict") or ""), "design": str(r["design"]), "rounds": int(r["rounds"])}


def _words(d: blocks.Decision | None, lower: str = "faster", higher: str = "slower") -> str:
    """A decision's verdict in one word: ``faster`` / ``slower`` (a direction), ``equivalent`` or ``undecided``."""
    if d is None:
        return "undecided"
    if d.verdict == "direction":
        return lower if d.direction == "lower" else higher
    return d.verdict


def prefix_savings(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """What prefix sharing saved, per prefix workload (``multiturn``, ``shared_prefix``) measured with sharing off and
    on (usable points only).

    The run is the unit: the ratio is the prefix design's (:func:`prefix_design`: the runs' mean TTFT with sharing on
    over off, rounds as blocks, its simultaneous interval and verdict); beside it the cache hit rates over the runs'
    served requests (:func:`workbench.stats.classes.cache_columns`) and each side's mean run TTFT. Measured without a
    design (one round) the ratio is the one pair's, undecided.

    Returns:
        One row per workload: ``workload``, ``rounds``, ``cache_hit_rate_off`` / ``cache_hit_rate_on``,
        ``ttft_s_mean_off`` / ``ttft_s_mean_on`` (the mean over its runs of the run's mean TTFT, s),
        ``ttft_saved_s`` (off - on, s), ``sharing_ttft_ratio`` (on / off) with ``_low`` / ``_high``, ``verdict``
        (``saves`` / ``costs`` / ``equivalent`` / ``undecided``), ``method`` and ``design``. Empty when no workload has
        both sides.
    """
    cols = ["workload", "rounds", "cache_hit_rate_off", "cache_hit_rate_on", "ttft_s_mean_off", "ttft_s_mean_on",
            "ttft_saved_s", "sharing_ttft_ratio", "sharing_ttft_ratio_low", "sharing_ttft_ratio_high", "verdict",
            "method", "design"]
    stats = run_statistics(points, requests)
    stats = stats[stats["workload"].isin(PREFIX_WORKLOADS)]
    designed = _designed(points, SHARING, PREFIX_WORKLOADS)
    out = []
    for w, g in stats.groupby("workload", sort=False):
        on, off = g[g["arm"] == "on"], g[g["arm"] == "off"]
        if on.empty or off.empty:
            continue
        req = served_rows(requests[requests["point_id"].isin(g["point_id"])])
        hit = {side: cache_columns(req[req["point_id"].isin(part["point_id"])], side == "on")["cache_hit_rate"]
               for side, part in (("off", off), ("on", on))}
        m_off, m_on = float(off[SHARING.name].mean()), float(on[SHARING.name].mean())
        row = designed.loc[f"{w}_on"] if f"{w}_on" in designed.index else None
        d = design.decision_from_row(row, SHARING) if row is not None else None
        nan = float("nan")
        out.append({"workload": w, "rounds": int(row["rounds"]) if row is not None else int(min(len(on), len(off))),
                    "cache_hit_rate_off": hit["off"], "cache_hit_rate_on": hit["on"], "ttft_s_mean_off": m_off,
                    "ttft_s_mean_on": m_on, "ttft_saved_s": m_off - m_on,
                    "sharing_ttft_ratio": d.estimate if d is not None else (m_on / m_off if m_off > 0 else nan),
                    "sharing_ttft_ratio_low": d.low if d is not None else nan,
                    "sharing_ttft_ratio_high": d.high if d is not None else nan,
                    "verdict": {"faster": "saves", "slower": "costs"}.get(_words(d), _words(d)),
                    "method": d.method if d is not None else "one round: nothing decided (the run is the unit)",
                    "design": str(row["design"]) if row is not None else ""})
    return pd.DataFrame(out, columns=cols)


def prefix_finding(points: pd.DataFrame, requests: pd.DataFrame) -> evidence.Finding | None:
    """The prefix-sharing part of the finding: per workload the cache hit rate next to the run TTFT ratio on / off
    with its decision (:func:`prefix_savings`, the prefix design: a direction, equivalent, or undecided with the rounds
    it would take); undecided when sharing was measured off and on but no such pair of points is usable (invalid
    points) or with one round; None when no workload was measured both ways. Its verdict is the first workload's."""
    sav = prefix_savings(points, requests)
    if sav.empty:
        if not _measured_both_ways(points):
            return None
        return evidence.Finding("Prefix sharing: undecided: no usable pair of points with sharing off and on.",
                                "the prefix points are invalid or failed", False, (), verdict="undecided")
    designed = _designed(points, SHARING, PREFIX_WORKLOADS)
    parts, fields = [], None
    for r in sav.itertuples():
        hit = "n/a" if r.cache_hit_rate_on != r.cache_hit_rate_on else f"{r.cache_hit_rate_on:.0%}"
        row = designed.loc[f"{r.workload}_on"] if f"{r.workload}_on" in designed.index else None
        d = design.decision_from_row(row, SHARING) if row is not None else None
        what = (d.describe("run TTFT on / off", words=TIME_WORDS,
                           seconds_per_round=checks.float_or_nan(row.get("seconds_per_round")))
                if d is not None else f"run TTFT on / off {r.sharing_ttft_ratio:.2f}x: undecided: one round (the run "
                                      f"is the unit: one pair of runs decides nothing)")
        parts.append(f"{r.workload.replace('_', '-')}: cache hit rate {hit} with sharing on, {what}")
        if fields is None:
            fields = design.finding_fields(row, d) if d is not None else {"verdict": "undecided"}
            if row is not None and row.get("aa_verdict") == "direction":
                parts[-1] += " (the A/A control moved: sharing off against itself shows a direction)"
                fields["verdict"] = "undecided"
    use = _usable(points)
    ids = evidence.point_ids(use[use.get("workload", pd.Series(dtype=str)).isin(PREFIX_WORKLOADS)])
    ev = "; ".join(f"{r.workload}: {r.rounds} rounds, each one run with sharing off and one on (a fresh engine each), "
                   f"{r.method}" for r in sav.itertuples())
    first = designed.iloc[0] if len(designed) else None
    if first is not None:
        ev += f"; {design.evidence_text(first)}"
    return evidence.Finding("Prefix sharing (continuous engine, on vs off, the run as the unit): " + "; ".join(parts)
                            + ".", ev, False, ids, **fields)


def recommend(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The closing table: per policy its interactive TTFT and background e2e against ``fcfs`` (the class means per
    run, the run as the unit) with the policy design's simultaneous intervals and verdicts (:func:`policy_design`),
    the longest wait and the A/A control. A policy is recommended when its interactive TTFT is lower than fcfs's
    beyond noise and the A/A control did not move. Measured without a design (one round) the ratios are the one pair
    of runs', undecided. Usable points only (:func:`workbench.stats.evidence.usable_points`, serving rules).

    Returns:
        One row per policy: ``policy``, ``interactive_ttft_ratio`` with ``_low`` / ``_high`` and
        ``interactive_verdict``, ``background_e2e_ratio`` with ``_low`` / ``_high`` and ``background_verdict``
        (``faster`` / ``slower`` / ``equivalent`` / ``undecided``), ``queue_s_max``, ``rounds``, ``level``,
        ``recommended``, ``verdict`` and the A/A columns ``aa_ratio``, ``aa_low``, ``aa_high``, ``aa_verdict``,
        ``design``.
    """
    stats = run_statistics(points, requests)
    mixed = stats[stats["workload"] == "mixed"]
    if CONTROL not in set(mixed["arm"]):
        return pd.DataFrame()
    designed = _designed(points, INTERACTIVE, ("mixed",))
    aa = aa_control(points) or {"aa_ratio": np.nan, "aa_low": np.nan, "aa_high": np.nan, "aa_verdict": "",
                                "design": "", "rounds": 0}
    moved = aa["aa_verdict"] == "direction"
    use = _usable(points)
    first = mixed[mixed["replicate"] == mixed["replicate"].min()].groupby("arm").first()
    nan = float("nan")
    out = []
    for p in [a for a in dict.fromkeys(mixed["arm"]) if a not in (CONTROL, AA_ARM)]:
        row = designed.loc[p] if p in designed.index else None
        d = design.decision_from_row(row, INTERACTIVE) if row is not None else None
        b = design.decision_from_row(row, BACKGROUND) if row is not None else None
        if d is None:   # one round: the one pair of runs, nothing decided
            one = {k: first.loc[p, k] / first.loc[CONTROL, k] if p in first.index and first.loc[CONTROL, k] > 0
                   else nan for k in (INTERACTIVE.name, BACKGROUND.name)}
        verdict = _words(d) if d is not None else "one round: undecided"
        if moved and d is not None:
            verdict = "undecided: the A/A control moved"
        qmax = pd.to_numeric(use[use.get("policy", pd.Series(dtype=str)) == p].get("queue_s_max"), errors="coerce")
        out.append({"policy": p, "interactive_ttft_ratio": d.estimate if d else one[INTERACTIVE.name],
                    "interactive_ttft_ratio_low": d.low if d else nan, "interactive_ttft_ratio_high": d.high if d else nan,
                    "interactive_verdict": _words(d), "background_e2e_ratio": b.estimate if b else one[BACKGROUND.name],
                    "background_e2e_ratio_low": b.low if b else nan, "background_e2e_ratio_high": b.high if b else nan,
                    "background_verdict": _words(b),
                    "queue_s_max": float(qmax.max()) if qmax is not None and qmax.notna().any() else nan,
                    "rounds": int(row["rounds"]) if row is not None else int(mixed["replicate"].nunique()),
                    "level": d.level if d else nan, "recommended": verdict == "faster", "verdict": verdict,
                    "aa_ratio": aa["aa_ratio"], "aa_low": aa["aa_low"], "aa_high": aa["aa_high"],
                    "aa_verdict": aa["aa_verdict"], "design": aa["design"]})
    return pd.DataFrame(out)


def finding(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> evidence.Finding:
    """The headline: the policy design's verdict, which policy helps the interactive requests' TTFT against ``fcfs``
    and what it costs the background requests (:func:`_policy_finding`; ``run_dir``: the pick against its runner-up
    from the design's table); then, where sharing was measured off and on, what prefix sharing saved
    (:func:`prefix_finding`, its own verdict in words). The finding's verdict is the policies'."""
    main = _policy_finding(points, requests, run_dir)
    prefix = prefix_finding(points, requests)
    return main if prefix is None else evidence.join([main, prefix])


def _policy_finding(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> evidence.Finding:
    rec = recommend(points, requests)
    use = _usable(points)
    use = use[use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"] if not use.empty else use
    ids = evidence.point_ids(use)
    n = int(len(requests[requests["point_id"].isin(use["point_id"])])) if "point_id" in requests and len(use) else 0
    if rec.empty:
        return evidence.Finding("Scheduling: undecided: no usable fcfs and policy points to compare.",
                                f"{len(use)} usable points", False, ids, verdict="undecided")
    waits = "; ".join(f"{r.policy}: longest wait {r.queue_s_max:.2f} s" for r in rec.itertuples()
                      if r.queue_s_max == r.queue_s_max)
    designed = _designed(points, INTERACTIVE, ("mixed",))
    if not _designed(points, INTERACTIVE, ("mixed",), usable=False).empty and CONTROL not in designed.index:
        return evidence.Finding("Scheduling: undecided: no usable fcfs run of the policy design (marked invalid: "
                                "other load, drift or stopped early).", f"{len(use)} usable runs", False, ids,
                                verdict="undecided")
    if designed.empty or CONTROL not in designed.index:
        parts = [f"{r.policy}: interactive TTFT {r.interactive_ttft_ratio:.2f}x of fcfs, background e2e "
                 f"{r.background_e2e_ratio:.2f}x (one run each)" for r in rec.itertuples()]
        return evidence.Finding("Scheduling: undecided: one round (each policy ran once; the run is the unit under a "
                                "queue, so one pair of runs decides nothing): " + "; ".join(parts) + ".",
                                f"{len(use)} usable runs, {n} requests" + (f"; {waits}" if waits else ""), False, ids,
                                verdict="undecided")
    ctrl = designed.loc[CONTROL]
    per = checks.int_or(ctrl.get("requests_planned"), 0)
    rate = checks.float_or_nan(ctrl.get("offered_rps"))
    setting = f"{int(ctrl['rounds'])} rounds of {per} requests at {rate:.2f} req/s, a fresh engine per run"
    decisions = {p: design.decision_from_row(designed.loc[p], INTERACTIVE) for p in rec["policy"] if p in designed.index}
    decisions = {p: d for p, d in decisions.items() if d is not None}
    secs = checks.float_or_nan(ctrl.get("seconds_per_round"))
    est = {p: d.estimate for p, d in decisions.items() if d is not None and d.estimate == d.estimate}
    pick = min(est, key=est.get) if est else None
    def clause(p, d, name):
        b = design.decision_from_row(designed.loc[p], BACKGROUND)
        return (d.describe(name, words=TIME_WORDS, seconds_per_round=secs) +
                ("; " + b.describe("background e2e", words=TIME_WORDS) if b is not None else ""))

    clauses = [clause(p, d, f"{p} vs fcfs, interactive TTFT") for p, d in decisions.items()]
    if pick is not None and est[pick] < 1:
        d = decisions[pick]
        row = designed.loc[pick]
        fields = design.finding_fields(row, d)
        lead = (f"For interactive traffic mixed with long reports ({setting}), {pick} against fcfs: "
                + "; ".join([clause(pick, d, "interactive TTFT (the class's mean per run)")]
                            + [c for q, c in zip(decisions, clauses) if q != pick]) + ".")
        rest = sorted((q for q in est if q != pick), key=est.get)
        said, open_ = design.versus_runner_up(run_dir, EXPERIMENT, INTERACTIVE.name, pick, rest[0] if rest else None,
                                              rest[0] if rest else "", d, row, TIME_WORDS)
        lead += said
        fields = open_ or fields
    else:   # fcfs kept: a verdict only when every policy is slower beyond noise or equivalent
        first = designed.loc[next(iter(decisions))] if decisions else ctrl
        held = [d for d in decisions.values() if d is not None]
        keep = bool(held) and all((d.verdict == "direction" and d.direction == "higher") or d.verdict == "equivalent"
                                  for d in held)
        fields = design.finding_fields(first)
        fields["verdict"] = "direction" if keep else "undecided"
        lead = (f"For interactive traffic mixed with long reports ({setting}): keep fcfs: "
                + ("every policy is slower beyond noise or equivalent" if keep else
                   "no policy shown faster, but not every one is decided slower or equivalent")
                + ". " + "; ".join(clauses) + ".")
    aa = aa_control(points)
    if aa is not None and aa["aa_verdict"] == "direction":
        lead += " The A/A control moved (fcfs against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    method = next((d.method for d in decisions.values() if d is not None), "")
    ev = (f"{len(use)} usable runs, {n} requests; per run the interactive class's mean TTFT and the background class's "
          f"mean e2e; {design.evidence_text(ctrl)}; {method}" + (f"; {waits}" if waits else ""))
    return evidence.Finding(lead, ev, False, ids, **fields)


# ----------------------------------------------------------------------------- figures


def _measured_both_ways(points: pd.DataFrame) -> bool:
    """Whether some prefix workload has points with sharing off and on (usable or not)."""
    if points is None or points.empty or not {"workload", "prefix_sharing"} <= set(points.columns):
        return False
    pre = points[points["workload"].isin(PREFIX_WORKLOADS)]
    return any(g["prefix_sharing"].fillna(False).astype(bool).nunique() == 2 for _, g in pre.groupby("workload"))


def prefix_cache_savings(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Cache hit rate with prefix sharing on against the run TTFT ratio on / off (the prefix design's simultaneous
    interval as the bar), one marker per prefix workload, its verdict and rounds in the label
    (:func:`prefix_savings`)."""
    return prefix_savings_figure(prefix_savings(points, requests), _measured_both_ways(points))


def policy_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each policy's interactive TTFT over fcfs's with the simultaneous interval its verdict was read from, each
    round's ratio faint (the design's table), the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    rows = _designed(points, INTERACTIVE, ("mixed",))
    rows = rows[rows.index != AA_ARM].reset_index()
    order = {p: i for i, p in enumerate(scheduling.POLICIES)}
    df = rows.assign(point_id=rows["_arm"], policy_order=rows["_arm"].map(order))
    fig = figures_design.ratio_figure(df, "policy_order", INTERACTIVE.prefix,
                                      figures_design.round_ratios(run_dir, EXPERIMENT, INTERACTIVE.name),
                                      name="interactive TTFT ratio", x_title="policy",
                                      y_title="interactive TTFT (class mean per run) / fcfs's (x)",
                                      title="Interactive TTFT against fcfs, the run as the unit (simultaneous 95% "
                                            "intervals; faint: each round; grey band: the A/A control)")
    fig.update_xaxes(tickmode="array", tickvals=list(order.values()), ticktext=list(order))
    return fig


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
def figures(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> dict[str, go.Figure]:
    """All figures of the scheduling notebook, by file name (``run_dir``: the policy design's rounds, drawn faint)."""
    out = {
        "sched_class_latency": class_latency(requests),
        "sched_slowdown_vs_length": slowdown_vs_length(requests),
        "sched_longest_wait": longest_wait(points),
        "sched_eta_error": eta_error(requests),
        "sched_goodput_per_class": goodput_per_class(points),
        "sched_ttft_by_turn": ttft_by_turn(points, requests),
        "sched_prefix_savings": prefix_cache_savings(points, requests),
        "sched_recommendation": recommendation_table(points, requests),
    }
    if not _designed(points, INTERACTIVE, ("mixed",)).empty:
        out["sched_policy_ratio"] = policy_ratio_figure(points, run_dir)
    return out
