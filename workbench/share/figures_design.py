"""The figure of a comparison measured as a design (:mod:`workbench.run.design`): every arm's ratio to its control
with the simultaneous interval its decision was read from, the rounds' own ratios as faint points, the line at 1,
the equivalence band and the A/A control's interval. One figure, one analysis: the intervals are the point rows'
``<prefix>_low`` / ``_high`` (:meth:`workbench.run.design.DesignResult.point_columns`), the faint points the design's
table in the run folder (``design/<experiment>.parquet``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from workbench.checks import float_or_nan


def round_ratios(run_dir, experiment: str, outcome: str) -> pd.DataFrame:
    """Each measured arm's value over its control's in the same round, from the run's design table.

    Returns:
        ``arm``, ``round``, ``ratio`` (the A/A arm under its own name); empty when the run holds no design of the
        experiment (measured point by point, or an older run).
    """
    if run_dir is None:
        return pd.DataFrame(columns=["arm", "round", "ratio"])
    import json

    folder = Path(run_dir) / "design"
    tpath, jpath = folder / f"{experiment}.parquet", folder / f"{experiment}.json"
    if not (tpath.exists() and jpath.exists()):
        return pd.DataFrame(columns=["arm", "round", "ratio"])
    desc = json.loads(jpath.read_text(encoding="utf-8"))
    table = pd.read_parquet(tpath)
    if outcome not in table:
        return pd.DataFrame(columns=["arm", "round", "ratio"])
    wide = table.pivot_table(index="round", columns="arm", values=outcome, aggfunc="first")
    ctrl_of = {a: desc["control"] for a in desc["arms"]}
    for g, members in (desc.get("groups") or {}).items():
        ctrl_of.update({a: g for a in members})
    ctrl_of["A/A"] = desc["control"]
    rows = []
    for arm in wide.columns:
        c = ctrl_of.get(arm)
        if c is None or c not in wide or arm == c:
            continue
        for rnd, v in (wide[arm] / wide[c]).dropna().items():
            rows.append({"arm": arm, "round": int(rnd), "ratio": float(v)})
    return pd.DataFrame(rows, columns=["arm", "round", "ratio"])


def ratio_figure(points: pd.DataFrame, x: str, prefix: str, rounds: pd.DataFrame | None = None, *, group=None,
                 name=str, title: str = "", x_title: str = "", y_title: str = "", log_x: bool = False,
                 invert: bool = False):
    """A comparison's figure: per arm its ratio to its control with the simultaneous interval (error bars), the
    rounds' ratios as faint points, the line at 1, the equivalence band (dotted lines at ``1/margin`` and ``margin``)
    and the A/A control's interval (a grey band).

    Args:
        points: point rows with ``point_id``, ``x`` and the ratio columns (``<prefix>``, ``_low``, ``_high``); the
            controls (ratio 1, no interval) are drawn at 1.
        x: the column on the x axis.
        prefix: the ratio columns' prefix (``throughput_ratio``, ``time_ratio``, ...).
        rounds: :func:`round_ratios` (None or empty: no faint points).
        group: a column splitting the rows into traces (one colour each); None: one trace.
        name: the trace name from the group's key (or the name itself without a group).
        title, x_title, y_title: the figure's title and axis titles.
        log_x: a log x axis (batch sizes, lengths).
        invert: draw ``control / arm`` (a speed-up from times).

    Returns:
        A plotly figure.
    """
    import plotly.express as px
    import plotly.graph_objects as go

    df = points[points[prefix].notna()].copy() if prefix in points else points.iloc[0:0].copy()
    f = (lambda v: 1.0 / v if invert else v)
    fig = go.Figure()
    colours = px.colors.qualitative.Safe
    parts = [(str(name), df)] if group is None else [(str(name(k)), g) for k, g in df.groupby(group, sort=True)]
    faint = rounds if rounds is not None and len(rounds) else None
    for i, (label, g) in enumerate(parts):
        g = g.sort_values(x)
        c = colours[i % len(colours)]
        y = g[prefix].map(f)
        lo, hi = (g[f"{prefix}_high"].map(f), g[f"{prefix}_low"].map(f)) if invert else (g[f"{prefix}_low"],
                                                                                       g[f"{prefix}_high"])
        fig.add_trace(go.Scatter(x=g[x], y=y, mode="lines+markers", name=label, line=dict(color=c),
                                 error_y=dict(type="data", symmetric=False, array=(hi - y).fillna(0),
                                              arrayminus=(y - lo).fillna(0)),
                                 customdata=g.get(f"{prefix}_verdict"), hovertemplate="%{x}: %{y:.2f}x %{customdata}"))
        if faint is not None and "point_id" in g:
            xs = dict(zip(g["point_id"].astype(str), g[x]))
            r = faint[faint["arm"].isin(xs)]
            if len(r):
                fig.add_trace(go.Scatter(x=r["arm"].map(xs), y=r["ratio"].map(f), mode="markers", showlegend=i == 0,
                                         name="each round", marker=dict(color=c, opacity=0.3, size=6),
                                         hoverinfo="skip"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    margin = float_or_nan(df["margin"].dropna().iloc[0]) if "margin" in df and df["margin"].notna().any() else math.nan
    if math.isfinite(margin) and margin > 1:
        for y in (1 / margin, margin):
            fig.add_hline(y=y, line_dash="dash", line_color="#aaa", line_width=1)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(dash="dash", color="#aaa"),
                                 name=f"equivalence band +-{margin - 1:.0%}"))
    if "aa_low" in df and df["aa_low"].notna().any():
        lo, hi = float(df["aa_low"].dropna().iloc[0]), float(df["aa_high"].dropna().iloc[0])
        if lo > 0 and math.isfinite(hi):
            lo, hi = (1 / hi, 1 / lo) if invert else (lo, hi)
            fig.add_hrect(y0=lo, y1=hi, fillcolor="#888888", opacity=0.18, line_width=0)
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"A/A control {lo:.2f}-{hi:.2f}x",
                                     marker=dict(symbol="square", size=14, color="#888888", opacity=0.35)))
    fig.update_layout(title=title, xaxis_title=x_title or x, yaxis_title=y_title or "ratio to the control")
    if log_x:
        fig.update_xaxes(type="log")
    return fig
