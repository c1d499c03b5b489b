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

**Parts** (this module is the experiment's face: :class:`Config`, :func:`measure_point`, :func:`run`, the endpoint
checks and the SLO search, and every name below re-exported): :mod:`.runs` (what a run records as a point, the
engine comparison's design), :mod:`.summaries` (the knees, the recommendation, the A/A control and the findings),
:mod:`.charts` (the figures).
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.experiments.serving_load.charts import engine_ratio_figure, figures, recommendation_table
from workbench.experiments.serving_load.runs import (
    COMPARE_FILE,
    COMPARISON,
    EXPERIMENT,
    THROUGHPUT,
    TTFT,
    compare_config,
    compare_rate,
    engine_design,
    kept_rows,
    point_columns,
)
from workbench.experiments.serving_load.summaries import (
    KEPT_UP_TOLERANCE,
    TIME_WORDS,
    aa_control,
    compared,
    engines_finding,
    finding,
    headline,
    kept_up,
    recommend,
    sweep_finding,
)
from workbench.load import endpoint as endpoint_mod
from workbench.load import load
from workbench.load.bench import Bench, achieved_rps, run_sampled
from workbench.load.bench import slo_rate_search as search
from workbench.measure.generation import GenerationSettings
from workbench.run import design, sweeps
from workbench.run.point_result import PointResult
from workbench.serving import engines as engines_mod
from workbench.serving import options
from workbench.stats import slo

ARRIVALS = load.ARRIVALS
TRANSPORTS = ("inprocess", "http")
TARGETS = engines_mod.ENGINES + (endpoint_mod.ENDPOINT,)  # what ``engines`` may list


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
        synchronous_requests: requests of the ``synchronous`` point alone (2 to ``requests_per_point``; None:
            ``closed_loop_requests``): one at a time it is the sweep's slowest point per request, and its rate and
            latencies (the twin's calibration at concurrency 1) settle within a dozen, where the throughput burst
            needs its 40 (a burst of 20 is 8 + 8 + 4 at a batch limit of 8, its rate ~17% low).
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
    synchronous_requests: int | None = None
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
        if self.synchronous_requests is not None:
            checks.check_int("synchronous_requests", self.synchronous_requests, lo=2, hi=self.requests_per_point)
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

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The engine comparison (:func:`engine_design`): one arm per compared engine (the open-loop sweep beside it is
        not a design); None without one (:meth:`compares`)."""
        return ((EXPERIMENT, len(self.compare_engines), int(self.repeats), int(self.max_rounds)) if self.compares()
                else None)

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
    rows = kept_rows(res, cfg)
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


#: the experiment's face: what notebook 08, the report, the benchmarks and the tests read as ``serving_load.<name>``
__all__ = [
    "EXPERIMENT", "ARRIVALS", "TRANSPORTS", "TARGETS", "COMPARISON", "COMPARE_FILE", "TTFT", "THROUGHPUT",
    "KEPT_UP_TOLERANCE", "TIME_WORDS", "Config", "measure_point", "point_columns", "kept_rows", "compare_config",
    "compare_rate", "engine_design", "run", "recorded_rates", "check_targets", "load_for", "search_engines", "search",
    "kept_up", "recommend", "aa_control", "headline", "compared", "engines_finding", "finding", "sweep_finding",
    "recommendation_table", "engine_ratio_figure", "figures",
]
