"""Experiment 11 (scheduling): bad input before any model, the mixed trace, per-class and per-bucket figures by
hand on a small table, the recommendation and the finding, and a tiny real run."""
import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import no_work
from workbench import ParameterError
from workbench.experiments import scheduling
from workbench.load import traces
from workbench.run import results
from workbench.stats import classes


@pytest.mark.parametrize("kwargs,name", [
    ({"policies": ["lottery"]}, "policies"),
    ({"engine": "continuous"}, "engine"),
    ({"lane_threshold_tokens": 0}, "lane_threshold_tokens"),
    ({"aging_s": 0}, "aging_s"),
    ({"long_cap": 0}, "long_cap"),
    ({"short_share": 1.0}, "short_share"),
    ({"long_max_tokens": 4, "short_max_tokens": 6}, "long_max_tokens"),
    ({"class_slo_ttft_s": {"interactive": 2.0}}, "class_slo_ttft_s"),
    ({"class_slo_ttft_s": {"interactive": 2.0, "background": 0}}, "class_slo_ttft_s[background]"),
    ({"abandon_share": 2}, "abandon_share"),
    ({"sjf_predictor": "oracle"}, "sjf_predictor"),
    ({"prefix_group_requests": 1, "shared_prefix_tokens": 64}, "prefix_group_requests"),
    ({"prefix_group_requests": 4, "shared_prefix_tokens": 0}, "prefix_group_requests"),
])
def test_invalid_config_is_one_line_before_any_model(kwargs, name, monkeypatch):
    no_work(monkeypatch)
    with pytest.raises(ParameterError) as err:
        scheduling.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_grid_and_the_prefix_sharing_switch(monkeypatch):
    cfg = scheduling.Config(policies=["fcfs", "sjf"], turns=2)
    assert cfg.grid() == [{"workload": "mixed", "policy": "fcfs", "prefix_sharing": False, "replicate": 0, "arm": "fcfs"},
                          {"workload": "mixed", "policy": "sjf", "prefix_sharing": False, "replicate": 0, "arm": "sjf"},
                          {"workload": "multiturn", "policy": "fcfs", "prefix_sharing": False, "replicate": 0,
                           "arm": "off"}]
    assert len(scheduling.Config(turns=0).grid()) == 4
    group = scheduling.Config(policies=["fcfs"], turns=0, prefix_group_requests=3, shared_prefix_tokens=64).grid()
    assert [(p["workload"], p["arm"]) for p in group] == [("mixed", "fcfs"), ("shared_prefix", "off")]
    # rounds: the policies are a design: every arm once per round up to max_rounds (a point per run it takes), the
    # A/A arm runs fcfs again with the same seeds; the prefix points measured both ways another design with its own
    two = scheduling.Config(policies=["fcfs", "sjf"], turns=0, rounds=2, max_rounds=3, aa_control=True)
    assert two.policy_design() and not two.prefix_design() and two.design_kwargs()["min_rounds"] == 2
    assert [(p["replicate"], p["arm"], p["policy"]) for p in two.grid()] == [
        (k, a, "sjf" if a == "sjf" else "fcfs") for k in range(3) for a in ("fcfs", "sjf", "fcfs_aa")]
    no_work(monkeypatch)
    if scheduling.prefix_sharing_available():
        both = scheduling.Config(policies=["fcfs"], turns=2, rounds=2, max_rounds=2, aa_control=True,
                                 multiturn_prefix_sharing=[False, True])
        assert both.prefix_design() and not both.policy_design()       # one policy: nothing to compare
        assert [(p["workload"], p["replicate"], p["arm"]) for p in both.grid() if p["workload"] != "mixed"] == [
            ("multiturn", k, a) for k in range(2) for a in ("off", "on", "off_aa")]
        assert [p["replicate"] for p in both.grid() if p["workload"] == "mixed"] == [0, 1]   # rounds, not max
    with pytest.raises(ParameterError, match="^max_rounds:"):
        scheduling.Config(rounds=4, max_rounds=3)
    no_work(monkeypatch)
    with pytest.raises(ParameterError, match="^multiturn_prefix_sharing:"):
        scheduling.Config(multiturn_prefix_sharing=[True, True])
    if not scheduling.prefix_sharing_available():
        with pytest.raises(ParameterError, match="^multiturn_prefix_sharing: this version"):
            scheduling.Config(multiturn_prefix_sharing=[False, True])


def test_cache_hit_rate_by_hand():
    rows = pd.DataFrame({"prompt_tokens": [100, 200, 300], "cached_tokens": [0, 96, 288]})
    assert classes.cache_columns(rows, True)["cache_hit_rate"] == pytest.approx(384 / 600)
    none = classes.cache_columns(rows.assign(cached_tokens=None), False)
    assert none["cache_hit_rate"] != none["cache_hit_rate"] and "not available" in none["cache_note"]


#: a design's common columns on every point it records (workbench.run.design.DesignResult.point_columns)
_DESIGN = {"design": "interleaved", "margin": 1.05, "design_seconds": 60.0, "seconds_per_round": 15.0,
           "design_stopped": "max rounds", "rounds_needed": float("nan")}


def _decision(prefix, est, lo, hi, verdict, direction="", need=0):
    return {prefix: est, f"{prefix}_low": lo, f"{prefix}_high": hi, f"{prefix}_level": 0.95,
            f"{prefix}_verdict": verdict, f"{prefix}_direction": direction,
            f"{prefix}_method": "pooled block model, 6 dof, Dunnett over 2", **({"rounds_needed": need} if need else {})}


def _prefix_table(on=(0.55, 0.45, 0.66, "direction", "lower"), rounds=4, aa="equivalent"):
    """Multi-turn points as the prefix design records them (one point per run: sharing off, on and off again, per
    round), each run two conversations of two turns, prompts 100 and 200 tokens, turn 2 reusing 96 tokens with sharing
    on; the on arm's decision ``on`` = (ratio, low, high, verdict, direction)."""
    rows, pts = [], []
    off_ttft = [0.50, 0.90, 0.55, 1.00]
    nan = float("nan")
    for k in range(rounds):
        for arm in ("off", "on", "off_aa"):
            share = arm == "on"
            pid = f"p/multiturn/{arm}/{k}"
            dec = (_decision("sharing_ttft_ratio", *on) if share else
                   _decision("sharing_ttft_ratio", 1.0, nan, nan, "") if arm == "off" else
                   _decision("sharing_ttft_ratio", 1.01, 0.95, 1.07, aa, "higher" if aa == "direction" else ""))
            pts.append({"point_id": pid, "status": "ok", "valid": True, "workload": "multiturn", "policy": "fcfs",
                        "prefix_sharing": share, "profile": "multiturn", "stopped_early": False, "replicate": k,
                        "arm": arm, **_DESIGN, "rounds": rounds, "aa_ratio": 1.01, "aa_low": 0.95, "aa_high": 1.07,
                        "aa_verdict": aa, **dec})
            for i, (conv, turn) in enumerate([(0, 1), (0, 2), (1, 1), (1, 2)]):
                rows.append({"point_id": pid, "workload": "multiturn", "policy": "fcfs", "request_class": "interactive",
                             "prefix_sharing": share, "conversation": conv, "turn": turn, "prompt_tokens": 100 * turn,
                             "cached_tokens": 96 if share and turn == 2 else 0,
                             "ttft_s": off_ttft[i] * (on[0] if share else 1.0), "error": None, "output_tokens": 4})
            # an abandoned request (no token) is left out
            rows.append(dict(rows[-1], conversation=9, ttft_s=float("nan"), output_tokens=0))
    return pd.DataFrame(pts), pd.DataFrame(rows)


def test_prefix_savings_carry_the_prefix_designs_decision_beside_the_cache_hit_rate():
    """The prefix design's decision (sharing on over off, the run as the unit) beside the cache hit rate and each
    side's mean run TTFT; an interval straddling 1 is undecided with the rounds it would take, one inside the margin
    equivalent; one round (no design) is undecided; a moved A/A control leaves the verdict undecided."""
    pts, req = _prefix_table()
    sav = scheduling.prefix_savings(pts, req).set_index("workload").loc["multiturn"]
    mean_off = np.mean([0.50, 0.90, 0.55, 1.00])
    assert sav["rounds"] == 4 and sav["ttft_s_mean_off"] == pytest.approx(mean_off)   # A/A runs not in "off"
    assert sav["ttft_saved_s"] == pytest.approx(mean_off * 0.45)
    assert sav["sharing_ttft_ratio"] == 0.55 and sav["sharing_ttft_ratio_high"] == 0.66 and sav["verdict"] == "saves"
    assert sav["cache_hit_rate_on"] == pytest.approx(4 * 192 / (4 * 600)) and sav["cache_hit_rate_off"] == 0
    f = scheduling.prefix_finding(pts, req)
    assert f.text.startswith("Prefix sharing (continuous engine, on vs off, the run as the unit): multiturn: cache "
                             "hit rate 32% with sharing on, run TTFT on / off: faster, 0.55x, 95% interval 0.45-0.66x")
    assert f.verdict == "direction" and "multiturn: 4 rounds" in f.evidence and "4 interleaved rounds" in f.evidence
    open_ = scheduling.prefix_finding(*_prefix_table(on=(0.8, 0.55, 1.2, "undecided", "", 11)))
    assert open_.verdict == "undecided" and "undecided: 0.80x" in open_.text and "about 11 rounds (~105 s more)" in \
        open_.text and open_.rounds_needed == 11
    same = scheduling.prefix_savings(*_prefix_table(on=(1.01, 0.97, 1.04, "equivalent", ""))).iloc[0]
    assert same["verdict"] == "equivalent"
    moved = scheduling.prefix_finding(*_prefix_table(aa="direction"))
    assert moved.verdict == "undecided" and "the A/A control moved" in moved.text
    one_pts, one_req = _prefix_table(rounds=1)
    one_pts = one_pts[one_pts["arm"] != "off_aa"].drop(columns=["design"])
    one = scheduling.prefix_savings(one_pts, one_req).iloc[0]
    assert one["verdict"] == "undecided" and one["sharing_ttft_ratio"] == pytest.approx(0.55)
    assert one["sharing_ttft_ratio_low"] != one["sharing_ttft_ratio_low"]          # one pair of runs: no interval
    assert scheduling.prefix_finding(one_pts, one_req).verdict == "undecided"
    assert scheduling.prefix_savings(pts[pts["arm"] != "on"], req).empty  # one side only: nothing to compare
    assert scheduling.prefix_finding(pts.iloc[:1], req) is None  # not measured both ways: nothing to say
    invalid = scheduling.prefix_finding(pts.assign(valid=False), req)  # measured, not usable: said so
    assert invalid.verdict == "undecided" and invalid.text.startswith("Prefix sharing: undecided")
    fig = scheduling.prefix_cache_savings(pts, req)
    assert list(fig.data[0].x) == [pytest.approx(0.32)] and list(fig.data[0].y) == [0.55]


def _write(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return p


def test_a_trace_row_whose_class_has_no_slo_is_a_one_line_error(tmp_path, monkeypatch):
    no_work(monkeypatch)
    row = {"offset_s": 0, "prompt_tokens": 32, "output_tokens": 4, "request_class": "interactive"}
    bad = _write(tmp_path, [row, dict(row, offset_s=1, request_class="batch")])
    with pytest.raises(ParameterError) as err:
        scheduling.Config(trace=str(bad))
    assert str(err.value).startswith("trace: line 2: request_class 'batch' has no SLO") and "\n" not in str(err.value)
    with pytest.raises(ParameterError, match=r"^trace: line 1: priority:"):
        traces.read_mixed_trace(_write(tmp_path, [dict(row, priority=1.5)]), {"interactive": 1.0})
    ok = traces.read_mixed_trace(_write(tmp_path, [dict(row, priority=-3)]), {"interactive": 1.0})
    assert ok == [dict(row, priority=-3)]


def test_the_sample_mixed_trace_reads_and_the_generator_follows_its_distributions():
    rows = traces.read_mixed_trace("data/traces/mixed_trace.jsonl", {"interactive": 2.0, "background": 30.0})
    assert {r["request_class"] for r in rows} == {"interactive", "background"}
    gen = traces.mixed_trace(400, 0.7, [32, 48], [64, 96], 6, 32, 2.0, seed=3)
    short = [r for r in gen if r["request_class"] == "interactive"]
    assert 0.6 < len(short) / len(gen) < 0.8
    assert {r["output_tokens"] for r in short} == {6} and {r["priority"] for r in short} == {0}
    assert {r["prompt_tokens"] for r in gen if r["request_class"] == "background"} == {64, 96}
    gaps = np.diff([r["offset_s"] for r in gen])
    assert 0.4 < gaps.mean() < 0.6  # Poisson at 2 requests/s
    assert gen == traces.mixed_trace(400, 0.7, [32, 48], [64, 96], 6, 32, 2.0, seed=3)


def _table():
    """Two policies, three requests each (two interactive of 4 tokens, one background of 16), paired by id."""
    rows = []
    for policy, ttft, queue, e2e in (("fcfs", [1.0, 3.0, 1.0], [0.5, 2.5, 0.0], [2.0, 4.0, 8.0]),
                                     ("sjf", [0.5, 1.0, 3.0], [0.0, 0.5, 2.0], [1.0, 2.0, 10.0])):
        for i, c in enumerate(("interactive", "interactive", "background")):
            rows.append({"point_id": f"p/{policy}", "workload": "mixed", "policy": policy, "request_id": i,
                         "request_class": c, "max_tokens": 4 if c == "interactive" else 16, "ttft_s": ttft[i],
                         "queue_s": queue[i], "e2e_s": e2e[i], "slowdown": e2e[i] / (1.0 if i < 2 else 4.0),
                         "error": None, "output_tokens": 4 if i < 2 else 16, "eta_s": queue[i] + 0.5,
                         "eta_error_s": 0.5, "abandoned": i == 1 and policy == "fcfs", "retries": 0})
    return pd.DataFrame(rows)


def test_per_class_and_per_bucket_figures_by_hand():
    summ = classes.class_summary(_table()).set_index(["policy", "request_class"])
    fi = summ.loc[("fcfs", "interactive")]
    assert fi["requests"] == 2 and fi["ttft_s_p50"] == pytest.approx(2.0) and fi["ttft_s_p90"] == pytest.approx(2.8)
    assert fi["queue_s_p50"] == pytest.approx(1.5) and fi["queue_s_max"] == 2.5 and fi["e2e_s_p50"] == pytest.approx(3.0)
    assert summ.loc[("sjf", "background"), "ttft_s_p50"] == 3.0
    b = classes.bucket_summary(_table()).set_index(["policy", "max_tokens"])
    assert b.loc[("fcfs", 4), "slowdown_p50"] == pytest.approx(3.0) and b.loc[("fcfs", 16), "slowdown_p50"] == 2.0
    assert b.loc[("sjf", 16), "slowdown_p90"] == 2.5
    cols = classes.class_columns(_table().query("policy == 'fcfs'"), {"interactive": 2.0, "background": 5.0}, 10.0)
    assert cols["requests_interactive"] == 2 and cols["slo_attainment_interactive"] == 0.5
    assert cols["goodput_rps_interactive"] == pytest.approx(0.1) and cols["goodput_rps_background"] == pytest.approx(0.1)
    assert cols["queue_s_max"] == 2.5 and cols["eta_abs_error_s_p50"] == 0.5 and cols["abandoned"] == 1


def _points(valid=True):
    return pd.DataFrame({"point_id": ["p/fcfs", "p/sjf"], "status": ["ok", "ok"], "valid": [valid, valid],
                         "workload": ["mixed", "mixed"], "policy": ["fcfs", "sjf"], "profile": ["replay", "replay"],
                         "stopped_early": [False, False], "queue_s_max": [2.5, 2.0]})


def test_one_run_per_policy_decides_nothing():
    """One run per policy: the ratio of the runs' class means, no interval, undecided (the run is the unit)."""
    rec = scheduling.recommend(_points(), _table()).set_index("policy")
    # the interactive class's mean TTFT per run: sjf (0.5 + 1.0) / 2 over fcfs (1.0 + 3.0) / 2; background e2e 10 / 8
    assert rec.loc["sjf", "interactive_ttft_ratio"] == pytest.approx(0.75 / 2.0)
    assert rec.loc["sjf", "background_e2e_ratio"] == pytest.approx(10 / 8)
    assert rec.loc["sjf", "verdict"] == "one round: undecided" and not rec.loc["sjf", "recommended"]
    f = scheduling.finding(_points(), _table())
    assert "sjf" in f.text and f.point_ids == ("p/fcfs", "p/sjf") and f.verdict == "undecided"
    assert not f.supported and f.text.startswith("Scheduling: undecided: one round")
    f = scheduling.finding(_points(valid=False), _table())
    assert not f.supported and f.text.startswith("Scheduling: undecided: no usable")
    assert "0 of 2 valid" in f.text and "--rerun-invalid" in f.text      # why, and the way on


def _designed(decisions, aa="equivalent", rounds=4, background=(1.2, 1.05, 1.4, "direction", "higher")):
    """Mixed-workload points as the policy design records them: one point per (arm, round), fcfs the control (ratio
    1), the A/A arm fcfs again; ``decisions`` = {policy: (ratio, low, high, verdict, direction[, rounds needed])} of
    the interactive TTFT, ``background`` every policy's background e2e decision. One interactive and one background
    request per run."""
    nan = float("nan")
    pts, rows = [], []
    for k in range(rounds):
        for arm in ["fcfs", *decisions, "fcfs_aa"]:
            pid = f"p/{arm}/{k}"
            if arm == "fcfs":
                dec = {**_decision("interactive_ttft_ratio", 1.0, nan, nan, ""),
                       **_decision("background_e2e_ratio", 1.0, nan, nan, "")}
            elif arm == "fcfs_aa":
                dec = {**_decision("interactive_ttft_ratio", 1.0, 0.9, 1.1, aa, "higher" if aa == "direction" else ""),
                       **_decision("background_e2e_ratio", 1.0, 0.9, 1.1, "undecided")}
            else:
                dec = {**_decision("interactive_ttft_ratio", *decisions[arm]),
                       **_decision("background_e2e_ratio", *background)}
            pts.append({"point_id": pid, "status": "ok", "valid": True, "workload": "mixed",
                        "policy": "fcfs" if arm == "fcfs_aa" else arm, "arm": arm, "replicate": k, "profile": "replay",
                        "stopped_early": False, "queue_s_max": 1.0 + k, "requests_planned": 6, "offered_rps": 2.5,
                        **_DESIGN, "rounds": rounds, "aa_ratio": 1.0, "aa_low": 0.9, "aa_high": 1.1, "aa_verdict": aa,
                        **dec})
            policy = "fcfs" if arm == "fcfs_aa" else arm
            rows += [{"point_id": pid, "workload": "mixed", "policy": policy, "request_id": 0,
                      "request_class": "interactive", "max_tokens": 4, "ttft_s": 1.0, "queue_s": 0.5, "e2e_s": 1.5,
                      "slowdown": 1.5, "error": None, "output_tokens": 4},
                     {"point_id": pid, "workload": "mixed", "policy": policy, "request_id": 1,
                      "request_class": "background", "max_tokens": 16, "ttft_s": 2.0, "queue_s": 1.0, "e2e_s": 8.0,
                      "slowdown": 2.0, "error": None, "output_tokens": 16}]
    return pd.DataFrame(pts), pd.DataFrame(rows)


def test_the_policy_designs_verdicts_set_the_finding():
    """The pick (lowest interactive TTFT) against fcfs sets the verdict: a direction with its interval and the
    background cost; undecided with the rounds and seconds it would take; fcfs kept only when every policy is slower
    or equivalent; a moved A/A control leaves it undecided."""
    pts, req = _designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower"),
                          "lanes": (0.7, 0.45, 1.1, "undecided", "", 9)})
    rec = scheduling.recommend(pts, req).set_index("policy")
    assert list(rec.index) == ["sjf", "lanes"] and rec.loc["sjf", "recommended"] and not rec.loc["lanes", "recommended"]
    assert rec.loc["sjf", "verdict"] == "faster" and rec.loc["sjf", "background_verdict"] == "slower"
    assert rec.loc["sjf", "queue_s_max"] == 4.0 and rec.loc["sjf", "rounds"] == 4 and rec.loc["lanes", "level"] == 0.95
    aa = scheduling.aa_control(pts)
    assert aa["rounds"] == 4 and aa["aa_verdict"] == "equivalent"
    f = scheduling.finding(pts, req)
    assert f.text.startswith("For interactive traffic mixed with long reports (4 rounds of 6 requests at 2.50 req/s, "
                             "a fresh engine per run), sjf against fcfs: interactive TTFT (the class's mean per run): "
                             "faster, 0.45x, 95% interval 0.30-0.68x")
    assert "background e2e: slower, 1.20x" in f.text and "lanes vs fcfs, interactive TTFT: undecided" in f.text
    assert f.verdict == "direction" and f.supported and f.rounds == 4 and "4 interleaved rounds" in f.evidence
    assert f.point_ids == tuple(pts["point_id"])
    open_ = scheduling.finding(*_designed({"sjf": (0.8, 0.55, 1.15, "undecided", "", 12)}))
    assert open_.verdict == "undecided" and open_.rounds_needed == 12 and open_.seconds_needed == 120.0
    assert "about 12 rounds (~120 s more)" in open_.text
    keep = scheduling.finding(*_designed({"sjf": (1.3, 1.1, 1.5, "direction", "higher"),
                                          "lanes": (1.01, 0.97, 1.04, "equivalent", "")}))
    assert keep.verdict == "direction" and "keep fcfs: every policy is slower beyond noise or equivalent" in keep.text
    unsure = scheduling.finding(*_designed({"sjf": (1.1, 0.9, 1.3, "undecided", "", 20)}))
    assert unsure.verdict == "undecided" and "keep fcfs: no policy shown faster" in unsure.text
    moved = scheduling.finding(*_designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower")}, aa="direction"))
    assert moved.verdict == "undecided" and "The A/A control moved" in moved.text
    assert scheduling.recommend(*_designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower")}, aa="direction")
                                ).iloc[0]["verdict"] == "undecided: the A/A control moved"


def test_figures_draw_from_small_tables():
    pts = _points().assign(goodput_rps_interactive=[0.1, 0.2], goodput_rps_background=[0.1, 0.05])
    figs = scheduling.figures(pts, _table())
    assert set(figs) == {"sched_class_latency", "sched_slowdown_vs_length", "sched_longest_wait", "sched_eta_error",
                         "sched_goodput_per_class", "sched_ttft_by_turn", "sched_prefix_savings",
                         "sched_recommendation"}
    bars = [t for t in figs["sched_class_latency"].data if t.name == "sjf"]
    assert list(bars[0].y) == [3.0, 0.75]  # TTFT p50 of background, interactive under sjf
    pts, req = _designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower")})
    fig = scheduling.figures(pts, req)["sched_policy_ratio"]
    drawn = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
    assert list(drawn[0].y) == [1.0, 0.45] and list(drawn[0].error_y.arrayminus) == [0, pytest.approx(0.15)]
    assert any((t.name or "").startswith("A/A control 0.90-1.10x") for t in fig.data)


QUICK_11 = dict(policies=["fcfs", "lanes"], engine="fifo", requests_per_point=4, short_prompt_tokens=[32],
                long_prompt_tokens=[40], short_max_tokens=2, long_max_tokens=5, lane_threshold_tokens=4, turns=2,
                conversations=1, warmup=0, shared_prefix_tokens=32, prefix_group_requests=2)


@pytest.mark.notebook
def test_scheduling_notebook(tmp_path, monkeypatch, run_notebook):
    from pathlib import Path

    from workbench.run import notebooks, results

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.open_run("", label="nb11")
    nb = Path(__file__).resolve().parents[2] / "notebooks" / "11_scheduling.ipynb"
    ns = run_notebook(nb, notebooks.validate_parameters(nb, QUICK_11), run)
    points = results.read_points(run, experiment=scheduling.EXPERIMENT)
    req = results.read_requests(run, experiment=scheduling.EXPERIMENT)
    assert list(points["status"]) == ["ok"] * 4
    mixed = req[req["workload"] == "mixed"]
    assert set(mixed["request_class"]) <= {"interactive", "background"} and len(mixed) == 8
    done = mixed[mixed["error"].isna()]
    assert (done["output_tokens"] == done["max_tokens"]).all()
    # warmup 0: no service history for the first arrivals (ETA unknown, NaN), then an estimate - when a request
    # arrives after an earlier one finished, which a slow machine may not give in 8 requests (seen once: all NaN);
    # the estimate itself: tests/serving/test_policies.py (unknown before any history, then the queue's figure)
    assert set(mixed["policy"]) == {"fcfs", "lanes"} and mixed["eta_s"].dtype.kind == "f"
    assert (mixed["eta_s"].dropna() >= 0).all()
    turns = req[req["workload"] == "multiturn"].sort_values("turn")
    assert list(turns["turn"]) == [1, 2] and turns["prompt_tokens"].is_monotonic_increasing
    assert turns["prompt_tokens"].iloc[0] > 32 + 32  # the shared system document, then the first user turn
    group = req[req["workload"] == "shared_prefix"]
    assert len(group) == 2 and (group["prompt_tokens"] > 32 + 32).all() and (group["output_tokens"] == 2).all()
    assert isinstance(ns["finding"].text, str) and (run / "figures").exists()


@pytest.mark.model
def test_prefix_sharing_on_serves_the_shared_document_from_the_cache(loaded):
    """The shared-prefix group on the continuous engine: with sharing on every request after the first reuses the
    document's full pages (cached_tokens > 0, whole pages), with it off none does; the savings table pairs them."""
    cfg = scheduling.Config(policies=["fcfs"], turns=0, shared_prefix_tokens=96, prefix_group_requests=3,
                            short_prompt_tokens=[32], short_max_tokens=2, multiturn_prefix_sharing=[False, True],
                            warmup=1)
    rows, pts = [], []
    for share in (False, True):
        res = scheduling.shared_prefix_point(loaded, cfg, share)
        pid = f"p/shared/{share}"
        rows += [dict(r, point_id=pid, workload="shared_prefix", prefix_sharing=share) for r in res.requests]
        pts.append({"point_id": pid, "status": "ok", "valid": True, "workload": "shared_prefix",
                    "prefix_sharing": share, **res.extra})
    req = pd.DataFrame(rows)
    on = req[req["prefix_sharing"]].sort_values("conversation")
    assert (req[~req["prefix_sharing"]]["cached_tokens"] == 0).all()
    assert on["cached_tokens"].iloc[0] == 0 and (on["cached_tokens"].iloc[1:] >= 96 - 32).all()
    assert (on["cached_tokens"] % 32 == 0).all() and (on["cached_tokens"] < on["prompt_tokens"]).all()
    sav = scheduling.prefix_savings(pd.DataFrame(pts), req).iloc[0]
    assert sav["rounds"] == 1 and 0 < sav["cache_hit_rate_on"] < 1 and sav["cache_hit_rate_off"] == 0
    assert sav["verdict"] == "undecided"          # one pair of runs decides nothing (the run is the unit)


@pytest.mark.model
def test_tiny_policy_and_prefix_designs_on_the_real_model(loaded):
    """Two rounds of the policy design (fcfs, sjf and the A/A arm) and of the prefix design (sharing off, on and off
    again) on the real model: each design's table in the run folder holds every arm in both rounds, every run is a
    point of its own carrying its arm's decision columns, and the finding carries one of the three verdicts."""
    from workbench.stats import blocks

    share = [False, True] if scheduling.prefix_sharing_available() else [False]
    cfg = scheduling.Config(policies=["fcfs", "sjf"], requests_per_point=4, short_prompt_tokens=[32],
                            long_prompt_tokens=[40], short_max_tokens=2, long_max_tokens=4, lane_threshold_tokens=3,
                            turns=2, conversations=1, warmup=0, load_factor=2.0, rounds=2, max_rounds=2,
                            aa_control=True, multiturn_prefix_sharing=share)
    run = results.create_run()
    points = scheduling.run(cfg, run, loaded)
    assert (points["status"] == "ok").all()
    table = pd.read_parquet(run / "design" / "scheduling.parquet")
    assert len(table) == 2 * 3 and set(table["arm"]) == {"fcfs", "sjf", "A/A"}
    assert (table[scheduling.INTERACTIVE.name] > 0).all() and (table[scheduling.BACKGROUND.name] > 0).all()
    mixed = points[points["workload"] == "mixed"].set_index(["arm", "replicate"]).sort_index()
    assert list(mixed.index) == [(a, k) for a in ("fcfs", "fcfs_aa", "sjf") for k in (0, 1)]
    assert (mixed.loc["sjf", "interactive_ttft_ratio_verdict"].isin(blocks.VERDICTS)).all()
    assert (mixed.loc["fcfs", "interactive_ttft_ratio"] == 1).all() and (mixed["rounds"] == 2).all()
    req = results.read_requests(run, experiment=scheduling.EXPERIMENT)
    per_run = req[req["workload"] == "mixed"].groupby("point_id").size()
    assert (per_run == 4).all() and len(per_run) == 6
    assert (run / "scheduling_aa.json").exists()
    if share == [False, True]:
        prefix = pd.read_parquet(run / "design" / "scheduling_prefix.parquet")
        assert len(prefix) == 2 * 3 and set(prefix["arm"]) == {"multiturn_off", "multiturn_on", "A/A"}
        on = points[(points["workload"] == "multiturn") & (points["arm"] == "on")]
        assert len(on) == 2 and on["sharing_ttft_ratio_verdict"].isin(blocks.VERDICTS).all()
    f = scheduling.finding(points.assign(valid=True), req, run)
    assert f.verdict in blocks.VERDICTS and f.rounds == 2
    assert "sched_policy_ratio" in scheduling.figures(points.assign(valid=True), req, run)


def test_a_pick_not_shown_better_than_its_runner_up_leaves_the_finding_undecided(monkeypatch):
    """Issue 49's rule for every pick (blocks.best_of): sjf beats fcfs, but within the rounds' noise of lanes (the
    runner-up, Tukey's level from the run's design table): the policy choice is open, and the finding says so."""
    import numpy as np

    from workbench.run import design
    from workbench.stats import blocks

    pts, req = _designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower"),
                          "lanes": (0.5, 0.33, 0.75, "direction", "lower")})
    drift, wobble = np.array([0.1, -0.2, 0.3, 0.0]), np.array([0.05, -0.05, 0.04, -0.04])
    table = {"fcfs": np.exp(drift), "sjf": np.exp(drift - 0.8 + wobble), "lanes": np.exp(drift - 0.75 - wobble)}
    rounds = pd.DataFrame([(a, r, v) for a, vals in table.items() for r, v in enumerate(vals)],
                          columns=["arm", "round", "value"])
    monkeypatch.setattr(design, "reanalyse", lambda *a, **k: (None, blocks.analyse(rounds, "fcfs", aa=None)))
    f = scheduling.finding(pts, req, "a run folder")
    assert "sjf against fcfs: interactive TTFT (the class's mean per run): faster" in f.text
    assert "Against the runner-up, lanes: undecided" in f.text and f.verdict == "undecided"
    rounds.loc[rounds["arm"] == "lanes", "value"] *= 1.6          # lanes clearly behind: the pick is decided
    assert scheduling.finding(pts, req, "a run folder").verdict == "direction"


def test_an_undecided_secondary_outcome_names_no_rounds_of_the_primarys():
    """A row's ``rounds_needed`` is the primary outcome's (0 once decided): the background e2e, undecided beside a
    decided interactive TTFT, read "about 0 rounds would decide it" (a default run, 2026-12-08); it says its verdict
    and interval, and no rounds estimate that is not its own."""
    pts, req = _designed({"sjf": (0.45, 0.3, 0.68, "direction", "lower")},
                         background=(1.2, 0.9, 1.5, "undecided", ""))
    f = scheduling.finding(pts.assign(rounds_needed=0.0), req)
    assert f.verdict == "direction"
    assert "background e2e: undecided: 1.20x, 95% interval 0.90-1.50x" in f.text
    assert "0 rounds" not in f.text and "rounds would" not in f.text
