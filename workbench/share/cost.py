"""Cost per million tokens and interactivity: what a deployment review asks of every point.

Columns (:func:`add_columns`, names in ``workbench/stats/columns.csv``):

- ``usd_per_mtok_output`` = ``price_per_hour_usd * n_devices / 3600 / output_throughput_tps * 1e6`` and
  ``usd_per_mtok_input`` = the same over ``input_throughput_tps``: each charges every device-hour the point's
  throughput used to that kind of token (the usual "cost per million tokens at this throughput", e.g. the price
  tables of hosted endpoints; the two are not a split of one bill, so they are never added). ``n_devices`` is the
  point's devices or replicas (:func:`devices`: ``n_devices``, else the serving twin's ``replicas``, else 1), so
  8 replicas at 8x one replica's throughput cost what one replica costs per token.
- ``output_tps_per_user``: what one user sees, the point's median per-request decode speed
  (``decode_tps_p50``), else ``1 / tpot_s_p50``.
- ``output_tps_per_device``: ``output_throughput_tps / n_devices`` (one device unless the point says more).
- ``n_devices`` is written on every point of a table where any point spans more than one device or replica.

The interactivity Pareto figure (:func:`pareto_figure`) plots tokens/s per user against tokens/s per device for
the batch-size and serving experiments, the front (points no other point beats on both) joined by a line, as
vLLM's ``benchmarks/sweep/plot_pareto.py`` and AIPerf draw it. Only valid points make the front.

The price comes from ``--price-per-hour`` (``workbench run`` / ``workbench report``) or a suite's
``price_per_hour`` field, and is recorded in the manifest as ``price_per_hour_usd``.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.errors import ParameterError

#: Experiments whose points get the interactivity Pareto figure.
PARETO_EXPERIMENTS = ("batch_size", "serving_load")
PARETO_FIGURE = "pareto_interactivity"
COST_COLUMNS = ["usd_per_mtok_input", "usd_per_mtok_output", "output_tps_per_user", "output_tps_per_device"]


def check_price(price) -> float | None:
    """A price per device-hour in USD, checked: None (no price), or a finite number >= 0.

    Raises:
        ParameterError: negative, not finite, or not a number.
    """
    if price is None:
        return None
    try:
        value = float(price)
    except (TypeError, ValueError):
        raise ParameterError(f"price_per_hour: must be a number of USD per device-hour >= 0 (got {price!r})") from None
    if not math.isfinite(value) or value < 0:
        raise ParameterError(f"price_per_hour: must be a number of USD per device-hour >= 0 (got {price!r})")
    return value


def usd_per_mtok(price_per_hour_usd: float, tokens_per_s: float) -> float:
    """USD per million tokens at ``tokens_per_s`` on a device costing ``price_per_hour_usd``.

    ``price / 3600 s * 1e6 / tokens_per_s``; NaN when the rate is missing or not positive.
    """
    if tokens_per_s is None or pd.isna(tokens_per_s) or tokens_per_s <= 0:
        return float("nan")
    return price_per_hour_usd / 3600.0 * 1e6 / float(tokens_per_s)


def _input_tps(points: pd.DataFrame, requests: pd.DataFrame | None) -> pd.Series:
    """Input tokens/s per point: the point's own ``input_throughput_tps`` where it has one (serving windows),
    else the prompt tokens of its completed requests over its ``wall_s``."""
    have = pd.to_numeric(points.get("input_throughput_tps"), errors="coerce") if "input_throughput_tps" in points \
        else pd.Series(float("nan"), index=points.index)
    if requests is None or requests.empty or not {"point_id", "prompt_tokens"} <= set(requests) \
            or "wall_s" not in points:
        return have
    req = requests
    if "error" in req:
        req = req[req["error"].isna()]
    prompt = pd.to_numeric(req["prompt_tokens"], errors="coerce").groupby(req["point_id"]).sum()
    derived = points["point_id"].map(prompt) / pd.to_numeric(points["wall_s"], errors="coerce")
    return have.where(have.notna(), derived)


def add_columns(points: pd.DataFrame, requests: pd.DataFrame | None = None,
                price_per_hour_usd: float | None = None) -> pd.DataFrame:
    """The points with the cost and interactivity columns (:data:`COST_COLUMNS`) added.

    Args:
        points: a run's points table (``output_throughput_tps``, ``wall_s``, ``decode_tps_p50`` / ``tpot_s_p50``).
        requests: its requests table (for input tokens/s of batch sweeps); optional.
        price_per_hour_usd: USD per device-hour; None leaves the two cost columns empty.

    Returns:
        A copy of ``points``; ``input_throughput_tps`` filled where it can be derived.

    Raises:
        ParameterError: a negative or non-numeric price.
    """
    price = check_price(price_per_hour_usd)
    out = points.copy()
    if out.empty:
        return out.reindex(columns=list(out.columns) + [c for c in COST_COLUMNS if c not in out])
    out["input_throughput_tps"] = _input_tps(out, requests)
    out_tps = pd.to_numeric(out.get("output_throughput_tps"), errors="coerce") \
        if "output_throughput_tps" in out else pd.Series(float("nan"), index=out.index)
    devices = _devices(out)
    if "n_devices" in out or (devices > 1).any():   # written wherever more than one device (or replica) is known
        out["n_devices"] = devices
    out["output_tps_per_device"] = out_tps / devices
    per_user = pd.to_numeric(out["decode_tps_p50"], errors="coerce") if "decode_tps_p50" in out \
        else pd.Series(float("nan"), index=out.index)
    if "tpot_s_p50" in out:
        tpot = pd.to_numeric(out["tpot_s_p50"], errors="coerce")
        per_user = per_user.where(per_user.notna(), 1.0 / tpot.where(tpot > 0))
    out["output_tps_per_user"] = per_user
    if price is None:
        out["usd_per_mtok_output"] = float("nan")
        out["usd_per_mtok_input"] = float("nan")
    else:
        in_tps = pd.to_numeric(out["input_throughput_tps"], errors="coerce")
        out["usd_per_mtok_output"] = [usd_per_mtok(price, v) for v in out_tps / devices]
        out["usd_per_mtok_input"] = [usd_per_mtok(price, v) for v in in_tps / devices]
    return out


def _devices(points: pd.DataFrame) -> pd.Series:
    """Devices (or replicas) each point's throughput spans: ``n_devices``, else ``replicas`` (the serving twin's
    engines behind its router), else 1."""
    n = pd.Series(float("nan"), index=points.index)
    for col in ("n_devices", "replicas"):
        if col in points:
            n = n.where(n.notna(), pd.to_numeric(points[col], errors="coerce"))
    return n.fillna(1).clip(lower=1)


def pareto_front(df: pd.DataFrame, x: str = "output_tps_per_user", y: str = "output_tps_per_device") -> pd.Series:
    """Whether each row is on the Pareto front of ``x`` and ``y`` (both higher is better): no other row is at
    least as good on both and better on one. Rows with a missing value are never on it.

    Returns:
        A boolean Series aligned with ``df``.
    """
    vals = df[[x, y]].apply(pd.to_numeric, errors="coerce")
    ok = vals.notna().all(axis=1)
    front = pd.Series(False, index=df.index)
    pts = vals[ok]
    for i, (a, b) in pts.iterrows():
        dominated = ((pts[x] >= a) & (pts[y] >= b) & ((pts[x] > a) | (pts[y] > b))).any()
        front[i] = not dominated
    return front


def _arm(df: pd.DataFrame, exp: str) -> pd.Series:
    """The configuration a point belongs to (the legend / colour key): the engine for serving, else the
    experiment."""
    if "engine" in df and df["engine"].notna().any():
        return exp + " · " + df["engine"].fillna("?").astype(str)
    return pd.Series(exp, index=df.index)


def pareto_figure(points: pd.DataFrame):
    """Tokens/s per user against tokens/s per device for the batch-size and serving points (valid, ``ok``).

    Args:
        points: points with :func:`add_columns`' columns (any experiments; others are ignored).

    Returns:
        A plotly figure (markers per configuration, each point labelled by its batch size or rate, the front of
        each configuration as a line), or None when no such point has both figures.
    """
    import plotly.graph_objects as go

    from workbench.share import plots

    if points.empty or "experiment" not in points:
        return None
    df = points[points["experiment"].isin(PARETO_EXPERIMENTS)]
    if "status" in df:
        df = df[df["status"] == "ok"]
    if "valid" in df:
        df = df[df["valid"].fillna(True).astype(bool)]
    df = df.dropna(subset=["output_tps_per_user", "output_tps_per_device"])
    if df.empty:
        return None
    df = df.assign(_arm=pd.concat([_arm(g, exp) for exp, g in df.groupby("experiment", sort=False)]))
    fig = go.Figure()
    for arm, g in df.groupby("_arm", sort=True):
        colour = plots.colour_for(arm)
        # serving points by their offered rate (a closed-loop point's is the rate it achieved), 3 significant figures
        tag = next((c for c in ("batch_size", "offered_rps", "rate_rps", "concurrency") if c in g and g[c].notna().any()),
                   None)
        text = [f"{v:.3g}" if isinstance(v, (int, float)) and not pd.isna(v) else "" for v in g[tag]] if tag else None
        fig.add_trace(go.Scatter(x=g["output_tps_per_user"], y=g["output_tps_per_device"], mode="markers+text",
                                 name=f"{arm} (point labels: {tag})" if tag else arm, text=text,
                                 textposition="top right", legendgroup=arm, cliponaxis=False,
                                 marker=dict(color=colour, size=9), hovertext=g.get("point_id")))
        front = g[pareto_front(g)].sort_values("output_tps_per_user")
        if len(front) > 1:
            fig.add_trace(go.Scatter(x=front["output_tps_per_user"], y=front["output_tps_per_device"], mode="lines",
                                     name=f"{arm} front", legendgroup=arm, showlegend=False,
                                     line=dict(color=colour, dash="dot")))
    fig.update_layout(title="Interactivity vs throughput: tokens/s per user against tokens/s per device "
                            "(valid points; Pareto front dotted)")
    for axis, col in (("x", "output_tps_per_user"), ("y", "output_tps_per_device")):
        lo, hi = float(df[col].min()), float(df[col].max())
        pad = 0.12 * (hi - lo) if hi > lo else 0.12 * max(abs(hi), 1.0)   # room for the point labels
        getattr(fig, f"update_{axis}axes")(title_text=plots.label(col), range=[max(lo - pad, 0), hi + pad])
    return plots.legend_below(fig)
