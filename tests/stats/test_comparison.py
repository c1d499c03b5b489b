"""Comparison designs (workbench/stats/comparison.py): A/A trials under injected drift, best-of-m, the schedule.

A fake measurement source drifts by a per-block speed offset of 4-7% (the size seen between back-to-back drift
references on this machine, issue 32): the old blocked design (each arm's repeats back to back, Welch over the
repeats) claims a direction in identical arms far above its nominal 5%; the interleaved design (paired by
round) stays near it.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from workbench.stats import comparison, evidence
from workbench.errors import ParameterError


class DriftingSource:
    """Latencies of identical arms: 1 s x a speed offset that changes every ``block_len`` measurements (magnitude
    uniform in 4-7%, random sign) x 2% log-normal noise per measurement."""

    def __init__(self, seed: int, block_len: int = 10, noise_sd: float = 0.02):
        self.rng = random.Random(seed)
        self.block_len, self.noise_sd, self.n, self.offset = block_len, noise_sd, 0, 0.0

    def __call__(self, *_):
        if self.n % self.block_len == 0:
            self.offset = self.rng.choice((-1, 1)) * self.rng.uniform(0.04, 0.07)
        self.n += 1
        return math.exp(self.offset + self.rng.gauss(0, self.noise_sd))


def _interleaved(arms, rounds, seed, adjust=True):
    src = DriftingSource(seed)
    order = comparison.schedule(arms, rounds, seed)
    rows = [{"arm": a, "round": u, "value": v} for u, a, v in comparison.run_schedule(order, src)]
    return comparison.compare(pd.DataFrame(rows), arms[0], adjust=adjust)


def test_blocked_design_claims_drift_interleaved_does_not():
    """600 A/A trials (>= 200) of 10 repeats an arm: blocked > 20% directions, interleaved <= 7%."""
    trials, n = 600, 10  # the interleaved rate is nominal 5% (1,500 trials: 5.1%); 600 keep its sd below 1%
    old = new = 0
    for t in range(trials):
        src = DriftingSource(t)
        a = [src() for _ in range(n)]  # arm A's block, then arm B's: the old configuration-outermost loop
        b = [src() for _ in range(n)]
        old += comparison.claims_direction(comparison.blocked_interval(b, a))
        c = _interleaved(["A", "B"], n, t)
        new += comparison.claims_direction(c.arms["B"].interval)
    assert old / trials > 0.20
    assert new / trials <= 0.07


def test_best_of_eight_equal_configurations_rarely_called_faster():
    """8 equal configurations + the A/A control, interleaved, Holm over the 7 comparisons: the fastest one is
    called faster than the baseline in <= 5% of 200 trials (unadjusted, the same picks do so more often)."""
    arms = [f"c{i}" for i in range(8)] + [comparison.AA]
    trials = 200
    held = unadjusted = 0
    for t in range(trials):
        c = _interleaved(arms, 8, 1000 + t)
        best = min(c.arms.values(), key=lambda r: r.interval.estimate)
        held += best.verdict == "lower" and c.supported(best.arm)
        raw = _interleaved(arms, 8, 1000 + t, adjust=False)
        rbest = min(raw.arms.values(), key=lambda r: r.interval.estimate)
        unadjusted += rbest.verdict == "lower"
    assert held / trials <= 0.05
    assert unadjusted > held  # the adjustment is what holds it down


def test_real_effect_is_found_and_aa_columns():
    """A 20% faster arm is called faster through drift; the A/A control gives the point columns."""
    src = DriftingSource(7)
    order = comparison.schedule(["base", "fast", comparison.AA], 8, seed=3)
    rows = [{"arm": a, "round": u, "value": src() * (0.8 if a == "fast" else 1.0)}
            for u, a in order]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.arms["fast"].verdict == "lower" and c.supported("fast")
    cols = c.columns()
    assert set(cols) == set(comparison.COLUMNS) and cols["design"] == "interleaved" and cols["rounds"] == 8
    assert cols["aa_low"] <= cols["aa_ratio"] <= cols["aa_high"]
    assert "A/A noise floor" in c.describe("fast")


def test_aa_moved_makes_findings_unsupported():
    """An A/A control that differs (a 30% slower second baseline) marks every comparison not supported."""
    rows = [{"arm": a, "round": r, "value": {"base": 1.0, "x": 0.5, comparison.AA: 1.3}[a] * (1 + 0.01 * (r % 3))}
            for r in range(5) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.aa_moved and not c.supported("x")
    assert comparison.AA_MOVED in c.describe("x")


def test_schedule_orders():
    s = comparison.schedule(["A", "B", "C"], 4, seed=1)
    assert len(s) == 12 and all(sorted(a for u, a in s if u == r) == ["A", "B", "C"] for r in range(4))
    assert s == comparison.schedule(["A", "B", "C"], 4, seed=1)
    assert [a for _, a in comparison.schedule(["A", "B"], 2, design="blocks", per_block=2)] == list("AABBBBAA")
    assert [a for _, a in comparison.schedule(["A", "B"], 2, design="blocks")] == ["A", "B", "B", "A"]
    with pytest.raises(ParameterError, match="rounds"):
        comparison.schedule(["A", "B"], 1, design="blocks")
    with pytest.raises(ParameterError, match="design"):
        comparison.schedule(["A"], 2, design="random")


def test_holm_matches_definition():
    adj = evidence.holm([0.01, 0.04, 0.03, float("nan")])
    assert adj[0] == pytest.approx(0.03) and adj[2] == pytest.approx(0.06) and adj[1] == pytest.approx(0.06)
    assert math.isnan(adj[3])
    assert evidence.holm_levels([0.01, 0.04, 0.03]) == pytest.approx([1 - 0.05 / 3, 1 - 0.05, 1 - 0.05 / 2])


def test_paired_pvalue_is_scipys_t_test():
    from scipy import stats

    num, den = [1.1, 0.9, 1.3, 1.2], [1.0, 1.0, 1.0, 1.1]
    want = stats.ttest_1samp([math.log(a / b) for a, b in zip(num, den)], 0.0).pvalue
    assert evidence.paired_log_ratio_pvalue(num, den) == pytest.approx(want)


def test_joined_finding_mark_agrees_with_its_headline():
    """Issue 32: a joined finding was supported when any part was ("Scheduling: not supported: ..." joined with
    a supported prefix-sharing part was marked supported); now its mark is its headline's."""
    main = evidence.Finding("Scheduling: not supported: no policy's interactive TTFT interval is below fcfs.",
                            "8 requests", False, ("a",))
    prefix = evidence.Finding("Prefix sharing: 1.4x faster TTFT.", "5 requests", True, ("b",))
    joined = evidence.join([main, prefix])
    assert not joined.supported and joined.point_ids == ("a", "b")
    assert evidence.join([prefix, main]).supported
    # a first sentence that says no difference is never marked supported, whatever the caller passed
    f = evidence.Finding("Accuracy 50% -> 42%: no difference beyond noise. Thinking makes the answer later.",
                         "", True)
    assert not f.supported and not evidence.Finding.from_value({"text": f.text, "supported": True}).supported
    assert evidence.Finding("Budget 0 -> 32: accuracy rises 0.42 -> 0.60. Later answers: not supported.").supported


def test_speed_techniques_measures_arms_interleaved_with_the_aa_control(monkeypatch):
    """Speed techniques' grid measured interleaved on a fake model: every round measures every point once plus
    the A/A baseline; prompt lookup 2x faster on extract (and equal on free) is found through a drift that
    moves whole rounds; the points carry the A/A columns and the table the paired verdicts."""
    import types

    from workbench.experiments import speed_techniques as st

    cfg = st.Config(device="cpu", techniques=["none", "prompt_lookup"], draft_tokens=[2], tasks=["extract", "free"],
                    quantizations=["none"], repeats=6, warmup=0)
    calls = []
    rng = random.Random(3)
    drift = {}

    def fake_generate(model, prompts, settings, generate_kwargs=None):
        r = settings.seed - cfg.seed
        drift.setdefault(r, rng.uniform(0.8, 1.25))  # a round's speed offset, shared by its arms
        fast = bool(generate_kwargs) and model == "extract"
        e2e = drift[r] * (0.5 if fast else 1.0) * rng.uniform(0.99, 1.01)
        calls.append((r, model, bool(generate_kwargs)))
        rec = {"e2e_s": e2e, "output_tokens": 16, "decode_tps": 15 / e2e}
        return types.SimpleNamespace(records=[rec], wall_s=e2e)

    monkeypatch.setattr(st, "arm_setup", lambda loaded, cfg, p, state: (p["task"], None,
                                                                        st.generate_kwargs(p), ["prompt"]))
    monkeypatch.setattr(st, "warm_up", lambda *a, **k: 0.0)
    monkeypatch.setattr(st, "generate_measured", fake_generate)
    monkeypatch.setattr(st, "point_extra", lambda *a, **k: {})
    got = st.measure_interleaved(None, cfg, cfg.grid(), {})
    assert len(calls) == 6 * (len(cfg.grid()) + 1)  # every point and the A/A baseline once a round
    assert [sum(1 for c in calls if c[0] == r) for r in range(6)] == [5] * 6
    rows = []
    for pid, res in got.items():
        p = next(p for p in cfg.grid() if st.point_result.point_id(st.EXPERIMENT, p) == pid)
        rows.append({**p, "point_id": pid, "status": "ok", "valid": True, **res.extra})
        assert {r["repeat"] for r in res.requests} == set(range(6))
        for col in comparison.COLUMNS:
            assert col in res.extra
    points = pd.DataFrame(rows)
    assert points["aa_low"].notna().all() and (points["design"] == "interleaved").all()
    reqs = pd.DataFrame([{**r, "point_id": pid, "request_id": 0, "output_ids": [1, 2]}
                         for pid, res in got.items() for r in res.requests])
    table = st.speed_table(points, reqs).set_index("task")
    assert table.loc["extract", "verdict"] == "higher" and table.loc["extract", "speedup"] == pytest.approx(2, rel=0.05)
    assert table.loc["free", "verdict"] == "no difference beyond noise"
    f = st.finding(table.reset_index(), points)
    assert f.supported and "A/A noise floor" in f.text and f.text.startswith("prompt lookup (k=2): extract/en")


def test_streaming_lengths_interleaved_with_the_aa_control(monkeypatch):
    """Streaming anatomy's output lengths measured by round on a fake model: a drift that moves whole rounds
    cancels in the paired TPOT ratio (equal TPOT: no direction), the A/A columns are on both points and the
    finding prints the noise floor."""
    import types

    from workbench.experiments import streaming_anatomy as sa

    cfg = sa.Config(output_tokens=[8, 32], repeats=6, warmup=0, http=False)
    rng, drift, order = random.Random(5), {}, []

    class Tap:
        def row_summary(self, *a):
            return {"first_display_s": 0.1, "handler_s_per_token": 1e-5}

    def fake_tapped(loaded, prompts, settings, granularities, **kw):
        r = settings.seed - cfg.seed
        drift.setdefault(r, rng.choice((0.9, 1.1)))  # whole rounds 10% slow or fast
        order.append((r, settings.max_new_tokens))
        tpot = 0.05 * drift[r] * rng.uniform(0.995, 1.005)
        n = settings.max_new_tokens
        rec = {"request_id": 0, "tpot_s": tpot, "ttft_s": 0.1, "e2e_s": 0.1 + tpot * (n - 1),
               "itl_s": [tpot] * (n - 1), "output_tokens": n}
        return types.SimpleNamespace(records=[rec], wall_s=rec["e2e_s"], t_submit=0.0), Tap()

    monkeypatch.setattr(sa, "_run_tapped", fake_tapped)
    monkeypatch.setattr(sa, "warm_up", lambda *a, **k: 0.0)
    got = sa.measure_streams_interleaved(None, cfg, cfg.output_tokens)
    assert len(order) == 6 * 3 and {r for r, _ in order} == set(range(6))
    pts, reqs = [], []
    for n, res in got.items():
        assert res.extra["design"] == "interleaved" and res.extra["rounds"] == 6
        pts.append({"point_id": f"s{n}", "experiment": "streaming", "max_new_tokens": n, "status": "ok",
                    "valid": True, "batch_size": 1, "ttft_s_p50": 0.1, "e2e_s_p50": res.requests[0]["e2e_s"],
                    "tpot_s_p50": 0.05, **res.extra})
        reqs += [{**r, "point_id": f"s{n}", "experiment": "streaming"} for r in res.requests]
    f = sa.finding(pd.DataFrame(pts), pd.DataFrame(reqs))
    assert "TPOT at 32 vs 8 tokens" in f.text and "no difference beyond noise" in f.text
    assert "A/A noise floor" in f.text and "paired" in f.evidence


def test_batch_size_throughput_ratio_pairs_rounds_and_prints_the_noise_floor():
    """An interleaved batch-size run: the throughput ratio pairs the two batches of each round, so a drift of
    whole rounds cancels (4x more throughput at batch 4, rounds 20% apart), and the A/A floor is printed; an A/A
    control that moved makes the ratio "not supported"."""
    from workbench.experiments import batch_size

    aa = {"aa_ratio": 1.0, "aa_low": 0.97, "aa_high": 1.03, "design": "interleaved", "rounds": 4}
    pts = pd.DataFrame([{"point_id": f"b{b}", "batch_size": b, "prompt_tokens": 32, "status": "ok", "valid": True,
                         "goodput_rps": float(b), "output_throughput_tps": 10.0 * b, "ttft_s_p50": 0.1,
                         "requests": 4 * b, "wall_s": 4.0, **aa} for b in (1, 4)])
    rows = []
    for r, slow in enumerate((1.0, 1.2, 0.9, 1.1)):
        for b in (1, 4):
            for i in range(b):  # every row of a batch ends together: throughput b * 8 tokens / e2e
                rows.append({"point_id": f"b{b}", "repeat": r, "request_id": i, "output_tokens": 8,
                             "e2e_s": 0.8 * slow * (1.0 + 0.001 * r), "ttft_s": 0.1, "tpot_s": 0.1})
    f = batch_size.headline(pts, pd.DataFrame(rows))
    assert "Output throughput at batch 4 vs batch 1: 4.00x" in f.text and "A/A noise floor 0.97-1.03x" in f.text
    moved = batch_size.headline(pts.assign(aa_low=1.05, aa_high=1.2), pd.DataFrame(rows))
    assert comparison.AA_MOVED in moved.text


def test_drift_between_neighbouring_rounds_is_reported():
    """A baseline that jumps 40% from one round to the next is reported beside the ratios it does not bias."""
    rows = [{"arm": a, "round": r, "value": (1.4 if r == 2 else 1.0) * (0.5 if a == "x" else 1.0)}
            for r in range(4) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base")
    assert c.columns()["round_drift"] == pytest.approx(0.4) and c.drift_moved
    assert "moved 40% between neighbouring rounds" in comparison.drift_text(c.columns()["round_drift"])
    assert comparison.drift_text(0.05) == ""


def test_compare_groups_judges_each_group_against_its_own_baseline_and_the_aa_only_with_the_first():
    """Two families: family b's arm is 2x its own baseline, which is itself 3x family a's baseline. Judged against
    its own baseline the arm's ratio is ~2 (against a's it would be ~6); the A/A columns come from the first group."""
    rng = random.Random(3)
    rows = []
    for rnd in range(8):
        drift = rng.uniform(0.95, 1.05)
        for arm, v in (("a0", 1.0), ("a1", 1.0), (comparison.AA, 1.0), ("b0", 3.0), ("b1", 6.0)):
            rows.append({"arm": arm, "round": rnd, "value": v * drift * rng.uniform(0.99, 1.01)})
    ratios, aa = comparison.compare_groups(pd.DataFrame(rows), {"a0": ["a0", "a1"], "b0": ["b0", "b1"]})
    assert set(ratios) == {"a0", "a1", "b0", "b1"}
    assert ratios["a0"]["time_ratio"] == 1.0 and ratios["b0"]["time_ratio"] == 1.0
    assert ratios["b1"]["time_ratio"] == pytest.approx(2.0, rel=0.03)
    assert ratios["a1"]["time_ratio_low"] < 1 < ratios["a1"]["time_ratio_high"]
    assert aa and math.isfinite(aa["aa_ratio"]) and aa["aa_low"] < 1 < aa["aa_high"]
    _, none = comparison.compare_groups(pd.DataFrame(rows), {"b0": ["b0", "b1"]}, aa=None)
    assert none == {}


def test_compare_within_tasks_pairs_each_task_within_its_round():
    """Three tasks of different lengths (1x, 2x, 4x), each measured by both arms in every round: the pair is the
    (round, task) unit, so the tasks' own spread is no noise; ``rounds`` counts rounds and the drift is the
    baseline's change between neighbouring rounds on one task, not the 4x between tasks."""
    rows = [{"arm": a, "round": r, "task": t, "value": (1, 2, 4)[t] * (1.0, 1.1)[r % 2] * (0.5 if a == "x" else 1.0)
             * (1 + 0.01 * ((r + t) % 3 - 1) * (a == comparison.AA))}
            for r in range(3) for t in range(3) for a in ("base", "x", comparison.AA)]
    c = comparison.compare(pd.DataFrame(rows), "base", task="task")
    assert c.arms["x"].interval.estimate == pytest.approx(0.5) and c.arms["x"].verdict == "lower"
    assert "9 (round, task) units, 8 dof" in c.arms["x"].interval.method
    assert c.rounds == 3 and c.columns()["round_drift"] == pytest.approx(0.1) and not c.aa_moved
    with pytest.raises(ParameterError, match="needs a 'depth' column"):
        comparison.compare(pd.DataFrame(rows), "base", task="depth")


def _ratio_points(**cols):
    n = len(next(iter(cols.values())))
    return pd.DataFrame({"status": ["ok"] * n, "time_ratio": [1.0, 0.6][:n] + [0.8] * (n - 2),
                         "time_ratio_low": [float("nan"), 0.5][:n] + [0.7] * (n - 2),
                         "time_ratio_high": [float("nan"), 0.7][:n] + [0.9] * (n - 2),
                         "aa_ratio": 1.0, "aa_low": 0.97, "aa_high": 1.03, "design": "interleaved", "rounds": 3,
                         **cols})


def test_every_ratio_figure_is_drawn_by_the_one_helper(monkeypatch):
    """The five comparative figures of ratios (long output, streaming reader, temperature, reasoning budget,
    context compression) draw their body with :func:`comparison.ratio_figure`: markers with interval error bars,
    the dotted line at 1 and the A/A band; each keeps its own title and axis titles."""
    from workbench.experiments import long_output, reasoning_budget, streaming_reader, temperature
    from workbench.share import figures_compression

    used = []
    helper = comparison.ratio_figure
    monkeypatch.setattr(comparison, "ratio_figure", lambda *a, **k: used.append(a[1]) or helper(*a, **k))
    figs = {
        "long_output": long_output.fig_time_ratio(_ratio_points(language=["en", "en"],
                                                                strategy=["one_shot", "outline_batch"])),
        "streaming_reader": streaming_reader.proxy_ratio_figure(_ratio_points(part=["proxy", "proxy"],
                                                                              proxy=["direct", "buffering_on"])),
        "temperature": temperature.fig_time_ratio(_ratio_points(family=["factual"] * 2, top_p=[1.0, 1.0],
                                                                temperature=[0.0, 0.7])),
        "reasoning_budget": reasoning_budget.fig_time_ratio(_ratio_points(batch_size=[6, 6], reasoning_budget=[0, 16])),
        "context_compression": figures_compression.time_ratio(_ratio_points(
            strategy=["none", "bm25", "bm25"], ratio=[1, 4, 4], context_tokens=[512, 512, 512], depth=[0.1, 0.1, 0.5])),
    }
    assert used == ["strategy", "proxy", "temperature", "reasoning_budget", "arm"]
    for name, fig in figs.items():
        assert any(s.y0 == 1 and s.y1 == 1 and s.line.dash == "dot" for s in fig.layout.shapes), name
        band = [s for s in fig.layout.shapes if s.y0 == pytest.approx(0.97) and s.y1 == pytest.approx(1.03)]
        assert band and [t.name for t in fig.data if (t.name or "").startswith("A/A noise floor")], name
        markers = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
        assert markers and "(x" in fig.layout.yaxis.title.text and fig.layout.title.text, name
    # the compression figure draws one marker per (strategy, ratio) arm, not one per depth
    assert list(figs["context_compression"].data[0].x) == ["none", "bm25 4x"]


def test_paired_best_picks_by_the_paired_estimate_with_the_baseline_at_one():
    """One rule for every comparative pick: time ratios lowest wins, speed-ups highest; the baseline competes at 1.0
    (every arm slower: the baseline); a NaN estimate (an arm not paired) picks nothing; ties keep the given order."""
    assert comparison.paired_best({"a": 0.8, "b": 0.9}, "base") == "a"
    assert comparison.paired_best({"a": 1.2, "b": 1.1}, "base") == "base"
    assert comparison.paired_best(pd.Series({"x": 1.0, "y": 1.3, "z": 1.17}), lower_is_better=False) == "y"
    assert comparison.paired_best({"a": 0.8, "b": float("nan")}, "base") is None
    assert comparison.paired_best({}, None) is None
    assert comparison.paired_best({"a": 0.9, "b": 0.9}, "base") == "a"
