"""A self-contained HTML report of one run, or a comparison of several.

``build_report(run_dir)`` writes ``<run_dir>/report.html``: the run's
environment, each experiment's configuration and point table (failed points
flagged), and every figure the notebooks saved (``figures/*.json``, in saved
order), interactive, with plotly.js embedded once (plotly
``doc/python/interactive-html-export.md``). It opens offline in any browser.
Given several runs, it writes one comparison page: figures of the same name
overlaid (one line style and marker per run, legend "A · trace"), a table of
headline deltas per point (median TTFT, p99 TTFT, output throughput, goodput;
points present in only some runs are listed, not dropped), and the runs'
environments side by side with differing rows marked.

Every build also exports each run for people outside Python
(:func:`workbench.share.csv_export.export`): ``requests.csv`` (list columns such as ``itl_s`` as JSON) and
``points.json`` (manifest environment, experiments and point rows), next to the
run's ``report.html``; a comparison writes the combined ``<name>.requests.csv``
and ``<name>.points.json`` next to its HTML.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
from pathlib import Path

import pandas as pd
import plotly.io as pio
import plotly.offline

from workbench.checks import mask_secrets
from workbench.errors import ParameterError
from workbench.run import locks, results
from workbench.share import plots
from workbench.share.comparability import DELTA_METRICS
from workbench.share.csv_export import export, write_csv, write_text
from workbench.share.findings import exp_anchor, finding_html, findings_html, point_anchor, summary_html
from workbench.stats import columns

#: The metrics of the comparison's delta table.
#: Environment keys shown first in the side-by-side table (any other keys follow).
ENV_KEYS = ["model", "model_sha256", "device", "device_name", "dtype", "torch", "transformers", "workbench",
            "git_commit", "python", "platform", "torch_threads", "cpu_count", "bandwidth_bytes_per_s",
            "flops_per_s", "seed"]
#: Trace types that can be overlaid on shared axes (others, e.g. tables, are shown per run).
_OVERLAY_TYPES = {"scatter", "scattergl", "bar", "box", "violin", "histogram"}
_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
_SYMBOLS = ["circle", "diamond", "square", "x", "triangle-up", "cross"]
_DASH_WORDS = ["solid", "dashed", "dotted", "dash-dot", "long dashes", "long dash-dot"]
#: A run's colour where each run draws one series (blue, red, green, ...: plotly's D3 palette)
_RUN_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
#: The point table's columns: the registry's ``report`` entries (``workbench/stats/columns.csv``).
_POINT_COLUMNS = list(columns.REPORT_POINT_COLUMNS)
#: Static figure formats a run's report writes by default (``$WORKBENCH_FIGURES`` overrides: ``png,svg,pdf`` or
#: ``none``).
DEFAULT_FIGURE_FORMATS = "png,svg"

_CSS = """
body{font-family:Inter,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{font-size:1.6rem} h2{border-bottom:1px solid #ddd;padding-bottom:.3rem;margin-top:2.5rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1rem} td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f5f5f5} td:first-child,th:first-child{text-align:left}
.failed{background:#fde8e8} tr.invalid td{color:#999;background:#f4f4f4} .finding{font-size:1.05rem;margin:.4rem 0}
.evidence{color:#555;font-size:.88rem;margin:.15rem 0} .supported,.unsupported{font-size:.75rem;padding:0 .35rem;border-radius:3px}
.supported{background:#e3f4e3;color:#1f6b1f} .unsupported{background:#f4e3e3;color:#8b1f1f} tr:target td{background:#fff2b3}
.warn{background:#fff6d6;padding:.5rem .8rem;border-left:4px solid #e0b000} .figure{margin:1rem 0 2rem} .meta{color:#666;font-size:.9rem}
details{margin:.5rem 0} tr.diff td{background:#fff6d6} .wide{overflow-x:auto} .downloads a{margin-right:1rem}
table.arms{font-size:.8rem;margin:.3rem 0 .4rem 1rem} .summary ul{margin:.3rem 0} .summary li{margin:.2rem 0}
"""


def _table(df: pd.DataFrame, failed_col: str | None = "status", row_ids: list[str] | None = None) -> str:
    """An HTML table of ``df``; failed rows red, invalid rows grey; ``row_ids`` become the rows' ``id``s."""
    if df.empty:
        return "<p class='meta'>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for i, (_, r) in enumerate(df.iterrows()):
        cls = " class='failed'" if failed_col in df and str(r[failed_col]).startswith("failed") else ""
        if not cls and "valid" in df and r["valid"] is not None and not pd.isna(r["valid"]) and not bool(r["valid"]):
            cls = " class='invalid'"
        cells = "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r)
        rid = f" id='{html.escape(row_ids[i])}'" if row_ids else ""
        rows.append(f"<tr{rid}{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _fmt(v) -> str:
    if isinstance(v, float):
        if pd.isna(v):
            return ""
        return f"{v:.4g}"
    return str(v)


def _kv_table(d: dict) -> str:
    return _table(pd.DataFrame({"key": list(d), "value": [json.dumps(v) if isinstance(v, (list, dict)) else v
                                                          for v in d.values()]}), failed_col=None)


def _figures(run: Path) -> list[tuple[str, str]]:
    names = _figure_names(run)
    out = []
    for name in names:
        path = run / "figures" / f"{name}.json"
        if path.exists():
            fig = plots.consistent_colours(pio.from_json(path.read_text()))
            out.append((name, pio.to_html(fig, full_html=False, include_plotlyjs=False, default_width="100%")))
    return out


def _validity_html(run: Path, points: pd.DataFrame) -> str:
    """How many points are valid, and the invalid ones with their reasons (greyed in the tables below)."""
    if points.empty or "valid" not in points:
        return ""
    ok = points[points.get("status", "ok") == "ok"] if "status" in points else points
    bad = results.invalid_points(run)
    moved = sorted(set(results.aa_moved_points(run).values()))
    text = f"{int(ok['valid'].eq(True).sum())} valid and {len(bad)} invalid of {len(ok)} measured points."
    kept = [f"{name}: {entry['drift_note']}" for name, entry in (results.read_manifest(run).get("experiments") or {}).items()
            if isinstance(entry, dict) and entry.get("drift_kept")]
    if "contention_note" in ok:  # other load or steal over a design its rounds absorbed (stats.validity.absorbed_by_rounds)
        noted = ok[ok["contention_note"].fillna("").astype(str).str.len() > 0]
        for exp, g in (noted.groupby("experiment") if "experiment" in noted else []):
            kept.append(f"{exp}: {len(g)} point(s) measured while {g['contention_note'].iloc[0]}")
    if kept:  # a drift across a design's rounds: its arms kept (run/drift.absorbed_by_rounds), said where it happened
        text += " " + " ".join(kept) + "."
    if not bad and not moved:
        return f"<p class='meta'>{html.escape(text)}</p>"
    again = f"<code>workbench run --rerun-invalid {html.escape(str(run))}</code>"
    out = f"<div class='warn'>{html.escape(text)}"
    if bad:
        items = "".join(f"<li><code>{html.escape(pid)}</code>: {html.escape(reason)}</li>" for pid, reason in bad.items())
        out += (f" Invalid points (other load or drift while measured) are greyed below; re-measure them with {again}."
                f"<details><summary>Invalid points</summary><ul>{items}</ul></details>")
    if moved:
        out += (f" {len(moved)} comparison(s) whose A/A control moved ({html.escape('; '.join(moved))}): their "
                f"findings are not supported; {again} measures them again.")
    return out + "</div>"


def _run_section(run: Path, with_figures: bool = True, label: str = "", page_dir: Path | None = None) -> str:
    """One run: findings first (each experiment's headline), validity, figures; then point tables, configs
    and the environment, collapsed."""
    manifest = results.read_manifest(run)
    points = _points_with_cost(run, manifest)
    parts = [f"<h2>Run {html.escape(label + ': ' if label else '')}{html.escape(run.name)}</h2>",
             f"<p class='meta'>created {html.escape(str(manifest.get('created_utc')))} · "
             f"status {html.escape(str(manifest.get('status')))}</p>",
             findings_html(manifest, run), _validity_html(run, points), _devices_html(points)]
    if with_figures:
        for name, div in _figures(run):
            parts.append(f"<div class='figure' id='fig-{html.escape(name)}'>{div}</div>")
    parts.append("<h2>Points</h2>")
    for exp, meta in manifest.get("experiments", {}).items():
        finding = manifest.get("findings", {}).get(exp)
        parts.append(f"<h3 id='{exp_anchor(run, exp)}'>Experiment: {html.escape(exp)}</h3>")
        if finding:
            parts.append(finding_html(run, exp, finding, tag="div"))
        if not points.empty and "experiment" in points:
            pts = points[points["experiment"] == exp]
            cols = [c for c in _POINT_COLUMNS if c in pts]
            for on, group in _by_device(pts):  # one table per device type: points are never pooled across them
                parts += [f"<details><summary>{len(group)} points{html.escape(on)}</summary><div class='wide'>",
                          _table(group[cols], row_ids=[point_anchor(run, p) for p in group["point_id"]]
                                 if "point_id" in group else None), "</div></details>"]
            parts.append(_residuals_html(run, exp, pts))
        if meta.get("config"):
            parts += ["<details><summary>Configuration</summary>", _kv_table(mask_secrets(meta["config"])),
                      "</details>"]
    parts += ["<details><summary>Environment</summary>", _kv_table(manifest.get("environment", {})), "</details>"]
    notebooks = sorted((run / "notebooks").glob("*.ipynb"))
    if notebooks:
        links = "".join(f"<li><a href='{html.escape(_rel(n, page_dir or run))}'>{html.escape(n.name)}</a></li>"
                        for n in notebooks)
        parts.append(f"<p class='meta'>Executed notebooks:</p><ul>{links}</ul>")
    return "\n".join(p for p in parts if p)


def _points_with_cost(run: Path, manifest: dict | None = None) -> pd.DataFrame:
    """The run's points with the cost and interactivity columns (:func:`workbench.share.cost.add_columns`, at the
    price the manifest records as ``price_per_hour_usd``)."""
    from workbench.share import cost

    manifest = manifest if manifest is not None else results.read_manifest(run)
    points = results.read_points(run)
    if points.empty:
        return points
    return cost.add_columns(points, results.read_requests(run), manifest.get("price_per_hour_usd"))


def _share_run(run: Path, figures, price_per_hour) -> str:
    """What a run's report writes into the run for people outside the workbench: the price (if given) in the
    manifest, the interactivity Pareto figure, static figures, and ``metrics.json``. Returns a one-line note
    when static figures could not be written (also printed to stderr), else ""."""
    import os
    import sys

    from workbench.share import cost, run_summary, static_figures

    formats = static_figures.parse_formats(os.environ.get("WORKBENCH_FIGURES", DEFAULT_FIGURE_FORMATS)
                                           if figures is None else figures)
    price = cost.check_price(price_per_hour)
    try:
        locks.check_writer(run)   # a run another process is measuring keeps its manifest to itself
    except locks.RunLockedError as exc:
        note = f"metrics.json, the Pareto figure and static figures not written now: {exc}"
        print(note, file=sys.stderr)
        return note
    if price is not None:
        results.update_manifest(run, price_per_hour_usd=price)
    points = _points_with_cost(run)
    fig = cost.pareto_figure(points)
    if fig is not None:
        results.save_figure(run, cost.PARETO_FIGURE, fig)
    note = ""
    if formats:
        _, problem = static_figures.write_static(run, formats)
        if problem:
            note = problem
            print(problem, file=sys.stderr)
    run_summary.write_metrics(run, points)
    return note


def _residuals_html(run: Path, exp: str, points: pd.DataFrame) -> str:
    """Measured / predicted TTFT and TPOT per point with the bound the roofline gives (``residuals/<exp>.csv``,
    else the points' own prediction columns); empty when the experiment has no predictions."""
    from workbench.predict import predictions

    path = run / "residuals" / f"{exp}.csv"
    table = pd.read_csv(path) if results.safe_name(exp) and path.exists() else predictions.residual_table(points)
    if table.empty or not {"ttft_ratio", "tpot_ratio"} & set(table.columns):
        return ""
    summary = predictions.residual_summary(table)
    return (f"<details><summary>Measured / predicted (calibrated roofline): "
            f"{html.escape(summary.splitlines()[0])}</summary><div class='wide'>{_table(table, None)}</div>"
            f"<pre>{html.escape(summary)}</pre></details>")


def _by_device(points: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``[(" on <device name>", rows), ...]`` when the points ran on several device types, else ``[("", points)]``."""
    if "device_name" not in points or points["device_name"].dropna().nunique() < 2:
        return [("", points)]
    return [(f" on {name}", g) for name, g in points.groupby(points["device_name"].fillna("unknown device"), sort=True)]


def _devices_html(points: pd.DataFrame) -> str:
    """A warning when a run's points were measured on several device types (a Ray cluster of mixed GPUs)."""
    groups = _by_device(points)
    if len(groups) < 2:
        return ""
    names = ", ".join(f"{on[4:]} ({len(g)} points)" for on, g in groups)
    return (f"<p class='warn'>Measured on {len(groups)} device types: {html.escape(names)}. The point tables below "
            "are per device; never average a figure across device types (compare curves of one device).</p>")


def run_labels(runs: list[Path]) -> dict[str, str]:
    """Short labels ``A (suffix)``, ``B (suffix)``... per run id (suffix: the run id after its timestamp)."""
    out = {}
    for i, run in enumerate(runs):
        letter = chr(ord("A") + i) if i < 26 else f"R{i}"
        out[run.name] = f"{letter} ({run.name.split('-', 1)[-1]})"
    return out


def compare_points(runs: list[Path], metrics: list[str] | None = None) -> pd.DataFrame:
    """Headline metrics per point across runs, with the relative change of each later run vs the first.

    Points are matched by ``point_id`` (experiment + parameters); a point missing from a run keeps
    NaN there and ``present_in`` says which runs have it, so runs with different parameter sets
    still compare.

    Args:
        runs: run folders; the first is the baseline.
        metrics: point columns to compare (default :data:`DELTA_METRICS`).

    Returns:
        One row per ``point_id``: ``present_in`` (the :func:`run_labels` letters of ``runs``, so a run without
        points keeps its letter), ``invalid_in`` (the letters of the runs where the point is marked invalid),
        ``<metric>@<run_id>`` per run with points and ``<metric> change@<run_id>`` (fraction, that run vs the first
        run with points) for each later one: NaN where either point is invalid (a change against a point measured
        under other load is not a change) or the first run's value is 0. Empty when fewer than two runs have points.
    """
    metrics = metrics or DELTA_METRICS
    frames, names, valid = [], [], {}
    for run in runs:
        pts = results.read_points(run)
        if pts.empty or "point_id" not in pts:
            continue
        pts = pts[pts["status"] == "ok"].drop_duplicates("point_id", keep="last").set_index("point_id")
        cols = pts.reindex(columns=metrics)
        frames.append(cols.add_suffix(f"@{run.name}"))
        names.append(run.name)
        # invalid: a verdict of False; a point without a verdict (NaN: an older run, another tool's) keeps its delta
        valid[run.name] = (pts["valid"].map(lambda v: v is None or v != v or bool(v)) if "valid" in pts
                           else pd.Series(True, index=pts.index))
    if len(frames) < 2:
        return pd.DataFrame()
    table = pd.concat(frames, axis=1, join="outer")
    labels = run_labels(runs)
    present = [table[[f"{m}@{n}" for m in metrics]].notna().any(axis=1) for n in names]
    table.insert(0, "present_in", [", ".join(labels[n].split(" ")[0] for n, p in zip(names, row) if p)
                                   for row in zip(*present)])
    ok = {n: valid[n].reindex(table.index).fillna(True).astype(bool) for n in names}
    table.insert(1, "invalid_in", [", ".join(labels[n].split(" ")[0] for n in names
                                             if pid in valid[n].index and not valid[n][pid]) for pid in table.index])
    first = names[0]
    for n in names[1:]:
        for m in metrics:
            base = table[f"{m}@{first}"]
            change = table[f"{m}@{n}"] / base.where(base != 0) - 1
            table[f"{m} change@{n}"] = change.where(ok[first] & ok[n])
    return table.reset_index().rename(columns={"index": "point_id"})


def _delta_table_html(table: pd.DataFrame, runs: list[Path]) -> str:
    """The delta table with run labels in the headers and changes as signed percentages."""
    if table.empty:
        return "<p class='meta'>(fewer than two runs with points)</p>"
    labels = run_labels(runs)
    # the changes are against the first run with points (one with columns here), which is not always run A
    base = next(labels[r.name] for r in runs if any(c.endswith(f"@{r.name}") for c in table.columns)).split(" ")[0]
    view = table.copy()
    for col in list(view.columns):
        if " change@" in col:
            view[col] = view[col].map(lambda v: "" if pd.isna(v) else f"{v:+.1%}")
    rename = {}
    for col in view.columns:
        for rid, lab in labels.items():
            letter = lab.split(" ")[0]
            if col.endswith(f" change@{rid}"):
                rename[col] = f"{col.split(' change@')[0]} Δ {letter} vs {base}"
            elif col.endswith(f"@{rid}"):
                rename[col] = f"{col.split('@')[0]} [{letter}]"
    return f"<div class='wide'>{_table(view.rename(columns=rename), failed_col=None)}</div>"


def environments(runs: list[Path]) -> pd.DataFrame:
    """The runs' recorded environments side by side: one row per key, one column per run label,
    ``differs`` True where the runs disagree. :data:`ENV_KEYS` first, then any other key."""
    labels = run_labels(runs)
    envs = {labels[r.name]: results.read_manifest(r).get("environment", {}) for r in runs}
    keys = [k for k in ENV_KEYS if any(k in e for e in envs.values())]
    keys += sorted({k for e in envs.values() for k in e} - set(keys))
    df = pd.DataFrame({lab: [e.get(k) for k in keys] for lab, e in envs.items()}, index=keys)
    df["differs"] = [len({json.dumps(v, sort_keys=True, default=str) for v in row}) > 1
                     for row in df.itertuples(index=False)]
    return df.rename_axis("key").reset_index()


def _env_table_html(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p class='meta'>(no environment recorded)</p>"
    cols = [c for c in df.columns if c != "differs"]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    rows = []
    for _, r in df.iterrows():
        cls = " class='diff'" if r["differs"] else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_fmt(r[c]))}</td>" for c in cols) + "</tr>")
    return (f"<p class='meta'>Highlighted rows differ between runs.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _figure_names(run: Path) -> list[str]:
    """The run's figure names in saving order (the manifest's ``figures``, then any other saved one); a manifest
    name that is not a plain file name (:func:`workbench.run.results.safe_name`: ``../..``) is never read."""
    manifest = results.read_manifest(run)
    listed = manifest.get("figures", [])
    names = [n for n in (listed if isinstance(listed, list) else []) if results.safe_name(n)]
    return names + sorted(p.stem for p in (run / "figures").glob("*.json") if p.stem not in names)


def _run_style(i: int, types: set[str]) -> str:
    """How the ``i``-th run's traces are told apart in an overlaid figure of trace ``types`` (for its subtitle)."""
    if types <= {"scatter", "scattergl"}:
        return _DASH_WORDS[i % len(_DASH_WORDS)]
    if types <= {"bar", "histogram"}:
        return ["plain", "hatched /", "hatched x", "dotted"][i % 4]
    return f"group {i + 1} at each x"


def _colour(trace, colour: str) -> None:
    """Give ``trace`` one colour (its line, markers, box or bar fill)."""
    if trace.type in ("scatter", "scattergl"):
        trace.update(line_color=colour, marker_color=colour)
    else:
        trace.update(marker_color=colour)
        if trace.type == "box":
            trace.update(line_color=colour)


def overlay_figures(runs: list[Path]) -> list[tuple[str, list]]:
    """The runs' figures grouped by name: ``(name, [figure, ...])``.

    Figures whose traces are all cartesian (scatter, bar, box, ...) become one figure with every
    run's traces (legend ``A (suffix) · trace``, one dash / marker symbol per run); others (tables)
    stay one figure per run.
    """
    import plotly.graph_objects as go

    labels = run_labels(runs)
    order: list[str] = []
    for run in runs:
        order += [n for n in _figure_names(run) if n not in order]
    out = []
    for name in order:
        figs = [(run, pio.from_json((run / "figures" / f"{name}.json").read_text()))
                for run in runs if (run / "figures" / f"{name}.json").exists()]
        types = {t.type for _, f in figs for t in f.data}
        if len(figs) < 2 or not types <= _OVERLAY_TYPES:
            out.append((name, [f.update_layout(title_text=f"{labels[r.name]} · {f.layout.title.text or name}")
                               if len(runs) > 1 else f for r, f in figs]))
            continue
        base = go.Figure(layout=figs[0][1].layout)
        # one series a run (a single curve, a single box): the runs differ by colour too, not by dash alone
        by_run_colour = all(len(f.data) == 1 for _, f in figs)
        for i, (run, fig) in enumerate(figs):
            lab = labels[run.name]
            for tr in fig.data:
                invalid = tr.name == plots.INVALID_NAME     # the grey crosses keep their look in every run
                tr.name = f"{lab} · {tr.name}" if tr.name else lab
                tr.legendgroup = lab
                tr.showlegend = tr.showlegend is not False    # shown, unless the run's figure hid a repeat entry
                if invalid:
                    base.add_trace(tr)
                    continue
                if by_run_colour:
                    _colour(tr, _RUN_COLOURS[i % len(_RUN_COLOURS)])
                if tr.type in ("scatter", "scattergl"):
                    tr.update(line_dash=_DASHES[i % len(_DASHES)], marker_symbol=_SYMBOLS[i % len(_SYMBOLS)])
                else:  # bar, box, violin, histogram: side by side per run; bars also hatched per run
                    tr.update(offsetgroup=f"{lab}{tr.offsetgroup or ''}")
                    if tr.type in ("bar", "histogram"):
                        tr.update(marker_pattern_shape=["", "/", "x", "."][i % 4])
                base.add_trace(tr)
        title = figs[0][1].layout.title.text or name
        styles = ", ".join(f"{labels[r.name].split(' ')[0]} {_run_style(i, types)}" for i, (r, _) in enumerate(figs))
        # the run's title wrapped (plotly runs a long one past the right edge), then how the runs are told apart;
        # the legend shown (a one-trace figure's own layout hides it) and below, in the figure's container (a legend
        # at a negative paper y inherited a container yref from the run's figure and fell outside the image): its
        # rows, the longer trace names of several runs, get the bottom margin they need
        wrapped = plots.wrap_title(title)
        lines = wrapped.count("<br>") + 2        # the title's lines and the subtitle, centred in the top margin
        base.update_layout(title=dict(text=f"{wrapped}<br><sup>runs overlaid: {styles}</sup>", y=None),
                           showlegend=True, margin=dict(t=40 + 24 * lines + (20 if base.layout.annotations else 0)))
        names = sum(len(t.name or "") + 6 for t in base.data)
        plots.legend_below(base, bottom=40 + 22 * max(1, -(-names * 7 // 1000)))
        if "box" in types:
            base.update_layout(boxmode="group")
        out.append((name, [base]))
    return out


def _export_many(runs: list[Path], out: Path, metrics: list[str] | None = None) -> dict[str, Path]:
    """Combined export of several runs next to a comparison page: ``<stem>.requests.csv`` / ``.points.json``."""
    req = [results.read_requests(r).assign(run_id=r.name) for r in runs]
    req = [d for d in req if not d.empty]
    paths = {"requests_csv": out.with_name(out.stem + ".requests.csv"),
             "points_json": out.with_name(out.stem + ".points.json")}
    write_csv(paths["requests_csv"], pd.concat(req, ignore_index=True) if req else pd.DataFrame())
    runs_json = []
    for r in runs:
        m = results.read_manifest(r)
        pts = results.read_points(r)
        runs_json.append({"run_id": r.name, "environment": m.get("environment"), "experiments": m.get("experiments"),
                          "points": json.loads(pts.to_json(orient="records", default_handler=str)) if not pts.empty else []})
    deltas = compare_points(runs, metrics)
    write_text(paths["points_json"], json.dumps(
        {"runs": runs_json, "deltas": json.loads(deltas.to_json(orient="records")) if not deltas.empty else []},
        indent=2, default=str))
    return paths


def _rel(target: Path, base: Path) -> str:
    import os

    return os.path.relpath(target, base).replace(os.sep, "/")


def _downloads(paths: dict[str, Path], page_dir: Path, label: str = "") -> str:
    links = "".join(f"<a href='{html.escape(_rel(p, page_dir))}'>{html.escape(label + p.name)}</a>"
                    for p in paths.values())
    return f"<p class='downloads meta'>Data: {links}</p>"


def build_report(run_dirs, out: str | Path | None = None, figures=None, price_per_hour=None) -> Path:
    """Write a self-contained HTML report, and export the data as CSV / JSON
    (:func:`workbench.share.csv_export.export`).

    A one-run report also writes into the run (:func:`_share_run`): ``metrics.json``
    (:mod:`workbench.share.run_summary`), the interactivity Pareto figure and cost columns (:mod:`workbench.share.cost`), and
    every figure as ``figures/NAME.png`` / ``.svg`` (:mod:`workbench.share.static_figures`; where no renderer is
    present, a one-line reason and the HTML figures alone).

    Args:
        run_dirs: one run folder, or a list (a comparison report).
        out: output file; default ``<run>/report.html`` for one run, and
            ``<results>/comparisons/compare-<id>.html`` for several. A comparison writes only its
            output (the page and ``<stem>.requests.csv`` / ``<stem>.points.json`` beside it), never
            into the runs it compares.
        figures: static formats for a one-run report (``"png,svg,pdf"``, a list, or ``"none"``); default
            ``$WORKBENCH_FIGURES`` else :data:`DEFAULT_FIGURE_FORMATS`.
        price_per_hour: USD per device-hour for the cost columns of a one-run report (recorded in the
            manifest); default: the price the run recorded, if any.

    Returns:
        The report path.

    Raises:
        ParameterError: the output would be written into one of the compared runs, or through a symlink
            out of the results folder; an unknown figure format or a negative price.
    """
    from workbench.share import cost, static_figures

    static_figures.parse_formats(figures if figures is not None else "")   # bad input: refused before any write
    cost.check_price(price_per_hour)
    runs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(r) for r in run_dirs]
    if out is None:
        out = (runs[0] / "report.html" if len(runs) == 1
               else results.results_root() / "comparisons" / f"compare-{results.new_run_id()}.html")
    out = Path(out)
    if len(runs) > 1:
        inside = [r for r in runs if out.resolve().parent == r.resolve() or r.resolve() in out.resolve().parents]
        if inside:
            raise ParameterError(f"output: {out} is inside the compared run {inside[0]}; a comparison never "
                                 "writes into its inputs (choose another -o)")
    results.check_write_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    share_note = ""
    if len(runs) == 1:
        share_note = _share_run(runs[0], figures, price_per_hour)
        exports = {runs[0]: export(runs[0])}
    else:   # link each run's own exports where they exist; write nothing into the runs
        exports = {r: {k: r / name for k, name in (("requests_csv", "requests.csv"), ("points_json", "points.json"))
                       if (r / name).is_file()} for r in runs}
    title = f"Workbench report: {runs[0].name}" if len(runs) == 1 else f"Workbench comparison of {len(runs)} runs"
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='meta'>built {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}. "
            "Latencies in seconds; throughput in tokens/s; goodput in requests/s meeting the SLO.</p>"]
    if len(runs) == 1:
        body.append(summary_html(runs[0]))
        body.append(_downloads(exports[runs[0]], out.parent))
        if share_note:
            body.append(f"<p class='meta'>{html.escape(share_note)}</p>")
        body.append(_run_section(runs[0], page_dir=out.parent))
    else:
        labels = run_labels(runs)
        body.append("<ul>" + "".join(f"<li><b>{html.escape(labels[r.name])}</b>: {html.escape(str(r))}</li>"
                                     for r in runs) + "</ul>")
        from workbench.share import comparability, cross_tool

        check, left_out = comparability.comparability(runs)
        body.append(_downloads(_export_many(runs, out, comparability.comparable_metrics(left_out)), out.parent,
                               "all runs: "))
        body += [comparability.table_html(check), cross_tool.cross_tool_html(cross_tool.cross_tool(runs)),
                 "<h2>Headline deltas (vs the first run with points)</h2>",
                 "<p class='meta'>Per point: median TTFT (ttft_s_p50), p99 TTFT, output throughput and goodput, "
                 "those the comparability check above keeps; Δ is the relative change vs the first run with "
                 "points (A unless A has none). Runs without points take no part. Points missing "
                 "from a run are blank there.</p>",
                 _delta_table_html(compare_points(runs, comparability.comparable_metrics(left_out)), runs),
                 "<h2>Environments</h2>", _env_table_html(environments(runs)),
                 "<h2>Figures, runs overlaid</h2>"]
        for name, figs in overlay_figures(runs):
            for i, fig in enumerate(figs):
                div = pio.to_html(fig, full_html=False, include_plotlyjs=False, default_width="100%")
                body.append(f"<div class='figure' id='fig-{html.escape(name)}{'-' + str(i) if i else ''}'>{div}</div>")
        for r in runs:
            body.append(_run_section(r, with_figures=False, label=labels[r.name], page_dir=out.parent))
            if exports[r]:
                body.append(_downloads(exports[r], out.parent))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body>{''.join(body)}</body></html>")
    write_text(out, page)
    return out


@dataclasses.dataclass
class CompareConfig:
    """Parameters of ``notebooks/90_compare_runs``.

    Attributes:
        runs: run folders or globs (``results/2026*``); empty: the two newest runs with points.
        experiment: restrict to one experiment ("" for all).

    Raises:
        ParameterError: not a list of strings, or a path that is not a run folder.
    """

    runs: list = dataclasses.field(default_factory=list)
    experiment: str = ""

    def __post_init__(self):
        if not isinstance(self.runs, list) or not all(isinstance(r, str) for r in self.runs):
            raise ParameterError(f"runs: must be a list of run folders (got {self.runs!r})")
        for r in self.run_dirs() if self.runs else []:
            if not (r / "manifest.json").exists():
                raise ParameterError(f"runs: {str(r)!r} is not a run folder (no manifest.json)")
        if not isinstance(self.experiment, str):
            raise ParameterError(f"experiment: must be a string (got {self.experiment!r})")

    @classmethod
    def from_namespace(cls, ns: dict):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in ns.items() if k in names})

    def run_dirs(self) -> list[Path]:
        """The runs to compare, in the given order (globs sorted); default: the two newest with points.

        Raises:
            ParameterError: fewer than two runs found.
        """
        if self.runs:
            found = results.expand_runs(self.runs)
        else:
            found = sorted(p.parent for p in results.results_root().glob("*/points.parquet"))[-2:]
        if len(found) < 2:
            raise ParameterError(f"runs: need at least two runs to compare (found {len(found)})")
        return found
