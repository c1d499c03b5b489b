"""The drift reference: did the machine's speed move under a sweep?

:func:`reference_tpot_s` measures a fixed small request before and after a sweep's points (on Ray, each
worker on its own device, before its first point and after its last); :func:`check` records the pair in
the run's manifest and marks the points invalid when the two differ by more than :data:`DRIFT_LIMIT` - except the
arms of an interleaved design whose control, measured every round, did not move that much between neighbouring rounds
(:func:`absorbed_by_rounds`: the rounds are the design's blocks).
:func:`start` and :func:`finish` bracket a local sweep (no end reference within :data:`REFERENCE_REUSE_S`).
The estimator (fastest of 3) and the limit come from ``benchmarks/drift_reference.py`` (README: "what the
drift reference is").
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import weakref
from pathlib import Path

from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.paths import read_machine_entry, write_machine_entry
from workbench.run import results

#: A drift of the reference TPOT (|end / start - 1|) beyond this marks the sweep's points invalid.
from workbench.stats.evidence import DRIFT_LIMIT  # noqa: E402 - the verdict's threshold, one home
from workbench.stats.validity import absorbed_by_rounds, design_step  # noqa: E402

#: A reference stands for the machine's speed for this long (seconds): a start reference may reuse the previous
#: sweep's end reference when it is at most this old (back-to-back sweeps share it instead of measuring the same
#: thing twice), and a sweep that ends within this long of its start reference is not given an end reference
#: (:func:`finish`): its whole window is covered by the same reference.
REFERENCE_REUSE_S = 15.0
#: A suite's ``reference_reuse_s:`` (the quick profile's: longer), handed to its kernel through this variable.
REUSE_ENV = "WORKBENCH_REFERENCE_REUSE_S"
if os.environ.get(REUSE_ENV):
    REFERENCE_REUSE_S = float(os.environ[REUSE_ENV])
#: model -> (monotonic time, TPOT) of the latest reference measured in this process; weakly keyed, so a model
#: freed and another loaded at the same address never inherits its reference.
_LAST_REFERENCE: "weakref.WeakKeyDictionary[object, tuple[float, float]]" = weakref.WeakKeyDictionary()
#: Models given their untimed warm-up run in this process (a reference read from the shared file has none).
_WARMED: "weakref.WeakSet[object]" = weakref.WeakSet()
#: The latest reference of each model, device, dtype, attention kernel and thread count on this machine, shared by
#: its processes (the notebooks of one ``workbench run`` are a kernel each): ``$WORKBENCH_CACHE/<this file>``.
SHARED_FILE = "drift_reference.json"


def reference_tpot_s(loaded, max_age_s: float = 0.0) -> float:
    """TPOT of a fixed small request (64-token prompt, 8 new tokens, batch 1, greedy): the drift probe.

    Measured at the start and the end of each sweep; a change beyond :data:`DRIFT_LIMIT` means the
    machine's speed moved under the sweep (thermal, other load) and its points are marked invalid. The value is
    the fastest of 3 runs (``timeit``'s rule: slower runs carry noise from elsewhere, the fastest is the
    machine's speed). On a quiet 2-core CPU references back to back spread far less with the fastest of 3 than
    with the median of 3, which marked quiet sweeps invalid (results/LOG.md, 2026-12-06: the figures); other load
    on two cores slows decoding many times over, far beyond the limit. One
    untimed warm-up before the first reference of a model in this process.

    With ``max_age_s``, a reference of this model measured at most that many seconds ago is returned instead of a
    new one: this process's own, else the latest one another process on this machine measured for the same model
    weights, device, dtype, attention kernel and torch thread count (:data:`SHARED_FILE` in the workbench cache;
    the notebooks of one ``workbench run`` each run in their own kernel, and a reference stands for the
    machine's speed, not for a process: issue 48, ~2 s a notebook). Every measured reference is written there.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        max_age_s: reuse a reference of this model at most this old (seconds); 0: always measure.

    Returns:
        The reference TPOT in seconds.
    """
    from workbench.inputs.prompts import build_batch

    last = _LAST_REFERENCE.get(loaded)
    if max_age_s > 0:
        if last is not None and time.monotonic() - last[0] <= max_age_s:
            return last[1]
        shared = _read_shared(loaded, max_age_s)
        if shared is not None:
            age_s, value = shared
            _LAST_REFERENCE[loaded] = (time.monotonic() - age_s, value)
            return value
    prompts = build_batch(loaded.tokenizer, 1, 64)
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    if loaded not in _WARMED:  # the first reference of this model in this process
        warm_up(loaded, prompts, settings, 1)
        _WARMED.add(loaded)
    runs = [generate_measured(loaded, prompts, settings).records[0]["tpot_s"] for _ in range(3)]
    value = float(min(runs))
    _LAST_REFERENCE[loaded] = (time.monotonic(), value)
    _write_shared(loaded, value)
    return value


def _shared_key(loaded) -> str | None:
    """The shared file's key of ``loaded`` on this machine: the weights, device, dtype, attention kernel, model class
    and torch's thread count (:func:`workbench.paths.read_machine_entry` adds the machine); None for a model without
    :class:`ModelInfo` (a stand-in)."""
    info, model = getattr(loaded, "info", None), getattr(loaded, "model", None)
    if info is None or model is None or not getattr(info, "weights_sha256", None):
        return None
    import torch

    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return "|".join(str(x) for x in (info.weights_sha256, info.device, info.dtype, attn, type(model).__name__,
                                     torch.get_num_threads()))


def _read_shared(loaded, max_age_s: float) -> tuple[float, float] | None:
    """``(age in seconds, TPOT)`` of the shared file's reference for ``loaded`` when at most ``max_age_s`` old."""
    key = _shared_key(loaded)
    found = read_machine_entry(SHARED_FILE, key, max_age_s) if key else None
    try:
        age_s, value = found[0], float(found[1]["tpot_s"])
    except (TypeError, KeyError, ValueError):
        return None
    return (age_s, value) if math.isfinite(value) and value > 0 else None


def _write_shared(loaded, value: float) -> None:
    """Put ``loaded``'s reference in the shared file (:func:`workbench.paths.write_machine_entry`)."""
    key = _shared_key(loaded)
    if key is not None:
        write_machine_entry(SHARED_FILE, key, {"tpot_s": value})


@dataclasses.dataclass(frozen=True)
class Start:
    """A sweep's start reference: ``tpot_s`` (seconds) measured at ``measured_at`` (``time.monotonic()``)."""

    tpot_s: float
    measured_at: float


def start(loaded) -> Start:
    """The start reference of a sweep: :func:`reference_tpot_s` reusing one at most :data:`REFERENCE_REUSE_S`
    old, with the time it was measured (for :func:`finish`)."""
    value = reference_tpot_s(loaded, REFERENCE_REUSE_S)
    return Start(value, _LAST_REFERENCE[loaded][0])


def finish(run: Path, experiment: str, loaded, begun: Start, rows: list) -> None:
    """End of a sweep: measure the end reference and :func:`check` the pair, unless the sweep ended within
    :data:`REFERENCE_REUSE_S` of its start reference - the window in which a reference is taken to stand for the
    machine's speed (as when it is reused as a start reference) - when the pair is recorded as
    ``[start, NaN]`` with ``drift`` NaN and a ``drift_note`` saying why (no verdict from drift: the points keep
    the one from their contamination figures). Short sweeps - the quick profile's, most of them a few seconds -
    thus share one reference instead of paying for a pair each."""
    age = time.monotonic() - begun.measured_at
    if age <= REFERENCE_REUSE_S:
        check(run, experiment, begun.tpot_s, float("nan"), rows,
              note=f"no end reference: the sweep ended {age:.1f} s after its start reference, within the "
                   f"{REFERENCE_REUSE_S:.0f} s a reference stands for the machine's speed")
        return
    check(run, experiment, begun.tpot_s, reference_tpot_s(loaded), rows)


#: The speed probe's columns on a point row (:func:`speed_probe`).
PROBE_COLUMNS = ("speed_probe_tpot_s", "speed_probe_before_tpot_s", "speed_probe_after_tpot_s")


def speed_probe(before: float, after: float) -> dict:
    """A point's speed probe columns (:data:`PROBE_COLUMNS`): the drift reference (:func:`reference_tpot_s`)
    measured right before and right after the point, and ``speed_probe_tpot_s``, their geometric mean (the
    machine's speed while the point ran; NaN where a reading is missing or not positive).

    The serving twin (:mod:`workbench.predict.twin_cost`) rescales its cost model by it: its calibration rows to a
    common speed, each predicted point to the speed at its moment. A shared CPU's speed swings within a sweep
    (results/LOG.md, 2026-12-05), and a sweep's start and end references miss the swings between them; a reading
    beside each point follows them. ``run_sweep(..., speed_probe=True)`` takes it; each reading reuses the latest
    reference when at most :data:`REFERENCE_REUSE_S` old (the window in which a reference stands for the machine's
    speed, as :func:`start` and :func:`finish` take it): the before reading is the previous point's after reading,
    and a point that ends within the window of its before reading takes that one as its after reading too, so a
    point pays at most one reference (issue 48: a reference after every short point was most of a quick run).
    """
    ok = all(v is not None and math.isfinite(v) and v > 0 for v in (before, after))
    return {"speed_probe_tpot_s": math.sqrt(before * after) if ok else float("nan"),
            "speed_probe_before_tpot_s": float(before) if before is not None else float("nan"),
            "speed_probe_after_tpot_s": float(after) if after is not None else float("nan")}


HISTORY_KEYS = ("reference_tpot_s", "drift", "drift_note")


def history(recorded: dict | None) -> dict:
    """An experiment's drift record from earlier sessions, for a resumed (or ``--rerun-invalid``) session's manifest
    entry: ``{"drift_history": [{reference_tpot_s, drift, drift_note}, ...]}``, oldest first, the entry's current
    record last; ``{}`` when it has none. Without it a rerun's references replace the first session's, and the run's
    original drift is then only in its log."""
    recorded = recorded or {}
    past = list(recorded.get("drift_history") or [])
    now = {k: recorded[k] for k in HISTORY_KEYS if k in recorded}
    if now:
        past.append(now)
    return {"drift_history": past} if past else {}


def check(run: Path, experiment: str, start: float, end: float, rows: list, worker: str = "",
          note: str = "") -> None:
    """Record the reference TPOT before/after a sweep and mark its points invalid when it drifted too far.

    Args:
        run: the run folder.
        experiment: the sweep's experiment (its manifest entry gets ``reference_tpot_s`` and ``drift``, or,
            for a worker, ``worker_drift.<worker>``).
        start, end: the references (seconds; None or NaN: no verdict).
        rows: ``(point_id, row)`` of the points measured between them; those with status ``ok`` are marked
            invalid (:func:`workbench.run.results.mark_invalid`) when ``|end / start - 1| >`` :data:`DRIFT_LIMIT`,
            except the arms of a design whose rounds absorb the move (:func:`absorbed_by_rounds`: recorded as
            ``drift_note`` and ``drift_kept``, their count).
        worker: a Ray worker's label: its own reference, before its first and after its last point.
        note: why there is no verdict (recorded as ``drift_note``; :func:`finish`).
    """
    ok = start and end and math.isfinite(start) and math.isfinite(end)
    drift = abs(end / start - 1) if ok else float("nan")
    entry = results.read_manifest(run)["experiments"][experiment]
    if worker:
        entry = {**entry, "worker_drift": {**entry.get("worker_drift", {}),
                                           worker: {"reference_tpot_s": [start, end], "drift": drift}}}
    else:
        entry = {**{k: v for k, v in entry.items() if k not in ("drift_note", "drift_kept")}, "reference_tpot_s": [start, end],
                 "drift": drift, **({"drift_note": note} if note else {})}
    if not drift > DRIFT_LIMIT:
        results.update_manifest(run, experiments={experiment: entry})
        return
    done = [(pid, row) for pid, row in rows if row.get("status") == "ok"]
    kept = [pid for pid, row in done if absorbed_by_rounds(row)]
    reason = (f"reference TPOT drifted {drift:.0%} during the sweep{' on ' + worker if worker else ''} "
              f"({start * 1e3:.1f} -> {end * 1e3:.1f} ms)")
    if kept:
        steps = max(design_step(row) for pid, row in done if pid in kept)
        said = (f"{reason}: {len(kept)} point(s) of an interleaved design kept valid - the rounds are its blocks and "
                f"its control, measured every round, moved at most {steps:.1%} between neighbouring rounds (limit "
                f"{DRIFT_LIMIT:.0%}), its A/A control did not move")
        if not worker:
            entry.update(drift_note=said, drift_kept=len(kept))
        print(f"{experiment}: {said}", file=sys.stderr)
    results.update_manifest(run, experiments={experiment: entry})
    marked = [pid for pid, _ in done if pid not in kept]
    if marked:
        print(f"{experiment}: {reason}; {len(marked)} point(s) marked invalid", file=sys.stderr)
        results.mark_invalid(run, marked, reason)
