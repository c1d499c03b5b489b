import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.share import plots


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


def test_a_legend_beside_a_long_title_goes_below_the_plot():
    """The prefix-sharing figure: an 81-character title and two 20-character entries ran into each other."""
    title = "Prefix sharing: cache hit rate vs TTFT saved (sharing on vs off, paired by request)"

    def fig_with(t):
        fig = go.Figure(go.Scatter(x=[0.6], y=[0.2], name="multiturn (6 pairs)"))
        fig.add_scatter(x=[0.7], y=[0.5], name="shared_prefix (5 pairs)")
        return fig.update_layout(title=t)

    assert plots.legend_is_below(plots.tidy_legend(fig_with(title)))
    assert not plots.legend_is_below(plots.tidy_legend(fig_with("Prefix sharing")))


def test_split_by_device_tidies_the_legend_of_each_figure():
    @plots.split_by_device
    def figures(points):
        return {"two": _two_panel(["a", "b"])}

    out = figures(pd.DataFrame({"x": [1]}))
    assert plots.legend_is_below(out["two"])


def _experiment_modules():
    import importlib
    import pkgutil

    import workbench.experiments as pkg

    return {m.name: importlib.import_module(f"workbench.experiments.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)}


# the explorer draws into one live widget (explorer_figure / update_figure), not a saved set of figures
INTERACTIVE_ONLY = {"explorer"}


def test_every_experiment_figure_goes_through_the_tidy_legend():
    """Each experiment's real ``figures`` (what the notebooks save) is wrapped by :func:`plots.split_by_device`,
    which draws each device type apart and passes every figure through :func:`plots.tidy_legend`."""
    wrapper_code = plots.split_by_device(lambda: {}).__code__
    modules = _experiment_modules()
    assert len(modules) >= 11
    missing = sorted(n for n, m in modules.items() if n not in INTERACTIVE_ONLY and not hasattr(m, "figures"))
    assert not missing, f"experiments without figures(): {missing}"
    bare = sorted(n for n, m in modules.items() if hasattr(m, "figures") and m.figures.__code__ is not wrapper_code)
    assert not bare, f"figures() not decorated with plots.split_by_device in {bare}"



def test_a_table_figure_is_sized_to_show_every_row_and_says_why_it_is_empty():
    """The serving recommendation's PNG showed 2 of its 7 rows under clipped headers (plotly's default 500 px), and
    the scheduling one an empty table with no reason."""
    from workbench.share.plots import table_figure

    rows = pd.DataFrame({"slo": [f"preset_{i}" for i in range(7)], "max_rate_rps": [1.5] * 7,
                         "verdict": ["met: one-sided 95% lower bound of attainment 0.93 >= 0.9 over 80 requests"] * 7})
    fig, few = table_figure(rows, "t"), table_figure(rows.head(2), "t")
    assert fig.layout.height > few.layout.height and fig.layout.meta["table_width_px"] >= 700
    assert fig.layout.width is None   # in a page it fills its column (a fixed width ran past the report's window)
    assert list(fig.data[0].cells.values[0]) == list(rows["slo"])   # every row is in the table
    assert fig.layout.height >= 130 + 7 * 26                         # and the figure is tall enough for them
    empty = table_figure(rows.iloc[:0], "t", empty_reason="no usable fcfs run of the mixed workload")
    assert not empty.data and "no rows: no usable fcfs run" in empty.layout.annotations[0].text


def test_the_house_template_is_plotly_white_with_the_house_layout_merged_once():
    """The default is a registered name, not ``"plotly_white+workbench"`` (merged again at every lookup); a
    figure's template is plotly_white's with the house font, colours and legend over it."""
    import plotly.io as pio

    assert pio.templates.default == "workbench" and "+" not in pio.templates.default
    layout = go.Figure(go.Scatter(x=[1], y=[1])).layout.template.layout
    white = pio.templates["plotly_white"].layout
    assert layout.plot_bgcolor == white.plot_bgcolor and layout.xaxis.gridcolor == white.xaxis.gridcolor
    assert layout.font.family.startswith("Inter") and layout.font.size == 13
    assert list(layout.colorway) == list(plots.px.colors.qualitative.Safe)
    assert layout.legend.orientation == "h" and layout.hovermode == "closest"


def test_a_long_title_is_wrapped_and_its_own_breaks_kept():
    text = plots.wrap_title("a " * 80 + "<br><sup>kept</sup>", 40)
    lines = text.split("<br>")
    assert lines[-1] == "<sup>kept</sup>" and all(len(line) <= 40 for line in lines[:-1]) and len(lines) == 5
    assert plots.wrap_title("short") == "short"
