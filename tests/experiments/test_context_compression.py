"""Tests for workbench.experiments.context_compression: answer scoring, summaries by hand, config, notebook 06."""

import math
from pathlib import Path

import pandas as pd
import pytest

from workbench.techniques import compression
from workbench.measure import quality
from workbench.errors import ParameterError
from workbench.experiments import context_compression as X

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_context_compression.ipynb"
QUICK = {
    "strategies": ["none", "bm25"], "ratios": [4], "context_lengths": [160], "depths": [0.5],
    "summary_lengths": [], "chat_lengths": [160], "chat_strategies": ["none", "kv_reuse"],
    "max_new_tokens": 4, "warmup": 0,
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
