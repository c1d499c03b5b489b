"""Tests for workbench.experiments.context_compression: answer scoring, summaries by hand, config, the interleaved
design with its A/A control (issue 32) on a fake model, notebook 06."""

import math
from pathlib import Path

import pandas as pd
import pytest

from workbench.techniques import compression
from workbench.measure import quality
from workbench.errors import ParameterError
from workbench.stats import evidence
from workbench.experiments import context_compression as X

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_context_compression.ipynb"
QUICK = {
    "strategies": ["none", "bm25"], "ratios": [4], "context_lengths": [160], "depths": [0.5],
    "summary_lengths": [], "chat_lengths": [160], "chat_strategies": ["none", "kv_reuse"],
    "max_new_tokens": 4, "warmup": 0, "repeats": 2,  # 2 rounds: the points interleaved with the A/A control
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
    # 2 rounds of 2 points, none again as the A/A control (not a point, its requests not stored)
    assert len(points) == 2 and len(req) == 4 and sorted(req["repeat"]) == [0, 0, 1, 1]
    assert (points["design"] == "interleaved").all() and (points["rounds"] == 2).all()
    assert points["aa_ratio"].notna().all() and "compression_time_ratio" in figs
    assert "(round, task) units" in points.set_index("strategy").loc["bm25", "time_ratio_method"]
    assert (req["rouge_l"] <= 1).all() and (req[req["strategy"] == "none"]["rouge_l"] == 1).all()


def test_finding_uses_valid_points_and_states_evidence_against_none():
    rows = []
    for strategy, total, match, valid in (("none", 2.0, 1.0, True), ("tail", 1.0, 1.0, True),
                                          ("bm25", 0.1, 1.0, False)):
        for d, noise in zip((0.1, 0.5, 0.9), (0.0, 0.02, -0.02)):
            rows.append(dict(point_id=f"{strategy}-{d}", strategy=strategy, ratio=1 if strategy == "none" else 4,
                             context_tokens=512, depth=d, substring_match_mean=match, gold_logprob_mean=-1.0,
                             total_s_p50=total + noise, valid=valid))
    pts = _points(rows)
    f = X.finding(pts)
    assert "512 tokens: tail at ratio 4 (match 3 of 3 tasks, no different beyond noise from none's 3 of 3" in f.text
    assert "total time vs none: 0.50x, 95% interval" in f.text and f.supported
    assert not any(p.startswith("bm25") for p in f.point_ids)  # the invalid (fastest) strategy is never chosen
    assert "3 and 3 tasks" in f.evidence
    # one repeat (no design columns): nothing paired, no A/A control, and the finding says so
    assert "Measured point by point (one repeat): no paired ratios, no A/A control." in f.text
    assert f.text.split(". ")[0].startswith("Best strategy per context length - 512 tokens: tail at ratio 4")


# ----------------------------------------------------------------------------- the interleaved design (fakes)


SALT = 1  # the A/A noise of every scenario below covers 1 (salt 0: one of the 5% that does not)


def _interleaved(monkeypatch, aa_shift=1.0, repeats=4, totals=None, logprobs=None, depths=(0.1, 0.5, 0.9),
                 lengths=(512,)):
    """measure_interleaved on a fake model: whole rounds 10% slow or fast (machine drift), a total time per
    strategy (``totals``, times 1.0-1.3 by depth: the tasks differ), a gold log-likelihood per strategy
    (``logprobs``), every answer matching, and the second none request of a task in a round (the A/A arm)
    ``aa_shift`` times slower."""
    import random
    import types

    from workbench.run import point_result
    from workbench.stats import comparison

    totals = totals or {"none": 2.0, "bm25": 1.0, "head_tail": 2.0}
    logprobs = logprobs or {}
    cfg = X.Config(strategies=list(totals), ratios=[4], context_lengths=list(lengths), depths=list(depths),
                   summary_lengths=[], chat_lengths=[], repeats=repeats, warmup=0)
    calls, order = [], []
    schedule = comparison.schedule

    def recorded_schedule(*a, **k):  # the arms in measuring order, so the fake knows which request is the A/A arm's
        order.extend(schedule(*a, **k))
        return list(order)

    def fake_evaluate(loaded, task, strategy, ratio, settings, reference=None, score=True, **options):
        r = settings.seed - cfg.seed
        again = isinstance(order[len(calls)][1], tuple)
        calls.append((r, strategy, task.depth, again))
        # +-1% noise per request, seeded by what it measures (a seed whose A/A intervals cover 1, as 95% do)
        noise = random.Random(f"{SALT}:{r}:{strategy}:{task.key}:{again}").uniform(0.99, 1.01)
        total = totals[strategy] * (1 + task.depth / 3) * (0.9, 1.1)[r % 2] * noise * (aa_shift if again else 1)
        rec = {c: 1.0 for c in X.QUALITY_COLUMNS + X.TIME_COLUMNS}
        rec.update(total_s=total, gold_logprob=logprobs.get(strategy, -1.0), text=f"The passkey is {strategy}.",
                   ttft_s=0.1, e2e_s=total, depth=task.depth, rouge_l=float("nan"))
        return rec

    monkeypatch.setattr(X, "evaluate", fake_evaluate)
    monkeypatch.setattr(X, "_task", lambda loaded, cfg, kind, p: types.SimpleNamespace(
        key=(kind, p["context_tokens"], p["depth"]), depth=p["depth"]))
    monkeypatch.setattr(comparison, "schedule", recorded_schedule)
    grid = cfg.grid()
    got = X.measure_interleaved(None, cfg, grid, {})
    pts, reqs = [], []
    for p in grid:
        pid = point_result.point_id(X.EXPERIMENT, p)
        pts.append({"point_id": pid, "status": "ok", "valid": True, **p, **got[pid].extra})
        reqs += [{**r, "point_id": pid} for r in got[pid].requests]
    return cfg, calls, got, pd.DataFrame(pts), pd.DataFrame(reqs)


def _first_sentence(text):
    return text.split(". ")[0]


def test_measure_interleaved_rounds_with_the_aa_control_and_the_finding_prints_the_noise_floor(monkeypatch):
    """Issue 32: every round measures every point once and none a second time on every task (the A/A arm, one
    request per task per round, not a point), in a shuffled order; every point carries the time_ratio and A/A
    columns (pairs within (round, task) units, Holm over the length's arms); the finding backs the faster pick
    with its paired ratio and the noise floor beside it; the ratio figure has the band and the line at 1."""
    from workbench.stats import comparison

    cfg, calls, got, pts, req = _interleaved(monkeypatch)
    grid = cfg.grid()
    assert len(got) == len(grid) == 9  # the A/A arm is not a point
    rounds = [c[0] for c in calls]
    assert rounds == sorted(rounds) and set(rounds) == set(range(cfg.repeats))  # round after round
    for r in range(cfg.repeats):
        mine = sorted(c[1:] for c in calls if c[0] == r)
        assert mine == sorted([(p["strategy"], p["depth"], False) for p in grid]
                              + [("none", d, True) for d in cfg.depths])  # every arm once, none again per task
    assert len({tuple(c[1:] for c in calls if c[0] == r) for r in range(cfg.repeats)}) > 1  # shuffled per round
    assert len(req) == len(grid) * cfg.repeats and set(req["repeat"]) == set(range(cfg.repeats))  # A/A not stored
    assert set(comparison.COLUMNS) <= set(pts) and pts["aa_low"].notna().all() and (pts["aa_low"] < 1).all()
    assert (pts["design"] == "interleaved").all() and (pts["rounds"] == cfg.repeats).all()
    assert pts["round_drift"].notna().all()  # none's change between neighbouring rounds on one task
    by = pts.set_index(["strategy", "depth"])
    assert (by.loc["none", "time_ratio"] == 1).all()
    assert by.loc["bm25", "time_ratio"].between(0.49, 0.51).all()
    assert (by.loc["bm25", "time_ratio_high"] < 1).all()
    assert "(round, task) units" in by.loc[("bm25", 0.5), "time_ratio_method"]
    assert f"{cfg.repeats * len(cfg.depths)} (round, task) units" in by.loc[("bm25", 0.5), "time_ratio_method"]
    assert "Holm over 2 comparisons" in by.loc[("head_tail", 0.1), "time_ratio_method"]
    f = X.finding(pts)
    assert _first_sentence(f.text) == ("Best strategy per context length - 512 tokens: bm25 at ratio 4 (match 3 of 3 "
                                       "tasks, no different beyond noise from none's 3 of 3, total "
                                       f"{pts.set_index('strategy').loc['bm25', 'total_s_p50'].mean():.2f} s vs "
                                       f"{pts.set_index('strategy').loc['none', 'total_s_p50'].mean():.2f} s)")
    assert "bm25 at ratio 4 at 512 tokens, total time vs none: 0.50x, " in f.text and "A/A noise floor" in f.text
    assert comparison.AA_MOVED not in f.text and "no paired ratios" not in f.text
    assert f.supported and evidence.headline_supported(f.text)
    fig = X.figures(pts)["compression_time_ratio"]
    assert len([t for t in fig.data if (t.name or "").startswith("A/A noise floor")]) == 1
    assert any(s.y0 == 1 and s.line.dash == "dot" for s in fig.layout.shapes)


def test_finding_says_the_aa_control_moved_and_is_not_supported(monkeypatch):
    """A/A requests 25% slower than none in every round: its interval excludes 1, the points say so, the first
    sentence and the time clause say "not supported: the A/A control moved", and the finding is not supported."""
    from workbench.stats import comparison

    _, _, _, pts, _ = _interleaved(monkeypatch, aa_shift=1.25)
    assert comparison.aa_moved_columns(pts.iloc[0]) and (pts["aa_low"] > 1).all()
    f = X.finding(pts)
    assert not f.supported and not evidence.headline_supported(f.text)  # the mark agrees with the first sentence
    assert _first_sentence(f.text).endswith(f"): {comparison.AA_MOVED}")
    assert f"bm25 at ratio 4 at 512 tokens, total time vs none: {comparison.AA_MOVED}" in f.text
    assert "(moved: excludes 1)" in f.text


@pytest.mark.parametrize("totals,logprobs,supported", [
    ({"none": 2.0, "bm25": 1.0}, {}, True),  # bm25 as good and faster beyond noise: backed
    ({"none": 2.0, "bm25": 2.0}, {}, False),  # as good, as fast: the pick (by time) is not backed
    ({"none": 2.0, "bm25": 1.0}, {"none": -0.5}, False),  # none picked by likelihood, bm25 faster: not backed
    ({"none": 1.0, "bm25": 2.0}, {"none": -0.5}, True),  # none picked and bm25 slower beyond noise: backed
])
def test_the_mark_agrees_with_the_first_sentence(monkeypatch, totals, logprobs, supported):
    """A finding is supported only when its headline pick is, and its first sentence says "not supported" exactly
    when it is not."""
    _, _, _, pts, _ = _interleaved(monkeypatch, totals=totals, logprobs=logprobs)
    f = X.finding(pts)
    first = _first_sentence(f.text)
    assert f.supported is supported
    assert ("not supported" in first) is (not supported) and "no difference beyond noise" not in first
    if "none" in logprobs:
        assert first.startswith("Best strategy per context length - 512 tokens: none (match 3 of 3 tasks")
        assert "A/A noise floor" in f.text  # no time clause of the pick: the noise floor on its own


def test_each_context_length_is_compared_on_its_own(monkeypatch):
    """Two context lengths are compared apart (Holm within each); every point of a length carries its A/A columns."""
    _, _, _, pts, _ = _interleaved(monkeypatch, lengths=(256, 512), depths=(0.1, 0.9))
    assert pts.groupby("context_tokens")["aa_ratio"].nunique().eq(1).all()
    assert pts.groupby("context_tokens")["aa_ratio"].first().nunique() == 2
    f = X.finding(pts)
    assert "256 tokens: bm25 at ratio 4" in f.text and "512 tokens: bm25 at ratio 4" in f.text and f.supported


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
