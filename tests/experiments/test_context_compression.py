"""Tests for workbench.experiments.context_compression: answer scoring, summaries by hand, config, the design
(issue 49: (pass, task) rounds, the A/A control, the pick, quality paired over the tasks) on a fake model, notebook
06."""

import math
from pathlib import Path

import pandas as pd
import pytest

from workbench.errors import ParameterError
from workbench.experiments import context_compression as X
from workbench.measure import quality
from workbench.techniques import compression

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_context_compression.ipynb"
QUICK = {
    "strategies": ["none", "bm25"], "ratios": [4], "context_lengths": [160], "depths": [0.5],
    "summary_lengths": [], "chat_lengths": [160], "chat_strategies": ["none", "kv_reuse"],
    "max_new_tokens": 4, "warmup": 0, "repeats": 2, "max_rounds": 2,  # one design of 2 rounds with the A/A arm
}


# ----------------------------------------------------------------------------- metrics by hand


def test_answer_scores():
    # scored by workbench.measure.quality (SQuAD-normalised exact match, whole-word substring match)
    assert X.answer_scores("The passkey is 48213.", "48213") == {"substring_match": 1.0, "exact_match": 0.0}
    assert X.answer_scores(" 48213. ", "48213") == {"substring_match": 1.0, "exact_match": 1.0}
    assert X.answer_scores("It is 148213", "48213")["substring_match"] == 0.0
    assert X.answer_scores("密码是48213。", "48213")["substring_match"] == 1.0  # CJK text may touch the digits
    assert X.answer_scores("答案：48213", "48213")["substring_match"] == 1.0


def test_rouge_l_by_hand():
    # LCS("the cat sat", "the cat sat on the mat") = 3: P = 3/3, R = 3/6, F = 2PR/(P+R) = 2/3
    # (the experiment's rouge_l column is workbench.measure.quality.rouge_l against the uncompressed answer)
    assert quality.rouge_l("the cat sat", "the cat sat on the mat") == pytest.approx(2 / 3)
    # CJK characters are tokens: LCS(天气很好, 天气不好) = 3 of 4 -> F = 0.75
    assert quality.rouge_l("天气很好", "天气不好") == pytest.approx(0.75)
    assert quality.rouge_l("", "") == 1.0 and quality.rouge_l("abc", "") == 0.0


def _points(rows):
    df = pd.DataFrame(rows)
    df["status"] = "ok"
    return df


def test_break_even_by_hand():
    # TTFT = 0.1 + 0.002 s per prefilled token; decode is fixed-length so total = compressor + TTFT + 1 s
    def row(strategy, ratio, L, d, compressor, achieved, match=1.0):
        prefilled = L / achieved + 30
        ttft = 0.1 + 0.002 * prefilled
        return dict(strategy=strategy, ratio=ratio, context_tokens=L, depth=d, achieved_ratio_p50=achieved,
                    prefilled_tokens_p50=prefilled, ttft_s_p50=ttft, compressor_s_p50=compressor,
                    total_s_p50=compressor + ttft + 1.0, substring_match_mean=match, gold_logprob_mean=-1.0,
                    rouge_l_mean=1.0)

    rows = []
    for L in (256, 512, 1024):
        for d in (0.1, 0.9):
            rows.append(row("none", 1, L, d, 0.0, 1.0))
            # saves 0.002 * L * (1 - 1/4) s of prefill, costs 0.3 s: L* = 0.3 / 0.0015 = 200 tokens
            rows.append(row("bm25", 4, L, d, 0.3, 4.0, match=0.5))
            rows.append(row("prune", 4, L, d, 0.002 * L, 4.0))  # compressor grows faster than the saving: never
            rows.append(row("tail", 4, L, d, 0.0, 4.0))  # free compressor: saves at every length
    be = X.break_even(_points(rows)).set_index("strategy")
    assert be.loc["bm25", "prefill_s_per_token"] == pytest.approx(0.002)
    assert be.loc["bm25", "break_even_tokens"] == pytest.approx(200.0)
    assert be.loc["bm25", "direct_tokens"] == pytest.approx(200.0)
    assert not be.loc["bm25", "measured"]  # 200 < 256, the shortest measured length
    assert math.isinf(be.loc["prune", "break_even_tokens"])
    assert be.loc["tail", "break_even_tokens"] == 0.0
    best = X.best_strategy(_points(rows)).set_index("context_tokens")
    # none, prune and tail all match fully with equal log-lik: the fastest (tail) wins
    assert list(best["strategy"]) == ["tail", "tail", "tail"]
    q = X.quality_at(_points(rows), 4).set_index("strategy")
    assert q.loc["bm25", "match_retained"] == pytest.approx(0.5) and q.loc["none", "match_retained"] == 1.0


def test_config_validation_and_grid():
    cfg = X.Config(strategies=["none", "bm25", "summary", "kv_reuse"], ratios=[2, 4],
                   context_lengths=[256], depths=[0.2, 0.8], summary_lengths=[256])
    grid = cfg.grid()
    assert grid[0]["strategy"] == "none"
    assert sum(p["strategy"] == "none" for p in grid) == 2 and all(p["ratio"] == 1 for p in grid
                                                                  if p["strategy"] in compression.LOSSLESS)
    assert sum(p["strategy"] == "bm25" for p in grid) == 4
    assert [p for p in grid if p["strategy"] == "summary"] == [
        {"strategy": "summary", "ratio": 4, "context_tokens": 256, "depth": 0.8}]
    for bad, prefix in (({"ratios": [0.5]}, "ratios:"), ({"strategies": ["zip"]}, "strategies:"),
                        ({"context_lengths": [10]}, "context_lengths:"), ({"depths": [2]}, "depths:"),
                        ({"task": "chat"}, "task:"), ({"chunk_tokens": 2}, "chunk_tokens:")):
        with pytest.raises(ParameterError) as err:
            X.Config(**bad)
        assert str(err.value).startswith(prefix) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the notebook


@pytest.mark.notebook
def test_notebook_runs_with_quick_parameters(tmp_path, monkeypatch, run_notebook):
    from workbench.run import notebooks, results

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.create_run("nbtest")
    run_notebook(NOTEBOOK, notebooks.validate_parameters(NOTEBOOK, QUICK), run)
    points = results.read_points(run, X.EXPERIMENT)
    assert set(points["strategy"]) == {"none", "bm25"} and (points["status"] == "ok").all()
    req = results.read_requests(run, X.EXPERIMENT)
    assert {"compression", "compressed_tokens", "compressor_s", "gold_logprob", "rouge_l", "total_s"} <= set(req)
    chat = results.read_points(run, X.CHAT_EXPERIMENT)
    kv = chat[chat["strategy"] == "kv_reuse"].iloc[0]
    assert kv["prefilled_tokens_p50"] < chat[chat["strategy"] == "none"].iloc[0]["prefilled_tokens_p50"]
    assert {"substring_match_mean", "gold_logprob_mean", "rouge_l_mean", "total_s_p50"} <= set(points)
    figs = {p.stem for p in (run / "figures").glob("*.json")}
    assert {"quality_vs_ratio", "time_vs_ratio", "break_even", "depth_length_heatmap", "best_strategy"} <= figs
    # one design: 2 rounds (2 passes over the one task) of 2 arms, none again as the A/A control (not a point, its
    # requests kept apart in the design's table)
    rounds = int(points["rounds"].iloc[0])
    assert len(points) == 2 and len(req) == 2 * rounds and sorted(req["repeat"].unique()) == list(range(rounds))
    assert (points["design"] == "interleaved").all() and rounds >= 2
    assert points["aa_ratio"].notna().all() and "compression_time_ratio" in figs
    table = pd.read_parquet(run / "design" / "compression.parquet")
    assert set(table["arm"]) == {"none@1@160", "bm25@4@160", "A/A"} and len(table) == 3 * rounds
    assert points.set_index("strategy").loc["bm25", "time_ratio_verdict"] in ("direction", "equivalent", "undecided")
    finding = results.read_manifest(run)["findings"][X.EXPERIMENT]
    assert finding["verdict"] in ("direction", "equivalent", "undecided") and finding["rounds"] == rounds
    assert (req["rouge_l"] <= 1).all() and (req[req["strategy"] == "none"]["rouge_l"] == 1).all()


def test_finding_point_by_point_uses_valid_points_and_pairs_quality_over_the_tasks():
    rows = []
    for strategy, total, match, valid in (("none", 2.0, 1.0, True), ("tail", 1.0, 1.0, True),
                                          ("bm25", 0.1, 1.0, False)):
        for d, noise in zip((0.1, 0.5, 0.9), (0.0, 0.02, -0.02)):
            rows.append(dict(point_id=f"{strategy}-{d}", strategy=strategy, ratio=1 if strategy == "none" else 4,
                             context_tokens=512, depth=d, substring_match_mean=match, gold_logprob_mean=-1.0,
                             total_s_p50=total + noise, valid=valid))
    f = X.finding(_points(rows))
    assert f.text.startswith("Context compression - 512 tokens: tail at ratio 4 (1.00 s total vs none's 2.00 s): "
                             "total time vs none: ")
    assert "answer match vs none over 3 paired tasks: undecided" in f.text
    assert not any(p.startswith("bm25") for p in f.point_ids)  # the invalid (fastest) strategy is never chosen
    assert "Measured point by point (one repeat)" in f.text and f.rounds == 0


def test_quality_is_paired_over_the_same_tasks():
    """Issue 49: "match 2 of 2 tasks" decides nothing. The answer match of an arm against none is McNemar's paired
    analysis over the same tasks (a task's match the majority over its passes): 12 tasks where the arm loses 10 of
    none's answers is a direction; identical answers on 2 tasks are undecided."""
    def pts(arm_matches, none_matches):
        rows = [dict(strategy=s, ratio=r, context_tokens=512, depth=i / 20, substring_match_mean=m)
                for s, r, ms in (("bm25", 4, arm_matches), ("none", 1, none_matches)) for i, m in enumerate(ms)]
        return _points(rows)

    worse = X.quality_versus_none(pts([1, 1] + [0] * 10, [1] * 12), "bm25", 4, 512)
    assert worse["verdict"] == "direction" and worse["direction"] == "lower" and worse["lost"] == 10
    two = X.quality_versus_none(pts([1, 1], [1, 1]), "bm25", 4, 512)
    assert two["verdict"] == "undecided" and two["n"] == 2 and two["lost"] == 0
    majority = X.quality_versus_none(pts([0.67, 0.33], [1.0, 1.0]), "bm25", 4, 512)   # 2 of 3 passes, 1 of 3
    assert majority["k"] == 1 and majority["lost"] == 1


# ----------------------------------------------------------------------------- the design (a fake model)


SALT = 1  # the A/A noise of every scenario below covers 1 (salt 0: one of the 5% that does not)


def _designed(monkeypatch, aa_shift=1.0, repeats=3, totals=None, logprobs=None, depths=(0.1, 0.5, 0.9),
              lengths=(512,), misses=()):
    """measure_design on a fake model: whole rounds 10% slow or fast (machine drift), a total time per strategy
    (``totals``, times 1.0-1.3 by depth: the tasks differ), every answer matching but the (strategy, depth) pairs in
    ``misses``, and the A/A arm's requests ``aa_shift`` times slower."""
    import random
    import types

    from workbench.run import design, point_result

    totals = totals or {"none": 2.0, "bm25": 1.0, "head_tail": 2.0}
    logprobs = logprobs or {}
    cfg = X.Config(strategies=list(totals), ratios=[4], context_lengths=list(lengths), depths=list(depths),
                   summary_lengths=[], chat_lengths=[], repeats=repeats, max_rounds=repeats, warmup=0)
    grid = cfg.grid()
    d = X.document_design(cfg, grid)
    calls = []

    def fake_evaluate(loaded, task, strategy, ratio, settings, reference=None, score=True, **options):
        i = len(calls)
        rnd, pos = divmod(i, len(d.measured_arms()))
        again = design._order(d, rnd)[pos] == design.AA
        calls.append((rnd, strategy, task.depth, again))
        noise = random.Random(f"{SALT}:{rnd}:{strategy}:{task.key}:{again}").uniform(0.99, 1.01)
        total = totals[strategy] * (1 + task.depth / 3) * (0.9, 1.1)[rnd % 2] * noise * (aa_shift if again else 1)
        rec = {c: 1.0 for c in X.QUALITY_COLUMNS + X.TIME_COLUMNS}
        rec.update(total_s=total, gold_logprob=logprobs.get(strategy, -1.0), text=f"The passkey is {strategy}.",
                   ttft_s=0.1, e2e_s=total, depth=task.depth, rouge_l=float("nan"),
                   substring_match=0.0 if (strategy, task.depth) in misses else 1.0)
        return rec

    monkeypatch.setattr(X, "evaluate", fake_evaluate)
    monkeypatch.setattr(X, "_task", lambda loaded, cfg, kind, p: types.SimpleNamespace(
        key=(kind, p["context_tokens"], p["depth"]), depth=p["depth"]))
    import tempfile

    run = Path(tempfile.mkdtemp())
    got = X.measure_design(None, cfg, grid, {}, run)
    pts, reqs = [], []
    for p in grid:
        pid = point_result.point_id(X.EXPERIMENT, p)
        pts.append({"point_id": pid, "status": "ok", "valid": True, **p, **got[pid].extra})
        reqs += [{**r, "point_id": pid, "strategy": p["strategy"]} for r in got[pid].requests]
    return cfg, calls, got, pd.DataFrame(pts).assign(run=str(run)), pd.DataFrame(reqs)


def test_each_round_answers_every_arm_on_one_task_and_the_tasks_take_turns(monkeypatch):
    """A round is a (pass, task) unit: every arm once and none again (the A/A arm) on the same depth, the depths in
    turn, the order shuffled per round; the points carry their arm's decision (rounds: passes x tasks)."""
    cfg, calls, got, pts, req = _designed(monkeypatch)
    grid = cfg.grid()
    t = len(cfg.depths)
    assert len(got) == len(grid) == 9  # the A/A arm is not a point
    for r in range(cfg.repeats * t):
        mine = [c for c in calls if c[0] == r]
        assert {c[2] for c in mine} == {cfg.depths[r % t]}                     # one task a round
        assert sorted((c[1], c[3]) for c in mine) == sorted(
            [("none", False), ("bm25", False), ("head_tail", False), ("none", True)])
    assert len({tuple(c[1:] for c in calls if c[0] == r) for r in range(cfg.repeats * t)}) > 1   # shuffled
    assert len(req) == len(grid) * cfg.repeats and set(req["repeat"]) == set(range(cfg.repeats))  # passes
    assert (pts["rounds"] == cfg.repeats * t).all() and (pts["design"] == "interleaved").all()
    by = pts.set_index(["strategy", "depth"])
    assert (by.loc["none", "time_ratio"] == 1).all() and by.loc["bm25", "time_ratio"].between(0.49, 0.51).all()
    assert (by.loc["bm25", "time_ratio_verdict"] == "direction").all() and (by.loc["bm25", "time_ratio_high"] < 1).all()
    assert "pooled block model" in by.loc[("bm25", 0.5), "time_ratio_method"]
    assert (req["rouge_l"] <= 1).all() and (req[req["strategy"] == "none"]["rouge_l"] == 1).all()


def test_the_finding_picks_the_fastest_strategy_that_keeps_the_answers(monkeypatch):
    """The pick against none and its runner-up (the design's decisions), the answer match paired over the tasks
    beside it; a faster strategy that loses an answer none gets right is named, never picked."""
    cfg, _, _, pts, _ = _designed(monkeypatch, totals={"none": 2.0, "bm25": 1.0, "head_tail": 1.5})
    f = X.finding(pts, Path(pts["run"].iloc[0]))
    assert f.verdict == "direction" and f.supported and f.rounds == 9
    assert f.text.startswith("Context compression - 512 tokens: bm25 at ratio 4 (")
    assert "answers match on 3 of 3 tasks, none on 3): total time vs none: faster, 0.50x, 95% interval" in f.text
    assert "; against the runner-up head_tail at ratio 4: faster, 0.67x" in f.text   # chosen after looking: Tukey
    assert "Tukey over 3 arms" in f.text
    assert f.text.index("total time vs none") < f.text.index("against the runner-up")
    without = X.finding(pts)     # from the points alone (no design table): no runner-up comparison to make
    assert without.verdict == "direction" and "runner-up" not in without.text
    assert "answer match vs none over 3 paired tasks: undecided: the same on every task" in f.text
    assert "a round answers every arm on one task" in f.evidence
    fig = X.figures(pts, None, Path(pts["run"].iloc[0]))["compression_time_ratio"]
    assert any(s.y0 == 1 and s.line.dash == "dot" for s in fig.layout.shapes) and "each round" in fig.to_json()


def test_a_strategy_that_loses_an_answer_is_not_picked(monkeypatch):
    _, _, _, pts, _ = _designed(monkeypatch, totals={"none": 2.0, "bm25": 1.0, "head_tail": 1.5},
                                misses={("bm25", 0.5)})
    f = X.finding(pts)
    assert f.text.startswith("Context compression - 512 tokens: head_tail at ratio 4 (")
    assert "bm25 at ratio 4 loses the answer on 1 of 3 tasks none answers" in f.text


@pytest.mark.parametrize("totals,verdict,words", [
    ({"none": 1.0, "bm25": 2.0}, "direction", "slower beyond noise or equivalent"),   # bm25 slower: none kept
    ({"none": 2.0, "bm25": 2.0}, "equivalent", "equivalent within"),   # as fast (1% noise): equivalent, either pick
])
def test_none_is_kept_only_when_every_other_strategy_is_slower_or_equivalent(monkeypatch, totals, verdict, words):
    _, _, _, pts, _ = _designed(monkeypatch, totals=totals, repeats=2)
    f = X.finding(pts)
    assert f.verdict == verdict and words in f.text


def test_the_aa_control_moved_leaves_the_finding_undecided(monkeypatch):
    _, _, _, pts, _ = _designed(monkeypatch, aa_shift=1.25)
    assert (pts["aa_verdict"] == "direction").all()
    f = X.finding(pts)
    assert f.verdict == "undecided" and not f.supported and "The A/A control moved" in f.text


def test_each_context_length_is_compared_with_its_own_none(monkeypatch):
    _, _, _, pts, _ = _designed(monkeypatch, lengths=(256, 512), depths=(0.1, 0.9))
    assert pts.groupby("context_tokens")["time_ratio_method"].first().notna().all()
    f = X.finding(pts)
    assert "256 tokens: bm25 at ratio 4" in f.text and "512 tokens: bm25 at ratio 4" in f.text
    assert f.verdict == "direction"


def test_a_prompt_is_scored_once_per_sweep_and_the_aa_control_not_at_all(monkeypatch):
    """The gold log-likelihood is a function of the prompt and the gold answer: a repeat of a prompt reuses it (an
    untimed pass saved), and the A/A control's requests (``score=False``) are not scored."""
    import types

    calls = []
    result = types.SimpleNamespace(compressor_s=0.1, prefix_cache=None, prefix_ids=None, text="ctx 123",
                                   messages=lambda: [{"role": "user", "content": "ctx 123"}], to_record=dict)
    monkeypatch.setattr(X, "compress", lambda *a, **k: result)
    monkeypatch.setattr(X, "answer", lambda *a, **k: {"text": "123", "e2e_s": 1.0, "ttft_s": 0.2})
    monkeypatch.setattr(X, "gold_logprob", lambda *a, **k: calls.append(1) or {"gold_logprob": -1.5})
    task = types.SimpleNamespace(context="c", question="q", answer="123", kind="needle", language="en", depth=0.5,
                                 needle="123")
    loaded, scores, settings = types.SimpleNamespace(tokenizer=None), {}, X.Config().settings()
    recs = [X.evaluate(loaded, task, "none", 1, settings, scores=scores) for _ in range(3)]
    assert len(calls) == 1 and [r["gold_logprob"] for r in recs] == [-1.5] * 3 and recs[0]["total_s"] == 1.1
    assert "gold_logprob" not in X.evaluate(loaded, task, "none", 1, settings, score=False) and len(calls) == 1
    X.evaluate(loaded, task, "none", 1, settings)  # no cache given: scored
    assert len(calls) == 2
