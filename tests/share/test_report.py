"""Reports: one run still builds; two runs with different parameter sets compare; CSV / JSON exports; the report
reads no path built from a manifest name (issue 36)."""
import json

import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.experiments import explorer
from workbench.run import results
from workbench.share import csv_export, findings, plots, report
from workbench.stats import metrics


def fake_point(ttfts=(0.1, 0.3), wall_s=1.0, **params) -> explorer.ExploredPoint:
    """Requests of 5 tokens each, TPOT exactly 0.1 s, so every summary value is known by hand."""
    reqs = [{"request_id": i, "repeat": 0, "prompt_tokens": 64, "output_tokens": 5, "ttft_s": t, "prefill_s": t / 2,
             "e2e_s": t + 0.4, "tpot_s": 0.1, "decode_tps": 10.0, "itl_s": [0.1] * 4, "finish_reason": "length",
             "text": "héllo, 世界"} for i, t in enumerate(ttfts)]
    cfg = explorer.Config(**params)
    s = metrics.summarize_point(pd.DataFrame(reqs), wall_s, cfg.slo_ttft_s, cfg.slo_tpot_s)
    return explorer.ExploredPoint(params=cfg.params(), requests=reqs, wall_s=wall_s, summary=s,
                                 resolved={"model": "fake", "device": "cpu", "dtype": "float32"})


def make_run(points, env=None, label=""):
    run = explorer.save_points("", points, label=label, config={"seed": 0})
    results.update_manifest(run, environment=env or {"device": "cpu", "dtype": "float32", "torch": "2.13.0"})
    return run


def test_one_run_report_and_exports():
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    out = report.build_report(run)
    assert out == run / "report.html"
    page = out.read_text()
    assert page.count("class='figure'") == 1 and "explorer_points" in page and "requests.csv" in page
    csv = pd.read_csv(run / "requests.csv")
    assert len(csv) == 4 and set(csv["batch_size"]) == {1, 2}
    assert json.loads(csv["itl_s"][0]) == [0.1] * 4 and csv["text"][0] == "héllo, 世界"
    summary = json.loads((run / "points.json").read_text())
    assert summary["run_id"] == run.name and summary["environment"]["torch"] == "2.13.0"
    by_batch = {p["batch_size"]: p for p in summary["points"]}
    assert by_batch[1]["output_throughput_tps"] == 10.0            # 2 x 5 tokens / 1 s
    assert by_batch[2]["output_throughput_tps"] == 5.0             # 10 tokens / 2 s
    assert by_batch[1]["ttft_s_p50"] == 0.2 and by_batch[1]["ttft_s_p99"] is None   # no p99 from 2 samples
    assert "ttft_s_p99" in by_batch[1]["percentile_note"]


def test_no_change_is_stated_against_an_invalid_point_or_a_zero(tmp_path):
    """A fresh user's compare of a run whose points were all invalid (other load) read "-81.9%" against them, and
    a goodput of 0 gave "+inf%": a change needs a valid point on both sides and a non-zero first value."""
    a = make_run([fake_point(batch_size=1), fake_point(batch_size=2)], label="a")
    b = make_run([fake_point(ttfts=(0.2, 0.6), wall_s=2.0, batch_size=1), fake_point(batch_size=2)], label="b")
    pts = results.read_points(a)
    pts["valid"] = pts["batch_size"] != 1                          # A's batch-1 point measured under other load
    pts.loc[pts["batch_size"] == 2, "goodput_rps"] = 0.0
    pts.to_parquet(a / "points.parquet")
    table = report.compare_points([a, b]).set_index(
        results.read_points(a).set_index("point_id")["batch_size"].reindex(report.compare_points([a, b])["point_id"]).values)
    assert table.loc[1, "invalid_in"] == "A" and table.loc[2, "invalid_in"] == ""
    assert pd.isna(table.loc[1, f"ttft_s_p50 change@{b.name}"])        # not +100 % against an invalid point
    assert table.loc[1, f"ttft_s_p50@{a.name}"] == 0.2                 # the values themselves stay shown
    assert pd.isna(table.loc[2, f"goodput_rps change@{b.name}"])       # 0 -> x: no ratio, not +inf %
    assert table.loc[2, f"ttft_s_p50 change@{b.name}"] == 0.0
    page = report.build_report([a, b], tmp_path / "cmp.html").read_text()
    assert "inf%" not in page


def test_compare_two_runs_with_different_parameter_sets(tmp_path):
    a = make_run([fake_point(batch_size=1), fake_point(batch_size=2)], label="a")
    b = make_run([fake_point(ttfts=(0.2, 0.6), wall_s=2.0, batch_size=1), fake_point(batch_size=4)],
                 env={"device": "cuda", "dtype": "bfloat16", "torch": "2.13.0"}, label="b")
    table = report.compare_points([a, b])
    assert len(table) == 3                                          # batch 1 in both, 2 only in A, 4 only in B
    both = table[table["present_in"] == "A, B"].iloc[0]
    assert both[f"ttft_s_p50@{a.name}"] == 0.2 and both[f"ttft_s_p50@{b.name}"] == 0.4
    assert abs(both[f"ttft_s_p50 change@{b.name}"] - 1.0) < 1e-12   # +100 %
    assert abs(both[f"output_throughput_tps change@{b.name}"] - (-0.5)) < 1e-12   # 10 -> 5 tok/s
    assert sorted(table["present_in"]) == ["A", "A, B", "B"]
    env = report.environments([a, b]).set_index("key")
    assert env.loc["device", "differs"] and not env.loc["torch", "differs"]
    out = report.build_report([a, b], tmp_path / "cmp.html")
    page = out.read_text()
    assert "Headline deltas" in page and "+100.0%" in page and "runs overlaid" in page
    assert page.count("class='figure'") == 1                       # explorer_points overlaid into one figure
    assert (tmp_path / "cmp.requests.csv").exists() and len(pd.read_csv(tmp_path / "cmp.requests.csv")) == 8
    deltas = json.loads((tmp_path / "cmp.points.json").read_text())
    assert len(deltas["runs"]) == 2 and len(deltas["deltas"]) == 3
    assert not (a / "requests.csv").exists() and not (b / "points.json").exists()   # inputs untouched


def test_overlay_keeps_every_runs_traces_and_tables_apart(tmp_path):
    import plotly.graph_objects as go

    a = make_run([fake_point(batch_size=1)], label="a")
    b = make_run([fake_point(batch_size=2)], label="b")
    results.save_figure(a, "table", go.Figure(go.Table(cells=dict(values=[[1]]))))
    results.save_figure(b, "table", go.Figure(go.Table(cells=dict(values=[[2]]))))
    figs = dict(report.overlay_figures([a, b]))
    assert len(figs["explorer_points"]) == 1
    names = [t.name for t in figs["explorer_points"][0].data]
    assert len(names) == 2 and names[0].startswith("A (") and names[1].startswith("B (")
    assert len(figs["table"]) == 2                                  # tables cannot share axes
    # a fresh user's overlaid TTFT: one curve a run, no legend (the run's own layout hid it), A and B the same colour
    # told apart by dash alone, and a long title with "(runs overlaid)" past the right edge
    for run, y in ((a, [0.1, 0.2]), (b, [0.3, 0.4])):
        results.save_figure(run, "ttft", go.Figure(go.Scatter(x=[1, 2], y=y, name="p50"),
                                                   layout=dict(showlegend=False, title_text="word " * 40)))
    (fig,) = dict(report.overlay_figures([a, b]))["ttft"]
    assert fig.layout.showlegend is True and len({t.line.color for t in fig.data}) == 2
    assert [t.line.dash for t in fig.data] == ["solid", "dash"]
    *title, styles = fig.layout.title.text.split("<br>")
    assert len(title) == 2 and all(len(line) <= 100 for line in title) and "A solid, B dashed" in styles
    assert plots.legend_is_below(fig)       # in the image: a run's container-anchored legend at a negative y was not
    # a run's grey crosses stay crosses (the run's marker symbol went onto them: big grey circles), and an entry the
    # run's figure hid (the same crosses in a second panel) stays hidden
    for run in (a, b):
        fig = go.Figure([go.Scatter(x=[1, 2], y=[1, 2], name="p50"),
                         go.Scatter(x=[2], y=[2], name=plots.INVALID_NAME, marker=dict(symbol="x-thin-open")),
                         go.Scatter(x=[2], y=[3], name=plots.INVALID_NAME, showlegend=False)])
        results.save_figure(run, "crossed", fig)
    (fig,) = dict(report.overlay_figures([a, b]))["crossed"]
    crosses = [t for t in fig.data if t.name.endswith(plots.INVALID_NAME)]
    assert len(crosses) == 4 and [t.marker.symbol for t in crosses[::2]] == ["x-thin-open"] * 2
    assert [t.showlegend for t in crosses] == [True, False, True, False]


def test_compare_needs_two_runs_with_points():
    """A run without points does not count: beside one run with points, in either order, there is no delta table
    and the comparison page says why; a second run with points fills it, its changes against the first run that has
    points. The comparison notebook refuses fewer than two runs before reading any."""
    a = make_run([fake_point()])
    empty = results.open_run("")
    for runs in ([a, empty], [empty, a]):
        assert report.compare_points(runs).empty
        page = report.build_report(runs).read_text()
        assert "Headline deltas" in page and "(fewer than two runs with points)" in page
        assert "Δ B vs A" not in page                                   # no delta column (A and B: both runs)
    b = make_run([fake_point(ttfts=(0.2, 0.6))])
    table = report.compare_points([empty, a, b])
    assert table["present_in"].tolist() == ["B, C"] and f"ttft_s_p50@{empty.name}" not in table
    assert table[f"ttft_s_p50 change@{b.name}"].iloc[0] == pytest.approx(1.0)        # median 0.2 s -> 0.4 s
    assert report.compare_points([a, empty, b])["present_in"].tolist() == ["A, C"]   # the page's letters
    page = report.build_report([empty, a, b]).read_text()
    assert "(fewer than two runs with points)" not in page and "+100.0%" in page
    assert "ttft_s_p50 Δ C vs B" in page and "Δ C vs A" not in page                  # A has no points
    with pytest.raises(ParameterError, match=r"^runs: need at least two runs to compare \(found 1\)"):
        report.CompareConfig(runs=[str(a)]).run_dirs()


def _snapshot(folder):
    return {p.relative_to(folder): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_comparison_writes_only_its_output():
    a = make_run([fake_point(batch_size=1)], label="a")
    b = make_run([fake_point(batch_size=2)], label="b")
    before = {r: _snapshot(r) for r in (a, b)}
    out = report.build_report([a, b])                       # default output: results/comparisons/, not run A
    assert out.parent == results.results_root() / "comparisons" and out.exists()
    assert out.with_name(out.stem + ".requests.csv").exists()
    assert {r: _snapshot(r) for r in (a, b)} == before        # no file added or rewritten in an input
    import pytest

    with pytest.raises(report.ParameterError, match="inside the compared run"):
        report.build_report([a, b], a / "cmp.html")
    assert results.load(str(results.results_root() / "*"), table="points")["run_id"].nunique() == 2


def test_no_write_follows_a_symlink_out_of_the_results_folder(tmp_path):
    import pytest

    run = make_run([fake_point(batch_size=1)])
    outside = tmp_path / "outside"
    outside.mkdir()
    import shutil

    shutil.rmtree(run / "figures", ignore_errors=True)
    (run / "figures").symlink_to(outside, target_is_directory=True)
    import plotly.graph_objects as go

    with pytest.raises(report.ParameterError, match="symlink out of the results folder"):
        results.save_figure(run, "f", go.Figure())
    (run / "requests.csv").symlink_to(outside / "victim.csv")    # a link planted at an export's name
    (outside / "victim.csv").write_text("keep")
    report.build_report(run)
    assert (outside / "victim.csv").read_text() == "keep"         # the link was replaced, not followed
    assert not (run / "requests.csv").is_symlink()
    assert list(outside.iterdir()) == [outside / "victim.csv"]


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(tmp_path):
    point = fake_point(batch_size=1)
    for r, text in zip(point.requests, ["=HYPERLINK(\"http://x\")", "+1+1"]):
        r["text"] = text
    run = make_run([point])
    paths = csv_export.export(run)
    csv = pd.read_csv(paths["requests_csv"])
    assert sorted(csv["text"]) == ["'+1+1", "'=HYPERLINK(\"http://x\")"]
    assert csv["ttft_s"].dtype.kind == "f"                    # numbers (even negative) stay numbers
    raw = paths["requests_csv"].read_text()
    assert ",=" not in raw and ",+" not in raw and ",@" not in raw
    assert csv_export._neutralise("-2+3") == "'-2+3" and csv_export._neutralise("@SUM(A1)") == "'@SUM(A1)"
    assert csv_export._neutralise("plain") == "plain" and csv_export._neutralise(-1.5) == -1.5


def test_findings_show_their_evidence_and_link_to_the_points_they_rest_on():
    from workbench.stats import evidence

    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    points = results.read_points(run)
    exp = points["experiment"].iloc[0]
    pid = str(points["point_id"].iloc[0])
    results.save_finding(run, exp, evidence.Finding("Batch 2 is slower.", "2 points, 1 repeat each", False, (pid,)))
    results.save_finding(run, "older", "A plain sentence from an old manifest.")
    assert results.read_manifest(run)["findings"][exp]["supported"] is False
    page = report.build_report(run).read_text()
    assert "Batch 2 is slower." in page and "Evidence: 2 points, 1 repeat each" in page
    assert "class='unsupported'>not supported<" in page
    anchor = findings.point_anchor(run, pid)
    assert f"href='#{anchor}'" in page and f"<tr id='{anchor}'" in page  # the link lands on the point's row
    assert "A plain sentence from an old manifest." in page and "0 decided: 0 directions, 0 equivalent; 0 undecided" in page
    table = findings.findings_table(run).set_index("experiment")
    assert table.loc[exp, "supported"] is False and table.loc["older", "supported"] is None
    assert table.loc[exp, "evidence"] == "2 points, 1 repeat each" and table.loc[exp, "points"] == 1


def test_the_report_never_reads_a_path_built_from_a_manifest_name(tmp_path):
    import plotly.graph_objects as go

    run = results.create_run()
    outside = run.parent / "outside.json"
    outside.write_text(go.Figure(layout={"title": {"text": "SECRET-OUTSIDE"}}).to_json())
    m = results.read_manifest(run)
    m["figures"] = ["../../outside", "../outside", {"x": 1}]
    (run / "manifest.json").write_text(json.dumps(m))
    assert report._figure_names(run) == []
    html_path = report.build_report(run)
    assert "SECRET-OUTSIDE" not in html_path.read_text()
