"""Experiment 08 (serving under load): config validation, summaries, and a tiny real sweep."""
import numpy as np
import pandas as pd
import pytest

from workbench import ParameterError
from workbench.experiments import serving_load
from workbench.load import saturation
from workbench.run import results


@pytest.mark.parametrize("kwargs,name", [
    ({"engines": ["vllm"]}, "engines"),
    ({"engines": []}, "engines"),
    ({"transport": "grpc"}, "transport"),
    ({"arrival": "bursty"}, "arrival"),
    ({"burstiness": 0}, "burstiness"),
    ({"burstiness": -1.0}, "burstiness"),
    ({"requests_per_point": 1}, "requests_per_point"),
    ({"closed_loop_requests": 1}, "closed_loop_requests"),
    ({"requests_per_point": 8, "closed_loop_requests": 9}, "closed_loop_requests"),
    ({"requests_per_point": 8, "synchronous_requests": 1}, "synchronous_requests"),
    ({"slo_presets": ["gold"]}, "slo_presets"),
    ({"search_slo": "gold"}, "search_slo"),
    ({"slo_ttft_s": 0}, "slo_ttft_s"),
    ({"max_batch_size": 0}, "max_batch_size"),
    ({"prompt_tokens": 9000}, "prompt_tokens"),
    ({"compare_engines": ["endpoint"]}, "compare_engines"),
    ({"compare_engines": ["fifo", "static"], "compare_control": "continuous"}, "compare_control"),
    ({"compare_requests": 1}, "compare_requests"),
    ({"compare_load": 0}, "compare_load"),
    ({"repeats": 3, "max_rounds": 2}, "max_rounds"),
])
def test_invalid_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        serving_load.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_grid_is_a_sweep_per_engine():
    cfg = serving_load.Config(engines=["fifo", "continuous"], sweep_points=2)
    assert [(p["engine"], p["profile"], p["step"]) for p in cfg.grid()] == [
        ("fifo", "synchronous", 0), ("fifo", "throughput", 0), ("fifo", "poisson", 1), ("fifo", "poisson", 2),
        ("continuous", "synchronous", 0), ("continuous", "throughput", 0), ("continuous", "poisson", 1),
        ("continuous", "poisson", 2)]


def test_the_engine_comparison_is_a_point_per_run_beside_the_sweep():
    """With 2+ rounds the compared engines get one point per run up to max_rounds (the control again as the A/A
    arm), after the sweep's points; one round compares nothing."""
    cfg = serving_load.Config(engines=["static"], sweep_points=1, compare_engines=["fifo", "static"], repeats=2,
                              max_rounds=3)
    grid = cfg.grid()
    assert cfg.compares() and [p["profile"] for p in grid[:3]] == ["synchronous", "throughput", "poisson"]
    runs = [(p["replicate"], p["engine"], p["arm"]) for p in grid if p.get("comparison") == "engines"]
    assert runs == [(k, e, a) for k in range(3) for e, a in (("fifo", "main"), ("static", "main"), ("fifo", "aa"))]
    assert not serving_load.Config(engines=["static"], repeats=1).compares()
    assert not serving_load.Config(engines=["static"], repeats=2, compare_engines=["fifo"]).compares()
    assert all("comparison" not in p for p in serving_load.Config(engines=["static"]).grid())


def _compared(decisions, aa="equivalent", throughput=(1.3, 1.1, 1.5, "direction", "higher"), rounds=3,
              valid=True):
    """Engine-comparison runs as the design records them (one point per engine and round, fifo the control at 1 and
    again the A/A arm), ``decisions`` = {engine: (ratio, low, high, verdict, direction[, rounds needed])} of the TTFT
    p50, ``throughput`` every engine's throughput decision; beside them the sweep's two keeping-up static points."""
    nan = float("nan")

    def dec(prefix, est, lo, hi, verdict, direction="", need=0):
        return {prefix: est, f"{prefix}_low": lo, f"{prefix}_high": hi, f"{prefix}_level": 0.95,
                f"{prefix}_verdict": verdict, f"{prefix}_direction": direction,
                f"{prefix}_method": "pooled block model, 6 dof, Dunnett over 3", **({"rounds_needed": need} if need
                                                                                    else {})}

    base = {"status": "ok", "valid": valid, "profile": "poisson", "stopped_early": False, "requests_unsent": 0,
            "requests_incomplete": 0, "requests_planned_window": 8, "requests_planned": 8, "offered_rps": 9.0,
            "arrival_rps": 9.0, "completion_rps": 3.0, "arrival_count": 4000, "completion_count": 1000,
            "slo_attainment_custom": 0.2, "goodput_rps_custom": 1.0, "comparison": "engines", "design": "interleaved",
            "rounds": rounds, "margin": 1.05, "design_seconds": 45.0, "seconds_per_round": 15.0,
            "design_stopped": "max rounds", "aa_ratio": 1.0, "aa_low": 0.9, "aa_high": 1.1, "aa_verdict": aa}
    rows = []
    for k in range(rounds):
        for arm in ["fifo", *decisions, "aa"]:
            if arm == "fifo":
                d = {**dec("ttft_vs_control", 1.0, nan, nan, ""), **dec("throughput_ratio", 1.0, nan, nan, ""),
                     "ttft_vs_control_method": "the control"}
            elif arm == "aa":
                d = {**dec("ttft_vs_control", 1.0, 0.9, 1.1, aa, "higher" if aa == "direction" else ""),
                     **dec("throughput_ratio", 1.0, 0.9, 1.1, "undecided")}
            else:
                d = {**dec("ttft_vs_control", *decisions[arm]), **dec("throughput_ratio", *throughput)}
            rows.append({**base, **d, "point_id": f"serving_load/{arm}/{k}", "engine": "fifo" if arm == "aa" else arm,
                         "arm": "aa" if arm == "aa" else "main", "replicate": k})
    sweep = _points().assign(engine="static", point_id=["serving_load/s1", "serving_load/s2"])
    return pd.concat([sweep, pd.DataFrame(rows)], ignore_index=True)


def test_the_engines_verdicts_lead_the_finding_and_the_runs_stay_out_of_the_knee():
    """Synthetic design columns: static lower TTFT than fifo beyond noise is the finding's verdict, continuous's own
    verdict beside it; an undecided pick names the rounds and seconds it needs; fifo kept only when every other
    engine is slower or equivalent; a moved A/A control leaves it undecided. The comparison's runs (fifo falling
    behind at 9 req/s) never enter the knee scan, the recommendation or the sweep's figures."""
    pts = _compared({"static": (0.3, 0.2, 0.45, "direction", "lower"),
                     "continuous": (2.1, 1.4, 3.2, "direction", "higher")})
    f = serving_load.finding(pts, 0.9)
    assert f.text.startswith("Engines under the same load (9.00 req/s poisson, 8 requests a run, 3 rounds, a fresh "
                             "engine per run): static against fifo: TTFT p50 of the run: faster, 0.30x, 95% "
                             "interval 0.20-0.45x")
    assert "output throughput: higher, 1.30x" in f.text and "continuous vs fifo, TTFT p50: slower, 2.10x" in f.text
    assert f.verdict == "direction" and f.rounds == 3 and f.supported
    assert "custom SLO: static up to 2.00 req/s" in f.text          # the sweep's recommendation rides along
    assert "3 interleaved rounds" in f.evidence and "engine comparison: 12 runs" in f.evidence
    assert saturation.knees(pts) == {"static": 2.0} and set(serving_load.recommend(pts, 0.9)["engine"]) == {"static"}
    assert serving_load.headline(pts, 0.9) == serving_load.headline(saturation.sweep_points(pts), 0.9)
    assert list(saturation.sweep_points(pts)["point_id"]) == ["serving_load/s1", "serving_load/s2"]
    fig = serving_load.engine_ratio_figure(pts)
    drawn = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
    assert list(drawn[0].y) == [1.0, 0.3, 2.1] and "9.00 req/s" in fig.layout.title.text   # fifo, static, continuous
    assert any((t.name or "").startswith("A/A control 0.90-1.10x") for t in fig.data)
    open_ = serving_load.engines_finding(_compared({"static": (0.8, 0.6, 1.1, "undecided", "", 8)}))
    assert open_.verdict == "undecided" and open_.rounds_needed == 8 and open_.seconds_needed == 75.0
    assert "about 8 rounds (~75 s more)" in open_.text
    keep = serving_load.engines_finding(_compared({"static": (1.2, 1.05, 1.4, "direction", "higher"),
                                                   "continuous": (1.01, 0.97, 1.04, "equivalent", "")}))
    assert keep.verdict == "direction" and "keep fifo: every other engine is slower beyond noise or equivalent" in \
        keep.text
    moved = serving_load.engines_finding(_compared({"static": (0.3, 0.2, 0.45, "direction", "lower")}, aa="direction"))
    assert moved.verdict == "undecided" and "The A/A control moved" in moved.text
    invalid = serving_load.engines_finding(_compared({"static": (0.3, 0.2, 0.45, "direction", "lower")}, valid=False))
    assert invalid.verdict == "undecided" and "no usable run of the control (fifo" in invalid.text
    assert "--rerun-invalid" in invalid.text                             # the way on
    assert serving_load.engines_finding(_points()) is None        # no comparison: the sweep's finding alone
    assert serving_load.finding(_points(), 0.9).verdict == ""


def test_recommend_and_knees_from_synthetic_points():
    """Points of 2000 requests each (a narrow count band): fifo falls behind at 2 req/s, continuous keeps up."""
    pts = pd.DataFrame({
        "status": ["ok"] * 4, "engine": ["fifo", "fifo", "continuous", "continuous"],
        "profile": ["poisson"] * 4, "offered_rps": [1.0, 2.0, 1.0, 2.0], "request_throughput_rps": [1.0, 1.2, 1.0, 1.95],
        "requests_planned_window": [2000] * 4,
        "slo_attainment_custom": [1.0, 0.5, 1.0, 0.95], "goodput_rps_custom": [1.0, 0.6, 1.0, 1.9]})
    rec = serving_load.recommend(pts, target=0.9).set_index("slo")
    assert rec.loc["custom", "engine"] == "continuous" and rec.loc["custom", "max_rate_rps"] == 2.0
    assert saturation.knees(pts) == {"continuous": 2.0, "fifo": 1.0}


def _points(interval=True, **extra):
    """Synthetic serving points of one engine: open-loop rates 1 and 2 req/s that keep up and meet the SLO."""
    base = {"status": "ok", "valid": True, "engine": "fifo", "profile": "poisson", "stopped_early": False,
            "requests_unsent": 0, "requests_incomplete": 0, "requests_planned_window": 40,
            "arrival_count": 4000, "completion_count": 4000,  # a long run: kept up is determined
            "slo_attainment_custom": 1.0, "goodput_rps_custom": 1.0, "slo_attainment": 1.0}
    if interval:
        base.update(slo_attainment_low_custom=0.91, slo_attainment_high_custom=1.0, slo_attainment_low=0.91,
                    slo_attainment_high=1.0)
    rows = [dict(base, offered_rps=r, arrival_rps=r, completion_rps=r, goodput_rps_custom=r) for r in (1.0, 2.0)]
    rows += [dict(base, **x) for x in extra.get("more", [])]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("bad", [
    {"profile": "throughput", "offered_rps": 9.0},                   # a closed-loop burst
    {"profile": "poisson", "offered_rps": 9.0, "stopped_early": True},  # stopped for over-saturation
    {"profile": "poisson", "offered_rps": 9.0, "valid": False},      # measured under other load
])
def test_recommend_and_knee_ignore_invalid_closed_loop_and_early_stopped_points(bad):
    more = [dict(bad, arrival_rps=9.0, completion_rps=9.0, goodput_rps_custom=9.0)]
    pts = _points(interval=False, more=more)
    rec = serving_load.recommend(pts, target=0.9).set_index("slo")
    assert rec.loc["custom", "max_rate_rps"] == 2.0 and rec.loc["custom", "goodput_rps"] == 2.0
    assert saturation.knees(pts) == {"fifo": 2.0}
    rec = serving_load.recommend(_points(more=more), target=0.9).set_index("slo")  # with the interval columns
    assert rec.loc["custom", "max_rate_rps"] == 2.0 and rec.loc["custom", "attainment_low"] == 0.91
    assert rec.loc["custom", "requests"] == 40


def test_kept_up_is_one_definition():
    ok = {"profile": "poisson", "arrival_rps": 2.0, "completion_rps": 1.98, "stopped_early": False,
          "requests_unsent": 0, "requests_incomplete": 0, "arrival_count": 4000, "completion_count": 4000}
    assert serving_load.kept_up(ok) == "kept up"
    assert serving_load.kept_up(dict(ok, completion_rps=1.5)) == "fell behind"
    assert serving_load.kept_up(dict(ok, stopped_early=True)) == "fell behind"
    assert serving_load.kept_up(dict(ok, requests_unsent=3)) == "fell behind"
    assert serving_load.kept_up(dict(ok, requests_incomplete=1)) == "fell behind"
    assert serving_load.kept_up(dict(ok, profile="throughput")) is None


def test_kept_up_is_undetermined_within_the_noise_band():
    """40 requests: completions at 0.95 or 1.0 of arrivals cannot be told from 0.8 (the old fixed 10% tolerance said
    kept up); 0.5 is beyond the noise (fell behind); 4000 requests at 1.0 keep up."""
    row = {"profile": "poisson", "arrival_rps": 2.0, "stopped_early": False, "requests_unsent": 0,
           "requests_incomplete": 0, "arrival_count": 40, "completion_count": 40}
    assert serving_load.kept_up(dict(row, completion_rps=1.9)) == "undetermined"
    assert serving_load.kept_up(dict(row, completion_rps=2.0)) == "undetermined"
    assert serving_load.kept_up(dict(row, completion_rps=1.0)) == "fell behind"
    assert serving_load.kept_up(dict(row, completion_rps=2.0, arrival_count=4000, completion_count=4000)) == "kept up"
    old_rows = dict(row, completion_rps=1.9, arrival_count=None, completion_count=None, requests_planned_window=40)
    assert serving_load.kept_up(old_rows) == "undetermined"  # counts from the planned requests


def test_kept_up_decides_from_the_backlog_growth_where_it_is_known_with_the_tolerance_as_the_line():
    """The same 40-request counts (undetermined) with the in-flight growth test's bounds: a backlog share below the
    10% line kept up, above it fell behind, across it undetermined; a well-measured ratio of 0.95 keeps up (the
    tolerance is the line both ways)."""
    row = {"profile": "poisson", "arrival_rps": 2.0, "completion_rps": 1.9, "stopped_early": False,
           "requests_unsent": 0, "requests_incomplete": 0, "arrival_count": 40, "completion_count": 40}
    assert serving_load.kept_up(row) == "undetermined"
    assert serving_load.kept_up(dict(row, backlog_growth_low=-0.02, backlog_growth_high=0.06)) == "kept up"
    assert serving_load.kept_up(dict(row, backlog_growth_low=0.15, backlog_growth_high=0.4)) == "fell behind"
    assert serving_load.kept_up(dict(row, backlog_growth_low=0.02, backlog_growth_high=0.2)) == "undetermined"
    assert serving_load.kept_up(dict(row, backlog_growth_low=float("nan"), backlog_growth_high=0.06)) == "undetermined"
    assert serving_load.kept_up(dict(row, stopped_early=True, backlog_growth_low=-0.02,
                                     backlog_growth_high=0.06)) == "fell behind"
    assert serving_load.kept_up(dict(row, completion_rps=1.9, arrival_count=40000, completion_count=40000)) == "kept up"


def test_stopped_early_point_ends_the_knee_scan():
    """Rates 1 (kept up), 2 (stopped early), 3 (kept up by chance): the knee is 1, not 3; 2 is never recommended."""
    more = [{"offered_rps": 3.0, "arrival_rps": 3.0, "completion_rps": 3.0, "goodput_rps_custom": 3.0}]
    pts = _points(more=more)
    pts.loc[1, "stopped_early"] = True
    pts["status"], pts["valid"], pts["engine"], pts["profile"] = "ok", True, "fifo", "poisson"
    for c in ("requests_unsent", "requests_incomplete"):
        pts[c] = 0
    pts["arrival_count"] = pts["completion_count"] = 4000
    pts["requests_planned_window"] = 40
    assert saturation.knees(pts) == {"fifo": 1.0}
    assert "stopped early" in serving_load.headline(pts, 0.9)
    assert 2.0 not in serving_load.recommend(pts, 0.9)["max_rate_rps"].tolist()


def test_36_of_40_at_a_090_target_is_not_recommended():
    """Point attainment 0.90 over 40 requests: the one-sided 95% lower bound is 0.80 < 0.90, no recommendation and
    the finding is not supported; 40 of 40 (lower bound 0.94) is recommended and supported."""
    pts = _points().assign(slo_attainment_custom=0.9, slo_attainment=0.9, slo_attainment_low_custom=0.77,
                           slo_attainment_high_custom=0.96, slo_attainment_low=0.77, slo_attainment_high=0.96)
    rec = serving_load.recommend(pts, target=0.9).set_index("slo")
    assert rec.loc["custom", "engine"] == "" and rec.loc["custom", "verdict"].startswith("undetermined")
    f = serving_load.finding(pts, 0.9)
    assert not f.supported and f.text.startswith("Not supported")
    ok = serving_load.recommend(_points(), target=0.9).set_index("slo")
    assert ok.loc["custom", "engine"] == "fifo" and ok.loc["custom", "attainment_lower"] > 0.93
    assert serving_load.finding(_points(), 0.9).supported


def test_mlperf_preset_is_judged_at_p99_with_the_sample_size_rule():
    """An MLPerf preset with every request within its limits: undetermined at 40 requests (p99 needs 100), met when
    the p99 check passed over enough requests, never judged by 90% attainment."""
    pts = _points().assign(slo_attainment_mlperf_server=1.0, goodput_rps_mlperf_server=1.0,
                           percentiles_ok_mlperf_server=None)
    rec = serving_load.recommend(pts, target=0.9).set_index("slo")
    assert rec.loc["mlperf_server", "engine"] == "" and "p99 needs 100" in rec.loc["mlperf_server", "verdict"]
    rec = serving_load.recommend(pts.assign(percentiles_ok_mlperf_server=True), 0.9).set_index("slo")
    assert rec.loc["mlperf_server", "engine"] == "fifo"
    rec = serving_load.recommend(pts.assign(percentiles_ok_mlperf_server=False), 0.9).set_index("slo")
    assert rec.loc["mlperf_server", "verdict"] == "missed"


def test_replicate_grid_and_the_aa_control():
    """rounds 2 with the A/A control: the open-loop points once per round and arm (a seed per round), the A/A ratio
    paired by (rate step, round); a control that moved makes the finding not supported."""
    cfg = serving_load.Config(engines=["static"], sweep_points=1, rounds=2, aa_control=True)
    assert [(p["profile"], p.get("replicate"), p.get("arm")) for p in cfg.grid()] == [
        ("synchronous", None, None), ("throughput", None, None), ("poisson", 0, "main"), ("poisson", 0, "aa"),
        ("poisson", 1, "aa"), ("poisson", 1, "main")]
    pts = pd.concat([_points().assign(step=[1, 2], replicate=k, arm=arm, ttft_s_p90=[0.5 * f, 0.6 * f])
                     for k, (arm, f) in enumerate([("main", 1.0), ("aa", 1.02), ("main", 1.1), ("aa", 1.08)])])
    pts["replicate"] = [0, 0, 0, 0, 1, 1, 1, 1]
    aa = serving_load.aa_control(pts)
    assert aa["rounds"] == 4 and aa["aa_low"] < 1 < aa["aa_high"] and aa["design"] == "replicates"
    f = serving_load.finding(pts, 0.9)
    assert f.supported and "A/A control (4 run pairs, ttft_s_p90)" in f.evidence
    moved = pts.assign(ttft_s_p90=np.where(pts["arm"] == "aa", pts["ttft_s_p90"] * 1.5, pts["ttft_s_p90"]))
    f = serving_load.finding(moved, 0.9)
    assert not f.supported and "the A/A control moved" in f.evidence
    assert serving_load.aa_control(_points()) is None


def test_headline_names_its_evidence_and_agrees_with_attainment():
    """Completions fell behind at every rate while every request met the SLO: the finding says both."""
    pts = _points()
    text = serving_load.headline(pts, 0.9)
    assert "kept up to 2.00 req/s" in text and "95% Wilson interval 0.91-1.00" in text and "40 planned" in text
    behind = pts.assign(completion_rps=pts["arrival_rps"] * 0.5)
    text = serving_load.headline(behind, 0.9)
    assert "did not keep up even at its lowest" in text and "fell behind" in text
    straddles = pts.assign(backlog_growth_low=-0.02, backlog_growth_high=0.2)   # the growth test across the line
    told = serving_load.headline(straddles, 0.9)
    assert "undetermined even at its lowest" in told and "backlog grew -2% to 20% of arrivals, across the 10% line" in told
    assert "custom-SLO attainment 1.00 (95% Wilson interval 0.91-1.00) stayed at target" in text
    assert "no open-loop rate kept up" not in text
    assert serving_load.recommend(behind, 0.9).iloc[0]["engine"] == ""  # a growing queue is not recommended


def test_finding_is_supported_only_when_the_lower_bound_reaches_the_target_on_usable_points():
    """40 planned requests all meeting the SLO: lower bound 0.94 >= 0.90, supported; 5 requests (lower bound 0.65)
    are not; no usable point (all closed-loop) is not supported either."""
    pts = _points()
    f = serving_load.finding(pts, 0.9)
    assert f.supported and "40 planned" in f.evidence and "lower bound 0.94" in f.evidence
    assert f.text.startswith("custom SLO: ")  # the claim the mark rests on is the first clause (issue 32)
    assert "Evidence:" not in f.text
    few = serving_load.finding(pts.assign(requests_planned_window=5), 0.9)
    assert not few.supported
    assert not serving_load.finding(pts.assign(profile="throughput"), 0.9).supported


def test_point_goodput_at_a_constant_rate_is_the_offered_rate():
    """A whole point's columns from a synthetic run at 3.0 req/s (5 requests of 0.8 s, all within the SLO):
    goodput and request throughput within 5% of 3.0, attainment 1 with its interval, columns named with units."""
    from workbench.load import load

    rows = [{"request_id": i, "t_scheduled_s": i / 3.0, "t_start_s": i / 3.0, "t_end_s": i / 3.0 + 0.8,
             "ttft_s": 0.2, "tpot_s": 0.05, "e2e_s": 0.8, "output_tokens": 4, "prompt_tokens": 40, "error": None,
             "queue_s": 0.0} for i in range(5)]
    summary = {"profile": "constant", "rate": 3.0, "concurrency": None, "stopped_early": False}
    summary.update(load.apply_window(rows, 0.0, 0.0, open_loop=True))
    summary.update(load.flow_rates(rows))
    res = load.LoadResult(rows, summary, load.time_slices(rows, 1.0))
    cfg = serving_load.Config(engines=["fifo"], slo_ttft_s=1.0, slo_tpot_s=0.1, slo_presets=["mlperf_server"])
    cols = serving_load.point_columns(res, cfg, 3.0, float("nan"))
    for c in ("goodput_rps", "goodput_rps_custom", "request_throughput_rps"):
        assert abs(cols[c] - 3.0) / 3.0 < 0.05, (c, cols[c])
    assert cols["slo_attainment"] == 1.0 and 0.5 < cols["slo_attainment_low"] < 1.0 == cols["slo_attainment_high"]
    assert cols["percentiles_ok_mlperf_server"] is None  # p99 from 5 requests is not supported
    assert cols["kept_up"] == "undetermined" and 0 < cols["littles_law_ratio"] <= 1.0  # 5 requests: the run drains inside
    assert {"input_throughput_tps", "total_throughput_tps", "mean_concurrency"} <= set(cols)


@pytest.mark.model
def test_tiny_load_sweep_on_the_real_model(loaded):
    cfg = serving_load.Config(engines=["fifo", "continuous"], requests_per_point=3, prompt_tokens=40,
                              max_new_tokens=3, max_batch_size=4, sweep_points=1, warmup=1, slice_s=1.0)
    run = results.create_run()
    points = serving_load.run(cfg, run, loaded)
    assert (points["status"] == "ok").all(), points["status"].tolist()
    assert len(points) == 6
    req = results.read_requests(run, experiment="serving_load")
    assert (req["output_tokens"] == 3).all()
    assert (req["queue_s"] >= 0).all() and (req["ttft_s"] >= req["queue_s"] - 1e-6).all()
    assert {"slo_attainment_mlperf_server", "goodput_rps_custom", "offered_rps", "saturation_rule",
            "slo_attainment_low", "input_throughput_tps", "mean_concurrency", "engine_batch_max"} <= set(points)
    # per point, not the engine's lifetime peak: the warm-up ran a batch of 3, synchronous requests run alone
    sync = points[points["profile"] == "synchronous"]
    assert (sync["engine_batch_max"] == 1).all(), sync[["engine", "engine_batch_max"]]
    assert (points["engine_batch_mean"] <= points["engine_batch_max"] + 1e-9).all()
    sync_req = req[req["point_id"].isin(sync["point_id"])]
    assert (sync_req["engine_batch"] == 1).all()  # each request's own batch, not the engine's lifetime peak
    figs = serving_load.figures(points, req)
    assert set(figs) == {"load_latency_vs_throughput", "load_goodput_vs_rate", "load_queue_vs_rate", "load_gantt",
                         "load_time_slices", "load_recommendation"}
    assert isinstance(serving_load.headline(points), str)


@pytest.mark.model
def test_tiny_engine_comparison_on_the_real_model(loaded):
    """fifo and static compared under one load on the real model, 2 rounds: the control's synchronous probe sets
    the rate (kept in the run folder), the design's table holds every engine and the A/A arm in both rounds, each run
    is a point with the decision columns, the sweep's points alone set the knee, and the finding carries a verdict."""
    import json

    from workbench.run import design

    cfg = serving_load.Config(engines=["static"], requests_per_point=3, prompt_tokens=32, max_new_tokens=2,
                              max_batch_size=4, sweep_points=1, warmup=0, slice_s=1.0, slo_presets=[],
                              compare_engines=["fifo", "static"], compare_requests=3, repeats=2, max_rounds=2)
    run = results.create_run()
    points = serving_load.run(cfg, run, loaded)
    assert (points["status"] == "ok").all(), points["status"].tolist()
    table = pd.read_parquet(run / "design" / "serving_load.parquet")
    assert len(table) == 2 * 3 and set(table["arm"]) == {"fifo", "static", design.AA}
    assert (table["ttft_s_p50"] > 0).all() and (table["run_output_tps"] > 0).all()
    rate = json.loads((run / serving_load.COMPARE_FILE).read_text())
    assert rate["engine"] == "fifo" and rate["rate_rps"] == pytest.approx(cfg.compare_load * rate["synchronous_rps"])
    runs = points[points["comparison"] == "engines"]
    assert len(runs) == 6 and np.allclose(runs["offered_rps"], rate["rate_rps"])
    assert runs.loc[runs["engine"] == "static", "ttft_vs_control_verdict"].isin(("direction", "equivalent",
                                                                                 "undecided")).all()
    req = results.read_requests(run, experiment="serving_load")
    assert (req[req["point_id"].isin(runs["point_id"])].groupby("point_id").size() == 3).all()
    assert len(saturation.sweep_points(points)) == 3
    f = serving_load.finding(points.assign(valid=True), 0.9, run)
    assert f.text.startswith("Engines under the same load") and f.verdict in ("direction", "equivalent", "undecided")


class _FakeBench:
    """Stands in for the experiment's engine holder: one worker serving each request in 0.04 s (no model)."""

    def __init__(self, n):
        import threading
        import time

        from workbench.load import load
        from workbench.stats import metrics

        self.specs = [load.RequestSpec("x", 2) for _ in range(n)]
        self.rates, self.opened, self.closed = {}, [], 0
        lock, state = threading.Lock(), {"free": 0.0}

        def send(spec, t_sched):
            t_sent = time.perf_counter()
            with lock:
                start = max(t_sent, state["free"])
                state["free"] = start + 0.04
            time.sleep(max(0.0, start + 0.04 - time.perf_counter()))
            t = time.perf_counter()
            timing = metrics.request_timing([t - 0.01, t], t_sched)
            return {"t_sent": t_sent, "t_done": t, "ttft_s": timing["ttft_s"], "e2e_s": timing["e2e_s"],
                    "tpot_s": timing["tpot_s"], "output_tokens": 2, "itl_s": timing["itl_s"]}

        self.send = send

    def open(self, name):
        self.opened.append(name)

    def close(self):
        self.closed += 1


def test_search_measures_missing_rates_and_reports_knee_and_history():
    import json

    cfg = serving_load.Config(engines=["fifo"], requests_per_point=6, arrival="constant", slo_ttft_s=0.1,
                              slo_tpot_s=1.0, search_slo="custom", search_steps=3, attainment_target=0.9, device="cpu")
    bench = _FakeBench(6)
    out = serving_load.search(cfg, bench)
    row = out.iloc[0]
    assert bench.opened == ["fifo"] and bench.closed == 1
    assert set(bench.rates["fifo"]) == {"synchronous", "throughput"}  # measured here: no sweep ran
    assert row["sync_rps"] > 0 and row["max_throughput_rps"] > 0 and 1 <= row["measurements"] <= 3
    hist = json.loads(row["history_json"])
    assert len(hist) == row["measurements"]
    assert {"rate_rps", "attainment", "arrival_rps", "completion_rps", "stopped_early"} <= set(hist[0])
    assert row["max_rate_rps"] in [h["rate_rps"] for h in hist] + [0.0]
    assert row["knee_rps"] != row["knee_rps"] or row["knee_rps"] > 0


def test_endpoint_points_with_a_fake_sender(monkeypatch):
    """An endpoint target's points: labelled with its name, no engine sampled (engine_batch NaN), the target
    described (URL, model, the key's variable NAME) and ``server_side_note`` saying why the server-side columns
    are empty; built-in engines' points carry an empty note. The sender is a fake (the real one is exercised
    against a second server process in tests/load/test_endpoint.py)."""
    import time

    from workbench.load import endpoint

    def fake_sender(ep, **kw):
        def send(spec, t_sched):
            now = time.perf_counter()
            row = {"t_sent": now, "t_done": now + 0.01, "ttft_s": 0.005, "e2e_s": 0.01,
                   "output_tokens": spec.max_tokens, "prompt_tokens": 32, "tpot_s": 0.001, "queue_s": float("nan"),
                   "error": None, "itl_s": []}
            row["server_side_note"] = endpoint.server_side_note(row)
            return row
        return send

    monkeypatch.setattr(endpoint, "sender", fake_sender)
    monkeypatch.setattr(endpoint, "local_server_pid", lambda ep: None)
    cfg = serving_load.Config(engines=["endpoint"], endpoint={"url": "https://h:1", "model": "m",
                                                              "api_key_env": "WORKBENCH_KEY_K",
                                                              "name": "ext"}, requests_per_point=3, prompt_tokens=32,
                              max_new_tokens=2, sweep_points=1, warmup=0, slo_presets=[])


    from workbench.load.bench import Bench
    from workbench.share.figures_serving import engine_colours

    bench = Bench.__new__(Bench)
    bench.cfg, bench.loaded = cfg, None
    bench.specs = [serving_load.load.RequestSpec("hi", 2, 32) for _ in range(3)]
    bench.name = bench.engine = bench.server = bench.send = bench.served_pid = None
    bench.rates = {}
    state = {"bench": bench}
    res = [serving_load.measure_point(None, cfg, p, state) for p in cfg.grid()]
    for r in res:
        assert r.extra["server_side_note"] == endpoint.SERVER_SIDE_NOTE
        assert r.extra["endpoint_name"] == "ext" and r.extra["endpoint_api_key_env"] == "WORKBENCH_KEY_K"
        assert r.extra["engine_batch_mean"] != r.extra["engine_batch_mean"]  # NaN: no engine to sample
        assert all(q["engine_batch"] is None for q in r.requests)
    colours = engine_colours(["fifo", "ext"])
    assert colours["ext"] not in (colours["fifo"], colours["static"], colours["continuous"])


def test_a_rerun_places_swept_rates_from_the_recorded_closed_loop_points():
    """--rerun-invalid of a swept point alone: its engine's synchronous and throughput rates come from the run's
    earlier session (before: 'the swept rates need this engine's synchronous and throughput points first')."""
    from workbench.run import results

    run = results.create_run("rates")
    rows = [{"experiment": "serving_load", "point_id": f"serving_load/engine=static,profile={p}", "engine": "static",
             "profile": p, "status": s, "offered_rps": v}
            for p, s, v in (("synchronous", "ok", 1.5), ("throughput", "ok", 3.0), ("poisson", "ok", 2.0),
                            ("throughput", "failed: x", 9.0))]
    rows.append({**rows[0], "engine": "fifo", "status": "failed: y"})
    results.write_table(run / "points.parquet", pd.DataFrame(rows))
    assert serving_load.recorded_rates({}, run) == {"static": {"synchronous": 1.5, "throughput": 3.0}}
    assert serving_load.recorded_rates({}, results.create_run("empty")) == {}


def test_closed_loop_points_send_closed_loop_requests_and_open_loop_points_all(monkeypatch):
    """``closed_loop_requests``: the synchronous and throughput points send the first N prompts (they only set the
    sweep's range), the open-loop points every one of ``requests_per_point`` (the growth test needs them); without
    it every point sends them all. A fake sender counts what each point sent."""
    import time

    from workbench.load import endpoint
    from workbench.load.bench import Bench

    sent = []

    def fake_sender(ep, **kw):
        def send(spec, t_sched):
            sent.append(spec)
            now = time.perf_counter()
            return {"t_sent": now, "t_done": now + 0.001, "ttft_s": 0.0005, "e2e_s": 0.001, "itl_s": [],
                    "output_tokens": spec.max_tokens, "prompt_tokens": 32, "tpot_s": 0.0001, "queue_s": 0.0,
                    "error": None, "server_side_note": ""}
        return send

    monkeypatch.setattr(endpoint, "sender", fake_sender)
    monkeypatch.setattr(endpoint, "local_server_pid", lambda ep: None)
    counts = {}
    for closed, sync in ((None, None), (3, None), (3, 2)):
        cfg = serving_load.Config(engines=["endpoint"], endpoint={"url": "https://h:1", "model": "m", "name": "ext"},
                                  requests_per_point=8, closed_loop_requests=closed, synchronous_requests=sync,
                                  prompt_tokens=32,
                                  max_new_tokens=2, sweep_points=1, warmup=0, slo_presets=[])
        bench = Bench.__new__(Bench)
        bench.cfg, bench.loaded = cfg, None
        bench.specs = [serving_load.load.RequestSpec(f"p{i}", 2, 32) for i in range(8)]
        bench.name = bench.engine = bench.server = bench.send = bench.served_pid = None
        bench.rates = {}
        state = {"bench": bench}
        for p in cfg.grid():
            sent.clear()
            res = serving_load.measure_point(None, cfg, p, state)
            counts[(closed, sync, p["profile"])] = (len(sent), len(res.requests), [s.prompt for s in sent])
    for prof in ("synchronous", "throughput", "poisson"):
        assert counts[(None, None, prof)][:2] == (8, 8)
    for prof in ("synchronous", "throughput"):
        assert counts[(3, None, prof)][:2] == (3, 3)
        assert sorted(counts[(3, None, prof)][2]) == ["p0", "p1", "p2"]
    assert counts[(3, None, "poisson")][:2] == (8, 8)
    # synchronous_requests: the synchronous point alone sends fewer (the throughput burst keeps its own)
    assert counts[(3, 2, "synchronous")][:2] == (2, 2) and sorted(counts[(3, 2, "synchronous")][2]) == ["p0", "p1"]
    assert counts[(3, 2, "throughput")][:2] == (3, 3) and counts[(3, 2, "poisson")][:2] == (8, 8)


def test_the_knee_line_sits_on_the_knee_points_offered_rate():
    """The knee is a point's realised arrival rate (a few percent below its offered rate with a fixed arrival seed);
    the goodput figure's x axis is the offered rate, so its dotted line is drawn at that point's offered rate (it
    was drawn at the realised one, left of the point that kept up), labelled with the realised value."""
    from workbench.share.figures_serving import goodput_vs_rate

    pts = _points()
    pts["offered_rps"] = [1.1, 2.3]                     # arrived at 1.0 and 2.0
    pts["goodput_rps"] = pts["goodput_rps_custom"]
    assert saturation.knees(pts) == {"fifo": 2.0}
    fig = goodput_vs_rate(pts)
    xs = {s["x0"] for s in fig.layout.shapes}
    assert xs == {2.3}
    assert any("knee: 2 req/s arrived" in t.name for t in fig.data)     # in the legend (an annotation ran off the axis)


def test_closed_loop_points_are_drawn_apart_from_the_open_loop_line():
    """A closed-loop point's "offered" rate is the rate it reached (another experiment than an offered arrival rate):
    the goodput and queue figures join only the open-loop points by a line and draw the closed-loop ones as markers
    of their own trace (a run's figure ran one line from the synchronous point through the swept rates to the
    throughput burst)."""
    from workbench.share.figures_serving import goodput_vs_rate, queue_vs_rate

    more = [{"profile": "synchronous", "offered_rps": 0.5, "arrival_rps": 0.5, "completion_rps": 0.5},
            {"profile": "throughput", "offered_rps": 5.0, "arrival_rps": 5.0, "completion_rps": 5.0}]
    pts = _points(more=more)
    pts["goodput_rps"] = pts["goodput_rps_custom"]
    pts["queue_s_p50"], pts["queue_s_p90"] = 0.1, 0.2
    for fig in (goodput_vs_rate(pts), queue_vs_rate(pts)):
        lines = [t for t in fig.data if "lines" in t.mode and "knee" not in t.name]
        closed = [t for t in fig.data if "closed loop" in t.name]
        assert lines and all(sorted(t.x) == [1.0, 2.0] for t in lines)
        assert closed and all(t.mode == "markers" and sorted(t.x) == [0.5, 5.0] for t in closed)


def test_an_engine_pick_not_shown_better_than_its_runner_up_is_undecided(monkeypatch):
    """The pick rule of every best-of finding (blocks.best_of): static beats fifo, but the rounds cannot tell it from
    continuous (the runner-up, Tukey's level from the run's design table): the engine choice is undecided."""
    import numpy as np

    from workbench.run import design
    from workbench.stats import blocks

    pts = _compared({"static": (0.3, 0.2, 0.45, "direction", "lower"),
                     "continuous": (0.32, 0.21, 0.48, "direction", "lower")})
    drift, wobble = np.array([0.1, -0.2, 0.3]), np.array([0.05, -0.05, 0.04])
    table = {"fifo": np.exp(drift), "static": np.exp(drift - 1.2 + wobble), "continuous": np.exp(drift - 1.15 - wobble)}
    rounds = pd.DataFrame([(a, r, v) for a, vals in table.items() for r, v in enumerate(vals)],
                          columns=["arm", "round", "value"])
    monkeypatch.setattr(design, "reanalyse", lambda *a, **k: (None, blocks.analyse(rounds, "fifo", aa=None)))
    f = serving_load.engines_finding(pts, "a run folder")
    assert "static against fifo: TTFT p50 of the run: faster" in f.text
    assert "Against the runner-up, continuous: undecided" in f.text and f.verdict == "undecided"
    rounds.loc[rounds["arm"] == "continuous", "value"] *= 1.8
    assert serving_load.engines_finding(pts, "a run folder").verdict == "direction"


def test_a_point_measured_under_other_load_is_greyed_in_every_rate_figure():
    """A fresh user's run: the goodput and latency figures drew an invalid point (other load) as a valid one on the
    engine's line; now each panel that draws it crosses it out in grey, one legend entry for the figure."""
    from workbench.share.figures_serving import goodput_vs_rate, latency_vs_throughput, queue_vs_rate
    from workbench.share.plots import INVALID_NAME

    more = [{"profile": "poisson", "offered_rps": 3.0, "arrival_rps": 3.0, "completion_rps": 3.0, "valid": False,
             "invalid_reason": "other load"}]
    pts = _points(more=more)
    pts["goodput_rps"] = pts["goodput_rps_custom"]
    pts["queue_s_p50"], pts["queue_s_p90"] = 0.1, 0.2
    pts["ttft_s_p50"], pts["tpot_s_p50"], pts["output_throughput_tps"] = 0.05, 0.02, [10.0, 20.0, 30.0]
    pts["ttft_s_p90"] = pts["ttft_s_p99"] = float("nan")
    for fig, panels in ((goodput_vs_rate(pts), 2), (latency_vs_throughput(pts), 2), (queue_vs_rate(pts), 1)):
        crosses = [t for t in fig.data if t.name == INVALID_NAME]
        assert len(crosses) == panels and sum(bool(t.showlegend) for t in crosses) == 1, fig.layout.title.text
        assert all(list(t.x) in ([3.0], [30.0]) for t in crosses)
    assert len({t.xaxis for t in latency_vs_throughput(pts).data if t.name == INVALID_NAME}) == 2   # one per panel


def test_an_undecided_throughput_beside_a_decided_ttft_names_no_rounds_of_the_ttfts():
    """The run's output throughput is the engine design's secondary outcome: undecided beside a decided TTFT it read
    "about 0 rounds would decide it" (the row's ``rounds_needed`` is the primary's; a default run, 2026-12-08)."""
    pts = _compared({"static": (0.3, 0.2, 0.45, "direction", "lower"),
                     "continuous": (0.6, 0.45, 0.8, "direction", "lower")},
                    throughput=(1.66, 0.85, 3.26, "undecided", ""))
    f = serving_load.finding(pts.assign(rounds_needed=0.0), 0.9)
    assert "output throughput: undecided: 1.66x, 95% interval 0.85-3.26x" in f.text
    assert "0 rounds" not in f.text
