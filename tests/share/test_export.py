"""Exports: a real (small) run into a local MLflow store read back with MLflow's client; BR0.2 against its schema;
vLLM bench JSON; bad input is one line and writes nothing."""
import json

import pytest

from workbench import cli
from workbench.share import export, report
from workbench.run import results
from workbench.errors import ParameterError

from tests.share.test_report import fake_point, make_run


def _run():
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    report.build_report(run, figures="none", price_per_hour=3.6)
    return run


def test_mlflow_export_reads_back_through_mlflows_client(tmp_path):
    from mlflow.tracking import MlflowClient

    run = _run()
    store = tmp_path / "store"
    lines = export.export_run(run, "mlflow", tracking_uri=str(store))
    assert lines[0].startswith("exporting 2 point(s)") and "2 valid, 0 invalid" in lines[0]
    uri, _ = export.resolve_tracking_uri(str(store))
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("workbench")
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`workbench.run_id` = '%s'" % run.name)
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags["env.torch"] == "2.13.0" and parent.data.metrics["points_valid"] == 2
    children = client.search_runs([exp.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 2
    by_batch = {c.data.params["batch_size"]: c for c in children}
    assert by_batch["1"].data.metrics["output_throughput_tps"] == 10.0       # 2 x 5 tokens / 1 s
    assert by_batch["2"].data.metrics["ttft_s_p50"] == 0.2
    assert by_batch["1"].data.metrics["usd_per_mtok_output"] == pytest.approx(100.0)  # 3.6 $/h = 0.001 $/s; /10 tok/s
    assert by_batch["1"].data.tags["valid"] == "true" and by_batch["1"].data.tags["invalid_reason"] == ""
    top = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"report", "tables", "figures", "metrics.json", "manifest.json"} <= top
    assert {f.path for f in client.list_artifacts(parent.info.run_id, "tables")} == {
        "tables/points.parquet", "tables/requests.parquet"}
    assert "report/report.html" in {f.path for f in client.list_artifacts(parent.info.run_id, "report")}


def test_mlflow_unwritable_tracking_uri_is_one_line_and_creates_nothing(tmp_path, capsys):
    run = _run()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert cli.main(["export", str(run), "--to", "mlflow", "--tracking-uri", str(blocked / "store")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --tracking-uri:") and "cannot be written" in err and "\n" not in err
    assert not (blocked.parent / "store").exists()


def test_unfinished_invalid_heavy_run_says_what_it_exports():
    run = _run()
    results.mark_invalid(run, [str(p) for p in results.read_points(run)["point_id"]], "other load")
    results.update_manifest(run, status="interrupted")
    lines = export.describe(run)
    assert "0 valid, 2 invalid" in lines[0]
    assert any("status is 'interrupted'" in line for line in lines)
    assert any("2 of 2 measured points are invalid" in line for line in lines)


def test_br02_export_validates_against_the_schema(tmp_path):
    run = _run()
    docs = export.br02_reports(run)
    assert len(docs) == 2
    validator = export.br02_validator()
    for doc in docs.values():
        assert not list(validator.iter_errors(doc))
    doc = next(d for d in docs.values() if d["scenario"]["load"]["standardized"]["concurrency"] == 1)
    agg = doc["results"]["request_performance"]["aggregate"]
    assert agg["latency"]["time_to_first_token"]["p50"] == pytest.approx(0.2)
    assert "p99" not in agg["latency"]["time_to_first_token"]                # 2 samples do not carry a p99
    assert agg["throughput"]["output_token_rate"] == {"units": "tokens/s", "mean": 10.0}
    broken = json.loads(json.dumps(doc))
    broken["results"]["request_performance"]["aggregate"]["requests"]["total"] = -1
    assert list(validator.iter_errors(broken))                              # the check can fail
    out = tmp_path / "br"
    lines = export.export_run(run, "br0.2", out=out)
    assert lines[-1].startswith("br0.2: 2 file(s)") and len(list(out.glob("*.json"))) == 2
    with pytest.raises(ParameterError, match="not an empty folder"):          # never overwrites
        export.export_run(run, "br0.2", out=out)


def test_vllm_json_export_has_vllms_fields(tmp_path):
    run = _run()
    export.export_run(run, "vllm-json", out=tmp_path / "v")
    docs = [json.loads(p.read_text()) for p in (tmp_path / "v").glob("*.json")]
    one = next(d for d in docs if d["max_concurrency"] == 1)
    assert one["completed"] == 2 and one["total_output_tokens"] == 10 and one["output_throughput"] == 10.0
    assert one["median_ttft_ms"] == pytest.approx(200.0) and one["mean_tpot_ms"] == pytest.approx(100.0)
    assert one["p99_ttft_ms"] is None and "p99_ttft_ms" in one["workbench_percentile_note"]
    assert one["ttfts"] == [0.1, 0.3] and one["request_rate"] == "inf"


def test_vllm_json_export_takes_rows_without_inter_token_latencies(tmp_path):
    """The default run's streaming-reader and long-output rows carry no itl_s (None): the export crashed
    ("'NoneType' object is not iterable"); such a row's list is empty, as vLLM writes for a one-token output."""
    point = fake_point(batch_size=1)
    point.requests[1]["itl_s"] = None
    run = make_run([point])
    export.export_run(run, "vllm-json", out=tmp_path / "v")
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "v").glob("*.json")]
    assert doc["itls"] == [[0.1] * 4, []] and doc["completed"] == 2


def test_unknown_format_is_one_line(capsys):
    run = _run()
    assert cli.main(["export", str(run), "--to", "csv"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --to: unknown format 'csv' (allowed: mlflow, br0.2, vllm-json)"
    assert not (run / "exports").exists()
