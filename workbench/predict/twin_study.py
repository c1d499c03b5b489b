"""What ``workbench simulate`` runs (issue 34): the serving twin's points, capacity search, what-ifs, and confirming
picks for real. The command line parses and dispatches (:func:`command`); the numbers are here.

- :func:`serving_points`: notebook 08's grid simulated: per engine ``synchronous``, ``throughput``, then open-loop
  rates (given, or ``sweep_points`` evenly between the simulated synchronous and throughput rates:
  :func:`workbench.load.load.sweep_rates`, as the notebook).
- :func:`scheduling_points`: notebook 11's mixed workload (:func:`workbench.load.traces.mixed_trace`, the
  same seed and distributions) under each policy, at ``load_factor`` of the simulated one-at-a-time capacity.
- :func:`capacities`: per SLO preset the highest rate meeting it (:func:`workbench.predict.twin.capacity`).
- :func:`interesting` and :func:`confirm`: the simulated points most worth measuring, measured.
- :func:`cost_from`, :func:`read_trace`, :func:`fill_workload`: the command's inputs, checked.

Notebooks 08 and 11's settings come from the run the twin is calibrated on (its recorded configs), else from what the
caller passes in (the command line passes the experiments' Config defaults): nothing here imports an experiment.
The validation against a run's measurements is :mod:`workbench.predict.twin_validation`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import load, traces
from workbench.predict import twin, twin_cost
from workbench.predict.twin_validation import cost_for, sentence, specs_from_rows, validate
from workbench.serving import engines, scheduling
from workbench.stats import slo

#: notebook 11's workload keys :func:`scheduling_points` needs (the run's recorded config, else passed in)
SCHEDULING_WORKLOAD = ("short_share", "short_prompt_tokens", "long_prompt_tokens", "short_max_tokens",
                       "long_max_tokens", "class_slo_ttft_s")


def _point(res: twin.TwinResult, **labels) -> dict:
    return {**labels, **res.summary}


def serving_points(cost, cfg: twin.TwinConfig, engine_names, n: int, prompt_tokens: int, max_tokens: int,
                   rates=None, sweep_points: int = 3, arrival: str = "poisson", burstiness: float = 1.0,
                   seed: int = 0, trace_rows=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook 08's points simulated (module docstring); ``trace_rows``: replay that trace instead of the rates.

    Returns:
        ``(points, requests)``, both with ``source = "simulated"``.
    """
    pts, reqs = [], []
    for e in engine_names:
        c = dataclasses.replace(cfg, engine=e, policy=cfg.policy if e != "continuous" else "fcfs",
                                prefix_sharing=cfg.prefix_sharing and e == "continuous")
        base = twin.open_loop("constant", n, 1.0, prompt_tokens, max_tokens)
        runs = []
        if trace_rows is not None:
            runs.append(("replay", None, twin.trace_specs(trace_rows)))
        else:
            got = {}
            for prof in ("synchronous", "throughput"):
                r = twin.simulate(cost, base, c, prof)
                got[prof] = r.summary["request_throughput_rps"]
                pts.append(_point(r, engine=e, step=0))
                reqs.append(r.rows.assign(engine=e, profile=prof, step=0))
            plan = list(rates) if rates else load.sweep_rates(got["synchronous"], got["throughput"], sweep_points)
            for i, rate in enumerate(plan):
                specs = twin.open_loop(arrival, n, rate, prompt_tokens, max_tokens, burstiness, seed)
                runs.append((arrival, rate, specs))
        for i, (prof, rate, specs) in enumerate(runs):
            r = twin.simulate(cost, specs, c, prof, rate=rate)
            pts.append(_point(r, engine=e, step=i + 1))
            reqs.append(r.rows.assign(engine=e, profile=prof, step=i + 1))
    return pd.DataFrame(pts), pd.concat(reqs, ignore_index=True)


def scheduling_points(cost, cfg: twin.TwinConfig, policies, workload: dict, n: int = 200, load_factor: float = 0.9,
                      seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook 11's mixed workload under each policy (module docstring), with its per-class columns
    (:func:`workbench.stats.classes.class_columns`).

    Args:
        workload: notebook 11's settings, at least :data:`SCHEDULING_WORKLOAD` (``short_share``,
            ``short_prompt_tokens``, ``long_prompt_tokens``, ``short_max_tokens``, ``long_max_tokens``,
            ``class_slo_ttft_s``): a run's recorded scheduling config, or the caller's defaults.

    Raises:
        ParameterError: a key of :data:`SCHEDULING_WORKLOAD` missing from ``workload``.
    """
    from workbench.stats.classes import class_columns

    missing = [k for k in SCHEDULING_WORKLOAD if k not in workload]
    if missing:
        raise ParameterError(f"workload: notebook 11's {', '.join(missing)} missing (its recorded config, or its "
                             "Config's defaults)")
    d = workload
    short_share, short_max_tokens, long_max_tokens = d["short_share"], d["short_max_tokens"], d["long_max_tokens"]
    short_prompt_tokens, long_prompt_tokens = d["short_prompt_tokens"], d["long_prompt_tokens"]
    class_slo_ttft_s = d["class_slo_ttft_s"]
    alone = {"interactive": cost.service_s(short_prompt_tokens[0], short_max_tokens),
             "background": cost.service_s(long_prompt_tokens[0], long_max_tokens)}
    rate = load_factor / (short_share * alone["interactive"] + (1 - short_share) * alone["background"])
    rows = traces.mixed_trace(n, short_share, list(short_prompt_tokens), list(long_prompt_tokens),
                              short_max_tokens, long_max_tokens, rate, seed)
    pts, reqs = [], []
    for p in policies:
        r = twin.simulate(cost, twin.trace_specs(rows), dataclasses.replace(cfg, policy=p), "replay", rate=rate)
        extra = class_columns(r.rows, class_slo_ttft_s, r.summary["window_s"])
        pts.append(_point(r, workload="mixed", **extra))
        reqs.append(r.rows.assign(policy=p, workload="mixed"))
    return pd.DataFrame(pts), pd.concat(reqs, ignore_index=True)


def capacities(cost, cfg: twin.TwinConfig, presets, prompt_tokens: int, max_tokens: int, n: int = 200,
               target: float = 0.9, seed: int = 0) -> pd.DataFrame:
    """Per SLO preset (:data:`workbench.stats.slo.PRESETS` names or ``custom`` objects): ``max_rate_rps`` meeting it
    (:func:`workbench.predict.twin.capacity`), the bracket and the simulations it took."""
    rows = []
    for p in presets:
        s = p if isinstance(p, slo.SLO) else slo.get(p)
        t = time.perf_counter()
        found = twin.capacity(cost, cfg, s, prompt_tokens, max_tokens, n=n, target=target, seed=seed)
        rows.append({"slo": s.name, "engine": cfg.engine, "policy": cfg.policy, "replicas": cfg.replicas,
                     "router": cfg.router, "max_rate_rps": found["rate"], "bracket_high_rps": found["bracket"][1],
                     "simulations": found["steps"], "search_s": time.perf_counter() - t,
                     "cost_source": cost.source, "source": twin.SOURCE})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- validation against a measured run


# ----------------------------------------------------------------------------- predict, then confirm


def interesting(points: pd.DataFrame, k: int) -> list[tuple[str, float]]:
    """The ``k`` simulated open-loop points most worth measuring, as ``(engine, rate)``: per engine its knee (the
    highest rate that kept up), then the first rate past it, engines taken in turn."""
    checks.check_int("confirm", k, lo=1)
    per = []
    for e, g in points[points["profile"].isin(load.OPEN_LOOP)].groupby("engine", sort=False):
        g = g.sort_values("offered_rps")
        up = g[g["kept_up"].map(lambda v: v is True)]
        knee = float(up["offered_rps"].iloc[-1]) if len(up) else float(g["offered_rps"].iloc[0])
        past = g[g["offered_rps"] > knee]
        per.append([(e, knee)] + ([(e, float(past["offered_rps"].iloc[0]))] if len(past) else []))
    out = []
    for i in range(max((len(x) for x in per), default=0)):
        out += [x[i] for x in per if i < len(x)]
    return out[:k]


def confirm(cost, loaded, picks, cfg) -> pd.DataFrame:
    """Measure each ``(engine, rate)`` of ``picks`` for real (notebook 08's load point: the same requests, profile
    and stop rule, :class:`workbench.experiments.serving_load.Config` ``cfg``), replay the very arrivals of the
    measurement in the twin at the measurement's own speed (the drift reference right before and after it,
    :func:`workbench.run.drift.speed_probe`, and :meth:`workbench.predict.twin_cost.StepCost.at_speed`: a cost fitted
    with probes on this model is rescaled to the moment, ``speed_factor``), and put both side by side with ``ape_*``
    (``|simulated / measured - 1|``).

    Returns:
        One row per pick: ``engine``, ``rate_rps``, ``speed_factor``, ``measured_*``, ``simulated_*``, ``ape_*`` of
        ``ttft_s_p50`` and ``e2e_s_p50``, ``source`` ``measured`` (the row is a measurement with its prediction
        beside it).
    """
    from workbench.load.bench import Bench, run_sampled
    from workbench.run import drift

    bench = Bench(cfg, loaded)
    rows = []
    try:
        for engine, rate in picks:
            bench.open(engine)
            before = drift.reference_tpot_s(loaded, drift.REFERENCE_REUSE_S)
            res, _ = run_sampled(bench, cfg, cfg.arrival, rate)
            at, factor = cost.at_speed(drift.speed_probe(before, drift.reference_tpot_s(loaded))["speed_probe_tpot_s"])
            kept = res.kept()
            tc = twin.TwinConfig(engine=engine, max_batch_size=cfg.max_batch_size, batch_window_s=cfg.batch_window_s)
            specs = specs_from_rows(kept.assign(max_new_tokens=cfg.max_new_tokens), {}, "serving_load")
            sim = twin.simulate(at, specs, tc, "replay", rate=rate).summary
            row = {"engine": engine, "rate_rps": rate, "requests": int(len(kept)), "cost_source": cost.source,
                   "speed_factor": factor, "source": "measured"}
            for c in ("ttft_s_p50", "e2e_s_p50"):
                col = c.rsplit("_", 1)[0]
                m = metrics_p50(kept, col)
                row[f"measured_{c}"], row[f"simulated_{c}"] = m, sim[c]
                row[f"ape_{c}"] = abs(sim[c] / m - 1) if m == m and m > 0 else math.nan
            rows.append(row)
    finally:
        bench.close()
    return pd.DataFrame(rows)


def metrics_p50(rows: pd.DataFrame, col: str) -> float:
    """The median of a column over the rows that produced tokens (:func:`workbench.stats.metrics.percentiles`)."""
    from workbench.stats import metrics

    done = rows[pd.to_numeric(rows.get("output_tokens"), errors="coerce") >= 1] if len(rows) else rows
    return metrics.percentiles(done[col].tolist() if col in done else [], (50,))["p50"]


# ----------------------------------------------------------------------------- the command


def read_trace(path) -> list[dict]:
    """A JSONL trace for the twin: :func:`workbench.load.load.read_trace`'s checked fields plus, where a line has
    them, ``priority`` (checked as the server checks it), ``request_class``, ``patience_s``, ``prefix_key`` and
    ``prefix_tokens``.

    Raises:
        ParameterError: what ``read_trace`` refuses, or a bad optional field (one line naming the line).
    """
    rows = load.read_trace(path)
    lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    out = []
    for i, (row, obj) in enumerate(zip(rows, lines), 1):
        extra = {k: obj[k] for k in ("priority", "request_class", "patience_s", "prefix_key", "prefix_tokens")
                 if obj.get(k) is not None}
        try:
            if "priority" in extra:
                scheduling.check_priority(extra["priority"])
            if "patience_s" in extra:
                checks.check_float("patience_s", extra["patience_s"], lo=0, lo_open=True)
            if "prefix_tokens" in extra:
                checks.check_int("prefix_tokens", extra["prefix_tokens"], lo=0)
        except ParameterError as exc:
            raise ParameterError(f"trace: line {i}: {exc}") from None
        out.append({**row, **extra})
    return out


def cost_from(args) -> twin_cost.StepCost:
    """The cost model ``simulate``'s options name: exactly one of ``args.run`` (:func:`cost_for`),
    ``args.calibration`` (a ``twin_calibration.json``) or ``args.device_profile`` with ``args.model_config`` and
    ``args.dtype`` (:func:`workbench.predict.twin_cost.from_roofline`).

    Raises:
        ParameterError: none or several given, a missing or malformed file (one line).
    """
    from workbench.predict import roofline

    given = [x for x in (args.run, args.calibration, args.device_profile) if x]
    if len(given) != 1:
        raise ParameterError("calibration: give exactly one of --run RUN_DIR, --calibration FILE, "
                             "--device-profile bandwidth=..,flops=.. (with --model-config)")
    if args.run:
        return cost_for(args.run)
    if args.calibration:
        p = Path(args.calibration)
        if not p.is_file():
            raise ParameterError(f"calibration: no such file {str(p)!r}")
        checks.check_file_size("calibration", p)
        try:
            return twin_cost.StepCost.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except ValueError as exc:
            raise ParameterError(f"calibration: {p} is not JSON ({exc})") from None
    dev = twin_cost.device_profile(args.device_profile, args.dtype)
    if not args.model_config:
        raise ParameterError("model_config: a device profile needs the model's config.json (--model-config)")
    mc = Path(args.model_config)
    if not mc.is_file():
        raise ParameterError(f"model_config: no such file {str(mc)!r}")
    checks.check_file_size("model_config", mc)
    shape = roofline.ModelShape.from_config(json.loads(mc.read_text(encoding="utf-8")), args.dtype)
    model = mc.parent.name if mc.name == "config.json" and mc.parent.name else mc.stem
    return twin_cost.from_roofline(shape, dev, source=f"roofline:{dev.name}/{model}")


#: ``simulate``'s workload options: notebook 08's config keys, from the run, else the defaults passed in
WORKLOAD = ("prompt_tokens", "max_new_tokens", "max_batch_size", "batch_window_s")


def recorded_config(run_dir, experiment: str) -> dict:
    """The config a run recorded for ``experiment`` (its manifest's ``experiments.<name>.config``); {} without a run,
    without one recorded, or when the manifest cannot be read."""
    if not run_dir:
        return {}
    from workbench.run import results

    try:
        return (results.read_manifest(run_dir).get("experiments", {}).get(experiment) or {}).get("config") or {}
    except (OSError, ValueError):
        return {}


def fill_workload(args, defaults: dict) -> dict:
    """Set the workload options (:data:`WORKLOAD`) left unset (None) on ``args``: from ``--run``'s notebook 08 config
    (the run's own workload: a twin calibrated on a run then predicts that run's serving points by default), else
    from ``defaults`` (the command line passes notebook 08's Config defaults). Returns ``{option: "run"}`` for those
    filled from the run."""
    cfg = recorded_config(getattr(args, "run", None), "serving_load")
    came = {}
    for k in WORKLOAD:
        if getattr(args, k, None) is None:
            value = cfg[k] if cfg.get(k) is not None else defaults[k]
            setattr(args, k, type(defaults[k])(value))
            if cfg.get(k) is not None:
                came[k] = "run"
    return came


def _csv(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def command(args, load_defaults: dict, scheduling_defaults: dict, load_config) -> int:
    """``workbench simulate`` (its arguments: :mod:`workbench.cli.simulate_args`). Every parameter is checked
    (one-line ParameterError) before any simulation runs.

    Args:
        args: the parsed arguments.
        load_defaults: notebook 08's settings where ``--run`` recorded none (:func:`fill_workload`).
        scheduling_defaults: notebook 11's settings where ``--run`` recorded none (:data:`SCHEDULING_WORKLOAD`, and
            the policies' ``aging_s``, ``long_cap``, ``lane_threshold_tokens``).
        load_config: notebook 08's Config class, built for ``--confirm``'s measured points.
    """
    if args.validate:
        cost = cost_from(args) if (args.calibration or args.device_profile or args.run) else None
        df, summ = validate(args.validate, cost)
        print(sentence(summ))
        for k in ("mape_by_experiment", "knee_search", "knee_measured", "knee_simulated", "recommendation_measured",
                  "recommendation_simulated", "recommendation_decided_count", "recommendation_undetermined_both"):
            if k in summ:
                print(f"  {k}: {summ[k]}")
        print(f"  written: {Path(args.validate) / twin.VALIDATION_FILE}, metrics.json")
        return 0
    engine_names = _csv(args.engines)
    checks.check_choice_list("engines", engine_names, engines.ENGINES)
    policies = _csv(args.policies)
    checks.check_choice_list("policies", policies, scheduling.POLICIES)
    checks.check_choice("arrival", args.arrival, ("constant", "poisson", "gamma"))
    try:
        parts = [x.strip() for x in str(args.rates).split(",")] if args.rates else []
        if any(not x for x in parts):
            raise ValueError
        rates = [float(x) for x in parts] or None
    except ValueError:
        raise ParameterError(f"rates: must be comma-separated numbers > 0 in req/s (got {args.rates!r})") from None
    if rates and args.trace:
        raise ParameterError("rates: a trace (--trace) brings its own arrivals; give --rates or --trace, not both")
    checks.check_int("sweep_points", args.sweep_points, lo=1, hi=1000)
    if rates:
        checks.check_float_list("rates", rates, lo=0, lo_open=True)
        if len(rates) > 1000:
            raise ParameterError(f"rates: at most 1000 rates (got {len(rates)})")
    checks.check_int("requests", args.requests, lo=2, hi=checks.MAX_REQUESTS)
    from_run = fill_workload(args, load_defaults)
    checks.check_int("prompt_tokens", args.prompt_tokens, lo=1, hi=checks.MAX_REQUEST_TOKENS)
    checks.check_int("max_new_tokens", args.max_new_tokens, lo=1, hi=checks.MAX_REQUEST_TOKENS)
    checks.check_int("max_batch_size", args.max_batch_size, lo=1, hi=checks.MAX_BATCH_SIZE)
    checks.check_float("batch_window_s", args.batch_window_s, lo=0)
    checks.check_float("target", args.target, lo=0, hi=1, lo_open=True)
    checks.check_float("load_factor", args.load_factor, lo=0, lo_open=True)
    if args.out:
        from workbench.run import results

        out = results.writable_run(args.out, must_exist=False)   # one line before anything is simulated
        held = [n for n in ("points.parquet", "requests.parquet") if (out / n).exists()]
        if held:   # a run's measured tables (or an earlier simulation's) are never overwritten
            raise ParameterError(f"out: {out} already holds {' and '.join(held)}; give a new folder (a simulation "
                                 "never overwrites a run's tables)")
    if args.confirm:
        checks.check_int("confirm", args.confirm, lo=1)
        checks.check_int("confirm_requests", args.confirm_requests, lo=2)
    presets = _csv(args.slo) if args.slo else list(slo.PRESETS)
    checks.check_choice_list("slo", presets, tuple(slo.PRESETS))
    trace_rows = read_trace(args.trace) if args.trace else None
    if args.prefix_sharing and "continuous" not in engine_names:
        raise ParameterError("prefix_sharing: only the continuous engine shares prefix cache pages "
                             "(add continuous to --engines)")
    cfg = twin.TwinConfig(engine="continuous" if args.prefix_sharing else engine_names[0], policy=policies[0],
                          max_batch_size=args.max_batch_size, batch_window_s=args.batch_window_s,
                          max_pending=args.max_pending, replicas=args.replicas, router=args.router,
                          prefix_sharing=args.prefix_sharing,
                          max_batch_tokens=args.max_batch_tokens, page_size=args.page_size)
    cost = cost_from(args)
    print(f"PREDICTION (simulated, not measured): {cost.describe()}")
    print(f"workload: {args.prompt_tokens} prompt / {args.max_new_tokens} output tokens a request, batches up to "
          f"{args.max_batch_size}" + (" (notebook 08's settings in --run)" if from_run else ""))
    t0 = time.perf_counter()
    pts, reqs = serving_points(cost, cfg, engine_names, args.requests, args.prompt_tokens, args.max_new_tokens,
                               rates, args.sweep_points, args.arrival, seed=args.seed, trace_rows=trace_rows)
    show = ["engine", "profile", "offered_rps", "request_throughput_rps", "ttft_s_p50", "ttft_s_p90", "e2e_s_p50",
            "queue_s_p50", "kept_up"]
    # an admission limit or patience at work: how many were refused (429), resent, abandoned, never served
    show += [c for c in ("refused", "retried", "abandoned", "not_served") if c in pts and (pts[c] > 0).any()]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(pts[show].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        if len(policies) > 1 or policies[0] != "fcfs":
            nb = {**scheduling_defaults, **recorded_config(args.run, "scheduling")}  # as notebook 11 runs them
            sc = dataclasses.replace(cfg, engine=args.scheduling_engine, aging_s=nb["aging_s"], long_cap=nb["long_cap"],
                                     lane_threshold_tokens=nb["lane_threshold_tokens"], replicas=1)
            sp, sr = scheduling_points(cost, sc, policies, nb, args.requests, args.load_factor, args.seed)
            cols = ["policy", "ttft_s_p50_interactive", "ttft_s_p90_interactive", "ttft_s_p50_background",
                    "queue_s_max", "slo_attainment_interactive"]
            print(sp[[c for c in cols if c in sp]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
            pts = pd.concat([pts, sp], ignore_index=True)
            reqs = pd.concat([reqs, sr], ignore_index=True)
        if args.capacity:
            cap = pd.concat([capacities(cost, dataclasses.replace(cfg, engine=e), presets, args.prompt_tokens,
                                        args.max_new_tokens, args.requests, args.target, args.seed)
                             for e in engine_names], ignore_index=True)
            print(cap[["slo", "engine", "replicas", "max_rate_rps", "simulations", "search_s"]].to_string(
                index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"simulated in {time.perf_counter() - t0:.2f} s")
    if args.confirm:
        from workbench.measure import models

        picks = interesting(pts, args.confirm)
        cfg8 = load_config(model=args.model, engines=sorted({e for e, _ in picks}),
                                   requests_per_point=args.confirm_requests, prompt_tokens=args.prompt_tokens,
                                   max_new_tokens=args.max_new_tokens, max_batch_size=args.max_batch_size,
                                   batch_window_s=args.batch_window_s, arrival=args.arrival, seed=args.seed)
        print(f"confirming {len(picks)} points for real: {picks}")
        conf = confirm(cost, models.load_model(cfg8.model, cfg8.device, cfg8.dtype), picks, cfg8)
        print(conf.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        print(f"twin error on the confirmed points: e2e p50 {conf['ape_e2e_s_p50'].mean():.0%}, "
              f"TTFT p50 {conf['ape_ttft_s_p50'].mean():.0%} ({len(conf)} points)")
    if args.out:
        from workbench.run import results
        from workbench.run.point_result import point_id

        run = results.open_run(args.out)
        keys = [k for k in ("engine", "policy", "profile", "step", "offered_rps") if k in pts]
        ids = [point_id("simulate", {k: r[k] for k in keys if r[k] == r[k] and r[k] is not None})
               for r in pts.to_dict("records")]
        results.write_table(run / "points.parquet", pts.assign(experiment="simulate", source=twin.SOURCE,
                                                               point_id=ids))
        results.write_table(run / "requests.parquet", reqs.assign(experiment="simulate", source=twin.SOURCE))
        twin_cost.save(run, cost)
        print(f"written: {run}")
    return 0
