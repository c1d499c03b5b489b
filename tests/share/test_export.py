"""Exports: a real (small) run into a local MLflow store read back with MLflow's client; BR0.2 against its schema;
vLLM bench JSON; bad input is one line and writes nothing."""
import json

import pytest

from tests.share.test_report import fake_point, make_run
from workbench import cli
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import export, export_mlflow, export_points, report


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
    uri, _ = export_mlflow.resolve_tracking_uri(str(store))
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
    docs = export_points.br02_reports(run)
    assert len(docs) == 2
    validator = export_points.br02_validator()
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


def test_vllm_json_export_takes_completed_rows_without_a_first_token_time(tmp_path):
    """A fresh user's `export --to vllm-json` of a quick run crashed (float(None)) on the long-output plan's and the
    keep-alive probe's rows, completed without a TTFT; such a row is 0.0 in ``ttfts`` and its text never "None"."""
    point = fake_point(batch_size=1)
    point.requests[0]["ttft_s"] = None
    point.requests[1]["text"] = None
    run = make_run([point])
    export.export_run(run, "vllm-json", out=tmp_path / "v")
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "v").glob("*.json")]
    assert doc["ttfts"][0] == 0.0 and "None" not in doc.get("generated_texts", [])


def test_unknown_format_is_one_line(capsys):
    run = _run()
    assert cli.main(["export", str(run), "--to", "csv"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --to: unknown format 'csv' (allowed: mlflow, br0.2, vllm-json)"
    assert not (run / "exports").exists()


# ------------------------------------------------------------------ fields that mean what the formats mean


def _with_points(run, **cols):
    """Rewrite the run's points with extra columns (what an experiment would have recorded)."""
    pts = results.read_points(run)
    for k, v in cols.items():
        pts[k] = v
    results.write_table(run / "points.parquet", pts)
    return pts


def _br_by_batch(run):
    return {d["scenario"]["load"]["standardized"]["concurrency"]: d for d in export_points.br02_reports(run).values()}


def test_br_source_is_sampled_for_prompts_cut_from_real_text_and_random_for_random_ids():
    run = make_run([fake_point(batch_size=1), fake_point(batch_size=2)])
    _with_points(run, source=[None, "random"])
    docs = _br_by_batch(run)
    assert docs[1]["scenario"]["load"]["standardized"]["source"] == "sampled"
    assert docs[2]["scenario"]["load"]["standardized"]["source"] == "random"


def test_br_start_is_the_first_round_of_an_interleaved_block():
    """Interleaved arms: the sweep's first point measures every arm round by round; a later arm only reads its
    share, so its rounds began when the block began, not ``finished - wall_s``."""
    run = make_run([fake_point(batch_size=1), fake_point(batch_size=2)])
    pts = _with_points(run, design="interleaved", wall_s=50.0)
    t0 = "2026-01-01T10:00:00+00:00"
    meta = {pid: {"experiment": "explorer", "started_utc": s, "finished_utc": f, "status": "ok"}
            for pid, s, f in zip(pts["point_id"], (t0, "2026-01-01T10:01:40.100000+00:00"),
                                 ("2026-01-01T10:01:40+00:00", "2026-01-01T10:01:40.200000+00:00"))}
    results.update_manifest(run, points=meta)
    docs = _br_by_batch(run)
    assert docs[2]["run"]["time"]["start"] == t0 == docs[1]["run"]["time"]["start"]
    assert docs[2]["run"]["time"]["end"] == "2026-01-01T10:01:40.200000+00:00"


def test_br_counts_never_finished_requests_as_incomplete_not_failures():
    run = make_run([fake_point(batch_size=1)])
    _with_points(run, requests_incomplete=1, requests=3)
    (doc,) = export_points.br02_reports(run).values()
    reqs = doc["results"]["request_performance"]["aggregate"]["requests"]
    assert (reqs["total"], reqs["failures"], reqs["incomplete"]) == (3, 0, 1)


def test_br_percentiles_are_gated_by_independent_samples_not_rows():
    """A batch-16 point of 2 repeats: 32 rows, 2 independent batches: no p90 (it needs 10 samples), and the rule
    is stated in the report."""
    ttfts = tuple(0.1 + 0.01 * i for i in range(32))
    run = make_run([fake_point(ttfts=ttfts, batch_size=16)])
    _with_points(run, n_samples=2)
    (doc,) = export_points.br02_reports(run).values()
    ttft = doc["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]
    assert "p50" in ttft and not {"p10", "p25", "p75", "p90", "p99"} & set(ttft)   # p25 needs 4, p90 10
    assert "n_samples" in doc["run"]["description"] and "p90 from 10" in doc["run"]["description"]
    vdoc = export_points.vllm_results(run)[next(iter(export_points.vllm_results(run)))]
    assert vdoc["workbench_n_samples"] == 2 and vdoc["p99_ttft_ms"] is None


def test_vllm_lists_run_over_every_sent_request_aligned_by_index(tmp_path):
    point = fake_point(ttfts=(0.1, 0.3, 0.2), batch_size=1)
    point.requests[1].update(error="RuntimeError: out of memory", output_tokens=0, ttft_s=None, itl_s=None)
    run = make_run([point])
    (doc,) = export_points.vllm_results(run).values()
    assert len(doc["ttfts"]) == len(doc["input_lens"]) == len(doc["output_lens"]) == len(doc["errors"]) == 3
    assert doc["errors"] == ["", "RuntimeError: out of memory", ""]
    assert doc["ttfts"] == [0.1, 0.0, 0.2] and doc["output_lens"] == [5, 0, 5] and doc["itls"][1] == []
    assert (doc["completed"], doc["failed"]) == (2, 1)


def test_vllm_duration_is_consistent_with_request_throughput():
    run = make_run([fake_point(batch_size=1)])
    _with_points(run, request_throughput_rps=4.0, wall_s=1.7)      # a window figure and a batch time that differ
    (doc,) = export_points.vllm_results(run).values()
    assert doc["duration"] * doc["request_throughput"] == pytest.approx(doc["completed"])
    assert doc["workbench_wall_s"] == 1.7


def test_n_devices_is_written_into_both_exports():
    run = make_run([fake_point(batch_size=1)])
    _with_points(run, n_devices=8)
    (br,) = export_points.br02_reports(run).values()
    stack = br["scenario"]["stack"][0]["standardized"]
    assert stack["accelerator"]["count"] == 8 and stack["replicas"] == 8
    (v,) = export_points.vllm_results(run).values()
    assert v["workbench_n_devices"] == 8
