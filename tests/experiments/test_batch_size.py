"""Experiment 01 (batch size): config validation, the recommendation, and a real sweep on the default model."""
import pandas as pd
import pytest

from workbench import ParameterError
from workbench.experiments import batch_size
from workbench.run import results


@pytest.mark.parametrize("kwargs,name", [
    ({"batch_sizes": [0]}, "batch_sizes"),
    ({"batch_sizes": []}, "batch_sizes"),
    ({"batch_sizes": "[1, 2]"}, "batch_sizes"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt_tokens": [9000]}, "prompt_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"model": "/no/such/model"}, "model"),
    ({"device": "tpu"}, "device"),
    ({"repeats": 0}, "repeats"),
    ({"slo_ttft_s": 0}, "slo_ttft_s"),
])
def test_invalid_batch_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        batch_size.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_recommend_batch_size_prefers_goodput_then_smaller_batch():
    pts = pd.DataFrame({"batch_size": [1, 2, 4, 8], "goodput_rps": [1.0, 2.0, 2.0, 0.0],
                        "output_throughput_tps": [5, 9, 12, 20], "status": ["ok"] * 4})
    assert batch_size.recommend(pts)["batch_size"] == 2
    pts["status"] = "failed: x"
    assert batch_size.recommend(pts) is None


def _designed(pts: pd.DataFrame, verdicts: dict) -> pd.DataFrame:
    """Points as a design records them (workbench.run.design): the batch-1 control at 1, each arm's decision."""
    out = pts.assign(design="interleaved", rounds=3, margin=1.05, design_seconds=30.0, seconds_per_round=10.0,
                     design_stopped="decided", aa_ratio=1.0, aa_low=0.95, aa_high=1.05, aa_verdict="undecided")
    for col in ("throughput_ratio", "throughput_ratio_low", "throughput_ratio_high", "throughput_ratio_level",
                "rounds_needed"):
        out[col] = float("nan")
    for col in ("throughput_ratio_verdict", "throughput_ratio_direction", "throughput_ratio_method"):
        out[col] = ""
    for pid, (est, lo, hi, verdict, direction, need) in verdicts.items():
        i = out.index[out["point_id"] == pid][0]
        out.loc[i, ["throughput_ratio", "throughput_ratio_low", "throughput_ratio_high", "throughput_ratio_level",
                    "rounds_needed"]] = [est, lo, hi, 0.95, need]
        out.loc[i, ["throughput_ratio_verdict", "throughput_ratio_direction", "throughput_ratio_method"]] = [
            verdict, direction, "pooled block model, 6 dof, Dunnett over 3"]
    out.loc[out["point_id"] == "b1", "throughput_ratio"] = 1.0
    return out


def test_recommend_and_headline_use_valid_points_only():
    pts = pd.DataFrame({"point_id": ["b1", "b2", "b4"], "batch_size": [1, 2, 4], "prompt_tokens": [64] * 3,
                        "goodput_rps": [1.0, 2.0, 9.0], "output_throughput_tps": [5.0, 9.0, 30.0],
                        "ttft_s_p50": [0.1, 0.2, 0.3], "wall_s": [4.0, 2.0, 1.0], "requests": [4, 4, 9],
                        "status": ["ok"] * 3, "valid": [True, True, False]})
    assert batch_size.recommend(pts)["batch_size"] == 2  # the invalid batch 4 never wins, even when alone best
    assert batch_size.recommend(pts.assign(valid=False)) is None
    drifted = batch_size.headline(pts.assign(valid=False, invalid_reason="reference TPOT drifted 55% during the sweep"))
    assert drifted.verdict == "undecided" and "relax" not in drifted.text, drifted.text   # the SLO is not why
    assert "0 of 3 valid (reference TPOT drifted 55%" in drifted.text and "--rerun-invalid RUN_DIR" in drifted.text
    decided = _designed(pts, {"b2": (2.0, 1.8, 2.2, "direction", "higher", 0),
                              "b4": (5.0, 4.0, 6.0, "direction", "higher", 0)})
    f = batch_size.headline(decided)
    assert f.text.startswith("Recommended batch size: 2") and f.point_ids == ("b2", "b1")
    assert f.verdict == "direction" and f.supported and f.rounds == 3 and f.margin == 1.05
    assert "Output throughput at batch 2 vs batch 1: higher, 2.00x, 95% interval 1.80-2.20x" in f.text
    assert "2 valid points (1 invalid or failed excluded)" in f.evidence and "8 of" not in f.evidence
    assert "4 requests at the recommended point, 4 met the SLO" in f.evidence
    open_ = batch_size.headline(_designed(pts, {"b2": (1.1, 0.9, 1.3, "undecided", "", 9)}))
    assert open_.verdict == "undecided" and not open_.supported and open_.rounds_needed == 9
    assert open_.seconds_needed == pytest.approx(60.0) and "about 9 rounds" in open_.text
    measured_alone = batch_size.headline(pts)     # one round: no design, no comparison
    assert measured_alone.verdict == "undecided" and "one round pairs nothing" in measured_alone.text


def test_a_recommended_baseline_is_a_verdict_only_when_every_larger_batch_is_decided():
    pts = pd.DataFrame({"point_id": ["b1", "b2"], "batch_size": [1, 2], "prompt_tokens": [64] * 2,
                        "goodput_rps": [2.0, 1.0], "output_throughput_tps": [5.0, 4.0], "ttft_s_p50": [0.1, 0.2],
                        "wall_s": [4.0, 2.0], "requests": [4, 4], "status": ["ok"] * 2, "valid": [True, True]})
    slower = batch_size.headline(_designed(pts, {"b2": (0.8, 0.7, 0.9, "direction", "lower", 0)}))
    assert slower.verdict == "direction" and "Keep batch 1: every larger batch is slower" in slower.text
    unclear = batch_size.headline(_designed(pts, {"b2": (0.97, 0.8, 1.1, "undecided", "", 12)}))
    assert unclear.verdict == "undecided" and "none shown faster" in unclear.text


def test_a_moved_a_a_control_leaves_the_batch_finding_undecided():
    """The smallest batch against itself shows a direction: drift, not effects, whatever the arms' intervals say."""
    pts = pd.DataFrame({"point_id": ["b1", "b4"], "batch_size": [1, 4], "prompt_tokens": [32] * 2,
                        "goodput_rps": [1.0, 4.0], "output_throughput_tps": [10.0, 40.0], "ttft_s_p50": [0.1, 0.1],
                        "wall_s": [4.0, 4.0], "requests": [4, 16], "status": ["ok"] * 2, "valid": [True, True]})
    ok = _designed(pts, {"b4": (4.0, 3.6, 4.4, "direction", "higher", 0)})
    assert batch_size.headline(ok).verdict == "direction"
    moved = batch_size.headline(ok.assign(aa_ratio=1.12, aa_low=1.05, aa_high=1.2, aa_verdict="direction"))
    assert moved.verdict == "undecided" and "A/A control moved" in moved.text


def test_batch_attainment_counts_batches_not_rows():
    """Batch 16 x 2 repeats, all 32 rows within the SLO: 2 independent units, Wilson 0.34-1.00 (not 0.89-1.00 over
    32 rows); one repeat is 1 unit."""
    pts = pd.DataFrame({"point_id": ["b16"], "batch_size": [16], "prompt_tokens": [64], "goodput_rps": [8.0],
                        "output_throughput_tps": [100.0], "ttft_s_p50": [0.5], "wall_s": [4.0], "requests": [32],
                        "n_samples": [2], "status": ["ok"], "valid": [True]})
    f = batch_size.headline(pts)
    assert "2/2" in f.evidence and "0.34-1.00" in f.evidence and "0.89" not in f.evidence
    assert f.verdict == "undecided"            # one point: no comparison to decide (the verdict is a comparison's)
    one = batch_size.headline(pts.assign(requests=16, n_samples=1, goodput_rps=4.0))
    assert "1/1" in one.evidence and not one.supported


@pytest.mark.model
def test_batch_sweep_on_the_real_model_keeps_the_invariants(loaded):
    """Two points on the real model, greedy: token counts; each row of the batch-2 point generates the same ids as
    its prompt alone at batch 1; a left-padded batch (prompts of different lengths, the experiment's settings)
    equals each prompt alone; the figures build, one panel or trace set per device type."""
    from workbench.inputs.prompts import build_batch, build_prompt
    from workbench.measure.generation import generate_measured

    cfg = batch_size.Config(batch_sizes=[1, 2], prompt_tokens=[48], max_new_tokens=3, repeats=2, max_rounds=4,
                            warmup=0)
    assert cfg.temperature == 0.0                      # greedy: equal ids are the expected outcome, not luck
    run = results.create_run()
    points = batch_size.run(cfg, run, loaded)
    assert (points["status"] == "ok").all() and len(points) == 2
    # one design: 2 rounds, then the looks' rounds up to max_rounds while undecided; every round of every arm is in
    # the run folder's design table, the A/A arm among them, and each point carries its decision
    rounds = int(points["rounds"].iloc[0])
    assert (points["design"] == "interleaved").all() and 2 <= rounds <= cfg.max_rounds
    table = pd.read_parquet(run / "design" / "batch_size.parquet")
    assert len(table) == rounds * 3 and set(table["arm"]) == {*points["point_id"], "A/A"}
    two = points[points["batch_size"] == 2].iloc[0]
    assert two["throughput_ratio_verdict"] in ("direction", "equivalent", "undecided")
    assert points.loc[points["batch_size"] == 1, "throughput_ratio"].iloc[0] == 1.0
    req = results.read_requests(run, experiment="batch_size")
    assert sorted(req["repeat"].unique()) == list(range(rounds)) and len(req) == rounds * (1 + 2)
    # batch 2 equals batch 1, row by row: row 0 against the batch-1 point (same prompt), row 1 against its own run
    settings = cfg.settings()
    req = req[req["repeat"] == 0]
    one = req[req["batch_size"] == 1].sort_values("request_id")["output_ids"].map(list).tolist()
    two = req[req["batch_size"] == 2].sort_values("request_id")["output_ids"].map(list).tolist()
    assert len(one) == 1 and len(two) == 2 and all(len(ids) == 3 for ids in one + two)
    assert two[0] == one[0]
    prompts = build_batch(loaded.tokenizer, 2, 48)
    assert two[1] == list(generate_measured(loaded, [prompts[1]], settings).records[0]["output_ids"])

    # left padding: prompts of different lengths share the batch (the experiment's measured generate, its
    # settings); each row equals its prompt alone
    mixed = [build_prompt(loaded.tokenizer, 48), build_prompt(loaded.tokenizer, 36, offset=400)]
    batched = generate_measured(loaded, mixed, settings).records
    assert [r["prompt_tokens"] for r in batched] == [48, 36]
    for p, rec in zip(mixed, batched):
        assert list(rec["output_ids"]) == list(generate_measured(loaded, [p], settings).records[0]["output_ids"])

    names = {"batch_ttft", "batch_throughput", "batch_pareto", "batch_decode_speed", "batch_goodput",
             "batch_throughput_ratio"}
    figs = batch_size.figures(points, req, run)
    assert set(figs) == names and "each round" in figs["batch_throughput_ratio"].to_json()
    # points of two device types are never drawn as one curve: every figure names both
    other = "Other Device 9000"
    mixed_points = pd.concat([points, points.assign(device_name=other)], ignore_index=True)
    mixed_req = pd.concat([req, req.assign(device_name=other)], ignore_index=True)
    figs = batch_size.figures(mixed_points, mixed_req)
    assert set(figs) == names
    for name, fig in figs.items():
        assert other in fig.to_json() and str(points["device_name"].iloc[0]) in fig.to_json(), name
    f = batch_size.headline(points, req, run)
    if points["valid"].fillna(False).astype(bool).any():
        assert f.verdict in ("direction", "equivalent", "undecided") and f.rounds == rounds
    else:   # a busy machine (a parallel test worker) can leave every point contaminated: no decision, said so
        assert f.verdict == "undecided" and not f.supported and "valid" in f.evidence


@pytest.mark.model
def test_one_repeat_measures_point_by_point(loaded, monkeypatch):
    """With one round there is nothing to pair: each point is measured (and written) on its own, so an interrupted
    one-repeat sweep keeps the points finished before it; with two rounds the points are one design."""
    calls = []
    real = batch_size.sweep_design
    monkeypatch.setattr(batch_size, "sweep_design", lambda *a: calls.append(a) or real(*a))
    cfg = batch_size.Config(batch_sizes=[1, 2], prompt_tokens=[32], max_new_tokens=2, repeats=1, warmup=0)
    points = batch_size.run(cfg, results.create_run(), loaded)
    assert (points["status"] == "ok").all() and len(points) == 2 and not calls
    assert "design" not in points or points["design"].isna().all()


def test_a_recommendation_not_shown_better_than_its_runner_up_is_undecided(monkeypatch):
    """Issue 49: batch 16 was "recommended" for beating batch 1 though 16 vs 8 was never decided. The recommendation
    beats the baseline (a direction) but is within noise of the runner-up in the design's rounds: the finding is
    undecided, says both comparisons, and carries the rounds the runner-up comparison needs."""
    import numpy as np

    from workbench.run import design
    from workbench.stats import blocks

    pts = pd.DataFrame({"point_id": ["b1", "b8", "b16"], "batch_size": [1, 8, 16], "prompt_tokens": [64] * 3,
                        "goodput_rps": [1.0, 2.9, 3.0], "output_throughput_tps": [10.0, 29.0, 30.0],
                        "ttft_s_p50": [0.1, 0.4, 0.8], "wall_s": [4.0, 4.0, 4.0], "requests": [4, 8, 16],
                        "status": ["ok"] * 3, "valid": [True] * 3})
    decided = _designed(pts, {"b8": (2.9, 2.5, 3.3, "direction", "higher", 0),
                              "b16": (3.0, 2.6, 3.4, "direction", "higher", 0)})
    drift, wobble = np.array([0.1, -0.2, 0.3]), np.array([0.04, -0.04, 0.03])
    rounds = pd.DataFrame([(a, r, v) for a, vals in {"b1": np.exp(drift), "b8": np.exp(drift + 1.06 + wobble),
                                                      "b16": np.exp(drift + 1.1 - wobble)}.items()
                           for r, v in enumerate(vals)], columns=["arm", "round", "value"])
    analysis = blocks.analyse(rounds, "b1", aa=None)
    monkeypatch.setattr(design, "reanalyse", lambda run_dir, exp, outcome=None: (None, analysis))
    f = batch_size.headline(decided, run_dir="a run folder")
    assert f.text.startswith("Recommended batch size: 16")
    assert "Output throughput at batch 16 vs batch 1: higher" in f.text
    assert "Against the runner-up, batch 8: undecided" in f.text
    assert f.verdict == "undecided" and not f.supported and f.point_ids == ("b16", "b1", "b8")
    # the same rounds with batch 16 clearly ahead of batch 8: the recommendation is decided
    rounds.loc[rounds["arm"] == "b16", "value"] *= 1.5
    monkeypatch.setattr(design, "reanalyse", lambda run_dir, exp, outcome=None: (None, blocks.analyse(rounds, "b1",
                                                                                                       aa=None)))
    assert batch_size.headline(decided, run_dir="a run folder").verdict == "direction"


def test_an_invalid_point_is_greyed_in_goodput_and_left_out_of_the_decode_speed_boxes():
    from workbench.share.plots import INVALID_NAME

    pts = pd.DataFrame({"point_id": ["a", "b", "c"], "batch_size": [1, 2, 4], "prompt_tokens": [64] * 3,
                        "goodput_rps": [1.0, 1.5, 2.0], "output_throughput_tps": [5.0, 9.0, 12.0],
                        "slo_ttft_s": [1.0] * 3, "slo_tpot_s": [0.1] * 3, "status": ["ok"] * 3,
                        "valid": [True, False, True], "invalid_reason": ["", "other load", ""]})
    (cross,) = [t for t in batch_size.goodput_vs_batch(pts).data if t.name == INVALID_NAME]
    assert list(cross.x) == [2]
    reqs = pd.DataFrame({"point_id": ["a", "b", "b", "c"], "batch_size": [1, 2, 2, 4], "output_tokens": [4] * 4,
                         "prompt_tokens": [64] * 4, "context_tokens": [float("nan")] * 4,
                         "decode_tps": [10.0, 99.0, 99.0, 8.0]})
    fig = batch_size.decode_speed_vs_batch(reqs, pts)
    assert sorted(x for t in fig.data for x in t.x) == [1, 4] and "2 requests of 1 invalid point left out" in \
        fig.layout.title.text
    assert sorted(x for t in batch_size.decode_speed_vs_batch(reqs).data for x in t.x) == [1, 2, 2, 4]
