"""Tests for workbench.experiments.streaming_anatomy: granularity on the model, tables, notebook 04 end to end."""

from pathlib import Path

import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.experiments import streaming_anatomy
from workbench.experiments.streaming_anatomy import measure_granularity
from workbench.measure.generation import GenerationSettings

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
QUICK_04 = {"output_tokens": [4, 8], "granularities": ["token", "4 tokens", "100 ms"], "granularity_tokens": 8,
            "timeline_batch": 2, "http_concurrency": [1, 2], "http_tokens": 4, "warmup": 0}


@pytest.mark.parametrize("kw,match", [
    ({"output_tokens": [0]}, "output_tokens"),
    ({"granularities": ["token", "1 token"]}, "granularities"),
    ({"granularities": ["fast"]}, "granularity"),
    ({"http_concurrency": []}, "http_concurrency"),
    ({"prompt": " "}, "prompt"),
    ({"http": "yes"}, "http"),
])
def test_config_rejects_bad_values_in_one_line(kw, match):
    with pytest.raises(ParameterError, match=match) as e:
        streaming_anatomy.Config(**kw)
    assert "\n" not in str(e.value)


def test_transport_table_is_in_seconds_by_hand():
    rows = [{"experiment": "http", "concurrency": 2, "ttft_s": t, "engine_ttft_s": e, "transport_ttft_s": t - e,
             "engine_queue_s": 0.0, "tpot_s": 0.02, "engine_tpot_s": 0.01, "transport_e2e_s": 0.005,
             "chunks": 3, "output_tokens": 4} for t, e in ((0.3, 0.2), (0.5, 0.3))]
    t = streaming_anatomy.transport_table(pd.DataFrame(rows + [{"experiment": "streaming", "concurrency": 2}]))
    assert not [c for c in t.columns if c.endswith("_ms")]
    r = t.iloc[0]
    assert r["requests"] == 2 and r["ttft_s_p50"] == pytest.approx(0.4) and r["engine_ttft_s_p50"] == pytest.approx(0.25)
    assert r["transport_ttft_s_max"] == pytest.approx(0.2) and r["chunks_per_token"] == pytest.approx(6 / 8)


@pytest.mark.model
def test_measure_granularity_on_the_model(loaded):
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    out = measure_granularity(loaded, ["Say hi.", "用中文说你好。"], settings,
                              ["token", "4 tokens", "50 ms"], repeats=1, warmup=0)
    assert list(out) == ["token", "4 tokens", "50 ms"]
    for lab, m in out.items():
        assert m.extra["text_equal"] is True
        assert set(m.extra) >= {"updates_p50", "display_lag_s_mean_p50", "added_first_display_s_p50"}
        for q in m.requests:
            assert q["text_equal"] and q["output_tokens"] == 8
            assert 1 <= q["updates"] <= 8
            assert q["first_display_s"] >= q["ttft_s"]
    assert all(q["updates"] <= 2 for q in out["4 tokens"].requests)  # 8 / 4
    with pytest.raises(ParameterError):
        measure_granularity(loaded, ["x"], settings, ["token", "1 token"])
    table = streaming_anatomy.granularity_table(pd.DataFrame([q for m in out.values() for q in m.requests]))
    assert list(table["granularity"]) == ["token", "4 tokens", "50 ms"] and table["text_equal"].all()


@pytest.mark.notebook
def test_streaming_anatomy_notebook(tmp_path, monkeypatch, run_notebook):
    from workbench.run import notebooks, results

    nb = NOTEBOOKS / "04_streaming_anatomy.ipynb"
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.open_run("", label="nb04")
    run_notebook(nb, notebooks.validate_parameters(nb, QUICK_04), run)
    pts = results.read_points(run)
    assert set(pts["experiment"]) == {"streaming", "granularity", "http"} and (pts["status"] == "ok").all()
    assert {"itl_s_p50", "itl_s_p99", "itl_jitter"} <= set(pts.columns)
    gran = results.read_requests(run, experiment="granularity")
    assert gran["text_equal"].all() and len(gran) == 3 * 2
    http = results.read_requests(run, experiment="http")
    assert len(http) == 1 + 2 and (http["ttft_s"] >= http["engine_ttft_s"]).all()
    # HTTP rows time text chunks: chunk_itl_s, no itl_s; the server serves one request per forward pass
    assert http["itl_s"].isna().all() and http["chunk_itl_s"].map(len).eq(http["chunks"] - 1).all()
    assert (http["batch_size"] == 1).all() and (http["decode_steps"] <= http["output_tokens"] - 1).all()
    # every request row with itl_s is one request's token ids: len(itl_s) == output_tokens - 1
    every = results.read_requests(run)
    with_itl = every[every["itl_s"].notna()]
    assert len(with_itl) > 0 and (with_itl["itl_s"].map(len) == with_itl["output_tokens"] - 1).all()
    figs = {p.stem for p in (run / "figures").glob("*.html")}
    assert figs >= {"itl_histogram", "itl_vs_position", "perceived_latency", "granularity", "timeline_batch",
                    "http_ttft", "timeline_http"}


def _stream_run(tpot_long=(0.10, 0.11, 0.10), tpot_short=(0.10, 0.10, 0.11), valid=True):
    pts = pd.DataFrame({"experiment": "streaming", "point_id": ["s32", "s192"], "status": "ok", "valid": [True, valid],
                        "max_new_tokens": [32, 192], "batch_size": 1, "ttft_s_p50": [0.1, 0.1],
                        "e2e_s_p50": [3.2, 19.2], "tpot_s_p50": [0.1, 0.1]})
    reqs = pd.DataFrame([{"experiment": "streaming", "point_id": pid, "repeat": r, "ttft_s": 0.1 + 0.01 * r,
                          "tpot_s": t, "e2e_s": 0.1 + t * (n - 1)}
                         for pid, n, ts in (("s32", 32, tpot_short), ("s192", 192, tpot_long))
                         for r, t in enumerate(ts)])
    return pts, reqs


def test_finding_carries_its_intervals_and_needs_two_repeats():
    pts, reqs = _stream_run()
    f = streaming_anatomy.finding(pts, reqs)
    assert f.supported and "x sooner)" in f.text and "3 repeat(s)" in f.evidence
    assert "TPOT at 192 vs 32 tokens" in f.text and "no difference beyond noise" in f.text
    one = streaming_anatomy.finding(pts, reqs[reqs["repeat"] == 0])
    assert not one.supported and "not supported" in one.text and "no interval" in one.text
    only_short = streaming_anatomy.finding(_stream_run(valid=False)[0], reqs)
    assert "32-token answer" in only_short.text and only_short.point_ids == ("s32",)  # the invalid point is out


def test_finding_with_points_of_other_parts_in_the_table():
    """The run's points table also holds other sweeps' points, so a streaming point's batch_size can be NaN: the
    finding still reads (it raised 'cannot convert float NaN to integer' in make run)."""
    import math

    import pandas as pd

    from workbench.experiments import streaming_anatomy as sa

    pts = pd.DataFrame([{"point_id": f"s{n}", "experiment": "streaming", "max_new_tokens": n, "batch_size": math.nan,
                         "status": "ok", "valid": True, "ttft_s_p50": 0.1, "e2e_s_p50": 0.1 + n * 0.05,
                         "tpot_s_p50": 0.05}
                        for n in (8, 32)] + [{"point_id": "h1", "experiment": "streaming_http", "batch_size": 4}])
    reqs = pd.DataFrame([{"point_id": f"s{n}", "experiment": "streaming", "repeat": r, "ttft_s": 0.1 + r * 0.01,
                          "e2e_s": 0.1 + n * 0.05 + r * 0.01, "tpot_s": 0.05} for n in (8, 32) for r in range(3)])
    f = sa.finding(pts, reqs)
    assert "3 repeat(s) of 1 request(s) per output length" in f.evidence
