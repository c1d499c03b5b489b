"""Temperature / top-p sweep: config validation, the grid, greedy determinism, scoring, the notebook."""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench import ParameterError
from workbench.experiments import temperature

NB = Path(__file__).resolve().parents[2] / "notebooks" / "03_temperature.ipynb"


@pytest.mark.parametrize("kwargs,name", [
    ({"temperatures": []}, "temperatures"),
    ({"temperatures": [-0.1]}, "temperatures"),
    ({"temperatures": [float("inf")]}, "temperatures"),
    ({"top_ps": []}, "top_ps"),
    ({"top_ps": [0.0]}, "top_ps"),
    ({"top_ps": [1.5]}, "top_ps"),
    ({"families": ["poems"]}, "families"),
    ({"languages": []}, "languages"),
    ({"n_factual_prompts": 0}, "n_factual_prompts"),
    ({"max_new_tokens": 9000}, "max_new_tokens"),
    ({"repeats": 0}, "repeats"),
])
def test_invalid_temperature_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        temperature.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_grid_holds_greedy_once():
    cfg = temperature.Config(temperatures=[0, 0.7], top_ps=[0.9, 1.0], families=["factual"])
    assert cfg.grid() == [
        {"family": "factual", "temperature": 0.0, "top_p": 1.0},
        {"family": "factual", "temperature": 0.7, "top_p": 0.9},
        {"family": "factual", "temperature": 0.7, "top_p": 1.0},
    ]
    s = cfg.settings({"family": "factual", "temperature": 0.0, "top_p": 1.0})
    assert not s.do_sample and s.max_new_tokens == cfg.factual_max_new_tokens


@pytest.mark.model
def test_greedy_rows_identical_across_repeats_and_seeds(loaded):
    cfg = temperature.Config(families=["factual"], languages=["en"], n_factual_prompts=1,
                                        factual_max_new_tokens=6, repeats=2, warmup=0, perplexity=False)
    point = {"family": "factual", "temperature": 0.0, "top_p": 1.0}
    a = temperature.measure_point(loaded, cfg, point, {}).requests
    cfg.seed, cfg.repeats = 7, 1
    b = temperature.measure_point(loaded, cfg, point, {}).requests
    ids = [tuple(r["output_ids"]) for r in a + b]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert [r["seed"] for r in a + b] == [0, 1, 7]  # repeat r uses seed + r, recorded


@pytest.mark.model
def test_score_records_adds_quality_and_perplexity(loaded):
    from workbench.inputs.prompts import factual_prompts

    cfg = temperature.Config(families=["factual"], languages=["en"], n_factual_prompts=2,
                                        factual_max_new_tokens=4, repeats=1, warmup=0)
    out = temperature.measure_point(loaded, cfg, {"family": "factual", "temperature": 1.2, "top_p": 0.9}, {})
    recs = out.requests
    assert [r["topic"] for r in recs] == [p["topic"] for p in factual_prompts(2, ["en"])]
    for r in recs:
        assert r["family"] == "factual" and r["sample"] == 0 and r["substring_match"] in (0.0, 1.0)
        assert r["perplexity"] >= 1.0 and math.isnan(r["section_coverage"])
    assert 0 <= out.extra["truncated_rate"] <= 1
    # the point records the shape its forward passes ran at, so the roofline can predict it
    assert out.extra["batch_size"] == 2 and out.extra["prompt_tokens"] == max(r["prompt_tokens"] for r in recs)


def test_summary_and_headline():
    rows = [{"family": "report", "language": "en", "temperature": t, "top_p": p, "truncated": tr,
             "repeated_4gram_rate": rep, "distinct_2": 0.9, "compression_ratio": 1.5}
            for t, p, tr, rep in [(0.0, 1.0, 1, 0.4), (0.0, 1.0, 1, 0.4), (0.7, 0.9, 1, 0.1), (0.7, 1.0, 0, 0.0),
                                  (0.7, 1.0, 1, 0.2)]]
    s = temperature.quality_summary(pd.DataFrame(rows))
    got = s[(s["temperature"] == 0.7) & (s["top_p"] == 1.0) & (s["metric"] == "truncated")].iloc[0]
    assert got["mean"] == 0.5 and got["n"] == 2
    h = temperature.headline(s)
    assert list(h.index.get_level_values("top_p")) == [1.0, 1.0]  # top_p pooled by the largest
    assert h.loc[("report", "en", 0.0, 1.0), "repeated_4gram_rate"].startswith("0.400")


@pytest.mark.notebook
def test_notebook_runs_and_writes_quality_and_figures(tmp_path, run_notebook):
    from workbench.run import notebooks, results

    params = {"temperatures": [0.0, 1.0], "top_ps": [1.0], "n_report_prompts": 1, "n_factual_prompts": 1,
              "languages": ["en", "zh"], "max_new_tokens": 6, "factual_max_new_tokens": 3, "repeats": 2,
              "warmup": 0}
    notebooks.validate_parameters(NB, params)
    run = results.open_run()
    run_notebook(NB, params, run)
    points = results.read_points(run, "temperature")
    assert len(points) == 4 and set(points["status"]) == {"ok"}
    req = results.read_requests(run, "temperature")
    assert len(req) == 4 * 2 * 2 and req["perplexity"].notna().all() and set(req["language"]) == {"en", "zh"}
    greedy = req[(req["temperature"] == 0) & (req["family"] == "report")]
    assert greedy.groupby("topic")["text"].nunique().eq(1).all()
    figs = json.loads((run / "manifest.json").read_text())["figures"]
    assert {"temperature_report_repetition", "temperature_factual_accuracy", "temperature_speed"} <= set(figs)
    # 2 repeats of 4 points: interleaved rounds with the A/A control (issue 32), the time ratio and its figure
    assert (points["design"] == "interleaved").all() and (points["rounds"] == 2).all()
    assert points["aa_low"].notna().all() and points["time_ratio"].notna().all()
    assert "temperature_time_ratio" in figs
    # (valid forced: a loaded test machine may mark the points invalid for drift, and the finding uses valid ones)
    f = temperature.finding(temperature.quality_summary(req), req, points.assign(valid=True))
    assert "A/A noise floor" in f.text and "Time per answer (e2e) at temperature 1 vs 0" in f.text
    assert (run / "quality_summary.csv").exists()


def _answers(rng, temperature, n, truncated_share, repetition, repeats=1, point_id=None):
    return [{"point_id": point_id or f"t{temperature}", "family": "report", "language": "en", "repeat": r,
             "temperature": temperature, "top_p": 1.0, "truncated": bool(rng.random() < truncated_share),
             "repeated_4gram_rate": max(0.0, rng.normal(repetition, 0.01)), "output_tokens": 100}
            for r in range(repeats) for _ in range(n)]


def test_finding_says_not_supported_when_most_greedy_answers_are_truncated():
    rng = np.random.default_rng(0)
    req = pd.DataFrame(_answers(rng, 0.0, 8, 1.0, 0.0) + _answers(rng, 1.2, 8, 1.0, 0.3))
    f = temperature.finding(temperature.quality_summary(req), req)
    assert not f.supported and "not supported: 100% of the answers at temperature 0" in f.text
    assert "from temperature" not in f.text.lower()  # no direction stated


def test_finding_states_a_direction_only_beyond_noise_and_counts_greedy_repeats_once():
    rng = np.random.default_rng(1)
    req = pd.DataFrame(_answers(rng, 0.0, 10, 0.0, 0.01, repeats=3) + _answers(rng, 1.2, 30, 0.0, 0.2))
    f = temperature.finding(temperature.quality_summary(req), req)
    assert f.supported and "the repeated 4-gram rate rises" in f.text
    assert "10 answers at temperature 0, 30 at 1.2" in f.evidence  # 3 greedy repeats of 10 prompts are 10 answers
    assert "share of answers cut by max_new_tokens: no difference beyond noise" in f.text
    assert "answer length (tokens): no difference beyond noise" in f.text  # both 100: no spread, no difference
    # an invalid point's answers are left out
    pts = pd.DataFrame({"point_id": ["t0.0", "t1.2"], "status": ["ok", "ok"], "valid": [True, False]})
    g = temperature.finding(temperature.quality_summary(req), req, pts)
    assert not g.supported and g.point_ids == ("t0.0",)


def _interleaved_temperature(monkeypatch, aa_shift=1.0, repeats=6):
    """measure_interleaved on a fake model: whole rounds 10% slow or fast (machine drift), a time per answer that
    grows with the temperature, and the second greedy batch of a round (the A/A arm) ``aa_shift`` times slower."""
    import random
    import types

    from workbench.run import point_result

    cfg = temperature.Config(temperatures=[0.0, 0.7, 1.2], top_ps=[1.0], families=["factual"], languages=["en"],
                             n_factual_prompts=3, repeats=repeats, warmup=0, perplexity=False)
    from workbench.stats import comparison

    rng, drift, calls, order = random.Random(3), {}, [], []
    schedule = comparison.schedule

    def recorded_schedule(*a, **k):  # the arms in measuring order, so the fake knows which batch is the A/A arm's
        order.extend(schedule(*a, **k))
        return list(order)

    def fake_generate(loaded, prompts, settings):
        r = settings.seed - cfg.seed
        drift.setdefault(r, rng.choice((0.9, 1.1)))
        again = order[len(calls)][1] == comparison.AA
        calls.append((r, settings.temperature, tuple(prompts)))
        e2e = 0.5 * (1 + 0.5 * settings.temperature) * drift[r] * rng.uniform(0.99, 1.01) * (aa_shift if again else 1)
        recs = [{"request_id": i, "text": "Paris is the capital of France.", "finish_reason": "stop",
                 "output_tokens": 7, "prompt_tokens": 20, "e2e_s": e2e, "ttft_s": 0.05, "tpot_s": 0.07,
                 "output_ids": [1] * 7, "seed": settings.seed, "temperature": settings.temperature,
                 "top_p": settings.top_p} for i in range(len(prompts))]
        return types.SimpleNamespace(records=recs, wall_s=e2e)

    monkeypatch.setattr(temperature, "generate_measured", fake_generate)
    monkeypatch.setattr(temperature, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(comparison, "schedule", recorded_schedule)
    loaded = types.SimpleNamespace(info=types.SimpleNamespace(device="cpu"))
    got = temperature.measure_interleaved(loaded, cfg, cfg.grid())
    pts, reqs = [], []
    for p in cfg.grid():
        pid = point_result.point_id(temperature.EXPERIMENT, p)
        res = got[pid]
        pts.append({"point_id": pid, "status": "ok", "valid": True, **p, **res.extra})
        reqs += [{**r, **p, "point_id": pid} for r in res.requests]
    return cfg, calls, pd.DataFrame(pts), pd.DataFrame(reqs)


def test_measure_interleaved_rounds_with_the_aa_control_and_the_finding_prints_the_noise_floor(monkeypatch):
    """Issue 32: every round measures every temperature once and greedy a second time (the A/A arm), the same
    prompts and seed for every arm of a round; the points carry the A/A and time-ratio columns; the finding prints
    the e2e ratio with the noise floor beside it, and the ratio figure shades the band."""
    from workbench.stats import comparison, evidence

    cfg, calls, pts, req = _interleaved_temperature(monkeypatch)
    rounds = [r for r, _, _ in calls]
    assert rounds == sorted(rounds) and set(rounds) == set(range(cfg.repeats))  # round after round
    for r in range(cfg.repeats):
        mine = [(t, p) for rr, t, p in calls if rr == r]
        assert sorted(t for t, _ in mine) == [0.0, 0.0, 0.7, 1.2]  # every arm once, greedy twice
        assert len({p for _, p in mine}) == 1  # the same prompts for every arm of a round
    orders = {tuple(t for rr, t, _ in calls if rr == r) for r in range(cfg.repeats)}
    assert len(orders) > 1  # the order within a round is shuffled
    assert set(comparison.COLUMNS) <= set(pts.columns)
    assert (pts["design"] == "interleaved").all() and (pts["rounds"] == cfg.repeats).all()
    assert pts["aa_low"].notna().all() and not comparison.aa_moved_columns(pts.iloc[0])
    assert len(req) == 3 * 3 * cfg.repeats and set(req["repeat"]) == set(range(cfg.repeats))
    assert {"time_ratio", "time_ratio_low", "time_ratio_high", "time_ratio_p_holm"} <= set(pts.columns)
    hot = pts[pts["temperature"] == 1.2].iloc[0]
    assert hot["time_ratio_low"] > 1 and "Holm over 2 comparisons" in hot["time_ratio_method"]
    f = temperature.finding(temperature.quality_summary(req), req, pts)
    assert "Time per answer (e2e) at temperature 1.2 vs 0: " in f.text and "A/A noise floor" in f.text
    assert comparison.AA_MOVED not in f.text
    assert f.supported == evidence.headline_supported(f.text) or not f.supported
    figs = temperature.figures(temperature.quality_summary(req), pts)
    band = [t for t in figs["temperature_time_ratio"].data if (t.name or "").startswith("A/A noise floor")]
    assert len(band) == 1


def test_finding_says_the_aa_control_moved(monkeypatch):
    """An A/A arm 25% slower than the baseline in every round: its interval excludes 1, the points say so and the
    finding's timing says "not supported: the A/A control moved"; the text outcomes keep their own verdicts."""
    from workbench.stats import comparison, evidence

    _, _, pts, req = _interleaved_temperature(monkeypatch, aa_shift=1.25)
    assert comparison.aa_moved_columns(pts.iloc[0]) and (pts["aa_low"] > 1).all()
    f = temperature.finding(temperature.quality_summary(req), req, pts)
    assert f"Time per answer (e2e) at temperature 1.2 vs 0: {comparison.AA_MOVED}" in f.text
    assert "A/A noise floor" in f.text and "(moved: excludes 1)" in f.text
    assert f.text.startswith("From temperature 0 to 1.2, ")
    assert not f.supported or evidence.headline_supported(f.text)
