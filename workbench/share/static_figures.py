"""Every figure of a run also as PNG, SVG and PDF, sized for a paper column, beside the HTML ones.

``write_static(run_dir, formats)`` reads each saved figure (``figures/NAME.json``) and writes
``figures/NAME.png`` / ``.svg`` / ``.pdf`` with plotly's static export: Kaleido 1.x (plotly
``doc/python/static-image-export.md``) driving a local Chromium (Debian's ``chromium``, which ``make system``
installs); nothing is downloaded. All of a run's figures go through one browser session (Kaleido's sync server),
figure by figure under a progress bar.

Paper layout (:data:`WIDTH_PX` x :data:`HEIGHT_PX` CSS pixels, fonts :data:`FONT_PX`): set 3.5 in wide (one
column of a two-column paper) the text is 7 pt; the PNG is rendered at :data:`DPI` dpi for that width. Titles
longer than a line are wrapped, the legend goes under the plot, and every engine / configuration takes its
house colour (:func:`workbench.share.plots.consistent_colours`), so one engine has one colour across figures.

Where no renderer is present (Kaleido not installed, no Chromium found) :func:`renderer_problem` says why in
one line, nothing is written, and the HTML figures stay as they are. Each figure's files are rendered into a
temporary folder and moved into place once rendered, so an interrupted export keeps the figures done before it and
leaves no half-written image.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import plotly.io as pio
from tqdm.auto import tqdm

from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import plots

FORMATS = results.STATIC_FIGURE_FORMATS
#: Paper column: 3.5 in at 300 dpi.
COLUMN_IN = 3.5
DPI = 300
WIDTH_PX = 504
HEIGHT_PX = 378
FONT_PX = 14
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def parse_formats(text) -> tuple[str, ...]:
    """``"png,svg"`` (or a list) -> ``("png", "svg")``; ``""`` / ``"none"`` -> ``()``.

    Raises:
        ParameterError: a format other than png, svg, pdf.
    """
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in (str(i).strip().lower() for i in items):
        if not item or item == "none":
            continue
        if item not in FORMATS:
            raise ParameterError(f"--figures: unknown format {item!r} (allowed: {', '.join(FORMATS)}, or none)")
        if item not in out:
            out.append(item)
    return tuple(out)


def _browser() -> str | None:
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    for name in _BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def renderer_problem() -> str | None:
    """Why static figures cannot be written here, in one line; None when Kaleido and a Chromium are present."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "static figures skipped: kaleido is not installed (pip install 'kaleido>=1.0')"
    if _browser() is None:
        return ("static figures skipped: no Chromium found for Kaleido (make system installs Debian's chromium; "
                "or set BROWSER_PATH)")
    return None


def _wrap(title: str, width: int = 58) -> str:
    if not title or "<br>" in title or len(title) <= width:
        return title
    return "<br>".join(textwrap.wrap(title, width))


def paper_figure(fig):
    """A copy of ``fig`` laid out for a paper column: fixed size, readable fonts, wrapped title, legend
    below the plot when it has several entries, house colours per engine / configuration. A table keeps its own
    size (a wide table is a page-wide figure; the PNG keeps the column's dots per CSS pixel).

    Returns:
        ``(figure, width_px, height_px)``.
    """
    import plotly.graph_objects as go

    out = go.Figure(fig)
    if out.data and all(t.type == "table" for t in out.data):
        # a table keeps the size it was laid out for (:func:`workbench.share.plots.table_figure`: every row, headers
        # whole): squeezed into a paper column, 19 columns showed two letters each
        meta = out.layout.meta if isinstance(out.layout.meta, dict) else {}
        w = int(out.layout.width or meta.get("table_width_px") or WIDTH_PX)
        h = int(out.layout.height or HEIGHT_PX)
        out.update_layout(width=w, height=h, autosize=False)
        return out, w, h
    plots.consistent_colours(out)
    height = HEIGHT_PX
    if out.layout.height and out.layout.height > 500:  # stacked panels (one per device type): keep them legible
        height = min(int(out.layout.height * 0.75), 3 * HEIGHT_PX)
    title = out.layout.title.text if out.layout.title else None
    lines = 1 + (_wrap(title or "").count("<br>") if title else 0)
    # subplot titles sit on the top panel's edge: the figure title goes one line above them
    lift = 22 if any(a.yref == "paper" and (a.y or 0) >= 0.99 for a in out.layout.annotations) else 0
    out.update_layout(width=WIDTH_PX, height=height, autosize=False,
                      font=dict(size=FONT_PX), title=dict(text=""),
                      margin=dict(l=60, r=20, t=16 + 20 * lines + lift if title else 15 + lift, b=50))
    if title:  # the title as an annotation: a wrapped block whose bottom sits on the plot's top (a multi-line
        # plotly title grows downward into the plot)
        out.add_annotation(text=_wrap(title), x=0, xref="paper", xanchor="left", y=1, yref="paper", yanchor="bottom",
                           yshift=6 + lift, showarrow=False, align="left", font=dict(size=FONT_PX + 1))
    out.update_xaxes(automargin=True, title_font=dict(size=FONT_PX), tickfont=dict(size=FONT_PX - 2))
    out.update_yaxes(automargin=True, title_font=dict(size=FONT_PX), tickfont=dict(size=FONT_PX - 2))
    shown = [t for t in out.data if t.name and t.showlegend is not False]
    # a one-entry legend with a title (plotly express's colour key, e.g. "prompt tokens: 128") is drawn too, and at
    # the top it sat on the title
    if len(shown) >= 2 or (shown and (out.layout.showlegend or out.layout.legend.title.text)):
        plots.legend_below(out, bottom=40)
        out.update_layout(legend=dict(font=dict(size=FONT_PX - 2)))
    return out, WIDTH_PX, height


def figure_names(run_dir) -> list[str]:
    """The run's figure names in report order (``manifest["figures"]``, then any other ``figures/*.json``)."""
    run = Path(run_dir)
    names = list(results.read_manifest(run).get("figures", []))
    return names + sorted(p.stem for p in (run / "figures").glob("*.json") if p.stem not in names)


def write_static(run_dir, formats=("png", "svg"), names: list[str] | None = None,
                 progress: bool = True) -> tuple[list[Path], str | None]:
    """Write each figure of a run as ``figures/NAME.<format>`` beside ``NAME.html``.

    Args:
        run_dir: the run folder.
        formats: any of :data:`FORMATS` (a string ``"png,svg"`` is parsed).
        names: the figures to write (default: all, :func:`figure_names`).
        progress: a progress bar on stderr, an image a step.

    Returns:
        ``(paths written, problem)``: ``problem`` is None, or the one-line reason nothing was written
        (no renderer) or why the export stopped (the files written before it stay; none is partial).

    Raises:
        ParameterError: an unknown format.
    """
    formats = parse_formats(formats) if isinstance(formats, str) else parse_formats(list(formats))
    run = Path(run_dir)
    names = figure_names(run) if names is None else names
    if not formats or not names:
        return [], None
    problem = renderer_problem()
    if problem:
        return [], problem
    figs_dir = results.check_write_target(run / "figures")
    for logger in ("kaleido", "choreographer"):  # their INFO lines (tabs, temp folders) would fill a run's log
        if logging.getLogger(logger).level == logging.NOTSET:
            logging.getLogger(logger).setLevel(logging.WARNING)
    if "BROWSER_PATH" not in os.environ:
        os.environ["BROWSER_PATH"] = _browser()
    jobs: dict[str, list] = {}
    for name in names:
        src = figs_dir / f"{name}.json"
        if not src.is_file():
            continue
        fig, w, h = paper_figure(pio.from_json(src.read_text(encoding="utf-8")))
        jobs[name] = [(fmt, fig, w, h) for fmt in formats]
    written: list[Path] = []
    with tempfile.TemporaryDirectory(dir=figs_dir, prefix=".static-") as tmp, contextlib.ExitStack() as browser:
        tmp = Path(tmp)
        try:
            browser.enter_context(_one_browser())
        except Exception as exc:  # noqa: BLE001 - a browser that cannot start: one line, nothing written
            return written, _failed(exc)
        bar = tqdm(total=sum(len(j) for j in jobs.values()), desc="static figures", unit="image", file=sys.stderr,
                   mininterval=1.0, disable=not progress)
        for name, group in jobs.items():
            try:
                pio.write_images([g[1] for g in group], [tmp / f"{name}.{g[0]}" for g in group],
                                 format=[g[0] for g in group], width=[g[2] for g in group],
                                 height=[g[3] for g in group],
                                 scale=[DPI * COLUMN_IN / WIDTH_PX if g[0] == "png" else 1 for g in group])
            except Exception as exc:  # noqa: BLE001 - the renderer's own errors (browser crash, timeout): one line
                bar.close()
                return written, _failed(exc)
            for fmt, *_ in group:
                part = tmp / f"{name}.{fmt}"
                if part.is_file() and part.stat().st_size > 0:
                    target = results.check_write_target(figs_dir / f"{name}.{fmt}")
                    os.replace(part, target)
                    written.append(target)
            bar.update(len(group))
        bar.close()
    return written, None


def _failed(exc: BaseException) -> str:
    """The one line of an export the renderer stopped."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"static figures failed: {type(exc).__name__}: {first}"[:300]


@contextlib.contextmanager
def _one_browser():
    """Kaleido's sync server around an export (``kaleido.start_sync_server``, Kaleido 1.x): one browser session
    for every figure's ``pio.write_images`` call, so the export can go figure by figure (a progress bar, each
    figure's files in place once rendered) at about the cost of one batched call (results/LOG.md, 2026-12-07 night).
    Plotly's "kopts ignored" warning (its empty options, passed to a running server) is silenced."""
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
            yield
    finally:
        kaleido.stop_sync_server(silence_warnings=True)
