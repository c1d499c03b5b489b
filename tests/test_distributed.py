"""Sweeps on Ray (workbench.distributed): same points as locally, worker death, resume, bad input, devices apart.

The Ray tests start one local cluster (2 CPUs) for the module and skip, with the reason, when Ray is not
installed or cannot start here. They use a tiny batch-size grid on the real default model.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from workbench import cli, distributed, results

REPO = Path(__file__).resolve().parents[1]
TINY = dict(batch_sizes=[1, 2], prompt_tokens=[32], max_new_tokens=3, repeats=1, warmup=0, device="cpu",
            dtype="float32")


# ----------------------------------------------------------------------------- no Ray needed


def test_ray_is_not_imported_without_ray():
    code = ("import sys, workbench.cli, workbench.sweeps, workbench.report, workbench.distributed, "
            "workbench.energy, workbench.experiments.batch_size; "
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


def test_report_keeps_device_types_apart():
    from workbench import report

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


# ----------------------------------------------------------------------------- with a local Ray cluster


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")
    try:
        distributed.start_local_cluster(ray, attempts=3, num_cpus=2, include_dashboard=False,
                                        logging_level="WARNING", log_to_driver=False)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"a local Ray cluster could not start on this machine: {exc}")
    yield ray.get_runtime_context().gcs_address
    distributed.release_workers()
    ray.shutdown()


def _sweep(run, cfg, loaded, executor=None, resume=False):
    from workbench import sweeps
    from workbench.experiments import batch_size

    return sweeps.run_sweep(run, "batch_size", cfg.grid(), lambda p: batch_size.measure_point(loaded, cfg, p),
                            resume=resume, info=loaded.info, config=cfg, executor=executor)


def _ray_sweep(run, cfg, loaded, monkeypatch, address):
    monkeypatch.setenv(distributed.ENV, address)
    return _sweep(run, cfg, loaded)


@pytest.mark.model
@pytest.mark.ray
def test_distributed_points_equal_local(ray_cluster, loaded, monkeypatch):
    from workbench.experiments import batch_size

    cfg = batch_size.Config(**TINY)
    local = results.create_run("local")
    _sweep(local, cfg, loaded)
    remote = results.create_run("ray")
    _ray_sweep(remote, cfg, loaded, monkeypatch, ray_cluster)
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
    cluster = results.read_manifest(remote)["cluster"]
    assert cluster["ray_version"] and cluster["nodes"] and cluster["workers"]


@pytest.mark.model
@pytest.mark.ray
def test_worker_death_retried_once_then_failed(ray_cluster, loaded, monkeypatch):
    from workbench.experiments import batch_size

    cfg = batch_size.Config(**{**TINY, "batch_sizes": [1, 2, 3]})
    monkeypatch.setenv(distributed.INJECT_ENV, "batch_size=2")      # dies on every attempt
    run = results.create_run("death")
    pts = _ray_sweep(run, cfg, loaded, monkeypatch, ray_cluster).set_index("point_id")
    dead = "batch_size/prompt_tokens=32,batch_size=2"
    assert pts.loc[dead, "status"].startswith("failed: WorkerDied: its worker died on both attempts")
    assert (pts.drop(index=dead)["status"] == "ok").all() and len(pts) == 3
    assert dead not in set(results.read_requests(run)["point_id"])

    monkeypatch.setenv(distributed.INJECT_ENV, "batch_size=1:1")    # dies on the first attempt only
    run2 = results.create_run("retry")
    pts2 = _ray_sweep(run2, batch_size.Config(**TINY), loaded, monkeypatch, ray_cluster)
    assert (pts2["status"] == "ok").all() and len(pts2) == 2


DRIVER = textwrap.dedent("""
    import os, sys
    from workbench import models, results, sweeps
    from workbench.experiments import batch_size
    cfg = batch_size.Config(batch_sizes=[1, 2, 3, 4], prompt_tokens=[32], max_new_tokens=3, repeats=1, warmup=0,
                            device="cpu", dtype="float32")
    loaded = models.load_model("default", "cpu", "float32")
    run = results.open_run(sys.argv[1])
    sweeps.run_sweep(run, "batch_size", cfg.grid(), lambda p: batch_size.measure_point(loaded, cfg, p),
                     resume=True, info=loaded.info, config=cfg)
""")


@pytest.mark.model
@pytest.mark.ray
def test_resume_after_killing_the_driver(ray_cluster, tmp_path):
    distributed.release_workers()   # the drivers below need the cluster's 2 CPUs for their own workers
    run = results.create_run("killed")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, distributed.ENV: ray_cluster, distributed.MAX_WORKERS_ENV: "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(run)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 400
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if len(results.read_manifest(run).get("points", {})) >= 1:
                break
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the driver and nothing else: its own process group
        proc.wait()
    before = set(results.read_manifest(run).get("points", {}))
    assert 1 <= len(before) < 4, "the driver should be killed mid-sweep"
    subprocess.run([sys.executable, str(script), str(run)], env={**env, distributed.MAX_WORKERS_ENV: "2"}, cwd=REPO,
                   check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pts = results.read_points(run)
    req = results.read_requests(run)
    assert sorted(pts["point_id"]) == sorted(f"batch_size/prompt_tokens=32,batch_size={b}" for b in (1, 2, 3, 4))
    assert (pts["status"] == "ok").all() and not pts["point_id"].duplicated().any()
    assert not req.duplicated(["point_id", "repeat", "request_id"]).any()
    assert req.groupby("point_id").size().to_dict() == {f"batch_size/prompt_tokens=32,batch_size={b}": b
                                                        for b in (1, 2, 3, 4)}
