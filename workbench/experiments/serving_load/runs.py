"""What one load run records, and the engines compared under one load as a design
(:mod:`workbench.experiments.serving_load`, notebook ``08_serving_load``).

The comparison's names every part reads: :data:`EXPERIMENT`, :data:`COMPARISON` (the ``comparison`` column of its
runs), :data:`COMPARE_FILE` and its per-run outcomes :data:`TTFT` (primary) and :data:`THROUGHPUT`. A run's point:
:func:`point_columns` (the window, throughput, queue and SLO columns) and :func:`kept_rows` (its request rows), for the
sweep's load points and the comparison's runs alike. The comparison: :func:`compare_config`, :func:`compare_rate`
(the offered rate, from a synchronous probe of the control) and :func:`engine_design`. The experiment re-exports them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.load import load
from workbench.load.bench import Bench, achieved_rps, run_profile, run_sampled
from workbench.load.saturation import kept_up
from workbench.run import design, design_sweep
from workbench.stats import metrics, slo

if TYPE_CHECKING:
    from workbench.experiments.serving_load import Config

EXPERIMENT = "serving_load"
COMPARISON = "engines"   # the ``comparison`` column of the engine comparison's runs (the knee sweep's: empty)
COMPARE_FILE = f"{EXPERIMENT}_compare.json"   # the comparison's offered rate and the probe it came from
#: the engine comparison's per-run outcomes: its TTFT p50 (primary) and its output throughput over the whole run
#: (secondary: its output tokens over first send to last completion; the counting window's figure, first to last
#: completion, is a few ms for a batch of 8 finishing together)
TTFT = design.Outcome("ttft_s_p50", False, "TTFT p50 of the run", "ttft_vs_control")
THROUGHPUT = design.Outcome("run_output_tps", True, "output throughput of the run", "throughput_ratio")




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


def compare_config(cfg: Config) -> Config:
    """The comparison runs' config (of :func:`compare_rate` and :func:`engine_design`): ``compare_requests``
    requests a run, no warm-up of their own (each engine is warmed once before its first run: :func:`engine_design`'s
    ``prepare``)."""
    return dataclasses.replace(cfg, requests_per_point=cfg.compare_requests, closed_loop_requests=None,
                               synchronous_requests=None, warmup=0, repeats=1)


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
    bench = bench or Bench(compare_config(cfg), loaded)
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


def engine_design(cfg: Config, loaded, run_dir=None) -> design_sweep.SweepDesign:
    """The engines compared under one load as one design (module docstring): the arms are ``compare_engines``,
    ``compare_control`` the marked control and the A/A arm; arm ``e`` in round ``k`` is one run of ``compare_requests``
    requests at :func:`compare_rate`'s rate (``cfg.compare_arrival``, arrival seed ``seed + k`` for every arm) on a fresh
    engine ``e``, one point per run (``unit_of``: the ``comparison`` points' ``(engine or A/A, replicate)``).
    Outcomes per run: :data:`TTFT` (the kept requests' TTFT p50, primary) and :data:`THROUGHPUT` (its output tokens
    over its wall time); each run's point columns are :func:`point_columns`'.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    import time

    small = compare_config(cfg)
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
        rows = kept_rows(res, cfg)
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
    return design_sweep.SweepDesign(d, measure, prepare, unit_of=unit_of)


def kept_rows(res: load.LoadResult, cfg: Config) -> list[dict]:
    """A run's kept request rows as a point records them (bookkeeping stamps dropped, ``engine_batch``): the rows of
    a sweep's load point (:func:`workbench.experiments.serving_load.measure_point`) and of a comparison run alike."""
    rows = []
    for r in res.kept().to_dict("records"):
        for k in ("t_scheduled", "t_sent", "t_done", "t_headers"):
            r.pop(k, None)
        r["engine_batch"] = r.pop("batch_size", None)
        rows.append(dict(r, max_new_tokens=cfg.max_new_tokens, temperature=0.0, context_tokens=cfg.prompt_tokens))
    return rows
