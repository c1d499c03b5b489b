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

**Parts** (this module is the experiment's face: :class:`Config`, :func:`measure_point`, :func:`run`,
:func:`finding`, :func:`figures`, and every name below re-exported): :mod:`.runs` (the arms, the outcomes and the
per-run statistics both designs judge), :mod:`.policies` (the policy design, its table, finding and figures),
:mod:`.prefix` (the multi-turn and shared-prefix points, the prefix design, what sharing saved).
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.errors import ParameterError
from workbench.experiments.scheduling.policies import (
    aa_control,
    calibration,
    mixed_columns,
    policy_design,
    policy_finding,
    policy_ratio_figure,
    recommend,
    recommendation_table,
)
from workbench.experiments.scheduling.prefix import (
    multiturn_point,
    prefix_cache_savings,
    prefix_design,
    prefix_finding,
    prefix_savings,
    prefix_sharing_available,
    shared_prefix_point,
)
from workbench.experiments.scheduling.runs import (
    AA_ARM,
    BACKGROUND,
    CONTROL,
    ENGINES,
    EXPERIMENT,
    INTERACTIVE,
    PREFIX_AA_ARM,
    PREFIX_DESIGN,
    PREFIX_WORKLOADS,
    SHARING,
    TIME_WORDS,
    TRACE_FIELDS,
    WORKLOADS,
    designed_arms,
    run_statistics,
    run_values,
)
from workbench.load.traces import calibrate, check_class_slos, read_mixed_trace, run_policy, trace_rows
from workbench.measure.generation import GenerationSettings
from workbench.run import design, sweeps
from workbench.run.point_result import PointResult
from workbench.serving import options, scheduling
from workbench.share.figures_serving import (
    class_latency,
    eta_error,
    goodput_per_class,
    longest_wait,
    slowdown_vs_length,
    ttft_by_turn,
)
from workbench.share.plots import split_by_device
from workbench.stats import evidence
from workbench.stats.classes import CLASSES, class_summary

#: the experiment's face: what notebook 11, the report and the tests read as ``scheduling.<name>``
__all__ = [
    "EXPERIMENT", "PREFIX_DESIGN", "CONTROL", "AA_ARM", "PREFIX_AA_ARM", "INTERACTIVE", "BACKGROUND", "SHARING",
    "WORKLOADS", "PREFIX_WORKLOADS", "ENGINES", "TRACE_FIELDS", "TIME_WORDS", "Config", "prefix_sharing_available",
    "measure_point", "multiturn_point", "shared_prefix_point", "calibrate", "run_values", "policy_design",
    "prefix_design", "run", "run_statistics", "aa_control", "prefix_savings", "prefix_finding", "recommend",
    "finding", "policy_finding", "class_summary", "prefix_cache_savings", "policy_ratio_figure",
    "recommendation_table", "figures",
]


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

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The policies' design (:func:`policy_design`, ``workbench plan``): one arm per policy, the run the unit,
        ``rounds`` first; the prefix design beside it is planned as the policies' is."""
        return ((EXPERIMENT, len(self.policies), int(self.rounds), int(self.max_rounds)) if self.policy_design()
                else None)

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
        return multiturn_point(loaded, cfg, bool(point.get("prefix_sharing")))
    if point["workload"] == "shared_prefix":
        return shared_prefix_point(loaded, cfg, bool(point.get("prefix_sharing")))
    cal = calibration(loaded, cfg, state)
    rows_in = trace_rows(cfg, cal["rate_rps"], int(point.get("replicate", 0)))
    rows, res, warmup_s = run_policy(loaded, cfg, point["policy"], rows_in, cal["alone_s"])
    return PointResult(requests=rows, wall_s=res.summary["wall_s"], warmup_s=warmup_s,
                       extra=mixed_columns(cfg, cal, rows, res))


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


# ----------------------------------------------------------------------------- the finding and figures


def finding(points: pd.DataFrame, requests: pd.DataFrame, run_dir=None) -> evidence.Finding:
    """The headline: the policy design's verdict, which policy helps the interactive requests' TTFT against ``fcfs``
    and what it costs the background requests (:func:`policy_finding`; ``run_dir``: the pick against its runner-up
    from the design's table); then, where sharing was measured off and on, what prefix sharing saved
    (:func:`prefix_finding`, its own verdict in words). The finding's verdict is the policies'."""
    main = policy_finding(points, requests, run_dir)
    prefix = prefix_finding(points, requests)
    return main if prefix is None else evidence.join([main, prefix])


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
    if not designed_arms(points, INTERACTIVE, ("mixed",)).empty:
        out["sched_policy_ratio"] = policy_ratio_figure(points, run_dir)
    return out
