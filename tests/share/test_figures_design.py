"""The design figure (workbench/share/figures_design.py): ratios with their simultaneous intervals, each round's
ratio from the run's design table, the line at 1, the equivalence band and the A/A band."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench.share import figures_design


def _design(tmp_path, outcome="throughput_tps"):
    folder = tmp_path / "design"
    folder.mkdir()
    rows = []
    for rnd, (c, a, b) in enumerate([(10.0, 30.0, 40.0), (12.0, 33.0, 50.0), (11.0, 35.0, 44.0)]):
        rows += [{"arm": "b1", "round": rnd, outcome: c}, {"arm": "b8", "round": rnd, outcome: a},
                 {"arm": "b16", "round": rnd, outcome: b}, {"arm": "A/A", "round": rnd, outcome: c * 1.01}]
    pd.DataFrame(rows).to_parquet(folder / "batch_size.parquet")
    (folder / "batch_size.json").write_text(json.dumps({"control": "b1", "arms": ["b1", "b8", "b16"]}))
    return tmp_path


def test_round_ratios_divide_each_arm_by_its_control_in_the_same_round(tmp_path):
    got = figures_design.round_ratios(_design(tmp_path), "batch_size", "throughput_tps")
    b8 = got[got["arm"] == "b8"].sort_values("round")["ratio"].tolist()
    assert b8 == pytest.approx([3.0, 33 / 12, 35 / 11])
    assert set(got["arm"]) == {"b8", "b16", "A/A"}  # the control is not its own ratio
    assert got[got["arm"] == "A/A"]["ratio"].tolist() == pytest.approx([1.01] * 3)
    # no design table (an older run, a point-by-point run), or an outcome it did not measure: empty, not an error
    assert figures_design.round_ratios(tmp_path / "elsewhere", "batch_size", "throughput_tps").empty
    assert figures_design.round_ratios(tmp_path, "batch_size", "ttft_s").empty
    assert figures_design.round_ratios(None, "batch_size", "throughput_tps").empty


def test_ratio_figure_draws_intervals_rounds_the_line_at_one_and_both_bands(tmp_path):
    run = _design(tmp_path)
    pts = pd.DataFrame({"point_id": ["b1", "b8", "b16"], "batch_size": [1, 8, 16],
                        "throughput_ratio": [1.0, 2.9, 4.0], "throughput_ratio_low": [None, 2.5, 3.4],
                        "throughput_ratio_high": [None, 3.4, 4.6], "margin": 1.05, "aa_low": 0.95, "aa_high": 1.06})
    rounds = figures_design.round_ratios(run, "batch_size", "throughput_tps")
    fig = figures_design.ratio_figure(pts, "batch_size", "throughput_ratio", rounds, title="t", x_title="batch size",
                                      y_title="throughput ratio to batch 1 (x)", log_x=True)
    main, faint = fig.data[0], fig.data[1]
    assert list(main.x) == [1, 8, 16] and list(main.y) == pytest.approx([1.0, 2.9, 4.0])
    assert list(main.error_y.array) == pytest.approx([0.0, 0.5, 0.6])
    assert list(main.error_y.arrayminus) == pytest.approx([0.0, 0.4, 0.6])
    assert sorted(faint.x) == [8, 8, 8, 16, 16, 16]  # each round's ratio at its arm's x; the A/A is not an arm here
    hlines = sorted(round(s.y0, 4) for s in fig.layout.shapes if s.type == "line")
    assert hlines == pytest.approx([round(1 / 1.05, 4), 1.0, 1.05])
    band = [s for s in fig.layout.shapes if s.type == "rect"]
    assert band and band[0].y0 == pytest.approx(0.95) and band[0].y1 == pytest.approx(1.06)
    names = [t.name for t in fig.data]
    assert "equivalence band +-5%" in names and any(n.startswith("A/A control") for n in names)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.title.text.endswith("(x)")


def test_ratio_figure_inverted_turns_time_ratios_into_speedups():
    pts = pd.DataFrame({"point_id": ["a", "b"], "arm": ["a", "b"], "time_ratio": [1.0, 0.5],
                        "time_ratio_low": [None, 0.4], "time_ratio_high": [None, 0.625]})
    fig = figures_design.ratio_figure(pts, "arm", "time_ratio", invert=True)
    assert list(fig.data[0].y) == pytest.approx([1.0, 2.0])
    assert list(fig.data[0].error_y.array) == pytest.approx([0.0, 0.5])  # 1/0.4 - 2
    assert list(fig.data[0].error_y.arrayminus) == pytest.approx([0.0, 0.4])  # 2 - 1/0.625
