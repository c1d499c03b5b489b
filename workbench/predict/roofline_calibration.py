"""The roofline's calibration and the predictor that carries it: the fit of the overheads and efficiencies of
:mod:`workbench.predict.roofline`'s model to measured runs (:func:`fit_calibration`, with its leave-one-workload-out
error), the calibration workload and its measurement on a loaded model (:func:`calibrate`), the per-machine cache
(:func:`cache_path`, :func:`load_cached`), the check of a cached calibration against today's device probe
(:func:`check_calibration`, :func:`checked_cached`: kept, rescaled or refitted), and :class:`Predictor`, one
model's shape, probe and calibration per dtype for the planner and the experiments; :func:`dtype_peaks` and
:func:`measured_utilisation` give a point's MBU / MFU over the peaks of the dtype it ran in. The formulas, the model
shape, the device and the :class:`~workbench.predict.roofline.Calibration` record are
:mod:`workbench.predict.roofline`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.predict.roofline import (
    BYTES_PER_ELEMENT,
    CALIBRATION_VERSION,
    RECALIBRATE_LIMIT,
    REFIT_LIMIT,
    Calibration,
    Device,
    ModelShape,
    decode_terms,
    predict,
    prefill_terms,
)
from workbench.stats import metrics

# ----------------------------------------------------------------------------- calibration


def _fit(roof_mem: Sequence[float], roof_comp: Sequence[float], measured: Sequence[float], overlap: bool
         ) -> tuple[float, float]:
    """``(overhead_s, efficiency)`` minimising the squared error of ``o + combine(mem, comp / eta)``.

    ``eta`` on a log grid in [0.01, 2]; for each, ``o`` is the mean residual clamped at 0 (an overhead is never
    negative).
    """
    mem, comp, y = (np.asarray(v, dtype=float) for v in (roof_mem, roof_comp, measured))
    keep = np.isfinite(y)
    mem, comp, y = mem[keep], comp[keep], y[keep]
    if y.size == 0:
        return 0.0, 1.0
    if not overlap and comp.any():
        # y - mem = o + k comp is linear: least squares, then o >= 0 and k > 0 enforced
        X = np.column_stack([np.ones_like(comp), comp])
        (o, k), *_ = np.linalg.lstsq(X, y - mem, rcond=None)
        if o < 0:
            o, k = 0.0, float((comp * (y - mem)).sum() / (comp**2).sum())
        if k > 0:
            return float(o), float(min(1.0 / k, 2.0))
    best = (math.inf, 0.0, 1.0)
    for grid in (np.geomspace(0.01, 2.0, 200), None):
        if grid is None:  # refine around the coarse optimum
            grid = np.geomspace(best[2] / 1.05, min(best[2] * 1.05, 2.0), 200)
        for eta in grid:
            core = np.maximum(mem, comp / eta) if overlap else mem + comp / eta
            o = max(0.0, float(np.mean(y - core)))
            sse = float(((o + core - y) ** 2).sum())
            if sse < best[0]:
                best = (sse, o, float(eta))
    return best[1], best[2]


def fit_calibration(shape: ModelShape, device: Device, runs: pd.DataFrame) -> Calibration:
    """Fit a :class:`~workbench.predict.roofline.Calibration` from measured runs, with its in-sample and
    out-of-sample error.

    The out-of-sample error is leave-one-workload-out: each distinct (batch, prompt) workload is predicted by
    a fit on the others, and the median ``|predicted / measured - 1|`` over those held-out runs is the error to
    quote (with four workloads for the decode fit's four coefficients the fit is exact and its in-sample error
    near 0 says nothing; :data:`CALIBRATION_RUNS` has six).

    Args:
        runs: one row per measured request with ``batch_size``, ``prompt_tokens``, ``output_tokens``,
            ``prefill_s``, ``ttft_s``, ``tpot_s``.
    """
    calib = _fit_calibration(shape, device, runs)
    keys = list(zip(runs["batch_size"], runs["prompt_tokens"])) if len(runs) else []
    workloads = list(dict.fromkeys(keys))
    ttft_in, tpot_in = _errors(shape, device, calib, runs)
    held_ttft, held_tpot = [], []
    if len(workloads) > 1:
        for w in workloads:
            out = np.array([k == w for k in keys])
            fit = _fit_calibration(shape, device, runs[~out])
            t, p = _errors(shape, device, fit, runs[out], median=False)
            held_ttft += t
            held_tpot += p
    med = (lambda v: float(np.median(v)) if len(v) else float("nan"))
    return dataclasses.replace(calib, workloads=len(workloads), in_sample_ttft_error=ttft_in,
                               in_sample_tpot_error=tpot_in, loo_ttft_error=med(held_ttft),
                               loo_tpot_error=med(held_tpot))


def _errors(shape: ModelShape, device: Device, calib: Calibration, runs: pd.DataFrame, median: bool = True):
    """``|predicted / measured - 1|`` of TTFT and TPOT over ``runs`` (their medians, or the lists)."""
    ttft, tpot = [], []
    for r in runs.itertuples():
        p = predict(shape, device, calib, r.batch_size, r.prompt_tokens, r.output_tokens)
        for out, m, q in ((ttft, r.ttft_s, p["predicted_ttft_s"]), (tpot, r.tpot_s, p["predicted_tpot_s"])):
            if m and m > 0 and math.isfinite(m) and math.isfinite(q):
                out.append(abs(q / m - 1))
    if not median:
        return ttft, tpot
    return (float(np.median(ttft)) if ttft else float("nan")), (float(np.median(tpot)) if tpot else float("nan"))


def _fit_calibration(shape: ModelShape, device: Device, runs: pd.DataFrame) -> Calibration:
    """The fit itself (see :func:`fit_calibration`)."""
    bw, fl = device.bandwidth_bytes_per_s, device.flops_per_s
    pre = [prefill_terms(shape, r.batch_size, r.prompt_tokens) for r in runs.itertuples()]
    po, pe = _fit([b / bw for b, _ in pre], [f / fl for _, f in pre], runs["prefill_s"], device.overlap)
    tt = float(np.nanmedian(runs["ttft_s"] - runs["prefill_s"])) if len(runs) else 0.0
    ctx = [r.prompt_tokens + r.output_tokens / 2 for r in runs.itertuples()]
    if device.overlap:
        dec = [decode_terms(shape, r.batch_size, c) for r, c in zip(runs.itertuples(), ctx)]
        do, de = _fit([b / bw for b, _ in dec], [f / fl for _, f in dec], runs["tpot_s"], True)
        return Calibration(po, pe, do, de, max(tt, 0.0), True)
    # CPU: tpot - weights/bw - compute/(eta_p F) = o + r B + m kv_bytes/bw, non-negative least squares
    weights_s = shape.weight_bytes / bw
    comp_s = np.array([decode_terms(shape, r.batch_size, c)[1] / fl / pe for r, c in zip(runs.itertuples(), ctx)])
    kv_s = np.array([shape.kv_cache_bytes_per_token() * r.batch_size * c / bw for r, c in zip(runs.itertuples(), ctx)])
    y = np.asarray(runs["tpot_s"], dtype=float) - weights_s - comp_s
    keep = np.isfinite(y)
    if not keep.any():
        return Calibration(po, pe, 0.0, pe, max(tt, 0.0), True)
    batch = np.asarray(runs["batch_size"], dtype=float)
    X = np.column_stack([np.ones(len(y)), batch, kv_s, (batch > 1).astype(float)])[keep]
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)  # nnls on unit-scaled columns (seconds vs bytes/bw)
    from scipy.optimize import nnls

    coef = nnls(X / scale, y[keep])[0] / scale
    return Calibration(po, pe, float(coef[0]), pe, max(tt, 0.0), True, step_row_overhead_s=float(coef[1]),
                       kv_traffic=float(coef[2]), batched_step_overhead_s=float(coef[3]))


#: The calibration workload: (batch, prompt tokens); a short batch-1 prompt pins the fixed overheads, a long
#: batch-1 prompt the prefill compute slope and the KV traffic (context), a short batch of 2 the GEMV -> GEMM
#: switch (``batched_step_overhead_s``), a batch of 8 the per-row cost (the
#: default CPU suite's batches 1-16 are then inter- or mildly extrapolated); a pair of batch 1 and 2 at 64 tokens
#: makes six workloads, two more than the decode fit's four coefficients, so the fit is not exact and each workload
#: can be held out (:func:`fit_calibration`); of the pairs tried on synthetic data with 3% noise, a same-context
#: batch 1/2 pair pinned the kernel-switch term best. 8 new tokens each, one warm-up and two timed repeats.
CALIBRATION_RUNS = ((1, 32), (1, 384), (2, 32), (8, 96), (1, 64), (2, 64))
#: Half the tokens, same levers: for a dtype the CPU runs without native units (bfloat16 without AVX512-BF16/AMX
#: is several times slower than float32), so its calibration takes about as long (with ``repeats=1``).
CALIBRATION_RUNS_SMALL = ((1, 32), (1, 192), (2, 32), (4, 64), (1, 64), (2, 64))
CALIBRATION_NEW_TOKENS = 8


def cache_path(model_path: str, device: str, dtype: str, threads: int) -> Path:
    """Where the calibration of this (model folder, device, dtype, threads) is cached."""
    import hashlib

    from workbench.paths import cache_root

    key = hashlib.sha256(f"{Path(model_path).resolve()}|{device}|{dtype}|{threads}".encode()).hexdigest()[:16]
    return cache_root() / "roofline" / f"{key}.json"


def calibrate(loaded, repeats: int = 2, save: bool = True, trials: int = 7,
              runs: Sequence[tuple[int, int]] = CALIBRATION_RUNS) -> tuple[Device, Calibration]:
    """Probe the device (``trials`` per figure) and fit the overheads on the loaded model (``runs``: (batch,
    prompt tokens), ``repeats`` timed runs each) (a dtype the CPU has no native units for, e.g. bfloat16 without AVX512-BF16/AMX, is slower: use :data:`CALIBRATION_RUNS_SMALL`,
    ``repeats=1, trials=3``).

    Returns:
        ``(device, calibration)``; saved to :func:`cache_path` when ``save`` (read back by :func:`load_cached`).
    """
    import torch

    from workbench.inputs.prompts import build_batch
    from workbench.measure.generation import GenerationSettings, generate_measured, warm_up

    t0 = time.perf_counter()
    info = loaded.info
    dev = Device.probe(info.device.split(":")[0] if info.device.startswith("cpu") else info.device, info.dtype,
                       trials)
    shape = shape_of(info)
    settings = GenerationSettings(max_new_tokens=CALIBRATION_NEW_TOKENS, ignore_eos=True)
    rows = []
    for B, L in runs:
        prompts = build_batch(loaded.tokenizer, B, L)
        warm_up(loaded, prompts, settings, 1)
        for _ in range(repeats):
            rec = generate_measured(loaded, prompts, settings).records[0]
            rows.append({"batch_size": B, "prompt_tokens": rec["prompt_tokens"], "output_tokens": rec["output_tokens"],
                         "prefill_s": rec["prefill_s"], "ttft_s": rec["ttft_s"], "tpot_s": rec["tpot_s"]})
    calib = dataclasses.replace(fit_calibration(shape, dev, pd.DataFrame(rows)),
                                calibration_s=time.perf_counter() - t0)
    if save:
        save_calibration(cache_path(info.path, dev.name, info.dtype, torch.get_num_threads()), dev, calib, rows)
        _CHECKED[_checked_key(info.path, dev.name, info.dtype, torch.get_num_threads())] = (dev, calib)
    return dev, calib


#: How many calibrations a cache file keeps (the newest and the ones it replaced): a machine whose speed swings
#: between states (a shared VM: its probed bandwidth 1.5x apart within an hour, results/LOG.md 2026-12-07 (evening))
#: finds the one fitted in a state like today's instead of refitting (~20-45 s) at each swing.
KEPT_CALIBRATIONS = 4


def _kept(path: Path) -> list[tuple[dict, dict]]:
    """``[(device dict, calibration dict)]`` in a cache file, newest first, of the current
    :data:`CALIBRATION_VERSION` only; [] when there is no readable file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = [data, *(data.get("earlier") or [])]
    return [(e["device"], e["calibration"]) for e in entries
            if isinstance(e, dict) and "device" in e and e.get("calibration", {}).get("version") == CALIBRATION_VERSION]


def save_calibration(path: Path, dev: Device, calib: Calibration, runs: list[dict] | None = None) -> None:
    """Write a calibration to its cache file as the newest, keeping the :data:`KEPT_CALIBRATIONS` - 1 newest of
    those the file held (their probes and fits; ``runs``, the measured rows, only for the newest)."""
    from workbench.paths import write_cache_text

    earlier = [{"device": d, "calibration": c} for d, c in _kept(path)][:KEPT_CALIBRATIONS - 1]
    write_cache_text(path, json.dumps({"device": dataclasses.asdict(dev), "calibration": dataclasses.asdict(calib),
                                       "runs": runs or [], "earlier": earlier}, indent=1))


def probe_distance(a: Device, b: Device) -> float:
    """How far apart two probes of a device are: the larger absolute log ratio of their bandwidths and of their
    matmul FLOP/s (0: the same; ln 1.5 = 0.41: one 1.5x the other); inf when a figure is missing."""
    out = 0.0
    for x, y in ((a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s), (a.flops_per_s, b.flops_per_s)):
        if not (x and y and x > 0 and y > 0):
            return math.inf
        out = max(out, abs(math.log(x / y)))
    return out


def load_cached(model_path: str, device: str, dtype: str, threads: int,
                nearest_to: Device | None = None) -> tuple[Device, Calibration] | None:
    """A saved calibration of this (model folder, device, dtype, threads), or None.

    Args:
        nearest_to: today's probe: of the :data:`KEPT_CALIBRATIONS` the file keeps, the one whose own probe is
            nearest (:func:`probe_distance`; the newest among equals); None: the newest.
    """
    kept = _kept(cache_path(model_path, device, dtype, threads))
    if not kept:
        return None   # none, or fitted by an older model: refit
    pairs = [(Device(**d), Calibration(**c)) for d, c in kept]
    if nearest_to is None:
        return pairs[0]
    return min(pairs, key=lambda pair: probe_distance(pair[0], nearest_to))


def check_calibration(cached: tuple[Device, Calibration], today: Device, loaded=None,
                      limit: float = RECALIBRATE_LIMIT, **calibrate_kwargs) -> tuple[Device, Calibration]:
    """Check a cached calibration against today's device probe, and rescale or refit it when the machine moved.

    A calibration fitted on a slower day over-predicts a faster one by 30-60% (overheads and achieved
    FLOP/s are the day's). When today's bandwidth or matmul FLOP/s differs from the cached probe's by more
    than ``limit``: beyond :data:`REFIT_LIMIT` and with ``loaded`` the calibration is refitted (:func:`calibrate`,
    cached again); otherwise (or without a model) it is rescaled: today's probe replaces the cached one and every fixed overhead (seconds of CPU work:
    Python, dispatch, sampling) scales by ``cached FLOP/s / today's FLOP/s``. ``Calibration.check`` records
    which happened (``kept``, ``rescaled``, ``refit``) with the probe ratios.

    Args:
        cached: ``(device, calibration)`` of :func:`load_cached`.
        today: a fresh :meth:`~workbench.predict.roofline.Device.probe` in the same dtype.
        loaded: the model, to refit (None: rescale).
        calibrate_kwargs: passed to :func:`calibrate` when refitting.

    Returns:
        ``(device, calibration)`` to predict with.
    """
    dev, calib = cached
    bw = today.bandwidth_bytes_per_s / dev.bandwidth_bytes_per_s if dev.bandwidth_bytes_per_s else float("nan")
    fl = today.flops_per_s / dev.flops_per_s if dev.flops_per_s else float("nan")
    ratios = f"today's probe / cached: bandwidth {bw:.2f}x, FLOP/s {fl:.2f}x"
    if all(math.isfinite(x) and abs(x - 1) <= limit for x in (bw, fl)):
        return dev, dataclasses.replace(calib, check=f"kept ({ratios}, within {limit:.0%})")
    if loaded is not None and not all(math.isfinite(x) and abs(x - 1) <= REFIT_LIMIT for x in (bw, fl)):
        new_dev, new = calibrate(loaded, **calibrate_kwargs)
        note = f"refit ({ratios}, beyond {limit:.0%})"
        print(f"roofline ({today.name}, {today.dtype}): cached calibration {note}", file=sys.stderr)
        return new_dev, dataclasses.replace(new, check=note)
    k = 1.0 / fl if math.isfinite(fl) and fl > 0 else 1.0
    scaled = dataclasses.replace(
        calib, prefill_overhead_s=calib.prefill_overhead_s * k, step_overhead_s=calib.step_overhead_s * k,
        ttft_overhead_s=calib.ttft_overhead_s * k, step_row_overhead_s=calib.step_row_overhead_s * k,
        batched_step_overhead_s=calib.batched_step_overhead_s * k,
        check=f"rescaled ({ratios}, beyond {limit:.0%}; overheads x{k:.2f}, today's probe)")
    print(f"roofline ({today.name}, {today.dtype}): cached calibration {scaled.check}", file=sys.stderr)
    return dataclasses.replace(today, threads=dev.threads, overlap=dev.overlap, name=dev.name), scaled


#: (calibration file, its mtime) -> the ``(device, calibration)`` checked (or fitted) in this process. A
#: run's notebooks share one kernel, so the check - a probe, and a refit when the machine moved - is paid
#: once per run; without it each notebook compared the 3-trial probe with the refit's own 7-trial probe and, on a
#: noisy day, refitted again (two refits in notebooks 01-02 of one quick run).
_CHECKED: dict = {}


def _checked_key(model_path, device: str, dtype: str, threads: int) -> tuple:
    """The calibration file and its modification time: a file written since (another process, a test's own
    cache folder) is checked afresh."""
    path = cache_path(model_path, device, dtype, int(threads))
    try:
        return str(path), path.stat().st_mtime_ns
    except OSError:
        return str(path), None


def checked_cached(model_path: str, device: str, dtype: str, threads: int, loaded=None,
                   **calibrate_kwargs) -> tuple[Device, Calibration] | None:
    """The cached calibration whose probe is nearest today's (:func:`load_cached` ``nearest_to``), checked against
    today's probe of the device (:func:`check_calibration`): the process's one
    :func:`workbench.measure.device.probe_device` (7 trials), the same the run's environment record takes, or None
    when nothing is cached.

    Once per process: a later call for the same model, device, dtype and threads returns the first one's result
    (or the calibration :func:`calibrate` fitted since). When today's probe is itself noisy (its trials spread
    beyond :data:`workbench.measure.device.PROBE_SPREAD_LIMIT`: other load), a moved machine is rescaled, not refitted:
    a refit measured under that load would be cached and mislead later runs.
    """
    key = _checked_key(model_path, device, dtype, threads)
    if key in _CHECKED:
        return _CHECKED[key]
    if load_cached(model_path, device, dtype, threads) is None:
        return None
    today = Device.probe(device, dtype)
    cached = load_cached(model_path, device, dtype, threads, nearest_to=today)
    noisy = bool(getattr(today, "noisy", False))
    out = check_calibration(cached, today, None if noisy else loaded, **calibrate_kwargs)
    if noisy and loaded is not None and out[1].check.startswith("rescaled"):
        out = out[0], dataclasses.replace(out[1], check=out[1].check + "; today's probe noisy: not refitted")
    _CHECKED[key] = out
    return out


def shape_of(info) -> ModelShape:
    """A :class:`~workbench.predict.roofline.ModelShape` from a loaded model's
    :class:`workbench.measure.models.ModelInfo`."""
    from workbench.measure import models

    cfg = models.read_model_config(info.path)
    base = ModelShape.from_config(cfg, info.dtype if info.dtype in BYTES_PER_ELEMENT else "float32")
    return dataclasses.replace(base, num_params=int(info.num_params),
                               num_non_embedding_params=int(info.num_non_embedding_params))


# ----------------------------------------------------------------------------- the planner


@dataclasses.dataclass
class Predictor:
    """Predictions for one model on this machine: the shape, the probed device and a calibration (of
    ``shape.dtype``); other dtypes through :meth:`for_dtype`.

    Attributes:
        model_path: the model folder, to find other dtypes' cached calibrations (None: none looked up).
    """

    shape: ModelShape
    device: Device
    calib: Calibration
    probe: bool = True
    model_path: str | None = None
    _devices: dict = dataclasses.field(default_factory=dict)

    def add(self, dtype: str, device: Device, calib: Calibration) -> None:
        """Use this probe and calibration for ``dtype`` points (e.g. a fresh :func:`calibrate` in that dtype)."""
        self._devices[dtype] = (device, calib)

    def for_dtype(self, dtype: str | None) -> tuple[ModelShape, Device, Calibration]:
        """``(shape, device, calibration)`` for ``dtype`` points: the dtype's own cached calibration when there
        is one (:func:`load_cached`), else its probed matmul FLOP/s (2 trials, so ``plan`` stays quick) with the
        base calibration's overheads and the base probe's bandwidth."""
        if not dtype or dtype in ("auto", self.shape.dtype):
            return self.shape, self.device, self.calib
        if dtype not in self._devices:
            cached = load_cached(self.model_path, self.device.name, dtype, torch_threads()) if self.model_path else None
            if cached is not None and self.probe:
                cached = check_calibration(cached, Device.probe(self.device.name, dtype, trials=2))
            if cached is None:
                dev = self.device
                p = Device.probe(dev.name, dtype, trials=2) if self.probe else dataclasses.replace(dev, dtype=dtype)
                cached = (dataclasses.replace(p, bandwidth_bytes_per_s=dev.bandwidth_bytes_per_s, threads=dev.threads),
                          self.calib)
            self._devices[dtype] = cached
        dev, calib = self._devices[dtype]
        return self.shape.with_dtype(dtype), dev, calib

    def calibrated_dtype(self, dtype: str | None) -> str | None:
        """The dtype whose calibration ``dtype`` points use (None: uncalibrated pure roofline)."""
        _, dev, calib = self.for_dtype(dtype)
        if not calib.calibrated:
            return None
        return self.shape.dtype if calib is self.calib else dtype

    def predict(self, batch_size: int, prompt_tokens: int, output_tokens: int, dtype: str | None = None,
                threads: int | None = None) -> dict:
        """:func:`~workbench.predict.roofline.predict` for a point in ``dtype`` (default: the base dtype), see
        :meth:`for_dtype`."""
        shape, dev, calib = self.for_dtype(dtype)
        return predict(shape, dev, calib, batch_size, prompt_tokens, output_tokens, threads)

    @classmethod
    def for_model(cls, spec: str = "default", device: str = "cpu", dtype: str = "float32",
                  probe: bool = True) -> "Predictor":
        """Config-only predictor (no weights load): the cached calibration when there is one, else the pure
        roofline on a fresh probe (``probe=False``: nominal 10 GB/s and 50 GFLOP/s, for tests)."""
        import torch

        from workbench.measure import models

        dtype = "float32" if dtype == "auto" and device == "cpu" else dtype
        dtype = "bfloat16" if dtype == "auto" else dtype
        shape = ModelShape.from_model(spec, dtype)
        path = str(models.resolve_model_path(spec))
        cached = load_cached(path, device, dtype, torch.get_num_threads())
        if cached is not None and probe:
            cached = check_calibration(cached, Device.probe(device, dtype))
        if cached is not None:
            return cls(shape, *cached, probe=probe, model_path=path)
        dev = Device.probe(device, dtype) if probe else Device(10e9, 50e9, torch.get_num_threads(),
                                                                overlap=device != "cpu", name=device, dtype=dtype)
        return cls(shape, dev, Calibration(), probe=probe, model_path=path)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ----------------------------------------------------------------------------- utilisation in a point's own dtype


_PEAKS: dict = {}


def dtype_peaks(device: str, dtype: str, threads: int | None = None,
                predictor: Predictor | None = None) -> dict:
    """Peak bandwidth and FLOP/s of ``device`` for a model in ``dtype``: the predictor's probe of that dtype
    (:meth:`Predictor.for_dtype`), else a fresh
    :meth:`workbench.predict.roofline.Device.probe` in that dtype (3 trials, memoised); FLOP/s scaled to ``threads`` (:meth:`~workbench.predict.roofline.Device.flops_at`).

    Returns:
        ``{"bandwidth_bytes_per_s", "flops_per_s"}``.
    """
    if predictor is not None:
        dev = predictor.for_dtype(dtype)[1]
    else:
        key = (device, dtype)
        if key not in _PEAKS:
            _PEAKS[key] = Device.probe(device, dtype)
        dev = _PEAKS[key]
    return {"bandwidth_bytes_per_s": dev.bandwidth_bytes_per_s, "flops_per_s": dev.flops_at(threads)}


def measured_utilisation(loaded, requests: list[dict], point: dict,
                         predictor: Predictor | None = None) -> dict:
    """MBU and MFU of a point from the model it measured (``loaded``: the configuration's dtype, so its weight
    and KV bytes) over the peaks probed in that dtype (:func:`dtype_peaks`), the formulas of
    :func:`workbench.stats.metrics.utilisation`. The sweep's own figures use the notebook's model (float32): for a
    bfloat16 point they counted twice the bytes and divided by float32's FLOP/s; these columns replace them.

    Returns:
        ``mbu``, ``mfu``, ``peak_bandwidth_bytes_per_s``, ``peak_flops_per_s`` (empty without requests).
    """
    req = pd.DataFrame(requests)
    if req.empty:
        return {}
    done = req[req["output_tokens"] >= 1]
    summary = {f"{c}_p50": metrics.percentiles(done[c].tolist() if c in done else [], (50,))["p50"]
               for c in ("tpot_s", "prefill_s")}
    peaks = dtype_peaks(loaded.info.device.split(":")[0], loaded.info.dtype, point.get("torch_threads"), predictor)
    return metrics.utilisation(req, summary, loaded.info, peaks)


def predictor_for(loaded, model: str, device: str, dtypes: Sequence[str], calibrate_dtypes: bool = True) -> "Predictor":
    """The roofline for ``loaded``'s model with one calibration per dtype of ``dtypes``: the cached one (checked
    against today's probe and refitted when off by more than 15%, :func:`check_calibration`), else
    (``calibrate_dtypes``) a fresh one on ``model`` loaded on ``device`` in that dtype (the small workload, one
    repeat, 3 probe trials); a dtype left uncalibrated uses its own probed FLOP/s with ``loaded``'s overheads
    (:meth:`Predictor.for_dtype`)."""
    from workbench.measure import models

    info = loaded.info
    dev = info.device.split(":")[0]
    threads = torch_threads()
    # a cached calibration is checked against today's probe and refitted (or, not calibrating, rescaled) when off
    cached = checked_cached(info.path, dev, info.dtype, threads, loaded if calibrate_dtypes else None)
    if cached is None and calibrate_dtypes:
        cached = calibrate(loaded)
    if cached is None:
        cached = (Device.probe(dev, info.dtype), Calibration())
    predictor = Predictor(shape_of(info), *cached, model_path=info.path)
    small = dict(repeats=1, trials=3, runs=CALIBRATION_RUNS_SMALL)
    for dtype in dtypes:
        if dtype != info.dtype and calibrate_dtypes:
            other = models.load_model(model, device, dtype)
            got = checked_cached(info.path, dev, dtype, threads, other, **small)
            predictor.add(dtype, *(got or calibrate(other, **small)))
    return predictor
