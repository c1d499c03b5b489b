"""Tests for workbench.experiments.reasoning_budget: config validation, the grid, summaries, figures, the notebook."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.errors import ParameterError
from workbench.experiments import reasoning_budget as R

NB = Path(__file__).resolve().parents[2] / "notebooks" / "05_reasoning_budget.ipynb"


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(budgets=[-4]), "budgets"),
        (dict(budgets=[0, 8, 8]), "budgets"),
        (dict(budgets=[0, 8], min_budget=9), "min_budget"),
        (dict(budgets=[0, 16, 64], min_budget=20), "min_budget"),
        (dict(batch_sizes=[0]), "batch_sizes"),
        (dict(thinking="yes"), "thinking"),
        (dict(num_tasks=0), "num_tasks"),
        (dict(task_kinds=["poetry"]), "task_kinds"),
        (dict(budgets=[9000]), "budgets"),
    ],
)
def test_config_rejects_bad_parameters_in_one_line(kwargs, name):
    with pytest.raises(ParameterError) as exc:
        R.Config(**kwargs)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(f"{name}: ")


def test_config_grid_and_specs():
    cfg = R.Config(budgets=[0, 16], batch_sizes=[1, 4], min_budget=4)
    assert cfg.grid() == [{"reasoning_budget": 0, "batch_size": 1}, {"reasoning_budget": 0, "batch_size": 4},
                          {"reasoning_budget": 16, "batch_size": 1}, {"reasoning_budget": 16, "batch_size": 4}]
    assert cfg.spec(0).min_budget == 0 and cfg.spec(16).min_budget == 4


def test_figures_from_tables():
    import pandas as pd

    rows = []
    for b in (0, 8):
        for i in range(4):
            rows.append(dict(reasoning_budget=b, batch_size=2, repeat=0, task_id=f"t{i}", gold="1", prediction="1",
                             exact_match=i % 2 == 0, gold_logprob=-1.0 - i - b / 8, thinking_tokens=0 if b == 0 else 11,
                             answer_tokens=5, ttft_s=0.1, ttfat_s=0.1 + b * 0.01, e2e_s=0.2 + b * 0.01,
                             thinking_text="", answer_text="\nAnswer: 1"))
    req = pd.DataFrame(rows)
    pts = pd.DataFrame([dict(reasoning_budget=b, batch_size=2, status="ok", ttft_s_p50=0.1, ttfat_s_p50=0.1 + b * 0.01,
                             e2e_s_p50=0.2 + b * 0.01, output_throughput_tps=10.0 + b) for b in (0, 8)])
    summary = R.quality_summary(req)
    acc = summary[(summary.metric == "exact_match") & (summary.reasoning_budget == 0)].iloc[0]
    assert acc["mean"] == 0.5 and acc["ci_low"] <= 0.5 <= acc["ci_high"] and acc["n"] == 4
    figs = R.figures(pts, req)
    assert list(figs) == ["reasoning_latency_vs_budget", "reasoning_quality_vs_budget", "reasoning_thinking_tokens",
                          "reasoning_throughput_vs_budget"]
    for fig in figs.values():
        assert fig.layout.title.text and len(fig.data) > 0
    assert "## B = 8" in R.examples_markdown(req)


def test_measure_point_aggregates_requests(monkeypatch):
    """measure_point batches the tasks, warms up once, and names its aggregates <column>_<stat>."""
    import workbench.experiments.reasoning_budget as mod
    from workbench.inputs.reasoning import make_tasks

    calls = {"warm": 0, "batches": []}

    def fake_warm_up(loaded, prompts, settings, n=1, **kw):
        calls["warm"] += n
        assert len(prompts) == len(kw["input_ids"]) == 2 and settings.max_new_tokens >= 8
        return 0.25

    def fake_batch(loaded, batch, spec, mode, temperature, top_p, seed, score=True):
        calls["batches"].append((len(batch), spec.budget, seed))
        return [dict(exact_match=1.0 if i == 0 else 0.0, gold_logprob=-2.0, thinking_tokens=spec.budget,
                     answer_truncated=False, forced_close=spec.budget > 0, thinking_mode="emulated",
                     ttft_s=0.1, ttfat_s=0.1 + 0.01 * spec.budget, prompt_tokens=40 + i) for i, _ in enumerate(batch)], 0.5

    from transformers import AutoTokenizer

    from workbench.measure.models import default_model_dir

    class Loaded:  # the default tokenizer (emulated thinking); generation is faked above
        tokenizer = AutoTokenizer.from_pretrained(default_model_dir())

    monkeypatch.setattr(mod, "warm_up", fake_warm_up)
    monkeypatch.setattr(mod, "run_reasoning_batch", fake_batch)
    cfg = R.Config(budgets=[0, 8], batch_sizes=[2], num_tasks=3, repeats=2, warmup=1)
    out = R.measure_point(Loaded(), cfg, {"reasoning_budget": 8, "batch_size": 2},
                         {"tasks": make_tasks(3)})
    assert calls["warm"] == 1 and out.warmup_s == 0.25
    assert calls["batches"] == [(2, 8, 0), (1, 8, 0), (2, 8, 1), (1, 8, 1)]
    assert len(out.requests) == 6 and out.wall_s == pytest.approx(2.0)
    assert [r["request_id"] for r in out.requests] == [0, 1, 2, 0, 1, 2]
    assert [r["batch_size"] for r in out.requests] == [2, 2, 1, 2, 2, 1]  # requests that shared a forward pass
    ex = out.extra
    assert ex["exact_match_mean"] == pytest.approx(4 / 6) and ex["gold_logprob_mean"] == -2.0
    assert ex["thinking_tokens_mean"] == 8 and ex["forced_close_rate"] == 1.0 and ex["answer_truncated_rate"] == 0.0
    assert ex["ttfat_s_p50"] == pytest.approx(0.18) and "accuracy" not in ex
    assert ex["prompt_tokens"] == 41  # the longest (padded) prompt of its batches, for the roofline


@pytest.mark.notebook
def test_notebook_runs_quick_and_writes_rows_and_figures(run_notebook):
    from workbench.run import notebooks, results

    nb = NB
    # 4 tasks at batch 2: two chunks, two interleaved rounds with the A/A control (issue 32)
    params = {"budgets": [0, 8], "batch_sizes": [2], "num_tasks": 4, "answer_tokens": 8, "warmup": 0}
    notebooks.validate_parameters(nb, params)
    run = results.open_run()
    run_notebook(nb, params, run)
    points = results.read_points(run, R.EXPERIMENT)
    assert sorted(points["reasoning_budget"]) == [0, 8] and set(points["status"]) == {"ok"}
    req = results.read_requests(run, R.EXPERIMENT)
    assert len(req) == 8
    assert (points["design"] == "interleaved").all() and (points["rounds"] == 2).all()
    assert points["aa_low"].notna().all() and points["time_ratio"].notna().all()
    assert (run / "figures" / "reasoning_time_ratio.html").exists()
    # (valid forced: a loaded test machine may mark the points invalid for drift, and the finding uses valid ones)
    f = R.finding(points.assign(valid=True), req)
    assert "A/A noise floor" in f.text and "Time to first answer token at budget 8 vs 0" in f.text
    assert (req["thinking_tokens"] + req["answer_tokens"] == req["output_tokens"]).all()
    assert (req.loc[req.reasoning_budget == 0, "thinking_tokens"] == 0).all()
    assert (req["ttfat_s"] >= req["ttft_s"]).all()
    for name in ("reasoning_latency_vs_budget", "reasoning_quality_vs_budget", "reasoning_thinking_tokens",
                 "reasoning_throughput_vs_budget"):
        assert (run / "figures" / f"{name}.html").exists()
    assert (run / "reasoning" / "examples.md").exists()
    assert points["exact_match_mean"].between(0, 1).all() and (points["gold_logprob_mean"] < 0).all()


def _reasoning_run(solved_lo, solved_hi, n_tasks=8, repeats=2, bs=4):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for b, solved in ((0, solved_lo), (64, solved_hi)):
        for r in range(repeats):
            for i in range(n_tasks):
                rows.append(dict(point_id=f"b{b}", reasoning_budget=b, batch_size=bs, repeat=r, batch_index=i // bs,
                                 exact_match=i < solved, thinking_tokens=b, ttfat_s=0.1 + b * 0.01 + rng.normal(0, .002)))
    req = pd.DataFrame(rows)
    pts = pd.DataFrame([dict(point_id=f"b{b}", reasoning_budget=b, batch_size=bs, status="ok", valid=True,
                             exact_match_mean=req[req.point_id == f"b{b}"].exact_match.mean(),
                             ttfat_s_p50=0.1 + b * 0.01, thinking_tokens_mean=b) for b in (0, 64)])
    return pts, req


def test_finding_says_not_supported_when_no_task_is_solved_and_gives_intervals():
    pts, req = _reasoning_run(0, 0)
    f = R.finding(pts, req)
    assert "effect on accuracy: not supported: no task solved" in f.text and "accuracy rises" not in f.text
    assert "time to first answer token: " in f.text and "95% interval" in f.text  # 4 batches each: an interval
    assert not f.supported  # the headline (accuracy) is not supported; the latency effect rides along in words
    assert "16 and 16 answers" in f.evidence and "accuracy change" in f.evidence
    pts, req = _reasoning_run(1, 8)
    assert "accuracy rises" in R.finding(pts, req).text and R.finding(pts, req).supported
    pts, req = _reasoning_run(4, 5)
    f = R.finding(pts, req)  # issue 32: "accuracy ... no difference beyond noise" was marked supported
    assert f.text.startswith("From budget 0 to 64, accuracy: no difference beyond noise") and not f.supported
    assert not R.finding(pts.assign(valid=False), req).supported
    assert "8 and 8 answers" in R.finding(pts, req.assign(temperature=0.0)).evidence  # greedy repeats count once


def _interleaved_reasoning(monkeypatch, aa_shift=1.0):
    """measure_interleaved on a fake model (the default tokenizer): whole rounds 10% slow or fast (machine drift),
    a time to first answer token that grows with the budget, the A/A arm's batches ``aa_shift`` times slower;
    budget 16 solves every task, budget 0 none."""
    import random
    import types

    import pandas as pd
    from transformers import AutoTokenizer

    import workbench.experiments.reasoning_budget as mod
    from workbench.measure.models import default_model_dir
    from workbench.run import point_result
    from workbench.stats import comparison

    cfg = R.Config(budgets=[0, 8, 16], batch_sizes=[2], num_tasks=8, repeats=2, warmup=0)
    rng, drift, calls, order = random.Random(4), {}, [], []
    schedule = comparison.schedule

    def recorded_schedule(*a, **k):
        order.extend(schedule(*a, **k))
        return list(order)

    def fake_batch(loaded, batch, spec, mode, temperature, top_p, seed, score=True):
        key = (seed, batch[0].task_id)
        drift.setdefault(key, rng.choice((0.9, 1.1)))
        n_round = len({c[0] for c in calls} | {key})  # rounds begun so far, this one included
        arm = order[[u for u, _ in order].index(n_round - 1) + sum(1 for c in calls if c[0] == key)][1]
        calls.append((key, spec.budget, tuple(t.task_id for t in batch), score))
        t = (0.1 + 0.01 * spec.budget) * drift[key] * rng.uniform(0.99, 1.01) * (aa_shift if arm == comparison.AA else 1)
        return [dict(exact_match=1.0 if spec.budget == 16 else 0.0, gold_logprob=-2.0, thinking_tokens=spec.budget,
                     answer_truncated=False, forced_close=spec.budget > 0, thinking_mode="emulated", ttft_s=0.1,
                     ttfat_s=t, prompt_tokens=40, temperature=0.0) for _ in batch], 0.5

    class Loaded:
        tokenizer = AutoTokenizer.from_pretrained(default_model_dir())

    monkeypatch.setattr(mod, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(mod, "run_reasoning_batch", fake_batch)
    monkeypatch.setattr(comparison, "schedule", recorded_schedule)
    got = R.measure_interleaved(Loaded(), cfg, cfg.grid(), {})
    pts, reqs = [], []
    for p in cfg.grid():
        pid = point_result.point_id(R.EXPERIMENT, p)
        pts.append({"point_id": pid, "status": "ok", "valid": True, "ttft_s_p50": 0.1, "e2e_s_p50": 0.3,
                    "output_throughput_tps": 10.0, **p, **got[pid].extra})
        reqs += [{**r, **p, "point_id": pid} for r in got[pid].requests]
    return cfg, calls, pd.DataFrame(pts), pd.DataFrame(reqs)


def test_measure_interleaved_rounds_with_the_aa_control(monkeypatch):
    """Issue 32: a round is one chunk of tasks in one repeat; every budget answers it once and budget 0 a second
    time (the A/A arm, not scored), the same tasks and seed for every arm of a round; the requests are those a
    point-by-point run records; the points carry the A/A and time-ratio columns; the finding prints the paired
    ratio with the noise floor and keeps accuracy as its headline and mark."""
    from workbench.stats import comparison, evidence

    cfg, calls, pts, req = _interleaved_reasoning(monkeypatch)
    assert R.chunk_size(cfg) == 2 and R.n_rounds(cfg) == 2 * 4
    keys = list(dict.fromkeys(k for k, *_ in calls))
    assert len(keys) == R.n_rounds(cfg)
    for k in keys:
        mine = [(b, tasks, score) for kk, b, tasks, score in calls if kk == k]
        assert sorted(b for b, *_ in mine) == [0, 0, 8, 16] and len({t for _, t, _ in mine}) == 1
        assert sum(1 for *_, score in mine if not score) == 1  # the A/A batch is timed, not scored
    firsts = [i for i, c in enumerate(calls) if i == 0 or c[0] != calls[i - 1][0]]
    assert len(firsts) == len(keys)  # a round's batches run together, round after round
    assert len({tuple(b for k, b, *_ in calls if k == kk) for kk in keys}) > 1  # shuffled within rounds
    for pid, g in req.groupby("point_id"):
        assert sorted(zip(g["repeat"], g["request_id"])) == [(r, i) for r in range(2) for i in range(8)]
        assert (g["batch_index"] == g["request_id"] // 2).all() and (g["batch_size"] == 2).all()
    assert set(comparison.COLUMNS) <= set(pts.columns) and (pts["design"] == "interleaved").all()
    assert (pts["rounds"] == R.n_rounds(cfg)).all() and not comparison.aa_moved_columns(pts.iloc[0])
    top = pts[pts["reasoning_budget"] == 16].iloc[0]
    assert top["time_ratio_low"] > 1 and "Holm over 2 comparisons" in top["time_ratio_method"]
    f = R.finding(pts, req)
    assert f.text.startswith("From budget 0 to 16, accuracy rises.") and f.supported
    assert "Time to first answer token at budget 16 vs 0: " in f.text and "A/A noise floor" in f.text
    assert comparison.AA_MOVED not in f.text and "paired within 8 interleaved rounds" in f.evidence
    assert f.supported == evidence.headline_supported(f.text)
    figs = R.figures(pts, req)
    band = [t for t in figs["reasoning_time_ratio"].data if (t.name or "").startswith("A/A noise floor")]
    assert len(band) == 1


def test_finding_says_the_aa_control_moved(monkeypatch):
    """An A/A arm 25% slower in every round: the points say it moved and the timing says "not supported: the A/A
    control moved"; accuracy (which drift cannot move) stays the headline and keeps its mark."""
    from workbench.stats import comparison, evidence

    _, _, pts, req = _interleaved_reasoning(monkeypatch, aa_shift=1.25)
    assert comparison.aa_moved_columns(pts.iloc[0])
    f = R.finding(pts, req)
    assert f"Time to first answer token at budget 16 vs 0: {comparison.AA_MOVED}" in f.text
    assert "(moved: excludes 1)" in f.text
    assert f.text.startswith("From budget 0 to 16, accuracy rises.") and f.supported
    assert evidence.headline_supported(f.text)


def test_default_suite_measures_the_budgets_in_interleaved_rounds():
    """The default suite's 05 entry has 2+ rounds (chunks x repeats), so its budgets are measured interleaved with
    the A/A control and the paired time-to-answer ratio has an interval; the batches are those a point-by-point
    run would make (the chunk holds whole batches)."""
    from workbench.run import notebooks

    entry = next(e for e in notebooks.load_suite("default")["notebooks"] if "05_reasoning_budget" in e["notebook"])
    merged = notebooks.validate_parameters(entry["notebook"], entry["parameters"])
    cfg = notebooks.notebook_config_class(entry["notebook"]).from_namespace(merged)
    assert R.n_rounds(cfg) >= 2 and all(R.chunk_size(cfg) % b == 0 for b in cfg.batch_sizes)
