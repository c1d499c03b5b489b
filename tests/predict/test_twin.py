"""The serving twin (issue 34): closed-form queueing, determinism, one home for the policy, one-line errors."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.predict import twin, twin_cost, twin_engine
from workbench.serving import scheduling

CONST = twin_cost.StepCost(a0=1.0, b0=1.0)  # one-token requests: service = the prefill = 1 s exactly
COST = twin_cost.StepCost(a0=0.02, a1=2e-4, b0=0.05, b1=0.004, b2=1e-6, b3=0.02, first_token_overhead_s=0.01)


@pytest.mark.simulation
@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_md1_waiting_time_matches_pollaczek_khinchine(rho):
    # M/D/1: Poisson arrivals at rate rho (service 1 s), Wq = rho / (2 (1 - rho)) (Pollaczek-Khinchine). 30,000
    # requests: the sample mean's own error at rho 0.7 is a few percent (a fixed seed keeps the test repeatable)
    specs = twin.open_loop("poisson", 30000, rho, 8, 1, seed=0)
    res = twin.simulate(CONST, specs, twin.TwinConfig(engine="fifo"), "poisson", slos=[])
    wq = res.rows["queue_s"].mean()
    assert wq == pytest.approx(rho / (2 * (1 - rho)), rel=0.06)
    assert res.rows["e2e_s"].mean() == pytest.approx(wq + 1.0, rel=1e-9)


def test_fifo_at_a_vanishing_rate_is_the_service_time():
    specs = twin.open_loop("constant", 20, 0.01, 64, 16)
    res = twin.simulate(COST, specs, twin.TwinConfig(engine="fifo"), "constant", rate=0.01)
    alone = COST.service_s(64, 16)
    assert np.allclose(res.rows["e2e_s"], alone)
    assert np.allclose(res.rows["ttft_s"], COST.prefill_s(1, 64) + COST.first_token_overhead_s)
    assert (res.rows["queue_s"] == 0).all()


def test_same_seed_same_trace_and_result():
    def one(seed):
        specs = twin.open_loop("gamma", 300, 4.0, 64, 16, burstiness=0.5, seed=seed)
        return specs, twin.simulate(COST, specs, twin.TwinConfig(engine="static", replicas=2,
                                                                router="least_outstanding"), "gamma", rate=4.0)

    (s1, r1), (s2, r2), (s3, r3) = one(7), one(7), one(8)
    assert s1 == s2 and s1 != s3
    pd.testing.assert_frame_equal(r1.rows, r2.rows)
    assert not r1.rows["e2e_s"].equals(r3.rows["e2e_s"])


def _mixed():
    rows = [{"offset_s": 0.25 * i, "prompt_tokens": 32 if i % 3 else 96, "output_tokens": 6 if i % 3 else 32,
             "priority": 0 if i % 3 else 1, "request_class": "interactive" if i % 3 else "background"}
            for i in range(60)]
    return twin.trace_specs(rows)


def test_policies_reorder_the_queue():
    ttft = {}
    for pol in scheduling.POLICIES:
        res = twin.simulate(COST, _mixed(), twin.TwinConfig(engine="fifo", policy=pol, lane_threshold_tokens=16))
        ttft[pol] = res.rows.groupby("request_class")["ttft_s"].median()
    for pol in ("priority", "sjf", "lanes"):
        assert ttft[pol]["interactive"] < 0.5 * ttft["fcfs"]["interactive"]


def test_a_policy_change_in_scheduling_changes_the_twin(monkeypatch):
    before = twin.simulate(COST, _mixed(), twin.TwinConfig(engine="fifo", policy="priority")).rows
    real_key = scheduling.PolicyQueue._key

    def inverted(self, seq, item, now, coef=None):  # a different policy, in its one home
        k = real_key(self, seq, item, now, coef)
        return (-k[0],) + tuple(k[1:]) if self.policy == "priority" else k

    monkeypatch.setattr(scheduling.PolicyQueue, "_key", inverted)
    after = twin.simulate(COST, _mixed(), twin.TwinConfig(engine="fifo", policy="priority")).rows
    b = before.groupby("request_class")["ttft_s"].median()
    a = after.groupby("request_class")["ttft_s"].median()
    assert a["background"] < b["background"] and a["interactive"] > b["interactive"]


def test_static_window_batches_and_lanes_cap():
    specs = twin.trace_specs([{"offset_s": 0.001 * i, "prompt_tokens": 32, "output_tokens": 8} for i in range(8)])
    res = twin.simulate(COST, specs, twin.TwinConfig(engine="static", max_batch_size=4, batch_window_s=0.05))
    assert sorted(res.rows["batch_size"].tolist()) == [4] * 8
    long = twin.trace_specs([{"offset_s": 0.0, "prompt_tokens": 32, "output_tokens": 64} for _ in range(4)])
    res = twin.simulate(COST, long, twin.TwinConfig(engine="static", policy="lanes", max_batch_size=4, long_cap=1,
                                                    lane_threshold_tokens=16))
    assert (res.rows["batch_size"] == 1).all()  # the long cap: one long request at a time


def test_admission_limit_refuses_with_retry_after_and_patience_abandons():
    specs = twin.trace_specs([{"offset_s": 0.0, "prompt_tokens": 32, "output_tokens": 16} for _ in range(10)])
    res = twin.simulate(COST, specs, twin.TwinConfig(engine="fifo", max_pending=3, max_retries=0))
    assert (res.rows["http_status"] == 429).sum() == 7 and res.summary["refused"] == 7
    # the 3 served still count: a row's error read back from a table is NaN, not None (the counting window took
    # NaN for an error and the point's throughput was 0 / NaN with refusals); the window opens at the first
    # completion, so 2 of the 3 are inside it
    assert res.summary["not_served"] == 7 and res.summary["requests_in_window"] == 2
    assert res.summary["request_throughput_rps"] > 0
    again = twin.simulate(COST, specs, twin.TwinConfig(engine="fifo", max_pending=3, max_retries=50))
    assert (again.rows["output_tokens"] == 16).all() and again.rows["retries"].max() > 0
    impatient = [twin.TwinSpec(0.0, 32, 16, patience_s=1.0) for _ in range(10)]
    res = twin.simulate(COST, impatient, twin.TwinConfig(engine="fifo"))
    assert res.rows["abandoned"].sum() > 0
    assert (res.rows.loc[res.rows["abandoned"], "output_tokens"] == 0).all()
    assert res.rows.loc[res.rows["abandoned"], "e2e_s"].max() == pytest.approx(1.0)


def test_prefix_sharing_hits_and_multiturn():
    specs = twin.multiturn(2, 3, 32, 6, shared_prefix_tokens=100)
    on = twin.simulate(COST, specs, twin.TwinConfig(engine="continuous", prefix_sharing=True)).rows
    off = twin.simulate(COST, specs, twin.TwinConfig(engine="continuous")).rows
    assert (off["cached_tokens"] == 0).all()
    later = on[on["turn"] > 1]
    assert (later["cached_tokens"] > 0).all() and (later["cached_tokens"] % 32 == 0).all()
    assert later["ttft_s"].mean() < off[off["turn"] > 1]["ttft_s"].mean()
    turns = on.sort_values(["conversation", "turn"]).groupby("conversation")["t_scheduled_s"]
    assert turns.is_monotonic_increasing.all()


def test_replicas_and_routers():
    specs = twin.open_loop("poisson", 400, 30.0, 64, 16, seed=1)
    one = twin.simulate(COST, specs, twin.TwinConfig(engine="continuous"), "poisson", rate=30.0)
    for router in twin.ROUTERS:
        eight = twin.simulate(COST, specs, twin.TwinConfig(engine="continuous", replicas=8, router=router), "poisson",
                              rate=30.0)
        assert set(eight.rows["replica"]) == set(range(8))
        assert eight.summary["e2e_s_p50"] < one.summary["e2e_s_p50"]


def test_capacity_search_brackets_the_knee():
    from workbench.stats import slo

    found = twin.capacity(COST, twin.TwinConfig(engine="fifo"), slo.get("custom", 5.0, None), 64, 16, n=120)
    alone = COST.service_s(64, 16)
    # never past the engine's most completions a second (it recommended 5.25 req/s on an engine completing 3.95)
    assert found["rate"] <= found["throughput_rps"]
    loose = twin.capacity(COST, twin.TwinConfig(engine="static"), slo.get("custom", 1e6, 1e6), 64, 16, n=200)
    assert 0 < loose["rate"] <= loose["throughput_rps"]
    # one server of capacity 1 / alone: the answer lies below it (plus kept_up's 10% tolerance on a short run)
    assert found["bracketed"] and 0.3 / alone < found["rate"] <= 1.1 / alone
    assert found["steps"] <= 14


@pytest.mark.parametrize("call, word", [
    (lambda: twin.open_loop("poisson", 10, 0.0, 64, 16), "rate"),
    (lambda: twin.open_loop("poisson", 10, -1.0, 64, 16), "rate"),
    (lambda: twin.TwinConfig(replicas=0), "replicas"),
    (lambda: twin.trace_specs([{"offset_s": -1.0, "prompt_tokens": 8, "output_tokens": 4}]), "offset_s"),
    (lambda: twin_cost.device_profile("flops=1e15"), "bandwidth"),
    (lambda: twin.TwinConfig(engine="continuous", policy="sjf"), "policy"),
    (lambda: twin.TwinConfig(router="random"), "router"),
])
def test_bad_input_is_one_line(call, word):
    with pytest.raises(ParameterError) as e:
        call()
    assert word in str(e.value) and "\n" not in str(e.value)


def test_cost_fit_recovers_coefficients_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for b in (1, 2, 4, 8):
        for p in (32, 128, 512):
            for _ in range(3):
                n = 16
                rows.append({"batch_size": b, "prompt_tokens": p, "output_tokens": n,
                             "prefill_s": COST.prefill_s(b, p) * rng.normal(1, 0.01),
                             "tpot_s": COST.step_s(b, b * (p + n / 2)) * rng.normal(1, 0.01)})
    fitted = twin_cost.fit(pd.DataFrame(rows), source="synthetic")
    assert fitted.loo_step_error < 0.05 and fitted.loo_prefill_error < 0.05
    assert fitted.step_s(4, 4 * 300) == pytest.approx(COST.step_s(4, 4 * 300), rel=0.05)
    run = tmp_path / "results" / "run1"
    run.mkdir(parents=True)
    twin_cost.save(run, fitted)
    assert repr(twin_cost.load(run)) == repr(fitted)   # (reference_tpot_s NaN: fitted without probes)
    with pytest.raises(ParameterError):
        twin_cost.fit(pd.DataFrame(rows[:2]))


def test_cost_fit_ignores_other_configurations_and_weighs_a_workload_once():
    """The default run's engine-tuning rows (bfloat16, int8: 2x faster), repeated 56 times at one workload, pulled
    the prefill term 40% low on the served float32 engine: only the served configuration's rows count, one median
    per workload."""
    rows = []
    for b in (1, 2, 4, 8):
        for p in (32, 128, 512):
            rows.append({"batch_size": b, "prompt_tokens": p, "output_tokens": 16, "dtype": "float32",
                         "prefill_s": COST.prefill_s(b, p), "tpot_s": COST.step_s(b, b * (p + 8))})
    clean = twin_cost.fit(pd.DataFrame(rows))
    fast = [{**rows[0], "dtype": "bfloat16", "prefill_s": rows[0]["prefill_s"] / 2, "tpot_s": rows[0]["tpot_s"] / 2},
            {**rows[0], "technique": "prompt_lookup", "tpot_s": rows[0]["tpot_s"] / 3}] * 30
    noisy = [{**rows[1], "prefill_s": rows[1]["prefill_s"] * 1.3}, {**rows[1], "prefill_s": rows[1]["prefill_s"] * 0.7}]
    mixed = twin_cost.fit(pd.DataFrame(rows + fast + noisy + [rows[1]] * 40))
    for k in twin_cost.PREFILL_TERMS + twin_cost.STEP_TERMS:
        assert getattr(mixed, k) == pytest.approx(getattr(clean, k), rel=1e-6, abs=1e-12), k
    assert clean.prefill_s(8, 512) == pytest.approx(COST.prefill_s(8, 512), rel=1e-3)


def test_roofline_what_if_profile(tmp_path):
    from workbench.predict.roofline import ModelShape

    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 128256, "model_type": "llama", "tie_word_embeddings": False}
    dev = twin_cost.device_profile("bandwidth=4.8e12,flops=9.9e14,name=h200")
    cost = twin_cost.from_roofline(ModelShape.from_config(cfg, "bfloat16"), dev)
    assert 1e-3 < cost.step_s(1, 512) < 1e-2  # ~16 GB of weights at 4.8 TB/s: a few ms per step


def test_bulk_decode_steps_equal_step_by_step(monkeypatch):
    specs = twin.open_loop("poisson", 150, 3.0, 64, 24, seed=2)
    cfg = twin.TwinConfig(engine="continuous", max_batch_size=4, max_batch_tokens=96)
    fast = twin.simulate(COST, specs, cfg, "poisson")
    monkeypatch.setattr(twin_engine.EngineTwin, "bulk_decode", False)
    slow = twin.simulate(COST, specs, cfg, "poisson")
    pd.testing.assert_frame_equal(fast.rows, slow.rows, rtol=1e-9)
    assert fast.summary["busy_share"] == pytest.approx(slow.summary["busy_share"], rel=1e-9)


def _measured_run(tmp_path, cost, speeds=None):
    """A run folder whose serving_load points are 'measured' by the twin itself under ``cost``; with ``speeds`` (one
    factor a point) point ``i`` ran at ``speeds[i]`` times ``cost`` and its speed probe read ``speeds[i] *
    cost.reference_tpot_s``."""

    from workbench.run import results

    run = results.create_run("twinval")
    pts, reqs = [], []
    for i, (prof, rate) in enumerate([("synchronous", None), ("poisson", 0.5), ("poisson", 0.9), ("poisson", 1.6)]):
        specs = twin.open_loop("poisson" if rate else "constant", 40, rate or 1.0, 64, 16, seed=i)
        at = cost.at_speed(speeds[i] * cost.reference_tpot_s)[0] if speeds else cost
        res = twin.simulate(at, specs, twin.TwinConfig(engine="fifo"), prof, rate=rate)
        pid = f"serving_load/engine=fifo,profile={prof},step={i}"
        probe = {"speed_probe_tpot_s": speeds[i] * cost.reference_tpot_s} if speeds else {}
        pts.append({**res.summary, "experiment": "serving_load", "point_id": pid, "engine": "fifo", "status": "ok",
                    "valid": True, "source": "measured", **probe})
        reqs.append(res.rows.assign(experiment="serving_load", point_id=pid, source="measured"))
    results.write_table(run / "points.parquet", pd.DataFrame(pts))
    results.write_table(run / "requests.parquet", pd.concat(reqs, ignore_index=True))
    results.update_manifest(run, experiments={"serving_load": {"config": {"max_batch_size": 8, "batch_window_s": 0.05,
                                                                         "prompt_tokens": 64, "max_new_tokens": 16}}})
    return run


def test_validation_table_and_metrics(tmp_path):
    from workbench.predict import twin_validation
    from workbench.share import figures_twin

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    table, summ = twin_validation.validate(run)
    assert len(table) == 4 and summ["mape_e2e_p50_points"] == 4
    assert summ["mape_e2e_p50"] < 1e-6 and summ["mape_ttft_p50"] < 1e-6   # the same cost: the same decisions
    # the same knee per engine; NaN on both sides where kept_up is undetermined at this many requests
    assert {e: repr(k) for e, k in summ["knee_measured"].items()} == {e: repr(k) for e, k in summ["knee_simulated"].items()}
    # each side's keep-up verdict per open-loop point (the in-flight growth test at 40 requests), the same here
    open_loop = table[table["profile"] == "poisson"]
    assert len(open_loop) == 3 and open_loop["measured_kept_up"].tolist() == open_loop["simulated_kept_up"].tolist()
    assert open_loop["measured_kept_up"].notna().all()
    for e, k in summ["knee_measured"].items():   # the knees' distance, 0 where both exist and agree
        assert (summ["knee_error"][e] == 0) if k == k else summ["knee_error"][e] != summ["knee_error"][e]
    on_disk = pd.read_csv(run / twin.VALIDATION_FILE)
    assert {"ape_e2e_s_p50", "ape_ttft_s_p50", "measured_e2e_s_p50", "simulated_e2e_s_p50",
            "measured_kept_up", "simulated_kept_up"} <= set(on_disk.columns)
    assert json.loads((run / "metrics.json").read_text())["twin_points"] == 4
    table2, fig, text = figures_twin.notebook_section(run, "serving_load")
    assert fig is not None and "MAPE e2e p50 0%" in text and (run / "figures" / "twin_serving_load.json").is_file()
    assert {ax.rangemode for ax in (fig.layout.yaxis, fig.layout.yaxis2)} == {"tozero"}   # latencies from 0 s
    slower = twin_cost.StepCost(**{k: 1.3 * getattr(COST, k) for k in twin_cost.PREFILL_TERMS + twin_cost.STEP_TERMS})
    _, off = twin_validation.validate(run, slower, write=False)
    assert off["mape_e2e_p50"] > 0.25   # a wrong cost model shows in the error
    assert "The larger miss" in twin_validation.sentence(off)
    # an invalid point (contended: it measured the machine, not the engine) stays in the table, out of the errors
    from workbench.run import results

    pts = results.read_points(run)
    bad = pts["point_id"] == pts["point_id"].iloc[0]
    results.write_table(run / "points.parquet", pts.assign(valid=~bad, e2e_s_p50=pts["e2e_s_p50"].where(~bad, 99.0)))
    table3, summ3 = twin_validation.validate(run, write=False)
    assert len(table3) == 4 and summ3["twin_points"] == 3 and summ3["twin_points_invalid"] == 1
    assert summ3["mape_e2e_p50_points"] == 3 and summ3["mape_e2e_p50"] < 1e-6
    assert "3 valid points (1 invalid left out)" in twin_validation.sentence(summ3)


def test_simulate_command_writes_simulated_rows(cli, tmp_path, capsys):
    from workbench import cli as cli_module
    from workbench.run import results

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(COST.to_dict()))
    out = results.results_root() / "sim1"
    args = cli_module.build_parser().parse_args([
        "simulate", "--calibration", str(cal), "--engines", "fifo,continuous", "--requests", "30", "--rates", "0.5,1",
        "--replicas", "2", "--router", "least_outstanding", "--policies", "fcfs,sjf", "--out", str(out)])
    assert cli_module.cmd_simulate(args) == 0 and "PREDICTION" in capsys.readouterr().out
    pts = pd.read_parquet(out / "points.parquet")
    assert (pts["source"] == "simulated").all() and {"fifo", "continuous"} <= set(pts["engine"])
    back = twin_cost.load(out)
    assert all(getattr(back, k) == getattr(COST, k) for k in twin_cost.PREFILL_TERMS + twin_cost.STEP_TERMS)
    code, _, err = cli("simulate", "--calibration", str(cal), "--replicas", "0")
    assert code == 2 and err.strip() == "error: replicas: must be an integer in [1, 4096] (got 0)"
    code, _, err = cli("simulate", "--calibration", str(cal), "--trace", str(tmp_path / "none.jsonl"))
    assert code == 2 and "trace" in err and len(err.strip().splitlines()) == 1
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"offset_s": 0, "prompt_tokens": 8, "output_tokens": 4}\n')
    code, _, err = cli("simulate", "--calibration", str(cal), "--trace", str(trace), "--rates", "5")
    assert code == 2 and err.strip().startswith("error: rates: a trace")   # the rates were dropped without a word
    # the simulated points have ids (a comparison with a measured run needs them)
    assert pts["point_id"].str.startswith("simulate/").all() and pts["point_id"].is_unique
    # each bad value is one line naming its parameter before anything is simulated (a user's try printed the
    # table first, a traceback for --rates abc, and "rate" for --load-factor 0)
    for argv, word in ((["--rates", "abc"], "rates"), (["--target", "1.5", "--capacity"], "target"),
                       (["--load-factor", "0", "--policies", "fcfs,sjf"], "load_factor"),
                       (["--out", str(tmp_path / "outside")], "run_dir"), (["--rates", "1,,2"], "rates"),
                       (["--sweep-points", "0"], "sweep_points"), (["--prompt-tokens", "0"], "prompt_tokens"),
                       # a simulation never overwrites a run's tables (it replaced a measured run's 73 points)
                       (["--out", str(out)], "out")):
        code, out_text, err = cli("simulate", "--calibration", str(cal), *argv)
        assert code == 2 and err.strip().startswith(f"error: {word}: ") and len(err.strip().splitlines()) == 1
        assert "PREDICTION" not in out_text and "engine" not in out_text, argv


def test_the_static_companion_rule_has_one_home(monkeypatch):
    from workbench.serving import engines

    specs = twin.trace_specs([{"offset_s": 0.001 * i, "prompt_tokens": 32, "output_tokens": 8} for i in range(6)])
    cfg = twin.TwinConfig(engine="static", max_batch_size=4, batch_window_s=0.05)
    assert twin.simulate(COST, specs, cfg).rows["batch_size"].max() == 4
    monkeypatch.setattr(engines, "may_join", lambda queue, batch, req: False)
    assert (twin.simulate(COST, specs, cfg).rows["batch_size"] == 1).all()


def test_thousands_of_requests_per_second_on_eight_gpu_replicas():
    from workbench.predict.roofline import ModelShape

    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
           "intermediate_size": 14336, "vocab_size": 128256, "model_type": "llama", "tie_word_embeddings": False}
    cost = twin_cost.from_roofline(ModelShape.from_config(cfg, "bfloat16"),
                                   twin_cost.device_profile("bandwidth=4.8e12,flops=9.9e14"))
    specs = twin.open_loop("poisson", 3000, 1000.0, 256, 32, seed=0)
    res = twin.simulate(cost, specs, twin.TwinConfig(engine="continuous", max_batch_size=64, max_batch_tokens=8192,
                                                     replicas=8, router="least_outstanding"), "poisson", rate=1000.0)
    assert res.summary["kept_up"] and set(res.rows["replica"]) == set(range(8))
    assert res.summary["request_throughput_rps"] == pytest.approx(1000, rel=0.1)


def test_interesting_points_are_the_knee_then_past_it():
    from workbench.predict import twin_study

    pts = pd.DataFrame({"engine": ["fifo"] * 3 + ["static"] * 3, "profile": ["poisson"] * 6,
                        "offered_rps": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
                        "kept_up": [True, False, False, True, True, False]})
    assert twin_study.interesting(pts, 3) == [("fifo", 1.0), ("static", 2.0), ("fifo", 2.0)]


@pytest.mark.model
def test_confirm_measures_the_picked_point_and_prints_the_twin_error(loaded):
    from workbench.experiments import serving_load
    from workbench.predict import twin_study

    cfg = serving_load.Config(engines=["fifo"], requests_per_point=4, prompt_tokens=32, max_new_tokens=4, warmup=0)
    cost = twin_cost.StepCost(a0=0.05, a1=1e-3, b0=0.05)
    conf = twin_study.confirm(cost, loaded, [("fifo", 0.5)], cfg)
    assert len(conf) == 1
    row = conf.iloc[0]
    assert (row["engine"], row["rate_rps"], row["source"]) == ("fifo", 0.5, "measured") and row["speed_factor"] > 0
    assert 0 < row["requests"] <= cfg.requests_per_point
    for c in ("ttft_s_p50", "e2e_s_p50"):   # the twin's error on the very point measured, beside the measurement
        assert row[f"measured_{c}"] > 0 and row[f"simulated_{c}"] > 0
        assert row[f"ape_{c}"] == pytest.approx(abs(row[f"simulated_{c}"] / row[f"measured_{c}"] - 1))


def test_a_trace_keeps_its_classes_and_refuses_a_bad_line_in_one_line(tmp_path):
    from workbench.predict import twin_study

    path = tmp_path / "t.jsonl"
    path.write_text('{"offset_s": 0, "prompt_tokens": 32, "output_tokens": 4, "priority": 1, "request_class": "bg"}\n'
                    '{"offset_s": 0.5, "prompt_tokens": 32, "output_tokens": 4}\n')
    rows = twin_study.read_trace(path)
    assert rows[0]["priority"] == 1 and rows[0]["request_class"] == "bg" and "priority" not in rows[1]
    path.write_text('{"offset_s": 0, "prompt_tokens": 32, "output_tokens": 4, "patience_s": -1}\n')
    with pytest.raises(ParameterError, match="trace: line 1: patience_s"):
        twin_study.read_trace(path)


def test_served_request_terms_come_from_the_synchronous_point_and_leave_it_out_of_the_errors(tmp_path):
    """A served request pays a fixed cost before its first token and one per decode step that bare ``generate`` rows
    do not show: fitted on the synchronous point alone, they close the gap on the other points, and that point
    (in-sample) is left out of the errors."""
    import dataclasses

    from workbench.predict import twin_validation

    served = dataclasses.replace(COST, first_token_overhead_s=COST.first_token_overhead_s + 0.08, b0=COST.b0 + 0.01)
    run = _measured_run(tmp_path, served)
    from workbench.run import results

    reqs, pts = results.read_requests(run), results.read_points(run)
    sync = pts.loc[pts["profile"] == "synchronous", "point_id"]
    fitted = twin_cost.with_serving(COST, reqs, sync)
    assert fitted.serving_first_s == pytest.approx(0.08, rel=0.02)
    assert fitted.serving_step_s == pytest.approx(0.01, rel=0.05)
    assert fitted.serving_points == tuple(sync) and "from the one-at-a-time served point" in fitted.describe()
    # the per-token term is the step's, whatever its batch (charged per row, a term fitted at batch 1 in a slow
    # moment was multiplied by the batch: 20 ms became 160 ms a step at batch 8 on a default run)
    for batch in (1, 4, 8):
        assert fitted.step_s(batch, 400) - COST.step_s(batch, 400) == pytest.approx(fitted.serving_step_s)
    twin_cost.save(run, fitted)
    assert repr(twin_cost.load(run)) == repr(fitted)   # (NaN errors: compared as text) the served terms travel with the run's calibration
    _, bare = twin_validation.validate(run, COST, write=False)
    _, summ = twin_validation.validate(run, fitted, write=False)
    assert summ["twin_points"] == 3 and summ["twin_points_calibration"] == 1
    assert summ["mape_ttft_p50"] < 0.02 < bare["mape_ttft_p50"]
    assert "1 calibration point left out" in twin_validation.sentence(summ)
    # no usable served row: the cost is returned as it was
    assert twin_cost.with_serving(COST, reqs, ["no-such-point"]) is COST


def test_the_serving_finding_says_where_the_twin_and_the_measurement_part(tmp_path):
    """The report's serving finding carries the twin's disagreement in its evidence (its text and mark unchanged);
    the point named furthest apart is the one whose measurement the twin misses most."""
    from workbench.predict import twin_validation
    from workbench.run import results
    from workbench.share import figures_twin
    from workbench.stats.evidence import Finding

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    pts = results.read_points(run)
    far = pts["point_id"].iloc[2]   # this point measured 1.5x slower than the engine the twin replays
    results.write_table(run / "points.parquet", pts.assign(
        e2e_s_p50=pts["e2e_s_p50"].where(pts["point_id"] != far, 1.5 * pts["e2e_s_p50"])))
    finding = Finding("Serving: fifo up to 0.9 req/s.", "40 requests a point", True, (far,))
    results.save_finding(run, "serving_load", finding)
    _, _, text = figures_twin.notebook_section(run, "serving_load", finding)
    saved = results.read_manifest(run)["findings"]["serving_load"]
    assert saved["text"] == finding.text and saved["supported"] is True
    assert saved["evidence"].startswith("40 requests a point. The twin")
    assert "furthest apart at engine=fifo,profile=poisson,step=2: " in saved["evidence"] and "(-33%)" in saved["evidence"]
    assert "furthest apart" in text
    assert twin_validation.disagreement(pd.DataFrame(), "serving_load") == ""


def test_the_served_terms_calibrate_on_a_valid_one_at_a_time_point_outside_the_serving_sweeps_first():
    """Streaming anatomy's HTTP point at concurrency 1 (every serving point then stays out of sample), else a valid
    synchronous serving point; a contended (invalid) point calibrates nothing: the default run's only synchronous
    point was invalid and its inflated terms put the twin 25% off."""
    from workbench.predict import twin_validation

    def pts(*rows):
        cols = ("experiment", "point_id", "status", "valid", "concurrency", "profile", "engine")
        return pd.DataFrame([dict(zip(cols, r)) for r in rows])

    sync_bad = ("serving_load", "serving_load/engine=static,profile=synchronous", "ok", False, None, "synchronous",
                "static")
    sync_ok = (*sync_bad[:3], True, *sync_bad[4:])
    http1 = ("http", "http/concurrency=1", "ok", True, 1, None, None)
    http4 = ("http", "http/concurrency=4", "ok", True, 4, None, None)
    assert twin_validation.calibration_points(pts(sync_ok, http4, http1)) == ["http/concurrency=1"]
    # the streaming reader's own streams join it (several moments of the run; its proxy paths do not)
    reader = pd.DataFrame([{"experiment": "streaming_reader", "point_id": f"streaming_reader/part={part}",
                            "status": "ok", "valid": valid, "part": part}
                           for part, valid in (("reader", True), ("proxy", True), ("keepalive", True))])
    both = pd.concat([pts(sync_ok, http1), reader], ignore_index=True)
    assert twin_validation.calibration_points(both) == ["http/concurrency=1", "streaming_reader/part=reader"]
    # measured with a speed probe, the HTTP point is brought to the calibration's speed and stands alone (the
    # unprobed reader streams, other moments of the run, pulled its first-token term from 15 ms to 2 ms on a run)
    probed = both.assign(speed_probe_tpot_s=[None, 0.06, None, None, None])
    assert twin_validation.calibration_points(probed) == ["http/concurrency=1"]
    assert twin_validation.calibration_points(pts(sync_ok, http4)) == [sync_ok[1]]
    assert twin_validation.calibration_points(pts(sync_bad, http4)) == []
    assert twin_validation.calibration_points(pts(sync_bad, (*http1[:3], False, *http1[4:]))) == []
    assert twin_validation.calibration_points(pd.DataFrame()) == []


def test_the_recommendations_compare_the_presets_the_measurement_scored(tmp_path):
    """Notebook 08 scores the presets of its slo_presets parameter; the twin scores every preset: the validation
    compares the measured side's presets (the default run showed mlperf_405b_* on the simulated side alone)."""
    from workbench.predict import twin_validation
    from workbench.run import results

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    pts = results.read_points(run)
    results.write_table(run / "points.parquet", pts[[c for c in pts.columns if "mlperf_405b" not in c]])
    _, summ = twin_validation.validate(run, write=False)
    assert summ["recommendation_measured"] and not any("mlperf_405b" in k for k in summ["recommendation_measured"])
    assert set(summ["recommendation_simulated"]) == set(summ["recommendation_measured"])


def test_the_cost_fit_uses_only_valid_points_and_says_when_it_cannot(tmp_path):
    """A point the run marked invalid (the reference drifted 27% over the default run's context-length sweep)
    measured the machine's moment: its rows stay out of the run's cost fit, which then recovers the valid points'
    costs; with too few valid workloads the invalid rows come back in and the source says so."""
    from workbench.predict import twin_validation
    from workbench.run import results

    run = results.create_run("validfit")
    pts, reqs = [], []
    for b in (1, 2, 4, 8):
        for p in (32, 128, 512):
            pid = f"batch_size/batch_size={b},prompt_tokens={p}"
            slow = 1.5 if p == 512 else 1.0   # the long prompts measured in a slow stretch, marked invalid
            pts.append({"experiment": "batch_size", "point_id": pid, "status": "ok", "valid": slow == 1.0})
            reqs.append({"experiment": "batch_size", "point_id": pid, "batch_size": b, "prompt_tokens": p,
                         "output_tokens": 16, "prefill_s": COST.prefill_s(b, p) * slow,
                         "tpot_s": COST.step_s(b, b * (p + 8)) * slow})
    results.write_table(run / "points.parquet", pd.DataFrame(pts))
    results.write_table(run / "requests.parquet", pd.DataFrame(reqs))
    cost = twin_validation.cost_for(run)
    assert "valid points" in cost.source and cost.n_rows == 8
    assert cost.prefill_s(8, 512) == pytest.approx(COST.prefill_s(8, 512), rel=1e-3)
    assert cost.step_s(4, 4 * 300) == pytest.approx(COST.step_s(4, 4 * 300), rel=1e-3)
    results.write_table(run / "points.parquet", pd.DataFrame(pts).assign(valid=lambda d: d["point_id"].str.contains(
        "batch_size=1,")))   # 3 valid workloads at batch 1: too few for the step fit
    assert "invalid points included" in twin_validation.cost_for(run).source


def test_a_cost_at_a_moments_speed_scales_every_time_term():
    """The speed probe's factor (the drift reference beside a point over the one the cost is at) multiplies every
    time term; a cost without a reference, or a missing probe, is never rescaled."""
    import dataclasses

    cost = dataclasses.replace(COST, reference_tpot_s=0.05)
    at, factor = cost.at_speed(0.075)
    assert factor == pytest.approx(1.5)
    assert at.service_s(64, 16) == pytest.approx(1.5 * cost.service_s(64, 16))
    assert at.mixed_step_s(3, 300, 20, 400) == pytest.approx(1.5 * cost.mixed_step_s(3, 300, 20, 400))
    for probe in (None, float("nan"), 0.0, -1.0):
        assert cost.at_speed(probe) == (cost, 1.0)
    assert COST.at_speed(0.075) == (COST, 1.0)          # fitted without probes: no reference
    assert "rescaled to each measured point's own" in cost.describe()
    assert twin_cost.StepCost.from_dict({k: v for k, v in COST.to_dict().items() if k != "reference_tpot_s"}) \
        .at_speed(0.075)[1] == 1.0                       # an older calibration file: not rescaled


def test_the_cost_fit_brings_each_workload_to_one_speed_by_its_speed_probe():
    """Workloads measured at moments 0.7x-1.6x the machine's usual speed, each with its probe: the fit on the probed
    rows recovers the cost (at the probes' median speed), the fit that ignores the probes does not."""
    rng = np.random.default_rng(3)
    rows = []
    for b in (1, 2, 4, 8):
        for p in (32, 128, 512, 1024):
            f = float(rng.uniform(0.7, 1.6))
            rows.append({"batch_size": b, "prompt_tokens": p, "output_tokens": 16, "speed_probe_tpot_s": 0.05 * f,
                         "prefill_s": f * COST.prefill_s(b, p), "tpot_s": f * COST.step_s(b, b * (p + 8))})
    df = pd.DataFrame(rows)
    probed, blind = twin_cost.fit(df), twin_cost.fit(df.drop(columns="speed_probe_tpot_s"))
    assert probed.reference_tpot_s == pytest.approx(df["speed_probe_tpot_s"].median())
    usual = probed.at_speed(0.05)[0]
    for b, p in ((1, 64), (4, 512), (8, 1024)):
        assert usual.step_s(b, b * p) == pytest.approx(COST.step_s(b, b * p), rel=0.02)
        assert usual.prefill_s(b, p) == pytest.approx(COST.prefill_s(b, p), rel=0.02)
    assert probed.loo_step_error < 0.02 < blind.loo_step_error
    assert blind.reference_tpot_s != blind.reference_tpot_s   # no probes: NaN, never rescaled


def test_the_validation_predicts_each_point_at_its_own_moments_speed(tmp_path):
    """Points measured while the machine ran 0.8x-1.5x its calibration's speed: predicted at their speed probe's
    speed the twin matches them; at the calibration's speed throughout (the ``_unscaled`` errors) it does not."""
    import dataclasses

    from workbench.predict import twin_validation
    from workbench.run import results

    cost = dataclasses.replace(COST, reference_tpot_s=0.05)
    run = _measured_run(tmp_path, cost, speeds=[1.0, 1.5, 0.8, 1.3])
    table, summ = twin_validation.validate(run, cost, write=False)
    assert summ["mape_e2e_p50"] < 1e-6 and summ["mape_ttft_p50"] < 1e-6
    assert summ["mape_e2e_p50_unscaled"] > 0.1 and summ["mape_ttft_p50_unscaled"] > 0.1
    assert table["speed_factor"].tolist() == pytest.approx([1.0, 1.5, 0.8, 1.3])
    assert summ["twin_speed_factor_min"] == pytest.approx(0.8) and summ["twin_speed_factor_max"] == pytest.approx(1.5)
    assert "at its own moment's speed (speed probe 0.80x-1.50x" in twin_validation.sentence(summ)
    # the probe joins the requests by point (what the cost fit reads)
    joined = twin_cost.with_speed(results.read_requests(run), results.read_points(run))
    assert joined.groupby("point_id")["speed_probe_tpot_s"].nunique().eq(1).all()
    assert sorted(joined["speed_probe_tpot_s"].unique()) == pytest.approx([0.04, 0.05, 0.065, 0.075])


def test_a_simulated_run_is_not_called_comparable_in_its_token_counts(tmp_path):
    """``workbench report RUN SIMULATED_RUN`` called the twin's token counts, warm-up and TTFT start "same" as a
    measured run's: the simulated run's provenance says what it is, and the check cautions that a difference is
    the twin's error."""
    from workbench.run import results
    from workbench.share import comparability

    measured = _measured_run(tmp_path, COST)
    sim = results.create_run("sim")
    res = twin.simulate(COST, twin.open_loop("poisson", 20, 0.5, 64, 16), twin.TwinConfig(engine="fifo"), "poisson",
                        rate=0.5)
    results.write_table(sim / "points.parquet", pd.DataFrame([{**res.summary, "experiment": "simulate",
                                                               "point_id": "simulate/x", "status": "ok"}]))
    assert comparability.provenance(sim)["token_counts"].startswith("simulated")
    lines, left = comparability.comparability([measured, sim])
    text = "\n".join(lines)
    assert "token counts: DIFFERENT" in text and "warm-up: DIFFERENT" in text and "TTFT counted from: DIFFERENT" in text
    assert "B (workbench twin (simulated" in text and "caution: run B is the serving twin's prediction" in text
    assert "goodput_rps" not in left   # the twin scores the workbench's own SLO definitions


def test_the_simulated_recommendation_is_the_twins_own_verdict(tmp_path):
    """The simulated points were built on the measured ones and kept every column the twin did not give: the
    measured one-sided attainment bounds among them, so the simulated recommendation for the attainment-judged
    presets was the measured verdict. Here the measurement 'met' rag at every rate while the twin's cost is 40x
    too slow for it: the simulated side must say so."""
    import dataclasses

    from workbench.predict import twin_validation
    from workbench.run import results

    run = _measured_run(tmp_path, COST)
    pts = results.read_points(run)
    results.write_table(run / "points.parquet", pts.assign(slo_attainment_rag=1.0, slo_attainment_lower_rag=0.99,
                                                           slo_attainment_upper_rag=1.0))
    slow = dataclasses.replace(COST, b0=40 * COST.b0)   # TPOT ~2 s a token: the rag preset's 0.15 s is missed
    table, summ = twin_validation.validate(run, slow, write=False)
    assert summ["recommendation_measured"]["rag"] > 0
    assert summ["recommendation_simulated"]["rag"] == 0
    assert set(summ["recommendation_simulated"]) == set(summ["recommendation_measured"])
    assert not {"background", "interactive"} & set(summ["recommendation_measured"])   # scheduling's classes


def test_simulate_takes_its_workload_from_the_runs_notebook_08(tmp_path):
    """``simulate --run R`` simulated 64 / 16-token requests where the run's notebook 08 sent 32 / 6: the options left
    unset come from the run, the others stay as given."""
    from types import SimpleNamespace

    from workbench.predict import twin_study
    from workbench.run import results

    run = results.create_run("wl")
    results.update_manifest(run, experiments={"serving_load": {"config": {"prompt_tokens": 32, "max_new_tokens": 6,
                                                                          "max_batch_size": 8}}})
    args = SimpleNamespace(run=str(run), prompt_tokens=None, max_new_tokens=12, max_batch_size=None,
                           batch_window_s=None)
    defaults = {"prompt_tokens": 64, "max_new_tokens": 16, "max_batch_size": 4, "batch_window_s": 0.05}
    came = twin_study.fill_workload(args, defaults)
    assert (args.prompt_tokens, args.max_new_tokens, args.max_batch_size) == (32, 12, 8)
    assert args.batch_window_s == defaults["batch_window_s"] and "prompt_tokens" in came
    bare = SimpleNamespace(run=None, prompt_tokens=None, max_new_tokens=None, max_batch_size=None, batch_window_s=None)
    assert not twin_study.fill_workload(bare, defaults) and (bare.prompt_tokens, bare.max_batch_size) == (64, 4)


def test_the_step_cost_carries_the_measured_residual_at_each_batch_size(tmp_path):
    """A CPU step of 3 or 7 rows cost 20-30% more than the linear form puts between 2 and 8 rows (a bare
    ``generate`` on this VM, results/LOG.md 2026-12-06): the fit keeps each measured batch size's residual, the
    twin's steps at those sizes follow the measurement, a size past the largest measured is the linear form's, and
    the table travels with the calibration and scales with the machine's speed."""
    bump = {3: 0.03, 7: 0.02}
    true = dataclasses.replace(COST, batch_residual_s=tuple((b, bump.get(b, 0.0)) for b in range(1, 9)))
    rows = []
    for b in range(1, 9):
        for p in (32, 128, 512):
            rows.append({"batch_size": b, "prompt_tokens": p, "output_tokens": 16,
                         "prefill_s": COST.prefill_s(b, p), "tpot_s": COST.step_s(b, b * (p + 8)) + bump.get(b, 0.0)})
    fitted = twin_cost.fit(pd.DataFrame(rows), source="synthetic")
    table = dict(fitted.batch_residual_s)
    assert sorted(table) == list(range(1, 9))
    for b, p in ((3, 64), (7, 256), (5, 128)):
        assert fitted.step_s(b, b * p) == pytest.approx(true.step_s(b, b * p), rel=0.03), b
    linear_only = dataclasses.replace(fitted, batch_residual_s=())
    assert abs(linear_only.step_s(3, 3 * 64) / true.step_s(3, 3 * 64) - 1) > 0.1   # what the table is for
    assert fitted.residual_s(12) == 0.0 and fitted.step_s(12, 1200) == linear_only.step_s(12, 1200)
    assert fitted.loo_step_error < 0.05
    steps = fitted.steps_s(3, 64, 5)
    assert steps == pytest.approx([fitted.step_s(3, 3 * (64 + k)) for k in range(1, 6)])
    # the twin's static batch of three pays the bump on each of its decode steps
    specs = twin.trace_specs([{"offset_s": 0.0, "prompt_tokens": 64, "output_tokens": 9} for _ in range(3)])
    cfg = twin.TwinConfig(engine="static", max_batch_size=3, batch_window_s=0.01)
    gap = twin.simulate(true, specs, cfg).rows["e2e_s"] - twin.simulate(COST, specs, cfg).rows["e2e_s"]
    assert np.allclose(gap, 8 * bump[3])
    # travels with the run, scales with the speed, refuses a bad table in one line
    run = tmp_path / "run"
    run.mkdir()
    twin_cost.save(run, fitted)
    assert twin_cost.load(run).batch_residual_s == fitted.batch_residual_s
    probed = dataclasses.replace(true, reference_tpot_s=0.05)
    assert probed.at_speed(0.1)[0].step_s(3, 300) == pytest.approx(2 * probed.step_s(3, 300))
    for bad in (((0, 0.01),), ((2, float("nan")),)):
        with pytest.raises(ParameterError, match="batch_residual_s") as e:
            dataclasses.replace(COST, batch_residual_s=bad)
        assert "\n" not in str(e.value)


def test_the_knee_test_can_fail_the_twin_searches_its_own_rate_against_the_measured_bracket(tmp_path):
    """The twin's own highest sustainable rate (its own Poisson arrivals, not the measured ones) lies inside the
    measured bracket with the true cost model, and outside it, with the distance, when the model is 3x too slow:
    the test could fail (the knee on the measured arrivals can only be one of the measured rates)."""
    from workbench.predict import twin_validation

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    _, summ = twin_validation.validate(run, write=False)
    k = summ["knee_search"]["fifo"]
    low, high = k["bracket"]
    assert low is not None and high is not None and low < high
    assert k["inside"] is True and low <= k["twin_rps"] <= high and k["distance"] == 0.0
    assert k["twin_rps"] not in (low, high)                       # a rate of its own, not a measured one
    slow = twin_cost.StepCost(**{c: 3 * getattr(COST, c) for c in twin_cost.PREFILL_TERMS + twin_cost.STEP_TERMS})
    _, off = twin_validation.validate(run, slow, write=False)
    miss = off["knee_search"]["fifo"]
    assert miss["inside"] is False and miss["twin_rps"] < low and miss["distance"] < -0.3
    assert "outside" in twin_validation.sentence(off)


def test_recommendations_count_only_presets_decided_on_a_side_and_the_unscaled_error_leads(tmp_path):
    from workbench.predict import twin_validation

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    _, summ = twin_validation.validate(run, write=False)
    both = set(summ["recommendation_undetermined_both"])
    assert summ["recommendation_decided_count"] == len(summ["recommendation_decided"])
    assert not both & set(summ["recommendation_decided"]) and "mlperf_server" in both   # p99 at 40 requests
    text = twin_validation.sentence(summ)
    assert f"of {summ['recommendation_decided_count']} presets decided on at least one side" in text
    assert text.index("prediction error (the calibration's speed throughout)") < text.index("given each moment's speed")
    assert summ["mape_by_experiment"]["serving_load"]["n"] == summ["twin_points"]


def test_the_all_rows_fallback_is_in_sample_flagged_and_out_of_the_errors(tmp_path):
    """Too few non-serving rows: the cost model is fitted on every row, the scored points' included. Each point
    is flagged in-sample and none enters the MAPE (it was in-sample with only the source string saying so)."""
    import dataclasses

    from workbench.predict import twin_validation

    run = _measured_run(tmp_path, COST)
    fitted_on_all = dataclasses.replace(COST, source=f"fit:{run.name} {twin_validation.ALL_ROWS}")
    table, summ = twin_validation.validate(run, fitted_on_all, write=False)
    assert table["calibration"].all() and summ["twin_in_sample_fit"] is True
    assert summ["twin_points"] == 0 and summ["mape_e2e_p50_points"] == 0
    assert "no out-of-sample point" in twin_validation.sentence(summ)


def test_the_aa_arms_duplicate_points_are_not_counted_twice(tmp_path):
    from workbench.predict import twin_validation
    from workbench.run import results

    run = _measured_run(tmp_path, COST)
    twin_cost.save(run, COST)
    pts = results.read_points(run)
    pts["policy"] = ["fcfs", "fcfs", "fcfs", "fcfs_aa"]
    results.write_table(run / "points.parquet", pts)
    table, summ = twin_validation.validate(run, write=False)
    assert len(table) == 4 and table["aa_duplicate"].tolist() == [False, False, False, True]
    assert summ["twin_points"] == 3 and summ["twin_points_aa_duplicate"] == 1
    assert "1 A/A duplicate left out" in twin_validation.sentence(summ)


def test_a_scheduling_point_is_simulated_without_the_serving_presets(monkeypatch):
    """A scheduling point is judged by its request classes' SLOs: its simulation evaluates no SLO preset (each
    evaluation of every preset on every simulated point was most of a run's validation, compared with nothing: the
    measured scheduling rows carry no preset figures). A serving-load point keeps the presets its row has."""
    from workbench.predict import twin_validation
    from workbench.stats import slo

    rows = pd.DataFrame({"request_id": range(6), "t_scheduled_s": [0.1 * i for i in range(6)], "prompt_tokens": 32,
                         "max_tokens": [4, 4, 16, 4, 4, 16],
                         "request_class": ["interactive", "interactive", "background"] * 2})
    seen = []
    real = slo.evaluate
    monkeypatch.setattr(slo, "evaluate", lambda df, s, *a, **k: (seen.append(s.name), real(df, s, *a, **k))[1])
    sched = pd.Series({"experiment": "scheduling", "policy": "sjf", "point_id": "scheduling/x"})
    summ = twin_validation._simulate_point(COST, sched, rows, {"engine": "fifo"})
    assert not set(seen) & set(slo.PRESETS)           # the classes' own limits only ("custom")
    assert not any(k.startswith("slo_attainment_") and k[15:] in slo.PRESETS for k in summ)
    assert {"slo_attainment_interactive", "slo_attainment_background"} <= set(summ)
    served = pd.Series({"experiment": "serving_load", "engine": "fifo", "profile": "poisson", "offered_rps": 1.0,
                        "point_id": "serving_load/x"})
    seen.clear()
    summ = twin_validation._simulate_point(COST, served, rows, {"prompt_tokens": 32, "max_new_tokens": 4})
    assert set(seen) & set(slo.PRESETS) and all(f"slo_attainment_{name}" in summ for name in seen)
