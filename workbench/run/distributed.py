"""Sweeps on a Ray cluster: long-lived workers, one point at a time per device, one writer.

``workbench run SUITE --ray [auto|ADDRESS]`` (and ``sweep``) sets ``$WORKBENCH_RAY`` for the notebook
kernels it starts; :func:`workbench.run.sweeps.run_sweep` then asks :func:`executor_for` for a
:class:`RayExecutor` and measures its points on the cluster instead of in the kernel:

- Workers are Ray actors (:class:`_Worker`), each loading the model once
  (:func:`workbench.measure.models.load_model`) and measuring many points, one at a time. A worker asks for
  ``num_gpus`` (``$WORKBENCH_RAY_GPUS_PER_WORKER``, default 1; a fraction packs small models several to a
  GPU) or, on CPU, ``num_cpus`` (``$WORKBENCH_RAY_CPUS_PER_WORKER``, default: all CPUs of a node, so one
  worker per node and no two points share a CPU; torch threads = that).
  The driver never sends a point to a GPU that is measuring another one, so workers sharing a GPU take
  turns. CPU workers of one node share its memory bandwidth: their points' ``others_cpu_load`` records
  that, and the verdict marks them invalid when it exceeds the limit.
- A worker calls ``measure_point(loaded, cfg, point, state)`` of the experiment's module (the module that
  defines the sweep config's class, :func:`experiment_module`): the config travels as a dict and is rebuilt
  there; ``state`` lives in the worker. Supported: :data:`SUPPORTED`; other experiments run
  locally in the kernel, with a line saying so.
- Workers get only the environment variables of :data:`WORKER_ENV` (:func:`worker_env`), never a key or token
  (``WORKBENCH_API_KEY``, ``HF_TOKEN``): a cluster ``auto`` finds may not be the user's own.
- The driver alone writes the run folder: workers return the point's
  :class:`~workbench.run.point_result.PointResult` (request rows tagged with ``node``, ``device_name``,
  ``device_index``; the device-side figures: peak memory, contamination, energy, and the worker's probed
  peaks, against which MBU/MFU are computed); :func:`workbench.run.sweeps.run_sweep` turns it into rows
  (:func:`workbench.run.point_result.point_rows`) and records each point as it arrives, so ``--resume`` works as it
  does locally.
- A point whose worker dies (killed, out of memory) is retried once on another worker, then recorded
  ``failed: WorkerDied: ...``; a dead worker is replaced while points remain. An exception raised by
  ``measure_point`` itself is recorded as it would be locally (no retry).
- The manifest's ``cluster`` entry records the Ray version, the nodes (CPUs, GPUs, accelerator type) and
  every worker (node, device, name, index, probed bandwidth / FLOP/s, energy availability).

- Drift: when the sweep measures its reference (``run_sweep(..., loaded=...)``, as the experiments do), each
  worker measures :func:`workbench.run.drift.reference_tpot_s` on its own device before its first point of the
  sweep and after its last one (``executor.references``); run_sweep marks that worker's points invalid when
  it drifted beyond :data:`workbench.run.drift.DRIFT_LIMIT` (manifest: ``experiments.<name>.worker_drift``).
  Each point's contamination is measured by its worker too.

Ray is imported only here, and only once ``--ray`` (``$WORKBENCH_RAY``) asks for it.
Test hook: ``$WORKBENCH_INJECT_WORKER_DEATH=SUBSTRING[:N][;SUBSTRING[:N]...]`` kills the worker measuring a
point whose id contains SUBSTRING (on its first N attempts; every attempt without N).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import os
import socket
import sys

from workbench.errors import ParameterError
from workbench.run import point_result
from workbench.run.point_result import point_id

ENV = "WORKBENCH_RAY"
CPUS_ENV = "WORKBENCH_RAY_CPUS_PER_WORKER"
NICENESS_ENV = "RAY_worker_niceness"   # Ray's own setting: the niceness its raylet gives the workers it starts
GPUS_ENV = "WORKBENCH_RAY_GPUS_PER_WORKER"
MAX_WORKERS_ENV = "WORKBENCH_RAY_MAX_WORKERS"
INJECT_ENV = "WORKBENCH_INJECT_WORKER_DEATH"
#: the only environment variables a Ray worker gets from the driver (issue 36): what measuring a point needs (the
#: cache and data folders, the trust switches, offline mode, the test hooks), never a key or token (the server's
#: ``WORKBENCH_API_KEY``, ``HF_TOKEN``): a cluster found by ``auto`` may not be the user's own.
WORKER_ENV = ("WORKBENCH_CACHE", "WORKBENCH_TESTS_CACHE", "WORKBENCH_RESULTS", "WORKBENCH_DATA",
              "WORKBENCH_TRUST_REMOTE_CODE", "WORKBENCH_ALLOW_PICKLE", "WORKBENCH_RERUN_INVALID",
              "WORKBENCH_INJECT_FAILURE", "WORKBENCH_INJECT_WRITE_ERROR", INJECT_ENV,
              "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE",
              "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS", "WORKBENCH_PROBE_REUSE_S")


def worker_env(environ=None) -> dict:
    """The variables of ``environ`` (default ``os.environ``) a Ray worker is given: those of :data:`WORKER_ENV`,
    never one whose name says it holds a secret (:func:`workbench.checks.secret_name`: ``KEY``, ``TOKEN``,
    ``SECRET``, ...)."""
    from workbench.checks import secret_name

    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in WORKER_ENV if k in environ and not secret_name(k)}

#: Experiment modules whose ``measure_point`` runs on a Ray worker (the others need objects of the kernel:
#: a server, a run folder, a live display, or state shared with the kernel).
SUPPORTED = ("workbench.experiments.batch_size", "workbench.experiments.context_length",
             "workbench.experiments.temperature")


class WorkerDied(RuntimeError):
    """The Ray worker measuring a point died (on both attempts)."""


# ----------------------------------------------------------------------------- placement (no Ray needed)


def placement(info, gpu_ids=None) -> dict:
    """``{"node", "device_name", "device_index"}`` of a loaded model (``info``: :class:`~workbench.measure.models.ModelInfo`).

    ``device_index``: the physical GPU index (through Ray's GPU ids or ``$CUDA_VISIBLE_DEVICES``), 0 on CPU
    and MPS.
    """
    index = 0
    if info.device.startswith("cuda"):
        index = int(info.device.split(":")[1]) if ":" in info.device else 0
        visible = [str(g) for g in gpu_ids] if gpu_ids else \
            [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if index < len(visible) and visible[index].isdigit():
            index = int(visible[index])
    return {"node": socket.gethostname(), "device_name": info.device_name, "device_index": index}


# ----------------------------------------------------------------------------- connecting


def require_ray():
    """The ``ray`` module, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ParameterError("--ray: Ray is not installed; install the extra: pip install -e '.[ray]'") from None
    return ray


def _check_reachable(address: str) -> None:
    """Fail fast (3 s) on a ``host:port`` nobody listens on, instead of Ray's minute of retries."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ParameterError(f"--ray: {address!r} is not a Ray address (auto, or HOST:PORT of a head node)")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise ParameterError(f"--ray: no Ray head answers at {address} ({exc.strerror or exc}); "
                             f"start one with `ray start --head` or give its address") from None


def connect(address: str = "auto", start_local: bool = True):
    """Connect this process to Ray; returns the ``ray`` module.

    Args:
        address: ``auto`` (a running cluster, found as Ray finds it; else, with ``start_local``, a new
            local one on this machine's cores) or ``HOST:PORT`` of a head node (``ray start --head``).
        start_local: start a local cluster when ``auto`` finds none.

    Raises:
        ParameterError: Ray missing, or an address that does not answer.
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    kwargs = dict(logging_level="WARNING", log_to_driver=False, include_dashboard=False)
    address = (address or "auto").strip()
    if address in ("auto", "local"):
        if address == "auto":
            try:
                ray.init(address="auto", **{k: v for k, v in kwargs.items() if k != "include_dashboard"})
                return ray
            except Exception:  # noqa: BLE001 - no running cluster: start one
                if not start_local:
                    raise ParameterError("--ray: no running Ray cluster found (start one with `ray start --head`)")
        return start_local_cluster(ray, **kwargs)
    _check_reachable(address)
    try:
        ray.init(address=address, **{k: v for k, v in kwargs.items() if k != "include_dashboard"})
    except Exception as exc:  # noqa: BLE001 - one line, never Ray's traceback
        raise ParameterError(f"--ray: cannot join the Ray cluster at {address} "
                             f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    return ray


def start_local_cluster(ray, attempts: int = 3, **kwargs):
    """``ray.init(**kwargs)``: a new cluster on this machine, retried: on a heavily loaded machine Ray's helper
    processes can miss the raylet's fixed start-up window (about 15 s), and a second try finds their imports cached.

    Raises:
        ParameterError: every attempt failed (one line, with Ray's reason).
    """
    # Ray starts its workers at niceness 15 (its raylet's default), so any other process on the machine takes their
    # cores first: a measuring worker must compete at the driver's priority (RAY_worker_niceness, read by the raylet
    # this call starts; results/LOG.md 2026-12-07 (evening): a Ray sweep beside two busy processes 4.4x slower)
    os.environ.setdefault(NICENESS_ENV, "0")
    last = None
    for i in range(attempts):
        try:
            ray.init(**kwargs)
            return ray
        except Exception as exc:  # noqa: BLE001
            last = exc
            print(f"ray: local cluster did not start (attempt {i + 1}/{attempts}): "
                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}", file=sys.stderr, flush=True)
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001
                pass
    raise ParameterError(f"--ray: could not start a local Ray cluster ({type(last).__name__}: "
                         f"{str(last).strip().splitlines()[0] if str(last).strip() else ''}); "
                         "start one with `ray start --head` and pass its address")


def cluster_info(ray) -> dict:
    """Ray version, address and nodes (CPUs, GPUs, accelerator type) of the connected cluster."""
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append({"node_id": n.get("NodeID"), "host": n.get("NodeManagerHostname"), "ip": n.get("NodeManagerAddress"),
                      "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0),
                      "accelerator": next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), None)})
    total = ray.cluster_resources()
    ctx = ray.get_runtime_context()
    return {"ray_version": ray.__version__, "address": getattr(ctx, "gcs_address", None), "nodes": nodes,
            "cpus": total.get("CPU", 0), "gpus": total.get("GPU", 0)}


def _wants_gpu(device: str, gpus: float) -> bool:
    return device == "cuda" or (device == "auto" and gpus > 0)


def prepare(address: str, entries: list[dict]) -> str:
    """``--ray``: connect (starting a local cluster for ``auto`` when none runs), check the suite fits, and
    export the address for the kernels (``$WORKBENCH_RAY``). Called by the CLI before any point runs.

    Args:
        address: ``auto`` or ``HOST:PORT``.
        entries: the suite's notebooks (``{"notebook", "parameters"}``).

    Returns:
        The address the kernels join.

    Raises:
        ParameterError: Ray missing, address unreachable, a notebook asking for GPUs on a cluster without
            any, or for a device Ray cannot schedule (``mps``).
    """
    ray = connect(address)
    info = cluster_info(ray)
    for e in entries:
        device = str((e.get("parameters") or {}).get("device", "auto"))
        name = os.path.basename(str(e.get("notebook", "")))
        if device == "mps":
            raise ParameterError(f"--ray: {name} asks for device mps, which Ray cannot schedule (use cpu or cuda)")
        if device == "cuda" and not info["gpus"]:
            raise ParameterError(f"--ray: {name} asks for device cuda but the Ray cluster "
                                 f"({len(info['nodes'])} node(s), {info['cpus']:g} CPUs) has no GPU")
    gcs = info["address"] or address
    os.environ[ENV] = gcs
    print(f"ray: {len(info['nodes'])} node(s), {info['cpus']:g} CPUs, {info['gpus']:g} GPUs, "
          f"Ray {info['ray_version']} at {gcs}", flush=True)
    return gcs


# ----------------------------------------------------------------------------- the worker (runs in a Ray actor)


def _inject_death(pid: str, attempt: int, spec: str) -> None:
    for one in (spec or "").split(";"):
        sub, _, n = one.partition(":")
        if sub and sub in pid and (not n or attempt <= int(n)):
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def normal_priority() -> int:
    """Bring this process to niceness 0 where the OS allows it (Ray starts its workers at 15 unless the cluster was
    started with ``RAY_worker_niceness=0``; a niced worker measures the other processes' load, not the model).

    Returns:
        the niceness the process runs at afterwards (0, or higher where lowering it is not permitted).
    """
    now = os.getpriority(os.PRIO_PROCESS, 0)
    if now > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:   # an unprivileged process may only raise its niceness
            pass
        now = os.getpriority(os.PRIO_PROCESS, 0)
    return now


class _Worker:
    """One model on one device, measuring points one at a time (wrapped by ``ray.remote`` in :class:`_Pool`)."""

    def __init__(self, model: str, device: str, dtype: str, threads: int, env: dict):
        os.environ.update(env)
        self.niceness = normal_priority()
        import torch

        if threads:
            torch.set_num_threads(int(threads))
        from workbench.measure import models

        self.loaded = models.load_model(model, device, dtype)
        self.info = self.loaded.info
        try:
            import ray

            gpu_ids = ray.get_gpu_ids()
        except Exception:  # noqa: BLE001
            gpu_ids = None
        self.where = {**placement(self.info, gpu_ids), "device": self.info.device}
        self.env: dict = {}
        self.configs: dict = {}
        self.state: dict = {}

    def ready(self) -> dict:
        """Probe the device (bandwidth / FLOP/s, once) and say where this worker is."""
        from workbench.measure import device, energy

        self.env = device.facts(self.info, probe=True)
        import ray

        return {**self.where, "pid": os.getpid(), "niceness": self.niceness,
                "node_id": ray.get_runtime_context().get_node_id(),
                "torch_threads": self.env.get("torch_threads"),
                "bandwidth_bytes_per_s": self.env.get("bandwidth_bytes_per_s"),
                "flops_per_s": self.env.get("flops_per_s"), "energy": energy.status(self.info.device)}

    def reference(self) -> float:
        """The drift probe on this worker's device (:func:`workbench.run.drift.reference_tpot_s`), in seconds."""
        from workbench.run import drift

        return drift.reference_tpot_s(self.loaded)

    def measure(self, module: str, cfg_dict: dict, point: dict, pid: str, attempt: int, inject: str = ""):
        """Measure one point with ``measure_point(loaded, cfg, point, state)`` of the experiment module
        ``module`` (e.g. ``workbench.experiments.batch_size``; its ``Config`` is rebuilt from ``cfg_dict``
        once, and ``state`` lives as long as this worker, per module and config).

        Returns:
            The :class:`workbench.run.point_result.PointResult`, measured with this worker's device readings
            (:func:`workbench.run.point_result.measure_on_device`); its ``device`` also says where it ran and holds
            this device's probed peaks (for MBU / MFU), and its requests are tagged with where they ran.
        """

        mod = importlib.import_module(module)
        key = (module, json.dumps(cfg_dict, sort_keys=True, default=str))
        if key not in self.configs:
            self.configs[key] = mod.Config(**cfg_dict)
        cfg, state = self.configs[key], self.state.setdefault(key, {})

        def measure():
            _inject_death(pid, attempt, inject)
            return mod.measure_point(self.loaded, cfg, point, state)

        result = point_result.measure_on_device(measure, self.info.device)
        for rec in result.requests:
            rec.update(self.where)
        peaks = {k: self.env[k] for k in ("bandwidth_bytes_per_s", "flops_per_s") if k in self.env}
        result.device.update(self.where, **peaks)
        return result


# ----------------------------------------------------------------------------- the driver side


@dataclasses.dataclass
class _Slot:
    handle: object
    name: str
    ready_ref: object = None
    where: dict | None = None
    busy: bool = False
    dead: bool = False

    @property
    def device_key(self):
        w = self.where or {}
        if str(w.get("device", "")).startswith("cuda"):
            return (w.get("node_id"), "cuda", w.get("device_index"))
        return (w.get("node_id"), "cpu-worker", self.name)  # a CPU worker owns its num_cpus cores


def _node_cpus(ray) -> float:
    """CPUs of the largest live node: a CPU worker's default size, so one worker owns a whole node and no two
    points are measured on one CPU at the same time (they would share its cores and memory bandwidth)."""
    return max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1) or 1


class _Pool:
    """Workers for one (model, device, dtype), kept for the life of the driver process."""

    def __init__(self, ray, model: str, device: str, dtype: str):
        self.ray, self.model, self.device, self.dtype = ray, model, device, dtype
        resources = ray.available_resources()
        gpus = ray.cluster_resources().get("GPU", 0)
        self.gpu = _wants_gpu(device, gpus)
        if self.gpu:
            self.per = float(os.environ.get(GPUS_ENV) or 1)
            self.capacity = int(resources.get("GPU", gpus) / self.per + 1e-9)
            self.options = {"num_gpus": self.per, "num_cpus": 1}
            self.threads = 0
        else:
            self.per = float(os.environ.get(CPUS_ENV) or _node_cpus(ray))
            self.capacity = int(resources.get("CPU", 1) / self.per + 1e-9)
            self.options = {"num_cpus": self.per}
            self.threads = max(1, int(self.per))
        if os.environ.get(MAX_WORKERS_ENV):
            self.capacity = min(self.capacity, int(os.environ[MAX_WORKERS_ENV]))
        if self.capacity < 1:
            print(f"ray: no free {'GPU' if self.gpu else 'CPU'} on the cluster now (other jobs hold them); "
                  "the worker waits until one frees", file=sys.stderr, flush=True)
        self.capacity = max(1, self.capacity)
        self.slots: list[_Slot] = []
        self.spawned = 0
        self.last_error = ""
        self._cls = ray.remote(max_restarts=0, max_concurrency=1)(_Worker)

    def spawn(self) -> _Slot:
        self.spawned += 1
        env = worker_env()
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        handle = self._cls.options(**self.options).remote(self.model, self.device if not self.gpu else "cuda",
                                                          self.dtype, self.threads, env)
        slot = _Slot(handle, f"worker-{self.spawned}")
        slot.ready_ref = handle.ready.remote()
        self.slots.append(slot)
        return slot

    def ensure(self, n: int) -> None:
        live = [s for s in self.slots if not s.dead]
        for _ in range(max(0, min(n, self.capacity) - len(live))):
            self.spawn()

    def live(self) -> list[_Slot]:
        return [s for s in self.slots if not s.dead]

    def kill(self, slot: _Slot) -> None:
        slot.dead = True
        try:
            self.ray.kill(slot.handle)
        except Exception:  # noqa: BLE001
            pass


_POOLS: dict[tuple, _Pool] = {}


def release_workers() -> None:
    """End this process's workers (they otherwise live as long as the driver), freeing their CPUs / GPUs."""
    for pool in _POOLS.values():
        for slot in pool.live():
            pool.kill(slot)
    _POOLS.clear()


class RayExecutor:
    """Measures a sweep's points on Ray workers; :func:`workbench.run.sweeps.run_sweep` consumes it.

    ``completed(todo)`` yields ``(point, point_id)`` as points finish (any order); ``measure(point)``
    then returns that point's :class:`workbench.run.point_result.PointResult`, or raises what the worker raised (or
    :class:`WorkerDied`). The workers run ``measure_point`` of the module that defines ``config``'s class
    (:func:`experiment_module`), whatever the sweep's recorded experiment name.
    """

    def __init__(self, ray, experiment: str, config, run_dir=None):
        self.ray, self.experiment, self.run_dir = ray, experiment, run_dir
        self.module = experiment_module(config)
        self.cfg_dict = dataclasses.asdict(config)
        key = (config.model, config.device, config.dtype)
        if key not in _POOLS:
            _POOLS[key] = _Pool(ray, *key)
        self.pool = _POOLS[key]
        self._results: dict = {}
        self.measure_drift = False   # set by run_sweep: measure each worker's reference around its points
        self.references: dict = {}   # worker label -> {"start", "end" (s), "points": [point ids]}

    # the measure of run_sweep
    def measure(self, point: dict):
        out = self._results.pop(point_id(self.experiment, point))
        if isinstance(out, BaseException):
            raise out
        return out

    def _record_cluster(self) -> None:
        if self.run_dir is None:
            return
        from workbench.run import results

        workers = [{"worker": s.name, **(s.where or {})} for s in self.pool.slots if s.where]
        results.update_manifest(self.run_dir, cluster={**cluster_info(self.ray), "workers": workers,
                                                      "resources_per_worker": self.pool.options})

    def completed(self, todo: list):
        """Dispatch the points, one per idle worker and device; yield each ``(point, point_id)`` as it ends."""
        ray, pool = self.ray, self.pool
        from ray.exceptions import RayActorError, RayTaskError

        queue = collections.deque((p, pid, 1) for p, pid in todo)
        refs: dict = {}   # slot name -> {"slot", "start" (ObjectRef), "points"}: the drift reference per worker
        pool.ensure(len(queue))
        spawn_budget = pool.spawned + 2 * max(1, len(pool.live()))
        running: dict = {}   # ref -> (slot, point, pid, attempt)
        print(f"ray: {self.experiment}: {len(queue)} point(s) on up to {pool.capacity} worker(s) "
              f"({', '.join(f'{k}={v:g}' for k, v in pool.options.items())} each)", file=sys.stderr, flush=True)
        try:
            while queue or running:
                busy_devices = {s.device_key for s, *_ in running.values()}
                for slot in pool.live():
                    if not queue:
                        break
                    if slot.busy or slot.where is None or slot.device_key in busy_devices:
                        continue
                    p, pid, attempt = queue.popleft()
                    if self.measure_drift and slot.name not in refs:  # runs before the point: actors run in order
                        refs[slot.name] = {"slot": slot, "start": slot.handle.reference.remote(), "points": []}
                    ref = slot.handle.measure.remote(self.module, self.cfg_dict, p, pid, attempt,
                                                     os.environ.get(INJECT_ENV, ""))
                    running[ref] = (slot, p, pid, attempt)
                    slot.busy = True
                    busy_devices.add(slot.device_key)
                starting = {s.ready_ref: s for s in pool.live() if s.where is None}
                if not running and not starting:  # nobody can take the queued points
                    if queue and pool.spawned < spawn_budget:
                        pool.spawn()
                        continue
                    while queue:
                        p, pid, _ = queue.popleft()
                        self._results[pid] = WorkerDied(f"no Ray worker could start ({pool.last_error})")
                        yield p, pid
                    break
                done, _ = ray.wait(list(running) + list(starting), num_returns=1)
                ref = done[0]
                if ref in starting:
                    slot = starting[ref]
                    try:
                        slot.where = ray.get(ref)
                        if (slot.where.get("niceness") or 0) > 0:
                            print(f"ray: {slot.name} runs at niceness {slot.where['niceness']} (Ray's default for "
                                  f"its workers): other load on its node takes its cores first; start the cluster "
                                  f"with {NICENESS_ENV}=0", file=sys.stderr, flush=True)
                        self._record_cluster()
                    except Exception as exc:  # noqa: BLE001 - the worker could not load the model
                        pool.last_error = _reason(exc)
                        print(f"ray: {slot.name} failed to start: {pool.last_error}", file=sys.stderr, flush=True)
                        pool.kill(slot)
                    continue
                slot, p, pid, attempt = running.pop(ref)
                slot.busy = False
                try:
                    self._results[pid] = ray.get(ref)
                    if slot.name in refs:
                        refs[slot.name]["points"].append(pid)
                except RayTaskError as exc:  # measure_point raised: recorded as it would be locally
                    cause = getattr(exc, "cause", None)
                    self._results[pid] = cause if isinstance(cause, BaseException) else RuntimeError(_reason(exc))
                except RayActorError as exc:  # the worker died mid-point
                    reason = _reason(exc)
                    pool.kill(slot)
                    if attempt < 2:
                        print(f"ray: {pid}: {slot.name} died ({reason}); retrying once on another worker",
                              file=sys.stderr, flush=True)
                        queue.appendleft((p, pid, attempt + 1))
                    else:
                        self._results[pid] = WorkerDied(f"its worker died on both attempts ({reason})")
                    if queue and len(pool.live()) < min(pool.capacity, len(queue)) and pool.spawned < spawn_budget:
                        pool.spawn()
                    if pid not in self._results:
                        continue
                yield p, pid
            self.references = self._end_references(refs)
        finally:
            for slot, *_ in running.values():  # interrupted: stop work nobody will record
                pool.kill(slot)

    def _end_references(self, refs: dict) -> dict:
        """Each worker's reference after its last point of the sweep (all workers at once), with its start."""
        ends = {name: r["slot"].handle.reference.remote() for name, r in refs.items()
                if r["points"] and not r["slot"].dead}
        out = {}
        for name, r in refs.items():
            if not r["points"]:
                continue
            w = r["slot"].where or {}
            label = f"{name} ({w.get('node')}, {w.get('device_name')} #{w.get('device_index')})"
            try:
                start, end = self.ray.get(r["start"]), self.ray.get(ends[name])
            except Exception as exc:  # noqa: BLE001 - the worker died after its points: no verdict
                print(f"ray: {label}: no drift reference ({_reason(exc)})", file=sys.stderr, flush=True)
                start, end = None, None
            out[label] = {"start": start, "end": end, "points": list(r["points"])}
        return out


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "ray::", "The actor", "Exception")):
            return f"{type(exc).__name__}: {line}"[:200]
    return type(exc).__name__


def experiment_module(config) -> str:
    """The experiment module a sweep's ``config`` belongs to (the module defining its class, e.g.
    ``workbench.experiments.context_compression``): what a Ray worker imports to call its ``measure_point``."""
    return type(config).__module__


def executor_for(experiment: str, config, run_dir=None):
    """The :class:`RayExecutor` for a sweep when ``$WORKBENCH_RAY`` is set, else None.

    Args:
        experiment: the sweep's recorded name (``experiment`` column; may differ from the module's, e.g.
            ``compression`` of ``context_compression``).
        config: the sweep's config dataclass; its class's module is the experiment the workers run.
        run_dir: the run folder (the manifest's ``cluster`` entry).

    None, with a line saying why, when the experiment cannot run on Ray (see :data:`SUPPORTED`).
    """
    address = os.environ.get(ENV)
    if not address:
        return None
    module = experiment_module(config) if dataclasses.is_dataclass(config) else ""
    if module not in SUPPORTED:
        print(f"ray: {experiment} is measured locally in this kernel: its measure_point needs objects of the "
              f"kernel that cannot cross to a worker (on Ray: {', '.join(m.rsplit('.', 1)[-1] for m in SUPPORTED)})",
              file=sys.stderr, flush=True)
        return None
    if config.device == "mps":
        raise ParameterError("--ray: device mps cannot be scheduled on Ray (use cpu or cuda)")
    ray = connect(address)
    return RayExecutor(ray, experiment, config, run_dir)
