"""Sweeps on Ray (workbench.run.distributed): same points as locally, worker death, resume, bad input, devices apart,
drift per worker, figures split by device and invalid points crossed out.

The Ray tests share one local cluster (2 CPUs, no dashboard) for the module and its workers (actors are reused
from test to test), and skip, with the reason, when Ray is not installed or cannot start here. They use a tiny
batch-size grid (32-token prompts, the minimum; 2 new tokens) on the real default model; only the resume test
starts a second driver process (the one it kills). The executor's drift bookkeeping is also checked on a fake Ray.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench import cli
from workbench.run import distributed, point_result, results
from workbench.run.point_result import PointResult

REPO = Path(__file__).resolve().parents[2]
TINY = dict(batch_sizes=[1, 2], prompt_tokens=[32], max_new_tokens=2, repeats=1, warmup=0, device="cpu",
            dtype="float32")
PID = "batch_size/prompt_tokens=32,batch_size={}".format


# ----------------------------------------------------------------------------- no Ray needed


def test_ray_is_not_imported_without_ray():
    code = ("import sys, workbench.cli, workbench.run.sweeps, workbench.share.report, workbench.run.distributed, "
            "workbench.measure.energy, workbench.experiments.batch_size; "
            "workbench.cli.build_parser().parse_args(['run', 'quick']); assert 'ray' not in sys.modules, 'ray'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=300)


def test_without_the_extra_one_line_error_before_any_point(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    rc = cli.main(["sweep", "01_batch_size", "-p", "batch_sizes", "[1]", "--ray"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Ray is not installed" in err and "[ray]" in err
    assert not list(results.results_root().glob("*"))   # no run folder: nothing ran


def test_gpu_suite_on_a_cluster_without_gpus(monkeypatch, capsys, tmp_path):
    class FakeRay:
        __version__ = "0"

    monkeypatch.setattr(distributed, "connect", lambda address, start_local=True: FakeRay())
    monkeypatch.setattr(distributed, "cluster_info", lambda ray: {"ray_version": "0", "address": "x:1", "nodes": [{}],
                                                                 "cpus": 2, "gpus": 0})
    rc = cli.main(["run", str(REPO / "suites" / "gpu.yaml"), "--ray", "auto"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "has no GPU" in err
    assert not list(results.results_root().glob("*"))


def test_a_niced_process_returns_to_normal_priority_where_allowed(monkeypatch):
    calls = []
    nice = {"now": 15}
    monkeypatch.setattr(os, "getpriority", lambda which, who: nice["now"])

    def allowed(which, who, value):
        calls.append(value)
        nice["now"] = value

    monkeypatch.setattr(os, "setpriority", allowed)
    assert distributed.normal_priority() == 0 and calls == [0]

    def refused(which, who, value):
        raise PermissionError(1, "Operation not permitted")

    nice["now"] = 15
    monkeypatch.setattr(os, "setpriority", refused)
    assert distributed.normal_priority() == 15     # reported as it is: the driver then names the setting


def test_report_keeps_device_types_apart():
    from workbench.share import report

    run = results.create_run("devices")
    for i, dev in enumerate(["CPU-A", "GPU-B", "GPU-B"]):
        pid = f"batch_size/prompt_tokens=32,batch_size={i + 1}"
        results.record_point(run, pid, pd.DataFrame({"point_id": [pid], "output_tokens": [3], "device_name": [dev]}),
                             {"point_id": pid, "experiment": "batch_size", "status": "ok", "batch_size": i + 1,
                              "device_name": dev, "ttft_s_p50": 0.1 * (i + 1)}, {"status": "ok"})
    results.update_manifest(run, experiments={"batch_size": {"config": {}, "points": []}})
    html = Path(report.build_report(run)).read_text(encoding="utf-8")
    assert "1 points on CPU-A" in html and "2 points on GPU-B" in html
    assert "Measured on 2 device types" in html


def test_unreachable_address_one_line(capsys):
    pytest.importorskip("ray")
    rc = cli.main(["sweep", "01_batch_size", "-p", "batch_sizes", "[1]", "--ray", "127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "no Ray head answers at 127.0.0.1:9" in err
    assert not list(results.results_root().glob("*"))


# ----------------------------------------------------------------------------- drift, devices, invalid points (fakes)


class FakeExecutor:
    """Stands for a RayExecutor: two workers measured the points; worker-2's reference TPOT drifted 60 %."""

    def __init__(self, measure):
        self._measure, self.measure_drift, self.references = measure, False, {}

    def measure(self, point):
        return self._measure(point)

    def completed(self, todo):
        yield from todo
        if self.measure_drift:   # run_sweep asked for the reference because it was given the model
            ids = [pid for _, pid in todo]
            self.references = {"worker-1 (n, CPU #0)": {"start": 0.010, "end": 0.011, "points": ids[:1]},
                               "worker-2 (n, CPU #0)": {"start": 0.010, "end": 0.016, "points": ids[1:]}}


def test_drift_on_a_ray_worker_marks_its_points_invalid():
    from workbench.run import sweeps

    def measure(p):
        return PointResult(requests=[{"request_id": 0, "repeat": 0, "ttft_s": 0.1, "e2e_s": 0.2, "tpot_s": 0.01,
                                      "output_tokens": 11, "prompt_tokens": 16, "itl_s": [0.01] * 10}], wall_s=0.2)

    run = results.create_run("drift")
    points = [{"batch_size": b} for b in (1, 2, 3)]
    ex = FakeExecutor(measure)
    pts = sweeps.run_sweep(run, "batch_size", points, measure, loaded=types.SimpleNamespace(info=None),
                           executor=ex).set_index("point_id")
    assert ex.measure_drift
    assert pts.loc["batch_size/batch_size=1", "valid"]
    for b in (2, 3):
        reason = pts.loc[f"batch_size/batch_size={b}", "invalid_reason"]
        assert not pts.loc[f"batch_size/batch_size={b}", "valid"]
        assert "drifted 60% during the sweep on worker-2" in reason and "10.0 -> 16.0 ms" in reason
    drift = results.read_manifest(run)["experiments"]["batch_size"]["worker_drift"]
    assert drift["worker-2 (n, CPU #0)"]["drift"] == pytest.approx(0.6)


class _FakeRay:
    """Just enough of Ray for :class:`distributed.RayExecutor`: actors run their calls in submission order (as Ray
    runs one caller's calls on an actor), logged in ``calls``; worker N's reference TPOT is ``refs[N]`` before
    its first point and ``refs[N] * drift[N]`` after its last."""

    class _Ref:
        def __init__(self, fn, seq):
            self.fn, self.seq = fn, seq

    def __init__(self, measure, drift):
        self.calls, self.spawned, self._measure, self._drift = [], 0, measure, drift

    def available_resources(self):
        return {"CPU": 2}

    cluster_resources = available_resources

    def remote(self, **_):
        ray = self

        class Actor:
            @staticmethod
            def options(**_):
                return Actor

            @staticmethod
            def remote(*_):
                ray.spawned += 1
                return ray._handle(ray.spawned)

        return lambda cls: Actor

    def _handle(self, n):
        ray, name, seen = self, f"worker-{n}", []

        def method(kind, fn):
            def remote(*args):
                ray.calls.append((name, kind))
                return _FakeRay._Ref(lambda: fn(*args), len(ray.calls))
            return types.SimpleNamespace(remote=remote)

        def reference():
            seen.append(1)
            return 0.010 * (ray._drift[n] if len(seen) > 1 else 1)

        return types.SimpleNamespace(
            ready=method("ready", lambda: {"node": "n", "device_name": "CPU", "device_index": 0, "device": "cpu",
                                           "node_id": "n"}),
            reference=method("reference", reference),
            measure=method("measure", lambda exp, cfg, p, *_: self._measure(p)))

    def wait(self, refs, num_returns=1):   # the call submitted first ends first
        first = min(refs, key=lambda r: r.seq)
        return [first], [r for r in refs if r is not first]

    def get(self, ref):
        return ref.fn()

    def kill(self, handle):
        pass

    def nodes(self):
        return []

    def get_runtime_context(self):
        return types.SimpleNamespace(gcs_address="fake:1")


def test_each_ray_worker_measures_its_drift_around_its_points(monkeypatch):
    pytest.importorskip("ray")   # ray.exceptions only: no cluster starts
    from workbench.experiments import batch_size
    from workbench.run import sweeps

    def measure(p):
        return PointResult(requests=[{"request_id": i, "repeat": 0, "ttft_s": 0.1, "e2e_s": 0.2, "tpot_s": 0.01,
                                      "output_tokens": 11, "prompt_tokens": 16, "itl_s": [0.01] * 10}
                                     for i in range(p["batch_size"])], wall_s=0.2)

    ray = _FakeRay(measure, drift={1: 1.05, 2: 1.6})   # worker-2 slows down by 60 % during its points
    monkeypatch.setattr(distributed, "_POOLS", {})
    monkeypatch.setattr(distributed, "cluster_info", lambda ray: {})
    cfg = batch_size.Config(**{**TINY, "batch_sizes": [1, 2, 3, 4]})
    run = results.create_run("worker-drift")
    ex = distributed.RayExecutor(ray, "batch_size", cfg, run)
    pts = sweeps.run_sweep(run, "batch_size", cfg.grid(), measure, config=cfg, executor=ex,
                           loaded=types.SimpleNamespace(info=None)).set_index("point_id")
    for w in ("worker-1", "worker-2"):   # reference, its points, reference: in that order on its own actor
        kinds = [k for name, k in ray.calls if name == w]
        assert kinds[0] == "ready" and kinds[1] == "reference" and kinds[-1] == "reference"
        assert set(kinds[2:-1]) == {"measure"}
    by_worker = {label.split()[0]: ref["points"] for label, ref in ex.references.items()}
    assert sorted(by_worker["worker-1"] + by_worker["worker-2"]) == sorted(pts.index)
    for pid in by_worker["worker-1"]:
        assert pts.loc[pid, "valid"]
    for pid in by_worker["worker-2"]:
        assert not pts.loc[pid, "valid"]
        assert "drifted 60% during the sweep on worker-2" in pts.loc[pid, "invalid_reason"]
    assert len(results.read_manifest(run)["experiments"]["batch_size"]["worker_drift"]) == 2


def test_ray_resolves_an_experiment_by_its_module_not_its_recorded_name(monkeypatch, capsys):
    """The workers run the module that defines the sweep's config class: the context-compression notebook records
    its sweeps as ``compression`` / ``compression_chat``, a module named ``context_compression`` (the old lookup,
    ``workbench.experiments.<recorded name>``, imported a module that does not exist)."""
    from workbench.experiments import batch_size, context_compression

    cfg = context_compression.Config()
    assert distributed.experiment_module(cfg) == "workbench.experiments.context_compression"
    monkeypatch.setenv(distributed.ENV, "127.0.0.1:1")
    monkeypatch.setattr(distributed, "connect", lambda address: pytest.fail("not a Ray experiment: no connection"))
    assert distributed.executor_for("compression", cfg) is None
    assert "compression is measured locally" in capsys.readouterr().err
    monkeypatch.setattr(distributed, "_POOLS", {("default", "cpu", "float32"): object()})
    monkeypatch.setattr(distributed, "connect", lambda address: object())
    ex = distributed.executor_for("batch_size_renamed", batch_size.Config(**TINY))
    assert ex.module == "workbench.experiments.batch_size" and ex.experiment == "batch_size_renamed"


def test_a_worker_runs_measure_point_of_the_module_it_is_given_with_its_own_state(monkeypatch):
    """``_Worker.measure`` imports the module named by the driver, rebuilds its Config once, keeps one ``state``
    per (module, config) across points, and returns the PointResult with where it ran and its device's peaks."""
    import dataclasses as dc

    fake = types.ModuleType("workbench_fake_experiment")

    @dc.dataclass
    class Config:
        n: int = 1

    seen = []

    def measure_point(loaded, cfg, point, state):
        state["calls"] = state.get("calls", 0) + 1
        seen.append((loaded, cfg.n, point["x"], state["calls"]))
        return PointResult(requests=[{"request_id": 0, "output_tokens": 2}], wall_s=0.5)

    fake.Config, fake.measure_point = Config, measure_point
    monkeypatch.setitem(sys.modules, "workbench_fake_experiment", fake)
    worker = object.__new__(distributed._Worker)   # no model load, no Ray
    worker.loaded, worker.info = "the model", types.SimpleNamespace(device="cpu")
    worker.where = {"node": "n1", "device_name": "CPU", "device_index": 0, "device": "cpu"}
    worker.env, worker.configs, worker.state = {"bandwidth_bytes_per_s": 3e10, "flops_per_s": 2e11}, {}, {}
    first = worker.measure("workbench_fake_experiment", {"n": 7}, {"x": 1}, "p/x=1", 1)
    second = worker.measure("workbench_fake_experiment", {"n": 7}, {"x": 2}, "p/x=2", 1)
    assert seen == [("the model", 7, 1, 1), ("the model", 7, 2, 2)] and len(worker.configs) == 1
    assert isinstance(second, PointResult) and first.requests[0]["node"] == "n1"
    assert first.device["bandwidth_bytes_per_s"] == 3e10 and first.device["device_name"] == "CPU"
    assert "peak_memory_method" in first.device and "others_cpu_load" in first.contamination
    _, row = point_result.point_rows(first, {"device": "driver-device", "node": "driver"},
                                info=None, env={"bandwidth_bytes_per_s": 1.0})
    assert row["node"] == "n1" and row["device"] == "cpu"   # the worker's placement wins over the driver's


def test_worker_death_hook_takes_several_points(monkeypatch):
    killed = []
    monkeypatch.setattr(distributed.os, "kill", lambda pid, sig: killed.append(sig))
    spec = "batch_size=2;batch_size=1:1"
    for pid, attempt, dies in ((PID(2), 2, True), (PID(1), 1, True), (PID(1), 2, False), (PID(3), 1, False)):
        killed.clear()
        distributed._inject_death(pid, attempt, spec)
        assert bool(killed) == dies, (pid, attempt)


def _two_device_points() -> tuple[pd.DataFrame, pd.DataFrame]:
    """batch_size and context_length points of a run on two device types; one invalid point on GPU-B."""
    rows = []
    for dev, scale in (("CPU-A", 1.0), ("GPU-B", 0.1)):
        for b in (1, 2, 4):
            for ctx in (16, 64):
                bad = dev == "GPU-B" and b == 2
                rows.append(dict(experiment="batch_size", status="ok", valid=not bad,
                                 invalid_reason="reference TPOT drifted 40%" if bad else None, device_name=dev,
                                 prompt_tokens=ctx, context_tokens=ctx, batch_size=b, ttft_s_p50=scale * b * ctx / 16,
                                 ttft_s_p99=np.nan, tpot_s_p50=0.01 * scale * b, e2e_s_p50=scale, goodput_rps=b / scale,
                                 output_throughput_tps=10 * b / scale, slo_ttft_s=1.0, slo_tpot_s=0.1,
                                 kv_bytes_computed=1e6 * b * ctx, kv_bytes_measured=1.1e6 * b * ctx,
                                 point_id=f"x/prompt_tokens={ctx},batch_size={b}"))
    pts = pd.DataFrame(rows)
    req = pts.assign(output_tokens=3, decode_tps=pts["output_throughput_tps"], ttft_s=pts["ttft_s_p50"],
                     prefill_s=pts["ttft_s_p50"] / 2)
    return pts, req


def test_every_figure_of_a_two_device_run_is_split_by_device():
    from workbench.experiments import batch_size, context_length
    from workbench.share import report

    pts, req = _two_device_points()
    figs = {**batch_size.figures(pts, req), **context_length.figures(pts, req, {})}
    run = results.create_run("two-devices")
    for name, fig in figs.items():
        panels = [a.text for a in fig.layout.annotations if str(a.text).startswith("on ")]
        assert panels == ["on CPU-A", "on GPU-B"], name
        axes = {t.yaxis for t in fig.data if t.type != "heatmap"} | {t.yaxis for t in fig.data if t.type == "heatmap"}
        assert axes == {"y", "y2"}, name                                  # one panel per device
        results.save_figure(run, name, fig)
    ttft = figs["batch_ttft"]
    on_b = [t for t in ttft.data if t.yaxis == "y2" and t.name.endswith("p50")][0]
    assert list(on_b.y) == pytest.approx([0.1, 0.2, 0.4])                 # GPU-B's own points, never pooled
    assert ttft.layout.xaxis2.type == "log"                                # axis settings kept on every panel
    html = Path(report.build_report(run)).read_text(encoding="utf-8")
    assert "on CPU-A" in html and "on GPU-B" in html
    one = batch_size.figures(pts[pts["device_name"] == "CPU-A"], req[req["device_name"] == "CPU-A"])["batch_ttft"]
    assert not any(str(a.text).startswith("on ") for a in one.layout.annotations)   # one device: unchanged


def test_invalid_points_crossed_out_beyond_batch_size():
    from workbench.experiments import context_length

    pts, _ = _two_device_points()
    pts = pts[pts["device_name"] == "GPU-B"]
    fig = context_length.fig_tpot_vs_context(pts)
    crosses = [t for t in fig.data if t.name == "invalid (greyed)"]
    assert len(crosses) == 1 and crosses[0].marker.symbol == "x-thin-open" and crosses[0].marker.color == "#999"
    assert list(crosses[0].x) == [16, 64] and list(crosses[0].y) == pytest.approx([0.002, 0.002])
    assert all("drifted 40%" in h for h in crosses[0].hovertext)


# ----------------------------------------------------------------------------- with a local Ray cluster


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster for the module (2 CPUs, no dashboard, warnings only); its workers are reused by the tests."""
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    try:
        distributed.start_local_cluster(ray, attempts=2, num_cpus=2, include_dashboard=False,
                                        logging_level="WARNING", log_to_driver=False)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"a local Ray cluster could not start on this machine: {exc}")
    old = os.environ.get(distributed.CPUS_ENV)
    os.environ[distributed.CPUS_ENV] = "1"  # two 1-core workers: the mechanics (retry on another worker) need two
    yield ray.get_runtime_context().gcs_address
    if old is None:
        os.environ.pop(distributed.CPUS_ENV, None)
    else:
        os.environ[distributed.CPUS_ENV] = old
    distributed.release_workers()
    ray.shutdown()


def _sweep(run, cfg, loaded, resume=False, drift=False):
    from workbench.experiments import batch_size
    from workbench.run import sweeps

    return sweeps.run_sweep(run, "batch_size", cfg.grid(), lambda p: batch_size.measure_point(loaded, cfg, p, {}),
                            resume=resume, info=loaded.info, config=cfg, loaded=loaded if drift else None)


def _ray_sweep(run, cfg, loaded, monkeypatch, address, **kwargs):
    monkeypatch.setenv(distributed.ENV, address)
    return _sweep(run, cfg, loaded, **kwargs)


@pytest.mark.model
@pytest.mark.ray
def test_distributed_points_equal_local(ray_cluster, loaded, monkeypatch):
    from workbench.experiments import batch_size

    cfg = batch_size.Config(**TINY)
    local = results.create_run("local")
    _sweep(local, cfg, loaded)
    remote = results.create_run("ray")
    _ray_sweep(remote, cfg, loaded, monkeypatch, ray_cluster, drift=True)
    key = ["point_id", "repeat", "request_id"]
    a = results.read_requests(local).sort_values(key).reset_index(drop=True)
    b = results.read_requests(remote).sort_values(key).reset_index(drop=True)
    assert list(a["point_id"]) == list(b["point_id"])
    assert list(a["output_tokens"]) == list(b["output_tokens"])          # greedy, fixed length: identical
    assert list(a["prompt_tokens"]) == list(b["prompt_tokens"])
    pa, pb = results.read_points(local), results.read_points(remote)
    assert sorted(pa["point_id"]) == sorted(pb["point_id"]) and (pb["status"] == "ok").all()
    assert b[["node", "device_name", "device_index"]].notna().all().all()
    assert pb[["node", "device_name", "device_index"]].notna().all().all()
    manifest = results.read_manifest(remote)
    cluster = manifest["cluster"]
    assert cluster["ray_version"] and cluster["nodes"] and cluster["workers"]
    # a measuring worker competes at the driver's priority, not at Ray's default niceness 15
    assert [w["niceness"] for w in cluster["workers"]] == [0] * len(cluster["workers"])
    drift = manifest["experiments"]["batch_size"]["worker_drift"]   # each worker's reference around its points
    assert drift and sum(len(w["reference_tpot_s"]) for w in drift.values()) == 2 * len(drift)
    assert all(0 < t < 10 for w in drift.values() for t in w["reference_tpot_s"])


@pytest.mark.model
@pytest.mark.ray
def test_worker_death_retried_once_then_failed(ray_cluster, loaded, monkeypatch):
    from workbench.experiments import batch_size

    cfg = batch_size.Config(**{**TINY, "batch_sizes": [1, 2, 3]})
    # batch 2: its worker dies on every attempt; batch 1: on the first attempt only (the retry succeeds)
    monkeypatch.setenv(distributed.INJECT_ENV, "batch_size=2;batch_size=1:1")
    run = results.create_run("death")
    pts = _ray_sweep(run, cfg, loaded, monkeypatch, ray_cluster).set_index("point_id")
    assert pts.loc[PID(2), "status"].startswith("failed: WorkerDied: its worker died on both attempts")
    assert (pts.drop(index=PID(2))["status"] == "ok").all() and len(pts) == 3
    assert set(results.read_requests(run)["point_id"]) == {PID(1), PID(3)}


# The driver measures nothing itself (its points go to its Ray worker), so it loads no model of its own (~6 s of a
# 2-core machine's CPU, beside its worker's load): no environment record for its session, which this test never reads.
DRIVER = textwrap.dedent("""
    import sys
    from workbench.run import results, sweeps
    from workbench.experiments import batch_size
    cfg = batch_size.Config(batch_sizes=[1, 2, 3, 4], prompt_tokens=[32], max_new_tokens=2, repeats=1, warmup=0,
                            device="cpu", dtype="float32")
    run = results.open_run(sys.argv[1])

    def measure(point):
        raise AssertionError("a Ray sweep measured a point in its driver")

    sweeps.run_sweep(run, "batch_size", cfg.grid(), measure, resume=True, config=cfg)
""")


@pytest.mark.model
@pytest.mark.ray
def test_resume_after_killing_the_driver(ray_cluster, loaded, monkeypatch, tmp_path):
    from workbench.experiments import batch_size

    for pool in distributed._POOLS.values():   # free one of the 2 CPUs for the driver's own worker
        for slot in pool.live()[1:]:
            pool.kill(slot)
        monkeypatch.setattr(pool, "capacity", 1)
    run = results.create_run("killed")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, distributed.ENV: ray_cluster, distributed.MAX_WORKERS_ENV: "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(run)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 400
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(results.read_manifest(run).get("points", {})) >= 1:
                break
            time.sleep(0.2)
    finally:
        died = proc.poll()
        if died is None:
            os.killpg(proc.pid, signal.SIGKILL)   # the driver and nothing else: its own process group
        _, err = proc.communicate()
    assert died is None, f"the driver ended by itself ({died}) before it could be killed: {err[-2000:]}"
    before = set(results.read_manifest(run).get("points", {}))
    assert 1 <= len(before) < 4, "the driver should be killed mid-sweep"
    # resume in this process, on the module's warm worker (Ray ends the killed driver's own worker)
    cfg = batch_size.Config(**{**TINY, "batch_sizes": [1, 2, 3, 4]})
    _ray_sweep(results.open_run(run), cfg, loaded, monkeypatch, ray_cluster, resume=True)
    pts = results.read_points(run)
    req = results.read_requests(run)
    assert sorted(pts["point_id"]) == sorted(PID(b) for b in (1, 2, 3, 4))
    assert (pts["status"] == "ok").all() and not pts["point_id"].duplicated().any()
    assert not req.duplicated(["point_id", "repeat", "request_id"]).any()
    assert req.groupby("point_id").size().to_dict() == {PID(b): b for b in (1, 2, 3, 4)}
