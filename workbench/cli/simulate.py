"""``workbench simulate``: the serving twin's points, capacity search, what-ifs and validation (issue 34).

- :func:`serving_points`: notebook 08's grid simulated: per engine ``synchronous``, ``throughput``, then open-loop
  rates (given, or ``sweep_points`` evenly between the simulated synchronous and throughput rates:
  :func:`workbench.serving.load.sweep_rates`, as the notebook).
- :func:`scheduling_points`: notebook 11's mixed workload (:func:`workbench.serving.traces.mixed_trace`, the
  same seed and distributions) under each policy, at ``load_factor`` of the simulated one-at-a-time capacity.
- :func:`capacities`: per SLO preset the highest rate meeting it (:func:`workbench.predict.twin.capacity`).
- :func:`validate`: for every measured serving and scheduling point of a run, the twin's prediction of the same
  requests (their scheduled times, sizes, classes, priorities; the point's engine, policy and limits) beside the
  measurement: ``twin_validation.csv`` (one row per point, ``measured_*``, ``simulated_*`` and ``ape_*`` columns:
  ``|simulated / measured - 1|``) and, merged into the run's ``metrics.json``, ``mape_e2e_p50``, ``mape_ttft_p50``
  (means over the points, as BLIS reports), their point counts, and the knee and recommendation per SLO preset
  measured vs simulated (:func:`workbench.serving.saturation.knees` / ``recommend`` on both tables).

The cost model of a run (:func:`cost_for`): its ``twin_calibration.json``, else a fit on its own request rows
outside the serving experiments (so the validation is out of sample), else on all of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import checks
from workbench.stats import slo
from workbench.predict import twin, twin_cost
from workbench.share import run_summary
from workbench.errors import ParameterError
from workbench.serving import engines, load, saturation, scheduling, senders, traces

SERVING_EXPERIMENTS = ("serving_load", "scheduling")
COMPARED = ("ttft_s_p50", "ttft_s_p90", "tpot_s_p50", "e2e_s_p50", "e2e_s_p90", "queue_s_p50",
            "request_throughput_rps", "goodput_rps")


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


def notebook11_defaults() -> dict:
    """The defaults of notebook 11's config (:class:`workbench.experiments.scheduling.Config`): one home."""
    from workbench.experiments import scheduling as sched_exp

    out = {}
    for f in dataclasses.fields(sched_exp.Config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def scheduling_points(cost, cfg: twin.TwinConfig, policies, n: int = 200, load_factor: float = 0.9, seed: int = 0,
                      **workload) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Notebook 11's mixed workload under each policy (module docstring), with its per-class columns
    (:func:`workbench.stats.classes.class_columns`). ``workload``: any of notebook 11's ``short_share``,
    ``short_prompt_tokens``, ``long_prompt_tokens``, ``short_max_tokens``, ``long_max_tokens``,
    ``class_slo_ttft_s`` (default: the notebook's, :func:`notebook11_defaults`)."""
    from workbench.stats.classes import class_columns

    d = {**notebook11_defaults(), **workload}
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


def cost_for(run_dir) -> twin_cost.StepCost:
    """A run's cost model (module docstring).

    Raises:
        ParameterError: no usable calibration in the run (one line).
    """
    from workbench.run import results

    run = Path(run_dir)
    if (run / twin_cost.CALIBRATION_FILE).is_file():
        return twin_cost.load(run)
    req = results.read_requests(run)
    if req.empty:
        raise ParameterError(f"calibration: {str(run)!r} has no requests.parquet to fit the twin's cost model on")
    if "experiment" in req:
        other = req[~req["experiment"].isin(SERVING_EXPERIMENTS)]
        try:
            cost = twin_cost.fit(other, source=f"fit:{run.name} (non-serving rows)")
        except ParameterError:
            return twin_cost.fit(req, source=f"fit:{run.name} (all rows)")
        # the served request's own costs, from the run's synchronous serving points (twin_cost.with_serving)
        points = results.read_points(run) if (run / "points.parquet").is_file() else pd.DataFrame()
        if {"experiment", "profile", "point_id"} <= set(points.columns):
            sync = points[(points["experiment"] == "serving_load") & (points["profile"] == "synchronous")]
            if "status" in sync:
                sync = sync[sync["status"].eq("ok")]
            if "engine" in sync:
                sync = sync[sync["engine"].isin(engines.ENGINES)]
            if len(sync):
                return twin_cost.with_serving(cost, req, sync["point_id"])
        return cost
    return twin_cost.fit(req, source=f"fit:{run.name} (all rows)")


def _num(v) -> float:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return math.nan
    return v


def _specs_from_rows(rows: pd.DataFrame, cfg: dict, experiment: str) -> list:
    rows = rows.sort_values("request_id") if "request_id" in rows else rows
    off = pd.to_numeric(rows.get("t_scheduled_s"), errors="coerce").fillna(0.0).clip(lower=0.0)
    t0 = float(off.min()) if len(off) else 0.0
    out_col = "max_tokens" if "max_tokens" in rows and rows["max_tokens"].notna().all() else "max_new_tokens"
    specs = []
    for (_, r), o in zip(rows.iterrows(), off):
        specs.append(twin.TwinSpec(float(o) - t0, int(_num(r.get("prompt_tokens")) or 1),
                                   int(_num(r.get(out_col)) or 1), int(_num(r.get("priority")) or 0)
                                   if _num(r.get("priority")) == _num(r.get("priority")) else 0,
                                   r.get("request_class")))
    if experiment == "scheduling" and _num(cfg.get("abandon_share")) > 0:  # the same clients lose patience
        picked = senders.with_patience([load.RequestSpec("", 1)] * len(specs), float(cfg["abandon_share"]),
                                    float(cfg["patience_s"]), int(cfg.get("seed", 0)))
        specs = [dataclasses.replace(s, patience_s=p.patience_s) for s, p in zip(specs, picked)]
    return specs


def _turn_specs(rows: pd.DataFrame, cfg: dict) -> list:
    rows = rows.sort_values(["conversation", "turn"])
    specs, index = [], {}
    for _, r in rows.iterrows():
        c, t = int(r["conversation"]), int(r["turn"])
        prev = index.get((c, t - 1))
        shared = specs[prev].prompt_tokens if prev is not None else int(cfg.get("shared_prefix_tokens") or 0)
        key = f"conv{c}" if prev is not None or not cfg.get("shared_prefix_tokens") else "doc"
        specs.append(twin.TwinSpec(0.0, int(r["prompt_tokens"]), int(r.get("max_new_tokens") or 1), prefix_key=key,
                                   prefix_tokens=shared, store_tokens=int(r["prompt_tokens"]), after=prev,
                                   conversation=c, turn=t))
        index[(c, t)] = len(specs) - 1
    return specs


def _simulate_point(cost, point: pd.Series, rows: pd.DataFrame, cfg: dict) -> dict | None:
    exp = point.get("experiment")
    if exp == "serving_load":
        e = point.get("engine")
        if e not in engines.ENGINES:
            return None  # an external endpoint: nothing of ours to simulate
        tc = twin.TwinConfig(engine=e, max_batch_size=int(cfg.get("max_batch_size", 8)),
                             batch_window_s=float(cfg.get("batch_window_s", 0.05)))
        prof = point.get("profile")
        if prof in load.CLOSED_LOOP:
            specs = twin.open_loop("constant", max(len(rows), 2), 1.0, int(cfg.get("prompt_tokens", 64)),
                                   int(cfg.get("max_new_tokens", 16)))
            return twin.simulate(cost, specs, tc, prof).summary
        return twin.simulate(cost, _specs_from_rows(rows, cfg, exp), tc, "replay",
                             rate=_num(point.get("offered_rps"))).summary
    if exp == "scheduling":
        work = point.get("workload", "mixed")
        if work in ("multiturn", "shared_prefix"):
            on = bool(point.get("prefix_sharing"))
            engine = "continuous" if any(cfg.get("multiturn_prefix_sharing") or []) else cfg.get("engine", "fifo")
            tc = twin.TwinConfig(engine=engine, max_batch_size=int(cfg.get("max_batch_size", 4)),
                                 batch_window_s=float(cfg.get("batch_window_s", 0.05)), prefix_sharing=on)
            return twin.simulate(cost, _turn_specs(rows, cfg), tc, "replay").summary
        tc = twin.TwinConfig(engine=cfg.get("engine", "fifo"), policy=point.get("policy", "fcfs"),
                             aging_s=float(cfg.get("aging_s", scheduling.AGING_S)),
                             lane_threshold_tokens=int(cfg.get("lane_threshold_tokens",
                                                               scheduling.LANE_THRESHOLD_TOKENS)),
                             long_cap=int(cfg.get("long_cap", 1)), predictor=cfg.get("sjf_predictor", "proxy"),
                             max_batch_size=int(cfg.get("max_batch_size", 4)),
                             batch_window_s=float(cfg.get("batch_window_s", 0.05)),
                             max_pending=cfg.get("max_pending"), max_retries=int(cfg.get("max_retries", 3)))
        res = twin.simulate(cost, _specs_from_rows(rows, cfg, exp), tc, "replay")
        from workbench.stats.classes import class_columns

        classes = cfg.get("class_slo_ttft_s") or {"interactive": 2.0, "background": 30.0}
        return {**res.summary, **class_columns(res.rows, classes, res.summary["window_s"])}
    return None


def validate(run_dir, cost: twin_cost.StepCost | None = None, write: bool = True) -> tuple[pd.DataFrame, dict]:
    """The twin beside every measured serving and scheduling point of ``run_dir`` (module docstring).

    Returns:
        ``(table, summary)``: the ``twin_validation.csv`` rows and the keys merged into ``metrics.json``
        (``mape_e2e_p50``, ``mape_ttft_p50``, ``twin_points``, ``twin_cost_source``, knees and recommendations).

    Raises:
        ParameterError: no such run, no serving or scheduling point in it, no usable calibration (one line).
    """
    from workbench.run import results
    from workbench.experiments import serving_load

    run = Path(run_dir)
    if not (run / "points.parquet").is_file():
        raise ParameterError(f"run: {str(run)!r} has no points.parquet")
    points = results.read_points(run)
    points = points[points.get("experiment", pd.Series(dtype=str)).isin(SERVING_EXPERIMENTS)]
    if "status" in points:
        points = points[points["status"].eq("ok")]
    if points.empty:
        raise ParameterError(f"run: {str(run)!r} has no measured serving_load or scheduling point to validate against")
    cost = cost or cost_for(run)
    requests = results.read_requests(run)
    configs = {k: (v or {}).get("config") or {} for k, v in results.read_manifest(run).get("experiments", {}).items()}
    table, sim_points = [], []
    for _, p in points.iterrows():
        rows = requests[requests["point_id"] == p["point_id"]] if "point_id" in requests else requests.iloc[:0]
        if rows.empty:
            continue
        sim = _simulate_point(cost, p, rows, configs.get(p["experiment"], {}))
        if sim is None:
            continue
        row = {"point_id": p["point_id"], "experiment": p["experiment"], "engine": p.get("engine"),
               "policy": p.get("policy"), "profile": p.get("profile"), "workload": p.get("workload"),
               "offered_rps": _num(p.get("offered_rps")), "requests": int(len(rows)), "valid": p.get("valid"),
               "cost_source": cost.source, "source": twin.SOURCE}
        per_class = ("ttft_s_p50_", "ttft_s_p90_", "slo_attainment_")
        cols = list(COMPARED) + sorted(c for c in sim if c.startswith(per_class))
        for c in cols:
            m, s = _num(p.get(c)), _num(sim.get(c))
            row[f"measured_{c}"], row[f"simulated_{c}"] = m, s
            row[f"ape_{c}"] = abs(s / m - 1) if m == m and s == s and m > 0 else math.nan
        table.append(row)
        sim_points.append({**p.to_dict(), **{k: v for k, v in sim.items() if k in p.index or k.startswith("slo_")},
                           "source": twin.SOURCE})
    df = pd.DataFrame(table)
    # errors over valid points only: an invalid point (contended, drifted) measured the machine, not the engine; its
    # row stays in the table with valid=False
    valid = df["valid"].fillna(False).astype(bool) if "valid" in df else pd.Series(True, index=df.index)
    # a point the served-request terms were fitted on is in-sample: in the table (calibration=True), not in the errors
    calib = set(cost.serving_points)
    df["calibration"] = df["point_id"].astype(str).isin(calib) if len(df) else pd.Series(dtype=bool)
    in_sample = df["calibration"].astype(bool)
    valid_all = valid
    valid = valid & ~in_sample
    summary = {"twin_points": int(valid.sum()), "twin_points_invalid": int((~valid_all).sum()),
               "twin_points_calibration": int((in_sample & valid_all).sum()), "twin_cost_source": cost.source,
               "twin_cost_loo_step_error": cost.loo_step_error, "twin_cost_loo_prefill_error": cost.loo_prefill_error}
    for key, col in (("mape_e2e_p50", "ape_e2e_s_p50"), ("mape_ttft_p50", "ape_ttft_s_p50"),
                     ("mape_e2e_p90", "ape_e2e_s_p90"), ("mape_ttft_p90", "ape_ttft_s_p90"),
                     ("mape_tpot_p50", "ape_tpot_s_p50"), ("mape_queue_p50", "ape_queue_s_p50")):
        v = pd.to_numeric(df[valid].get(col, pd.Series(dtype=float)), errors="coerce").dropna()
        summary[key], summary[f"{key}_points"] = (float(v.mean()) if len(v) else math.nan), int(len(v))
    measured_sl = points[points["experiment"] == "serving_load"]
    simulated_sl = pd.DataFrame([p for p in sim_points if p.get("experiment") == "serving_load"])
    if not measured_sl.empty and not simulated_sl.empty:
        summary["knee_measured"] = {k: _num(v) for k, v in saturation.knees(measured_sl).items()}
        summary["knee_simulated"] = {k: _num(v) for k, v in saturation.knees(simulated_sl).items()}
        rm, rs = serving_load.recommend(measured_sl), serving_load.recommend(simulated_sl)
        if not rm.empty and not rs.empty:
            summary["recommendation_measured"] = dict(zip(rm["slo"], rm["max_rate_rps"].map(float)))
            summary["recommendation_simulated"] = dict(zip(rs["slo"], rs["max_rate_rps"].map(float)))
    if write:
        path = run / twin.VALIDATION_FILE
        from workbench.run import results as res_mod

        text = df.to_csv(index=False)
        res_mod.atomic_write(path, lambda f: f.write(text), text=True)
        run_summary.merge_metrics(run, summary)
    return df, summary


def sentence(summary: dict) -> str:
    """The validation in words: the errors with their point counts (as BLIS reports them) and, where the twin
    misses, the cost-model term that carries the error (TTFT: the prefill term; TPOT: the decode step term; queue
    time: the scheduling, which the twin runs as the real code, so its error follows the service times)."""
    n = summary.get("twin_points", 0)
    if not n:
        return ("twin: no valid measured serving or scheduling point to compare with"
                + (f" ({summary['twin_points_invalid']} invalid)." if summary.get("twin_points_invalid") else "."))

    def pct(k):
        v = summary.get(k)
        return "n/a" if v is None or v != v else f"{v:.0%}"

    left = summary.get("twin_points_invalid") or 0
    calib = summary.get("twin_points_calibration") or 0
    out = [f"{left} invalid"] if left else []
    out += [f"{calib} calibration point{'s' if calib > 1 else ''}"] if calib else []
    gone = f" ({', '.join(out)} left out)" if out else ""
    text = (f"Twin vs measurement over {n} valid points{gone} "
            f"(cost model {summary.get('twin_cost_source')}): MAPE e2e p50 "
            f"{pct('mape_e2e_p50')} ({summary.get('mape_e2e_p50_points', 0)} points), TTFT p50 {pct('mape_ttft_p50')} "
            f"({summary.get('mape_ttft_p50_points', 0)}), TPOT p50 {pct('mape_tpot_p50')}, queue p50 "
            f"{pct('mape_queue_p50')}.")
    worst = max((("prefill term (a0-a2: TTFT)", summary.get("mape_ttft_p50")),
                 ("decode step term (b0-b3: TPOT)", summary.get("mape_tpot_p50"))),
                key=lambda t: -1 if t[1] is None or t[1] != t[1] else t[1])
    if worst[1] is not None and worst[1] == worst[1] and worst[1] > 0.1:
        text += f" The larger miss is the {worst[0]}."
    km, ks = summary.get("knee_measured"), summary.get("knee_simulated")
    if km and ks:
        text += " Knee measured / simulated: " + ", ".join(f"{e} {km[e]:.3g} / {ks.get(e, math.nan):.3g} req/s"
                                                           for e in km) + "."
    return text


def figure(table: pd.DataFrame, experiment: str):
    """The twin beside the measurement: per point TTFT p50 and e2e p50, measured (markers) and simulated (dashed,
    open markers); ``serving_load`` against the offered rate per engine, ``scheduling`` per policy / workload."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT p50 (s)", "e2e p50 (s)"))
    df = table[table["experiment"] == experiment] if not table.empty else table
    if experiment == "serving_load":
        groups = [(e, g[g["profile"].isin(load.OPEN_LOOP)].sort_values("offered_rps")) for e, g in df.groupby("engine")]
        xcol = "offered_rps"
    else:
        work = df.get("workload", pd.Series([None] * len(df), index=df.index))
        df = df.assign(label=[f"{w or 'mixed'}:{p}" for w, p in zip(work, df["policy"])])
        groups, xcol = [("", df)], "label"
    for name, g in groups:
        for col, c in (("ttft_s_p50", 1), ("e2e_s_p50", 2)):
            fig.add_trace(go.Scatter(x=g[xcol], y=g[f"measured_{col}"], mode="markers", name=f"{name} measured".strip(),
                                     legendgroup=f"{name}m", showlegend=c == 1), row=1, col=c)
            fig.add_trace(go.Scatter(x=g[xcol], y=g[f"simulated_{col}"], mode="lines+markers",
                                     line=dict(dash="dash"), marker=dict(symbol="circle-open"),
                                     name=f"{name} simulated".strip(), legendgroup=f"{name}s", showlegend=c == 1),
                          row=1, col=c)
    fig.update_layout(title="The serving twin (source=simulated, a prediction) beside the measured points")
    if experiment == "serving_load":
        fig.update_xaxes(title_text="offered rate (req/s)")
    return fig


def notebook_section(run_dir, experiment: str):
    """What notebooks 08 and 11 show of the twin: :func:`validate` on the run (writing ``twin_validation.csv`` and
    ``metrics.json``), the figure ``twin_<experiment>`` saved, and :func:`sentence`. Without a calibration in the
    run (no batch-size / context-length rows, no ``twin_calibration.json``) it says why and shows nothing.

    Returns:
        ``(table, figure or None, sentence)``.
    """
    from workbench.run import results

    try:
        table, summ = validate(run_dir)
    except ParameterError as exc:
        return pd.DataFrame(), None, f"twin: not shown ({exc})"
    fig = figure(table, experiment)
    results.save_figure(run_dir, f"twin_{experiment}", fig)
    return table, fig, sentence(summ)


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
    measurement in the twin, and put both side by side with ``ape_*`` (``|simulated / measured - 1|``).

    Returns:
        One row per pick: ``engine``, ``rate_rps``, ``measured_*``, ``simulated_*``, ``ape_*`` of ``ttft_s_p50`` and
        ``e2e_s_p50``, ``source`` ``measured`` (the row is a measurement with its prediction beside it).
    """
    from workbench.serving.bench import Bench, run_sampled

    bench = Bench(cfg, loaded)
    rows = []
    try:
        for engine, rate in picks:
            bench.open(engine)
            res, _ = run_sampled(bench, cfg, cfg.arrival, rate)
            kept = res.kept()
            tc = twin.TwinConfig(engine=engine, max_batch_size=cfg.max_batch_size, batch_window_s=cfg.batch_window_s)
            specs = _specs_from_rows(kept.assign(max_new_tokens=cfg.max_new_tokens), {}, "serving_load")
            sim = twin.simulate(cost, specs, tc, "replay", rate=rate).summary
            row = {"engine": engine, "rate_rps": rate, "requests": int(len(kept)), "cost_source": cost.source,
                   "source": "measured"}
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
    """A JSONL trace for the twin: :func:`workbench.serving.load.read_trace`'s checked fields plus, where a line has
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


def _cost_from_args(args) -> twin_cost.StepCost:
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
    shape = roofline.ModelShape.from_config(json.loads(mc.read_text(encoding="utf-8")), args.dtype)
    model = mc.parent.name if mc.name == "config.json" and mc.parent.name else mc.stem
    return twin_cost.from_roofline(shape, dev, source=f"roofline:{dev.name}/{model}")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def command(args) -> int:
    """``workbench simulate`` (its arguments: :func:`workbench.cli.build_parser`). Every parameter is checked
    (one-line ParameterError) before any simulation runs."""
    if args.validate:
        cost = _cost_from_args(args) if (args.calibration or args.device_profile or args.run) else None
        df, summ = validate(args.validate, cost)
        print(sentence(summ))
        for k in ("knee_measured", "knee_simulated", "recommendation_measured", "recommendation_simulated"):
            if k in summ:
                print(f"  {k}: {summ[k]}")
        print(f"  written: {Path(args.validate) / twin.VALIDATION_FILE}, metrics.json")
        return 0
    engine_names = _csv(args.engines)
    checks.check_choice_list("engines", engine_names, engines.ENGINES)
    policies = _csv(args.policies)
    checks.check_choice_list("policies", policies, scheduling.POLICIES)
    checks.check_choice("arrival", args.arrival, ("constant", "poisson", "gamma"))
    rates = [float(x) for x in _csv(args.rates)] if args.rates else None
    if rates:
        checks.check_float_list("rates", rates, lo=0, lo_open=True)
    checks.check_int("requests", args.requests, lo=2)
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
    cost = _cost_from_args(args)
    print(f"PREDICTION (simulated, not measured): {cost.describe()}")
    t0 = time.perf_counter()
    pts, reqs = serving_points(cost, cfg, engine_names, args.requests, args.prompt_tokens, args.max_new_tokens,
                               rates, args.sweep_points, args.arrival, seed=args.seed, trace_rows=trace_rows)
    show = ["engine", "profile", "offered_rps", "request_throughput_rps", "ttft_s_p50", "ttft_s_p90", "e2e_s_p50",
            "queue_s_p50", "kept_up"]
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(pts[show].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        if len(policies) > 1 or policies[0] != "fcfs":
            nb = notebook11_defaults()  # the policies' options as notebook 11 runs them
            sc = dataclasses.replace(cfg, engine=args.scheduling_engine, aging_s=nb["aging_s"], long_cap=nb["long_cap"],
                                     lane_threshold_tokens=nb["lane_threshold_tokens"], replicas=1)
            sp, sr = scheduling_points(cost, sc, policies, args.requests, args.load_factor, args.seed)
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
        from workbench.experiments import serving_load

        picks = interesting(pts, args.confirm)
        cfg8 = serving_load.Config(model=args.model, engines=sorted({e for e, _ in picks}),
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

        run = results.open_run(args.out)
        results.write_table(run / "points.parquet", pts.assign(experiment="simulate", source=twin.SOURCE))
        results.write_table(run / "requests.parquet", reqs.assign(experiment="simulate", source=twin.SOURCE))
        twin_cost.save(run, cost)
        print(f"written: {run}")
    return 0
