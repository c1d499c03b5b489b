"""The live target of a load test and the runs made on it (notebook ``08_serving_load``, ``workbench simulate``).

:class:`Bench` holds the engine (in process, behind the OpenAI-compatible server, or an external endpoint) of the
current engine name with its prompts and the synchronous / maximum rates measured on it; :func:`run_profile` runs
one load profile on it (:func:`workbench.load.load.run_load` with the config's window, slices and stop rule),
:func:`run_sampled` does so while sampling the engine's running requests, :func:`achieved_rps` is a closed-loop
run's request rate, and :func:`slo_rate_search` bisects for the highest rate that meets an SLO. The config they read
is a load config (:class:`workbench.experiments.serving_load.Config`), passed in, never imported.
"""

from __future__ import annotations

import json

import pandas as pd

from workbench.load import endpoint as endpoint_mod
from workbench.load import load, saturation, senders
from workbench.measure import contention
from workbench.serving import engine_kinds
from workbench.serving import engines as engines_mod
from workbench.stats import slo


class Bench:
    """The live engine (and server) of the current engine name, the prompts and the measured rates.

    ``cfg``: a load config (:class:`workbench.experiments.serving_load.Config`: ``requests_per_point``,
    ``prompt_tokens``, ``max_new_tokens``, ``max_batch_size``, ``transport``, ``warmup``, ``target()``,
    ``engine_options_for()``, ``settings()``)."""

    def __init__(self, cfg, loaded):
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

            self.server = ServerThread(self.loaded, engine=cfg.engine_options_for(name), early_headers=True).start()
            self.send = senders.http_sender(self.server.base_url, timeout=600.0)
        else:
            self.engine = engine_kinds.make_engine(cfg.engine_options_for(name, max_seq_tokens=max_seq), self.loaded,
                                                  None, cfg.settings())
            self.send = senders.engine_sender(self.engine, self.loaded.tokenizer, cfg.settings())
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


def engine_of(bench: "Bench"):
    """The engine running the point's requests (in process, or behind the server), or None."""
    eng = bench.engine
    if eng is None and bench.server is not None:
        eng = getattr(bench.server, "engine", None)
        eng = getattr(eng, "engine", eng)  # the server's adapter holds the engine
    return eng if hasattr(eng, "running_requests") else None


def run_sampled(bench: "Bench", cfg, profile: str, rate: float | None,
                seed: int | None = None) -> tuple[load.LoadResult, dict]:
    """Run one profile while sampling the engine's running requests; ``engine_batch_mean`` / ``_max`` over the
    counting window (:class:`workbench.serving.engines.RunningSampler`; NaN when the engine cannot be read), and
    each row's ``batch_size`` the most requests running while it was in flight."""
    eng = engine_of(bench)
    if eng is None:
        return run_profile(bench, cfg, profile, rate, seed), {"engine_batch_mean": float("nan"),
                                                             "engine_batch_max": float("nan")}
    with engines_mod.RunningSampler(eng) as sampler:
        res = run_profile(bench, cfg, profile, rate, seed)
    for r in res.rows:  # each request's batch: the most running while it was in flight (not a lifetime peak)
        most = sampler.stats(res.t0 + r["t_start_s"], res.t0 + r["t_end_s"])["engine_batch_max"]
        if most == most:
            r["batch_size"] = int(most)
    a, b = res.summary.get("measure_start_s"), res.summary.get("measure_end_s")
    if a == a and b == b and b > a:
        return res, sampler.stats(res.t0 + a, res.t0 + b)
    return res, sampler.stats()


def run_profile(bench: Bench, cfg, profile: str, rate: float | None = None,
                seed: int | None = None) -> load.LoadResult:
    """One load run of ``profile`` on the bench's sender and prompts with ``cfg``'s burstiness, windows, slices and
    stop rule (:func:`workbench.load.load.run_load`); arrival seed ``seed``, else ``cfg.seed``. A closed-loop
    profile sends the first ``cfg.closed_loop_requests`` prompts where the config sets it (the synchronous one its
    ``cfg.synchronous_requests`` where set), else all of them."""
    specs = bench.specs
    n = getattr(cfg, "closed_loop_requests", None)
    if profile == "synchronous" and getattr(cfg, "synchronous_requests", None):
        n = cfg.synchronous_requests
    if profile in load.CLOSED_LOOP and n:
        specs = specs[:n]
    return load.run_load(bench.send, specs, profile, rate=rate, burstiness=cfg.burstiness,
                         seed=cfg.seed if seed is None else seed,
                         warmup_s=cfg.warmup_s, cooldown_s=cfg.cooldown_s, slice_s=cfg.slice_s,
                         max_in_flight=cfg.max_in_flight, max_wait_s=cfg.max_wait_s)


def achieved_rps(res: load.LoadResult) -> float:
    """Completed requests of the kept window per second of it (the sweep's request rate of a closed-loop run)."""
    kept, wall = res.kept(), res.summary["wall_s"]
    done = int((kept["output_tokens"] >= 1).sum()) if len(kept) else 0
    return done / wall if wall and wall > 0 else float("nan")


def slo_rate_search(cfg, bench: Bench, points: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per engine: the highest offered rate (``cfg.arrival``) whose attainment of ``cfg.search_slo`` reaches
    ``cfg.attainment_target`` (its one-sided 95% lower bound: :func:`workbench.stats.slo.one_sided_bounds`; a rate that
    fell behind, :func:`~workbench.load.saturation.kept_up`, fails), by bisection
    (:func:`workbench.stats.slo.search_rate`) between half the synchronous rate and the maximum throughput,
    ``cfg.search_steps`` measurements of ``requests_per_point`` requests each, relative tolerance
    ``cfg.search_tolerance``. An over-saturated measurement (stopped early) fails.

    The synchronous and maximum rates come from the sweep already run on ``bench`` or, when missing, are
    measured here first (one ``synchronous`` and one ``throughput`` run). ``points`` is unused (kept for callers).

    Returns:
        One row per engine: ``engine``, ``slo``, ``max_batch_size``, ``max_rate_rps`` (0: even the lowest rate
        failed), ``bracket_low_rps`` / ``bracket_high_rps`` (inf: the highest tried rate still met it),
        ``bracketed``, ``measurements``, ``tolerance``, ``requests_per_measurement``, ``sync_rps``,
        ``max_throughput_rps``, ``knee_rps`` (:func:`workbench.load.saturation.knee` over the search's own
        open-loop measurements with :func:`~workbench.load.saturation.kept_up`; NaN when the lowest did not keep
        up) and ``history_json`` (per measurement: rate, attainment and its lower bound, arrival and completion
        rates, kept up, stopped early).
    """
    target = slo.get(cfg.search_slo, cfg.slo_ttft_s, cfg.slo_tpot_s)
    out = []
    for e in cfg.engine_names():
        bench.open(e)
        r = bench.rates.setdefault(e, {})
        for prof in ("synchronous", "throughput"):
            if prof not in r:
                r[prof] = achieved_rps(run_profile(bench, cfg, prof))
        hist: list = []

        def attainment_at(rate):
            res = run_profile(bench, cfg, cfg.arrival, rate)
            att = slo.attainment(res.kept(), target, res.summary["requests_planned_window"])
            verdict = saturation.kept_up(res.summary)
            hist.append({"rate_rps": rate, "attainment": att["slo_attainment"],
                         "attainment_lower": att["slo_attainment_lower"], "arrival_rps": res.summary["arrival_rps"],
                         "completion_rps": res.summary["completion_rps"], "kept_up": verdict,
                         "stopped_early": res.summary["stopped_early"]})
            # a rate passes on attainment's one-sided 95% lower bound, and only if it did not fall behind (the
            # same kept_up as the knee scan; stopped early is fell behind)
            return 0.0 if verdict == saturation.FELL_BEHIND else att["slo_attainment_lower"]

        lo, hi = r["synchronous"] * 0.5, max(r["throughput"], r["synchronous"] * 1.1)
        found = slo.search_rate(attainment_at, lo, hi, cfg.attainment_target, cfg.search_tolerance, cfg.search_steps)
        knee, _ = saturation.knee([h["rate_rps"] for h in hist], [h["kept_up"] for h in hist])
        out.append({"engine": e, "slo": target.name, "max_batch_size": cfg.max_batch_size,
                    "max_rate_rps": found["rate"], "bracket_low_rps": found["bracket"][0],
                    "bracket_high_rps": found["bracket"][1], "bracketed": found["bracketed"],
                    "measurements": found["steps"], "tolerance": cfg.search_tolerance,
                    "requests_per_measurement": cfg.requests_per_point, "sync_rps": r["synchronous"],
                    "max_throughput_rps": r["throughput"], "knee_rps": knee, "history_json": json.dumps(hist)})
        bench.close()
    return pd.DataFrame(out)
