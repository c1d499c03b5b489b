"""Sweeps: the shared config fields, parameter grids and the point loop.

A sweep is a list of points (dicts of parameter values). :func:`run_sweep`
measures each point with a caller's ``measure`` function (an experiment's ``measure_point``, returning a
:class:`workbench.run.point_result.PointResult`), turns the result into rows with
:func:`workbench.run.point_result.point_rows`, and writes them to the run folder
as soon as the point finishes. A point that raises is recorded
``failed: <reason>`` and the loop goes on; ``resume=True`` skips points already
recorded ``ok``.

Each experiment (``workbench/experiments/``) subclasses :class:`SweepConfig` and calls
:func:`run_sweep`; papermill execution and parameter checking live in :mod:`workbench.run.notebooks`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import math
import os
import sys
from pathlib import Path
from typing import Callable

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.measure import energy, models
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.run import distributed, drift, point_result, results, resume_check
from workbench.run.point_result import PointResult

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
        if self.device != "auto":   # "auto" always resolves (to cpu at worst): no torch import to check it
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


def measure_generation(loaded, prompts, settings: GenerationSettings, repeats: int = 1, warmup: int = 1,
                       **kwargs) -> PointResult:
    """Measure one plain batch: ``warmup`` untimed runs, then ``repeats`` timed ones.

    Warm-up: :func:`workbench.measure.generation.warm_up` (same prompts, same shapes).
    Repeat ``r`` uses seed ``settings.seed + r``. ``kwargs`` go to
    :func:`workbench.measure.generation.generate_measured`.

    Returns:
        :class:`workbench.run.point_result.PointResult`: ``requests`` (records with ``repeat``, ``batch_size``,
        ``batch_wall_s``), ``wall_s`` (sum of timed batch wall times), ``warmup_s``, ``energy``
        (:meth:`workbench.measure.energy.EnergyMeter.result`: NVML energy over the timed repeats only; NaN with a
        reason off NVIDIA GPUs).
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
    return PointResult(requests=requests, wall_s=wall, warmup_s=warmup_s, energy=meter.result())


def _utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_sweep(
    run_dir,
    experiment: str,
    points: list[dict],
    measure: Callable[[dict], PointResult],
    resume: bool = False,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    info=None,
    config=None,
    loaded=None,
    executor=None,
    speed_probe: bool = False,
    design=None,
) -> pd.DataFrame:
    """Measure every point, writing each as it finishes; failures are recorded, not raised.

    Args:
        run_dir: the run folder (:func:`workbench.run.results.open_run`).
        experiment: experiment name (the ``experiment`` column).
        points: parameter dicts (e.g. from :func:`expand_grid`); their keys become columns.
        measure: ``measure(point) -> PointResult`` (:class:`workbench.run.point_result.PointResult`; a dict of its
            fields is accepted too), usually ``lambda p: measure_point(loaded, cfg, p, state)``.
        resume: skip points already recorded ``ok`` in this run.
        slo_ttft_s, slo_tpot_s: SLO for ``goodput_rps``.
        info: :class:`workbench.measure.models.ModelInfo`; enables the environment record, MBU and MFU.
        config: the experiment's config dataclass, recorded in the manifest; on Ray its class's module is the
            experiment the workers run (:func:`workbench.run.distributed.executor_for`).
        loaded: the model; when given, the drift reference (:func:`workbench.run.drift.reference_tpot_s`) is
            measured before and after the points (:func:`workbench.run.drift.start` / :func:`~workbench.run.drift.finish`:
            no end reference for a sweep ending within ``REFERENCE_REUSE_S`` of its start reference), and a
            drift beyond :data:`workbench.run.drift.DRIFT_LIMIT` marks them invalid (on Ray: each worker's reference, before its first and after its last point, judges
            that worker's points).
        executor: measures the points elsewhere (:class:`workbench.run.distributed.RayExecutor`: its
            ``completed(todo)`` yields points as they finish, its ``measure(point)`` returns their results);
            by default :func:`workbench.run.distributed.executor_for` picks Ray when ``$WORKBENCH_RAY`` is set
            (``--ray``), else the points are measured here, in order, with ``measure``.
        speed_probe: a drift reference right before and after each point (the twin's calibration); with a design,
            one before and one after the design, shared by its arms (they are measured over the same rounds).
        design: a :class:`workbench.run.design_sweep.SweepDesign`, or a list of them: each over some of the points (its
            arms), measured in interleaved rounds by :func:`workbench.run.design.run_design` (resumed by round) when
            the loop reaches its first point, before any of them is recorded; each point's row carries its arm's
            decision (:meth:`workbench.run.design.DesignResult.point_columns`) and one speed probe around the whole
            design. A design with ``unit_of`` records each (arm, round) measurement as its own point; its points of
            rounds the design did not take are not recorded. The points no design holds are measured with
            ``measure``, one by one, in the grid's order (an experiment's design beside its other parts).

    Returns:
        ``points.parquet`` rows of this experiment (:func:`workbench.run.point_result.point_rows`): the point's
        parameters, the :func:`~workbench.stats.metrics.summarize_point` columns, ``mbu``, ``mfu``,
        ``peak_memory_bytes``, ``warmup_s``, the result's ``extra``, ``status``, the contamination
        figures (``others_cpu_load``, ``steal_frac``) and the verdict ``valid`` / ``invalid_reason``.

    The environment variable ``WORKBENCH_INJECT_FAILURE`` (a substring of point
    ids) makes matching points fail: a test hook for the failure path.
    """
    from tqdm.auto import tqdm

    run = Path(run_dir)
    run_id = run.name
    recorded = (results.read_manifest(run).get("experiments") or {}).get(experiment) or {} if resume else {}
    # a config changed since the run's first session (allowed with --allow-changed): its points get new ids
    suffix = resume_check.point_suffix(recorded.get("config"), config) if resume else ""
    ids = [point_result.point_id(experiment, p) + suffix for p in points]
    if len(set(ids)) != len(ids):
        raise ParameterError(f"points: duplicate points in the {experiment} grid")
    env = {}
    if info is not None:
        env = results.environment(info, seed=getattr(config, "seed", None), probe=run)
        results.update_manifest(run, environment=env)
    this = {"config": checks.mask_secrets(dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config),
            "model": info.to_dict() if info is not None else None, "points": ids, **drift.history(recorded)}
    if suffix:  # the manifest keeps both configs: the run's first, and each changed one with its points
        changed = [c for c in recorded.get("changed_configs") or [] if c.get("suffix") != suffix]
        this = {**recorded, "changed_configs": changed + [{**this, "suffix": suffix}]}
    results.update_manifest(run, experiments={experiment: this})
    if info is None and loaded is not None:
        info = loaded.info
    done = results.finished_points(run) if resume else set()
    inject = os.environ.get("WORKBENCH_INJECT_FAILURE")
    model_cols = {}
    if info is not None:  # the display name for people, the folder for lookups (roofline predictions), and
        # where each row ran (node, device name, device index; Ray workers put their own)
        path = getattr(info, "path", None)
        model_cols = {"model": info.name, "model_path": str(path) if path else None, "device": info.device,
                      "dtype": info.dtype, "random_weights": bool(getattr(info, "random_weights", False)),
                      **distributed.placement(info)}
        results.update_manifest(run, energy={experiment: energy.status(info.device)})
    todo = [(p, pid) for p, pid in zip(points, ids) if pid not in done]
    if len(todo) < len(points):
        print(f"{experiment}: resuming, {len(points) - len(todo)} of {len(points)} points already done")
    designs, units, taken = _design_units(design, points, ids, suffix, run)
    todo = [(p, pid) for p, pid in todo if pid not in taken]   # rounds a finished design of this run did not take
    if executor is None and todo and not designs and os.environ.get(distributed.ENV):
        executor = distributed.executor_for(experiment, config, run)  # None: this experiment runs here
    if executor is not None:  # the drift reference belongs to one device: each Ray worker measures its own
        executor.measure_drift = loaded is not None
        measure, loaded = executor.measure, None
    ref_start = drift.start(loaded) if loaded is not None and todo else None
    by_id = dict(zip(ids, points))
    made: dict = {}

    def designed(k: int) -> tuple[dict, dict]:
        """Design ``k``'s results and its speed probe, measured on the first call (an error kept and raised
        again for each of its points: one failed design is not measured once per point)."""
        from workbench.run import design_sweep

        if k not in made:
            before = (drift.reference_tpot_s(loaded, drift.REFERENCE_REUSE_S) if speed_probe and loaded is not None
                      else None)
            try:
                got = design_sweep.measure_sweep_design(designs[k], by_id, suffix, run, info)
            except Exception as exc:  # noqa: BLE001 - recorded as each point's failure; KeyboardInterrupt is not
                made[k] = exc
                raise
            after = drift.reference_tpot_s(loaded, drift.REFERENCE_REUSE_S) if before is not None else None
            made[k] = (got, drift.speed_probe(before, after) if before is not None else {})
        if isinstance(made[k], Exception):
            raise made[k]
        return made[k]

    bar = tqdm(todo if executor is None else executor.completed(todo), total=len(todo), desc=experiment,
               unit="point", file=sys.stderr, mininterval=1.0)
    rows = []
    probing = speed_probe and loaded is not None and executor is None
    for i, (p, pid) in enumerate(bar, 1):
        meta = {"experiment": experiment, "params": p, "started_utc": _utc()}
        unit = units.get(pid)
        if probing and unit is None:  # the previous point's after reading, when recent, is this one's before reading
            before = drift.reference_tpot_s(loaded, drift.REFERENCE_REUSE_S)
        base = {"run_id": run_id, "experiment": experiment, "point_id": pid, **model_cols, **p}
        try:
            if inject and inject in pid:
                raise RuntimeError(f"injected failure (WORKBENCH_INJECT_FAILURE={inject!r})")
            probe = {}
            if unit is not None:
                got, probe = designed(unit[0])
                if unit[1] not in got:      # a round the design did not take (it stopped before): not a point
                    continue
                one = got[unit[1]]
                measured = (lambda: one)  # noqa: E731
            else:
                measured = (lambda: measure(p))  # noqa: E731
            # on Ray the worker's own readings (device, placement, contamination) win over these
            result = point_result.measure_on_device(measured, info.device if info is not None else None)
            req, row = point_result.point_rows(result, base, slo_ttft_s, slo_tpot_s, info, env)
            if model_cols.get("random_weights"):
                req, row = _quality_off(req, row)
            if probing and unit is None:  # a point within the window a reading stands for takes it as both
                row.update(drift.speed_probe(before, drift.reference_tpot_s(loaded, drift.REFERENCE_REUSE_S)))
            row.update(probe)
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
        drift.finish(run, experiment, loaded, ref_start, rows)
    for worker, ref in (getattr(executor, "references", None) or {}).items():  # per Ray worker, its own points
        mine = [(pid, row) for pid, row in rows if pid in ref["points"]]
        drift.check(run, experiment, ref["start"], ref["end"], mine, worker)
    return results.read_points(run, experiment)


def _design_units(design, points: list[dict], ids: list[str], suffix: str, run) -> tuple[list, dict, set]:
    """The designs of a sweep and which point each one records.

    Returns:
        ``(designs, units, taken)``: the :class:`workbench.run.design_sweep.SweepDesign` s (``design`` as a list);
        ``{point id: (design index, key)}``, the key the design's results are filed under (the point id for a design
        whose points are its arms; ``(arm, round)`` with ``unit_of``); and the ids of ``unit_of`` points whose round
        a finished design of this run folder did not take (:func:`workbench.run.design.finished_rounds`).
    """
    if design is None:
        return [], {}, set()
    from workbench.run import design as design_mod

    designs = list(design) if isinstance(design, (list, tuple)) else [design]
    units, taken = {}, set()
    for k, sd in enumerate(designs):
        if sd.unit_of is None:
            units.update({f"{a}{suffix}": (k, f"{a}{suffix}") for a in sd.design.arms})
            continue
        done = design_mod.finished_rounds(run, sd.design.experiment)
        for p, pid in zip(points, ids):
            key = sd.unit_of(p)
            if key is None:
                continue
            units[pid] = (k, tuple(key))
            if done is not None and int(key[1]) >= done:
                taken.add(pid)
    return designs, units, taken


def _quality_off(req: pd.DataFrame, row: dict) -> tuple[pd.DataFrame, dict]:
    """Blank the quality columns of a random-weight model's rows (``model: config:PATH``): the columns stay, so
    its tables have a real model's columns, with NaN where a quality figure would mean nothing."""
    from workbench.measure.guard import COLUMNS as GUARD_COLUMNS
    from workbench.measure.quality import HIGHER_IS_BETTER

    cols = [c for c in HIGHER_IS_BETTER if c not in ("output_tokens", "output_chars", "truncated")]
    cols += [c for c in GUARD_COLUMNS if c not in ("guard_passed", "guard_reason")]
    for c in cols:
        if c in row:
            row[c] = float("nan")
        if c in req:
            req[c] = float("nan")
    return req, row


def _headline(i: int, n: int, pid: str, row: dict) -> str:
    if row["status"] != "ok":
        return f"[{i}/{n}] {pid}: {row['status']}"
    if row.get("valid") is False:
        return f"[{i}/{n}] {pid}: INVALID ({row['invalid_reason']})"
    def fig(col, scale, unit, digits):   # "n/a" where the point has no such figure (a plan's rows: no one TTFT)
        v = row.get(col)
        return f"{v * scale:.{digits}f} {unit}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"

    line = (f"[{i}/{n}] {pid}: TTFT p50 {fig('ttft_s_p50', 1, 's', 3)}, TPOT p50 {fig('tpot_s_p50', 1e3, 'ms', 1)}, "
            f"{fig('output_throughput_tps', 1, 'tok/s', 1)}")
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


def block_share(state: dict, point_id: str, measure_block: Callable[[], dict]):
    """A point's share of an interleaved block (issue 32): the first point of a sweep measures every arm
    interleaved by round (``measure_block()``, returning ``{point_id: PointResult}``), cached in
    ``state["interleaved"]``; every point, that one included, returns its own entry.

    A block that raised is not measured again for each of its points (a failure inside the block would otherwise
    cost one whole block per point): the error is kept in ``state["interleaved_error"]`` and raised again for
    every point, so :func:`run_sweep` records each as failed with the block's reason and ``--resume`` measures
    them again. A resumed sweep measures the whole block again and takes only its unfinished points' shares: the
    family the block's Holm adjustment is over stays the whole grid, and each point's ratios are paired within
    the block it was measured in.

    Raises:
        KeyError: ``point_id`` is not in the block.
        Exception: the block's own error, for every point of a block that raised.
    """
    if "interleaved_error" in state:
        raise state["interleaved_error"]
    if "interleaved" not in state:
        try:
            state["interleaved"] = measure_block()
        except Exception as exc:  # noqa: BLE001 - kept, raised for each point; KeyboardInterrupt is not caught
            state["interleaved_error"] = exc
            raise
    return state["interleaved"][point_id]
