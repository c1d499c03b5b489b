"""The point loop: grids, failure handling and resume (fake measurements, no model)."""
import time

import pytest

from tests.conftest import fake_references, resident_bytes
from workbench import ParameterError
from workbench.measure import contention, device
from workbench.run import drift, point_result, results, sweeps
from workbench.run.point_result import PointResult


def test_expand_grid_order():
    assert sweeps.expand_grid(a=[1, 2], b=["x"]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    with pytest.raises(ParameterError):
        sweeps.expand_grid(a=[])


def _fake_measure(point):
    n = point["batch_size"]
    reqs = [{"repeat": 0, "request_id": i, "prompt_tokens": 10, "output_tokens": 3, "ttft_s": 0.5, "prefill_s": 0.4,
             "tpot_s": 0.1, "e2e_s": 0.7, "decode_tps": 10.0, "itl_s": [0.1, 0.1]} for i in range(n)]
    return PointResult(requests=reqs, wall_s=1.0)


def test_failed_point_is_recorded_and_resume_completes(monkeypatch):
    run = results.create_run()
    points = sweeps.expand_grid(batch_size=[1, 2, 3])
    monkeypatch.setenv("WORKBENCH_INJECT_FAILURE", "batch_size=2")
    pts = sweeps.run_sweep(run, "fake", points, _fake_measure)
    assert pts.set_index("batch_size")["status"].to_dict()[2].startswith("failed: RuntimeError: injected")
    assert sorted(results.read_requests(run)["batch_size"].unique()) == [1, 3]
    monkeypatch.delenv("WORKBENCH_INJECT_FAILURE")
    calls = []
    pts = sweeps.run_sweep(run, "fake", points, lambda p: calls.append(p) or _fake_measure(p), resume=True)
    assert calls == [{"batch_size": 2}]                 # finished points are skipped
    assert (pts["status"] == "ok").all() and len(pts) == 3
    req = results.read_requests(run)
    assert req.groupby("batch_size").size().to_dict() == {1: 1, 2: 2, 3: 3}   # no duplicates


def test_measure_exception_does_not_stop_the_sweep():
    run = results.create_run()

    def measure(p):
        if p["batch_size"] == 1:
            raise MemoryError("out of memory at batch 1")
        return _fake_measure(p)

    pts = sweeps.run_sweep(run, "fake", sweeps.expand_grid(batch_size=[1, 2]), measure)
    assert pts["status"].tolist() == ["failed: MemoryError: out of memory at batch 1", "ok"]


def _sleep_measure(seconds):
    import time

    def measure(p):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:   # this process's own work is not "other load"
            pass
        return _fake_measure(p)
    return measure


@pytest.mark.quiet
def test_a_busy_process_during_a_point_marks_it_invalid_and_a_quiet_point_stays_valid():
    import subprocess
    import sys
    import time


    probe = contention.LoadMonitor()
    time.sleep(0.5)
    if probe.stop()["others_cpu_load"] > contention.OTHERS_LOAD_LIMIT / 2:
        pytest.skip("other processes are loading this machine now: a quiet point cannot be shown quiet")
    run = results.create_run()
    quiet = sweeps.run_sweep(run, "quiet", sweeps.expand_grid(batch_size=[1]), _sleep_measure(1.0))
    # the quiet point is never blamed on other processes; the hypervisor's steal is the host's (a sleeping point has
    # little busy time, so a burst of steal on the host can pass the limit: seen once in a full run, 11%)
    quiet_ok, reason = bool(quiet["valid"].iloc[0]), quiet["invalid_reason"].iloc[0]
    assert quiet_ok or (reason.startswith("hypervisor stole") and "other processes" not in reason), reason
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = sweeps.run_sweep(run, "busy", sweeps.expand_grid(batch_size=[1]), _sleep_measure(1.5))
    finally:
        hog.kill()
    assert bool(busy["valid"].iloc[0]) is False
    assert "other processes used" in busy["invalid_reason"].iloc[0]
    assert busy["others_cpu_load"].iloc[0] > 0.5
    assert set(results.invalid_points(run)) - ({quiet["point_id"].iloc[0]} if not quiet_ok else set()) == \
        {busy["point_id"].iloc[0]}


def test_reference_drift_marks_the_sweep_invalid_and_rerun_invalid_remeasures_them(monkeypatch):
    from types import SimpleNamespace

    run = results.create_run()
    fake_references(monkeypatch, [0.10, 0.20])
    monkeypatch.setattr(contention, "verdict", lambda row: {"valid": True, "invalid_reason": ""})
    fake = SimpleNamespace(info=None)
    pts = sweeps.run_sweep(run, "drift", sweeps.expand_grid(batch_size=[1, 2]), _fake_measure, loaded=fake)
    assert (pts["valid"] == False).all() and pts["invalid_reason"].str.contains("drifted 100%").all()  # noqa: E712
    assert results.read_manifest(run)["experiments"]["drift"]["drift"] == pytest.approx(1.0)
    assert results.finished_points(run) == set(pts["point_id"])   # plain resume keeps them
    monkeypatch.setenv("WORKBENCH_RERUN_INVALID", "1")
    assert results.finished_points(run) == set()                  # --rerun-invalid measures them again
    calls = []
    fake_references(monkeypatch, [0.1, 0.1])
    pts = sweeps.run_sweep(run, "drift", sweeps.expand_grid(batch_size=[1, 2]),
                           lambda p: calls.append(p) or _fake_measure(p), resume=True, loaded=fake)
    assert len(calls) == 2 and (pts["valid"] == True).all()  # noqa: E712
    entry = results.read_manifest(run)["experiments"]["drift"]
    assert entry["drift"] == pytest.approx(0.0)                  # this session's references
    assert [h["drift"] for h in entry["drift_history"]] == [pytest.approx(1.0)]   # the first session's kept
    assert entry["drift_history"][0]["reference_tpot_s"] == [0.10, 0.20]


def test_a_drift_across_a_designs_rounds_keeps_its_arms_and_the_report_says_so(monkeypatch):
    """Issue 49: the sweep's reference pair drifting 50% marked every arm of a design invalid, its findings then
    undecided for lack of valid points. The arms of a design whose control moved a few percent between neighbouring
    rounds stay valid (the rounds are blocks), the report's validity line says which experiment kept how many and
    why; a step beyond the limit still marks them (and a sweep of plain points, above)."""
    import html
    from types import SimpleNamespace

    from workbench.share import report

    monkeypatch.setattr(contention, "verdict", lambda row: {"valid": True, "invalid_reason": ""})
    fake = SimpleNamespace(info=None)

    def designed(step):
        def m(point):
            r = _fake_measure(point)
            r.extra = {"design": "interleaved", "rounds": 3, "round_drift": step, "aa_verdict": "equivalent"}
            return r
        return m

    run = results.create_run()
    results.begin_session(run)
    fake_references(monkeypatch, [0.10, 0.15, 0.10, 0.15])
    calm = sweeps.run_sweep(run, "calm", sweeps.expand_grid(batch_size=[1, 2]), designed(0.04), loaded=fake)
    steep = sweeps.run_sweep(run, "steep", sweeps.expand_grid(batch_size=[1, 2]), designed(0.40), loaded=fake)
    assert (calm["valid"] == True).all() and (steep["valid"] == False).all()  # noqa: E712
    assert steep["invalid_reason"].str.contains("drifted 50%").all()
    entry = results.read_manifest(run)["experiments"]["calm"]
    assert entry["drift"] == pytest.approx(0.5) and entry["drift_kept"] == 2
    warn = html.unescape(report._validity_html(run, results.read_points(run)))
    assert "2 valid and 2 invalid of 4 measured points" in warn
    assert "calm: reference TPOT drifted 50% during the sweep (100.0 -> 150.0 ms): 2 point(s) of an interleaved" in warn
    assert "steep:" not in warn.split("Invalid points")[0]
    # other load over a calm design: kept the same way, and the validity line names it
    monkeypatch.setattr(contention, "verdict", lambda row: {"valid": False, "invalid_reason": "other processes used 0.40 CPU cores during the point (limit 0.25)"})
    fake_references(monkeypatch, [0.10, 0.10])
    loaded_calm = sweeps.run_sweep(run, "busy", sweeps.expand_grid(batch_size=[1, 2]), designed(0.04), loaded=fake)
    assert (loaded_calm["valid"] == True).all() and loaded_calm["contention_note"].str.contains("kept valid").all()  # noqa: E712
    warn = html.unescape(report._validity_html(run, results.read_points(run)))
    assert "busy: 2 point(s) measured while other processes used 0.40 CPU cores" in warn


@pytest.mark.parametrize("reset_ignored", [False, True], ids=["this-kernel", "reset-ignored"])
def test_peak_memory_is_per_point_not_a_running_maximum(monkeypatch, tmp_path, reset_ignored):
    """A point after a memory-hungry one reports its own peak (Linux VmHWM reset per point, or the sampled
    resident size where the kernel ignores the reset, as some sandboxed kernels do)."""
    if reset_ignored:
        monkeypatch.setattr(sweeps.results.device, "CLEAR_REFS", str(tmp_path / "clear_refs"))
        with resident_bytes(100_000_000):
            pass  # the lifetime high-water mark now sits well above today's size, as in a long test session
    from types import SimpleNamespace

    def measure(p):
        if p["batch_size"] == 1:
            with resident_bytes(400_000_000):   # 400 MB touched
                time.sleep(0.05)                  # longer than the sampler's period
        return _fake_measure(p)

    info = SimpleNamespace(device="cpu", device_name="cpu", name="fake", dtype="float32", to_dict=lambda: {})
    monkeypatch.setattr(sweeps.results, "environment", lambda *a, **k: {})
    run = results.create_run()
    pts = sweeps.run_sweep(run, "mem", sweeps.expand_grid(batch_size=[1, 2]), measure, info=info)
    peaks = pts.set_index("batch_size")["peak_memory_bytes"]
    assert pts["peak_memory_method"].isin(["rss_sampled"] if reset_ignored else ["vmhwm", "rss_sampled"]).all()
    assert peaks[1] - peaks[2] > 300e6


def test_the_notebooks_of_one_session_share_one_device_probe(monkeypatch):
    from types import SimpleNamespace

    probes = []
    monkeypatch.setattr(device, "probe_device", lambda dev, dtype: probes.append(dev) or {
        "bandwidth_bytes_per_s": 1e10, "flops_per_s": 1e11, "bandwidth_spread": 0.0, "flops_spread": 0.0,
        "probe_trials": 7, "probe_noisy": False})
    info = SimpleNamespace(name="m", path="/m", weights_sha256="x", num_params=1, weight_bytes=4, dtype="float32",
                           device="cpu", device_name="cpu")
    run = results.create_run()
    results.begin_session(run)
    first = results.environment(info, probe=run)
    results.update_manifest(run, environment=first)
    second = results.environment(info, probe=run)
    assert len(probes) == 1 and second["bandwidth_bytes_per_s"] == 1e10
    other = SimpleNamespace(**{**vars(info), "dtype": "bfloat16"})
    results.environment(other, probe=run)                                   # another dtype: probed
    assert len(probes) == 2


def test_sweep_rows_record_the_model_folder(monkeypatch):
    """``model_path`` beside the display name: what the roofline predictions of figures look a model up by."""
    from types import SimpleNamespace

    info = SimpleNamespace(device="cpu", device_name="cpu", name="m", path="/models/m", dtype="float32",
                           to_dict=lambda: {})
    monkeypatch.setattr(sweeps.results, "environment", lambda *a, **k: {})
    run = results.create_run()
    sweeps.run_sweep(run, "x", sweeps.expand_grid(batch_size=[1]), _fake_measure, info=info)
    req = results.read_requests(run, "x")
    assert (req["model_path"] == "/models/m").all() and (req["model"] == "m").all()
    assert (results.read_points(run, "x")["model_path"] == "/models/m").all()


def test_a_moved_aa_control_is_remeasured_by_rerun_invalid_and_a_steady_one_is_not(monkeypatch):
    """A comparison whose A/A interval excludes 1 keeps its points valid (its finding says "the A/A control moved"),
    and --rerun-invalid counts exactly its points as unfinished, names them, and measures them again."""
    from types import SimpleNamespace

    from workbench.run import suite

    monkeypatch.setattr(contention, "verdict", lambda row: {"valid": True, "invalid_reason": ""})
    fake_references(monkeypatch, [0.1] * 6)
    fake = SimpleNamespace(info=None)
    aa_cols = {"design": "interleaved", "rounds": 4, "round_drift": 0.01}

    def measure(aa_low, aa_high):
        def m(point):
            r = _fake_measure(point)
            r.extra = {**aa_cols, "aa_ratio": (aa_low + aa_high) / 2, "aa_low": aa_low, "aa_high": aa_high}
            return r
        return m

    run = results.create_run()
    results.begin_session(run)
    sweeps.run_sweep(run, "moved", sweeps.expand_grid(batch_size=[1, 2]), measure(1.06, 1.12), loaded=fake)
    steady = sweeps.run_sweep(run, "steady", sweeps.expand_grid(batch_size=[1, 2]), measure(0.97, 1.03), loaded=fake)
    moved_ids = set(results.read_points(run, "moved")["point_id"])
    assert set(results.aa_moved_points(run)) == moved_ids
    assert results.invalid_points(run) == {}                       # the numbers stand; the comparison does not
    from workbench.share import report
    warn = report._validity_html(run, results.read_points(run))
    assert "1 comparison(s) whose A/A control moved (moved: the A/A control moved (1.06-1.12x))" in warn
    assert "--rerun-invalid" in warn
    assert results.finished_points(run) == moved_ids | set(steady["point_id"])
    monkeypatch.setenv("WORKBENCH_RERUN_INVALID", "1")
    assert results.finished_points(run) == set(steady["point_id"])
    monkeypatch.delenv("WORKBENCH_RERUN_INVALID")
    entries = suite.rerun_invalid_entries(str(run))              # sets WORKBENCH_RERUN_INVALID for the kernels
    assert isinstance(entries, list)
    calls = []
    sweeps.run_sweep(run, "moved", sweeps.expand_grid(batch_size=[1, 2]),
                           lambda p: calls.append(p) or measure(0.98, 1.02)(p), resume=True, loaded=fake)
    assert len(calls) == 2 and results.aa_moved_points(run) == {}
    with pytest.raises(ParameterError, match="A/A control moved"):
        suite.rerun_invalid_entries(str(run))


def _block_sweep(run, calls, fail_at=None, resume=False):
    """A fake interleaved experiment: the first point measures a block of every point of the grid (each point's
    share a PointResult whose ``warmup_s`` numbers the block), as the experiments' ``measure_interleaved`` do."""
    grid = sweeps.expand_grid(batch_size=[1, 2, 3])
    state: dict = {}

    def block():
        calls.append(len(calls))
        if fail_at is not None:
            raise RuntimeError(f"arm {fail_at} ran out of memory")
        return {point_result.point_id("fake", p): PointResult(requests=_fake_measure(p).requests, wall_s=1.0,
                                                        warmup_s=float(len(calls))) for p in grid}

    return sweeps.run_sweep(run, "fake", grid, lambda p: sweeps.block_share(state, point_result.point_id("fake", p), block),
                            resume=resume)


def test_a_failed_interleaved_block_is_measured_once_and_resume_measures_it_again():
    """A failure inside the block used to re-measure the whole block once for every point of it."""
    run, calls = results.create_run(), []
    pts = _block_sweep(run, calls, fail_at=3)
    assert calls == [0]                                        # one block, not one per point
    assert pts["status"].str.contains("arm 3 ran out of memory").all() and len(pts) == 3
    calls.clear()
    pts = _block_sweep(run, calls, resume=True)
    assert calls == [0] and (pts["status"] == "ok").all() and set(pts["warmup_s"]) == {1.0}


def test_a_resumed_block_keeps_the_finished_points_and_records_only_the_unfinished_shares(monkeypatch):
    """An interrupted interleaved sweep (here: its last point failed) keeps what it finished; the resume measures
    the block again and records only the unfinished point's share, from the new block."""
    run, calls = results.create_run(), []
    monkeypatch.setenv("WORKBENCH_INJECT_FAILURE", "batch_size=3")
    _block_sweep(run, calls)
    before = results.read_manifest(run)["points"]
    monkeypatch.delenv("WORKBENCH_INJECT_FAILURE")
    calls.clear()
    pts = _block_sweep(run, calls, resume=True).set_index("batch_size")
    after = results.read_manifest(run)["points"]
    assert calls == [0] and (pts["status"] == "ok").all()
    for pid in (point_result.point_id("fake", {"batch_size": b}) for b in (1, 2)):
        assert after[pid] == before[pid]                       # finished points: their first record, untouched
    assert results.read_requests(run).groupby("batch_size").size().to_dict() == {1: 1, 2: 2, 3: 3}


def test_the_speed_probe_reads_the_reference_beside_each_point(monkeypatch):
    """With ``speed_probe`` each point's row carries the drift reference right before it and right after it, and
    their geometric mean. A reading stands for ``REFERENCE_REUSE_S`` (as the sweep's start and end references): the
    before reading is the previous point's after reading, and a point that ends within the window of its before
    reading takes it as its after reading too (issue 48); without ``speed_probe`` no reference beyond the sweep's
    own."""
    from types import SimpleNamespace

    monkeypatch.setattr(contention, "verdict", lambda row: {"valid": True, "invalid_reason": ""})
    monkeypatch.setattr(drift, "start", lambda loaded: drift.Start(0.1, time.monotonic()))   # no end reference
    now, last, measured = [0.0], {}, []
    values = iter([0.10, 0.40, 0.20, 0.3, 0.9])

    def reference(loaded, max_age_s=0.0):   # the real reuse rule on a fake clock
        if last and max_age_s > 0 and now[0] - last["at"] <= max_age_s:
            return last["value"]
        last.update(at=now[0], value=next(values))
        measured.append(now[0])
        return last["value"]

    def taking(seconds):
        return lambda p: (now.__setitem__(0, now[0] + seconds), _fake_measure(p))[1]

    monkeypatch.setattr(drift, "reference_tpot_s", reference)
    fake, grid = SimpleNamespace(info=None), sweeps.expand_grid(batch_size=[1, 2])
    long_ = drift.REFERENCE_REUSE_S + 1                    # points longer than the window: a reading after each
    pts = sweeps.run_sweep(results.create_run(), "probe", grid, taking(long_), loaded=fake, speed_probe=True)
    assert measured == [0.0, long_, 2 * long_]             # the second point's before reading is the first's after
    assert pts["speed_probe_before_tpot_s"].tolist() == [0.10, 0.40]
    assert pts["speed_probe_after_tpot_s"].tolist() == [0.40, 0.20]
    assert pts["speed_probe_tpot_s"].tolist() == pytest.approx([0.2, (0.4 * 0.2) ** 0.5])
    measured.clear()
    last.clear()
    pts = sweeps.run_sweep(results.create_run(), "probe", grid, taking(1.0), loaded=fake, speed_probe=True)
    assert len(measured) == 1                              # short points: one reading stands for both and both points
    assert pts["speed_probe_before_tpot_s"].tolist() == pts["speed_probe_after_tpot_s"].tolist() == [0.3, 0.3]
    measured.clear()
    pts = sweeps.run_sweep(results.create_run(), "probe", grid, _fake_measure, loaded=fake)
    assert measured == [] and not set(drift.PROBE_COLUMNS) & set(pts.columns)


def test_designs_beside_plain_points_and_a_design_whose_runs_are_points():
    """One grid may hold a design's arms (measured in rounds when the loop reaches the first of them), a design whose
    every (arm, round) measurement is a point of its own (the queue experiments' runs), and plain points measured one
    by one, in the grid's order; the rounds a design did not take are not recorded, and a resume measures neither
    design again (issue 49: streaming reader, scheduling, serving load)."""
    from workbench.run import design, design_sweep

    run, calls = results.create_run(), []

    def rows(n=2):
        return [dict(_fake_measure({"batch_size": 1}).requests[0], request_id=i) for i in range(n)]

    def plain(p):
        calls.append(("plain", p["proxy"]))
        return _fake_measure({"batch_size": 1})

    def by_arm(p, rnd):
        calls.append(("arm", p["proxy"], rnd))
        return design.Measured({"e2e_s": (2.0 if p["proxy"] == "b" else 1.0) * (1 + 0.01 * rnd)}, rows(), 1.0)

    def by_run(arm, rnd):
        calls.append(("run", arm, rnd))
        value = 3.0 * (1.03 if rnd % 2 else 0.98) if arm == "q" else 1.0 * (1.01 if rnd % 2 else 1.0)
        return design.Measured({"e2e_s": value}, rows(3), 2.0, {"offered_rps": rnd})

    arms = design_sweep.SweepDesign(design.Design("fake", ["fake/proxy=a", "fake/proxy=b"], "fake/proxy=a", design.Outcome("e2e_s", False),
                                            min_rounds=2, max_rounds=2), by_arm)
    keys = {"p": "p", "q": "q", "p_aa": design.AA}
    runs = design_sweep.SweepDesign(design.Design("fake_runs", ["p", "q"], "p", design.Outcome("e2e_s", False),
                                            min_rounds=2, max_rounds=4), by_run,
                              unit_of=lambda p: (keys[p["policy"]], p["replicate"]) if "policy" in p else None)
    grid = [{"proxy": "plain"}, {"proxy": "a"}, {"proxy": "b"}] + [{"policy": a, "replicate": k} for k in range(4)
                                                       for a in ("p", "q", "p_aa")]
    pts = sweeps.run_sweep(run, "fake", grid, plain, design=[arms, runs])
    assert calls[0] == ("plain", "plain") and {c[0] for c in calls[1:5]} == {"arm"} and len(calls) == 1 + 6 + 6
    assert (pts["status"] == "ok").all() and len(pts) == 3 + 3 * 2        # rounds 2 and 3 were never taken
    per_run = pts[pts["policy"].notna()].set_index(["policy", "replicate"])
    assert sorted(per_run.index) == [(a, k) for a in ("p", "p_aa", "q") for k in (0, 1)]
    assert per_run.loc[("q", 1), "offered_rps"] == 1 and per_run.loc[("q", 0), "time_ratio_verdict"] == "direction"
    assert per_run.loc[("q", 0), "time_ratio"] == pytest.approx(3.0, rel=0.03) and per_run.loc[("p", 0), "time_ratio"] == 1.0
    assert per_run.loc[("p_aa", 0), "time_ratio"] == pytest.approx(1.0)   # the A/A run: its own ratio to p
    assert (per_run["design_stopped"] == "decided").all() and (per_run["rounds"] == 2).all()
    req = results.read_requests(run, experiment="fake")
    assert req[req["point_id"] == "fake/policy=q,replicate=1"]["repeat"].tolist() == [1, 1, 1]
    assert pts.set_index("proxy").loc["b", "time_ratio"] == pytest.approx(2.0, rel=0.02)
    calls.clear()
    again = sweeps.run_sweep(run, "fake", grid, plain, design=[arms, runs], resume=True)
    assert calls == [] and len(again) == len(pts)


def test_a_points_console_line_says_n_a_for_a_figure_it_does_not_have():
    """A new user read "TTFT p50 nan s, TPOT p50 nan ms" in a quick run's console (a long-output plan's point)."""
    from workbench.run.sweeps import _headline

    line = _headline(2, 3, "p", {"status": "ok", "ttft_s_p50": float("nan"), "tpot_s_p50": None,
                                 "output_throughput_tps": 17.04})
    assert line == "[2/3] p: TTFT p50 n/a, TPOT p50 n/a, 17.0 tok/s"
    assert "TTFT p50 0.202 s, TPOT p50 51.3 ms" in _headline(1, 3, "p", {"status": "ok", "ttft_s_p50": 0.2024,
                                                                          "tpot_s_p50": 0.0513,
                                                                          "output_throughput_tps": 1.0})
