"""Experiment 11 (scheduling): bad input before any model, the mixed trace, per-class and per-bucket figures by
hand on a small table, the recommendation and the finding, and a tiny real run."""
import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import no_work
from workbench import ParameterError
from workbench.experiments import scheduling
from workbench.stats import classes
from workbench.load import traces


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
    # rounds: every arm once per round (the order rotated), the A/A arm runs fcfs again with the same seeds
    two = scheduling.Config(policies=["fcfs", "sjf"], turns=0, rounds=2, aa_control=True).grid()
    assert [(p["replicate"], p["arm"], p["policy"]) for p in two] == [
        (0, "fcfs", "fcfs"), (0, "sjf", "sjf"), (0, "fcfs_aa", "fcfs"),
        (1, "sjf", "sjf"), (1, "fcfs_aa", "fcfs"), (1, "fcfs", "fcfs")]
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


def _prefix_table(saved, rounds=4):
    """Multi-turn point pairs (sharing off / on) over ``rounds`` rounds: two conversations of two turns, prompts 100
    and 200 tokens; with sharing on turn 2 reuses 96 tokens; in round k every TTFT with sharing on is the off one
    minus ``saved[k]``."""
    rows, pts = [], []
    off_ttft = [0.50, 0.90, 0.55, 1.00]
    for k in range(rounds):
        for share in (False, True):
            pid = f"p/multiturn/{share}/{k}"
            pts.append({"point_id": pid, "status": "ok", "valid": True, "workload": "multiturn", "policy": "fcfs",
                        "prefix_sharing": share, "profile": "multiturn", "stopped_early": False, "replicate": k,
                        "arm": "on" if share else "off"})
            for i, (conv, turn) in enumerate([(0, 1), (0, 2), (1, 1), (1, 2)]):
                rows.append({"point_id": pid, "workload": "multiturn", "policy": "fcfs", "request_class": "interactive",
                             "prefix_sharing": share, "conversation": conv, "turn": turn, "prompt_tokens": 100 * turn,
                             "cached_tokens": 96 if share and turn == 2 else 0,
                             "ttft_s": off_ttft[i] - (saved[k] if share else 0.0), "error": None, "output_tokens": 4})
            # an abandoned request (no token) is left out
            rows.append(dict(rows[-1], conversation=9, ttft_s=float("nan"), output_tokens=0))
    return pd.DataFrame(pts), pd.DataFrame(rows)


def test_prefix_savings_pair_runs_by_round_and_say_not_supported_when_the_interval_straddles_1():
    from scipy import stats

    saved = [0.01, 0.30, -0.25, 0.40]
    pts, req = _prefix_table(saved)
    sav = scheduling.prefix_savings(pts, req).set_index("workload").loc["multiturn"]
    p50_off = np.median([0.50, 0.90, 0.55, 1.00])
    half = stats.t.ppf(0.975, 3) * np.std(saved, ddof=1) / 2
    assert sav["rounds"] == 4 and sav["ttft_saved_s"] == pytest.approx(np.mean(saved))
    assert sav["ttft_saved_s_low"] == pytest.approx(np.mean(saved) - half)
    logs = np.log((p50_off - np.array(saved)) / p50_off)
    assert sav["ttft_ratio"] == pytest.approx(np.exp(logs.mean()))
    assert sav["cache_hit_rate_on"] == pytest.approx(4 * 192 / (4 * 600)) and sav["cache_hit_rate_off"] == 0
    assert sav["verdict"] == "not supported: the interval straddles 1" and sav["design"] == "replicates"
    f = scheduling.finding(pts, req)
    assert "Prefix sharing: not supported" in f.text and "hit rate 32%" in f.text and "straddles 1" in f.text
    assert "multiturn: 4 rounds" in f.evidence
    steady = [0.20, 0.21, 0.19, 0.20]
    sav = scheduling.prefix_savings(*_prefix_table(steady)).iloc[0]
    assert sav["verdict"] == "saves" and sav["ttft_saved_s_low"] > 0 and sav["ttft_ratio_high"] < 1
    one = scheduling.prefix_savings(*_prefix_table(steady, rounds=1)).iloc[0]
    assert one["verdict"] == "one run: not supported"  # requests of one run are not independent samples
    assert scheduling.prefix_savings(pts, req[~req["prefix_sharing"]]).empty  # one side only: nothing to pair
    assert scheduling.prefix_finding(pts.iloc[:1], req) is None  # not measured both ways: nothing to say
    invalid = scheduling.prefix_finding(pts.assign(valid=False), req)  # measured, not usable: said so
    assert not invalid.supported and invalid.text.startswith("Prefix sharing: not supported")
    fig = scheduling.prefix_cache_savings(pts, req)
    assert list(fig.data[0].x) == [pytest.approx(0.32)] and list(fig.data[0].y) == [pytest.approx(np.mean(saved))]


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


def test_recommendation_with_one_run_per_policy_says_one_run_not_supported():
    """One run per policy: the ratio of the runs' statistics, no interval, "one run: not supported"."""
    rec = scheduling.recommend(_points(), _table()).set_index("policy")
    # interactive TTFT p90 per run: sjf p90(0.5, 1.0) over fcfs p90(1.0, 3.0); background e2e 10 / 8
    assert rec.loc["sjf", "interactive_ttft_ratio"] == pytest.approx(np.percentile([0.5, 1.0], 90) / 2.8)
    assert rec.loc["sjf", "background_e2e_ratio"] == pytest.approx(10 / 8)
    assert rec.loc["sjf", "verdict"] == "one run: not supported" and not rec.loc["sjf", "recommended"]
    f = scheduling.finding(_points(), _table())
    assert "sjf" in f.text and f.point_ids == ("p/fcfs", "p/sjf")
    assert not f.supported and f.text.startswith("Scheduling: one run: not supported")
    f = scheduling.finding(_points(valid=False), _table())
    assert not f.supported and f.text.startswith("Scheduling: not supported")


def _replicated(gain, aa_shift=None, rounds=4):
    """Mixed-workload runs over ``rounds`` seeds: fcfs, sjf (interactive TTFT x ``gain[k]`` of fcfs in round k) and
    the A/A arm (fcfs again, x ``aa_shift[k]``); one interactive and one background request per run."""
    aa_shift = aa_shift or [1.0] * rounds
    pts, rows = [], []
    for k in range(rounds):
        base = 1.0 + 0.3 * k  # the seeds differ; the pairing removes it
        for arm, f in (("fcfs", 1.0), ("sjf", gain[k]), ("fcfs_aa", aa_shift[k])):
            pid = f"p/{arm}/{k}"
            pts.append({"point_id": pid, "status": "ok", "valid": True, "workload": "mixed",
                        "policy": "fcfs" if arm == "fcfs_aa" else arm, "arm": arm, "replicate": k,
                        "profile": "replay", "stopped_early": False, "queue_s_max": 1.0})
            rows += [{"point_id": pid, "workload": "mixed", "request_id": 0, "request_class": "interactive",
                      "ttft_s": base * f, "e2e_s": base * f + 0.5, "error": None, "output_tokens": 4},
                     {"point_id": pid, "workload": "mixed", "request_id": 1, "request_class": "background",
                      "ttft_s": 2.0, "e2e_s": 8.0, "error": None, "output_tokens": 16}]
    return pd.DataFrame(pts), pd.DataFrame(rows)


def test_policies_compared_over_rounds_with_an_aa_control():
    """The run as the unit: sjf x0.5 of fcfs in every round, A/A flat: recommended, A/A columns reported; the same
    gain with an A/A control that moved (x1.3 every round): not supported."""
    pts, req = _replicated([0.5, 0.52, 0.48, 0.5])
    rec = scheduling.recommend(pts, req).set_index("policy")
    assert list(rec.index) == ["sjf"] and rec.loc["sjf", "rounds"] == 4 and rec.loc["sjf", "recommended"]
    assert rec.loc["sjf", "interactive_ttft_ratio_high"] < 1 and rec.loc["sjf", "design"] == "replicates"
    assert rec.loc["sjf", "aa_ratio"] == pytest.approx(1.0) and rec.loc["sjf", "aa_low"] <= 1 <= rec.loc["sjf", "aa_high"]
    aa = scheduling.aa_control(pts, req)
    assert aa["rounds"] == 4 and aa["design"] == "replicates"
    f = scheduling.finding(pts, req)
    assert f.supported and f.text.startswith("For interactive traffic") and "4 rounds" in f.evidence
    pts, req = _replicated([0.5, 0.52, 0.48, 0.5], aa_shift=[1.3, 1.32, 1.28, 1.3])
    rec = scheduling.recommend(pts, req).set_index("policy")
    assert rec.loc["sjf", "verdict"] == "not supported: the A/A control moved" and not rec.loc["sjf", "recommended"]
    assert scheduling.finding(pts, req).text.startswith("Scheduling: not supported: the A/A control moved")


def test_figures_draw_from_small_tables():
    pts = _points().assign(goodput_rps_interactive=[0.1, 0.2], goodput_rps_background=[0.1, 0.05])
    figs = scheduling.figures(pts, _table())
    assert set(figs) == {"sched_class_latency", "sched_slowdown_vs_length", "sched_longest_wait", "sched_eta_error",
                         "sched_goodput_per_class", "sched_ttft_by_turn", "sched_prefix_savings",
                         "sched_recommendation"}
    bars = [t for t in figs["sched_class_latency"].data if t.name == "sjf"]
    assert list(bars[0].y) == [3.0, 0.75]  # TTFT p50 of background, interactive under sjf


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
    # warmup 0: no service history for the first arrivals (ETA unknown, NaN), then an estimate
    assert set(mixed["policy"]) == {"fcfs", "lanes"} and mixed["eta_s"].notna().any()
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
        res = scheduling._shared_prefix(loaded, cfg, share)
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
    assert sav["pairs"] == sav["rounds"] == 1 and 0 < sav["cache_hit_rate_on"] < 1  # runs pair by round (issue 32) and sav["cache_hit_rate_off"] == 0
