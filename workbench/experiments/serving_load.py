"""Experiment 08: serving under load (notebook ``08_serving_load``; issue 13, docs/design.md section 7 item 8).

Requests arrive at some rate; an engine (:mod:`workbench.serving.engines`: ``fifo``, ``static`` window,
``continuous`` batching from ``transformers``) schedules them; TTFT, TPOT and goodput move as the offered
load grows until the server saturates (the knee). Per engine the grid is a sweep
(:mod:`workbench.load.load`): ``synchronous`` (one at a time), ``throughput`` (every request at once),
then ``sweep_points`` open-loop rates evenly between the two measured request rates, each with
``requests_per_point`` requests of ``prompt_tokens`` prompt and ``max_new_tokens`` fixed-length output
(greedy). Open-loop latencies count from the scheduled arrival (no coordinated omission); an over-saturated
rate stops early by the recorded rule. Per point (:func:`point_columns`): the usual latency percentiles;
request, output, input and total token throughput and goodput over the measured window (completions inside
it per second of it, :func:`workbench.load.load.apply_window`: not biased low by a short run); mean
concurrency with its Little's-law check; ``queue_s`` percentiles; SLO attainment over the requests planned
for the window (unsent and unfinished ones are misses) with its Wilson 95% interval, goodput and the
percentile check per preset (:mod:`workbench.stats.slo`); the engine's running requests over the window
(``engine_batch_mean`` / ``_max``); the time slices and the stop rule. :func:`recommend` (beside the knees in
:mod:`workbench.load.saturation`) gives, per SLO preset, the engine and the highest measured rate that met it
(:func:`workbench.stats.slo.verdict`: attainment's one-sided 95% lower bound reaches ``attainment_target``; the MLPerf presets at their stated p99, undetermined below 100
requests);
:func:`search` finds that rate by bisection (:func:`search_engines` runs it on its own, without the sweep:
``benchmarks/serving.py``). The knee (:func:`workbench.load.saturation.knees`) is the highest open-loop rate that kept up
(:func:`kept_up`, the one definition, three-valued: kept up / fell behind / undetermined from the noise band of the
arrival and completion counts, :mod:`workbench.load.saturation`), below the first that did not; stopped-early
points take part in that scan as "fell behind". Recommendations use usable points only
(:func:`workbench.stats.evidence.usable_points`: valid, open-loop, not stopped early).

**The engines compared under one load** (issue 49; :func:`engine_design`): with ``repeats`` >= 2 and two or more
``compare_engines`` the built-in engines are the arms of one design, the run the unit (a queue carries one
request's delay into every later one: :mod:`workbench.stats.replicates`). Each round runs every engine once on the
same arrivals (``compare_arrival``: constant by default, so that rounds differ by the machine's noise alone; a
random process's trace is seed ``seed + round``), ``compare_requests`` requests at one offered rate, each run on a
fresh engine, in a shuffled order, and ``compare_control`` (``fifo``: one request at a time) again as the A/A arm; the
rate is ``compare_load`` times the control's one-at-a-time rate, measured once by a synchronous probe of
``compare_requests`` requests on it (kept in ``serving_load_compare.json``, so a resume runs at the same rate). The
outcome is one statistic per run: its TTFT p50 (primary, ``ttft_vs_control``) and its output throughput, output
tokens over the run's wall time (secondary, ``throughput_ratio``); one block analysis of the rounds (rounds as blocks, one residual
variance pooled over the engines, Dunnett's simultaneous intervals) gives each engine three verdicts against the
control. Each run is a point of its own (``comparison`` = ``engines``), left out of the knee scan, the
recommendation and the twin's validation (their open-loop sweep is the points without it); the finding leads with
the engines' verdicts (:func:`engines_finding`).

Transport: ``inprocess`` submits straight to the engine (no HTTP); ``http`` runs the OpenAI-compatible
server (:mod:`workbench.serving.server`) with the engine behind it and drives it with the load generator's
``httpx`` client, token counts from the server's ``usage``.

External target (issue 23): ``"endpoint"`` in ``engines`` with ``endpoint: {url, model, api_key_env, name}``
(:mod:`workbench.load.endpoint`) runs the same grid against any OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp) over HTTP, its points labelled ``name``; :func:`check_targets` checks it in one line before any point
runs. Its engine-side columns (``queue_s``, ``prefill_s``, ``engine_batch_*``) stay empty and ``server_side_note``
says why. An endpoint-only run loads the tokenizer alone (:func:`load_for`), for the prompts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import endpoint as endpoint_mod
from workbench.load import load, saturation
from workbench.load.bench import Bench, achieved_rps, run_profile, run_sampled
from workbench.load.bench import slo_rate_search as search
from workbench.load.saturation import knee_points, knee_scan, point_rates
from workbench.measure.generation import GenerationSettings
from workbench.run import design, sweeps
from workbench.run.point_result import PointResult
from workbench.serving import engines as engines_mod
from workbench.serving import options
from workbench.share import figures_design
from workbench.share.figures_serving import gantt, goodput_vs_rate, latency_vs_throughput, queue_vs_rate, time_slices
from workbench.share.plots import ok_points, split_by_device, table_figure
from workbench.stats import evidence, metrics, replicates, slo

EXPERIMENT = "serving_load"
ARRIVALS = load.ARRIVALS
TRANSPORTS = ("inprocess", "http")
TARGETS = engines_mod.ENGINES + (endpoint_mod.ENDPOINT,)  # what ``engines`` may list
COMPARISON = "engines"   # the ``comparison`` column of the engine comparison's runs (the knee sweep's: empty)
COMPARE_FILE = f"{EXPERIMENT}_compare.json"   # the comparison's offered rate and the probe it came from
#: the engine comparison's per-run outcomes: its TTFT p50 (primary) and its output throughput over the whole run
#: (secondary: its output tokens over first send to last completion; the counting window's figure, first to last
#: completion, is a few ms for a batch of 8 finishing together)
TTFT = design.Outcome("ttft_s_p50", False, "TTFT p50 of the run", "ttft_vs_control")
THROUGHPUT = design.Outcome("run_output_tps", True, "output throughput of the run", "throughput_ratio")


@dataclasses.dataclass
class Config(sweeps.SweepConfig, design.DesignFields):
    """The serving-under-load sweep (notebook ``08_serving_load``).

    With ``repeats`` >= 2 and two or more ``compare_engines`` the engines are also compared under one load (module
    docstring, :func:`engine_design`): ``repeats`` rounds first, up to ``max_rounds`` while an engine's comparison is
    undecided and ``budget_s`` allows; ``margin`` its equivalence margin.

    Attributes:
        engines: subset of ``fifo``, ``static``, ``continuous`` and ``endpoint`` (the external ``endpoint``).
        endpoint: the external OpenAI-compatible target, ``{url, model, api_key_env, name}``
            (:class:`workbench.load.endpoint.Endpoint`); needed when ``engines`` lists ``endpoint``.
        transport: ``inprocess`` (engine directly) or ``http`` (through the server); built-in engines only.
        requests_per_point: requests sent per point (>= 2).
        closed_loop_requests: requests of the ``synchronous`` and ``throughput`` points (2 to
            ``requests_per_point``; None: ``requests_per_point``). Their rates set the sweep's range, which a few
            requests measure (a closed loop has no arrival process); the open-loop points' in-flight growth test
            decides "kept up" from many (at 40 requests its 90% band is +/-0.05-0.15 around the growth, at 80
            +/-0.02-0.05: :func:`workbench.load.load.backlog_growth`).
        prompt_tokens: prompt length, chat template included (>= 32).
        max_new_tokens: fixed output length per request (``ignore_eos``).
        max_batch_size: the batch limit of ``static`` and ``continuous``.
        batch_window_s: the ``static`` engine's batching window (seconds, >= 0).
        sweep_points: open-loop rates between the synchronous and maximum rates (>= 1).
        arrival: ``constant``, ``poisson`` or ``gamma`` for the swept rates.
        burstiness: gamma shape (> 0; 1 is Poisson).
        warmup_s, cooldown_s: excluded windows (seconds, >= 0).
        slice_s: time-slice width (seconds, > 0).
        max_in_flight, max_wait_s: the over-saturation stop rule.
        slo_presets: named presets to evaluate (:data:`workbench.stats.slo.PRESETS`).
        slo_ttft_s, slo_tpot_s: the custom SLO (columns ``goodput_rps``, ``slo_attainment``).
        attainment_target: share of requests that must meet an SLO (0, 1].
        search: run the bisection search per engine after the sweep; ``search_slo`` its preset (or ``custom``);
            ``search_steps`` measurements; ``search_tolerance`` relative width of the final bracket.
        rounds: replicate runs of the open-loop points (>= 1): round ``k`` uses arrival seed ``seed + k`` and a
            fresh engine per run (the run is the unit under a queue: :mod:`workbench.stats.replicates`).
        aa_control: measure the first engine's open-loop points twice per round (arm ``aa``, the same seeds, the
            arm order alternating by round): the A/A control, its TTFT p90 ratio paired by (rate, round) the
            experiment's noise floor (:func:`aa_control`).
        compare_engines: the built-in engines compared under one load (empty: no comparison).
        compare_control: the comparison's marked control (one of ``compare_engines``; measured again each round as
            the A/A arm).
        compare_requests: requests of each comparison run (>= 2), and of the control's synchronous probe.
        compare_load: the comparison's offered rate over the control's one-at-a-time rate (> 0). Far above 1 (the
            default, 4: a burst) every engine drains a queue and its TTFT scales with the machine's speed, which the
            rounds' blocks remove; near 1 the control sits at its knee, where a 30% swing of the speed moves its TTFT
            many-fold (at 1.5, 8-request runs on a loaded VM: fifo's p50 0.4-1.9 s between rounds, nothing decided).
        compare_arrival: the comparison's arrival process (``constant``: every round the same arrival times, so the
            rounds differ by the machine's noise alone; ``poisson`` / ``gamma``: a trace per round, seed ``seed +
            round``, shared by the engines of the round).
    """

    engines: list = dataclasses.field(default_factory=lambda: list(engines_mod.ENGINES))
    endpoint: dict | None = None
    transport: str = "inprocess"
    requests_per_point: int = 12
    closed_loop_requests: int | None = None
    prompt_tokens: int = 64
    max_new_tokens: int = 16
    max_batch_size: int = 8
    batch_window_s: float = 0.05
    sweep_points: int = 2
    arrival: str = "poisson"
    burstiness: float = 1.0
    warmup_s: float = 0.0
    cooldown_s: float = 0.0
    slice_s: float = 2.0
    max_in_flight: int = 32
    max_wait_s: float = 60.0
    slo_presets: list = dataclasses.field(default_factory=lambda: [  # every preset but the 405B model's two
        "interactive_chat", "code_completion", "rag", "batch_offline", "mlperf_server", "mlperf_interactive"])
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    attainment_target: float = 0.9
    search: bool = False
    search_slo: str = "custom"
    search_steps: int = 4
    search_tolerance: float = 0.1
    rounds: int = 1
    aa_control: bool = False
    engine_options: dict = dataclasses.field(default_factory=dict)
    compare_engines: list = dataclasses.field(default_factory=lambda: list(engines_mod.ENGINES))
    compare_control: str = "fifo"
    compare_requests: int = 8
    compare_load: float = 4.0
    compare_arrival: str = "constant"

    def engine_options_for(self, engine: str, **fixed) -> options.EngineOptions:
        """The engine's options: ``engine_options`` with this notebook's own engine fields."""
        return options.from_mapping(options.EngineOptions, self.engine_options, "engine_options", engine=engine,
                                    max_batch_size=self.max_batch_size, batch_window_s=self.batch_window_s, **fixed)

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        checks.check_choice_list("engines", self.engines, TARGETS)
        self.target()  # the endpoint's shape (no network; check_targets reaches it)
        checks.check_choice("transport", self.transport, TRANSPORTS)
        checks.check_int("requests_per_point", self.requests_per_point, lo=2)
        if self.closed_loop_requests is not None:
            checks.check_int("closed_loop_requests", self.closed_loop_requests, lo=2, hi=self.requests_per_point)
        checks.check_int("max_new_tokens", self.max_new_tokens, lo=1)
        checks.check_int("prompt_tokens", self.prompt_tokens, lo=32, hi=self.max_context() - self.max_new_tokens)
        checks.check_int("max_batch_size", self.max_batch_size, lo=1)
        checks.check_float("batch_window_s", self.batch_window_s, lo=0)
        for e in self.engines:
            if e in engines_mod.ENGINES:
                self.engine_options_for(e)  # the options' one-line errors, before any model loads
        checks.check_int("sweep_points", self.sweep_points, lo=1)
        checks.check_choice("arrival", self.arrival, ARRIVALS)
        checks.check_float("burstiness", self.burstiness, lo=0, lo_open=True)
        checks.check_float("warmup_s", self.warmup_s, lo=0)
        checks.check_float("cooldown_s", self.cooldown_s, lo=0)
        checks.check_float("slice_s", self.slice_s, lo=load.MIN_SLICE_S)
        checks.check_int("max_in_flight", self.max_in_flight, lo=1)
        checks.check_float("max_wait_s", self.max_wait_s, lo=0, lo_open=True)
        checks.check_choice_list("slo_presets", self.slo_presets, tuple(slo.PRESETS), allow_empty=True)
        checks.check_float("slo_ttft_s", self.slo_ttft_s, lo=0, lo_open=True)
        checks.check_float("slo_tpot_s", self.slo_tpot_s, lo=0, lo_open=True)
        checks.check_float("attainment_target", self.attainment_target, lo=0, hi=1, lo_open=True)
        checks.check_bool("search", self.search)
        checks.check_choice("search_slo", self.search_slo, tuple(slo.PRESETS) + ("custom",))
        checks.check_int("search_steps", self.search_steps, lo=2)
        checks.check_float("search_tolerance", self.search_tolerance, lo=0, lo_open=True)
        checks.check_int("rounds", self.rounds, lo=1)
        checks.check_bool("aa_control", self.aa_control)
        checks.check_choice_list("compare_engines", self.compare_engines, engines_mod.ENGINES, allow_empty=True)
        if self.compare_engines:
            checks.check_choice("compare_control", self.compare_control, tuple(self.compare_engines))
        checks.check_int("compare_requests", self.compare_requests, lo=2)
        checks.check_float("compare_load", self.compare_load, lo=0, lo_open=True)
        checks.check_choice("compare_arrival", self.compare_arrival, ARRIVALS)

    def compares(self) -> bool:
        """Whether the engines are compared under one load (:func:`engine_design`): 2+ rounds (``repeats``) and 2+
        ``compare_engines``."""
        return self.repeats >= 2 and len(self.compare_engines) >= 2

    def settings(self) -> GenerationSettings:
        """Every request: greedy, fixed length ``max_new_tokens``."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=True, seed=self.seed)

    def target(self) -> "endpoint_mod.Endpoint | None":
        """The external endpoint when ``engines`` lists ``endpoint``, else None.

        Raises:
            ParameterError: ``endpoint`` listed without an ``endpoint`` mapping, a mapping without ``endpoint``
                listed, or a bad mapping (:meth:`workbench.load.endpoint.Endpoint.from_param`).
        """
        listed = endpoint_mod.ENDPOINT in self.engines
        if listed and self.endpoint is None:
            raise ParameterError("endpoint: engines lists 'endpoint' but no endpoint {url, model} is given")
        if not listed and self.endpoint is not None:
            raise ParameterError("endpoint: given, but engines does not list 'endpoint' (add it to engines)")
        return endpoint_mod.Endpoint.from_param(self.endpoint, engines_mod.ENGINES) if listed else None

    def engine_names(self) -> list[str]:
        """The point labels in order: built-in engine names, the endpoint as its ``name``."""
        ep = self.target()
        return [ep.name if e == endpoint_mod.ENDPOINT else e for e in self.engines]

    def needs_model(self) -> bool:
        """Whether a built-in engine runs, in the sweep or in the engine comparison (an endpoint-only run needs the
        tokenizer alone)."""
        return any(e in engines_mod.ENGINES for e in self.engines) or self.compares()

    def grid(self) -> list[dict]:
        """Per engine: synchronous, throughput, then ``sweep_points`` open-loop steps (engine outermost); the
        endpoint's points carry its ``name``. Then, when the engines are compared (:meth:`compares`), per round up to
        ``max_rounds`` one run per compared engine and the control's A/A run (``comparison`` = ``engines``,
        ``replicate`` the round, ``arm`` ``main`` / ``aa``): the design records the rounds it takes."""
        pts = []
        names = self.engine_names()
        for e in names:
            pts += [{"engine": e, "profile": "synchronous", "step": 0}, {"engine": e, "profile": "throughput", "step": 0}]
            if self.rounds == 1 and not self.aa_control:
                pts += [{"engine": e, "profile": self.arrival, "step": i + 1} for i in range(self.sweep_points)]
                continue
            for k in range(self.rounds):  # replicate runs: a seed per round, the A/A arm alternating with the main
                arms = ["main", "aa"] if self.aa_control and e == names[0] else ["main"]
                for arm in arms[:: -1 if k % 2 else 1]:
                    pts += [{"engine": e, "profile": self.arrival, "step": i + 1, "replicate": k, "arm": arm}
                            for i in range(self.sweep_points)]
        if self.compares():   # the engine comparison: a point per run it takes, up to max_rounds rounds
            for k in range(self.max_rounds):
                pts += [{"engine": e, "profile": self.compare_arrival, "comparison": COMPARISON, "replicate": k,
                         "arm": "main"} for e in self.compare_engines]
                pts.append({"engine": self.compare_control, "profile": self.compare_arrival, "comparison": COMPARISON,
                            "replicate": k, "arm": "aa"})
        return pts

    def slos(self) -> list:
        return [slo.get(n) for n in self.slo_presets] + [slo.get("custom", self.slo_ttft_s, self.slo_tpot_s)]


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One load point: run its profile on the point's engine and summarise the kept window.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"engine", "profile"}`` (and ``step`` for the swept rates).
        state: shared by the points of one sweep: ``bench``, the live engine (and server) with the rates
            measured so far (a :class:`workbench.load.bench.Bench` is made on the first point when absent; the caller closes it),
            and ``last_point``, ``{engine: its last point}``: the engine is stopped after that point.

    Returns:
        :class:`workbench.run.point_result.PointResult`: kept request rows, ``wall_s`` of the kept
        window, ``warmup_s`` and ``extra`` (offered rate, window, stop rule, queue percentiles, SLO
        attainment / goodput / percentile checks per preset, time slices as JSON).
    """
    if "bench" not in state:
        state["bench"] = Bench(cfg, loaded)
    bench: Bench = state["bench"]
    e, prof = point["engine"], point["profile"]
    if "replicate" in point:
        bench.close()  # a replicate run gets a fresh engine (a queue's state never carries over)
    warm = bench.open(e)
    rate = None
    if prof in ARRIVALS:
        r = bench.rates.get(e, {})
        if "synchronous" not in r or "throughput" not in r:
            raise ParameterError(f"{e}: the swept rates need this engine's synchronous and throughput points first")
        rate = load.sweep_rates(r["synchronous"], r["throughput"], cfg.sweep_points)[point["step"] - 1]
    res, engine_batch = run_sampled(bench, cfg, prof, rate, cfg.seed + int(point.get("replicate", 0)))
    wall = res.summary["wall_s"]
    achieved = achieved_rps(res)
    if prof in ("synchronous", "throughput"):
        bench.rates.setdefault(e, {})[prof] = achieved
    rows = _kept_rows(res, cfg)
    extra = point_columns(res, cfg, rate, achieved)
    extra.update(engine_batch)
    ep = cfg.target()
    external = ep is not None and e == ep.name
    notes = sorted({r.get("server_side_note") or "" for r in rows}) if external else [""]
    extra.update(server_side_note="; ".join(n for n in notes if n) if external else "",
                 **(ep.describe() if external else {}))
    if state.get("last_point", {}).get(e) == point:
        bench.close()
    return PointResult(requests=rows, wall_s=wall, warmup_s=warm, extra=extra)


def point_columns(res: load.LoadResult, cfg: Config, rate: float | None, achieved_rps: float) -> dict:
    """A load point's columns from its run (they replace the sweep's per-wall-time figures of the same name).

    Returns:
        The run's summary (send window, counting window ``window_s``, planned / unsent / incomplete requests,
        stop rule, arrival and completion rates), ``offered_rps`` (the open-loop rate, else the achieved one),
        ``rate_rps``, ``queue_s`` percentiles, the window figures of :func:`workbench.load.load.window_figures`
        (``request_throughput_rps``, ``output_throughput_tps``, ``input_throughput_tps``, ``total_throughput_tps``,
        ``mean_concurrency``, ``littles_law_ratio``), per SLO preset ``slo_attainment_<name>``,
        ``slo_attainment_low_<name>`` / ``_high_<name>`` (two-sided Wilson 95%), ``slo_attainment_lower_<name>`` /
        ``_upper_<name>`` (one-sided 95% bounds, :func:`workbench.stats.slo.one_sided_bounds`), ``goodput_rps_<name>`` and
        ``percentiles_ok_<name>``
        (:func:`workbench.stats.slo.evaluate` over the planned requests and the counting window), the custom SLO's
        ``slo_attainment`` (with ``_low`` / ``_high``), ``goodput_rps`` and ``percentiles_ok``, ``kept_up``
        (:func:`kept_up`) and ``slices_json``.
    """
    kept = res.kept()
    summ = res.summary
    extra = {k: v for k, v in summ.items() if k not in ("wall_s", "rate", "concurrency", "profile")}
    extra.update(offered_rps=rate if rate is not None else achieved_rps, rate_rps=rate,
                 **{f"queue_s_{k}": v for k, v in metrics.percentiles(kept.get("queue_s", []), (50, 90, 99)).items()},
                 **load.window_figures(res.rows, summ), slices_json=res.slices.to_json(orient="records"))
    planned, window_s = summ["requests_planned_window"], summ["window_s"]
    for s in cfg.slos():
        ev = slo.evaluate(kept, s, window_s, planned)
        extra.update({f"slo_attainment_{s.name}": ev["slo_attainment"],
                      f"slo_attainment_low_{s.name}": ev["slo_attainment_low"],
                      f"slo_attainment_high_{s.name}": ev["slo_attainment_high"],
                      f"slo_attainment_lower_{s.name}": ev["slo_attainment_lower"],
                      f"slo_attainment_upper_{s.name}": ev["slo_attainment_upper"],
                      f"goodput_rps_{s.name}": ev["goodput_rps"], f"percentiles_ok_{s.name}": ev["percentiles_ok"]})
        if s.name == "custom":
            extra.update({k: ev[k] for k in ("slo_attainment", "slo_attainment_low", "slo_attainment_high",
                                             "slo_attainment_lower", "slo_attainment_upper", "goodput_rps",
                                             "percentiles_ok")})
    extra["kept_up"] = kept_up(dict(extra, profile=summ["profile"]))
    return extra


def _compare_config(cfg: Config) -> Config:
    """The comparison runs' config: ``compare_requests`` requests a run, no warm-up of their own (each engine is
    warmed once before its first run: :func:`engine_design`'s ``prepare``)."""
    return dataclasses.replace(cfg, requests_per_point=cfg.compare_requests, closed_loop_requests=None, warmup=0,
                               repeats=1)


def compare_rate(cfg: Config, loaded, run_dir=None, bench: Bench | None = None) -> dict:
    """The engine comparison's offered rate: ``compare_load`` times the control's one-at-a-time rate, from a
    synchronous probe of ``compare_requests`` requests on a fresh control engine. Kept in the run folder
    (:data:`COMPARE_FILE`), so a resumed design runs its next rounds at the rate of its first.

    Returns:
        ``{"rate_rps", "synchronous_rps", "engine", "requests", "compare_load"}``.
    """
    import json as json_mod

    path = Path(run_dir) / COMPARE_FILE if run_dir is not None else None
    if path is not None and path.is_file():
        got = json_mod.loads(path.read_text(encoding="utf-8"))
        if got.get("engine") == cfg.compare_control and got.get("requests") == cfg.compare_requests:
            return got
    bench = bench or Bench(_compare_config(cfg), loaded)
    try:
        bench.close()
        bench.open(cfg.compare_control)
        res = run_profile(bench, bench.cfg, "synchronous")
    finally:
        bench.close()
    sync = achieved_rps(res)
    if not (sync == sync and sync > 0):
        raise RuntimeError(f"compare_control: {cfg.compare_control}'s synchronous probe completed no request")
    got = {"rate_rps": cfg.compare_load * sync, "synchronous_rps": sync, "engine": cfg.compare_control,
           "requests": cfg.compare_requests, "compare_load": cfg.compare_load}
    if path is not None:
        from workbench.run import results

        results.save_text(run_dir, COMPARE_FILE, json_mod.dumps(got))
    return got


def engine_design(cfg: Config, loaded, run_dir=None) -> design.SweepDesign:
    """The engines compared under one load as one design (module docstring): the arms are ``compare_engines``,
    ``compare_control`` the marked control and the A/A arm; arm ``e`` in round ``k`` is one run of ``compare_requests``
    requests at :func:`compare_rate`'s rate (``cfg.compare_arrival``, arrival seed ``seed + k`` for every arm) on a fresh
    engine ``e``, one point per run (``unit_of``: the ``comparison`` points' ``(engine or A/A, replicate)``).
    Outcomes per run: :data:`TTFT` (the kept requests' TTFT p50, primary) and :data:`THROUGHPUT` (its output tokens
    over its wall time); each run's point columns are :func:`point_columns`'.

    Returns:
        :class:`workbench.run.design.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    import time

    small = _compare_config(cfg)
    bench = Bench(small, loaded)
    state: dict = {}

    def rate() -> float:
        if "rate" not in state:
            state["rate"] = compare_rate(cfg, loaded, run_dir, bench)["rate_rps"]
        return state["rate"]

    def prepare(engine):   # once per engine: its first calls, a batch of two requests, untimed
        t0 = time.perf_counter()
        warm = Bench(dataclasses.replace(small, requests_per_point=2, warmup=max(cfg.warmup, 1)), loaded)
        try:
            warm.open(engine)
        finally:
            warm.close()
        return time.perf_counter() - t0

    def measure(engine, rnd):
        r = rate()
        bench.close()                       # a fresh engine per run: a queue's state never carries over
        warm = bench.open(engine)
        try:
            res, engine_batch = run_sampled(bench, small, cfg.compare_arrival, r, cfg.seed + rnd)
        finally:
            bench.close()
        rows = _kept_rows(res, cfg)
        extra = {**point_columns(res, small, r, achieved_rps(res)), **engine_batch, "warmup_s": warm}
        done = [x["ttft_s"] for x in rows if (x.get("output_tokens") or 0) >= 1 and not load.failed(x)]
        wall = res.summary.get("wall_s", float("nan"))
        tokens = sum(x.get("output_tokens") or 0 for x in rows if not load.failed(x))
        values = {TTFT.name: float(np.median(done)) if done else float("nan"),
                  THROUGHPUT.name: tokens / wall if wall == wall and wall > 0 else float("nan")}
        bad = [k for k, v in values.items() if not (v == v and v > 0)]
        if bad:
            raise RuntimeError(f"{engine} round {rnd}: no {', '.join(bad)} (completed {len(done)} of "
                               f"{cfg.compare_requests} requests; stopped early: {res.summary.get('stopped_early')})")
        return design.Measured(values, rows, res.summary["wall_s"], extra)

    def unit_of(p):
        if p.get("comparison") != COMPARISON:
            return None
        return (design.AA if p.get("arm") == "aa" else p["engine"]), int(p["replicate"])

    d = design.Design(EXPERIMENT, list(cfg.compare_engines), cfg.compare_control, TTFT, (THROUGHPUT,),
                      **cfg.design_kwargs())
    return design.SweepDesign(d, measure, prepare, unit_of=unit_of)


def _kept_rows(res: load.LoadResult, cfg: Config) -> list[dict]:
    """A run's kept request rows as a point records them (bookkeeping stamps dropped, ``engine_batch``)."""
    rows = []
    for r in res.kept().to_dict("records"):
        for k in ("t_scheduled", "t_sent", "t_done", "t_headers"):
            r.pop(k, None)
        r["engine_batch"] = r.pop("batch_size", None)
        rows.append(dict(r, max_new_tokens=cfg.max_new_tokens, temperature=0.0, context_tokens=cfg.prompt_tokens))
    return rows


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The load sweep of ``cfg`` on every engine, then the engine comparison when ``cfg`` makes one
    (:meth:`Config.compares`, :func:`engine_design`: each finished round on disk, a resume continues from the last);
    then the SLO search when ``cfg.search``. With the A/A control its columns (:func:`aa_control`) are saved as
    ``serving_load_aa.json`` in the run folder.

    Returns:
        The experiment's points DataFrame (:func:`workbench.run.sweeps.run_sweep`).
    """
    grid = cfg.grid()
    check_targets(cfg)
    bench = Bench(cfg, loaded)
    if resume:
        recorded_rates(bench.rates, run_dir)
    sweep = [p for p in grid if p.get("comparison") != COMPARISON]
    state = {"bench": bench, "last_point": {p["engine"]: p for p in sweep}}

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    designed = engine_design(cfg, loaded, run_dir) if cfg.compares() else None
    try:  # a tokenizer-only load (endpoint-only run) has no model for the drift reference
        points = sweeps.run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, slo_ttft_s=cfg.slo_ttft_s,
                                  slo_tpot_s=cfg.slo_tpot_s, info=loaded.info,
                                  loaded=loaded if loaded.model is not None else None, config=cfg,
                                  speed_probe=True,  # the twin predicts each point at its moment's speed
                                  design=designed)
        if cfg.aa_control and aa_control(points) is not None:
            from workbench.run import results

            results.save_text(run_dir, f"{EXPERIMENT}_aa.json", json.dumps(aa_control(points), default=float))
        if cfg.search:
            from workbench.run import results

            found = search(cfg, bench, points)
            results.save_text(run_dir, f"{EXPERIMENT}_search.json", found.to_json(orient="records", indent=1))
    finally:
        bench.close()
    return points


def recorded_rates(rates: dict, run_dir) -> dict:
    """Fill ``rates`` (``{engine: {profile: req/s}}``) with the synchronous and throughput rates an earlier session
    of this run recorded (closed-loop points: ``offered_rps`` is the achieved rate), so a resume or
    ``--rerun-invalid`` that measures only a swept point can place its rate; a point measured again in this session
    overwrites its entry. Returns ``rates``."""
    from workbench.run import results

    try:
        pts = results.read_points(run_dir)
    except (OSError, ValueError):
        return rates
    if pts.empty or "experiment" not in pts or "profile" not in pts:
        return rates
    done = pts[(pts["experiment"] == EXPERIMENT) & pts["status"].eq("ok")
               & pts["profile"].isin(["synchronous", "throughput"])]
    for _, r in done.iterrows():
        if r.get("offered_rps") == r.get("offered_rps"):
            rates.setdefault(r["engine"], {})[r["profile"]] = float(r["offered_rps"])
    return rates


def check_targets(cfg: Config) -> dict | None:
    """One-line errors for the external endpoint, before any point runs (and before the model loads, when
    called first): :func:`workbench.load.endpoint.check_endpoint`. None without an endpoint.

    Raises:
        ParameterError: unreachable, key refused, model not served, or not OpenAI-compatible.
    """
    ep = cfg.target()
    return endpoint_mod.check_endpoint(ep) if ep is not None else None


def load_for(cfg: Config):
    """What the run needs loaded: the model (:func:`workbench.measure.models.load_model`) when a built-in engine runs;
    for an endpoint-only run the tokenizer alone (prompts are built with it;
    :func:`workbench.measure.models.load_tokenizer_only`: ``model`` None, no weights)."""
    from workbench.measure import models

    if cfg.needs_model():
        return models.load_model(cfg.model, cfg.device, cfg.dtype)
    return models.load_tokenizer_only(cfg.model)


def search_engines(cfg: Config, loaded) -> pd.DataFrame:
    """:func:`search` for every engine of ``cfg`` (an external endpoint too, checked first: :func:`check_targets`)
    without a sweep (no run folder): the table it returns."""
    check_targets(cfg)
    bench = Bench(cfg, loaded)
    try:
        return search(cfg, bench)
    finally:
        bench.close()


# ----------------------------------------------------------------------------- summaries


KEPT_UP_TOLERANCE = saturation.KEPT_UP_TOLERANCE
kept_up = saturation.kept_up  # the one definition (knee, recommendation, finding, figures, search)
recommend = saturation.recommend  # beside the knees, where the twin's validation reads it too


def aa_control(points: pd.DataFrame, column: str = "ttft_s_p90") -> dict | None:
    """The A/A control: the first engine's open-loop points measured twice per round (arms ``main`` and ``aa``, the
    same rates and seeds, a fresh engine per run), ``column`` (a per-run statistic; ``ttft_s_p50`` when no run has
    the samples for a p90) paired by (rate step, round): :func:`workbench.stats.replicates.aa_columns` (``aa_ratio``,
    ``aa_low``, ``aa_high``, ``design`` ``replicates``, ``rounds`` the pairs) and ``statistic``. None without an
    A/A arm. Valid open-loop points only (stopped-early ones included: the
    statistic of a run is what it is)."""
    if points is None or points.empty or "arm" not in points or column not in points:
        return None
    df = knee_points(points)
    if not (df["arm"] == "aa").any():
        return None
    if df[column].isna().all() and column == "ttft_s_p90" and "ttft_s_p50" in df:
        column = "ttft_s_p50"  # p90 needs 10 independent samples per run
    key = ["engine", "step", "replicate"]
    a = df[df["arm"] == "aa"].groupby(key)[column].first().dropna()
    b = df[df["arm"] == "main"].groupby(key)[column].first().dropna()
    both = a.index.intersection(b.index)
    return dict(replicates.aa_columns(a.loc[both], b.loc[both], "replicates"), statistic=column)


def _attained(r, target: float) -> str:
    """``custom-SLO attainment 1.00 (95% Wilson interval 0.76-1.00)`` of a point row."""
    lo, hi = r.get("slo_attainment_low", np.nan), r.get("slo_attainment_high", np.nan)
    ci = f"95% Wilson interval {lo:.2f}-{hi:.2f}" if lo == lo and hi == hi else "no interval"
    return f"custom-SLO attainment {r.get('slo_attainment', np.nan):.2f} ({ci})"


def _engine_sentence(e: str, g: pd.DataFrame, knee: float, why: str, target: float) -> str:
    """One engine's part of the finding: how far it kept up (three-valued, :func:`kept_up`), the attainment there
    and at the rate that stopped the scan."""
    g = g.assign(_rate=point_rates(g)).sort_values("_rate")
    verdicts = [kept_up(r) for _, r in g.iterrows()]
    if knee == knee:
        at = g[g["_rate"] == knee].iloc[-1]
        text = f"{e}: kept up to {knee:.2f} req/s, {_attained(at, target)} there"
    elif verdicts and verdicts[0] == saturation.UNDETERMINED:
        first = g.iloc[0]
        lo, hi = first.get("backlog_growth_low", np.nan), first.get("backlog_growth_high", np.nan)
        band = (f": its backlog grew {lo:.0%} to {hi:.0%} of arrivals, across the {saturation.KEPT_UP_TOLERANCE:.0%} "
                f"line" if lo == lo and hi == hi else "")
        text = f"{e}: whether it kept up is undetermined even at its lowest open-loop rate (too few requests " \
               f"per point to tell{band}; more requests per point decide)"
    else:
        text = f"{e}: did not keep up even at its lowest open-loop rate"
    nxt = [(r, v) for (_, r), v in zip(g.iterrows(), verdicts) if knee != knee or r["_rate"] > knee][:1]
    if nxt and nxt[0][1] == saturation.FELL_BEHIND:
        r = nxt[0][0]
        comp = r.get("completion_rps", r.get("request_throughput_rps", np.nan))
        how = "stopped early (over-saturated)" if bool(r.get("stopped_early") or False) else \
            f"completions fell behind ({comp:.2f} req/s completed)"
        text += f"; at {r['offered_rps']:.2f} req/s {how}"
        if not bool(r.get("stopped_early") or False):
            text += (f" while {_attained(r, target)} stayed at target: the queue grew within the SLO's slack"
                     if r.get("slo_attainment", np.nan) >= target else f", {_attained(r, target)}")
    elif nxt and knee == knee:
        text += f"; undetermined at {nxt[0][0]['offered_rps']:.2f} req/s"
    return text


def headline(points: pd.DataFrame, target: float = 0.9) -> str:
    """The finding: the recommended engine for the custom SLO (:func:`recommend`) first when there is one, then per
    engine the highest open-loop rate that kept up (:func:`kept_up`, the knee) with the custom SLO's attainment
    there and at the first rate past it; each with its evidence: requests planned per point and attainment with its Wilson 95%
    interval. Only usable points of the sweep count (valid, open-loop, not stopped early; the engine comparison's runs
    are :func:`engines_finding`'s); how many others were left out is said."""
    points = saturation.sweep_points(points)
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        return ("No usable open-loop load point (valid, not stopped early): no knee or recommendation is "
                "supported." if len(points) else "No load point finished.")
    k = knee_scan(points)
    parts = [_engine_sentence(e, g, *k.get(e, (float("nan"), "")), target)
             for e, g in knee_points(points).groupby("engine")]
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    if not custom.empty and custom.iloc[0]["engine"]:
        c = custom.iloc[0]
        ci = (f"95% Wilson interval {c['attainment_low']:.2f}-{c['attainment_high']:.2f}"
              if c["attainment_low"] == c["attainment_low"] else "no interval")
        # the claim the mark rests on leads (its first clause is the finding's headline); the knees follow
        parts.insert(0, f"custom SLO: {c['engine']} up to {c['max_rate_rps']:.2f} req/s ({c['goodput_rps']:.2f} "
                     f"req/s goodput; attainment {c['attainment']:.2f}, {ci}, one-sided 95% lower bound "
                     f"{c['attainment_lower']:.2f} >= {target:.2f}, {c['requests']} requests)")
    elif not custom.empty and str(custom.iloc[0]["verdict"]).startswith("missed"):
        parts.append(f"no engine met the custom SLO (attainment >= {target:.0%}: every usable rate's one-sided 95% "
                     f"upper bound below it)")
    elif not custom.empty:
        parts.append(f"no rate is shown to meet the custom SLO (attainment's one-sided 95% lower bound >= "
                     f"{target:.0%}): {custom.iloc[0]['verdict']}")
    n_req = use["requests_planned_window"] if "requests_planned_window" in use else use.get("requests")
    if n_req is None or n_req.isna().all():
        n_txt = "an unknown number of"
    else:
        n_txt = f"{int(n_req.min())}" + (f"-{int(n_req.max())}" if n_req.min() != n_req.max() else "")
    left = len(ok_points(points)) - len(use)
    tail = (f" Evidence: {len(use)} usable open-loop points of {n_txt} planned requests each"
            + (f"; {left} closed-loop, stopped-early or invalid points left out" if left else "") + ".")
    return "; ".join(parts) + "." + tail


# ----------------------------------------------------------------------------- figures


def recommendation_table(points: pd.DataFrame, target: float = 0.9) -> go.Figure:
    """The :func:`recommend` table as a figure."""
    points = saturation.sweep_points(points)
    rec = recommend(points, target)
    cols = ["slo", "engine", "max_rate_rps", "goodput_rps", "attainment", "attainment_low", "attainment_high",
            "attainment_lower", "requests", "verdict", "source"]
    usable = evidence.usable_points(points, serving=True) if not points.empty else points
    why = ("no usable open-loop point (valid, not stopped early)" if usable.empty
           else f"no SLO preset scored on the {len(usable)} usable points")
    if not rec.empty:   # no rate met it: "none", not a rate of 0 req/s
        rec = rec.assign(max_rate_rps=rec["max_rate_rps"].astype(object).where(rec["max_rate_rps"] > 0, None),
                         goodput_rps=rec["goodput_rps"].astype(object).where(rec["max_rate_rps"] > 0, None))
    return table_figure(rec[[c for c in cols if c in rec]] if not rec.empty else rec,
                        f"Recommended engine per SLO (one-sided 95% lower bound of attainment >= {target:.0%}; "
                        "MLPerf presets at p99 from >= 100 requests)", empty_reason=why)


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame, target: float = 0.9, run_dir=None) -> dict[str, go.Figure]:
    """All figures of the serving-load notebook, by file name: the sweep's (the engine comparison's runs left out)
    and, with the comparison, its engines' ratio figure (``run_dir``: its rounds, drawn faint)."""
    sweep = saturation.sweep_points(points)
    req = requests[requests["point_id"].isin(sweep["point_id"])] if "point_id" in requests and "point_id" in sweep \
        else requests
    out = {
        "load_latency_vs_throughput": latency_vs_throughput(sweep),
        "load_goodput_vs_rate": goodput_vs_rate(sweep),
        "load_queue_vs_rate": queue_vs_rate(sweep),
        "load_gantt": gantt(sweep, req),
        "load_time_slices": time_slices(sweep),
        "load_recommendation": recommendation_table(sweep, target),
    }
    if not compared(points).empty:
        out["load_engine_ratio"] = engine_ratio_figure(points, run_dir)
    return out


def compared(points: pd.DataFrame, usable: bool = True) -> pd.DataFrame:
    """The engine comparison's runs, one row per arm (its runs carry the same decision), indexed by the engine (the
    A/A arm as ``aa``); ``usable``: valid and finished only. Empty without a comparison."""
    if points is None or points.empty or "comparison" not in points or "design" not in points:
        return pd.DataFrame()
    df = evidence.usable_points(points) if usable else points[points["status"].eq("ok")]
    df = df[df["comparison"].eq(COMPARISON) & df["design"].notna()]
    if df.empty:
        return df
    keys = [("aa" if r.get("arm") == "aa" else r["engine"]) for r in df.to_dict("records")]
    return df.assign(_arm=keys).drop_duplicates("_arm").set_index("_arm")


def engine_ratio_figure(points: pd.DataFrame, run_dir=None) -> go.Figure:
    """Each engine's run TTFT p50 over the control's under the same load, with the simultaneous interval its verdict
    was read from, each round's ratio faint, the equivalence band and the A/A control's interval
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    rows = compared(points)
    rows = rows[rows.index != "aa"].reset_index()
    order = {e: i for i, e in enumerate(engines_mod.ENGINES)}
    df = rows.assign(point_id=rows["_arm"], engine_order=rows["_arm"].map(order))
    rate = checks.float_or_nan(rows["offered_rps"].iloc[0]) if len(rows) and "offered_rps" in rows else float("nan")
    fig = figures_design.ratio_figure(df, "engine_order", TTFT.prefix,
                                      figures_design.round_ratios(run_dir, EXPERIMENT, TTFT.name),
                                      name="TTFT p50 ratio", x_title="engine",
                                      y_title="run TTFT p50 / the control's (x, log scale)",
                                      title=f"Engines under the same load ({rate:.2f} req/s): TTFT p50 against the "
                                            "control, the run as the unit (simultaneous 95% intervals; faint: each "
                                            "round; grey band: the A/A control)")
    fig.update_xaxes(tickmode="array", tickvals=list(order.values()), ticktext=list(order))
    fig.update_yaxes(type="log")
    return fig


TIME_WORDS = ("slower", "faster")   # a ratio of times above / below 1


def engines_finding(points: pd.DataFrame, run_dir=None) -> evidence.Finding | None:
    """The engine comparison's finding (module docstring): the pick (the engine with the lowest run TTFT p50) against
    the control with its verdict (a direction, equivalent within the margin, or undecided with the rounds and seconds
    it would take) and its throughput beside, every other engine's verdicts, and the pick against its runner-up
    (Tukey's all-pairs level from the design's table in ``run_dir``: the pick was chosen after looking). The control
    kept is a verdict only when every other engine is slower beyond noise or equivalent; a moved A/A control leaves it
    undecided. None without a comparison.

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict, or None.
    """
    every = compared(points, usable=False)
    if every.empty:
        return None
    rows = compared(points)
    control = next((e for e in every.index if every.loc[e].get(f"{TTFT.prefix}_method") == "the control"), None)
    runs = points[points["comparison"].eq(COMPARISON)]
    ids = evidence.point_ids(evidence.usable_points(runs))
    if control not in rows.index:
        return evidence.Finding(f"Engines under the same load: undecided: no usable run of the control "
                                f"({control or 'unknown'}; marked invalid: other load or drift).",
                                f"{len(runs)} runs measured, {len(ids)} usable", False, ids, verdict="undecided")
    ctrl = rows.loc[control]
    decisions = {e: design.decision_from_row(rows.loc[e], TTFT) for e in rows.index if e not in ("aa", control)}
    decisions = {e: d for e, d in decisions.items() if d is not None}
    secs = checks.float_or_nan(ctrl.get("seconds_per_round"))
    setting = (f"{checks.float_or_nan(ctrl.get('offered_rps')):.2f} req/s {ctrl.get('profile')}, "
               f"{checks.int_or(ctrl.get('requests_planned'), 0)} requests a run, {int(ctrl['rounds'])} rounds, a fresh "
               f"engine per run")
    def clause(e, d, name):
        t = design.decision_from_row(rows.loc[e], THROUGHPUT)
        return (d.describe(name, words=TIME_WORDS, seconds_per_round=secs)
                + ("; " + t.describe("output throughput", words=THROUGHPUT.words) if t is not None else ""))

    clauses = [clause(e, d, f"{e} vs {control}, TTFT p50") for e, d in decisions.items()]
    est = {e: d.estimate for e, d in decisions.items() if d.estimate == d.estimate}
    pick = min(est, key=est.get) if est else None
    if pick is not None and est[pick] < 1:
        d = decisions[pick]
        fields = design.finding_fields(rows.loc[pick], d)
        text = (f"Engines under the same load ({setting}): {pick} against {control}: "
                + "; ".join([clause(pick, d, "TTFT p50 of the run")]
                            + [c for e, c in zip(decisions, clauses) if e != pick]) + ".")
        rest = sorted((e for e in est if e != pick), key=est.get)
        said, open_ = design.versus_runner_up(run_dir, EXPERIMENT, TTFT.name, pick, rest[0] if rest else None,
                                              rest[0] if rest else "", d, rows.loc[pick], TIME_WORDS)
        text += said
        fields = open_ or fields
    else:   # the control kept: a verdict only when every other engine is slower beyond noise or equivalent
        keep = bool(decisions) and all((d.verdict == "direction" and d.direction == "higher") or
                                       d.verdict == "equivalent" for d in decisions.values())
        fields = design.finding_fields(rows.loc[next(iter(decisions))] if decisions else ctrl)
        fields["verdict"] = "direction" if keep else "undecided"
        text = (f"Engines under the same load ({setting}): keep {control}: "
                + ("every other engine is slower beyond noise or equivalent" if keep else
                   "none shown faster, but not every other engine is decided slower or equivalent")
                + ". " + "; ".join(clauses) + ".")
    if ctrl.get("aa_verdict") == "direction":
        text += f" The A/A control moved ({control} against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    method = next((d.method for d in decisions.values()), "")
    rate = ""
    if run_dir is not None and (Path(run_dir) / COMPARE_FILE).is_file():
        got = json.loads((Path(run_dir) / COMPARE_FILE).read_text(encoding="utf-8"))
        rate = (f"; the rate {got['compare_load']:g} x {got['engine']}'s one-at-a-time "
                f"{got['synchronous_rps']:.2f} req/s (a synchronous probe of {got['requests']} requests)")
    ev = (f"engine comparison: {len(runs)} runs, one statistic each (its TTFT p50; its output tokens over its wall "
          f"time); {design.evidence_text(ctrl)}; {method}{rate}")
    return evidence.Finding(text, ev, False, ids, **fields)


def finding(points: pd.DataFrame, target: float = 0.9, run_dir=None) -> evidence.Finding:
    """The report's finding: with the engine comparison, its verdict first (:func:`engines_finding`: the finding's
    verdict), then the sweep's (:func:`sweep_finding`); without it the sweep's alone."""
    sweep = sweep_finding(points, target)
    engines = engines_finding(points, run_dir)
    return sweep if engines is None else evidence.join([engines, sweep])


def sweep_finding(points: pd.DataFrame, target: float = 0.9) -> evidence.Finding:
    """The sweep's finding: :func:`headline`'s sentences, its evidence apart, and whether they are supported.

    Supported when a recommendation for the custom SLO rests on a usable point whose attainment's one-sided 95%
    lower bound reaches the target (:func:`recommend`), or when every usable point is shown to miss it (upper
    bound below the target); not supported without usable points or when no rate could be judged either way.

    Returns:
        :class:`workbench.stats.evidence.Finding` over the usable points' ids.
    """
    points = saturation.sweep_points(points)
    text = headline(points, target)
    body, _, tail = text.partition(" Evidence: ")
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        return evidence.Finding(body, tail.rstrip("."), False)
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    supported, why = False, "no custom-SLO recommendation"
    if not custom.empty:
        c = custom.iloc[0]
        verdict = str(c["verdict"])
        supported = bool(c["engine"]) or verdict.startswith("missed")
        why = (f"recommended rate {verdict}" if c["engine"] else
               "every usable rate shown to miss the custom SLO" if supported else f"not supported: {verdict}")
    aa = aa_control(points)
    if aa is not None:
        why += (f"; A/A control ({aa['rounds']} run pairs, {aa['statistic']}): "
                f"{replicates.describe(aa['aa_ratio'], aa['aa_low'], aa['aa_high'])}")
        if replicates.aa_moved(aa):
            supported, why = False, why + ": the A/A control moved"
    return evidence.Finding(body if supported or body.startswith("No ") else f"Not supported: {body}",
                            f"{tail.rstrip('.')}; {why} (a rate qualifies on attainment's one-sided 95% lower bound)",
                            supported, evidence.point_ids(use))
