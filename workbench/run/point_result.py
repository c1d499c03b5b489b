"""One point: its id, its typed result, and the rows a run folder records for it.

:func:`point_id` (a stable id from the point's parameters), :class:`PointResult` (what every experiment's
``measure_point`` returns), :func:`measure_on_device` (the readings every point carries: peak memory, other load)
and :func:`point_rows` (request rows and the point row with its validity verdict). Writing them is
:mod:`workbench.run.results`' job; the columns are those of the registry (:mod:`workbench.stats.columns`).
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from workbench.measure import contention, device, energy
from workbench.stats import columns, evidence, metrics, validity

#: Columns every request row carries (None when an experiment has no value for it): the registry's ``row = request``.
REQUEST_COLUMNS = columns.REQUEST_COLUMNS
#: ``source`` of a measured row and point (the serving twin's are ``simulated``: docs/design.md section 10).
MEASURED = "measured"
#: The run's own columns: on a request row they are always the run's, never a measured record's.
_RUN_COLUMNS = ("run_id", "experiment", "point_id")
#: Where a point was measured (a Ray worker's :attr:`PointResult.device`): these win over the run's columns.
_WHERE_COLUMNS = ("node", "device_name", "device_index", "device")
#: The measuring device's probed peaks in :attr:`PointResult.device` (MBU / MFU use them over the run's).
_PEAK_KEYS = ("bandwidth_bytes_per_s", "flops_per_s")


def point_id(experiment: str, point: dict) -> str:
    """A stable id such as ``batch_size/prompt_tokens=128,batch_size=4``."""
    return experiment + "/" + ",".join(f"{k}={point[k]}" for k in point)


@dataclasses.dataclass
class PointResult:
    """What measuring one point returns: every experiment's ``measure_point(loaded, cfg, point, state)``,
    and the ``measure`` of :func:`workbench.run.sweeps.run_sweep`.

    Attributes:
        requests: one dict per request of the timed repeats (``ttft_s``, ``tpot_s``, ``output_tokens``, ...;
            ``repeat`` and ``batch_size`` where the experiment has them).
        wall_s: wall time of the timed work, seconds: the denominator of the point's throughputs.
        warmup_s: untimed warm-up before it, seconds (None: the point ran none of its own).
        extra: the experiment's own point columns (quality means, memory figures, ...), added to the row as is.
        energy: :meth:`workbench.measure.energy.EnergyMeter.result` over the timed repeats (None: not measured, the
            energy columns are NaN).
        contamination: ``others_cpu_load`` and ``steal_frac`` while it ran (:class:`workbench.measure.contention.LoadMonitor`,
            filled by :func:`measure_on_device`).
        device: figures of the device that measured it: ``peak_memory_bytes`` and ``peak_memory_method``
            (:func:`measure_on_device`); a Ray worker adds where it ran (``node``, ``device_name``,
            ``device_index``, ``device``) and its probed peaks (``bandwidth_bytes_per_s``, ``flops_per_s``),
            which its point's MBU / MFU use.
    """

    requests: list
    wall_s: float
    warmup_s: float | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    energy: dict | None = None
    contamination: dict = dataclasses.field(default_factory=dict)
    device: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, measured) -> "PointResult":
        """``measured`` as a :class:`PointResult`: itself, or a mapping with the same field names (a measure
        written as a dict, e.g. :func:`workbench.load.client.measure_http` or a test's stand-in).

        Raises:
            TypeError: anything else, or a mapping with other keys.
        """
        if isinstance(measured, cls):
            return measured
        if isinstance(measured, dict):
            unknown = set(measured) - {f.name for f in dataclasses.fields(cls)}
            if unknown:
                raise TypeError(f"a point's result has no field {', '.join(sorted(unknown))} "
                                f"(fields: {', '.join(f.name for f in dataclasses.fields(cls))})")
            return cls(**measured)
        raise TypeError(f"a point's measure must return a PointResult (got {type(measured).__name__})")


def measure_on_device(measure, device_name: str | None) -> PointResult:
    """Measure one point with the readings every point carries: its peak memory and the load of others.

    Args:
        measure: ``measure() -> PointResult`` (or a dict of its fields, :meth:`PointResult.of`).
        device_name: the model's device (``cpu``, ``cuda:0``, ...): a peak-memory window
            (:func:`workbench.measure.device.reset_peak_memory`) is opened around the measure; None: no window,
            the peak is ``unavailable``.

    Returns:
        The measure's result with ``contamination`` (:class:`workbench.measure.contention.LoadMonitor` over the measure;
        figures the measure brought itself win) and ``device`` (``peak_memory_bytes``, ``peak_memory_method``;
        entries the measure brought itself win).
    """
    if device_name is not None:
        device.reset_peak_memory(device_name)
    load = contention.LoadMonitor()
    result = PointResult.of(measure())
    contamination = load.stop()
    peak, method = device.peak_memory_bytes(device_name) if device_name is not None else (None, "unavailable")
    return dataclasses.replace(result, contamination={**contamination, **result.contamination},
                               device={"peak_memory_bytes": peak, "peak_memory_method": method, **result.device})


def point_rows(result: PointResult, base: dict, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
               info=None, env: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """A measured point's request rows and its point row with the validity verdict: what a run folder records.

    Args:
        result: the point's :class:`PointResult`.
        base: the run's columns of the point (``run_id``, ``experiment``, ``point_id``, the model columns,
            the point's parameters). Request rows take them where they have no value of their own (measured
            values win), except ``run_id``, ``experiment`` and ``point_id``, which are always the run's.
        slo_ttft_s, slo_tpot_s: the SLO of ``goodput_rps`` (:func:`workbench.stats.metrics.summarize_point`).
        info: :class:`workbench.measure.models.ModelInfo`; with the probed peaks of ``env`` (or of ``result.device``)
            it gives ``mbu`` / ``mfu`` (:func:`workbench.stats.metrics.utilisation`).
        env: the run's environment (:func:`environment`).

    Returns:
        ``(requests, row)``: the request rows with every :data:`REQUEST_COLUMNS` column (None where missing),
        and the point row: ``base``, the :func:`~workbench.stats.metrics.summarize_point` columns, ``mbu``, ``mfu``,
        ``peak_memory_bytes``, ``peak_memory_method``, ``warmup_s``, the energy columns
        (:func:`workbench.measure.energy.point_columns`), ``result.extra``, where it ran, the contamination figures,
        ``status`` ``ok`` and the verdict ``valid`` / ``invalid_reason`` (:func:`workbench.measure.contention.verdict`;
        an arm of an interleaved design whose rounds absorb the load stays valid with a ``contention_note``:
        :func:`workbench.stats.validity.absorbed_by_rounds`).
    """
    req = pd.DataFrame(result.requests)
    for col, val in base.items():  # measured request values win over the point's parameters
        if col not in req or col in _RUN_COLUMNS:
            req[col] = [val] * len(req)
    for col in REQUEST_COLUMNS:
        if col not in req:
            req[col] = None
    if "source" not in req:
        req["source"] = MEASURED  # the serving twin's rows say "simulated" (workbench.predict.twin)
    summary = metrics.summarize_point(req, result.wall_s, slo_ttft_s, slo_tpot_s)
    dev = result.device
    peaks = {**(env or {}), **{k: dev[k] for k in _PEAK_KEYS if k in dev}}
    row = {"source": MEASURED, **base, **summary, **metrics.utilisation(req, summary, info, peaks),
           "peak_memory_bytes": dev.get("peak_memory_bytes"),
           "peak_memory_method": dev.get("peak_memory_method", "unavailable"),
           "warmup_s": result.warmup_s, **energy.point_columns(result.energy, req), **result.extra,
           **{k: dev[k] for k in _WHERE_COLUMNS if k in dev}, **result.contamination, "status": "ok"}
    verdict = contention.verdict(row)
    if not verdict["valid"] and validity.absorbed_by_rounds(row):
        # other load or steal over a whole interleaved design: a block effect its rounds absorb (the gate and why:
        # workbench.stats.validity.absorbed_by_rounds); said in the row and in the report's validity line
        verdict = {"valid": True, "invalid_reason": "",
                   "contention_note": f"{verdict['invalid_reason']} over the whole design: kept valid - its control "
                                      f"moved at most {validity.design_step(row):.1%} between neighbouring rounds "
                                      f"(limit {evidence.DRIFT_LIMIT:.0%}), its A/A control did not move"}
    row.update(verdict)
    return req, row
