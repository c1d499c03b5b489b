"""Experiment 08: serving under load (notebook ``08_serving_load``; issue 13, DESIGN.md section 7 item 8).

Requests arrive at some rate; an engine (:mod:`workbench.serving.engines`: ``fifo``, ``static`` window,
``continuous`` batching from ``transformers``) schedules them; TTFT, TPOT and goodput move as the offered
load grows until the server saturates (the knee). Per engine the grid is a sweep
(:mod:`workbench.serving.load`): ``synchronous`` (one at a time), ``throughput`` (every request at once),
then ``sweep_points`` open-loop rates evenly between the two measured request rates, each with
``requests_per_point`` requests of ``prompt_tokens`` prompt and ``max_new_tokens`` fixed-length output
(greedy). Open-loop latencies count from the scheduled arrival (no coordinated omission); an over-saturated
rate stops early by the recorded rule. Per point (:func:`point_columns`): the usual latency percentiles;
request, output, input and total token throughput and goodput over the measured window (completions inside
it per second of it, :func:`workbench.serving.load.apply_window`: not biased low by a short run); mean
concurrency with its Little's-law check; ``queue_s`` percentiles; SLO attainment over the requests planned
for the window (unsent and unfinished ones are misses) with its Wilson 95% interval, goodput and the
percentile check per preset (:mod:`workbench.stats.slo`); the engine's running requests over the window
(``engine_batch_mean`` / ``_max``); the time slices and the stop rule. :func:`recommend` gives, per SLO
preset, the engine and the highest measured rate whose attainment reaches ``attainment_target``;
:func:`search` finds that rate by bisection (:func:`search_engines` runs it on its own, without the sweep:
``benchmarks/serving.py``). The knee (:func:`knees`) is the highest open-loop rate that kept up
(:func:`kept_up`, the one definition). Knees, recommendations and the finding use usable points only
(:func:`workbench.stats.evidence.usable_points`: valid, open-loop, not stopped early).

Transport: ``inprocess`` submits straight to the engine (no HTTP); ``http`` runs the OpenAI-compatible
server (:mod:`workbench.serving.server`) with the engine behind it and drives it with the load generator's
``httpx`` client, token counts from the server's ``usage``.

External target (issue 23): ``"endpoint"`` in ``engines`` with ``endpoint: {url, model, api_key_env, name}``
(:mod:`workbench.serving.endpoint`) runs the same grid against any OpenAI-compatible server (vLLM, SGLang, TGI,
llama.cpp) over HTTP, its points labelled ``name``; :func:`check_targets` checks it in one line before any point
runs. Its engine-side columns (``queue_s``, ``prefill_s``, ``engine_batch_*``) stay empty and ``server_side_note``
says why. An endpoint-only run loads the tokenizer alone (:func:`load_for`), for the prompts.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.measure import contention
from workbench import checks
from workbench.stats import evidence, metrics, slo
from workbench.run import sweeps
from workbench.errors import ParameterError
from workbench.measure.generation import GenerationSettings
from workbench.share.plots import label, ok_points, split_by_device
from workbench.run.point_result import PointResult
from workbench.serving import endpoint as endpoint_mod
from workbench.serving import engines as engines_mod
from workbench.serving import load

EXPERIMENT = "serving_load"
ARRIVALS = ("constant", "poisson", "gamma")
TRANSPORTS = ("inprocess", "http")
TARGETS = engines_mod.ENGINES + (endpoint_mod.ENDPOINT,)  # what ``engines`` may list


@dataclasses.dataclass
class Config(sweeps.SweepConfig):
    """The serving-under-load sweep (notebook ``08_serving_load``).

    Attributes:
        engines: subset of ``fifo``, ``static``, ``continuous`` and ``endpoint`` (the external ``endpoint``).
        endpoint: the external OpenAI-compatible target, ``{url, model, api_key_env, name}``
            (:class:`workbench.serving.endpoint.Endpoint`); needed when ``engines`` lists ``endpoint``.
        transport: ``inprocess`` (engine directly) or ``http`` (through the server); built-in engines only.
        requests_per_point: requests sent per point (>= 2).
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
    """

    engines: list = dataclasses.field(default_factory=lambda: list(engines_mod.ENGINES))
    endpoint: dict | None = None
    transport: str = "inprocess"
    requests_per_point: int = 12
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
    slo_presets: list = dataclasses.field(default_factory=lambda: list(slo.PRESETS))
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    attainment_target: float = 0.9
    search: bool = False
    search_slo: str = "custom"
    search_steps: int = 4
    search_tolerance: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        checks.check_choice_list("engines", self.engines, TARGETS)
        self.target()  # the endpoint's shape (no network; check_targets reaches it)
        checks.check_choice("transport", self.transport, TRANSPORTS)
        checks.check_int("requests_per_point", self.requests_per_point, lo=2)
        checks.check_int("max_new_tokens", self.max_new_tokens, lo=1)
        checks.check_int("prompt_tokens", self.prompt_tokens, lo=32, hi=self.max_context() - self.max_new_tokens)
        checks.check_int("max_batch_size", self.max_batch_size, lo=1)
        checks.check_float("batch_window_s", self.batch_window_s, lo=0)
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

    def settings(self) -> GenerationSettings:
        """Every request: greedy, fixed length ``max_new_tokens``."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=True, seed=self.seed)

    def target(self) -> "endpoint_mod.Endpoint | None":
        """The external endpoint when ``engines`` lists ``endpoint``, else None.

        Raises:
            ParameterError: ``endpoint`` listed without an ``endpoint`` mapping, a mapping without ``endpoint``
                listed, or a bad mapping (:meth:`workbench.serving.endpoint.Endpoint.from_param`).
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
        """Whether a built-in engine runs (an endpoint-only run needs the tokenizer alone)."""
        return any(e in engines_mod.ENGINES for e in self.engines)

    def grid(self) -> list[dict]:
        """Per engine: synchronous, throughput, then ``sweep_points`` open-loop steps (engine outermost); the
        endpoint's points carry its ``name``."""
        pts = []
        for e in self.engine_names():
            pts += [{"engine": e, "profile": "synchronous", "step": 0}, {"engine": e, "profile": "throughput", "step": 0}]
            pts += [{"engine": e, "profile": self.arrival, "step": i + 1} for i in range(self.sweep_points)]
        return pts

    def slos(self) -> list:
        return [slo.get(n) for n in self.slo_presets] + [slo.get("custom", self.slo_ttft_s, self.slo_tpot_s)]


class _Bench:
    """The live engine (and server) of the current engine name, the prompts and the measured rates."""

    def __init__(self, cfg: Config, loaded):
        from workbench.inputs.prompts import build_batch

        self.cfg, self.loaded = cfg, loaded
        texts = build_batch(loaded.tokenizer, cfg.requests_per_point, cfg.prompt_tokens)
        self.specs = [load.RequestSpec(t, cfg.max_new_tokens, cfg.prompt_tokens) for t in texts]
        self.name = self.engine = self.server = self.send = self.served_pid = None
        self.rates: dict = {}

    def open(self, name: str) -> float:
        """Start engine ``name`` (stopping the previous one) and warm it up; returns the warm-up seconds."""
        import time

        if self.name == name:
            return 0.0
        self.close()
        cfg = self.cfg
        t0 = time.perf_counter()
        max_seq = cfg.prompt_tokens + cfg.max_new_tokens + 8
        ep = cfg.target()
        if ep is not None and name == ep.name:
            self.send = endpoint_mod.sender(ep, timeout=600.0)
            self.served_pid = endpoint_mod.local_server_pid(ep)  # a loopback server's CPU is the point's work
            if self.served_pid is not None:
                contention.SERVED_BY_PIDS.add(self.served_pid)
        elif cfg.transport == "http":
            from workbench.serving.server import ServerThread

            self.server = ServerThread(self.loaded, engine=name, max_batch_size=cfg.max_batch_size, early_headers=True,
                                       batch_window_s=cfg.batch_window_s).start()
            self.send = load.http_sender(self.server.base_url, timeout=600.0)
        else:
            self.engine = engines_mod.make_engine(name, self.loaded, cfg.max_batch_size, cfg.batch_window_s,
                                                  cfg.settings(), max_seq)
            self.send = load.engine_sender(self.engine, self.loaded.tokenizer, cfg.settings())
        self.name = name
        for _ in range(cfg.warmup):  # untimed: first calls, and a batch of the largest shape
            load.run_load(self.send, self.specs[: min(len(self.specs), cfg.max_batch_size)], "throughput")
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.engine is not None:
            self.engine.stop()
        contention.SERVED_BY_PIDS.discard(self.served_pid)
        self.name = self.engine = self.server = self.send = self.served_pid = None


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One load point: run its profile on the point's engine and summarise the kept window.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"engine", "profile"}`` (and ``step`` for the swept rates).
        state: shared by the points of one sweep: ``bench``, the live engine (and server) with the rates
            measured so far (a :class:`_Bench` is made on the first point when absent; the caller closes it),
            and ``last_point``, ``{engine: its last point}``: the engine is stopped after that point.

    Returns:
        :class:`workbench.run.point_result.PointResult`: kept request rows, ``wall_s`` of the kept
        window, ``warmup_s`` and ``extra`` (offered rate, window, stop rule, queue percentiles, SLO
        attainment / goodput / percentile checks per preset, time slices as JSON).
    """
    if "bench" not in state:
        state["bench"] = _Bench(cfg, loaded)
    bench: _Bench = state["bench"]
    e, prof = point["engine"], point["profile"]
    warm = bench.open(e)
    rate = None
    if prof in ARRIVALS:
        r = bench.rates.get(e, {})
        if "synchronous" not in r or "throughput" not in r:
            raise ParameterError(f"{e}: the swept rates need this engine's synchronous and throughput points first")
        rate = load.sweep_rates(r["synchronous"], r["throughput"], cfg.sweep_points)[point["step"] - 1]
    res, engine_batch = _run_sampled(bench, cfg, prof, rate)
    kept = res.kept()
    wall = res.summary["wall_s"]
    achieved = _achieved_rps(res)
    if prof in ("synchronous", "throughput"):
        bench.rates.setdefault(e, {})[prof] = achieved
    rows = []
    for r in kept.to_dict("records"):
        r.pop("t_scheduled", None)
        r.pop("t_sent", None)
        r.pop("t_done", None)
        r.pop("t_headers", None)
        r["engine_batch"] = r.pop("batch_size", None)
        rows.append(dict(r, max_new_tokens=cfg.max_new_tokens, temperature=0.0, context_tokens=cfg.prompt_tokens))
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
        ``rate_rps``, ``queue_s`` percentiles, the window figures of :func:`workbench.serving.load.window_figures`
        (``request_throughput_rps``, ``output_throughput_tps``, ``input_throughput_tps``, ``total_throughput_tps``,
        ``mean_concurrency``, ``littles_law_ratio``), per SLO preset ``slo_attainment_<name>``,
        ``slo_attainment_low_<name>`` / ``_high_<name>``, ``goodput_rps_<name>`` and ``percentiles_ok_<name>``
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
                      f"goodput_rps_{s.name}": ev["goodput_rps"], f"percentiles_ok_{s.name}": ev["percentiles_ok"]})
        if s.name == "custom":
            extra.update({k: ev[k] for k in ("slo_attainment", "slo_attainment_low", "slo_attainment_high",
                                             "goodput_rps", "percentiles_ok")})
    extra["kept_up"] = kept_up(dict(extra, profile=summ["profile"]))
    return extra


def _engine_of(bench: "_Bench"):
    """The engine running the point's requests (in process, or behind the server), or None."""
    eng = bench.engine
    if eng is None and bench.server is not None:
        eng = getattr(bench.server, "engine", None)
        eng = getattr(eng, "engine", eng)  # the server's adapter holds the engine
    return eng if hasattr(eng, "running_requests") else None


def _run_sampled(bench: "_Bench", cfg: Config, profile: str, rate: float | None) -> tuple[load.LoadResult, dict]:
    """Run one profile while sampling the engine's running requests; ``engine_batch_mean`` / ``_max`` over the
    counting window (:class:`workbench.serving.engines.RunningSampler`; NaN when the engine cannot be read), and
    each row's ``batch_size`` the most requests running while it was in flight."""
    eng = _engine_of(bench)
    if eng is None:
        return _run_profile(bench, cfg, profile, rate), {"engine_batch_mean": float("nan"),
                                                         "engine_batch_max": float("nan")}
    with engines_mod.RunningSampler(eng) as sampler:
        res = _run_profile(bench, cfg, profile, rate)
    for r in res.rows:  # each request's batch: the most running while it was in flight (not a lifetime peak)
        most = sampler.stats(res.t0 + r["t_start_s"], res.t0 + r["t_end_s"])["engine_batch_max"]
        if most == most:
            r["batch_size"] = int(most)
    a, b = res.summary.get("measure_start_s"), res.summary.get("measure_end_s")
    if a == a and b == b and b > a:
        return res, sampler.stats(res.t0 + a, res.t0 + b)
    return res, sampler.stats()


def run(cfg: Config, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The load sweep of ``cfg`` on every engine; then the SLO search when ``cfg.search``.

    Returns:
        The experiment's points DataFrame (:func:`workbench.run.sweeps.run_sweep`).
    """
    grid = cfg.grid()
    check_targets(cfg)
    bench = _Bench(cfg, loaded)
    state = {"bench": bench, "last_point": {p["engine"]: p for p in grid}}

    def measure(p):
        return measure_point(loaded, cfg, p, state)

    try:  # a tokenizer-only load (endpoint-only run) has no model for the drift reference
        points = sweeps.run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, slo_ttft_s=cfg.slo_ttft_s,
                                  slo_tpot_s=cfg.slo_tpot_s, info=loaded.info,
                                  loaded=loaded if loaded.model is not None else None, config=cfg)
        if cfg.search:
            from workbench.run import results

            found = search(cfg, bench, points)
            results.save_text(run_dir, f"{EXPERIMENT}_search.json", found.to_json(orient="records", indent=1))
    finally:
        bench.close()
    return points


def check_targets(cfg: Config) -> dict | None:
    """One-line errors for the external endpoint, before any point runs (and before the model loads, when
    called first): :func:`workbench.serving.endpoint.check_endpoint`. None without an endpoint.

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


def _run_profile(bench: _Bench, cfg: Config, profile: str, rate: float | None = None) -> load.LoadResult:
    return load.run_load(bench.send, bench.specs, profile, rate=rate, burstiness=cfg.burstiness, seed=cfg.seed,
                         warmup_s=cfg.warmup_s, cooldown_s=cfg.cooldown_s, slice_s=cfg.slice_s,
                         max_in_flight=cfg.max_in_flight, max_wait_s=cfg.max_wait_s)


def _achieved_rps(res: load.LoadResult) -> float:
    """Completed requests of the kept window per second of it (the sweep's request rate of a closed-loop run)."""
    kept, wall = res.kept(), res.summary["wall_s"]
    done = int((kept["output_tokens"] >= 1).sum()) if len(kept) else 0
    return done / wall if wall and wall > 0 else float("nan")


def search(cfg: Config, bench: _Bench, points: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per engine: the highest offered rate (``cfg.arrival``) whose attainment of ``cfg.search_slo`` reaches
    ``cfg.attainment_target``, by bisection (:func:`workbench.stats.slo.search_rate`) between half the synchronous
    rate and the maximum throughput, ``cfg.search_steps`` measurements of ``requests_per_point`` requests each,
    relative tolerance ``cfg.search_tolerance``. An over-saturated measurement (stopped early) fails.

    The synchronous and maximum rates come from the sweep already run on ``bench`` or, when missing, are
    measured here first (one ``synchronous`` and one ``throughput`` run). ``points`` is unused (kept for callers).

    Returns:
        One row per engine: ``engine``, ``slo``, ``max_batch_size``, ``max_rate_rps`` (0: even the lowest rate
        failed), ``bracket_low_rps`` / ``bracket_high_rps`` (inf: the highest tried rate still met it),
        ``bracketed``, ``measurements``, ``tolerance``, ``requests_per_measurement``, ``sync_rps``,
        ``max_throughput_rps``, ``knee_rps`` (:func:`workbench.stats.metrics.saturation_knee` over the search's own
        open-loop measurements, arrival vs completion rate; NaN when even the lowest fell behind) and
        ``history_json`` (per measurement: rate, attainment, arrival and completion rates, stopped early).
    """
    target = slo.get(cfg.search_slo, cfg.slo_ttft_s, cfg.slo_tpot_s)
    out = []
    for e in cfg.engine_names():
        bench.open(e)
        r = bench.rates.setdefault(e, {})
        for prof in ("synchronous", "throughput"):
            if prof not in r:
                r[prof] = _achieved_rps(_run_profile(bench, cfg, prof))
        hist: list = []

        def attainment_at(rate):
            res = _run_profile(bench, cfg, cfg.arrival, rate)
            att = 0.0 if res.summary["stopped_early"] else \
                slo.attainment(res.kept(), target, res.summary["requests_planned_window"])["slo_attainment"]
            hist.append({"rate_rps": rate, "attainment": att, "arrival_rps": res.summary["arrival_rps"],
                         "completion_rps": res.summary["completion_rps"],
                         "stopped_early": res.summary["stopped_early"]})
            return att  # over-saturated: the rate fails

        lo, hi = r["synchronous"] * 0.5, max(r["throughput"], r["synchronous"] * 1.1)
        found = slo.search_rate(attainment_at, lo, hi, cfg.attainment_target, cfg.search_tolerance, cfg.search_steps)
        knee = metrics.saturation_knee([h["arrival_rps"] for h in hist], [h["completion_rps"] for h in hist])
        out.append({"engine": e, "slo": target.name, "max_batch_size": cfg.max_batch_size,
                    "max_rate_rps": found["rate"], "bracket_low_rps": found["bracket"][0],
                    "bracket_high_rps": found["bracket"][1], "bracketed": found["bracketed"],
                    "measurements": found["steps"], "tolerance": cfg.search_tolerance,
                    "requests_per_measurement": cfg.requests_per_point, "sync_rps": r["synchronous"],
                    "max_throughput_rps": r["throughput"], "knee_rps": knee, "history_json": json.dumps(hist)})
        bench.close()
    return pd.DataFrame(out)


def search_engines(cfg: Config, loaded) -> pd.DataFrame:
    """:func:`search` for every engine of ``cfg`` (an external endpoint too, checked first: :func:`check_targets`)
    without a sweep (no run folder): the table it returns."""
    check_targets(cfg)
    bench = _Bench(cfg, loaded)
    try:
        return search(cfg, bench)
    finally:
        bench.close()


# ----------------------------------------------------------------------------- summaries


KEPT_UP_TOLERANCE = 0.1  # completions may fall this far (relative) below arrivals and still keep up


def kept_up(point, tolerance: float = KEPT_UP_TOLERANCE) -> bool | None:
    """Whether an open-loop point kept up with its arrivals: the one definition (knee, finding, figures).

    Kept up: not stopped early by the over-saturation rule, every request planned for its window sent and
    finished (``requests_unsent`` and ``requests_incomplete`` zero), and completions kept pace with arrivals
    (``completion_rps >= (1 - tolerance) * arrival_rps``, :func:`workbench.serving.load.flow_rates`; older rows
    without them: ``request_throughput_rps`` against ``offered_rps``). Attainment is a separate question (did
    the requests meet the SLO), reported beside it with its interval.

    Args:
        point: a points row (Series or dict).

    Returns:
        True / False; None for a closed-loop point (no arrival process to keep up with) or one without rates.
    """
    get = point.get
    if get("profile") not in load.OPEN_LOOP:
        return None
    if bool(get("stopped_early") or False):
        return False
    for col in ("requests_unsent", "requests_incomplete"):
        v = get(col)
        if v is not None and v == v and v > 0:
            return False
    arr, comp = get("arrival_rps"), get("completion_rps")
    if arr is None or comp is None or not (arr == arr):
        arr, comp = get("offered_rps"), get("request_throughput_rps")
    if arr is None or comp is None or not (arr == arr and arr > 0):
        return None
    return bool(comp == comp and comp >= (1 - tolerance) * arr)


def knees(points: pd.DataFrame, tolerance: float = KEPT_UP_TOLERANCE) -> dict:
    """Per engine: the highest open-loop rate (realised ``arrival_rps``, else ``offered_rps``) that kept up
    (:func:`kept_up`), below the first that did not; NaN when even the lowest did not. Only usable points
    (:func:`workbench.stats.evidence.usable_points` with ``serving``: valid, open-loop, not stopped early)."""
    df = evidence.usable_points(points, serving=True)
    out = {}
    for e, g in df.groupby("engine"):
        x = g["arrival_rps"] if "arrival_rps" in g and g["arrival_rps"].notna().all() else g["offered_rps"]
        knee = float("nan")
        for rate, (_, r) in sorted(zip(x, g.iterrows()), key=lambda t: t[0]):
            if kept_up(r, tolerance) is not True:  # fell behind, or not known
                break
            knee = float(rate)
        out[e] = knee
    return out


def _slo_names(columns) -> list[str]:
    """SLO names of the ``slo_attainment_<name>`` columns (not the interval columns)."""
    return sorted({c[len("slo_attainment_"):] for c in columns if c.startswith("slo_attainment_")
                   and not c.startswith(("slo_attainment_low", "slo_attainment_high"))})


def recommend(points: pd.DataFrame, target: float = 0.9) -> pd.DataFrame:
    """Per SLO preset (and ``custom``): the engine and the highest measured offered rate whose attainment
    reaches ``target`` (ties: higher goodput), with its goodput, its attainment's Wilson 95% interval and the
    requests planned for it; ``engine`` empty when none does. Only usable points
    (:func:`workbench.stats.evidence.usable_points` with ``serving``: valid, open-loop, not stopped early) that kept up
    (:func:`kept_up` not False): a closed-loop burst, a point stopped for over-saturation, one measured under
    other load or one whose queue grew is never recommended."""
    df = evidence.usable_points(points, serving=True)
    if not df.empty:  # a rate whose queue grew is not one the engine sustains, whatever its short-run attainment
        df = df[[kept_up(r) is not False for _, r in df.iterrows()]]
    rows = []
    for n in _slo_names(df.columns):
        source = slo.PRESETS[n].source if n in slo.PRESETS else "custom limits"
        ok = df[df[f"slo_attainment_{n}"] >= target]
        if ok.empty:
            rows.append({"slo": n, "engine": "", "max_rate_rps": 0.0, "goodput_rps": 0.0, "attainment": np.nan,
                         "attainment_low": np.nan, "attainment_high": np.nan, "requests": 0, "source": source})
            continue
        best = ok.sort_values(["offered_rps", f"goodput_rps_{n}"], ascending=False).iloc[0]
        planned = best.get("requests_planned_window", best.get("requests", np.nan))
        rows.append({"slo": n, "engine": best["engine"], "max_rate_rps": float(best["offered_rps"]),
                     "goodput_rps": float(best[f"goodput_rps_{n}"]), "attainment": float(best[f"slo_attainment_{n}"]),
                     "attainment_low": float(best.get(f"slo_attainment_low_{n}", np.nan)),
                     "attainment_high": float(best.get(f"slo_attainment_high_{n}", np.nan)),
                     "requests": int(planned) if planned == planned else 0, "source": source})
    return pd.DataFrame(rows)


def _attained(r, target: float) -> str:
    """``custom-SLO attainment 1.00 (95% Wilson interval 0.76-1.00)`` of a point row."""
    lo, hi = r.get("slo_attainment_low", np.nan), r.get("slo_attainment_high", np.nan)
    ci = f"95% Wilson interval {lo:.2f}-{hi:.2f}" if lo == lo and hi == hi else "no interval"
    return f"custom-SLO attainment {r.get('slo_attainment', np.nan):.2f} ({ci})"


def _engine_sentence(e: str, g: pd.DataFrame, knee: float, target: float) -> str:
    """One engine's part of the finding: how far it kept up, the attainment there and at the first rate past it."""
    g = g.sort_values("offered_rps")
    verdicts = [kept_up(r) for _, r in g.iterrows()]
    if knee == knee:
        at = g.iloc[max(i for i, v in enumerate(verdicts) if v) if any(verdicts) else 0]
        text = f"{e}: kept up to {knee:.2f} req/s, {_attained(at, target)} there"
        rest = [(r, v) for (_, r), v in zip(g.iterrows(), verdicts) if r["offered_rps"] > at["offered_rps"]]
    elif verdicts and verdicts[0] is None:
        return f"{e}: no arrival and completion rates recorded, so whether it kept up is not known"
    else:
        text = f"{e}: did not keep up even at its lowest open-loop rate"
        rest = [(r, v) for (_, r), v in zip(g.iterrows(), verdicts)][:1]
    if rest and rest[0][1] is False:
        r = rest[0][0]
        comp = r.get("completion_rps", r.get("request_throughput_rps", np.nan))
        text += f"; at {r['offered_rps']:.2f} req/s completions fell behind ({comp:.2f} req/s completed)"
        text += (f" while {_attained(r, target)} stayed at target: the queue grew within the SLO's slack"
                 if r.get("slo_attainment", np.nan) >= target else f", {_attained(r, target)}")
    return text


def headline(points: pd.DataFrame, target: float = 0.9) -> str:
    """The finding: per engine, the highest open-loop rate that kept up (:func:`kept_up`, the knee) with the
    custom SLO's attainment there and at the first rate past it, and the recommended engine for the custom SLO
    (:func:`recommend`); each with its evidence: requests planned per point and attainment with its Wilson 95%
    interval. Only usable points count (valid, open-loop, not stopped early); how many others were left out
    is said."""
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        return ("No usable open-loop load point (valid, not stopped early): no knee or recommendation is "
                "supported." if len(points) else "No load point finished.")
    k = knees(points)
    parts = [_engine_sentence(e, g, k.get(e, float("nan")), target) for e, g in use.groupby("engine")]
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    if not custom.empty and custom.iloc[0]["engine"]:
        c = custom.iloc[0]
        ci = (f"95% Wilson interval {c['attainment_low']:.2f}-{c['attainment_high']:.2f}"
              if c["attainment_low"] == c["attainment_low"] else "no interval")
        parts.append(f"custom SLO: {c['engine']} up to {c['max_rate_rps']:.2f} req/s ({c['goodput_rps']:.2f} req/s "
                     f"goodput; attainment {c['attainment']:.2f}, {ci}, {c['requests']} requests)")
    elif not custom.empty:
        parts.append(f"no engine met the custom SLO (attainment >= {target:.0%}) at a usable rate it kept up with")
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


def _colours(names=()):
    """A colour per built-in engine, then per other label (an external endpoint) in ``names``."""
    import plotly.express as px

    labels = list(engines_mod.ENGINES) + sorted({str(n) for n in names} - set(engines_mod.ENGINES))
    return dict(zip(labels, px.colors.qualitative.Safe))


def latency_vs_throughput(points: pd.DataFrame) -> go.Figure:
    """TTFT p50 (solid) and p90/p99 (dashed/dotted, where enough samples) and TPOT p50 versus achieved output
    throughput, one curve per engine; hover shows the profile and offered rate."""
    df = ok_points(points).sort_values(["engine", "output_throughput_tps"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT p50"))
    col = _colours(points.get("engine", ()))
    for e, g in df.groupby("engine"):
        hover = [f"{p} @ {o:.2f} req/s offered" for p, o in zip(g["profile"], g["offered_rps"])]
        for stat, dash in (("p50", "solid"), ("p90", "dash"), ("p99", "dot")):
            y = g.get(f"ttft_s_{stat}")
            if y is None or y.isna().all():
                continue
            fig.add_trace(go.Scatter(x=g["output_throughput_tps"], y=y, mode="lines+markers", name=f"{e} TTFT {stat}",
                                     line=dict(color=col.get(e), dash=dash), hovertext=hover), row=1, col=1)
        fig.add_trace(go.Scatter(x=g["output_throughput_tps"], y=g["tpot_s_p50"], mode="lines+markers",
                                 name=f"{e} TPOT p50", line=dict(color=col.get(e)), hovertext=hover,
                                 showlegend=True), row=1, col=2)
    fig.update_xaxes(title_text=label("output_throughput_tps"))
    fig.update_yaxes(title_text=label("ttft_s"), row=1, col=1)
    fig.update_yaxes(title_text=label("tpot_s"), row=1, col=2)
    fig.update_layout(title="Latency vs achieved output throughput, per engine")
    return fig


def goodput_vs_rate(points: pd.DataFrame) -> go.Figure:
    """Goodput (custom SLO) and SLO attainment (with its Wilson 95% interval over the planned requests) versus
    offered rate per engine, the knee (:func:`knees`) marked."""
    df = ok_points(points).sort_values(["engine", "offered_rps"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=("goodput (custom SLO)", "SLO attainment (custom SLO)"))
    col = _colours(points.get("engine", ()))
    kn = knees(points)
    for e, g in df.groupby("engine"):
        fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["goodput_rps"], mode="lines+markers", name=f"{e} goodput",
                                 line=dict(color=col.get(e)), hovertext=g["profile"]), row=1, col=1)
        err = None
        if {"slo_attainment_low", "slo_attainment_high"} <= set(g.columns):
            err = dict(type="data", symmetric=False, array=(g["slo_attainment_high"] - g["slo_attainment"]).clip(lower=0),
                       arrayminus=(g["slo_attainment"] - g["slo_attainment_low"]).clip(lower=0))
        hover = [f"{p}; kept up: {kept_up(r)}" for p, (_, r) in zip(g["profile"], g.iterrows())]
        fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["slo_attainment"], mode="lines+markers", error_y=err,
                                 name=f"{e} attainment", line=dict(color=col.get(e), dash="dash"),
                                 hovertext=hover), row=1, col=2)
        knee = kn.get(e, float("nan"))  # NaN: no usable point, or none kept up
        if knee == knee:
            for c in (1, 2):
                fig.add_vline(x=knee, line=dict(color=col.get(e), dash="dot"), row=1, col=c)
    fig.update_xaxes(title_text="offered rate (requests/s)")
    fig.update_yaxes(title_text=label("goodput_rps"), row=1, col=1)
    fig.update_yaxes(title_text=label("slo_attainment"), range=[0, 1.05], row=1, col=2)
    fig.update_layout(title="Goodput and SLO attainment (bars: 95% Wilson interval) vs offered rate (dotted: the knee)")
    return fig


def queue_vs_rate(points: pd.DataFrame) -> go.Figure:
    """Engine-side queue time p50 (solid) and p90 (dashed) versus offered rate, per engine."""
    df = ok_points(points).sort_values(["engine", "offered_rps"])
    fig = go.Figure()
    col = _colours(points.get("engine", ()))
    for e, g in df.groupby("engine"):
        fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["queue_s_p50"], mode="lines+markers", name=f"{e} p50",
                                 line=dict(color=col.get(e))))
        if g["queue_s_p90"].notna().any():
            fig.add_trace(go.Scatter(x=g["offered_rps"], y=g["queue_s_p90"], mode="lines+markers", name=f"{e} p90",
                                     line=dict(color=col.get(e), dash="dash")))
    fig.update_layout(title="Queue time (arrival to admission) vs offered rate", xaxis_title="offered rate (requests/s)",
                      yaxis_title=label("queue_s"))
    return fig


def _pick_point(points: pd.DataFrame) -> pd.DataFrame:
    """The highest open-loop step of each engine (the busiest swept rate)."""
    df = ok_points(points)
    sw = df[df["profile"].isin(ARRIVALS)]
    return sw.sort_values("step").groupby("engine").tail(1) if not sw.empty else df.groupby("engine").tail(1)


def gantt(points: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """Per-request timeline at the busiest swept rate, one panel per engine: grey from arrival to admission
    (queue), coloured from admission to the last token."""
    pick = _pick_point(points)
    fig = make_subplots(rows=max(1, len(pick)), cols=1, shared_xaxes=True,
                        subplot_titles=[f"{r.engine}, {r.profile} {r.offered_rps:.2f} req/s" for r in pick.itertuples()])
    col = _colours(points.get("engine", ()))
    for i, r in enumerate(pick.itertuples(), 1):
        q = requests[requests["point_id"] == r.point_id].sort_values("request_id")
        if q.empty:
            continue
        start = q["t_scheduled_s"]
        queue = q["queue_s"].fillna(0).clip(lower=0) + (q["t_start_s"] - q["t_scheduled_s"])
        end = start + q["e2e_s"]
        fig.add_trace(go.Bar(y=q["request_id"], x=queue, base=start, orientation="h", marker_color="lightgrey",
                             name="queued", showlegend=i == 1), row=i, col=1)
        fig.add_trace(go.Bar(y=q["request_id"], x=end - start - queue, base=start + queue, orientation="h",
                             marker_color=col.get(r.engine), name=f"{r.engine} served"), row=i, col=1)
    fig.update_layout(barmode="overlay", title="Per-request timeline (queued, then served)", height=250 * max(1, len(pick)))
    fig.update_xaxes(title_text="seconds after the first arrival")
    return fig


def time_slices(points: pd.DataFrame) -> go.Figure:
    """Requests in flight and completed per time slice at the busiest swept rate, per engine (steady state?)."""
    pick = _pick_point(points)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("in flight at slice end", "completed per slice"))
    col = _colours(points.get("engine", ()))
    for r in pick.itertuples():
        sl = pd.DataFrame(json.loads(r.slices_json)) if isinstance(r.slices_json, str) else pd.DataFrame()
        if sl.empty:
            continue
        fig.add_trace(go.Scatter(x=sl["slice_start_s"], y=sl["in_flight"], mode="lines+markers", name=f"{r.engine}",
                                 line=dict(color=col.get(r.engine))), row=1, col=1)
        fig.add_trace(go.Bar(x=sl["slice_start_s"], y=sl["completed"], name=f"{r.engine} completed",
                             marker_color=col.get(r.engine)), row=1, col=2)
    fig.update_xaxes(title_text="slice start (s after the first arrival)")
    fig.update_layout(title="Time slices at the busiest swept rate")
    return fig


def recommendation_table(points: pd.DataFrame, target: float = 0.9) -> go.Figure:
    """The :func:`recommend` table as a figure."""
    rec = recommend(points, target)
    cols = ["slo", "engine", "max_rate_rps", "goodput_rps", "attainment", "attainment_low", "attainment_high",
            "requests", "source"]
    cells = [rec[c].map(lambda v: f"{v:.3g}" if isinstance(v, float) else (v or "none")) if c in rec else [] for c in cols]
    fig = go.Figure(go.Table(header=dict(values=cols), cells=dict(values=cells)))
    fig.update_layout(title=f"Recommended engine per SLO (attainment >= {target:.0%} at the highest measured rate)")
    return fig


@split_by_device
def figures(points: pd.DataFrame, requests: pd.DataFrame, target: float = 0.9) -> dict[str, go.Figure]:
    """All figures of the serving-load notebook, by file name."""
    return {
        "load_latency_vs_throughput": latency_vs_throughput(points),
        "load_goodput_vs_rate": goodput_vs_rate(points),
        "load_queue_vs_rate": queue_vs_rate(points),
        "load_gantt": gantt(points, requests),
        "load_time_slices": time_slices(points),
        "load_recommendation": recommendation_table(points, target),
    }


def finding(points: pd.DataFrame, target: float = 0.9) -> evidence.Finding:
    """The report's finding: :func:`headline`'s sentences, its evidence apart, and whether they are supported.

    Supported when a recommendation for the custom SLO rests on a usable point whose attainment interval (Wilson
    95%) is at most +/-0.15 wide, or when no usable point met the SLO and that "no" rests on usable points; not
    supported without usable points or with a wider interval (too few requests per point to place the knee).

    Returns:
        :class:`workbench.stats.evidence.Finding` over the usable points' ids.
    """
    text = headline(points, target)
    body, _, tail = text.partition(" Evidence: ")
    use = evidence.usable_points(points, serving=True)
    if use.empty:
        return evidence.Finding(body, tail.rstrip("."), False)
    rec = recommend(points, target)
    custom = rec[rec["slo"] == "custom"] if not rec.empty else rec
    supported, why = False, "no custom-SLO recommendation"
    if not custom.empty and custom.iloc[0]["engine"]:
        c = custom.iloc[0]
        half = (c["attainment_high"] - c["attainment_low"]) / 2
        supported = bool(half == half and half <= 0.15)
        why = (f"attainment interval +/-{half:.2f} at the recommended rate" if half == half else
               "no attainment interval at the recommended rate")
    elif not custom.empty:
        supported, why = True, "no usable rate met the custom SLO"
    return evidence.Finding(body, f"{tail.rstrip('.')}; {why} (supported needs <= +/-0.15)", supported,
                            evidence.point_ids(use))
