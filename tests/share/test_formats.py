"""Foreign results: each fixture round-trips through import and the comparison view, with the comparability check
printed first and non-comparable metrics left out with their reason; bad files are one line and write nothing."""
import json
from pathlib import Path

import pytest

from workbench import cli
from workbench.share import export, formats, report
from workbench.run import results
from workbench.errors import ParameterError

from tests.share.test_report import fake_point, make_run

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
    lines, left = formats.comparability([make_run([fake_point(batch_size=1)]), formats.import_file(FIXTURES["vllm-json"])])
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
    empty.write_text(json.dumps({"completed": 0, "duration": 1.0, "median_ttft_ms": None}))
    with pytest.raises(ParameterError, match="holds no TTFT or throughput figure"):
        formats.read_file(empty)
