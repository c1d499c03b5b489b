"""The roofline put to use: plan a suite before running it, predict every point beside its measurement, and
the residuals ``measured / predicted``.

- :func:`plan_entries` / :func:`format_plan`: a suite's points with their predicted TTFT, TPOT and wall time,
  nothing measured (``workbench plan``).
- :func:`calibrated_predictor`, :func:`with_predictions`, :func:`save_residuals`: an experiment predicts its
  points before its sweep and records measured / predicted after it (``residuals/<experiment>.txt``, the report's
  residual table).
- :func:`predict_rows` / :func:`add_predicted_line`: figure functions draw the prediction beside the measurement
  from the cached calibration alone (nothing loaded or probed).

The model and its formulas are :mod:`workbench.predict.roofline`'s, its calibration
:mod:`workbench.predict.roofline_calibration`'s; this module only applies them, and calls the calibration's functions
through its module (``roofline_calibration.checked_cached``), so one stand-in there reaches both.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.predict import roofline_calibration
from workbench.predict.roofline import Calibration, Device, ModelShape
from workbench.predict.roofline_calibration import Predictor

_BATCH_KEYS = ("batch_size", "batch_sizes", "max_batch_size")
_PROMPT_KEYS = ("prompt_tokens", "context_tokens", "context_lengths", "chat_lengths")
_OUTPUT_KEYS = ("max_new_tokens", "output_tokens", "budget_tokens", "answer_tokens", "http_tokens")


def _first(point: dict, cfg, keys, default):
    for k in keys:
        v = point.get(k, getattr(cfg, k, None))
        if isinstance(v, (list, tuple)):
            v = max(v) if v else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return default


def workload_of(cfg, point: dict) -> dict:
    """``{batch_size, prompt_tokens, output_tokens}`` of a point, from its keys or the config's fields (the
    largest value of a list); ``exact`` is False when a default had to stand in."""
    B = _first(point, cfg, _BATCH_KEYS, None)
    L = _first(point, cfg, _PROMPT_KEYS, None)
    n = _first(point, cfg, _OUTPUT_KEYS, None)
    exact = None not in (B, L, n)
    if "reasoning_budget" in point and n is not None:
        n += checks.int_or(point["reasoning_budget"], 0)
    return {"batch_size": B or 1, "prompt_tokens": L or 128, "output_tokens": n or 32, "exact": exact}


def plan_entries(entries: list[dict], predictor: Predictor | None = None, load_s: float = 2.0) -> pd.DataFrame:
    """The points of suite entries with their predictions and estimated wall time; nothing is measured.

    Args:
        entries: ``[{"notebook": path, "parameters": dict}]`` (:func:`workbench.run.notebooks.load_suite`).
        predictor: default :meth:`Predictor.for_model` of the first entry's model on its device.
        load_s: seconds charged per notebook for kernel start and model load.

    Returns:
        One row per point: ``notebook``, ``point_id``, the workload, the :func:`predict` columns and
        ``estimated_wall_s`` (``(warmup + repeats) x e2e`` of the point, plus the compile time of compiled
        points is not known in advance and is not included).
    """
    from workbench.measure import models
    from workbench.run import notebooks
    from workbench.run.point_result import point_id

    rows = []
    for e in entries:
        merged = notebooks.validate_parameters(e["notebook"], e.get("parameters", {}))
        cls = notebooks.notebook_config_class(e["notebook"])
        name = Path(e["notebook"]).stem
        if cls is None:
            rows.append({"notebook": name, "point_id": f"{name}/(no config)", "estimated_wall_s": load_s})
            continue
        cfg = cls.from_namespace(merged)
        if predictor is None:
            dev = models.pick_device(getattr(cfg, "device", "auto"))
            predictor = Predictor.for_model(getattr(cfg, "model", "default"), dev, getattr(cfg, "dtype", "auto"))
        exp = getattr(sys.modules[cls.__module__], "EXPERIMENT", name)
        # every sweep the notebook runs: a config with several (streaming anatomy, compression's chat) lists them
        pairs = (cfg.plan_points() if hasattr(cfg, "plan_points")
                 else [(exp, p) for p in (cfg.grid() if hasattr(cfg, "grid") else [{}])])
        runs = int(getattr(cfg, "warmup", 0) or 0) + int(getattr(cfg, "repeats", 1) or 1)
        for i, (exp, p) in enumerate(pairs):
            w = workload_of(cfg, p)
            pr = predictor.predict(w["batch_size"], w["prompt_tokens"], w["output_tokens"],
                                   dtype=p.get("dtype"), threads=p.get("torch_threads"))
            rows.append({"notebook": name, "point_id": point_id(exp, p) if p else f"{exp}/(single)",
                         **{k: w[k] for k in ("batch_size", "prompt_tokens", "output_tokens")},
                         "workload_exact": w["exact"], **pr,
                         "estimated_wall_s": runs * pr["predicted_e2e_s"] + (load_s if i == 0 else 0.0)})
    return pd.DataFrame(rows)


def format_plan(plan: pd.DataFrame, calibrated: bool) -> str:
    """A text table of :func:`plan_entries` and the total estimated wall time."""
    if plan.empty:
        return "no points"
    cols = ["point_id", "batch_size", "prompt_tokens", "output_tokens", "predicted_ttft_s", "predicted_tpot_s",
            "predicted_output_throughput_tps", "bound", "estimated_wall_s"]
    cols = [c for c in cols if c in plan]
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.max_colwidth", 70):
        text = plan[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}")
    total = float(plan["estimated_wall_s"].sum())
    note = ("calibrated on this machine" if calibrated else
            "UNCALIBRATED pure roofline (run `workbench plan --calibrate` once to fit this machine's overheads)")
    return (f"{text}\n\n{len(plan)} points; estimated wall time {total:.0f} s ({total / 60:.1f} min) "
            f"before reports; predictions {note}")


def design_lines(entries: list[dict], plan: pd.DataFrame | None = None, suite: str = "") -> list[str]:
    """Per notebook measured as a design (its Config's :meth:`workbench.run.design.DesignFields.planned_design`):
    the smallest effect its last look can decide and the time its rounds take
    (:func:`workbench.run.design.plan_text`), from the spread the experiment's last run on this machine measured.
    ``plan``: :func:`plan_entries`' table, whose predicted e2e per point prices a measurement where no run of
    ``suite`` has (a run of another suite measured the spread, not these parameters' seconds)."""
    from workbench.run import design, notebooks

    out = []
    for e in entries:
        cls = notebooks.notebook_config_class(e["notebook"])
        if cls is None or not issubclass(cls, design.DesignFields):
            continue
        cfg = cls.from_namespace(notebooks.validate_parameters(e["notebook"], e.get("parameters", {})))
        planned = cfg.planned_design()   # (its experiment, arms, first look, max rounds) or None: no design
        if planned is None:
            continue
        exp, arms, first, most = planned
        name = Path(e["notebook"]).stem
        per = None
        if plan is not None and "predicted_e2e_s" in plan:
            mine = plan[plan["notebook"] == name]["predicted_e2e_s"].dropna()
            per = float(mine.mean()) if len(mine) else None
        out.append(design.plan_text(exp or name, arms, first, most, seconds_per_measurement=per, suite=suite))
    return out


def calibrated_predictor(loaded) -> Predictor:
    """The :class:`Predictor` for ``loaded``'s model on this machine: the cached calibration, else a fresh
    :func:`calibrate` (once per machine, model, dtype and thread count; cached). Experiments call it
    before their sweep, so every point's prediction exists before the point is measured."""
    info = loaded.info
    cached = roofline_calibration.checked_cached(info.path, info.device.split(":")[0], info.dtype,
                                                 roofline_calibration.torch_threads(), loaded)
    return Predictor(roofline_calibration.shape_of(info), *(cached or roofline_calibration.calibrate(loaded)),
                     model_path=info.path)


def with_predictions(points: pd.DataFrame, info, predictor: Predictor | None = None) -> pd.DataFrame:
    """``points`` plus the prediction columns and the residual ratios ``ttft_ratio`` / ``tpot_ratio``
    (measured p50 / predicted) for every ``ok`` point with a batch size and prompt length."""
    if predictor is None:
        dev = info.device.split(":")[0]
        cached = roofline_calibration.checked_cached(info.path, dev, info.dtype, roofline_calibration.torch_threads())
        cached = cached or (Device.probe(dev, info.dtype), Calibration())
        predictor = Predictor(roofline_calibration.shape_of(info), *cached, model_path=info.path)
    out = points.copy()
    preds = []
    for _, r in out.iterrows():
        B = r.get("batch_size")
        L = r.get("prompt_tokens")
        if L is None or (isinstance(L, float) and math.isnan(L)):
            L = r.get("context_tokens")
        n = r.get("max_new_tokens", None)
        if n is None or (isinstance(n, float) and math.isnan(n)):
            n = r["output_tokens"] / max(r.get("requests", 1) or 1, 1) if "output_tokens" in r else 8
        failed = str(r.get("status", "ok")) != "ok"
        if failed or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in (B, L, n)):
            preds.append({})   # a failed point, or one without a batch, prompt or output length: no prediction
            continue
        preds.append(predictor.predict(int(B), int(L), int(n), threads=r.get("torch_threads")))
    pred = pd.DataFrame(preds, index=out.index)
    for c in pred:
        out[c] = pred[c]
    if "predicted_ttft_s" in out and "ttft_s_p50" in out:
        out["ttft_ratio"] = out["ttft_s_p50"] / out["predicted_ttft_s"]
    if "predicted_tpot_s" in out and "tpot_s_p50" in out:
        out["tpot_ratio"] = out["tpot_s_p50"] / out["predicted_tpot_s"]
    return out


def _model_path(model: str) -> str | None:
    """The folder of a model spec, or of a model recorded by its display name (rows record ``info.name``,
    e.g. ``SmolLM2-135M-Instruct``: the embedded default is recognised by it); None when unknown."""
    from workbench.measure import models

    for spec in (model, "default"):
        try:
            path = models.resolve_model_path(spec)
        except (OSError, ParameterError):
            continue
        if spec == model or Path(path).name.split("-")[:-1] == str(model).split("-"):
            return str(path)
    return None


def cached_predictor(model: str, device: str, dtype: str) -> Predictor | None:
    """Config-only :class:`Predictor` on this machine's cached calibration of (model, device, dtype), or None
    when there is none (figures then show no prediction rather than an uncalibrated one)."""

    path = _model_path(model)
    if path is None:
        return None
    dev = str(device).split(":")[0]
    cached = roofline_calibration.load_cached(path, dev, dtype, roofline_calibration.torch_threads())
    if cached is None:
        return None
    return Predictor(ModelShape.from_model(path, dtype), *cached, probe=False, model_path=path)


def predict_rows(df: pd.DataFrame, output_tokens: str | None = None) -> pd.DataFrame:
    """``df`` (points or requests) plus ``predicted_ttft_s``, ``predicted_tpot_s``, ``predicted_e2e_s`` and
    ``predicted_output_throughput_tps`` per row, from its recorded ``model_path`` (else ``model``) / ``device`` /
    ``dtype``,
    ``batch_size`` (1 when absent), ``prompt_tokens`` and output length (``output_tokens``: the named column,
    else ``output_tokens_mean``, else ``output_tokens / requests`` of a point, else a request's
    ``output_tokens``). Rows without a cached calibration (:func:`cached_predictor`), a prompt length or an
    output length get NaN; nothing is loaded or probed, so figure functions may call it."""
    cols = ("predicted_ttft_s", "predicted_tpot_s", "predicted_e2e_s", "predicted_output_throughput_tps")
    out = df.copy()
    for c in cols:
        out[c] = float("nan")
    if out.empty or not {"model", "device", "dtype", "prompt_tokens"} <= set(out.columns):
        return out
    if output_tokens is None:
        output_tokens = "output_tokens_mean" if "output_tokens_mean" in out else "output_tokens"
    if output_tokens not in out:
        return out
    n = out[output_tokens].astype(float)
    if output_tokens == "output_tokens" and "requests" in out:
        n = n / out["requests"].astype(float).clip(lower=1)
    predictors: dict = {}
    for i, r in out.iterrows():
        path = r.get("model_path")  # runs before 2026-12 record only the display name
        key = (path if isinstance(path, str) and path else r["model"], r["device"], r["dtype"])
        if key not in predictors:
            predictors[key] = cached_predictor(*key)
        B = r.get("batch_size", 1)
        B = 1 if B is None or pd.isna(B) else B
        L, k = r["prompt_tokens"], n.loc[i]
        if predictors[key] is None or pd.isna(L) or pd.isna(k) or k < 1:
            continue
        p = predictors[key].predict(int(B), int(L), int(round(k)), threads=r.get("torch_threads"))
        for c in cols:
            out.at[i, c] = p[c]
    return out


def residual_table(points: pd.DataFrame) -> pd.DataFrame:
    """Measured / predicted per point (``point_id``, measured and predicted TTFT/TPOT, ratios, bound)."""
    cols = ["point_id", "ttft_s_p50", "predicted_ttft_s", "ttft_ratio", "tpot_s_p50", "predicted_tpot_s",
            "tpot_ratio", "bound", "prefill_bound", "decode_bound"]
    return points[[c for c in cols if c in points]].copy()


def residual_summary(table: pd.DataFrame, limit: float = 0.30) -> str:
    """Median ``|measured / predicted - 1|`` for TTFT and TPOT, and the points outside ``limit`` with their bound."""
    parts = []
    for q in ("ttft", "tpot"):
        col = f"{q}_ratio"
        if col not in table:
            continue
        dev = (table[col] - 1).abs().dropna()
        if dev.empty:
            continue
        parts.append(f"{q.upper()} median |measured/predicted - 1| = {dev.median():.1%}")
        out = table[(table[col] - 1).abs() > limit]
        phase = "prefill_bound" if q == "ttft" else "decode_bound"
        for _, r in out.iterrows():
            bound = r.get(phase) if isinstance(r.get(phase), str) else r.get("bound", "?")
            parts.append(f"  {q.upper()} outside {limit:.0%}: {r['point_id']} ratio {r[col]:.2f} "
                         f"(model says {'prefill' if q == 'ttft' else 'decode'} is {bound}-bound)")
    return "\n".join(parts) if parts else "no point to compare"


def save_residuals(run_dir, experiment: str, points: pd.DataFrame) -> Path:
    """Write the residual table and its summary as ``residuals/<experiment>.txt`` in the run folder, and the
    table as ``residuals/<experiment>.csv`` (the report's residual table)."""
    from workbench.run import results

    table = residual_table(points)
    text = table.to_string(index=False, float_format=lambda v: f"{v:.4g}") + "\n\n" + residual_summary(table) + "\n"
    path = results.save_text(run_dir, f"residuals/{experiment}.txt", text)
    table.to_csv(path.with_suffix(".csv"), index=False)
    return path


def add_predicted_line(fig, points: pd.DataFrame, x: str, y: str, group: str | None = None, name: str = "predicted"):
    """Add dotted predicted lines (column ``y``, e.g. ``predicted_ttft_s``) versus ``x`` to a plotly figure,
    one per ``group`` value; a no-op when the column is absent."""
    import plotly.graph_objects as go

    if y not in points or x not in points or points[y].isna().all():
        return fig
    groups = points.groupby(group) if group and group in points else [(None, points)]
    for key, g in groups:
        g = g.sort_values(x)
        fig.add_trace(go.Scatter(x=g[x], y=g[y], mode="lines", line=dict(dash="dot", color="#555"),
                                 name=f"{name}" + (f", {key}" if key is not None else "")))
    return fig
