"""Tests for workbench.experiments.long_output: the config, and notebook 07 end to end."""

from pathlib import Path

import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.experiments import long_output

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
QUICK_07 = {"budget_tokens": 48, "n_sections": 2, "outline_tokens": 16, "languages": ["en"],
            "strategies": ["one_shot", "outline_batch", "outline_sequential"], "warmup": 0}


@pytest.mark.parametrize("kw,match", [
    ({"budget_tokens": 8}, "budget_tokens"),
    ({"strategies": ["magic"]}, "strategies"),
    ({"languages": []}, "languages"),
    ({"budget_tokens": 40, "n_sections": 8}, "budget_tokens"),
    ({"n_sections": 0}, "n_sections"),
])
def test_config_rejects_bad_values_in_one_line(kw, match):
    with pytest.raises(ParameterError, match=match) as e:
        long_output.Config(**kw)
    assert "\n" not in str(e.value)


def test_figure_and_table_take_only_this_experiments_rows():
    rows = [{"experiment": "long_output", "strategy": s, "language": "en", "first_text_s": 0.1, "first_section_s": 0.2,
             "wall_s": 1.0, "coverage": 1.0, "repetition": 0.0, "output_tokens": 40, "chars": 100,
             "sections_found": 2, "output_throughput_tps": 40.0} for s in ("one_shot", "outline_batch")]
    other = {"experiment": "batch_size", "ttft_s": 9.0}
    req = pd.DataFrame(rows + [other])
    assert len(long_output.request_table(req)) == 2
    fig = long_output.figures(req)["long_output"]
    walls = [y for tr in fig.data if tr.name == "wall time" for y in tr.y]
    assert walls == [1.0, 1.0]  # wall time is wall_s, not the last token's e2e_s
    firsts = [y for tr in fig.data if tr.name == "first visible text" for y in tr.y]
    assert firsts == [0.1, 0.1]  # first_text_s, not a per-request ttft_s
    assert "ttft_s" not in long_output.request_table(req) and "first_text_s" in long_output.request_table(req)


@pytest.mark.notebook
def test_long_output_notebook(tmp_path, monkeypatch, run_notebook):
    from workbench.run import notebooks, results

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.open_run("", label="nb07")
    nb = NOTEBOOKS / "07_long_output.ipynb"
    run_notebook(nb, notebooks.validate_parameters(nb, QUICK_07), run)
    req = results.read_requests(run, experiment="long_output")
    assert sorted(req["strategy"]) == sorted(QUICK_07["strategies"])
    assert (req["output_tokens"] <= 48).all() and req["coverage"].between(0, 1).all()
    assert (req["first_text_s"] <= req["wall_s"]).all()
    # every row with itl_s is one request's: len(itl_s) == output_tokens - 1 (outline rows merge several: None)
    for _, q in req.iterrows():
        if q["itl_s"] is not None:
            assert len(q["itl_s"]) == q["output_tokens"] - 1
    by = req.set_index("strategy")
    assert by.loc["one_shot", "batch_size"] == 1 and by.loc["outline_sequential", "batch_size"] == 1
    assert by.loc["outline_batch", "batch_size"] == by.loc["outline_batch", "sections_planned"]  # decoded together
    assert by.loc["outline_batch", "itl_s"] is None and by.loc["outline_batch", "ttft_s"] != by.loc["outline_batch", "ttft_s"]
    pts = results.read_points(run, experiment="long_output")
    assert (pts["status"] == "ok").all()
    assert {"coverage_p50", "repetition_p50", "first_section_s_p50", "first_text_s_p50"} <= set(pts)
    assert (run / "figures" / "long_output.html").exists()
    texts = sorted(p.name for p in (run / "texts").iterdir())
    assert texts == sorted(f"long_output_{s}_en_r0.md" for s in QUICK_07["strategies"])


def _long_rows(walls):
    return pd.DataFrame([{"experiment": "long_output", "point_id": f"{s}-{lang}", "language": lang, "strategy": s,
                          "repeat": r, "wall_s": w, "first_text_s": 0.5, "coverage": 1.0}
                         for (s, lang), ws in walls.items() for r, w in enumerate(ws)])


def test_finding_compares_strategies_over_matched_pairs_and_valid_points_only():
    rows = _long_rows({("one_shot", "en"): [10.0, 10.2], ("one_shot", "zh"): [12.0, 12.1],
                       ("outline_batch", "en"): [6.0, 6.1], ("outline_batch", "zh"): [7.0, 7.3]})
    f = long_output.finding(rows)
    assert "en: outline_batch has the shortest wall time" in f.text and f.supported
    assert "outline_batch wall time vs one_shot: 0.60x" in f.text and "95% interval" in f.text
    assert "4 matched (language, repeat) pairs" in f.evidence
    noisy = _long_rows({("one_shot", "en"): [10.0], ("outline_batch", "en"): [9.0]})
    g = long_output.finding(noisy)
    assert not g.supported and "not supported" in g.text and "no interval" in g.text
    pts = pd.DataFrame({"point_id": ["outline_batch-en", "outline_batch-zh", "one_shot-en", "one_shot-zh"],
                        "status": "ok", "valid": [False, False, True, True]})
    assert "outline_batch" not in long_output.finding(rows, pts).text
