"""Reports: one run still builds; two runs with different parameter sets compare; CSV / JSON exports."""
import json

import pandas as pd

from workbench import metrics, report, results
from workbench.experiments import explorer


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
    assert by_batch[1]["ttft_s_p50"] == 0.2 and abs(by_batch[1]["ttft_s_p99"] - 0.298) < 1e-12


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
    assert (a / "requests.csv").exists() and (b / "points.json").exists()


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


def test_compare_needs_two_runs_with_points():
    a = make_run([fake_point()])
    empty = results.open_run("")
    assert report.compare_points([a, empty]).empty
    assert report.build_report([a, empty]).exists()
