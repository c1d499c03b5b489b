"""Tests for workbench.experiments.long_output: the config, and notebook 07 end to end."""

from pathlib import Path

import pandas as pd
import pytest

from workbench.stats import evidence

from workbench.errors import ParameterError
from workbench.experiments import long_output

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# 2 sections of 8 tokens (the least LongOutputPlan allows) after a 16-token outline
QUICK_07 = {"budget_tokens": 32, "n_sections": 2, "outline_tokens": 16, "languages": ["en"],
            "strategies": ["one_shot", "outline_batch", "outline_sequential"], "warmup": 0, "repeats": 2}


@pytest.mark.parametrize("kw,match", [
    ({"budget_tokens": 8}, "budget_tokens"),
    ({"strategies": ["magic"]}, "strategies"),
    ({"languages": []}, "languages"),
    ({"budget_tokens": 40, "n_sections": 8}, "budget_tokens"),
    ({"n_sections": 0}, "n_sections"),
])
def test_config_rejects_bad_values_in_one_line(kw, match):
    with pytest.raises(ParameterError, match=match) as e:
        long_output.Config(**kw)
    assert "\n" not in str(e.value)


def test_figure_and_table_take_only_this_experiments_rows():
    rows = [{"experiment": "long_output", "strategy": s, "language": "en", "first_text_s": 0.1, "first_section_s": 0.2,
             "wall_s": 1.0, "coverage": 1.0, "repetition": 0.0, "output_tokens": 40, "chars": 100,
             "sections_found": 2, "output_throughput_tps": 40.0} for s in ("one_shot", "outline_batch")]
    other = {"experiment": "batch_size", "ttft_s": 9.0}
    req = pd.DataFrame(rows + [other])
    assert len(long_output.request_table(req)) == 2
    fig = long_output.figures(req)["long_output"]
    walls = [y for tr in fig.data if tr.name == "wall time" for y in tr.y]
    assert walls == [1.0, 1.0]  # wall time is wall_s, not the last token's e2e_s
    firsts = [y for tr in fig.data if tr.name == "first visible text" for y in tr.y]
    assert firsts == [0.1, 0.1]  # first_text_s, not a per-request ttft_s
    assert "ttft_s" not in long_output.request_table(req) and "first_text_s" in long_output.request_table(req)


@pytest.mark.notebook
def test_long_output_notebook(tmp_path, monkeypatch, run_notebook):
    from workbench.run import notebooks, results

    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path))
    run = results.open_run("", label="nb07")
    nb = NOTEBOOKS / "07_long_output.ipynb"
    run_notebook(nb, notebooks.validate_parameters(nb, QUICK_07), run)
    req = results.read_requests(run, experiment="long_output")
    assert sorted(req["strategy"]) == sorted(QUICK_07["strategies"] * 2)  # one text per strategy and round
    assert (req["output_tokens"] <= QUICK_07["budget_tokens"]).all() and req["coverage"].between(0, 1).all()
    assert (req["first_text_s"] <= req["wall_s"]).all()
    # every row with itl_s is one request's: len(itl_s) == output_tokens - 1 (outline rows merge several: None)
    for _, q in req.iterrows():
        if q["itl_s"] is not None:
            assert len(q["itl_s"]) == q["output_tokens"] - 1
    by = req[req["repeat"] == 0].set_index("strategy")
    assert by.loc["one_shot", "batch_size"] == 1 and by.loc["outline_sequential", "batch_size"] == 1
    assert by.loc["outline_batch", "batch_size"] == by.loc["outline_batch", "sections_planned"]  # decoded together
    assert by.loc["outline_batch", "itl_s"] is None and by.loc["outline_batch", "ttft_s"] != by.loc["outline_batch", "ttft_s"]
    pts = results.read_points(run, experiment="long_output")
    assert (pts["status"] == "ok").all()
    assert {"coverage_p50", "repetition_p50", "first_section_s_p50", "first_text_s_p50"} <= set(pts)
    assert (run / "figures" / "long_output.html").exists()
    texts = sorted(p.name for p in (run / "texts").iterdir())
    assert texts == sorted(f"long_output_{s}_en_r{r}.md" for s in QUICK_07["strategies"] for r in (0, 1))
    # 2 rounds of 3 strategies: interleaved with the A/A control (issue 32), the ratio figure with its band
    assert (pts["design"] == "interleaved").all() and (pts["rounds"] == 2).all() and pts["aa_low"].notna().all()
    assert (run / "figures" / "long_output_time_ratio.html").exists()
    f = long_output.finding(req, pts.assign(valid=True))
    assert "wall time vs one_shot (en)" in f.text and "A/A noise floor" in f.text


def _interleaved(monkeypatch, aa_shift=1.0, repeats=6, walls=None, languages=("en", "zh"), coverage=None):
    """measure_interleaved on a fake technique: whole rounds 10% slow or fast (machine drift), a wall time per
    strategy (``walls``), a section coverage per strategy (``coverage``, default 1.0), and the second one_shot text
    of a round (the A/A arm) ``aa_shift`` times slower."""
    import random
    import types

    from workbench.run import point_result
    from workbench.stats import comparison

    walls = walls or {"one_shot": 10.0, "outline_batch": 6.0, "outline_sequential": 11.0}
    cfg = long_output.Config(languages=list(languages), strategies=list(walls), repeats=repeats, warmup=0)
    rng, drift, calls, order = random.Random(5), {}, [], []
    schedule = comparison.schedule

    def recorded_schedule(*a, **k):  # the arms in measuring order, so the fake knows which text is the A/A arm's
        order.extend(schedule(*a, **k))
        return list(order)

    def fake_long_output(loaded, strategy, topic, plan, language, temperature, seed):
        r = seed - cfg.seed
        drift.setdefault(r, rng.choice((0.9, 1.1)))
        again = order[len(calls)][1] == comparison.AA
        calls.append((r, strategy, language, again))
        w = walls[strategy] * drift[r] * rng.uniform(0.99, 1.01) * (aa_shift if again else 1)
        row = {"language": language, "strategy": strategy, "wall_s": w, "first_text_s": 0.5, "first_section_s": 0.6,
               "coverage": (coverage or {}).get(strategy, 1.0), "repetition": 0.1, "sections_found": 4, "chars": 900, "output_tokens": 200}
        return types.SimpleNamespace(row=row, outline="", text="text")

    monkeypatch.setattr(long_output, "run_long_output", fake_long_output)
    monkeypatch.setattr(long_output, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(comparison, "schedule", recorded_schedule)
    grid = [{"language": lang, "strategy": s} for lang in languages for s in walls]
    got = long_output.measure_interleaved(None, cfg, grid, {})
    pts, reqs = [], []
    for p in grid:
        pid = point_result.point_id(long_output.EXPERIMENT, p)
        pts.append({"point_id": pid, "status": "ok", "valid": True, **p, **got[pid].extra})
        reqs += [{**r, "experiment": long_output.EXPERIMENT, "point_id": pid} for r in got[pid].requests]
    return cfg, calls, pd.DataFrame(pts), pd.DataFrame(reqs)


def test_measure_interleaved_rounds_with_the_aa_control_and_the_finding_prints_the_noise_floor(monkeypatch):
    """Issue 32: every round writes every (language, strategy) text once and the first language's one_shot a
    second time (the A/A arm), in a shuffled order; the points carry the A/A and time-ratio columns; the finding
    keeps its first sentence, prints each strategy's ratio vs one_shot with the noise floor, and the ratio figure
    shades the band."""
    from workbench.stats import comparison

    cfg, calls, pts, req = _interleaved(monkeypatch)
    rounds = [c[0] for c in calls]
    assert rounds == sorted(rounds) and set(rounds) == set(range(cfg.repeats))  # round after round
    for r in range(cfg.repeats):
        mine = [c[1:] for c in calls if c[0] == r]
        assert sorted(mine) == sorted([(s, lang, False) for lang in cfg.languages for s in cfg.strategies]
                                      + [("one_shot", "en", True)])  # every arm once, the A/A arm en one_shot
    orders = {tuple(c[1:] for c in calls if c[0] == r) for r in range(cfg.repeats)}
    assert len(orders) > 1  # the order within a round is shuffled
    assert set(comparison.COLUMNS) <= set(pts.columns) and pts["aa_low"].notna().all()
    assert (pts["design"] == "interleaved").all() and (pts["rounds"] == cfg.repeats).all()
    assert not comparison.aa_moved_columns(pts.iloc[0])
    assert len(req) == len(pts) * cfg.repeats  # the A/A texts are not stored
    by = pts.set_index(["language", "strategy"])
    assert (by.xs("one_shot", level="strategy")["time_ratio"] == 1).all()
    assert (by.xs("outline_batch", level="strategy")["time_ratio_high"] < 1).all()
    assert "Holm over 2 comparisons" in by.loc[("zh", "outline_batch"), "time_ratio_method"]
    f = long_output.finding(req, pts)
    assert f.text.startswith("en: outline_batch has the shortest wall time (")
    assert "zh: outline_batch has the shortest wall time" in f.text
    for lang in cfg.languages:
        assert f"outline_batch wall time vs one_shot ({lang}): " in f.text
        assert f"outline_sequential wall time vs one_shot ({lang}): " in f.text
    assert "A/A noise floor" in f.text and comparison.AA_MOVED not in f.text
    assert f.supported and evidence.headline_supported(f.text)
    fig = long_output.figures(req, pts)["long_output_time_ratio"]
    assert len([t for t in fig.data if (t.name or "").startswith("A/A noise floor")]) == 1
    assert {t.name for t in fig.data} >= set(cfg.languages)


def test_finding_says_the_aa_control_moved_and_is_not_supported(monkeypatch):
    """An A/A arm 25% slower than the baseline in every round: its interval excludes 1, the points say so, the
    first sentence and every ratio say "not supported: the A/A control moved", and the finding is not supported."""
    from workbench.stats import comparison

    _, _, pts, req = _interleaved(monkeypatch, aa_shift=1.25)
    assert comparison.aa_moved_columns(pts.iloc[0]) and (pts["aa_low"] > 1).all()
    f = long_output.finding(req, pts)
    assert not f.supported and not evidence.headline_supported(f.text)  # the mark agrees with the first sentence
    assert f.text.startswith(f"en: outline_batch has the shortest wall time (") and comparison.AA_MOVED in f.text
    assert f"outline_batch wall time vs one_shot (en): {comparison.AA_MOVED}" in f.text
    assert "(moved: excludes 1)" in f.text


def test_finding_without_a_difference_is_not_supported_and_says_so_first(monkeypatch):
    """Strategies as fast as one_shot: whichever is picked as fastest, its ratio is no difference beyond noise,
    said in the first sentence, and the finding is not supported."""
    _, _, pts, req = _interleaved(monkeypatch, walls={"one_shot": 10.0, "outline_batch": 10.0},
                                  languages=("en",))
    f = long_output.finding(req, pts)
    assert not f.supported and not evidence.headline_supported(f.text)
    assert "outline_batch wall time vs one_shot (en): no difference beyond noise" in f.text
    assert "not supported" in f.text.split(". ")[0]  # the first sentence carries the verdict its mark shows


def _long_rows(walls):
    return pd.DataFrame([{"experiment": "long_output", "point_id": f"{s}-{lang}", "language": lang, "strategy": s,
                          "repeat": r, "wall_s": w, "first_text_s": 0.5, "coverage": 1.0}
                         for (s, lang), ws in walls.items() for r, w in enumerate(ws)])


def test_point_by_point_finding_makes_no_comparative_claim_and_uses_valid_points_only():
    """Without interleaved rounds (one repeat, or points without the ratio columns) the first sentence names the
    fastest strategy per language, says why it is not supported, and the finding is not supported."""
    rows = _long_rows({("one_shot", "en"): [10.0, 10.2], ("one_shot", "zh"): [12.0, 12.1],
                       ("outline_batch", "en"): [6.0, 6.1], ("outline_batch", "zh"): [7.0, 7.3]})
    f = long_output.finding(rows)
    assert f.text.startswith("en: outline_batch has the shortest wall time (6.0 s, first text after 0.50 s")
    assert not f.supported and "not supported: no interleaved rounds" in f.text and "no A/A control" in f.evidence
    pts = pd.DataFrame({"point_id": ["outline_batch-en", "outline_batch-zh", "one_shot-en", "one_shot-zh"],
                        "status": "ok", "valid": [False, False, True, True]})
    assert "outline_batch" not in long_output.finding(rows, pts).text


def test_the_pick_follows_the_paired_ratios_where_the_medians_over_drifting_rounds_disagree(monkeypatch):
    """Interleaved rounds are the evidence: when the median wall time over rounds names another strategy than the
    within-round ratios (a drift the pairs cancel), the first sentence names the paired fastest and says so."""
    _, _, pts, req = _interleaved(monkeypatch)
    by = pts.set_index(["language", "strategy"])
    assert by.loc[("en", "outline_batch"), "time_ratio"] < by.loc[("en", "outline_sequential"), "time_ratio"]
    drifted = req.assign(wall_s=req["wall_s"].where(~((req["language"] == "en")
                                                      & (req["strategy"] == "outline_sequential")), 0.1))
    f = long_output.finding(drifted, pts)
    assert f.text.startswith("en: outline_batch is the fastest paired within rounds (median wall time")
    assert long_output.finding(req, pts).text.startswith("en: outline_batch has the shortest wall time (")


def test_a_faster_strategy_that_drops_sections_is_not_the_pick(monkeypatch):
    """The quality guard: a strategy faster because it delivers fewer of the sections asked for (coverage below
    one_shot's) is named with its coverage and left out of the pick, which goes to the fastest strategy that covers
    as much; when that is one_shot, the strategy left out does not count against it."""
    walls = {"one_shot": 10.0, "outline_batch": 6.0, "outline_sequential": 4.0}
    _, _, pts, req = _interleaved(monkeypatch, walls=walls, languages=("en",))
    assert long_output.finding(req, pts).text.startswith("en: outline_sequential has the shortest wall time (")
    _, _, pts, req = _interleaved(monkeypatch, walls=walls, languages=("en",),
                                  coverage={"outline_sequential": 0.0, "one_shot": 2 / 3, "outline_batch": 2 / 3})
    f = long_output.finding(req, pts)
    assert f.text.startswith("en: outline_batch has the shortest wall time of those covering at least one_shot's "
                             "sections (")
    assert "outline_sequential (en) left out of the pick by the quality guard: coverage 0% against one_shot's 67%" \
        in f.text
    assert f.supported and evidence.headline_supported(f.text)
    _, _, pts, req = _interleaved(monkeypatch, walls={**walls, "outline_batch": 12.0}, languages=("en",),
                                  coverage={"outline_sequential": 1 / 3})
    f = long_output.finding(req, pts)
    assert f.text.startswith("en: one_shot has the shortest wall time of those covering at least one_shot's "
                             "sections (")
    assert f.supported, f.text  # outline_batch slower beyond noise; outline_sequential is outside the guard
