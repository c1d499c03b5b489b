import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import plots


def _two_panel(names):
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT"))
    for i, n in enumerate(names):
        fig.add_scatter(x=[1, 2], y=[i, i + 1], name=n, row=1, col=1 + i % 2)
    return fig


def test_a_legend_that_would_cover_subplot_titles_goes_below_the_plot():
    fig = plots.tidy_legend(_two_panel(["fifo TTFT p50", "static TTFT p50", "continuous TPOT p50"]))
    assert plots.legend_is_below(fig)


def test_a_short_legend_on_a_single_plot_stays_where_the_template_puts_it():
    fig = go.Figure(go.Scatter(x=[1], y=[1], name="128"))
    fig.add_scatter(x=[1], y=[2], name="512")
    assert plots.tidy_legend(fig).layout.legend.y is None


def test_every_experiment_figure_goes_through_the_tidy_legend():
    @plots.split_by_device
    def figures(points):
        return {"two": _two_panel(["a", "b"])}

    out = figures(pd.DataFrame({"x": [1]}))
    assert plots.legend_is_below(out["two"])
