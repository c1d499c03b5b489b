"""Foreign results: each fixture round-trips through import and the comparison view, with the comparability check
printed first and non-comparable metrics left out with their reason; bad files are one line and write nothing."""
import json
import math
from pathlib import Path

import pytest

from tests.share.test_report import fake_point, make_run
from workbench import cli
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import comparability, cross_tool, export, formats, report

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = {"guidellm": DATA / "guidellm_benchmarks.json", "aiperf": DATA / "aiperf_profile_export_aiperf.json",
            "vllm-json": DATA / "vllm_bench_serve.json"}


@pytest.mark.parametrize("tool", list(FIXTURES))
def test_fixture_imports_in_workbench_names_and_units(tool):
    imp = formats.read_file(FIXTURES[tool])
    assert imp.tool == tool and len(imp.points) == 1
    p = imp.points.iloc[0]
    assert p["ttft_s_p50"] == pytest.approx(0.22 if tool != "guidellm" else 0.21)   # ms -> s (GuideLLM: lower median)
    assert p["tpot_s_p50"] == pytest.approx(0.0505 if tool != "guidellm" else 0.050)
    assert p["output_throughput_tps"] == pytest.approx(20.0)
    assert pd_isna(p.get("ttft_s_p99"))                          # 4 requests carry no p99
    run = formats.import_file(FIXTURES[tool])
    assert results.read_manifest(run)["imported"]["tool"] == tool
    assert results.read_points(run)["ttft_s_p50"].iloc[0] == pytest.approx(p["ttft_s_p50"])


def pd_isna(v):
    import pandas as pd

    return v is None or pd.isna(v)


@pytest.mark.parametrize("tool", list(FIXTURES))
def test_report_compares_a_workbench_run_with_each_tool(tool, capsys, tmp_path):
    run = make_run([fake_point(batch_size=2)])
    out = tmp_path / "cmp.html"
    assert cli.main(["report", str(run), str(FIXTURES[tool]), "-o", str(out), "--figures", "none"]) == 0
    printed = capsys.readouterr().out
    check = printed.index("comparability check")
    assert printed.index(f"imported {FIXTURES[tool]}") < check < printed.index(str(out))   # before the comparison
    assert "token counts:" in printed and "ignore_eos:" in printed and "arrival pattern: DIFFERENT" in printed
    assert "warm-up:" in printed and "percentiles:" in printed
    assert "not compared: output_throughput_tps:" in printed                # arrival / ignore_eos differ
    page = out.read_text()
    assert "Comparability" in page and "Headline deltas" in page
    deltas = json.loads(out.with_name("cmp.points.json").read_text())["deltas"]
    assert deltas and not any(k.startswith("output_throughput_tps") for k in deltas[0])   # left out of the deltas
    assert any(k.startswith("ttft_s_p50@") for k in deltas[0])


def test_guidellm_tpot_and_vllm_itl_are_left_out_with_the_reason():
    g = formats.read_file(FIXTURES["guidellm"])
    assert "includes the first token" in g.left_out["time_per_output_token_ms"]
    v = formats.read_file(FIXTURES["vllm-json"])
    assert "streamed chunks" in v.left_out["itl"]
    lines, left = comparability.comparability([make_run([fake_point(batch_size=1)]), formats.import_file(FIXTURES["vllm-json"])])
    assert "itl_s_p50" in left and "ITL" in left["itl_s_p50"]
    assert "goodput_rps" in left


def test_workbench_vllm_export_round_trips_as_comparable(tmp_path):
    run = make_run([fake_point(batch_size=1)])
    export.export_run(run, "vllm-json", out=tmp_path / "v")
    back = formats.import_file(next((tmp_path / "v").glob("*.json")))
    pts, orig = results.read_points(back).iloc[0], results.read_points(run).iloc[0]
    assert pts["point_id"] == orig["point_id"] and pts["ttft_s_p50"] == pytest.approx(orig["ttft_s_p50"])
    assert pts["output_throughput_tps"] == pytest.approx(orig["output_throughput_tps"])
    table = report.compare_points([run, back])
    assert len(table) == 1 and table["present_in"].iloc[0] == "A, B"          # the same point, matched


@pytest.mark.parametrize("fmt", ["vllm-json", "br0.2"])
def test_a_run_read_back_from_its_own_export_compares_as_the_same_measurement(tmp_path, fmt):
    """A fresh user compared a run with its own vLLM export: token counts, percentiles, TPOT and the TTFT start
    read DIFFERENT (the vLLM reader's words for the workbench's definitions) and p99 was left out."""
    run = make_run([fake_point(batch_size=1)])
    export.export_run(run, fmt, out=tmp_path / "x")
    back = formats.import_file(next((tmp_path / "x").glob("*.json")))
    lines, left = comparability.comparability([run, back])
    assert not any("DIFFERENT" in line or "UNKNOWN" in line or "caution" in line for line in lines), lines
    assert left == {}, left                        # every metric compared, throughput and goodput included


def _recorded_before_points_carried_ignore_eos(run, value=True):
    """A run as notebook 01 wrote it: every request records ``ignore_eos``, its point rows do not."""
    pts = results.read_points(run).drop(columns=["ignore_eos"], errors="ignore")
    req = results.read_requests(run).assign(ignore_eos=value)
    pts.to_parquet(run / "points.parquet")
    req.to_parquet(run / "requests.parquet")
    return run


def test_ignore_eos_recorded_by_the_requests_makes_two_runs_comparable_and_reaches_the_exports(tmp_path):
    """A fresh user's report of two runs of notebook 01 read "ignore_eos: UNKNOWN ... not recorded" and left out
    output throughput, though every request recorded ``ignore_eos: true``; the vLLM export wrote ``null``."""
    a = _recorded_before_points_carried_ignore_eos(make_run([fake_point(batch_size=1)], label="a"))
    b = _recorded_before_points_carried_ignore_eos(make_run([fake_point(batch_size=1)], label="b"))
    assert comparability.provenance(a)["ignore_eos"] is True
    lines, left = comparability.comparability([a, b])
    assert "output_throughput_tps" not in left and not any("UNKNOWN" in line for line in lines), (lines, left)
    export.export_run(a, "vllm-json", out=tmp_path / "v")
    assert json.loads(next((tmp_path / "v").glob("*.json")).read_text())["ignore_eos"] is True
    mixed = _recorded_before_points_carried_ignore_eos(make_run([fake_point(batch_size=1)], label="c"), value=False)
    assert comparability.provenance(mixed)["ignore_eos"] is False
    assert "output_throughput_tps" in comparability.comparability([a, mixed])[1]     # differs: left out


def test_a_file_that_is_not_what_it_claims_is_one_line_and_writes_nothing(tmp_path, capsys):
    run = make_run([fake_point(batch_size=1)])
    fake = tmp_path / "benchmarks.json"
    fake.write_text(json.dumps({"hello": "world"}))
    before = sorted(results.results_root().iterdir())
    assert cli.main(["report", str(run), str(fake)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: RUN_DIR:") and "is not a GuideLLM benchmarks.json" in err and "\n" not in err
    assert sorted(results.results_root().iterdir()) == before                  # no imported run, no comparison
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(ParameterError, match="not JSON"):
        formats.read_file(bad)
    empty = tmp_path / "v.json"
    empty.write_text(json.dumps({"completed": 1, "duration": 1.0, "median_ttft_ms": None}))
    with pytest.raises(ParameterError, match="holds no TTFT, latency or throughput figure"):
        formats.read_file(empty)


# ------------------------------------------------------------------- files the real tools wrote (tests/data)


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


#: (file, tool, version, schema fragment, the file's own TTFT p50 in seconds or None, requests in the file beside)
REAL = [
    ("aiperf/0.1.1/stream/profile_export_aiperf.json", "aiperf", "0.1.x", "records",
     lambda d: d["records"]["ttft"]["p50"] / 1000, 0),
    ("aiperf/0.1.1/nonstream/profile_export_aiperf.json", "aiperf", "0.1.x", "records", None, 0),
    ("aiperf/0.8.0/stream/profile_export_aiperf.json", "aiperf", "0.8.0", "schema 1.1",
     lambda d: d["time_to_first_token"]["p50"] / 1000, 4),
    ("aiperf/0.8.0/nonstream/profile_export_aiperf.json", "aiperf", "0.8.0", "schema 1.1", None, 4),
    ("aiperf/0.13.0/stream/profile_export_aiperf.json", "aiperf", "0.13.0", "schema 1.4",
     lambda d: d["time_to_first_token"]["p50"] / 1000, 4),
    ("aiperf/0.13.0/nonstream/profile_export_aiperf.json", "aiperf", "0.13.0", "schema 1.4", None, 4),
    ("guidellm/0.8.1/stream/benchmarks.json", "guidellm", "0.8.1", "report v2",
     lambda d: d["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]["median"] / 1000, 4),
    ("guidellm/0.8.1/nonstream/benchmarks.json", "guidellm", "0.8.1", "report v2", None, 4),
    ("inference-perf/0.7.0/stream/summary_lifecycle_metrics.json", "inference-perf", "unknown", "lifecycle report",
     lambda d: d["successes"]["latency"]["time_to_first_token"]["median"], 4),
    ("inference-perf/0.7.0/nonstream/stage_0_lifecycle_metrics.json", "inference-perf", "unknown", "lifecycle report",
     None, 4),
    ("inference-perf/published-7de5ef2/stage_0_lifecycle_metrics.json", "inference-perf", "unknown", "prompt_len",
     lambda d: d["successes"]["latency"]["time_to_first_token"]["median"], 0),
    ("llmperf/2023-08-31/vllm-yi-34b-c1/01-ai-Yi-1-5-34B-Chat_550_150_summary.json", "llmperf", "2023-08-31",
     "individual_responses", lambda d: d["results_ttft_s_quantiles_p50"], 80),
    ("genai-bench/0.0.5/stream/D32_8_text-to-text_num_concurrency_2_time_136s.json", "genai-bench", "0.0.5",
     "aggregated_metrics", lambda d: d["aggregated_metrics"]["stats"]["ttft"]["p50"], 4),
    ("benchmark-report/llm-d-8bc9f1d/br_v0_2_example.yaml", "benchmark-report", "", "v0.2", "yaml", 0),
    ("benchmark-report/llm-d-8bc9f1d/br_v0_2_1_example.yaml", "benchmark-report", "", "v0.2.1", "yaml", 0),
]


@pytest.mark.parametrize("rel,tool,version,schema,ttft,n_req", REAL, ids=[r[0].rsplit("/", 1)[0] for r in REAL])
def test_every_real_fixture_imports_with_its_version_and_schema(rel, tool, version, schema, ttft, n_req):
    path = DATA / rel
    imp = formats.read_file(path)
    assert imp.tool == tool and version in imp.version and schema in imp.schema
    p = imp.points.iloc[0]
    assert p["status"] == "ok" and p["completed"] > 0 and p["failed"] == 0
    if ttft is None:                            # non-streaming: no TTFT, and the reason is said
        assert pd_isna(p["ttft_s_p50"]) and "non-streaming" in imp.left_out["ttft_s"]
        assert p["e2e_s_p50"] > 0                # its latency and throughput still import
    elif ttft == "yaml":
        import yaml

        doc = yaml.safe_load(path.read_text())
        stats = doc["results"]["request_performance"]["aggregate"]["latency"]["time_to_first_token"]
        scale = {"ms": 1e-3, "s": 1.0}[stats["units"]]
        assert p["ttft_s_p50"] == pytest.approx(stats["p50"] * scale)
    else:
        assert p["ttft_s_p50"] == pytest.approx(ttft(json.loads(path.read_text())))
    assert len(imp.requests) == n_req
    run = formats.import_file(path, imp)
    rec = results.read_manifest(run)["imported"]
    assert (rec["format"], rec["version"], rec["schema"], rec["file"]) == (tool, imp.version, imp.schema,
                                                                           str(path.resolve()))
    assert tool.split("-")[0] in rec["tool"]                 # the tool that wrote it (a BR: "benchmark-report (...)")


def test_aiperf_per_request_jsonl_beside_the_export_is_read_and_agrees_with_its_summary():
    from workbench.stats import metrics

    path = DATA / "aiperf/0.13.0/stream/profile_export_aiperf.json"
    imp = formats.read_file(path)
    lines = _jsonl(path.with_name("profile_export.jsonl"))
    assert len(imp.requests) == len(lines) and imp.requests["error"].isna().all()
    by_hand = [ln["metrics"]["time_to_first_token"]["value"] / 1000 for ln in lines]
    assert sorted(imp.requests["ttft_s"]) == pytest.approx(sorted(by_hand))
    # AIPerf's p50 is linear interpolation over the same values: the export and the rows agree
    assert metrics.percentiles(by_hand, (50,))["p50"] == pytest.approx(imp.points["ttft_s_p50"].iloc[0])


FAILED = ["aiperf/0.1.1/failed/profile_export_aiperf.json", "aiperf/0.8.0/failed/profile_export_aiperf.json",
          "aiperf/0.13.0/failed/profile_export.jsonl", "guidellm/0.8.1/failed-model/benchmarks.json",
          "guidellm/0.5.4/failed-model/benchmarks.json",
          "inference-perf/0.7.0/failed/summary_lifecycle_metrics.json",
          "inference-perf/0.7.0/failed-404/stage_0_lifecycle_metrics.json", "vllm/all_failed.json",
          "genai-bench/0.0.5/failed/debug_for_run_D32_8_2.json"]


@pytest.mark.parametrize("rel", FAILED, ids=[f.rsplit("/", 1)[0] for f in FAILED])
def test_an_all_failed_run_imports_as_a_failed_point_without_a_latency(rel, capsys, tmp_path):
    imp = formats.read_file(DATA / rel)
    p = imp.points.iloc[0]
    assert p["status"].startswith("failed: no request completed") and p["completed"] == 0 and p["failed"] > 0
    assert p["error_reason"] and p["error_reason"] in p["status"]       # the reason, shown
    for col in ("ttft_s_p50", "e2e_s_p50", "tpot_s_p50", "output_throughput_tps", "request_throughput_rps"):
        assert pd_isna(p.get(col)), col                                  # never a 0.0 from "no data"
    run = make_run([fake_point(batch_size=1)])
    out = tmp_path / "cmp.html"
    assert cli.main(["report", str(run), str(DATA / rel), "-o", str(out), "--figures", "none"]) == 0
    deltas = json.loads(out.with_name("cmp.points.json").read_text())["deltas"]
    assert not any(k.startswith("ttft_s_p50@") and "import" in k and v == 0 for d in deltas for k, v in d.items())


def test_the_issues_vllm_case_all_eight_failed_is_not_the_fastest_run():
    raw = json.loads((DATA / "vllm/all_failed.json").read_text())
    assert raw["completed"] == 0 and raw["failed"] == 8 and raw["median_ttft_ms"] == 0.0
    imp = formats.read_file(DATA / "vllm/all_failed.json")
    p = imp.points.iloc[0]
    assert p["status"].startswith("failed") and pd_isna(p["ttft_s_p50"]) and p["requests"] == 8
    assert imp.requests["error"].notna().all() and imp.requests["ttft_s"].isna().all()   # aligned, each its error


def test_a_partial_run_carries_completed_failed_and_incomplete(tmp_path):
    doc = json.loads((DATA / "guidellm/0.8.1/stream/benchmarks.json").read_text())
    bench = doc["benchmarks"][0]
    moved = bench["requests"]["successful"].pop()
    moved["info"]["error"] = "ReadTimeout"
    bench["requests"]["errored"] = [moved]
    bench["metrics"]["request_totals"] = {"successful": 3, "errored": 1, "incomplete": 0, "total": 4}
    f = tmp_path / "partial.json"
    f.write_text(json.dumps(doc))
    p = formats.read_file(f).points.iloc[0]
    assert p["status"] == "ok" and (p["completed"], p["failed"], p["incomplete"], p["requests"]) == (3, 1, 0, 4)
    assert "ReadTimeout" in p["error_reason"]


def test_a_vllm_sweep_tree_is_one_point_per_run_with_the_sweeps_parameters():
    imp = formats.read_file(DATA / "vllm/sweep")
    assert imp.tool == "vllm-sweep" and len(imp.points) == 4
    pts = imp.points.set_index("point_id")
    for pid, row in pts.iterrows():
        raw = json.loads((DATA / "vllm/sweep" / row["sweep_combination"] / f"run={row['repeat']}.json").read_text())
        assert row["ttft_s_p50"] == pytest.approx(raw["median_ttft_ms"] / 1000)
        assert row["concurrency"] == raw["max_concurrency"] and f"run={raw['run_number']}" in pid
    run = formats.import_file(DATA / "vllm/sweep")
    assert len(results.read_points(run)) == 4


def test_the_workbench_br_export_imports_back_with_the_same_figures(tmp_path):
    run = make_run([fake_point(batch_size=1), fake_point(ttfts=(0.2, 0.2), wall_s=2.0, batch_size=2)])
    export.export_run(run, "br0.2", out=tmp_path / "br")
    orig = results.read_points(run).set_index("point_id")
    for f in (tmp_path / "br").glob("*.json"):
        imp = formats.read_file(f)
        p = imp.points.iloc[0]
        assert imp.provenance["tool"] == "workbench (via br0.2)" and "v0.2" in imp.schema
        o = orig.loc[p["point_id"]]
        for col in ("ttft_s_p50", "output_throughput_tps", "request_throughput_rps", "e2e_s_p50"):
            assert p[col] == pytest.approx(o[col]), col
        assert p["batch_size"] == o["batch_size"] and p["experiment"] == o["experiment"]


# --------------------------------------------------------------------------------------------- bad input


def _report_fails_in_one_line(run, bad, capsys) -> str:
    before = sorted(results.results_root().iterdir())
    assert cli.main(["report", str(run), str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: RUN_DIR:") and "\n" not in err
    assert sorted(results.results_root().iterdir()) == before          # no run folder, no half-written import
    return err


def test_a_wrong_typed_per_request_value_is_one_line_and_writes_nothing(tmp_path, capsys):
    run = make_run([fake_point(batch_size=1)])
    doc = json.loads((DATA / "vllm_bench_serve.json").read_text())
    doc["input_lens"][1] = "sixty-four"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    err = _report_fails_in_one_line(run, bad, capsys)
    assert "input_lens[1]" in err and "not a number" in err


def test_a_10000_deep_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    run = make_run([fake_point(batch_size=1)])
    deep = tmp_path / "deep.json"
    deep.write_text('{"benchmarks": ' + "[" * 10_000 + "]" * 10_000 + "}")
    err = _report_fails_in_one_line(run, deep, capsys)
    assert f"deeper than {formats.MAX_DEPTH} levels" in err
    shallow_but_over = tmp_path / "d2.json"           # under the parser's limit, over the cap
    shallow_but_over.write_text("[" * (formats.MAX_DEPTH + 5) + "]" * (formats.MAX_DEPTH + 5))
    assert f"deeper than {formats.MAX_DEPTH}" in _report_fails_in_one_line(run, shallow_but_over, capsys)


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    run = make_run([fake_point(batch_size=1)])
    big = tmp_path / "big.json"
    big.write_text(json.dumps(json.loads((DATA / "vllm_bench_serve.json").read_text())))
    monkeypatch.setattr(formats, "MAX_FILE_BYTES", big.stat().st_size - 1)
    err = _report_fails_in_one_line(run, big, capsys)
    assert "over the" in err and "cap" in err


def test_an_unknown_format_is_one_line_naming_what_is_missing(tmp_path, capsys):
    run = make_run([fake_point(batch_size=1)])
    unknown = tmp_path / "other.json"
    unknown.write_text(json.dumps({"results": {"ttft": 1.0}, "version": "9"}))
    err = _report_fails_in_one_line(run, unknown, capsys)
    assert "none of their fields found" in err and "GuideLLM needs benchmarks[].metrics" in err


# ------------------------------------------------------------------------------------ cross-tool decisions


def test_cross_tool_ratio_of_medians_with_an_interval_and_the_comparability_verdict(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    a_ttfts = tuple(float(x) for x in rng.lognormal(np.log(0.2), 0.1, 12))
    run = make_run([fake_point(ttfts=a_ttfts, batch_size=1)])
    doc = json.loads((DATA / "vllm_bench_serve.json").read_text())
    b = rng.lognormal(np.log(0.3), 0.1, 12)                       # the other client sees 1.5x the TTFT
    doc.update(completed=12, ttfts=[float(x) for x in b], input_lens=[64] * 12, output_lens=[5] * 12,
               errors=[""] * 12, itls=[[]] * 12, generated_texts=[""] * 12)
    f = tmp_path / "vllm_detailed.json"
    f.write_text(json.dumps(doc))
    other = formats.import_file(f)
    rows = cross_tool.cross_tool([run, other])
    ttft = next(r for r in rows if r["metric"] == "ttft_s")
    assert (ttft["n_a"], ttft["n_b"]) == (12, 12)
    assert ttft["ratio"] == pytest.approx(np.median(b) / np.median(a_ttfts))
    assert ttft["low"] < ttft["ratio"] < ttft["high"] and ttft["low"] > 1.0 and ttft["verdict"] == "higher"
    assert ttft["gm_low"] < 1.5 < ttft["gm_high"] and "Welch" in ttft["gm_method"]
    assert ttft["comparability"].startswith("caution:") and "TTFT counted from" in ttft["comparability"]
    e2e = next(r for r in rows if r["metric"] == "e2e_s")
    assert "token counts" in e2e["comparability"] and "token counts" not in ttft["comparability"]
    same = cross_tool.cross_tool([run, make_run([fake_point(ttfts=a_ttfts, batch_size=1)])])
    s = next(r for r in same if r["metric"] == "ttft_s")
    assert s["low"] <= 1.0 <= s["high"] and s["verdict"] == "no difference beyond noise"
    assert s["comparability"].startswith("comparable")
    out = tmp_path / "cmp.html"
    assert cli.main(["report", str(run), str(f), "-o", str(out), "--figures", "none"]) == 0
    printed = capsys.readouterr().out
    assert "cross-tool decisions on per-request data" in printed and "median ratio" in printed
    assert "Cross-tool decisions on per-request data" in out.read_text()


def test_a_summary_only_import_says_so_instead_of_an_interval():
    run = make_run([fake_point(ttfts=(0.1, 0.2, 0.15, 0.12, 0.11), batch_size=1)])
    other = formats.import_file(DATA / "aiperf/0.1.1/stream/profile_export_aiperf.json")   # no per-request file
    rows = cross_tool.cross_tool([run, other])
    ttft = next(r for r in rows if r["metric"] == "ttft_s")
    assert ttft["verdict"] == "summary only: no interval" and math.isnan(ttft["low"])
    assert any("summary only: no interval" in line for line in cross_tool.cross_tool_lines(rows))


def test_guidellm_report_v1_written_by_0_5_4_a_real_partial_run():
    """GuideLLM 0.5.4 (report v1) against the loaded CPU server: one of three requests timed out; the point keeps
    its two completed requests' figures and says the rest."""
    path = DATA / "guidellm/0.5.4/stream/benchmarks.json"
    raw = json.loads(path.read_text())
    totals = raw["benchmarks"][0]["metrics"]["request_totals"]
    imp = formats.read_file(path)
    p = imp.points.iloc[0]
    assert imp.version == "0.5.4" and imp.schema == "report v1"
    assert (p["completed"], p["failed"], p["incomplete"]) == (totals["successful"], totals["errored"],
                                                             totals["incomplete"])
    assert p["status"] == "ok" and p["failed"] > 0 and "ReadTimeout" in p["error_reason"]
    assert p["ttft_s_p50"] == pytest.approx(
        raw["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]["median"] / 1000)
    assert len(imp.requests) == totals["total"] and imp.requests["error"].notna().sum() == totals["errored"]
