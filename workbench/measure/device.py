"""The ground floor: device synchronisation, the device probe, peak memory and the environment facts.

Everything here reads the machine and nothing of the workbench above it (it imports no other workbench
module), so every instrument (:mod:`workbench.measure.generation`, :mod:`workbench.stats.metrics`,
:mod:`workbench.measure.energy`) and the run machinery can use it without an import circle.

- :func:`synchronize`: wait for queued device work before a clock is read (CUDA and MPS are
  asynchronous; nanochat's ``scripts/infer_bench.py`` does the same around every timed call).
- :func:`probe_device`: peak copy bandwidth and matmul FLOP/s, the denominators of MBU / MFU.
- :func:`reset_peak_memory` / :func:`peak_memory_bytes`: a point's peak-memory window.
- :func:`usable_cores`, :func:`supported_dtypes`, :func:`supported_attention` and :func:`threads`: what a
  device can be tuned over (cores, dtypes, attention kernels) and a body run at a thread count.
- :func:`facts` and :func:`git_commit`: versions, threads, code commit, model and probed peaks
  (optimum-benchmark and lm-evaluation-harness record the same next to each run).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time

from workbench.paths import REPO, read_machine_entry, write_machine_entry

PROBE_SPREAD_LIMIT = 0.25  # a probe whose trials spread more than this (max-min over median) is flagged noisy

#: The probe figures recorded in the environment (:func:`facts`).
PROBE_KEYS = ("bandwidth_bytes_per_s", "flops_per_s", "bandwidth_spread", "flops_spread", "probe_trials",
              "probe_noisy", "probe_age_s")
#: A quiet probe stands for the device this long (seconds): another process on this machine (the next notebook's
#: kernel of one ``workbench run``, a test worker) reads it from :data:`PROBE_FILE` instead of probing again
#: (:data:`PROBE_REUSE_ENV` overrides it, read at each probe; 0: always probe). A device's peaks do not move within a
#: run; load does, and a noisy probe is never shared.
PROBE_REUSE_S = 900.0
PROBE_REUSE_ENV = "WORKBENCH_PROBE_REUSE_S"
PROBE_FILE = "device_probe.json"


def synchronize(device_type: str) -> None:
    """Wait for queued device work before a clock is read: CUDA and Apple MPS are asynchronous; CPU is not."""
    if device_type.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    elif device_type.startswith("mps"):
        import torch

        torch.mps.synchronize()


def _timed_trials(fn, device: str, trials: int) -> list[float]:
    out = []
    for _ in range(trials):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def _measure_probe(device: str, dtype: str, trials: int) -> dict:
    """The measurement of :func:`probe_device` (its docstring says what is measured and how)."""
    import numpy as np
    import torch

    dt = getattr(torch, dtype)
    n_bytes = 512 << 20
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    bw = 2 * n_bytes / np.asarray(_timed_trials(lambda: dst.copy_(src), device, trials))
    n = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    bt = b.t()
    a @ bt
    fl = 2 * n**3 / np.asarray(_timed_trials(lambda: a @ bt, device, trials))

    def spread(x):
        return float((x.max() - x.min()) / np.median(x))

    out = {"bandwidth_bytes_per_s": float(np.median(bw)), "flops_per_s": float(np.median(fl)),
           "bandwidth_spread": spread(bw), "flops_spread": spread(fl), "probe_trials": trials,
           "device": device, "dtype": dtype}
    return out


@functools.lru_cache(maxsize=8)
def probe_device(device: str = "cpu", dtype: str = "float32", trials: int = 7) -> dict:
    """Measure peak memory bandwidth and matmul FLOP/s of a device: medians of several trials, with spread.

    Bandwidth: a copy between two 512 MiB buffers (far larger than any last-level cache, so the copy
    streams from memory; read + write = 2 x size bytes per copy), the median of ``trials`` copies after
    one untimed copy. FLOP/s: an ``n x n`` matmul in ``dtype`` (``2 n^3`` FLOPs; ``n = 2048`` on CPU and
    MPS, 8192 on CUDA) in ``nn.Linear``'s layout (``x @ W.T``, the layout every model layer runs; on CPUs
    without bf16 units a bfloat16 ``a @ b`` falls to a path ~10x slower than the layers'), the median of
    ``trials`` after a warm-up. Each figure's spread is
    ``(max - min) / median`` of the per-trial rates; above :data:`PROBE_SPREAD_LIMIT` the probe is
    ``noisy`` (other load ran) and MBU/MFU divided by it deserve doubt. Device synchronisation (CUDA,
    MPS) before every clock read.

    A quiet probe of this device, dtype, trial count and torch thread count that another process on this machine
    measured at most :data:`PROBE_REUSE_S` ago is returned instead of measuring again
    (:func:`workbench.paths.read_machine_entry`; ~1.6 s a process on a 2-core CPU, paid once per kernel before).

    Returns:
        ``{"bandwidth_bytes_per_s", "flops_per_s", "bandwidth_spread", "flops_spread", "probe_trials",
        "probe_noisy" (bool), "probe_age_s" (seconds since it was measured: 0 here, more when read), "device",
        "dtype"}``.
    """
    import torch

    key = f"{device}|{dtype}|{trials}|{torch.get_num_threads()}"
    window_s = float(os.environ.get(PROBE_REUSE_ENV) or PROBE_REUSE_S)
    shared = read_machine_entry(PROBE_FILE, key, window_s) if window_s > 0 else None
    if shared is not None and all(k in shared[1] for k in PROBE_KEYS[:-1]):
        return {**{k: shared[1][k] for k in PROBE_KEYS[:-1]}, "probe_age_s": round(shared[0], 1), "device": device,
                "dtype": dtype}
    out = _measure_probe(device, dtype, trials)
    out["probe_noisy"] = max(out["bandwidth_spread"], out["flops_spread"]) > PROBE_SPREAD_LIMIT
    if not out["probe_noisy"]:
        write_machine_entry(PROBE_FILE, key, {k: out[k] for k in PROBE_KEYS[:-1]})
    out["probe_age_s"] = 0.0
    return out


#: Linux files of the CPU peak-memory window (module constants so a test can stand in a kernel whose reset
#: does nothing, as some sandboxed kernels do: they accept the write to ``clear_refs`` and keep ``VmHWM``).
CLEAR_REFS = "/proc/self/clear_refs"
PROC_STATUS = "/proc/self/status"
RESET_SLACK_BYTES = 16 << 20  # after a reset that took, VmHWM is within this of VmRSS
SAMPLE_INTERVAL_S = 0.005     # the resident-size sampler's period where the high-water mark cannot be reset

_sampler: "_RssSampler | None" = None


def _status_bytes(*keys: str) -> dict[str, int]:
    out = {}
    try:
        with open(PROC_STATUS) as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in keys:
                    out[key] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def _rss_bytes() -> int | None:
    """The process's resident size now (``VmRSS``; ``psutil`` where there is no ``/proc``)."""
    rss = _status_bytes("VmRSS").get("VmRSS")
    if rss is None:
        try:
            import psutil

            rss = int(psutil.Process().memory_info().rss)
        except Exception:
            return None
    return rss


class _RssSampler:
    """A daemon thread that reads the resident size every :data:`SAMPLE_INTERVAL_S` and keeps the largest.

    The fallback where the kernel's high-water mark cannot be reset; optimum-benchmark's memory tracker
    polls the same way. It misses a spike shorter than one period, so its method is named apart.
    """

    def __init__(self):
        import threading

        self.peak = _rss_bytes() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss-sampler", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            rss = _rss_bytes()
            if rss is not None and rss > self.peak:
                self.peak = rss

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=1.0)
        return max(self.peak, _rss_bytes() or 0)


def _stop_sampler() -> int | None:
    global _sampler
    if _sampler is None:
        return None
    peak, _sampler = _sampler.stop(), None
    return peak


def reset_peak_memory(device: str) -> None:
    """Start a new peak-memory window (call before a point's first run).

    CUDA: ``torch.cuda.reset_peak_memory_stats``. Linux CPU: writing ``5`` to ``/proc/self/clear_refs``
    resets the process's resident high-water mark ``VmHWM`` (proc(5)); the reset is checked (afterwards
    ``VmHWM`` must be within :data:`RESET_SLACK_BYTES` of ``VmRSS``), and where it did not take (a sandboxed
    kernel that accepts the write and ignores it) or there is no ``/proc``, a thread samples the resident
    size every :data:`SAMPLE_INTERVAL_S` until :func:`peak_memory_bytes` reads the window. A window still
    open from before is closed first.
    """
    _stop_sampler()
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
        return
    if device.startswith("mps"):
        return
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
    except OSError:
        pass
    mem = _status_bytes("VmHWM", "VmRSS")
    if "VmHWM" in mem and "VmRSS" in mem and mem["VmHWM"] - mem["VmRSS"] <= RESET_SLACK_BYTES:
        return
    global _sampler
    _sampler = _RssSampler()


def peak_memory_bytes(device: str) -> tuple[int | None, str]:
    """Peak memory since :func:`reset_peak_memory`, and how it was measured (closes the window).

    Returns:
        ``(bytes, method)``: CUDA ``torch.cuda.max_memory_allocated`` (``cuda_max_allocated``); CPU, where
        the kernel's high-water mark was reset, ``VmHWM`` of ``/proc/self/status`` (``vmhwm``: the whole
        process, weights included); where it could not be reset, the largest resident size sampled over the
        window (``rss_sampled``: whole process, may miss a spike shorter than :data:`SAMPLE_INTERVAL_S`);
        else ``(None, "unavailable")`` - never the current size, nor a lifetime peak, passed off as the
        window's peak.
    """
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
    sampled = _stop_sampler()
    if sampled is not None:
        return sampled, "rss_sampled"
    if device.startswith("mps"):
        return None, "unavailable"
    hwm = _status_bytes("VmHWM").get("VmHWM")
    return (hwm, "vmhwm") if hwm is not None else (None, "unavailable")


def git_commit() -> str | None:
    """The workbench's git commit (with ``-dirty`` when the tree has changes), or None outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return None


def facts(info=None, seed: int | None = None, probe: bool = True, prior: dict | None = None) -> dict:
    """What a measurement ran on: versions, threads, git commit, device and its probed bandwidth / FLOP/s.

    Args:
        info: :class:`workbench.measure.models.ModelInfo` of the loaded model, or None (then no model, device or
            probe figures).
        seed: the run's base seed.
        probe: run :func:`probe_device` (seconds, cached per process) when ``prior`` has no figures.
        prior: probe figures (:data:`PROBE_KEYS`) already measured on this device and dtype (e.g. by the
            run's current session, :func:`workbench.run.results.environment`); used instead of a new probe.

    Returns:
        A flat dict: ``python``, ``platform``, ``torch``, ``transformers``, ``workbench``, ``git_commit``,
        ``torch_threads``, ``omp_num_threads``, ``omp_wait_policy``, ``cpu_count``, ``seed``; with ``info``
        also the model facts (``model``, ``model_path``, ``model_sha256``, ``num_params``, ``weight_bytes``,
        ``dtype``, ``device``, ``device_name``) and the probe figures.
    """
    import platform

    import torch
    import transformers

    from workbench import __version__

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "workbench": __version__,
        "git_commit": git_commit(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "cpu_count": os.cpu_count(),
        "seed": seed,
    }
    if info is not None:
        env.update(
            model=info.name,
            model_path=info.path,
            model_sha256=info.weights_sha256,
            num_params=info.num_params,
            weight_bytes=info.weight_bytes,
            dtype=info.dtype,
            device=info.device,
            device_name=info.device_name,
        )
        if prior:
            env.update(prior)
        elif probe:
            dev = "cuda" if info.device.startswith("cuda") else info.device
            p = probe_device(dev, info.dtype)
            env.update({k: p[k] for k in PROBE_KEYS if k in p})
    return env


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask), the ceiling of ``torch_threads``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def supported_dtypes(device: str) -> tuple[str, ...]:
    """Dtypes worth tuning on a device: float32 and bfloat16 on CPU; plus float16 on CUDA and MPS (bfloat16 on
    CUDA only where the GPU supports it)."""
    if device == "cpu":
        return ("float32", "bfloat16")
    if device == "cuda":
        import torch

        return ("float32", "bfloat16", "float16") if torch.cuda.is_bf16_supported() else ("float32", "float16")
    return ("float32", "float16")


def supported_attention(device: str) -> tuple[str, ...]:
    """Attention kernels the installed ``transformers`` offers on a device: ``eager`` and ``sdpa`` everywhere;
    on CUDA also ``flex_attention`` and ``flash_attention_2``/``_3`` when the ``flash_attn`` package is
    installed (FlashAttention kernels are CUDA-only)."""
    out = ["eager", "sdpa"]
    if device == "cuda":  # transformers' registry only here: the command line validates without importing it
        import importlib.util

        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        out += [k for k in ("flex_attention",) if k in ALL_ATTENTION_FUNCTIONS]
        if importlib.util.find_spec("flash_attn") is not None:
            out += [k for k in ("flash_attention_2", "flash_attention_3") if k in ALL_ATTENTION_FUNCTIONS]
    return tuple(out)


@contextlib.contextmanager
def threads(n: int | None):
    """Run the body with ``torch.set_num_threads(n)`` (None: unchanged), restoring the previous count."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
