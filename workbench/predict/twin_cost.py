"""The serving twin's per-step cost model (issue 34): seconds of one prefill and one decode step, in place of the
model, calibrated on this machine from the workbench's own measurements.

**Form** (linear in features the roofline names; :mod:`workbench.predict.roofline` gives their physics):

- prefill of ``B`` left-padded rows of ``L`` computed tokens (``fifo`` / ``static``; a ``continuous`` chunk is
  ``B = 1``): ``prefill_s = a0 + a1 * B * L + a2 * B * L**2``. ``a0`` is the fixed cost of a ``generate`` call
  (launch, templating already done, first sampling), ``a1`` the weight FLOPs and KV writes per token (compute
  bound), ``a2`` the attention scores' quadratic term (PaLM's count, Chowdhery et al. 2022 appendix B).
- decode step over ``B`` rows holding ``C`` cached tokens in all: ``step_s = b0 + b1 * B + b2 * C + b3 * [B > 1]``:
  ``b0`` the weights read once per step (memory bound: Pope et al., MLSys 2023), ``b1`` each row's sampling and
  GEMV share, ``b2`` the KV-cache traffic per cached token, ``b3`` the CPU BLAS switch from matrix-vector to
  packed matrix-matrix kernels at two rows (:class:`workbench.predict.roofline.Calibration` ``batched_step_overhead_s``),
  plus ``r(B)``, the measured step's residual at its batch size (:attr:`StepCost.batch_residual_s`): a CPU's
  matrix kernels are not linear in the rows (a bare ``generate`` step of 3 or 7 rows cost more than one of 4 to 8 on
  a 2-core CPU), and the serving sweep's open-loop batches are of 2 to 8 rows: the linear form put them low
  (results/LOG.md, 2026-12-06: the figures). ``r`` is the median residual of the linear fit over the workloads measured at each
  batch size, interpolated between measured sizes, 0 past the largest (the linear form alone), and never takes a
  step below half the linear form's.
- a ``continuous`` step mixes both (:meth:`StepCost.mixed_step_s`): the decode step of its decoding rows plus
  ``a1`` per prefill-chunk token and ``a2`` per (chunk token x context) pair, one fixed ``b0``.

**Calibration** (:func:`fit`): non-negative least squares (``scipy.optimize.nnls``: a cost never runs
backwards) of ``prefill_s`` on the prefill features and of ``tpot_s`` (the mean decode step) on the step features
at the request's mean context ``prompt + output / 2`` (every step term is linear in the context, so this is the
mean step), over measured request rows with ``batch_size``, ``prompt_tokens``, ``output_tokens``, ``prefill_s``
and ``tpot_s`` (experiments 01 batch size and 02 context length, and the serving sweeps' ``synchronous``
points), **one median per workload** (a point's repeats share its moment on this machine: 56 repeats of one
workload must not outweigh one of another) and **only the served configuration's rows** (:func:`plain_rows`: engine
tuning's bfloat16 / int8 arms and the speed techniques' rows measure another engine; mixed in, they pulled the
prefill term 40% low on the default run). Its **out-of-sample error**: each workload (a distinct ``(batch_size, prompt_tokens)``) predicted by a fit
on the others (leave-one-workload-out), median ``|predicted / measured - 1|`` (``loo_prefill_error``,
``loo_step_error``), beside the in-sample error. Or :func:`from_roofline`: the roofline's prediction for a
device and a model config (a what-if past this machine), sampled on a grid and fitted the same way (its error
against the roofline is ``in_sample_*``; it inherits the roofline's own error).

**Served requests** (:func:`with_serving`): a request through ``workbench serve`` also pays what a bare ``generate``
call does not: the chat template and tokenisation, the engine's admission, the HTTP and SSE path before its first
token, and per streamed token the incremental detokenisation and one event. Two additive terms carry them,
``serving_first_s`` (per request, to the first token) and ``serving_step_s`` (per decode step of the engine, whatever
its batch), fitted on points of one request at a time (no queue, no batch:
:func:`workbench.predict.twin_validation.calibration_points` picks streaming anatomy's HTTP point at concurrency 1 and the
streaming reader's own streams, outside the serving experiments, else a serving sweep's ``synchronous`` point; valid
points only; one median per point, then the median over points) as the median of the measured ``ttft_s - queue_s`` and
``tpot_s`` over the generate-fitted model's predictions; the twin folds them into ``first_token_overhead_s`` and
``b0``. Per step, not per row: the served static engine's batch-8 step cost what bare ``generate``'s did, and a
term fitted at batch 1 carries the machine's speed at that point's moment; charged per row it was multiplied by the
batch, charged per step it is bounded (results/LOG.md, 2026-12-05: the figures). A calibration point inside the serving
experiments is then in-sample, and the validation leaves it out of its errors
(:func:`workbench.predict.twin_validation.validate`).

**The machine's speed at each moment** (:func:`workbench.run.drift.speed_probe`): where the rows' points carry a
speed probe (``speed_probe_tpot_s``, the drift reference right before and after the point; :func:`with_speed` joins
it from ``points.parquet``), :func:`fit` and :func:`with_serving` first divide each row's times by its point's
``probe / reference`` (``reference_tpot_s``: the median probe over the fitted workloads), so the coefficients are the
costs at one speed, and :meth:`StepCost.at_speed` rescales the whole model to a measured point's own probe before the
twin predicts it. A shared CPU's speed swings within a sweep; a sweep's start and end references did not follow it
(results/LOG.md, 2026-12-05: how far), a reading beside each point does. A row
without a probe counts as measured at the reference speed, and a cost without ``reference_tpot_s`` is never
rescaled.

A calibration travels as ``twin_calibration.json`` (:func:`save`, :func:`load`; ``workbench simulate --out`` writes
it), so a twin can be built from someone else's shared run without its model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError

CALIBRATION_FILE = "twin_calibration.json"
VERSION = 1
PREFILL_TERMS = ("a0", "a1", "a2")
STEP_TERMS = ("b0", "b1", "b2", "b3")


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Per-step costs (module docstring), in seconds.

    Attributes:
        a0, a1, a2: prefill: fixed, per row-token, per row-token squared.
        b0, b1, b2, b3: decode step: fixed, per row, per cached token (all rows), two-rows-or-more switch.
        first_token_overhead_s: a ``generate`` call's time from admission to its first token beyond the prompt's
            forward pass (setup, logits processing, the first sampling; the roofline's ``ttft_overhead_s``), paid
            once per ``fifo`` / ``static`` batch.
        source: where the coefficients come from (``fit:<run>``, ``roofline:<device>/<model>``, ``given``).
        batch_residual_s: ``((batch_size, seconds), ...)``, ascending: the decode step's measured residual over the
            linear form at each measured batch size (module docstring); empty: the linear form alone.
        serving_first_s, serving_step_s: the served request's own costs (:func:`with_serving`), already
            included in ``first_token_overhead_s`` and ``b0`` (per step); 0 when not calibrated on served rows.
        serving_points: the point ids the serving terms were fitted on (empty when none).
        reference_tpot_s: the speed probe (:func:`workbench.run.drift.speed_probe`, seconds) the coefficients are
            the costs at (:meth:`at_speed`); NaN: fitted without probes, never rescaled.
        n_rows: measured rows the fit saw (0: not a fit on measurements).
        in_sample_prefill_error, in_sample_step_error, loo_prefill_error, loo_step_error: median
            ``|predicted / measured - 1|``; ``loo_*`` leave-one-workload-out (the error to quote); NaN when unknown.
    """

    a0: float = 0.0
    a1: float = 0.0
    a2: float = 0.0
    b0: float = 0.0
    b1: float = 0.0
    b2: float = 0.0
    b3: float = 0.0
    first_token_overhead_s: float = 0.0
    source: str = "given"
    n_rows: int = 0
    serving_first_s: float = 0.0
    serving_step_s: float = 0.0
    serving_points: tuple = ()
    reference_tpot_s: float = float("nan")
    batch_residual_s: tuple = ()
    in_sample_prefill_error: float = float("nan")
    in_sample_step_error: float = float("nan")
    loo_prefill_error: float = float("nan")
    loo_step_error: float = float("nan")

    def __post_init__(self):
        for k in PREFILL_TERMS + STEP_TERMS + ("first_token_overhead_s",):
            checks.check_float(k, getattr(self, k), lo=0)
        if self.a0 + self.a1 + self.a2 <= 0 or self.b0 + self.b1 + self.b2 + self.b3 <= 0:
            raise ParameterError("cost: prefill and decode step both need a positive cost (all coefficients 0)")
        if len(self.batch_residual_s) > checks.MAX_BATCH_SIZE:
            raise ParameterError(f"batch_residual_s: at most {checks.MAX_BATCH_SIZE} rows "
                                 f"(got {len(self.batch_residual_s)})")
        table = tuple(sorted((int(b), float(r)) for b, r in self.batch_residual_s))
        if any(b < 1 or not math.isfinite(r) for b, r in table):
            raise ParameterError("batch_residual_s: batch sizes >= 1 with finite residuals (seconds)")
        if table and table[-1][0] > checks.MAX_BATCH_SIZE:  # r(B) is tabulated up to the largest (a lookup a step)
            raise ParameterError(f"batch_residual_s: batch sizes must be <= {checks.MAX_BATCH_SIZE} "
                                 f"(got {table[-1][0]})")
        object.__setattr__(self, "batch_residual_s", table)
        # r(B) for every batch size up to the largest measured (the twin asks once a step: a lookup, not np.interp)
        sizes = np.arange(1, table[-1][0] + 1) if table else np.arange(0)
        object.__setattr__(self, "_residual", dict(zip(sizes.tolist(), _residuals(sizes, table).tolist())))

    def residual_s(self, batch: int) -> float:
        """``r(batch)``: the step's measured residual at ``batch`` rows (seconds; module docstring), 0 past the
        largest measured batch size or without a table."""
        return self._residual.get(int(batch), 0.0)

    def prefill_s(self, batch: int, tokens: float) -> float:
        """One padded prefill of ``batch`` rows of ``tokens`` computed prompt tokens each."""
        return self.a0 + self.a1 * batch * tokens + self.a2 * batch * tokens * tokens

    def step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` rows holding ``context_tokens`` cached tokens in all."""
        linear = self.b0 + self.b1 * batch + self.b2 * context_tokens + (self.b3 if batch > 1 else 0.0)
        return float(_floored(linear, self.residual_s(batch)))

    def steps_s(self, batch: int, prompt_tokens: int, steps: int) -> np.ndarray:
        """The durations of ``steps`` consecutive decode steps of a padded batch (row context ``prompt_tokens + k``
        at step ``k`` = 1..steps): a numpy array of seconds."""
        k = np.arange(1, steps + 1, dtype=float)
        linear = self.b0 + self.b1 * batch + self.b2 * batch * (prompt_tokens + k) + (self.b3 if batch > 1 else 0.0)
        return _floored(linear, self.residual_s(batch))

    def mixed_step_s(self, decode_rows: int, context_tokens: float, chunk_tokens: float, chunk_pairs: float) -> float:
        """One ``continuous`` step: ``decode_rows`` decoding rows over ``context_tokens`` cached tokens, plus
        prefill chunks of ``chunk_tokens`` tokens in all that attend to ``chunk_pairs`` (token x context) pairs."""
        rows = decode_rows + (1 if chunk_tokens else 0)
        linear = self.b0 + self.b1 * decode_rows + self.b2 * context_tokens + (self.b3 if rows > 1 else 0.0)
        return float(_floored(linear, self.residual_s(rows))) + self.a1 * chunk_tokens + self.a2 * chunk_pairs

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """One request alone (batch 1, a ``generate`` call): prefill, the first-token overhead and
        ``output_tokens - 1`` decode steps."""
        return (self.prefill_s(1, prompt_tokens) + self.first_token_overhead_s
                + float(self.steps_s(1, prompt_tokens, max(output_tokens - 1, 0)).sum()))

    def at_speed(self, probe_tpot_s) -> tuple["StepCost", float]:
        """This cost at the machine's speed of a moment whose speed probe read ``probe_tpot_s`` seconds
        (:func:`workbench.run.drift.speed_probe`): every time term times ``factor = probe_tpot_s /
        reference_tpot_s``.

        Returns:
            ``(cost, factor)``; ``(self, 1.0)`` when either figure is missing, NaN or not positive.
        """
        factor = _speed_factor(probe_tpot_s, self.reference_tpot_s)
        if factor == 1.0:
            return self, 1.0
        terms = PREFILL_TERMS + STEP_TERMS + ("first_token_overhead_s", "serving_first_s", "serving_step_s")
        table = tuple((b, r * factor) for b, r in self.batch_residual_s)
        return dataclasses.replace(self, batch_residual_s=table, **{k: getattr(self, k) * factor for k in terms}), factor

    def describe(self) -> str:
        """One line: the source and the out-of-sample errors."""
        err = (f"leave-one-workload-out error prefill {self.loo_prefill_error:.0%}, step {self.loo_step_error:.0%}"
               if self.loo_step_error == self.loo_step_error else "no out-of-sample error (not fitted on measurements)")
        served = (f"; served-request terms {self.serving_first_s * 1e3:.0f} ms to first token, "
                  f"{self.serving_step_s * 1e3:.1f} ms per decode step, from the one-at-a-time served "
                  f"point{'s' if len(self.serving_points) > 1 else ''} {', '.join(self.serving_points)}"
                  if self.serving_points else "")
        table = (f"; step residual by batch size {', '.join(f'{b}: {r * 1e3:+.0f} ms' for b, r in self.batch_residual_s)}"
                 if self.batch_residual_s else "")
        speed = (f"; costs at the speed probe's {self.reference_tpot_s * 1e3:.1f} ms, rescaled to each measured "
                 f"point's own" if _positive(self.reference_tpot_s) else "")
        return f"cost model {self.source} ({self.n_rows} rows; {err}{served}{table}{speed})"

    def to_dict(self) -> dict:
        return {"version": VERSION, **dataclasses.asdict(self),
                "batch_residual_s": [list(x) for x in self.batch_residual_s]}

    @classmethod
    def from_dict(cls, d: dict) -> "StepCost":
        """From :meth:`to_dict` output (ParameterError, one line, on a bad or foreign file)."""
        if not isinstance(d, dict) or d.get("version") != VERSION:
            raise ParameterError(f"calibration: not a twin calibration of version {VERSION}")
        fields = {f.name for f in dataclasses.fields(cls)}
        vals = {k: (float("nan") if v is None else v) for k, v in d.items() if k in fields}
        vals["serving_points"] = tuple(str(x) for x in (d.get("serving_points") or ()))
        try:
            vals["batch_residual_s"] = tuple((int(b), float(r)) for b, r in (d.get("batch_residual_s") or ()))
        except (TypeError, ValueError):
            raise ParameterError("calibration: batch_residual_s must be [batch_size, seconds] pairs") from None
        return cls(**vals)


# ----------------------------------------------------------------------------- fitting


def _positive(v) -> bool:
    try:
        return math.isfinite(float(v)) and float(v) > 0
    except (TypeError, ValueError):
        return False


def _speed_factor(probe, reference) -> float:
    """``probe / reference`` (both seconds); 1.0 when either is missing, NaN or not positive."""
    return float(probe) / float(reference) if _positive(probe) and _positive(reference) else 1.0


def with_speed(requests: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with each row's point's speed probe (``speed_probe_tpot_s``,
    :func:`workbench.run.drift.speed_probe`) joined from ``points`` by ``point_id``; ``requests`` unchanged when
    either table lacks the columns."""
    col = "speed_probe_tpot_s"
    if points is None or points.empty or col not in points or "point_id" not in points or "point_id" not in requests:
        return requests
    probe = pd.to_numeric(points.drop_duplicates("point_id").set_index("point_id")[col], errors="coerce")
    probe.index = probe.index.astype(str)
    return requests.assign(**{col: requests["point_id"].astype(str).map(probe).astype(float)})


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    # relative least squares: each row scaled by 1/y, so short and long workloads weigh alike
    w = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(X * w[:, None], y * w)
    return coef


def _prefill_X(b, length):
    return np.column_stack([np.ones(len(b)), b * length, b * length * length])


def _step_X(b, c):
    return np.column_stack([np.ones(len(b)), b, c, (b > 1).astype(float)])


def _ape(pred, y) -> float:
    return float(np.median(np.abs(pred / y - 1))) if len(y) else float("nan")


def _residual_table(batch: np.ndarray, resid: np.ndarray) -> tuple:
    """``((B, median residual), ...)`` over the workloads at each batch size ``B`` (module docstring)."""
    return tuple((int(b), float(np.median(resid[batch == b]))) for b in sorted(set(batch.astype(int))))


def _residuals(batch, table: tuple) -> np.ndarray:
    """``r(batch)`` from ``table`` (``((B, seconds), ...)`` ascending): interpolated between the measured sizes, 0
    past the largest and without a table (module docstring). ``batch``: an array of batch sizes."""
    batch = np.asarray(batch, dtype=float)
    if not table:
        return np.zeros_like(batch)
    xs, ys = zip(*table)
    return np.where(batch <= xs[-1], np.interp(batch, xs, ys), 0.0)


def _floored(linear, residual):
    """The step: ``linear + residual``, never below half the linear form's (module docstring)."""
    return np.maximum(linear + residual, 0.5 * linear)


def _with_table(linear: np.ndarray, batch: np.ndarray, table: tuple) -> np.ndarray:
    """``linear`` step predictions with ``table``'s residual at each row's ``batch`` (:meth:`StepCost.step_s`)."""
    return _floored(linear, _residuals(batch, table))


def _loo(X, y, groups, batch=None) -> float:
    """Leave-one-workload-out error (module docstring); with ``batch`` (the rows' batch sizes) the left-out
    workload is also predicted with the residual table of the others (:func:`_residual_table`)."""
    keys = sorted(set(groups))
    if len(keys) < 2:
        return float("nan")
    errs = []
    for k in keys:
        out = np.asarray([g == k for g in groups])
        coef = _nnls(X[~out], y[~out])
        pred = X[out] @ coef
        if batch is not None:
            table = _residual_table(batch[~out], y[~out] - X[~out] @ coef)
            pred = _with_table(pred, batch[out], table)
        errs += list(np.abs(pred / y[out] - 1))
    return float(np.median(errs))


# the configuration the server runs (its engines load the model as measure/models does by default): a row measured
# under another (engine tuning's bfloat16 or int8 arms, a speed technique) says nothing about the served costs
PLAIN = {"dtype": ("float32",), "quantization": ("none",), "technique": ("none",),
         "cache_implementation": ("dynamic",), "attn_implementation": ("sdpa",), "compile": ("False", "false", "0")}


def plain_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` less the rows measured under a configuration the server does not run (:data:`PLAIN`: a column
    that is present and set to another value, e.g. engine tuning's ``dtype=bfloat16`` or a speed technique)."""
    keep = pd.Series(True, index=requests.index)
    for col, ok in PLAIN.items():
        if col in requests:
            v = requests[col]
            keep &= v.isna() | v.astype(str).isin(ok + ("", "None", "nan"))
    return requests[keep]


def rows_for_fit(requests: pd.DataFrame) -> pd.DataFrame:
    """The measured rows a fit can use: ``batch`` (``batch_size``, else ``engine_batch``), ``prompt_tokens``,
    ``output_tokens``, ``prefill_s``, ``tpot_s`` numeric (``ttft_s``, ``queue_s``, ``speed_probe_tpot_s`` kept
    where present); errored rows and rows of another configuration than the
    served one (:func:`plain_rows`) dropped."""
    df = plain_rows(requests)
    if "error" in df:
        df = df[df["error"].isna() | (df["error"].astype(str) == "")]
    batch = pd.to_numeric(df.get("batch_size", pd.Series(np.nan, index=df.index)), errors="coerce")
    if "engine_batch" in df:
        batch = batch.fillna(pd.to_numeric(df["engine_batch"], errors="coerce"))
    out = pd.DataFrame({"batch": batch.fillna(1.0)})
    for col in ("prompt_tokens", "output_tokens", "prefill_s", "tpot_s", "ttft_s", "queue_s", "speed_probe_tpot_s"):
        out[col] = pd.to_numeric(df.get(col, pd.Series(np.nan, index=df.index)), errors="coerce")
    return out[out["prompt_tokens"] > 0]


def _at_reference(df: pd.DataFrame, reference: float) -> pd.DataFrame:
    """:func:`rows_for_fit` rows with their times (``prefill_s``, ``tpot_s``, ``ttft_s``; not the queue, which is
    other requests' service) divided by their speed factor (module docstring); rows without a probe unchanged."""
    if not _positive(reference):
        return df
    factor = df["speed_probe_tpot_s"].map(lambda v: _speed_factor(v, reference))
    times = ("prefill_s", "tpot_s", "ttft_s")   # each measured time brought to the reference speed (not a TPOT formula)
    return df.assign(**{col: df[col].div(factor) for col in times})


def _medians(df: pd.DataFrame, col: str) -> pd.DataFrame:
    """Per workload ``(batch, prompt_tokens)``: the median of ``col`` and of ``output_tokens``."""
    if df.empty:
        return df
    return df.groupby(["batch", "prompt_tokens"], as_index=False)[[col, "output_tokens"]].median()


def fit(requests: pd.DataFrame, source: str = "fit") -> StepCost:
    """:class:`StepCost` fitted on measured request rows (module docstring), with its out-of-sample error.

    Args:
        requests: rows of a run's ``requests.parquet`` (any experiments; :func:`rows_for_fit` picks the usable),
            with their point's ``speed_probe_tpot_s`` where measured (:func:`with_speed`; module docstring).
        source: the label kept in :attr:`StepCost.source`.

    Raises:
        ParameterError: fewer than 3 rows with ``prefill_s`` or 4 with ``tpot_s`` (one line).
    """
    df = rows_for_fit(requests)
    # the rows' speed probes: one reference (the median over workloads of their median probe), every row's times
    # brought to it (module docstring)
    probed = df[df["speed_probe_tpot_s"] > 0]
    reference = (float(probed.groupby(["batch", "prompt_tokens"])["speed_probe_tpot_s"].median().median())
                 if len(probed) else float("nan"))
    df = _at_reference(df, reference)
    # one observation per workload (its median): the repeats of a point share its moment on this machine and are not
    # independent observations, and 56 repeats of one workload must not outweigh one repeat of another
    pre = _medians(df[np.isfinite(df["prefill_s"]) & (df["prefill_s"] > 0)], "prefill_s")
    dec = _medians(df[np.isfinite(df["tpot_s"]) & (df["tpot_s"] > 0) & (df["output_tokens"] > 1)], "tpot_s")
    if len(pre) < 3 or len(dec) < 4:
        raise ParameterError(f"calibration: a twin needs measured prefill_s and tpot_s on >= 3 and >= 4 workloads (got "
                             f"{len(pre)} and {len(dec)}): a batch-size / context-length or serving run")
    b, lengths, y = (pre[c].to_numpy(float) for c in ("batch", "prompt_tokens", "prefill_s"))
    Xp = _prefill_X(b, lengths)
    a = _nnls(Xp, y)
    gp = list(zip(b, lengths))
    bd, ld, nd, yd = (dec[c].to_numpy(float) for c in ("batch", "prompt_tokens", "output_tokens", "tpot_s"))
    Xd = _step_X(bd, bd * (ld + nd / 2))
    bb = _nnls(Xd, yd)
    gd = list(zip(bd, ld))
    if a.sum() <= 0:
        a[0] = float(np.median(y))
    # the first-token overhead: admission to first token beyond the forward pass, where the rows say it (serving
    # rows: ttft - queue - prefill); else batch-1 rows' ttft - prefill (which also holds their templating)
    over = (df["ttft_s"] - df["queue_s"] - df["prefill_s"]).dropna()
    if over.empty:
        one = df[df["batch"] == 1]
        over = (one["ttft_s"] - one["prefill_s"]).dropna()
    first = max(0.0, float(over.median())) if len(over) else 0.0
    if bb.sum() <= 0:
        bb[0] = float(np.median(yd))
    # the step's residual at each measured batch size (module docstring: a CPU's kernels are not linear in the rows)
    table = _residual_table(bd, yd - Xd @ bb)
    return StepCost(*map(float, a), *map(float, bb), first_token_overhead_s=first, source=source, n_rows=int(len(df)),
                    reference_tpot_s=reference, batch_residual_s=table, in_sample_prefill_error=_ape(Xp @ a, y),
                    in_sample_step_error=_ape(_with_table(Xd @ bb, bd, table), yd),
                    loo_prefill_error=_loo(Xp, y, gp), loo_step_error=_loo(Xd, yd, gd, bd))


def with_serving(cost: StepCost, requests: pd.DataFrame, point_ids) -> StepCost:
    """``cost`` plus the served request's own costs (module docstring), fitted on the request rows of the
    ``point_ids`` points (one request at a time: streaming anatomy's HTTP point at concurrency 1, or a
    ``synchronous`` serving point).

    Args:
        cost: a cost fitted on bare ``generate`` rows (:func:`fit`).
        requests: request rows with ``point_id``, ``prompt_tokens``, ``output_tokens``, ``ttft_s``, ``queue_s``,
            ``tpot_s`` (``queue_s`` absent: 0) and, where measured, ``speed_probe_tpot_s`` (:func:`with_speed`: the
            rows are brought to ``cost.reference_tpot_s`` first).
        point_ids: the calibration points' ids.

    Returns:
        A :class:`StepCost` whose ``first_token_overhead_s`` and ``b0`` include the two terms (each the median over
        the points of a point's median excess over ``cost``'s prediction, floored at 0), ``serving_points`` naming
        the points; ``cost`` itself when no usable row is there.
    """
    ids = [str(p) for p in point_ids]
    rows = requests[requests["point_id"].astype(str).isin(ids)] if "point_id" in requests else requests.iloc[:0]
    df = _at_reference(rows_for_fit(rows), cost.reference_tpot_s)   # each point at the cost's speed
    df = df[np.isfinite(df["ttft_s"])]
    if df.empty:
        return cost
    # one median per point, then the median over points: each point is one moment of this machine (its rows share
    # it), and a point that stored more rows must not outweigh the others
    pid = rows.loc[df.index, "point_id"].astype(str)
    queue = df["queue_s"].fillna(0.0)
    alone = np.array([cost.prefill_s(1, float(L)) for L in df["prompt_tokens"]]) + cost.first_token_overhead_s
    first = max(0.0, float(np.median((df["ttft_s"] - queue - alone).groupby(pid).median())))
    dec = df[np.isfinite(df["tpot_s"]) & (df["output_tokens"] > 1)]
    per_step = 0.0
    if not dec.empty:
        step = np.array([cost.step_s(1, float(L) + float(N) / 2) for L, N in zip(dec["prompt_tokens"],
                                                                              dec["output_tokens"])])
        per_step = max(0.0, float(np.median((dec["tpot_s"] - step).groupby(pid.loc[dec.index]).median())))
    return dataclasses.replace(cost, first_token_overhead_s=cost.first_token_overhead_s + first,
                               b0=cost.b0 + per_step, serving_first_s=first, serving_step_s=per_step,
                               serving_points=tuple(sorted(set(ids) & set(rows["point_id"].astype(str)))))


def from_roofline(shape, device, calib=None, threads: int | None = None, max_batch: int = 64,
                  max_tokens: int = 8192, source: str = "") -> StepCost:
    """:class:`StepCost` from the roofline (:func:`workbench.predict.roofline.predict` terms) of ``shape`` on ``device``:
    prefill and step times sampled over batches 1..``max_batch`` and contexts 16..``max_tokens`` and fitted as in
    :func:`fit` (on an accelerator the roofline is a max of memory and compute, which the linear form
    approximates; ``in_sample_*`` says how well).

    Args:
        shape: :class:`workbench.predict.roofline.ModelShape` (e.g. ``ModelShape.from_config(config_json)``).
        device: :class:`workbench.predict.roofline.Device` (bandwidth and FLOP/s of the what-if device).
        calib: :class:`workbench.predict.roofline.Calibration` (default: uncalibrated, the pure roofline).

    Raises:
        ParameterError: a device without a positive bandwidth or FLOP/s (one line).
    """
    from workbench.predict import roofline

    if not (device.bandwidth_bytes_per_s and device.bandwidth_bytes_per_s > 0):
        raise ParameterError("device: the profile needs bandwidth_bytes_per_s > 0")
    if not (device.flops_per_s and device.flops_per_s > 0):
        raise ParameterError("device: the profile needs flops_per_s > 0")
    calib = calib or roofline.Calibration()
    flops, bw = device.flops_at(threads), device.bandwidth_bytes_per_s
    batches = sorted({int(x) for x in np.geomspace(1, max_batch, 7)})
    lens = sorted({int(x) for x in np.geomspace(16, max_tokens, 8)})
    pb, pl, py, db, dc, dy = [], [], [], [], [], []
    for B in batches:
        for L in lens:
            nb, nf = roofline.prefill_terms(shape, B, L)
            t, _ = roofline.phase_time(nb / bw, nf / flops / calib.prefill_efficiency, calib.prefill_overhead_s,
                                   device.overlap)
            pb.append(B), pl.append(L), py.append(t)
            nb, nf = roofline.decode_terms(shape, B, L, calib.kv_traffic)
            t, _ = roofline.phase_time(nb / bw, nf / flops / calib.decode_efficiency,
                                   calib.step_overhead_s + calib.step_row_overhead_s * B
                                   + (calib.batched_step_overhead_s if B > 1 else 0.0), device.overlap)
            db.append(B), dc.append(B * L), dy.append(t)
    pb, pl, py, db, dc, dy = map(np.asarray, (pb, pl, py, db, dc, dy))
    Xp, Xd = _prefill_X(pb.astype(float), pl.astype(float)), _step_X(db.astype(float), dc.astype(float))
    a, bb = _nnls(Xp, py), _nnls(Xd, dy)
    return StepCost(*map(float, a), *map(float, bb), source=source or f"roofline:{device.name}",
                    in_sample_prefill_error=_ape(Xp @ a, py), in_sample_step_error=_ape(Xd @ bb, dy))


def device_profile(text: str, dtype: str = "bfloat16"):
    """A what-if :class:`workbench.predict.roofline.Device` from ``"bandwidth=3.35e12,flops=9.9e14[,name=h100]"``
    (bytes/s and FLOP/s; ``overlap`` True: an accelerator) or from a JSON file with those keys.

    Raises:
        ParameterError: a missing or non-positive bandwidth or FLOP/s, an unknown key (one line).
    """
    from workbench.predict import roofline

    p = Path(text)
    if p.suffix == ".json" and p.is_file():
        checks.check_file_size("device_profile", p)
        raw = json.loads(p.read_text(encoding="utf-8"))
    else:
        raw = {}
        for part in filter(None, (x.strip() for x in str(text).split(","))):
            k, _, v = part.partition("=")
            raw[k.strip()] = v.strip()
    unknown = set(raw) - {"bandwidth", "flops", "name", "overlap"}
    if unknown:
        raise ParameterError(f"device_profile: unknown key {', '.join(sorted(unknown))} "
                             "(allowed: bandwidth, flops, name, overlap)")
    vals = {}
    for k in ("bandwidth", "flops"):
        if k not in raw:
            raise ParameterError(f"device_profile: needs {k} (bytes/s and FLOP/s), e.g. bandwidth=3.35e12,flops=9.9e14")
        try:
            vals[k] = float(raw[k])
        except (TypeError, ValueError):
            raise ParameterError(f"device_profile: {k} must be a number (got {raw[k]!r})") from None
        if not (vals[k] > 0 and math.isfinite(vals[k])):
            raise ParameterError(f"device_profile: {k} must be > 0 (got {raw[k]!r})")
    overlap = str(raw.get("overlap", "true")).lower() not in ("0", "false", "no")
    return roofline.Device(vals["bandwidth"], vals["flops"], threads=1, overlap=overlap,
                           name=str(raw.get("name", "profile")), dtype=dtype)


# ----------------------------------------------------------------------------- a run folder's calibration


def save(run_dir, cost: StepCost) -> Path:
    """Write ``cost`` as ``<run_dir>/twin_calibration.json`` (atomic); returns the path."""
    from workbench.run import results

    path = Path(run_dir) / CALIBRATION_FILE
    text = json.dumps(cost.to_dict(), indent=1, allow_nan=True)
    return results.atomic_write(path, lambda f: f.write(text), text=True)


def load(run_dir) -> StepCost:
    """The run folder's calibration: its ``twin_calibration.json`` when present, else a fit on its
    ``requests.parquet`` (:func:`fit`).

    Raises:
        ParameterError: no such folder, or neither file usable (one line).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ParameterError(f"calibration: no such run folder {str(run)!r}")
    f = run / CALIBRATION_FILE
    if f.is_file():
        try:
            return StepCost.from_dict(json.loads(f.read_text(encoding="utf-8")))
        except ValueError as exc:
            raise ParameterError(f"calibration: {f} is not JSON ({exc})") from None
    req = run / "requests.parquet"
    if not req.is_file():
        raise ParameterError(f"calibration: {str(run)!r} has neither {CALIBRATION_FILE} nor requests.parquet")
    points = run / "points.parquet"
    requests = pd.read_parquet(req)
    if points.is_file():
        requests = with_speed(requests, pd.read_parquet(points))
    return fit(requests, source=f"fit:{run.name}")
