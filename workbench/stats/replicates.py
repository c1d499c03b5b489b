"""The run as the unit: paired comparisons over replicate runs, and an A/A control's verdict (issue 32).

Under a queue one request's delay carries into every later request of the same run, so the requests of one run
are not independent samples: pairing them across two runs (one per arm) and taking a t interval over the request
pairs claims a direction far more often than its nominal 5% when the arms are identical
(``benchmarks/aa_queue.py``; ``tests/stats/test_replicates.py``). The unit here is a whole run: each arm is run once per
replicate (an arrival seed, a fresh engine each), one statistic is taken per run (the interactive class's TTFT
p90, a point's goodput), and the two arms are paired by replicate.

- :func:`paired_log_ratio`: ``(ratio, low, high)`` of arm ``a`` over arm ``b`` from per-unit values paired by
  index: a Student-t interval over the units' log ratios, back-transformed (the geometric-mean ratio; the paired
  t-test of Student 1908 on the log scale). NaN bounds with fewer than two units: one run supports no interval.
- :func:`compare_runs`: one column of two arms of a table of per-run statistics (``workload``, ``arm``,
  ``replicate``), paired by replicate through :func:`paired_log_ratio`.
- :func:`verdict`: ``faster`` / ``slower`` / ``no difference beyond noise`` / ``one run: not supported``.
- :func:`aa_columns`: the A/A control's ``aa_ratio``, ``aa_low``, ``aa_high`` with ``design`` and ``rounds``
  (docs/design.md section 10), and :func:`aa_moved`: whether the control itself shows a direction.

Kept small and general on purpose: the lead merges it with the generation half's comparison module.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from workbench.errors import ParameterError

CONFIDENCE = 0.95
ONE_RUN = "one run: not supported"


def paired_log_ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
                     ) -> tuple[float, float, float]:
    """Ratio ``a / b`` over units paired by index, with its two-sided t interval.

    Args:
        a, b: one positive value per unit (a run's statistic per replicate seed), the same length; a pair with a
            non-finite or non-positive value on either side is dropped.
        confidence: nominal coverage in (0, 1).

    Returns:
        ``(ratio, low, high)``: ``exp(mean(log(a_i / b_i)))`` and ``exp(mean +- t_{n-1} * sd / sqrt(n))``; the
        bounds are NaN with fewer than two usable pairs (the ratio of the one pair is still returned), all three
        NaN with none.

    Raises:
        ParameterError: ``a`` and ``b`` of different lengths, or ``confidence`` outside (0, 1).
    """
    from workbench.stats.evidence import paired_ratio_interval

    if not 0 < confidence < 1:
        raise ParameterError(f"confidence: must be in (0, 1) (got {confidence})")
    x, y = np.asarray(list(a), dtype=float), np.asarray(list(b), dtype=float)
    if x.shape != y.shape:
        raise ParameterError(f"a, b: must pair unit by unit (got {x.size} and {y.size} values)")
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    iv = paired_ratio_interval(x[keep], y[keep], confidence, unit="runs")  # t over the log ratios (one home)
    return float(iv.estimate), float(iv.low), float(iv.high)


def verdict(low: float, high: float, lower_is_better: bool = True) -> str:
    """The direction an interval of a ratio (arm / baseline) carries.

    Returns:
        ``one run: not supported`` without an interval (NaN bounds), ``no difference beyond noise`` when it
        includes 1, else ``faster`` / ``slower`` (``lower_is_better``: a latency) or ``higher`` / ``lower``.
    """
    if not (low == low and high == high):
        return ONE_RUN
    if low <= 1 <= high:
        return "no difference beyond noise"
    below = high < 1
    if lower_is_better:
        return "faster" if below else "slower"
    return "lower" if below else "higher"


def claims_direction(low: float, high: float) -> bool:
    """True when an interval of a ratio exists and excludes 1."""
    return low == low and high == high and not (low <= 1 <= high)


def aa_columns(a: Sequence[float], a2: Sequence[float], design: str = "replicates",
               confidence: float = CONFIDENCE) -> dict:
    """The A/A control's columns: the baseline measured twice per replicate (the same seeds), paired by seed.

    Args:
        a, a2: the baseline's per-run statistic in its two arms, one value per replicate, in the same order.
        design: how the arms were laid out (docs/design.md section 10: ``interleaved`` or ``blocks``; queue
            experiments: ``replicates``, one run per arm and seed, arms alternating within a seed).
        confidence: nominal coverage.

    Returns:
        ``{"aa_ratio", "aa_low", "aa_high", "design", "rounds"}`` (:func:`paired_log_ratio`; ``rounds`` the
        replicates that paired).
    """
    ratio, low, high = paired_log_ratio(a, a2, confidence)
    x, y = np.asarray(list(a), dtype=float), np.asarray(list(a2), dtype=float)
    rounds = int(np.sum(np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)))
    return {"aa_ratio": ratio, "aa_low": low, "aa_high": high, "design": design, "rounds": rounds}


def aa_moved(row) -> bool:
    """Whether an A/A control (a row or dict with ``aa_low`` / ``aa_high``) shows a direction: then every
    comparative finding of the experiment is "not supported: the A/A control moved"."""
    get = row.get
    return claims_direction(float(get("aa_low", float("nan"))), float(get("aa_high", float("nan"))))


def describe(ratio: float, low: float, high: float, fmt: str = "{:.2f}") -> str:
    """``0.83x (0.71-0.97x)`` or ``0.83x (one run: no interval)``."""
    if ratio != ratio:
        return "no runs"
    if low == low and high == high:
        return f"{fmt.format(ratio)}x ({fmt.format(low)}-{fmt.format(high)}x)"
    return f"{fmt.format(ratio)}x (one run: no interval)"


def compare_runs(stats: pd.DataFrame, arm: str, base: str, column: str, workload: str = "mixed",
                 confidence: float = CONFIDENCE) -> dict:
    """``column`` of arm ``arm`` over arm ``base``, runs paired by round: :func:`paired_log_ratio`.

    Returns:
        ``{"ratio", "low", "high", "rounds"}`` (NaN bounds with one paired round: "one run: not supported").
    """
    g = stats[stats["workload"] == workload]
    a = g[g["arm"] == arm].groupby("replicate")[column].first().dropna()
    b = g[g["arm"] == base].groupby("replicate")[column].first().dropna()
    both = a.index.intersection(b.index)
    ratio, low, high = paired_log_ratio(a.loc[both], b.loc[both], confidence)
    return {"ratio": ratio, "low": low, "high": high, "rounds": int(len(both))}
