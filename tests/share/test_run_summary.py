"""metrics.json: written with the report, headline figures and findings, other writers' keys kept."""
import json

import pytest

from tests.share.test_report import fake_point, make_run
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import report, run_summary
from workbench.stats import evidence


def test_metrics_json_written_with_the_report_and_keeps_merged_keys():
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    exp = results.read_points(run)["experiment"].iloc[0]
    results.save_finding(run, exp, evidence.Finding("Batch 2 is slower.", "2 points", False, ()))
    run_summary.merge_metrics(run, {"mape_e2e_p50": 0.125, "twin": {"points": 3}})   # another developer's keys
    report.build_report(run, figures="none")
    data = json.loads((run / "metrics.json").read_text())
    assert data["schema"] == "workbench.stats.metrics/1" and data["run_id"] == run.name
    assert data["points"] == {"total": 2, "ok": 2, "failed": 0, "valid": 2, "invalid": 0}
    e = data["experiments"][exp]
    assert e["finding"] == {"text": "Batch 2 is slower.", "supported": False, "evidence": "2 points", "points": 0}
    thr = e["headline"]["output_throughput_tps"]
    assert thr["best"] == 10.0 and thr["median"] == 7.5 and thr["higher_is_better"] is True   # 10 and 5 tok/s
    assert e["headline"]["ttft_s_p50"]["best"] == 0.2 and e["headline"]["ttft_s_p50"]["unit"] == "s"
    assert data["findings"] == {"total": 1, "supported": 0, "decided": 0, "direction": 0, "equivalent": 0,
                                "undecided": 0, "measurements": 1}
    assert data["mape_e2e_p50"] == 0.125 and data["twin"] == {"points": 3}   # kept through the rebuild
    run_summary.merge_metrics(run, {"twin": {"mape": 0.5}})                  # nested dicts merge key by key
    assert run_summary.read_metrics(run)["twin"] == {"points": 3, "mape": 0.5}


def test_merge_refuses_what_json_cannot_hold_and_writes_nothing(tmp_path):
    run = make_run([fake_point(batch_size=1)])
    with pytest.raises(ParameterError, match="keys"):
        run_summary.merge_metrics(run, {"bad": object()})
    assert not (run / "metrics.json").exists()
    with pytest.raises(ParameterError, match="not a run folder"):
        run_summary.merge_metrics(tmp_path, {"a": 1})
    run_summary.merge_metrics(run, {"nan": float("nan")})
    assert json.loads((run / "metrics.json").read_text()) == {"nan": None}
