"""Sweeps: the shared config fields, parameter grids and the point loop.

A sweep is a list of points (dicts of parameter values). :func:`run_sweep`
measures each point with a caller's ``measure`` function, aggregates it with
:func:`workbench.metrics.summarize_point`, and writes the rows to the run folder
as soon as the point finishes. A point that raises is recorded
``failed: <reason>`` and the loop goes on; ``resume=True`` skips points already
recorded ``ok``.

Each experiment (``workbench/experiments/``) subclasses :class:`SweepConfig` and calls
:func:`run_sweep`; papermill execution and parameter checking live in :mod:`workbench.notebooks`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import math
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Callable

import pandas as pd

from . import checks, distributed, energy, metrics, models, results
from .errors import ParameterError
from .generation import GenerationSettings, generate_measured, warm_up

REPO = Path(__file__).resolve().parents[1]
SUITES_DIR = REPO / "suites"

#: Columns every request row carries (None when an experiment has no value for it).
REQUEST_COLUMNS = (
    "run_id", "experiment", "point_id", "repeat", "request_id", "model", "model_path", "device", "dtype",
    "batch_size", "context_tokens", "prompt_tokens", "max_new_tokens", "temperature", "top_p", "do_sample", "seed",
    "reasoning_budget", "compression", "compressed_tokens", "ttft_s", "prefill_s", "e2e_s", "tpot_s",
    "decode_tps", "output_tokens", "thinking_tokens", "answer_tokens", "ttfat_s", "finish_reason", "itl_s",
    "error",
)


# ----------------------------------------------------------------------------- configs


@dataclasses.dataclass
class SweepConfig:
    """Fields every experiment shares; subclasses add theirs and validate in ``__post_init__``.

    Attributes:
        model: ``default`` (embedded SmolLM2-135M-Instruct), a local directory or a cached hub id.
        device: ``auto``, ``cpu``, ``cuda`` or ``mps``.
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        repeats: timed repetitions of each point (>= 1).
        warmup: untimed warm-up runs before each point (>= 0).
        seed: base seed; repeat ``r`` uses ``seed + r``.

    Raises:
        ParameterError: any invalid field (checked without loading the model).
    """

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    repeats: int = 1
    warmup: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.device not in models.DEVICES:
            checks.check_choice("device", self.device, models.DEVICES)
        if self.dtype not in models.DTYPES:
            raise ParameterError(f"dtype: must be one of {', '.join(models.DTYPES)} (got {self.dtype!r})")
        checks.check_int("repeats", self.repeats, 1)
        checks.check_int("warmup", self.warmup, 0)
        checks.check_seed("seed", self.seed)
        if self.model != models.DEFAULT_MODEL:
            models.resolve_model_path(self.model)
        models.pick_device(self.device)  # a device this machine lacks fails here, before any kernel starts

    def max_context(self) -> int:
        """The model's maximum context in tokens (from its config; no weights load)."""
        return models.max_context_tokens(self.model)

    @classmethod
    def from_namespace(cls, ns: dict):
        """Build the config from a mapping (a notebook's ``globals()``), taking this class's field names."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in ns.items() if k in names})


# ----------------------------------------------------------------------------- the point loop


def expand_grid(**axes) -> list[dict]:
    """Cartesian product of the axes, first axis outermost: ``expand_grid(a=[1,2], b=[3])``
    -> ``[{"a": 1, "b": 3}, {"a": 2, "b": 3}]``.

    Raises:
        ParameterError: an axis that is not a non-empty list.
    """
    for name, values in axes.items():
        if not isinstance(values, (list, tuple)) or len(values) == 0:
            raise ParameterError(f"{name}: must be a non-empty list (got {values!r})")
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def point_id(experiment: str, point: dict) -> str:
    """A stable id such as ``batch_size/prompt_tokens=128,batch_size=4``."""
    return experiment + "/" + ",".join(f"{k}={point[k]}" for k in point)


def measure_generation(loaded, prompts, settings: GenerationSettings, repeats: int = 1, warmup: int = 1, **kwargs) -> dict:
    """Measure one plain batch: ``warmup`` untimed runs, then ``repeats`` timed ones.

    Warm-up: :func:`workbench.generation.warm_up` (same prompts, same shapes).
    Repeat ``r`` uses seed ``settings.seed + r``. ``kwargs`` go to
    :func:`workbench.generation.generate_measured`.

    Returns:
        The measure-dict of :func:`run_sweep`: ``requests`` (records with
        ``repeat``, ``batch_size``, ``batch_wall_s``), ``wall_s`` (sum of timed
        batch wall times), ``warmup_s``, ``energy`` (:meth:`workbench.energy.EnergyMeter.result`: NVML
        energy over the timed repeats only; NaN with a reason off NVIDIA GPUs).
    """
    warmup_s = warm_up(loaded, prompts, settings, warmup, **kwargs)
    requests, wall = [], 0.0
    meter = energy.EnergyMeter(loaded.info.device)  # NVML energy around each timed repeat (NaN off NVIDIA GPUs)
    for r in range(repeats):
        meter.begin()
        res = generate_measured(loaded, prompts, dataclasses.replace(settings, seed=settings.seed + r), **kwargs)
        meter.end(res.wall_s)
        for rec in res.records:
            rec.update(repeat=r, batch_size=len(prompts), batch_wall_s=res.wall_s)
            requests.append(rec)
        wall += res.wall_s
    return {"requests": requests, "wall_s": wall, "warmup_s": warmup_s, "energy": meter.result()}


def _utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _utilisation(req: pd.DataFrame, summary: dict, info, env: dict) -> dict:
    """MBU (decode) and MFU (prefill) of a point, from its medians and the probed device peaks.

    The batch is the recorded ``batch_size`` of the requests (how many shared one forward pass), never
    the number of rows of a repeat: a point that runs 8 tasks one at a time is batch 1. Without a
    recorded batch size the figures are left empty rather than guessed.
    """
    if info is None or "bandwidth_bytes_per_s" not in env or req.empty or "batch_size" not in req:
        return {}
    batch = pd.to_numeric(req["batch_size"], errors="coerce").median()
    prompt = pd.to_numeric(req["prompt_tokens"], errors="coerce").mean()
    if not (math.isfinite(prompt) and math.isfinite(batch) and batch >= 1):
        return {}
    batch = int(batch)
    out = pd.to_numeric(req["output_tokens"], errors="coerce")
    if "n_requests" in req:  # a row standing for several requests (long-output strategies): per-request output
        out = out / pd.to_numeric(req["n_requests"], errors="coerce").fillna(1).clip(lower=1)
    ctx = prompt + float(out.mean()) / 2
    # with a reused prefix cache only the new tokens are prefilled (compression's kv_reuse)
    prefilled = pd.to_numeric(req["prefilled_tokens"], errors="coerce").mean() if "prefilled_tokens" in req else math.nan
    prefill_tokens = prefilled if math.isfinite(prefilled) else prompt
    return {
        "mbu": metrics.mbu(info.weight_bytes, info.kv_cache_bytes_per_token(), batch, ctx,
                           summary.get("tpot_s_p50", float("nan")), env["bandwidth_bytes_per_s"]),
        "mfu": metrics.mfu(metrics.prefill_flops(info.num_non_embedding_params, info.num_layers, info.attn_dim,
                                                 int(prefill_tokens), batch),
                           summary.get("prefill_s_p50", float("nan")), env["flops_per_s"]),
        "peak_bandwidth_bytes_per_s": env["bandwidth_bytes_per_s"],
        "peak_flops_per_s": env["flops_per_s"],
    }


def reference_tpot_s(loaded, max_age_s: float = 0.0) -> float:
    """TPOT of a fixed small request (64-token prompt, 8 new tokens, batch 1, greedy): the drift probe.

    Measured at the start and the end of each sweep; a change beyond :data:`DRIFT_LIMIT` means the
    machine's speed moved under the sweep (thermal, other load) and its points are marked invalid. The value is
    the fastest of 3 runs (``timeit``'s rule: slower runs carry noise from elsewhere, the fastest is the
    machine's speed). On the 2-core build VM, quiet, 15 references back to back spread 24 % (min/max) with the
    fastest of 3 and 40 % with the median of 3 (worst consecutive pair 13 % vs 21 %), so the median
    marked quiet sweeps invalid; other load on two cores slows decoding 5-25x, far beyond the limit. One
    untimed warm-up before the first reference of a model in this process; with ``max_age_s`` a reference
    of this model measured at most that many seconds ago is returned instead of a new one.
    """
    from .prompts import build_batch

    last = _LAST_REFERENCE.get(loaded)
    if last is not None and max_age_s > 0 and time.monotonic() - last[0] <= max_age_s:
        return last[1]
    prompts = build_batch(loaded.tokenizer, 1, 64)
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    if last is None:  # the first reference of this model in this process
        warm_up(loaded, prompts, settings, 1)
    runs = [generate_measured(loaded, prompts, settings).records[0]["tpot_s"] for _ in range(3)]
    value = float(min(runs))
    _LAST_REFERENCE[loaded] = (time.monotonic(), value)
    return value


#: model -> (monotonic time, TPOT) of the latest reference measured in this process; weakly keyed, so a model
#: freed and another loaded at the same address never inherits its reference.
_LAST_REFERENCE: "weakref.WeakKeyDictionary[object, tuple[float, float]]" = weakref.WeakKeyDictionary()
#: A start reference may reuse the previous sweep's end reference when it is at most this old (seconds):
#: back-to-back sweeps of one notebook share it instead of measuring the same thing twice.
REFERENCE_REUSE_S = 15.0


DRIFT_LIMIT = 0.25


def run_sweep(
    run_dir,
    experiment: str,
    points: list[dict],
    measure: Callable[[dict], dict],
    resume: bool = False,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    info=None,
    config=None,
    loaded=None,
    executor=None,
) -> pd.DataFrame:
    """Measure every point, writing each as it finishes; failures are recorded, not raised.

    Args:
        run_dir: the run folder (:func:`workbench.results.open_run`).
        experiment: experiment name (the ``experiment`` column).
        points: parameter dicts (e.g. from :func:`expand_grid`); their keys become columns.
        measure: ``measure(point) -> {"requests": [dict], "wall_s": float,
            "extra": dict (optional), "warmup_s": float (optional)}``.
        resume: skip points already recorded ``ok`` in this run.
        slo_ttft_s, slo_tpot_s: SLO for ``goodput_rps``.
        info: :class:`workbench.models.ModelInfo`; enables the environment record, MBU and MFU.
        config: the experiment's config dataclass, recorded in the manifest.
        loaded: the model; when given, the drift reference (:func:`reference_tpot_s`) is measured before
            and after the points, and a drift beyond :data:`DRIFT_LIMIT` marks them invalid (on Ray: each
            worker's reference, before its first and after its last point, judges that worker's points).
        executor: measures the points elsewhere (:class:`workbench.distributed.RayExecutor`: its
            ``completed(todo)`` yields points as they finish, its ``measure(point)`` returns their results);
            by default :func:`workbench.distributed.executor_for` picks Ray when ``$WORKBENCH_RAY`` is set
            (``--ray``), else the points are measured here, in order, with ``measure``.

    Returns:
        ``points.parquet`` rows of this experiment: the point's parameters, the
        :func:`~workbench.metrics.summarize_point` columns, ``mbu``, ``mfu``,
        ``peak_memory_bytes``, ``warmup_s``, the measure's ``extra``, ``status``, the contamination
        figures (``others_cpu_load``, ``steal_frac``) and the verdict ``valid`` / ``invalid_reason``.

    The environment variable ``WORKBENCH_INJECT_FAILURE`` (a substring of point
    ids) makes matching points fail: a test hook for the failure path.
    """
    from tqdm.auto import tqdm

    run = Path(run_dir)
    run_id = run.name
    ids = [point_id(experiment, p) for p in points]
    if len(set(ids)) != len(ids):
        raise ParameterError(f"points: duplicate points in the {experiment} grid")
    env = {}
    if info is not None:
        env = results.environment(info, seed=getattr(config, "seed", None), probe=run)
        results.update_manifest(run, environment=env)
    results.update_manifest(
        run,
        experiments={experiment: {
            "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "model": info.to_dict() if info is not None else None,
            "points": ids,
        }},
    )
    if info is None and loaded is not None:
        info = loaded.info
    done = results.finished_points(run) if resume else set()
    inject = os.environ.get("WORKBENCH_INJECT_FAILURE")
    model_cols = {}
    if info is not None:  # the display name for people, the folder for lookups (roofline predictions), and
        # where each row ran (node, device name, device index; Ray workers put their own)
        path = getattr(info, "path", None)
        model_cols = {"model": info.name, "model_path": str(path) if path else None, "device": info.device,
                      "dtype": info.dtype, **distributed.placement(info)}
        results.update_manifest(run, energy={experiment: energy.status(info.device)})
    todo = [(p, pid) for p, pid in zip(points, ids) if pid not in done]
    if len(todo) < len(points):
        print(f"{experiment}: resuming, {len(points) - len(todo)} of {len(points)} points already done")
    if executor is None and todo and os.environ.get(distributed.ENV):
        executor = distributed.executor_for(experiment, config, run)  # None: this experiment runs here
    if executor is not None:  # the drift reference belongs to one device: each Ray worker measures its own
        executor.measure_drift = loaded is not None
        measure, loaded = executor.measure, None
    ref_start = reference_tpot_s(loaded, REFERENCE_REUSE_S) if loaded is not None and todo else None
    bar = tqdm(todo if executor is None else executor.completed(todo), total=len(todo), desc=experiment,
               unit="point", file=sys.stderr, mininterval=1.0)
    rows = []
    for i, (p, pid) in enumerate(bar, 1):
        meta = {"experiment": experiment, "params": p, "started_utc": _utc()}
        base = {"run_id": run_id, "experiment": experiment, "point_id": pid, **model_cols, **p}
        try:
            if inject and inject in pid:
                raise RuntimeError(f"injected failure (WORKBENCH_INJECT_FAILURE={inject!r})")
            if info is not None:
                metrics.reset_peak_memory(info.device)
            load = metrics.LoadMonitor()
            m = measure(p)
            contamination = {**load.stop(), **m.pop("contamination", {})}  # a Ray worker's own reading wins
            req = pd.DataFrame(m["requests"])
            for col, val in base.items():  # measured request values win over the point's parameters
                if col not in req or col in ("run_id", "experiment", "point_id"):
                    req[col] = [val] * len(req)
            for col in REQUEST_COLUMNS:
                if col not in req:
                    req[col] = None
            summary = metrics.summarize_point(req, m["wall_s"], slo_ttft_s, slo_tpot_s)
            peak, method = metrics.peak_memory_bytes(info.device) if info is not None else (None, "unavailable")
            row = {**base, **summary, **_utilisation(req, summary, info, env),
                   "peak_memory_bytes": peak, "peak_memory_method": method,
                   "warmup_s": m.get("warmup_s"), **energy.point_columns(m.get("energy"), req),
                   **m.get("extra", {}), **contamination, "status": "ok"}
            row.update(metrics.verdict(row))
            meta.update(status="ok")
        except Exception as exc:  # noqa: BLE001 - a failed point is data, not a crash
            reason = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            req = pd.DataFrame()
            row = {**base, "status": reason}
            meta.update(status=reason)
            _free_accelerator_memory()
        meta["finished_utc"] = _utc()
        meta["valid"] = row.get("valid")
        results.record_point(run, pid, req, row, meta)
        rows.append((pid, row))
        bar.write(_headline(i, len(todo), pid, row))
    bar.close()
    if ref_start is not None:
        _check_drift(run, experiment, ref_start, reference_tpot_s(loaded), rows)
    for worker, ref in (getattr(executor, "references", None) or {}).items():  # per Ray worker, its own points
        mine = [(pid, row) for pid, row in rows if pid in ref["points"]]
        _check_drift(run, experiment, ref["start"], ref["end"], mine, worker)
    return results.read_points(run, experiment)


def _check_drift(run: Path, experiment: str, start: float, end: float, rows: list, worker: str = "") -> None:
    """Record the reference TPOT before/after the sweep (``worker``: a Ray worker's, before its first and after its
    last point); mark those points invalid when it drifted beyond :data:`DRIFT_LIMIT`."""
    ok = start and end and math.isfinite(start) and math.isfinite(end)
    drift = abs(end / start - 1) if ok else float("nan")
    entry = results.read_manifest(run)["experiments"][experiment]
    if worker:
        entry = {**entry, "worker_drift": {**entry.get("worker_drift", {}),
                                           worker: {"reference_tpot_s": [start, end], "drift": drift}}}
    else:
        entry = {**entry, "reference_tpot_s": [start, end], "drift": drift}
    results.update_manifest(run, experiments={experiment: entry})
    if not drift > DRIFT_LIMIT:
        return
    reason = (f"reference TPOT drifted {drift:.0%} during the sweep{' on ' + worker if worker else ''} "
              f"({start * 1e3:.1f} -> {end * 1e3:.1f} ms)")
    print(f"{experiment}: {reason}; its points are marked invalid", file=sys.stderr)
    results.mark_invalid(run, [pid for pid, row in rows if row.get("status") == "ok"], reason)


def _headline(i: int, n: int, pid: str, row: dict) -> str:
    if row["status"] != "ok":
        return f"[{i}/{n}] {pid}: {row['status']}"
    if row.get("valid") is False:
        return f"[{i}/{n}] {pid}: INVALID ({row['invalid_reason']})"
    line = (f"[{i}/{n}] {pid}: TTFT p50 {row.get('ttft_s_p50', float('nan')):.3f} s, "
            f"TPOT p50 {row.get('tpot_s_p50', float('nan')) * 1e3:.1f} ms, "
            f"{row.get('output_throughput_tps', float('nan')):.1f} tok/s")
    goodput = row.get("goodput_rps")
    if goodput is not None and math.isfinite(goodput):
        line += f", goodput {goodput:.2f} req/s"
    return line


def _free_accelerator_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
