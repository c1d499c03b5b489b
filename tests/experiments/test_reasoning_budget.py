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
        (dict(num_tasks=8, batch_sizes=[2], repeats=2, max_rounds=6), "max_rounds"),   # 2 passes of 4 chunks: 8
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
    assert "## Budget 8 thinking tokens" in R.examples_markdown(req)


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
    import pandas as pd

    from workbench.run import notebooks, results

    nb = NB
    # 4 tasks at batch 2: two chunks, two rounds of one design (issue 49), the A/A arm among them
    params = {"budgets": [0, 8], "batch_sizes": [2], "num_tasks": 4, "answer_tokens": 8, "warmup": 0,
              "max_rounds": 2}
    notebooks.validate_parameters(nb, params)
    run = results.open_run()
    run_notebook(nb, params, run)
    points = results.read_points(run, R.EXPERIMENT)
    assert sorted(points["reasoning_budget"]) == [0, 8] and set(points["status"]) == {"ok"}
    req = results.read_requests(run, R.EXPERIMENT)
    assert len(req) == 8 and sorted(req.loc[req.reasoning_budget == 8, "request_id"]) == [0, 1, 2, 3]
    table = pd.read_parquet(run / "design" / "reasoning.parquet")
    assert len(table) == 2 * 3 and set(table["arm"]) == {*points["point_id"], "A/A"} and (table["ttfat_s"] > 0).all()
    assert (points["design"] == "interleaved").all() and (points["rounds"] == 2).all()
    top = points[points["reasoning_budget"] == 8].iloc[0]
    assert top["time_ratio_verdict"] in ("direction", "equivalent", "undecided") and top["time_ratio"] > 0
    assert points.loc[points["reasoning_budget"] == 0, "time_ratio"].iloc[0] == 1.0
    assert (run / "figures" / "reasoning_time_ratio.html").exists()
    # (valid forced: a loaded test machine may mark the points invalid for drift, and the finding uses valid ones)
    f = R.finding(points.assign(valid=True), req)
    assert f.text.startswith("Time to first answer token at budget 8 vs 0: ") and f.rounds == 2
    assert "accuracy at budget 8 vs 0 over the same 4 tasks" in f.text and "McNemar" in f.evidence
    assert (req["thinking_tokens"] + req["answer_tokens"] == req["output_tokens"]).all()
    assert (req.loc[req.reasoning_budget == 0, "thinking_tokens"] == 0).all()
    assert (req["ttfat_s"] >= req["ttft_s"]).all() and req["gold_logprob"].notna().all()
    for name in ("reasoning_latency_vs_budget", "reasoning_quality_vs_budget", "reasoning_thinking_tokens",
                 "reasoning_throughput_vs_budget"):
        assert (run / "figures" / f"{name}.html").exists()
    assert (run / "reasoning" / "examples.md").exists()
    assert points["exact_match_mean"].between(0, 1).all() and (points["gold_logprob_mean"] < 0).all()


def _designed(ttfat=(6.0, 5.5, 6.5, "direction", "higher", 0), aa_verdict="undecided", sizes=(4,), budgets=(0, 64)):
    """Points as a design records them (workbench.run.design): each batch size's smallest budget the control (ratio
    1), its largest budget's decision ``ttfat`` = (est, lo, hi, verdict, direction, rounds_needed), or a dict of
    them by batch size."""
    import pandas as pd

    rows = []
    for bs in sizes:
        for b in budgets:
            got = (ttfat.get(bs) if isinstance(ttfat, dict) else ttfat) if b == max(budgets) else None
            est, lo, hi, verdict, direction, need = got or (1.0 if b == min(budgets) else float("nan"), float("nan"),
                                                             float("nan"), "", "", float("nan"))
            rows.append(dict(point_id=f"b{b}-{bs}", reasoning_budget=b, batch_size=bs, status="ok", valid=True,
                             exact_match_mean=0.5, ttfat_s_p50=0.1 + b * 0.01, thinking_tokens_mean=b,
                             design="interleaved", rounds=4, margin=1.05, design_seconds=40.0, seconds_per_round=10.0,
                             design_stopped="decided", aa_ratio=1.0, aa_low=0.95, aa_high=1.05, aa_verdict=aa_verdict,
                             time_ratio=est, time_ratio_low=lo, time_ratio_high=hi, time_ratio_level=0.95,
                             time_ratio_verdict=verdict, time_ratio_direction=direction,
                             time_ratio_method="pooled block model, 6 dof, Dunnett over 2", rounds_needed=need))
    return pd.DataFrame(rows)


def _answers(solved_lo, solved_hi, n_tasks=40, sizes=(4,), rounds=2):
    """Requests of the same ``n_tasks`` tasks at budgets 0 and 64, ``rounds`` greedy passes each: the tasks
    ``solved_lo`` (indices) solved at 0 and ``solved_hi`` at 64."""
    import pandas as pd

    return pd.DataFrame([dict(point_id=f"b{b}-{bs}", reasoning_budget=b, batch_size=bs, task_id=f"t{i}", seed=r,
                              repeat=r, temperature=0.0, exact_match=float(i in (solved_lo if b == 0 else solved_hi)),
                              thinking_tokens=b, ttfat_s=0.1 + b * 0.01)
                         for bs in sizes for b in (0, 64) for r in range(rounds) for i in range(n_tasks)])


def test_accuracy_is_paired_task_by_task_and_never_sets_the_mark():
    """Issue 49: accuracy at two budgets is the same tasks answered twice. 40 tasks, 20 solved at budget 0 and the
    same 20 plus 7 more at 64: as two independent shares (50% vs 68%, Newcombe) no difference is shown; paired
    (7 discordant tasks, all one way: McNemar exact p = 0.016) it rises. The finding's verdict is the time to first
    answer token's (the primary comparison), whatever accuracy does."""
    req = _answers(range(20), range(27))
    f = R.finding(_designed(), req)
    assert "accuracy at budget 64 vs 0 over the same 40 tasks: 50% -> 68%: rises, +18 points" in f.text
    assert "McNemar exact p = 0.016" in f.evidence and "(20+0" not in f.evidence and "7+0 discordant" in f.evidence
    assert f.verdict == "direction" and f.supported
    assert f.text.startswith("Time to first answer token at budget 64 vs 0: slower, 6.00x, 95% interval 5.50-6.50x")
    open_ = R.finding(_designed((1.2, 0.9, 1.6, "undecided", "", 9)), req)        # accuracy rises, timing open
    assert open_.verdict == "undecided" and not open_.supported and open_.rounds_needed == 9
    assert "about 9 rounds (~50 s more) would decide it" in open_.text and "rises" in open_.text
    none = R.finding(_designed(), _answers([], []))
    assert "no task solved under either budget" in none.text and none.verdict == "direction"
    same = R.finding(_designed(), _answers(range(20), range(20)))                 # nothing flips: zero width
    assert "50% -> 50%: undecided" in same.text


def test_the_least_decided_batch_size_and_a_moved_aa_control_set_the_verdict():
    req = _answers(range(4), range(4), n_tasks=8, sizes=(1, 4))
    two = R.finding(_designed({1: (6.0, 5.5, 6.5, "direction", "higher", 0), 4: (1.1, 0.9, 1.3, "undecided", "", 20)},
                              sizes=(1, 4)), req)
    assert two.verdict == "undecided" and two.rounds_needed == 20 and "(batch 4): undecided" in two.text
    assert "Bonferroni over 2 batch sizes" in two.evidence and "97.5% interval" in two.text
    moved = R.finding(_designed(aa_verdict="direction"), _answers(range(4), range(4), n_tasks=8))
    assert moved.verdict == "undecided" and "The A/A control moved" in moved.text
    alone = R.finding(_designed().drop(columns=["design"]), _answers(range(4), range(4), n_tasks=8))
    assert alone.verdict == "undecided" and "no comparison (one round pairs nothing" in alone.text


def _fake_design(monkeypatch, tmp_path, repeats=1, num_tasks=8, max_rounds=4):
    """sweep_design on a fake model (the default tokenizer): whole rounds 10% slow or fast (machine drift), a time
    to first answer token that grows with the budget; budget 16 solves every task, budget 0 none."""
    import random
    import types

    import pandas as pd
    from transformers import AutoTokenizer

    import workbench.experiments.reasoning_budget as mod
    from workbench.measure.models import default_model_dir
    from workbench.run import design_sweep, point_result

    cfg = R.Config(budgets=[0, 8, 16], batch_sizes=[2], num_tasks=num_tasks, repeats=repeats, max_rounds=max_rounds,
                   warmup=0)
    rng, drift, calls = random.Random(4), {}, []

    def fake_batch(loaded, batch, spec, mode, temperature, top_p, seed, score=True):
        key = (seed, batch[0].task_id)
        drift.setdefault(key, rng.choice((0.9, 1.1)))
        calls.append((key, spec.budget, tuple(t.task_id for t in batch), score))
        t = (0.1 + 0.01 * spec.budget) * drift[key] * rng.uniform(0.99, 1.01)
        return [dict(exact_match=1.0 if spec.budget == 16 else 0.0, gold_logprob=-2.0, thinking_tokens=spec.budget,
                     answer_truncated=False, forced_close=spec.budget > 0, thinking_mode="emulated", ttft_s=0.1,
                     ttfat_s=t, e2e_s=t + 0.1, prompt_tokens=40, temperature=0.0, seed=seed,
                     task_id=task.task_id) for task in batch], 0.5

    loaded = types.SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(default_model_dir()))
    monkeypatch.setattr(mod, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(mod, "run_reasoning_batch", fake_batch)
    grid = cfg.grid()
    sd = R.sweep_design(loaded, cfg, grid, {})
    by_id = {point_result.point_id(R.EXPERIMENT, p): p for p in grid}
    got = design_sweep.measure_sweep_design(sd, by_id, "", tmp_path, None)
    pts = pd.DataFrame([{"point_id": pid, "status": "ok", "valid": True, "ttft_s_p50": 0.1, "e2e_s_p50": 0.3,
                         "output_throughput_tps": 10.0, **p, **got[pid].extra} for pid, p in by_id.items()])
    reqs = pd.DataFrame([{**r, **p, "point_id": pid} for pid, p in by_id.items() for r in got[pid].requests])
    return cfg, sd, calls, pts, reqs


def test_the_budgets_are_one_design_a_round_a_chunk_of_tasks(monkeypatch, tmp_path):
    """A round is one chunk of tasks; every budget answers it once and the smallest budget a second time (the A/A
    arm, timed but not scored), the same tasks and seed for every arm of a round; the smallest budget is the marked
    control, the time to first answer token the primary outcome; the requests are those a point-by-point run
    records; budget 16's later answer start (2.6x) is a direction and sets the verdict."""
    cfg, sd, calls, pts, req = _fake_design(monkeypatch, tmp_path)
    d = sd.design
    assert R.chunk_size(cfg) == 2 and R.n_rounds(cfg) == 4 and d.min_rounds == 4 and d.max_rounds == 4
    assert d.control == "reasoning/reasoning_budget=0,batch_size=2" and d.primary.name == "ttfat_s"
    assert d.decide == ["reasoning/reasoning_budget=16,batch_size=2"]
    keys = list(dict.fromkeys(k for k, *_ in calls))
    assert len(keys) == 4
    for k in keys:
        mine = [(b, tasks, score) for kk, b, tasks, score in calls if kk == k]
        assert sorted(b for b, *_ in mine) == [0, 0, 8, 16] and len({t for _, t, _ in mine}) == 1
        assert sum(1 for *_, score in mine if not score) == 1          # the A/A batch is timed, not scored
    assert len({tuple(b for k, b, *_ in calls if k == kk) for kk in keys}) > 1   # shuffled within rounds
    for pid, g in req.groupby("point_id"):
        assert sorted(g["request_id"]) == list(range(8)) and (g["batch_index"] == g["request_id"] // 2).all()
    top = pts[pts["reasoning_budget"] == 16].iloc[0]
    assert top["time_ratio_verdict"] == "direction" and top["time_ratio_low"] > 1
    assert top["time_ratio"] == pytest.approx(0.26 / 0.1, rel=0.05)
    f = R.finding(pts, req)
    assert f.verdict == "direction" and f.text.startswith("Time to first answer token at budget 16 vs 0: slower")
    assert "0% -> 100%: rises" in f.text
    figs = R.figures(pts, req, tmp_path)
    assert "each round" in figs["reasoning_time_ratio"].to_json()


def test_default_suite_measures_the_budgets_in_interleaved_rounds():
    """The default suite's 05 entry has 2+ rounds (chunks x repeats), so its budgets are measured interleaved with
    the A/A control and the paired time-to-answer ratio has an interval; the batches are those a point-by-point
    run would make (the chunk holds whole batches)."""
    from workbench.run import notebooks

    entry = next(e for e in notebooks.load_suite("default")["notebooks"] if "05_reasoning_budget" in e["notebook"])
    merged = notebooks.validate_parameters(entry["notebook"], entry["parameters"])
    cfg = notebooks.notebook_config_class(entry["notebook"]).from_namespace(merged)
    assert R.n_rounds(cfg) >= 2 and all(R.chunk_size(cfg) % b == 0 for b in cfg.batch_sizes)
