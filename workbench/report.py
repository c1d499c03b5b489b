"""A self-contained HTML report of one run, or a comparison of several.

``build_report(run_dir)`` writes ``<run_dir>/report.html``: the run's
environment, each experiment's configuration and point table (failed points
flagged), and every figure the notebooks saved (``figures/*.json``, in saved
order), interactive, with plotly.js embedded once (plotly
``doc/python/interactive-html-export.md``). It opens offline in any browser.
Given several runs, it writes one comparison page with each run's figures
and a table of headline deltas per matching point.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
from pathlib import Path

import pandas as pd
import plotly.io as pio
import plotly.offline

from . import results

HEADLINE = ["ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "output_throughput_tps", "goodput_rps"]
_POINT_COLUMNS = ["point_id", "status", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50",
                  "output_throughput_tps", "request_throughput_rps", "goodput_rps", "mbu", "mfu"]

_CSS = """
body{font-family:Inter,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{font-size:1.6rem} h2{border-bottom:1px solid #ddd;padding-bottom:.3rem;margin-top:2.5rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1rem} td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f5f5f5} td:first-child,th:first-child{text-align:left}
.failed{background:#fde8e8} .figure{margin:1rem 0 2rem} .meta{color:#666;font-size:.9rem}
details{margin:.5rem 0}
"""


def _table(df: pd.DataFrame, failed_col: str | None = "status") -> str:
    if df.empty:
        return "<p class='meta'>(none)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        cls = " class='failed'" if failed_col in df and str(r[failed_col]).startswith("failed") else ""
        cells = "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r)
        rows.append(f"<tr{cls}>{cells}</tr>")
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
    manifest = results.read_manifest(run)
    names = list(manifest.get("figures", []))
    names += sorted(p.stem for p in (run / "figures").glob("*.json") if p.stem not in names)
    out = []
    for name in names:
        path = run / "figures" / f"{name}.json"
        if path.exists():
            fig = pio.from_json(path.read_text())
            out.append((name, pio.to_html(fig, full_html=False, include_plotlyjs=False, default_width="100%")))
    return out


def _run_section(run: Path, with_figures: bool = True) -> str:
    manifest = results.read_manifest(run)
    points = results.read_points(run)
    parts = [f"<h2>Run {html.escape(run.name)}</h2>",
             f"<p class='meta'>created {html.escape(str(manifest.get('created_utc')))} · "
             f"status {html.escape(str(manifest.get('status')))}</p>",
             "<details open><summary>Environment</summary>", _kv_table(manifest.get("environment", {})), "</details>"]
    for exp, meta in manifest.get("experiments", {}).items():
        parts.append(f"<h3>Experiment: {html.escape(exp)}</h3>")
        if meta.get("config"):
            parts += ["<details><summary>Configuration</summary>", _kv_table(meta["config"]), "</details>"]
        if not points.empty and "experiment" in points:
            pts = points[points["experiment"] == exp]
            cols = [c for c in _POINT_COLUMNS if c in pts]
            parts.append(_table(pts[cols]))
    notebooks = sorted((run / "notebooks").glob("*.ipynb"))
    if notebooks:
        links = "".join(f"<li><a href='notebooks/{html.escape(n.name)}'>{html.escape(n.name)}</a></li>" for n in notebooks)
        parts.append(f"<p class='meta'>Executed notebooks:</p><ul>{links}</ul>")
    if with_figures:
        for name, div in _figures(run):
            parts.append(f"<div class='figure' id='fig-{html.escape(name)}'>{div}</div>")
    return "\n".join(parts)


def compare_points(runs: list[Path]) -> pd.DataFrame:
    """Headline metrics of points present in every run, side by side, with relative change vs the first run.

    Returns:
        One row per ``point_id``: ``<metric>@<run_id>`` columns and
        ``<metric> change`` (fraction, last run vs first).
    """
    frames = []
    for run in runs:
        pts = results.read_points(run)
        if pts.empty:
            continue
        pts = pts[pts["status"] == "ok"].set_index("point_id")
        frames.append(pts[[c for c in HEADLINE if c in pts]].add_suffix(f"@{run.name}"))
    if len(frames) < 2:
        return pd.DataFrame()
    table = pd.concat(frames, axis=1, join="inner")
    first, last = runs[0].name, runs[-1].name
    for m in HEADLINE:
        a, b = f"{m}@{first}", f"{m}@{last}"
        if a in table and b in table:
            table[f"{m} change"] = table[b] / table[a] - 1
    return table.reset_index()


def build_report(run_dirs, out: str | Path | None = None) -> Path:
    """Write a self-contained HTML report.

    Args:
        run_dirs: one run folder, or a list (a comparison report).
        out: output file; default ``<run>/report.html`` for one run, and
            ``<first run>/compare.html`` for several.

    Returns:
        The report path.
    """
    runs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(r) for r in run_dirs]
    if out is None:
        out = runs[0] / ("report.html" if len(runs) == 1 else "compare.html")
    out = Path(out)
    title = f"Workbench report: {runs[0].name}" if len(runs) == 1 else f"Workbench comparison of {len(runs)} runs"
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='meta'>built {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}. "
            "Latencies in seconds; throughput in tokens/s; goodput in requests/s meeting the SLO.</p>"]
    if len(runs) > 1:
        body += ["<h2>Headline deltas</h2>", _table(compare_points(runs), failed_col=None)]
    body += [_run_section(r) for r in runs]
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script type='text/javascript'>{plotly.offline.get_plotlyjs()}</script>"
            f"</head><body>{''.join(body)}</body></html>")
    out.write_text(page, encoding="utf-8")
    return out
