"""The drift reference (:mod:`workbench.run.drift`): reuse between sweeps, its verdict (fakes, no model)."""
import gc
import time
from types import SimpleNamespace

import pytest

from workbench.measure import models
from workbench.run import drift, results


def test_back_to_back_sweeps_share_the_reference_between_them(monkeypatch):
    """The end reference of one sweep is the start reference of the next when it was measured moments ago;
    a stale one is measured again, and the warm-up runs once per model."""
    calls = {"generate": 0, "warm": 0}

    def fake_generate(loaded, prompts, settings):
        calls["generate"] += 1
        return SimpleNamespace(records=[{"tpot_s": (0.3, 0.1, 0.2)[calls["generate"] % 3]}])

    monkeypatch.setattr(drift, "generate_measured", fake_generate)
    monkeypatch.setattr(drift, "warm_up", lambda *a, **k: calls.__setitem__("warm", calls["warm"] + 1))
    monkeypatch.setattr("workbench.inputs.prompts.build_batch", lambda tok, b, n: ["x"])
    before = len(drift._LAST_REFERENCE)
    fake = models.LoadedModel(model=None, tokenizer=None, info=None)
    assert drift.reference_tpot_s(fake, drift.REFERENCE_REUSE_S) == 0.1   # first: warm-up, fastest of 3 runs
    assert calls == {"generate": 3, "warm": 1}
    drift.reference_tpot_s(fake, drift.REFERENCE_REUSE_S)                   # moments later: reused
    assert calls == {"generate": 3, "warm": 1}
    drift.reference_tpot_s(fake)                                             # an end reference: always measured
    assert calls == {"generate": 6, "warm": 1}
    # long ago: measured again. Older than the window *now* - not monotonic time 0, which is less than the window
    # (conftest's one_drift_reference: an hour) after a boot: the test failed on a machine up for under an hour
    drift._LAST_REFERENCE[fake] = (time.monotonic() - drift.REFERENCE_REUSE_S - 1, 0.1)
    drift.reference_tpot_s(fake, drift.REFERENCE_REUSE_S)
    assert calls == {"generate": 9, "warm": 1}
    other = models.LoadedModel(model=None, tokenizer=None, info=None)      # another model: its own warm-up
    drift.reference_tpot_s(other, drift.REFERENCE_REUSE_S)
    assert calls == {"generate": 12, "warm": 2}
    del fake, other
    gc.collect()
    assert len(drift._LAST_REFERENCE) == before                             # freed models leave no reference


def test_check_records_the_pair_and_marks_only_ok_points_beyond_the_limit(monkeypatch):
    marked = []
    monkeypatch.setattr(results, "mark_invalid", lambda run, ids, reason: marked.append((ids, reason)))
    run = results.create_run()
    results.update_manifest(run, experiments={"x": {"points": []}})
    ok = ("x/a=1", {"status": "ok"})
    failed = ("x/a=2", {"status": "failed: boom"})
    drift.check(run, "x", 0.10, 0.10 * (1 + drift.DRIFT_LIMIT / 2), [ok, failed])
    assert marked == []
    entry = results.read_manifest(run)["experiments"]["x"]
    assert entry["reference_tpot_s"] == [0.10, pytest.approx(0.10 * (1 + drift.DRIFT_LIMIT / 2))]
    drift.check(run, "x", 0.10, 0.10 * (1 + 2 * drift.DRIFT_LIMIT), [ok, failed], worker="worker-1")
    assert [ids for ids, _ in marked] == [["x/a=1"]] and "on worker-1" in marked[0][1]
    assert "worker-1" in results.read_manifest(run)["experiments"]["x"]["worker_drift"]


def test_a_drift_across_an_interleaved_designs_rounds_leaves_its_arms_valid(monkeypatch):
    """Issue 49: a sweep-wide drift marked every arm of a design invalid although its rounds are blocks. Now an arm
    stays valid when its control moved at most the limit between neighbouring rounds - the steadier of its requests'
    TPOT and its primary outcome - and its A/A control did not move; a step beyond the limit, one round (no
    step), an A/A control that moved, or a point measured on its own is still marked, and the manifest says how many
    were kept and why."""
    marked = []
    monkeypatch.setattr(results, "mark_invalid", lambda run, ids, reason: marked.append((ids, reason)))
    run = results.create_run()
    results.update_manifest(run, experiments={"x": {"points": []}})
    calm = {"status": "ok", "design": "interleaved", "round_drift": 0.06, "aa_verdict": "equivalent"}
    rows = [("x/kept", calm), ("x/kept2", {**calm, "round_drift": drift.DRIFT_LIMIT, "aa_verdict": "undecided"}),
            ("x/step", {**calm, "round_drift": drift.DRIFT_LIMIT * 1.5}),
            ("x/one_round", {**calm, "round_drift": float("nan")}),
            ("x/aa_moved", {**calm, "aa_verdict": "direction"}),
            # a queue's TTFT moved 149% between rounds while the control's TPOT, the machine's speed, moved 12%
            ("x/queue", {**calm, "round_drift": 1.49, "round_speed_drift": 0.12}),
            # a TPOT over a few decode gaps moved 33% while the primary time, moved alike by the speed, moved 4%
            ("x/few_tokens", {**calm, "round_drift": 0.04, "round_speed_drift": 0.33}),
            ("x/slowed", {**calm, "round_drift": drift.DRIFT_LIMIT * 1.2, "round_speed_drift": drift.DRIFT_LIMIT * 1.5}),
            ("x/alone", {"status": "ok"}), ("x/no_design", {**calm, "design": ""}),
            ("x/failed", {**calm, "status": "failed: boom"})]
    drift.check(run, "x", 0.10, 0.10 * (1 + 2 * drift.DRIFT_LIMIT), rows)
    assert [sorted(ids) for ids, _ in marked] == [["x/aa_moved", "x/alone", "x/no_design", "x/one_round", "x/slowed", "x/step"]]
    note = results.read_manifest(run)["experiments"]["x"]["drift_note"]
    assert note.startswith("reference TPOT drifted 50% during the sweep") and "4 point(s) of an interleaved design" in note
    assert f"at most {drift.DRIFT_LIMIT:.1%} between neighbouring rounds" in note
    marked.clear()                                      # within the limit: nothing marked, no note
    drift.check(run, "x", 0.10, 0.10 * (1 + drift.DRIFT_LIMIT / 2), rows)
    assert marked == [] and "drift_note" not in results.read_manifest(run)["experiments"]["x"]


def test_a_sweep_ending_within_the_reuse_window_gets_no_end_reference(monkeypatch):
    """Within REFERENCE_REUSE_S a reference stands for the machine's speed (as a start reference is reused):
    a sweep ending inside that window records [start, NaN], no drift and why, marks nothing and measures no
    end reference; one ending after it measures the end reference and is judged."""
    import math
    import time

    marked, measured = [], []
    monkeypatch.setattr(results, "mark_invalid", lambda run, ids, reason: marked.append(ids))
    monkeypatch.setattr(drift, "reference_tpot_s", lambda loaded, max_age_s=0.0: measured.append(1) or 0.2)
    run = results.create_run()
    results.update_manifest(run, experiments={"x": {"points": []}})
    ok = ("x/a=1", {"status": "ok"})
    drift.finish(run, "x", None, drift.Start(0.1, time.monotonic() - 2.0), [ok])
    entry = results.read_manifest(run)["experiments"]["x"]
    assert measured == [] and marked == [] and math.isnan(entry["drift"])
    assert entry["reference_tpot_s"][0] == 0.1 and math.isnan(entry["reference_tpot_s"][1])
    assert entry["drift_note"].startswith("no end reference: the sweep ended 2.0 s after its start reference")
    drift.finish(run, "x", None, drift.Start(0.1, time.monotonic() - drift.REFERENCE_REUSE_S - 1), [ok])
    entry = results.read_manifest(run)["experiments"]["x"]
    assert measured == [1] and marked == [["x/a=1"]] and entry["drift"] == pytest.approx(1.0)
    assert "drift_note" not in entry                                           # the older note does not linger


def test_the_start_reference_carries_when_it_was_measured(monkeypatch):
    """A reused start reference keeps its own time, so a chain of short sweeps does not stretch one
    reference beyond the window."""
    monkeypatch.setattr(drift, "generate_measured",
                        lambda loaded, prompts, settings: SimpleNamespace(records=[{"tpot_s": 0.1}]))
    monkeypatch.setattr(drift, "warm_up", lambda *a, **k: None)
    monkeypatch.setattr("workbench.inputs.prompts.build_batch", lambda tok, b, n: ["x"])
    fake = models.LoadedModel(model=None, tokenizer=None, info=None)
    first = drift.start(fake)
    again = drift.start(fake)
    assert again == first
    drift._LAST_REFERENCE[fake] = (first.measured_at - drift.REFERENCE_REUSE_S - 1, 0.1)
    assert drift.start(fake).measured_at > first.measured_at                   # too old: measured anew


def test_another_process_reuses_a_reference_of_the_same_model_within_the_window(monkeypatch, tmp_path):
    """A reference is written to the workbench cache, and a process with the same weights, device, dtype, attention
    kernel and thread count reuses it while it is at most ``max_age_s`` old (a second model object stands for
    the second process: it has no reference of its own). Another attention kernel or a stale entry is measured;
    an end reference (no ``max_age_s``) is always measured; a stand-in without a ModelInfo shares nothing."""
    import json
    import time

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    calls = {"generate": 0, "warm": 0}

    def fake_generate(loaded, prompts, settings):
        calls["generate"] += 1
        return SimpleNamespace(records=[{"tpot_s": 0.05 + 0.01 * calls["generate"]}])

    monkeypatch.setattr(drift, "generate_measured", fake_generate)
    monkeypatch.setattr(drift, "warm_up", lambda *a, **k: calls.__setitem__("warm", calls["warm"] + 1))
    monkeypatch.setattr("workbench.inputs.prompts.build_batch", lambda tok, b, n: ["x"])
    info = SimpleNamespace(weights_sha256="abc123", device="cpu", dtype="float32")

    def process(attn="sdpa"):
        return models.LoadedModel(model=SimpleNamespace(config=SimpleNamespace(_attn_implementation=attn)),
                                  tokenizer=None, info=info)

    first = process()
    assert drift.reference_tpot_s(first, 15.0) == pytest.approx(0.06)        # measured: fastest of 3, written
    shared = json.loads((tmp_path / drift.SHARED_FILE).read_text())
    assert [e["tpot_s"] for e in shared.values()] == [pytest.approx(0.06)]
    second = process()
    assert drift.reference_tpot_s(second, 15.0) == pytest.approx(0.06) and calls["generate"] == 3   # reused
    assert time.monotonic() - drift.start(second).measured_at < 15.0         # its age is the first one's
    assert drift.reference_tpot_s(process(attn="eager"), 15.0) == pytest.approx(0.09)   # another kernel: measured
    assert calls["generate"] == 6
    assert drift.reference_tpot_s(process()) == pytest.approx(0.12)           # an end reference: measured
    key = next(k for k in json.loads((tmp_path / drift.SHARED_FILE).read_text()) if k.split("|")[5] == "sdpa")
    stale = {key: {"measured_at": time.time() - 20.0, "tpot_s": 0.5}}
    (tmp_path / drift.SHARED_FILE).write_text(json.dumps(stale))
    assert drift.reference_tpot_s(process(), 15.0) == pytest.approx(0.15)     # older than the window: measured
    assert drift.reference_tpot_s(process(), 30.0) == pytest.approx(0.15)     # the new one is shared
    assert calls["warm"] == 4                          # a model warmed once, before its first measured reference
    stand_in = models.LoadedModel(model=None, tokenizer=None, info=None)
    drift.reference_tpot_s(stand_in, 15.0)
    assert calls["generate"] == 15 and len(json.loads((tmp_path / drift.SHARED_FILE).read_text())) == 1
