"""The house plotly template and the label lookup every experiment's figures use.

Importing this module registers the ``workbench`` template (plotly ``doc/python/templates.md``: ``plotly_white``
with the house font, colours, margins and legend, merged once) and makes it the default. Axis labels and units come
from the column table (:data:`workbench.stats.columns.COLUMNS`) through :func:`label`; each experiment module builds
its own figures from tidy point and request tables (docs/design.md section 5).
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from workbench.stats import columns

#: The house settings over plotly's ``plotly_white``, merged once and registered as ``workbench``: a default named
#: ``"plotly_white+workbench"`` is merged again at every lookup (``pio.templates[...]``, several a figure): about half
#: of building a small figure (benchmarks/figures.py prints the ratio; results/LOG.md).
HOUSE = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        colorway=px.colors.qualitative.Safe,
        margin=dict(l=70, r=30, t=60, b=60),
        hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
    )
)
pio.templates["workbench"] = pio.templates.merge_templates(pio.templates["plotly_white"], HOUSE)
pio.templates.default = "workbench"

#: One colour per engine / configuration, the same in every figure (the house colorway, plotly's ``Safe``
#: qualitative palette, colour-blind safe). Names not listed get a palette colour from a stable hash of the name.
COLOUR_MAP = {"fifo": "#88CCEE", "static": "#CC6677", "continuous": "#117733", "vllm": "#332288",
              "llama.cpp": "#DDCC77", "llama-cpp": "#DDCC77", "sglang": "#AA4499", "tgi": "#44AA99",
              "float32": "#88CCEE", "bfloat16": "#CC6677", "float16": "#DDCC77", "none": "#888888"}


def colour_for(name) -> str:
    """The house colour of an engine / configuration name (:data:`COLOUR_MAP`, else a stable palette pick).

    A name that starts or ends with a mapped key (``"serving_load · fifo"``, ``"fifo TTFT p50"``) takes that
    key's colour, so one engine keeps its colour across figures whatever the figure calls its traces.
    """
    import zlib

    text = str(name).strip()
    low = text.lower()
    for key in sorted(COLOUR_MAP, key=len, reverse=True):
        if low == key or low.startswith(key + " ") or low.endswith(" " + key):
            return COLOUR_MAP[key]
    palette = px.colors.qualitative.Safe
    return palette[zlib.crc32(text.encode("utf-8")) % len(palette)]


_RECOLOURED = ("scatter", "scattergl", "bar", "box", "violin", "histogram")


def consistent_colours(fig: go.Figure) -> go.Figure:
    """Recolour ``fig``'s named traces by :func:`colour_for` of their legend group (else name), so the same
    engine / configuration has the same colour in every figure. Traces with an explicit colour outside the
    house palette (the grey crosses of invalid points), per-point colour arrays or colour scales keep theirs.

    Returns:
        ``fig`` (changed in place).
    """
    palette = {c.lower() for c in px.colors.qualitative.Safe} | {c.lower() for c in px.colors.qualitative.Plotly}
    for tr in fig.data:
        if tr.type not in _RECOLOURED or not (tr.legendgroup or tr.name):
            continue
        marker = getattr(tr, "marker", None)
        current = marker.color if marker is not None else None
        if current is not None and (not isinstance(current, str) or current.lower() not in palette):
            continue
        colour = colour_for(tr.legendgroup or tr.name)
        tr.update(marker_color=colour)
        if tr.type in ("scatter", "scattergl", "box", "violin"):
            line = getattr(tr, "line", None)
            if line is None or line.color is None or str(line.color).lower() in palette:
                tr.update(line_color=colour)
    return fig

def label(column: str) -> str:
    """Axis label with unit of a column or aggregate, from the one column table (:data:`workbench.stats.columns.COLUMNS`)."""
    return columns.label(column)


def labels(*columns: str, **extra: str) -> dict[str, str]:
    """``labels=`` mapping for plotly express: each column's :func:`label`, plus ``extra`` names."""
    return {**{c: label(c) for c in columns}, **extra}


def ok_points(points: pd.DataFrame) -> pd.DataFrame:
    """Points whose status is ``ok`` (failed points carry no figures): what figures draw (invalid ones crossed
    out with :func:`mark_invalid`). Fits, knees, recommendations and best-of choices use :func:`workbench.stats.evidence.usable_points`."""
    return points[points["status"] == "ok"].copy() if "status" in points else points.copy()


def legend_below(fig: go.Figure, bottom: int = 60) -> go.Figure:
    """Put the legend at the bottom of the figure (horizontal, left-aligned), under the x tick labels and the
    x axis title, so long trace names never cover the title and long or rotated category labels never run
    into the legend: it is anchored to the figure's container (``yref="container"``), and plotly's automargin
    makes the room the tick labels and axis title need above it.

    Args:
        fig: the figure (changed in place).
        bottom: minimum bottom margin in pixels (the legend row itself).

    Returns:
        ``fig``.
    """
    fig.update_layout(legend=dict(orientation="h", yref="container", yanchor="bottom", y=0, xanchor="left", x=0),
                      margin=dict(b=bottom))
    fig.update_xaxes(automargin=True)
    return fig


def wrap_title(text: str, width: int = 100) -> str:
    """``text`` broken into lines of at most ``width`` characters with ``<br>`` (plotly never wraps a title: a long
    one runs past the figure's right edge); a line already broken with ``<br>`` keeps its breaks."""
    import textwrap

    return "<br>".join(line for part in str(text).split("<br>") for line in (textwrap.wrap(part, width) or [""]))


def legend_is_below(fig: go.Figure) -> bool:
    """Whether :func:`legend_below` placed ``fig``'s legend."""
    return fig.layout.legend.yref == "container" and fig.layout.legend.y == 0


INVALID_NAME = "invalid (greyed)"


def mark_invalid(fig: go.Figure, points: pd.DataFrame, x: str, y: str, row: int | None = None,
                 col: int | None = None) -> go.Figure:
    """Overlay grey crosses on the points marked invalid (other load or drift while measured).

    Args:
        fig: the figure (changed in place).
        points: the points table with ``valid``, ``invalid_reason`` and the ``x`` / ``y`` columns.
        row, col: the subplot of a :func:`plotly.subplots.make_subplots` figure (one legend entry for all panels).

    Returns:
        ``fig``; unchanged when no point is invalid.
    """
    if "valid" not in points or x not in points or y not in points:
        return fig
    bad = points[points["valid"].eq(False)]
    if bad.empty:
        return fig
    shown = any(getattr(t, "name", None) == INVALID_NAME for t in fig.data)
    fig.add_trace(go.Scatter(x=bad[x], y=bad[y], mode="markers", name=INVALID_NAME, legendgroup=INVALID_NAME,
                             showlegend=not shown,
                             marker=dict(symbol="x-thin-open", size=16, color="#999", line=dict(width=2)),
                             hovertext=bad.get("invalid_reason"), hoverinfo="text"), row=row, col=col)
    return fig


DEVICE_COLUMN = "device_name"


def device_names(*tables) -> list[str]:
    """The device types (``device_name``) in the DataFrames among ``tables``, sorted; missing names count as
    ``unknown device``."""
    names: set[str] = set()
    for t in tables:
        if isinstance(t, pd.DataFrame) and DEVICE_COLUMN in t and len(t):
            names |= set(t[DEVICE_COLUMN].fillna("unknown device").astype(str))
    return sorted(names)


def _on_device(table, name: str):
    if isinstance(table, pd.DataFrame) and DEVICE_COLUMN in table:
        return table[table[DEVICE_COLUMN].fillna("unknown device").astype(str) == name]
    return table  # no device column (e.g. a quality summary, the same on every device): whole


_DOMAIN_TRACES = ("table", "pie", "sunburst", "treemap", "indicator", "sankey", "parcoords")


def _axis_names(fig: go.Figure) -> set[str]:
    return {k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))}


def _remap_ref(ref, k: int):
    """``x`` / ``y`` / ``x domain`` of a one-panel figure -> the same on panel ``k`` (1-based)."""
    if not isinstance(ref, str) or k == 1 or ref[:1] not in ("x", "y") or ref[1:2] not in ("", " "):
        return ref
    return ref[0] + str(k) + ref[1:]


def facet_by_device(figs: dict[str, go.Figure]) -> go.Figure:
    """One figure from the same figure drawn per device type (``{device name: figure}``): one panel per device
    (rows, titled ``on <device>``) so no curve mixes device types; a figure that already has several panels
    is overlaid instead, each trace named ``<trace> · <device>`` and grouped by device in the legend.

    Returns:
        The combined figure (the single figure unchanged when there is one device).
    """
    names = list(figs)
    first = figs[names[0]]
    if len(names) == 1:
        return first
    if any(tr.type in _DOMAIN_TRACES for f in figs.values() for tr in f.data):  # tables: stacked, titled
        out = go.Figure(layout=first.layout)
        n = len(names)
        for k, (dev, f) in enumerate(figs.items()):
            top, bottom = 1 - k / n, 1 - (k + 1) / n + 0.06 / n
            for tr in f.data:
                out.add_trace(tr.to_plotly_json() | {"domain": {"x": [0, 1], "y": [bottom, top - 0.06 / n]}})
            out.add_annotation(text=f"on {dev}", x=0, y=top, xref="paper", yref="paper", showarrow=False,
                               xanchor="left", yanchor="top")
        out.update_layout(height=max(450, 300 * n))
        return out
    if any(len(_axis_names(f)) > 2 for f in figs.values()):
        out = go.Figure(layout=first.layout)
        for dev, f in figs.items():
            for tr in f.data:
                out.add_trace(tr.to_plotly_json() | {"name": f"{tr.name} · {dev}" if tr.name else dev,
                                                     "legendgroup": dev, "legendgrouptitle": {"text": dev}})
        return out
    from plotly.subplots import make_subplots

    out = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12 / len(names),
                        subplot_titles=[f"on {d}" for d in names])
    shown: set = set()
    for k, (dev, f) in enumerate(figs.items(), 1):
        for tr in f.data:
            t = tr.to_plotly_json()
            t.pop("xaxis", None), t.pop("yaxis", None)
            key = t.get("name")
            t["legendgroup"] = key if key else t.get("legendgroup")
            if key in shown:
                t["showlegend"] = False
            shown.add(key)
            out.add_trace(t, row=k, col=1)
        axes = {a: f.layout[a].to_plotly_json() for a in ("xaxis", "yaxis")}
        for a in axes.values():
            for drop in ("anchor", "domain", "matches", "scaleanchor", "overlaying"):
                a.pop(drop, None)
        if k < len(names):
            axes["xaxis"].pop("title", None)
        out.update_xaxes(axes["xaxis"], row=k, col=1)
        out.update_yaxes(axes["yaxis"], row=k, col=1)
        for kind in ("shapes", "annotations"):
            for item in f.layout[kind] or ():
                d = item.to_plotly_json()
                if "paper" in (d.get("xref"), d.get("yref")) and k > 1:
                    continue  # drawn once
                d["xref"], d["yref"] = _remap_ref(d.get("xref", "x"), k), _remap_ref(d.get("yref", "y"), k)
                getattr(out, f"add_{kind[:-1]}")(d)
    lay = first.layout.to_plotly_json()
    out.update_layout({k: v for k, v in lay.items() if not k.startswith(("xaxis", "yaxis", "shapes", "annotations"))})
    out.update_layout(height=max(450, 340 * len(names)))
    return out


def split_by_device(figures_fn):
    """Decorate an experiment's ``figures(...) -> {name: figure}``: when its tables hold points of several device
    types (a Ray cluster of mixed GPUs), draw every figure once per device and combine them with
    :func:`facet_by_device`, so points of different device types are never averaged into one curve.
    DataFrame arguments with a ``device_name`` column are split; other arguments go whole to every call."""
    import functools

    @functools.wraps(figures_fn)
    def wrapper(*args, **kwargs):
        names = device_names(*args, *kwargs.values())
        if len(names) < 2:
            return {k: tidy_legend(f) for k, f in figures_fn(*args, **kwargs).items()}
        per = {n: figures_fn(*[_on_device(a, n) for a in args], **{k: _on_device(v, n) for k, v in kwargs.items()})
               for n in names}
        keys = list(dict.fromkeys(k for figs in per.values() for k in figs))
        return {key: tidy_legend(facet_by_device({n: per[n][key] for n in names if key in per[n]})) for key in keys}

    return wrapper


def tidy_legend(fig):
    """Move a figure's legend under the plot (:func:`legend_below`) when, at the top, it would cover the title
    or the subplot titles: several entries on a figure with subplot titles, long entry names, or a long title
    beside them (over 110 characters together: the prefix-sharing figure's legend ran over its title). Other
    figures (and non-figures) are returned unchanged."""
    if not isinstance(fig, go.Figure) or legend_is_below(fig):
        return fig
    names = [t.name for t in fig.data if t.name and t.showlegend is not False]
    subplot_titles = any(a.yref == "paper" and (a.y or 0) >= 0.99 for a in fig.layout.annotations)
    title = (fig.layout.title.text or "") if fig.layout.title else ""
    legend_chars = sum(len(n) for n in names)
    if len(names) >= 2 and (subplot_titles or legend_chars > 70 or len(title) + legend_chars > 110):
        legend_below(fig)
    return fig


def error_y(df: pd.DataFrame, column: str) -> dict | None:
    """``error_y`` arrays for a ``<column>`` p50 from its interval columns (``_ci_low`` / ``_ci_high``), or None when absent."""
    lo, hi = f"{column}_ci_low", f"{column}_ci_high"
    if lo not in df or hi not in df or df[[lo, hi]].isna().all().all():
        return None
    return dict(type="data", symmetric=False, array=(df[hi] - df[column]).clip(lower=0),
                arrayminus=(df[column] - df[lo]).clip(lower=0))


def _cell_text(v) -> str:
    """A table cell: floats to 3 significant digits (infinity as ``never``, NaN as ``-``), None as ``none``."""
    import math

    if isinstance(v, float):
        return "-" if v != v else ("never" if math.isinf(v) else f"{v:.3g}")
    return "none" if v is None else str(v)


def table_figure(df: pd.DataFrame, title: str, empty_reason: str = "") -> go.Figure:
    """A table as a figure, sized to show every row and its headers (a static PNG / SVG keeps the figure's size:
    plotly's default 500 px showed 2 of 7 rows of the serving recommendation and clipped its headers).

    Args:
        df: the rows to show (its columns are the headers; cells through :func:`_cell_text`).
        title: the figure's title.
        empty_reason: said in the figure when ``df`` has no rows (a table without rows and without a reason tells
            the reader nothing).

    Returns:
        A ``go.Table`` figure whose ``height`` fits the rows at the width it wants (each row as tall as its longest
        cell wraps; that width in ``layout.meta["table_width_px"]``, for the static export: a page fits it to its
        column), or, with no rows, a figure that says ``no rows: <empty_reason>``.
    """
    import math
    import textwrap

    if df is None or df.empty:
        fig = go.Figure()
        text = "<br>".join(textwrap.wrap(f"no rows: {empty_reason or 'nothing to show'}", 56))   # a paper column
        fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.update_layout(title=title, height=260)
        return fig
    cols = [str(c) for c in df.columns]
    cells = [[_cell_text(v) for v in df[c]] for c in df.columns]
    # width: each column its widest cell's share (a header breaks at its underscores), capped: long texts wrap
    part = [max((len(x) for x in h.split("_")), default=1) for h in cols]
    want = [min(max(p + 2, *(len(x) for x in col)) * 7 + 16, 360) for p, col in zip(part, cells)]
    width = int(min(max(700, sum(want) + 100), 2000))
    px_per_col = [w * (width - 100) / sum(want) for w in want]

    def wrap_header(h: str, w: float) -> str:   # column names have no spaces: break them at the underscores
        per = max(int((w - 12) / 7), 4)
        out, line = [], ""
        for piece in h.split("_"):
            nxt = f"{line}_{piece}" if line else piece
            if line and len(nxt) > per:
                out.append(line + "_")
                line = piece
            else:
                line = nxt
        return "<br>".join(out + [line])

    def lines(text: str, w: float) -> int:
        return max(1, math.ceil(len(text) * 7 / max(w - 12, 20)))

    heads = [wrap_header(h, w) for h, w in zip(cols, px_per_col)]
    header_lines = max(h.count("<br>") + 1 for h in heads)
    row_lines = [max(lines(col[i], w) for col, w in zip(cells, px_per_col)) for i in range(len(df))]
    height = 130 + 20 * header_lines + sum(max(28, 10 + 18 * n) for n in row_lines)
    fig = go.Figure(go.Table(columnwidth=want, header=dict(values=heads, align="left"),
                             cells=dict(values=cells, align="left", height=28)))
    # the width goes to the static export only (``meta``): in a page (the report, a notebook) the table fills the
    # column it is given and wraps its cells, where a fixed 1,700 px ran past a 1,400 px window
    fig.update_layout(title=title, height=int(height), meta={"table_width_px": width},
                      margin=dict(l=30, r=30, t=80, b=20))
    return fig
