"""The serving twin beside a run's measurements (issue 34): the twin's prediction of every measured serving and
scheduling point, its errors, and the words and figure the notebooks and the report show.

- :func:`cost_for`: a run's cost model: its ``twin_calibration.json``, else a fit on its own bare ``generate`` rows
  (outside the serving experiments, so the validation is out of sample), plus the served request's own terms from
  a valid one-at-a-time served point (:func:`calibration_points`, :func:`workbench.predict.twin_cost.with_serving`),
  else a fit on all its rows.
- :func:`validate`: for every measured serving and scheduling point of a run, the twin's prediction of the same
  requests (their scheduled times, sizes, classes, priorities; the point's engine, policy and limits) beside the
  measurement: ``twin_validation.csv`` (one row per point, ``measured_*``, ``simulated_*`` and ``ape_*`` columns:
  ``|simulated / measured - 1|``) and, merged into the run's ``metrics.json``, ``mape_e2e_p50``, ``mape_ttft_p50``
  (means over the points, as BLIS reports), their point counts, each point predicted at its own moment's speed (its
  speed probe, :meth:`workbench.predict.twin_cost.StepCost.at_speed`; ``speed_factor`` in the table, the errors at
  the calibration's speed throughout as ``mape_*_unscaled``), and the knee and recommendation per SLO preset
  measured vs simulated (:func:`workbench.load.saturation.knees` / ``recommend`` on both tables).
- :func:`sentence` (the validation in words), :func:`disagreement` (where the twin and one experiment's
  measurement are furthest apart: the report's serving findings carry it). The figure and the section notebooks 08
  and 11 show are :mod:`workbench.share.figures_twin`'s.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

from workbench.checks import float_or_nan
from workbench.errors import ParameterError
from workbench.load import load, saturation, senders
from workbench.predict import twin, twin_cost
from workbench.run import metrics_file
from workbench.serving import engines, scheduling

SERVING_EXPERIMENTS = ("serving_load", "scheduling")
#: a measured point's columns a simulated point never inherits (:func:`validate`): its SLO verdicts and keep-up figures
MEASURED_VERDICTS = ("slo_attainment", "goodput_rps", "percentiles_ok", "kept_up", "backlog_growth", "arrival_",
                     "completion_", "requests_in_window", "requests_planned", "window_s", "measure_")
#: the columns whose error :func:`validate` also gives without the per-point speed (``ape_<col>_unscaled``)
UNSCALED = ("ttft_s_p50", "e2e_s_p50")
COMPARED = ("ttft_s_p50", "ttft_s_p90", "tpot_s_p50", "e2e_s_p50", "e2e_s_p90", "queue_s_p50",
            "request_throughput_rps", "goodput_rps")


#: experiments whose requests went through ``workbench serve`` outside the serving sweeps: their rows carry the
#: served request's own costs, so the bare ``generate`` fit leaves them out (streaming anatomy's ``http`` sweep, the
#: streaming reader)
SERVED_EXPERIMENTS = ("http", "streaming_reader")


def calibration_points(points: pd.DataFrame) -> list[str]:
    """The points the served-request terms are fitted on (:func:`workbench.predict.twin_cost.with_serving`): one
    request at a time through ``workbench serve`` (no queue, no batch), valid and finished. Streaming anatomy's
    HTTP point at concurrency 1 alone when it was measured with a speed probe (its rows are brought to the
    calibration's speed: :func:`workbench.predict.twin_cost.with_serving`); else that point and the streaming
    reader's ``reader`` points (its streams read straight from the server) when the run has them, pooled over
    several moments of the run (the served terms are small, the difference of two measurements on a machine whose
    speed swings within minutes: one unprobed point measured in a slow stretch moved them; results/LOG.md,
    2026-12-05). Both are outside the serving experiments, so every serving and
    scheduling point stays out of sample; else the serving sweeps' ``synchronous`` points on a built-in engine; []
    when none is there (a point invalid for contention measured the machine: it calibrates nothing).

    Args:
        points: a run's ``points.parquet`` rows (``experiment``, ``point_id``, ``status``, ``valid``,
            ``concurrency``, ``profile``, ``engine``).
    """
    if points.empty or not {"experiment", "point_id"} <= set(points.columns):
        return []
    ok = points
    if "status" in ok:
        ok = ok[ok["status"].eq("ok")]
    if "valid" in ok:
        ok = ok[ok["valid"].fillna(True).astype(bool)]
    served = []
    if "concurrency" in ok:
        http = ok[(ok["experiment"] == "http") & (pd.to_numeric(ok["concurrency"], errors="coerce") == 1)]
        if "speed_probe_tpot_s" in http and (pd.to_numeric(http["speed_probe_tpot_s"], errors="coerce") > 0).any():
            # measured with a speed probe: its rows are brought to the calibration's speed (twin_cost.with_serving),
            # which the pooling over unprobed moments below stood in for
            return list(http["point_id"].astype(str))
        served += list(http["point_id"].astype(str))
    if "part" in ok:   # the streaming reader's own streams, read straight from the server (no proxy)
        reader = ok[(ok["experiment"] == "streaming_reader") & (ok["part"] == "reader")]
        served += list(reader["point_id"].astype(str))
    if served:
        return served
    if "profile" not in ok:
        return []
    sync = ok[(ok["experiment"] == "serving_load") & (ok["profile"] == "synchronous")]
    if "engine" in sync:
        sync = sync[sync["engine"].isin(engines.ENGINES)]
    return list(sync["point_id"].astype(str))


def usable_rows(requests: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """``requests`` of the usable points only (:func:`workbench.stats.evidence.usable_points`: finished and valid; a
    point the run marked invalid for drift or other load measured the machine's moment, not the model's cost);
    ``requests`` itself when either table lacks ``point_id`` (nothing to tell them apart by)."""
    from workbench.stats import evidence

    if points.empty or "point_id" not in points or "point_id" not in requests:
        return requests
    ok = evidence.usable_points(points)["point_id"].astype(str)
    return requests[requests["point_id"].astype(str).isin(set(ok))]


def cost_for(run_dir) -> twin_cost.StepCost:
    """A run's cost model (module docstring): its ``twin_calibration.json``; else a fit on its bare ``generate``
    rows (outside the serving experiments and :data:`SERVED_EXPERIMENTS`) of valid points (:func:`usable_rows`;
    all its bare rows, said in the source, when the valid ones are too few to fit) plus the served-request terms
    from :func:`calibration_points`; else a fit on all its rows.

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
        points = results.read_points(run) if (run / "points.parquet").is_file() else pd.DataFrame()
        req = twin_cost.with_speed(req, points)   # each row's speed probe, where its point measured one
        bare = req[~req["experiment"].isin(SERVING_EXPERIMENTS + SERVED_EXPERIMENTS)]
        try:
            cost = twin_cost.fit(usable_rows(bare, points), source=f"fit:{run.name} (non-serving rows, valid points)")
        except ParameterError:
            try:  # too few valid workloads: the invalid points' rows too, said in the source
                cost = twin_cost.fit(bare, source=f"fit:{run.name} (non-serving rows, invalid points included)")
            except ParameterError:
                return twin_cost.fit(req, source=f"fit:{run.name} {ALL_ROWS}")
        calib = calibration_points(points)
        return twin_cost.with_serving(cost, req, calib) if calib else cost
    return twin_cost.fit(req, source=f"fit:{run.name} {ALL_ROWS}")



def specs_from_rows(rows: pd.DataFrame, cfg: dict, experiment: str) -> list:
    """The twin's requests for a measured point's ``rows``: their scheduled offsets (from the first), prompt and
    output sizes, priorities and classes; for ``scheduling`` with ``abandon_share`` in its config ``cfg``, the same
    clients' patience (:func:`workbench.load.senders.with_patience`, seeded as the run was)."""
    rows = rows.sort_values("request_id") if "request_id" in rows else rows
    off = pd.to_numeric(rows.get("t_scheduled_s"), errors="coerce").fillna(0.0).clip(lower=0.0)
    t0 = float(off.min()) if len(off) else 0.0
    out_col = "max_tokens" if "max_tokens" in rows and rows["max_tokens"].notna().all() else "max_new_tokens"
    specs = []
    for (_, r), o in zip(rows.iterrows(), off):
        specs.append(twin.TwinSpec(float(o) - t0, int(float_or_nan(r.get("prompt_tokens")) or 1),
                                   int(float_or_nan(r.get(out_col)) or 1), int(float_or_nan(r.get("priority")) or 0)
                                   if float_or_nan(r.get("priority")) == float_or_nan(r.get("priority")) else 0,
                                   r.get("request_class")))
    if experiment == "scheduling" and float_or_nan(cfg.get("abandon_share")) > 0:  # the same clients lose patience
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


def _load_slos(cfg: dict) -> list:
    """The SLOs notebook 08 scored: every preset and, where the run recorded them (every run records its whole
    config), the ``custom`` limits of its ``slo_ttft_s`` / ``slo_tpot_s``."""
    from workbench.stats import slo

    custom = ([slo.get("custom", float(cfg["slo_ttft_s"]), float(cfg["slo_tpot_s"]))]
              if cfg.get("slo_ttft_s") and cfg.get("slo_tpot_s") else [])
    return list(slo.PRESETS.values()) + custom


def _with_custom(summary: dict) -> dict:
    """The custom SLO's columns under notebook 08's unsuffixed names too (``goodput_rps``, ``slo_attainment``,
    ``percentiles_ok``), as :func:`workbench.experiments.serving_load.point_columns` writes them."""
    return {**summary, **{k: summary[f"{k}_custom"] for k in ("goodput_rps", "slo_attainment", "percentiles_ok")
                          if f"{k}_custom" in summary}}


def _simulate_point(cost, point: pd.Series, rows: pd.DataFrame, cfg: dict) -> dict | None:
    """The twin's summary of one measured point (None: nothing of ours to simulate). A serving-load point gets the
    SLO presets' figures its measured row has; a scheduling point none (its measured row is judged by its request
    classes' SLOs, :func:`workbench.stats.classes.class_columns`: evaluating every preset on each simulated point
    was most of a validation's time, compared with nothing)."""
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
            return _with_custom(twin.simulate(cost, specs, tc, prof, slos=_load_slos(cfg)).summary)
        return _with_custom(twin.simulate(cost, specs_from_rows(rows, cfg, exp), tc, "replay", slos=_load_slos(cfg),
                                          rate=float_or_nan(point.get("offered_rps"))).summary)
    if exp == "scheduling":
        work = point.get("workload", "mixed")
        if work in ("multiturn", "shared_prefix"):
            on = bool(point.get("prefix_sharing"))
            engine = "continuous" if any(cfg.get("multiturn_prefix_sharing") or []) else cfg.get("engine", "fifo")
            tc = twin.TwinConfig(engine=engine, max_batch_size=int(cfg.get("max_batch_size", 4)),
                                 batch_window_s=float(cfg.get("batch_window_s", 0.05)), prefix_sharing=on)
            return twin.simulate(cost, _turn_specs(rows, cfg), tc, "replay", slos=()).summary
        tc = twin.TwinConfig(engine=cfg.get("engine", "fifo"), policy=point.get("policy", "fcfs"),
                             aging_s=float(cfg.get("aging_s", scheduling.AGING_S)),
                             lane_threshold_tokens=int(cfg.get("lane_threshold_tokens",
                                                               scheduling.LANE_THRESHOLD_TOKENS)),
                             long_cap=int(cfg.get("long_cap", 1)), predictor=cfg.get("sjf_predictor", "proxy"),
                             max_batch_size=int(cfg.get("max_batch_size", 4)),
                             batch_window_s=float(cfg.get("batch_window_s", 0.05)),
                             max_pending=cfg.get("max_pending"), max_retries=int(cfg.get("max_retries", 3)))
        res = twin.simulate(cost, specs_from_rows(rows, cfg, exp), tc, "replay", slos=())
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

    # written through the same checks as every other writer into a run (inside the results root, not the root, its
    # lock not held by another process), before anything is simulated
    run = results.writable_run(run_dir) if write else Path(run_dir)
    if not (run / "points.parquet").is_file():
        raise ParameterError(f"run: {str(run_dir)!r} has no points.parquet")
    points = results.read_points(run)
    points = points[points.get("experiment", pd.Series(dtype=str)).isin(SERVING_EXPERIMENTS)]
    points = saturation.sweep_points(points)   # notebook 08's engine comparison (issue 49) is not validated here
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
        cfg = configs.get(p["experiment"], {})
        at, factor = cost.at_speed(p.get("speed_probe_tpot_s"))   # the twin at this point's moment's speed
        sim = _simulate_point(at, p, rows, cfg)
        if sim is None:
            continue
        row = {"point_id": p["point_id"], "experiment": p["experiment"], "engine": p.get("engine"),
               "policy": p.get("policy"), "profile": p.get("profile"), "workload": p.get("workload"),
               "offered_rps": float_or_nan(p.get("offered_rps")), "requests": int(len(rows)), "valid": p.get("valid"),
               "cost_source": cost.source, "source": twin.SOURCE, "speed_factor": factor}
        # the same prediction at the calibration's speed: how much the speed probe moved the error
        flat = sim if factor == 1.0 else _simulate_point(cost, p, rows, cfg)
        for c in UNSCALED:
            m, s = float_or_nan(p.get(c)), float_or_nan(flat.get(c))
            row[f"ape_{c}_unscaled"] = abs(s / m - 1) if m == m and s == s and m > 0 else math.nan
        # the simulated point: the measured one's identity (engine, profile, rate, validity) with every figure the
        # twin gives; the measured SLO verdicts (attainment, its stored one-sided bounds, goodput, percentile
        # checks) and keep-up figures are dropped, never carried over where the twin gives none (the simulated
        # recommendation read the measured attainment bounds through them)
        own = {k: v for k, v in p.to_dict().items() if not str(k).startswith(MEASURED_VERDICTS)}
        simulated = {**own, **sim, "source": twin.SOURCE}
        if p.get("profile") in load.OPEN_LOOP:   # each side's keep-up verdict (the knee and the recommendations use them)
            row["measured_kept_up"] = saturation.kept_up(p)
            row["simulated_kept_up"] = saturation.kept_up(simulated)
        per_class = ("ttft_s_p50_", "ttft_s_p90_", "slo_attainment_")
        cols = list(COMPARED) + sorted(c for c in sim if c.startswith(per_class))
        for c in cols:
            m, s = float_or_nan(p.get(c)), float_or_nan(sim.get(c))
            row[f"measured_{c}"], row[f"simulated_{c}"] = m, s
            row[f"ape_{c}"] = abs(s / m - 1) if m == m and s == s and m > 0 else math.nan
        table.append(row)
        sim_points.append(simulated)
    df = pd.DataFrame(table)
    # errors over valid points only: an invalid point (contended, drifted) measured the machine, not the engine; its
    # row stays in the table with valid=False
    valid = df["valid"].fillna(False).astype(bool) if "valid" in df else pd.Series(True, index=df.index)
    # a point the served-request terms were fitted on is in-sample: in the table (calibration=True), not in the errors
    calib = set(cost.serving_points)
    df["calibration"] = df["point_id"].astype(str).isin(calib) if len(df) else pd.Series(dtype=bool)
    # the all-rows fallback fitted the cost model on every row, the scored serving points' rows included: every
    # point is in-sample, flagged, and none enters the errors (an in-sample MAPE is no test of the twin)
    in_sample_fit = ALL_ROWS in str(cost.source)
    if in_sample_fit and len(df):
        df["calibration"] = True
    in_sample = df["calibration"].astype(bool) if len(df) else pd.Series(dtype=bool)
    # the A/A arm replays its baseline's workload: its points are duplicates of the baseline's, in the table but
    # not counted a second time in the errors
    df["aa_duplicate"] = df["policy"].map(is_aa_arm) if len(df) else pd.Series(dtype=bool)
    valid_all = valid
    valid = valid & ~in_sample & ~df["aa_duplicate"].astype(bool)
    summary = {"twin_points": int(valid.sum()), "twin_points_invalid": int((~valid_all).sum()),
               "twin_points_calibration": int((in_sample & valid_all).sum()), "twin_cost_source": cost.source,
               "twin_in_sample_fit": bool(in_sample_fit),
               "twin_points_aa_duplicate": int((df["aa_duplicate"].astype(bool) & valid_all & ~in_sample).sum())
               if len(df) else 0,
               "twin_cost_loo_step_error": cost.loo_step_error, "twin_cost_loo_prefill_error": cost.loo_prefill_error}
    for key, col in (("mape_e2e_p50", "ape_e2e_s_p50"), ("mape_ttft_p50", "ape_ttft_s_p50"),
                     ("mape_e2e_p90", "ape_e2e_s_p90"), ("mape_ttft_p90", "ape_ttft_s_p90"),
                     ("mape_tpot_p50", "ape_tpot_s_p50"), ("mape_queue_p50", "ape_queue_s_p50")):
        v = pd.to_numeric(df[valid].get(col, pd.Series(dtype=float)), errors="coerce").dropna()
        summary[key], summary[f"{key}_points"] = (float(v.mean()) if len(v) else math.nan), int(len(v))
    for c in UNSCALED:   # the errors without the per-point speed (the calibration's speed throughout)
        v = pd.to_numeric(df[valid].get(f"ape_{c}_unscaled", pd.Series(dtype=float)), errors="coerce").dropna()
        summary[f"mape_{c.replace('_s_', '_')}_unscaled"] = float(v.mean()) if len(v) else math.nan
    summary["mape_by_experiment"] = by_experiment(df[valid])
    factors = pd.to_numeric(df[valid].get("speed_factor", pd.Series(dtype=float)), errors="coerce")
    summary["twin_speed_factor_min"] = float(factors.min()) if factors.notna().any() else math.nan
    summary["twin_speed_factor_max"] = float(factors.max()) if factors.notna().any() else math.nan
    measured_sl = points[points["experiment"] == "serving_load"]
    simulated_sl = pd.DataFrame([p for p in sim_points if p.get("experiment") == "serving_load"])
    if not measured_sl.empty and not simulated_sl.empty:
        summary["knee_measured"] = {k: float_or_nan(v) for k, v in saturation.knees(measured_sl).items()}
        summary["knee_simulated"] = {k: float_or_nan(v) for k, v in saturation.knees(simulated_sl).items()}
        summary["knee_error"] = {k: abs(summary["knee_simulated"].get(k, math.nan) / v - 1) if v == v and v > 0
                                 else math.nan for k, v in summary["knee_measured"].items()}
        summary["knee_search"] = knee_search(cost, measured_sl, configs.get("serving_load", {}))
        rm, rs = saturation.recommend(measured_sl), saturation.recommend(simulated_sl)
        if not rm.empty and not rs.empty:
            # the presets the measurement scored: a column with an attainment on some serving point (the run's points
            # table also holds scheduling's per-class columns, empty on these rows)
            scored = [k for k in rm["slo"] if pd.to_numeric(measured_sl.get(f"slo_attainment_{k}"),
                                                            errors="coerce").notna().any()]
            rm = rm[rm["slo"].isin(scored)]
            summary["recommendation_measured"] = dict(zip(rm["slo"], rm["max_rate_rps"].map(float)))
            # the presets the measurement scored (notebook 08's slo_presets): the twin scores every preset
            summary["recommendation_simulated"] = {k: float(v) for k, v in zip(rs["slo"], rs["max_rate_rps"])
                                                   if k in summary["recommendation_measured"]}
            summary.update(decided_presets(rm, rs))
    if write:
        path = run / twin.VALIDATION_FILE
        from workbench.run import results as res_mod

        text = df.to_csv(index=False)
        res_mod.atomic_write(path, lambda f: f.write(text), text=True)
        metrics_file.merge_metrics(run, summary)
    return df, summary


#: The cost source of :func:`cost_for`'s last fallback: a fit on every row of the run, the serving points' included.
ALL_ROWS = "(all rows)"


def is_aa_arm(policy) -> bool:
    """Whether a point's policy is an A/A control arm (the baseline measured again: scheduling's ``fcfs_aa``)."""
    return isinstance(policy, str) and policy.endswith("_aa")


def by_experiment(table: pd.DataFrame) -> dict:
    """The errors per experiment over the points counted (valid, out of sample, no A/A duplicate): ``n``, and per
    error its mean, median, min and max (the spread), the prediction (``unscaled``: the calibration's speed
    throughout) first.

    Returns:
        ``{experiment: {"n", "e2e_p50_unscaled": {"mean", "median", "min", "max"}, ...}}``.
    """
    out = {}
    if table is None or table.empty or "experiment" not in table:
        return out
    for exp, g in table.groupby("experiment"):
        entry = {"n": int(len(g))}
        for key, col in (("e2e_p50_unscaled", "ape_e2e_s_p50_unscaled"), ("ttft_p50_unscaled", "ape_ttft_s_p50_unscaled"),
                         ("e2e_p50", "ape_e2e_s_p50"), ("ttft_p50", "ape_ttft_s_p50")):
            v = pd.to_numeric(g.get(col, pd.Series(dtype=float)), errors="coerce").dropna()
            entry[key] = ({"mean": float(v.mean()), "median": float(v.median()), "min": float(v.min()),
                           "max": float(v.max()), "n": int(len(v))} if len(v) else None)
        out[str(exp)] = entry
    return out


def decided_presets(measured: pd.DataFrame, simulated: pd.DataFrame) -> dict:
    """Recommendation agreement counted only over the presets decided on at least one side (met at some rate, or
    missed at every usable rate); a preset undetermined on both sides (the MLPerf presets at p99 below 100
    requests) agrees by construction and is not counted.

    Returns:
        ``recommendation_decided`` (the presets), ``recommendation_decided_count``, ``recommendation_agree``
        (those with the same rate on both sides) and ``recommendation_undetermined_both``.
    """
    def decided(df):
        return {str(r["slo"]): not str(r.get("verdict", "")).startswith(("undetermined", "no usable"))
                for _, r in df.iterrows()}

    dm, ds = decided(measured), decided(simulated)
    rate_m = dict(zip(measured["slo"].astype(str), measured["max_rate_rps"].map(float)))
    rate_s = dict(zip(simulated["slo"].astype(str), simulated["max_rate_rps"].map(float)))
    names = [n for n in rate_m if dm.get(n) or ds.get(n)]
    agree = [n for n in names if n in rate_s and abs(rate_m[n] - rate_s[n]) <= 1e-9 * max(1.0, abs(rate_m[n]))]
    return {"recommendation_decided": names, "recommendation_decided_count": len(names),
            "recommendation_agree": len(agree),
            "recommendation_undetermined_both": [n for n in rate_m if n not in names]}


def knee_search(cost, measured: pd.DataFrame, cfg: dict, steps: int = 8, requests: int = 40) -> dict:
    """A knee test that could fail: per engine, the twin searches its own highest sustainable rate with arrivals of
    its own (Poisson at each trial rate, not the measured arrival times), bisecting between a rate it keeps up with
    and one it does not (:func:`workbench.load.saturation.kept_up`, the one definition), and that rate is checked
    against the measured bracket: the highest open-loop rate measured as kept up and the lowest measured as fallen
    behind (either may be missing: the bracket is then open on that side).

    Returns:
        ``{engine: {"twin_rps", "bracket": [low, high], "inside": bool | None, "distance": float | None}}``;
        ``distance`` is the relative distance to the nearest bound when outside (0 inside; None when the
        measurement brackets nothing).
    """
    out = {}
    if measured.empty or "engine" not in measured:
        return out
    prompt, max_tokens = int(cfg.get("prompt_tokens", 64)), int(cfg.get("max_new_tokens", 16))
    for eng, g in measured.groupby("engine"):
        if eng not in engines.ENGINES:
            continue
        tc = twin.TwinConfig(engine=eng, max_batch_size=int(cfg.get("max_batch_size", 8)),
                             batch_window_s=float(cfg.get("batch_window_s", 0.05)))
        kept, fell = [], []
        for _, p in g.iterrows():
            verdict = saturation.kept_up(p)
            rate = float_or_nan(p.get("offered_rps"))
            if rate == rate and verdict == saturation.KEPT_UP:
                kept.append(rate)
            elif rate == rate and verdict == saturation.FELL_BEHIND:
                fell.append(rate)
        low, high = (max(kept) if kept else None), (min(fell) if fell else None)

        def sustains(rate: float) -> bool:
            specs = twin.open_loop("poisson", requests, rate, prompt, max_tokens, seed=1)
            res = twin.simulate(cost, specs, tc, "poisson", rate=rate).summary
            return saturation.kept_up(res) == saturation.KEPT_UP

        service = cost.service_s(prompt, max_tokens)
        lo, hi = 0.05 / service, 4.0 * max(tc.max_batch_size, 1) / service
        if not sustains(lo):
            rate = 0.0
        else:
            while sustains(hi) and hi < 1e6:
                lo, hi = hi, hi * 4
            for _ in range(steps):
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if sustains(mid) else (lo, mid)
            rate = lo
        inside = None if low is None and high is None else (
            (low is None or rate >= low) and (high is None or rate <= high))
        dist = None if inside is None else 0.0 if inside else (
            rate / high - 1 if high is not None and rate > high else rate / low - 1)
        out[str(eng)] = {"twin_rps": float(rate), "bracket": [low, high], "inside": inside, "distance": dist}
    return out


def sentence(summary: dict) -> str:
    """The validation in words: the errors with their point counts (as BLIS reports them) and, where the twin
    misses, the cost-model term that carries the error (TTFT: the prefill term; TPOT: the decode step term; queue
    time: the scheduling, which the twin runs as the real code, so its error follows the service times)."""
    n = summary.get("twin_points", 0)
    if summary.get("twin_in_sample_fit"):
        return ("twin: no out-of-sample point: the run had too few non-serving rows, so the cost model was fitted on "
                "every row, the serving points' included (in-sample, flagged in twin_validation.csv); no error is "
                "reported.")
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
    aa = summary.get("twin_points_aa_duplicate") or 0
    if aa:
        out += [f"{aa} A/A duplicate{'s' if aa > 1 else ''}"]
        gone = f" ({', '.join(out)} left out)"
    text = (f"Twin vs measurement over {n} valid points{gone} (out of sample; cost model "
            f"{summary.get('twin_cost_source')}): prediction error (the calibration's speed throughout) MAPE e2e p50 "
            f"{pct('mape_e2e_p50_unscaled')}, TTFT p50 {pct('mape_ttft_p50_unscaled')}; given each moment's speed "
            f"(its speed probe): e2e p50 {pct('mape_e2e_p50')} ({summary.get('mape_e2e_p50_points', 0)} points), "
            f"TTFT p50 {pct('mape_ttft_p50')} ({summary.get('mape_ttft_p50_points', 0)}), TPOT p50 "
            f"{pct('mape_tpot_p50')}, queue p50 {pct('mape_queue_p50')}.")
    per = summary.get("mape_by_experiment") or {}
    if per:
        def spread(e):
            v = per[e].get("e2e_p50_unscaled")
            return (f"{e}: {v['mean']:.0%} over {per[e]['n']} points ({v['min']:.0%}-{v['max']:.0%})" if v
                    else f"{e}: n/a ({per[e]['n']} points)")
        text += " Per experiment (e2e p50, prediction): " + "; ".join(spread(e) for e in sorted(per)) + "."
    worst = max((("prefill term (a0-a2: TTFT)", summary.get("mape_ttft_p50")),
                 ("decode step term (b0-b3: TPOT)", summary.get("mape_tpot_p50"))),
                key=lambda t: -1 if t[1] is None or t[1] != t[1] else t[1])
    if worst[1] is not None and worst[1] == worst[1] and worst[1] > 0.1:
        text += f" The larger miss is the {worst[0]}."
    lo, hi = summary.get("twin_speed_factor_min"), summary.get("twin_speed_factor_max")
    if lo is not None and hi is not None and lo == lo and hi == hi and (lo != 1.0 or hi != 1.0):
        text += (f" Each point predicted at its own moment's speed (speed probe {lo:.2f}x-{hi:.2f}x the "
                 f"calibration's); at the calibration's speed throughout: e2e p50 {pct('mape_e2e_p50_unscaled')}, "
                 f"TTFT p50 {pct('mape_ttft_p50_unscaled')}.")
    km, ks = summary.get("knee_measured"), summary.get("knee_simulated")
    if km and ks:
        def knee(e):
            m, k = km[e], ks.get(e, math.nan)
            if m != m and k != k:
                return f"{e} none / none (no rate kept up on either side: the sweep does not bracket it)"
            err = (summary.get("knee_error") or {}).get(e, math.nan)
            return f"{e} {m:.3g} / {k:.3g} req/s" + (f" ({err:.0%} apart)" if err == err else "")

        text += " Knee measured / simulated: " + ", ".join(knee(e) for e in km) + "."
    search = summary.get("knee_search") or {}
    if search:
        def found(e, k):
            lo, hi = k["bracket"]
            br = f"[{'-' if lo is None else f'{lo:.3g}'}, {'-' if hi is None else f'{hi:.3g}'}] req/s"
            where = ("the measurement brackets nothing" if k["inside"] is None else "inside" if k["inside"]
                     else f"outside, {k['distance']:+.0%} from the nearest bound")
            return f"{e} {k['twin_rps']:.3g} req/s vs measured bracket {br}: {where}"

        text += (" The twin's own highest sustainable rate (its own Poisson arrivals): "
                 + "; ".join(found(e, k) for e, k in search.items()) + ".")
    if "recommendation_decided_count" in summary:
        text += (f" Recommendations: {summary['recommendation_agree']} of {summary['recommendation_decided_count']} "
                 "presets decided on at least one side agree"
                 + (f" ({len(summary['recommendation_undetermined_both'])} undetermined on both sides, not counted)"
                    if summary.get("recommendation_undetermined_both") else "") + ".")
    return text


def _short(point_id: str) -> str:
    """A point id without its experiment and ``prefix_sharing=False`` (for a sentence); ``step=`` stays (two open-loop
    rates of one engine differ only by it)."""
    body = str(point_id).split("/", 1)[-1]
    keep = [kv for kv in body.split(",") if not kv.startswith("prefix_sharing=False")]   # step= tells rates apart
    return ",".join(keep) or body


def disagreement(table: pd.DataFrame, experiment: str, k: int = 2) -> str:
    """Where the twin and ``experiment``'s measurement disagree (what the report's serving findings carry): the mean
    e2e p50 error over the experiment's valid, out-of-sample points and the ``k`` points furthest apart, each with
    both e2e p50 values; "" when no such point.

    Args:
        table: :func:`validate`'s table (``experiment``, ``point_id``, ``valid``, ``calibration``,
            ``measured_e2e_s_p50``, ``simulated_e2e_s_p50``, ``ape_e2e_s_p50``).
        experiment: ``serving_load`` or ``scheduling``.
    """
    if table is None or table.empty or "ape_e2e_s_p50" not in table:
        return ""
    df = table[(table["experiment"] == experiment) & table["valid"].fillna(False).astype(bool)
               & ~table.get("calibration", pd.Series(False, index=table.index)).fillna(False).astype(bool)]
    df = df[pd.to_numeric(df["ape_e2e_s_p50"], errors="coerce").notna()]
    if df.empty:
        return ""
    worst = df.sort_values("ape_e2e_s_p50", ascending=False).head(k)
    far = "; ".join(f"{_short(r.point_id)}: {r.measured_e2e_s_p50:.2f} s measured, {r.simulated_e2e_s_p50:.2f} s "
                    f"simulated ({r.simulated_e2e_s_p50 / r.measured_e2e_s_p50 - 1:+.0%})"
                    for r in worst.itertuples())
    return (f"The twin (a prediction from this run's calibration) is {df['ape_e2e_s_p50'].mean():.0%} off the measured "
            f"e2e p50 on average over {len(df)} valid point{'s' if len(df) > 1 else ''}; furthest apart at {far}.")
