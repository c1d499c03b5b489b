"""Static figures: PNG / SVG / PDF beside the HTML ones at the paper-column size; a one-line reason without a renderer."""
import html
import struct

import plotly.graph_objects as go
import pytest

from tests.share.test_report import fake_point, make_run
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import plots, report, static_figures


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(static_figures.renderer_problem() is not None, reason=str(static_figures.renderer_problem()))
def test_every_figure_as_png_svg_pdf_at_the_column_size():
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    report.build_report(run, figures="png,svg,pdf")
    names = static_figures.figure_names(run)
    assert names
    for name in names:
        assert (run / "figures" / f"{name}.html").is_file()
        width, height = _png_size(run / "figures" / f"{name}.png")
        assert width == round(static_figures.COLUMN_IN * static_figures.DPI)     # 3.5 in at 300 dpi
        svg = (run / "figures" / f"{name}.svg").read_text()
        assert svg.lstrip().startswith("<svg") and f'width="{static_figures.WIDTH_PX}"' in svg
        assert (run / "figures" / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    assert not list((run / "figures").glob(".static-*"))                       # no temporary folder left


@pytest.mark.skipif(static_figures.renderer_problem() is not None, reason=str(static_figures.renderer_problem()))
def test_the_export_goes_figure_by_figure_under_a_bar_and_a_renderer_stop_keeps_the_figures_before(monkeypatch,
                                                                                                       capsys):
    """One browser session, one ``write_images`` call a figure (all its formats): a progress bar counts the images,
    and a renderer that stops on the second figure leaves the first figure's files in place (none partial) and
    returns one line."""
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    report.build_report(run)
    results.save_figure(run, "second", go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="a")))
    names = static_figures.figure_names(run)
    assert len(names) >= 2
    calls, real = [], static_figures.pio.write_images

    def stops_on_the_second(figs, paths, **kw):
        calls.append([p.name for p in paths])
        if len(calls) == 2:
            raise RuntimeError("browser went away\nits traceback")
        return real(figs, paths, **kw)

    monkeypatch.setattr(static_figures.pio, "write_images", stops_on_the_second)
    written, problem = static_figures.write_static(run, "png,svg")
    assert calls == [[f"{names[0]}.png", f"{names[0]}.svg"], [f"{names[1]}.png", f"{names[1]}.svg"]]
    assert problem == "static figures failed: RuntimeError: browser went away"
    assert sorted(p.name for p in written) == [f"{names[0]}.png", f"{names[0]}.svg"]
    assert all(p.stat().st_size > 0 for p in written)
    assert not (run / "figures" / f"{names[1]}.png").exists() and not list((run / "figures").glob(".static-*"))
    assert "static figures" in capsys.readouterr().err                      # the progress bar


def test_without_a_renderer_one_line_and_the_html_figures_still_written(monkeypatch, capsys):
    monkeypatch.setattr(static_figures, "_browser", lambda: None)
    run = make_run([fake_point(batch_size=1)])
    out = report.build_report(run, figures="png,svg")
    reason = static_figures.renderer_problem()
    assert reason and "\n" not in reason and "static figures skipped" in reason
    assert reason in capsys.readouterr().err and html.escape(reason) in out.read_text()
    assert list((run / "figures").glob("*.html")) and not list((run / "figures").glob("*.png"))


def test_unknown_format_is_refused_before_anything_is_written():
    run = make_run([fake_point(batch_size=1)])
    with pytest.raises(ParameterError, match="--figures: unknown format 'jpeg'"):
        report.build_report(run, figures="png,jpeg")
    assert not (run / "report.html").exists() and not (run / "metrics.json").exists()


def test_one_colour_per_engine_across_figures():
    a = go.Figure([go.Scatter(x=[1], y=[1], name="fifo"), go.Scatter(x=[1], y=[2], name="continuous")])
    b = go.Figure([go.Scatter(x=[1], y=[1], name="continuous TTFT p50"), go.Bar(x=[1], y=[1], name="fifo")])
    invalid = go.Scatter(x=[1], y=[1], name="invalid (greyed)", marker=dict(color="#999"))
    b.add_trace(invalid)
    plots.consistent_colours(a), plots.consistent_colours(b)
    assert a.data[0].marker.color == b.data[1].marker.color == plots.COLOUR_MAP["fifo"]
    assert a.data[1].marker.color == b.data[0].marker.color == plots.COLOUR_MAP["continuous"]
    assert b.data[2].marker.color == "#999"                                       # explicit colours kept
    assert plots.colour_for("some config") == plots.colour_for("some config")     # stable for unknown names


def test_a_table_keeps_the_size_it_was_laid_out_for():
    """Squeezed into the paper column (504 px), the scheduling recommendation's 19 columns showed two letters each;
    a table keeps its own width and height (every row, whole headers), a plot still gets the column."""
    import pandas as pd

    table = plots.table_figure(pd.DataFrame({f"column_{i}_ratio_low": [0.95, 1.1] for i in range(19)}), "wide")
    out, w, h = static_figures.paper_figure(table)
    assert (w, h) == (table.layout.meta["table_width_px"], table.layout.height) and w > static_figures.WIDTH_PX
    plot = go.Figure(go.Scatter(x=[1, 2], y=[1, 2]), layout=dict(width=1400, title="a plot"))
    assert static_figures.paper_figure(plot)[1] == static_figures.WIDTH_PX


def test_a_one_entry_colour_key_goes_under_the_plot():
    """Notebook 01's decode-speed boxes at one prompt length: plotly express's key ("prompt tokens" / "128") stayed
    at the top of the paper figure and sat on its title; two entries already went below, a lone unnamed trace has
    no legend to move."""
    import pandas as pd
    import plotly.express as px

    df = pd.DataFrame({"batch_size": [1, 1, 2, 2], "decode_tps": [17.0, 18.0, 11.0, 11.5], "prompt_tokens": ["128"] * 4})
    boxes = px.box(df, x="batch_size", y="decode_tps", color="prompt_tokens", title="Per-request decode speed")
    assert plots.legend_is_below(static_figures.paper_figure(boxes)[0])
    lone = go.Figure(go.Scatter(x=[1, 2], y=[1, 2]), layout=dict(title="a plot"))
    assert not plots.legend_is_below(static_figures.paper_figure(lone)[0])
