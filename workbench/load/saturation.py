"""Did an open-loop load point keep up with its arrivals? Three answers, and the knee they place (issue 32).

A server keeps up when it completes requests as fast as they arrive; past its capacity completions fall to that
capacity and the queue grows. Both rates are estimated from a few dozen events, so comparing them with a fixed
tolerance answers at random near the knee (at 40 requests a 10% tolerance said "fell behind" 24% of the time at
90% load and "kept up" 36% of the time at 110%). :func:`kept_up` answers with the noise band instead:

- the ratio ``completion_rps / arrival_rps`` gets an interval from the two event counts
  (:func:`rate_ratio_interval`: each count treated as Poisson over its span, the ratio of two Poisson rates by
  the conditional binomial, Clopper-Pearson bounds; Cox 1953, Przyborowski & Wilenski 1940 - conservative for a
  constant-rate arrival process, whose count is not random);
- or, where every request's timing is known, from **the growth of the backlog** (the in-flight growth test,
  :func:`workbench.load.load.backlog_growth`): the backlog each arrival finds, its slope over time by batch
  means; the ratio is ``1 - growth``. It decides with far fewer requests than the counts (at 40 requests the
  counts' band of a ratio of 1.0 is about 0.68-1.47), so it is used where its columns are present;
- **kept up** when the one-sided 95% lower bound reaches ``1 - tolerance`` (completions within the tolerance of
  arrivals, beyond the noise);
- **fell behind** when the one-sided 95% upper bound is below ``1 - tolerance`` (completions short of arrivals
  by more than the tolerance, beyond the noise), or the point stopped early by the over-saturation rule, or a
  planned request went unsent or unfinished. The tolerance is the line between the two, so a backlog that
  still fills from empty in a short run (a slope a few percent above 0) is not called "fell behind";
- **undetermined** otherwise: the interval straddles the line, and a longer point decides.

:func:`knee` scans rates upwards: the highest rate that kept up below the first that did not (fell behind or
undetermined). Stopped-early points take part (as "fell behind"): dropping them before the scan would let a rate
above an over-saturated one, kept up by chance, be the knee. They are still never recommended. Over a table of
points (one row per point, an ``engine`` column): :func:`sweep_points` (a sweep's rates, an engine comparison's runs left
out), :func:`knee_points` (the points a scan may use), :func:`point_rates`
(the rate a point is scanned at), :func:`knee_scan` (per engine the knee and why) and :func:`knees`; beside them
:func:`recommend`, per SLO the engine and the highest rate that met it (notebook 08's recommendation, and the
twin's on its simulated points).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.checks import float_or_nan
from workbench.load import load
from workbench.stats import evidence, slo

KEPT_UP = "kept up"
FELL_BEHIND = "fell behind"
UNDETERMINED = "undetermined"
VERDICTS = (KEPT_UP, FELL_BEHIND, UNDETERMINED)
KEPT_UP_TOLERANCE = 0.1   # the line: completions at least (1 - this) x arrivals keep up, beyond the noise
CONFIDENCE = 0.95         # one-sided, each way


def rate_ratio_interval(arrivals: int, arrival_rps: float, completions: int, completion_rps: float,
                        confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``completion_rps / arrival_rps`` with one-sided ``confidence`` bounds each way.

    Args:
        arrivals, completions: the events behind each rate (timestamps; the rate spans ``count - 1`` intervals,
            :func:`workbench.load.load.flow_rates`).
        arrival_rps, completion_rps: the two rates (requests/s).
        confidence: one-sided coverage of each bound (0.95: the two together a 90% interval).

    Returns:
        ``(ratio, low, high)``; NaN bounds when a count has no interval behind it (fewer than 2 events) or a
        rate is not positive.
    """
    from scipy.stats import binomtest

    nan = float("nan")
    x_a, x_c = int(arrivals) - 1, int(completions) - 1
    if not (arrival_rps == arrival_rps and arrival_rps > 0 and completion_rps == completion_rps):
        return nan, nan, nan
    ratio = completion_rps / arrival_rps
    if x_a < 1 or x_c < 1 or completion_rps <= 0:
        return ratio, nan, nan
    t_a, t_c = x_a / arrival_rps, x_c / completion_rps        # the spans (seconds)
    ci = binomtest(x_c, x_a + x_c).proportion_ci(confidence_level=1 - 2 * (1 - confidence), method="exact")

    def rho(p):
        return math.inf if p >= 1 else p / (1 - p) * t_a / t_c

    return ratio, rho(float(ci.low)), rho(float(ci.high))


def kept_up(point, tolerance: float = KEPT_UP_TOLERANCE, confidence: float = CONFIDENCE) -> str | None:
    """Whether an open-loop point kept up with its arrivals: the one definition (knee, recommendation, search).

    Args:
        point: a points row or a run summary (Series or dict): ``profile``, ``stopped_early``,
            ``requests_unsent``, ``requests_incomplete``, ``arrival_rps`` / ``completion_rps`` with
            ``arrival_count`` / ``completion_count`` (:func:`workbench.load.load.flow_rates`); rows without
            the counts use ``requests_planned_window`` for both, without the rates ``offered_rps`` and
            ``request_throughput_rps``; ``backlog_growth_low`` / ``backlog_growth_high`` (the in-flight growth
            test) decide in place of the counts where both are present.
        tolerance: kept up needs the ratio's lower bound at ``1 - tolerance`` or above (0-1).
        confidence: one-sided coverage of each bound.

    Returns:
        :data:`KEPT_UP`, :data:`FELL_BEHIND` or :data:`UNDETERMINED` (module docstring); None for a closed-loop
        point (no arrival process to keep up with).
    """
    get = point.get
    if get("profile") not in load.OPEN_LOOP:
        return None
    if bool(get("stopped_early") or False):
        return FELL_BEHIND
    for col in ("requests_unsent", "requests_incomplete"):
        v = float_or_nan(get(col))
        if v == v and v > 0:
            return FELL_BEHIND
    arr, comp = float_or_nan(get("arrival_rps")), float_or_nan(get("completion_rps"))
    if not (arr == arr and comp == comp):
        arr, comp = float_or_nan(get("offered_rps")), float_or_nan(get("request_throughput_rps"))
    n_a, n_c = float_or_nan(get("arrival_count")), float_or_nan(get("completion_count"))
    if not (n_a == n_a and n_c == n_c):
        n_a = n_c = float_or_nan(get("requests_planned_window"))
    if not (arr == arr and arr > 0 and comp == comp and n_a == n_a):
        return UNDETERMINED
    g_low, g_high = float_or_nan(get("backlog_growth_low")), float_or_nan(get("backlog_growth_high"))
    if g_low == g_low and g_high == g_high:       # the in-flight growth test: a backlog share per arrival
        low, high = 1 - g_high, 1 - g_low
    else:
        _, low, high = rate_ratio_interval(int(n_a), arr, int(n_c), comp, confidence)
    if high == high and high < 1 - tolerance:
        return FELL_BEHIND
    if low == low and low >= 1 - tolerance:
        return KEPT_UP
    return UNDETERMINED


def knee(rates: Sequence[float], verdicts: Sequence[str | None]) -> tuple[float, str]:
    """The highest rate that kept up, below the first rate that did not.

    Args:
        rates: the open-loop rates (requests/s), any order; stopped-early points included.
        verdicts: :func:`kept_up` of each (a stopped-early point's is :data:`FELL_BEHIND`).

    Returns:
        ``(knee, why)``: the knee (NaN when the lowest rate did not keep up) and what stopped the scan:
        ``"fell behind at R req/s"``, ``"undetermined at R req/s"`` or ``""`` (every rate kept up).
    """
    k = float("nan")
    for rate, v in sorted(zip(rates, verdicts), key=lambda t: float(t[0])):
        if v != KEPT_UP:
            return k, f"{v or UNDETERMINED} at {float(rate):.2f} req/s"
        k = float(rate)
    return k, ""


# ----------------------------------------------------------------------------- knees over a table of points


def sweep_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points of a load sweep: notebook 08's engine comparison (its runs at one rate, ``comparison`` set) left
    out, which is no rate of a sweep."""
    if points is None or "comparison" not in points:
        return points
    return points[points["comparison"].isna() | points["comparison"].eq("")]


def knee_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points a knee scan may use: valid open-loop points of the sweep (:func:`sweep_points`), stopped-early ones
    included (they fell behind)."""
    df = evidence.usable_points(sweep_points(points))
    if "profile" in df:
        df = df[df["profile"].isin(load.OPEN_LOOP)]
    return df


def point_rates(g: pd.DataFrame) -> pd.Series:
    """A point's rate for the scan: the realised ``arrival_rps`` where every point has one, else ``offered_rps``."""
    return g["arrival_rps"] if "arrival_rps" in g and g["arrival_rps"].notna().all() else g["offered_rps"]


def knee_scan(points: pd.DataFrame, tolerance: float = KEPT_UP_TOLERANCE) -> dict:
    """Per engine: ``(knee, why)`` of :func:`knee` over its valid open-loop points
    (stopped-early points included, as "fell behind": rates 1 kept up, 2 stopped early, 3 kept up by chance give a
    knee of 1, not 3)."""
    out = {}
    for e, g in knee_points(points).groupby("engine"):
        out[e] = knee(list(point_rates(g)), [kept_up(r, tolerance) for _, r in g.iterrows()])
    return out


def knees(points: pd.DataFrame, tolerance: float = KEPT_UP_TOLERANCE) -> dict:
    """Per engine: the highest open-loop rate (realised ``arrival_rps``, else ``offered_rps``) that kept up
    (:func:`kept_up`), below the first that fell behind or is undetermined; NaN when the lowest did not keep up.
    Valid open-loop points, stopped-early ones counted as fell behind (:func:`knee_scan`)."""
    return {e: k for e, (k, _) in knee_scan(points, tolerance).items()}


# ----------------------------------------------------------------------------- the recommendation per SLO


def slo_names(points: pd.DataFrame) -> list[str]:
    """SLO names of the ``slo_attainment_<name>`` columns (not the interval columns) that hold an attainment on some
    point: a run's points table also carries the scheduling classes' columns (``interactive``, ``background``),
    empty on the load points, which the recommendation listed as "undetermined: no attainment"."""
    return sorted({c[len("slo_attainment_"):] for c in points.columns if c.startswith("slo_attainment_")
                   and not c.startswith(("slo_attainment_low", "slo_attainment_high", "slo_attainment_upper"))
                   and pd.to_numeric(points[c], errors="coerce").notna().any()})


def recommend(points: pd.DataFrame, target: float = 0.9) -> pd.DataFrame:
    """Per SLO preset (and ``custom``): the engine and the highest measured offered rate that met it
    (:func:`workbench.stats.slo.verdict`: attainment's one-sided 95% lower bound reaches ``target``; the MLPerf presets
    at their stated p99 with the sample-size rule), ties by higher goodput, with its goodput, its attainment's
    Wilson 95% interval and one-sided lower bound and the requests planned for it; ``engine`` empty when none
    does, and ``verdict`` saying why (``missed``: every usable rate shown to miss it; ``undetermined``: some rate
    could not be judged with the requests it had). Only usable points
    (:func:`workbench.stats.evidence.usable_points` with ``serving``: valid, open-loop, not stopped early) of the sweep
    (:func:`sweep_points`) that did not fall behind (:func:`kept_up`): a closed-loop burst, a point stopped for over-saturation, one measured under
    other load or one whose queue grew is never recommended."""
    points = sweep_points(points)
    df = evidence.usable_points(points, serving=True)
    if not df.empty:  # a rate whose queue grew is not one the engine sustains, whatever its short-run attainment
        df = df[[kept_up(r) != FELL_BEHIND for _, r in df.iterrows()]]
    rows = []
    for n in slo_names(df if not df.empty else points):   # no usable point: each scored SLO says so
        source = slo.PRESETS[n].source if n in slo.PRESETS else "custom limits"
        judged = [slo.verdict(r, n, target) for _, r in df.iterrows()]
        met = [v == slo.MET for v, _ in judged]
        ok = df[met] if len(df) else df
        if ok.empty:
            undet = [why for v, why in judged if v == slo.UNDETERMINED]
            verdict = (f"undetermined: {undet[0]}" if undet else
                       "missed" if judged else "no usable point")
            rows.append({"slo": n, "engine": "", "max_rate_rps": 0.0, "goodput_rps": 0.0, "attainment": np.nan,
                         "attainment_low": np.nan, "attainment_high": np.nan, "attainment_lower": np.nan,
                         "requests": 0, "verdict": verdict, "source": source})
            continue
        best = ok.sort_values(["offered_rps", f"goodput_rps_{n}"], ascending=False).iloc[0]
        planned = best.get("requests_planned_window", best.get("requests", np.nan))
        why = slo.verdict(best, n, target)[1]
        lower = best.get(f"slo_attainment_lower_{n}", np.nan)
        if (lower is None or lower != lower) and planned == planned and planned:
            lower = slo.one_sided_bounds(int(round(float(best[f"slo_attainment_{n}"]) * int(planned))), int(planned))[0]
        rows.append({"slo": n, "engine": best["engine"], "max_rate_rps": float(best["offered_rps"]),
                     "goodput_rps": float(best[f"goodput_rps_{n}"]), "attainment": float(best[f"slo_attainment_{n}"]),
                     "attainment_low": float(best.get(f"slo_attainment_low_{n}", np.nan)),
                     "attainment_high": float(best.get(f"slo_attainment_high_{n}", np.nan)),
                     "attainment_lower": float(lower) if lower is not None else np.nan,
                     "requests": int(planned) if planned == planned else 0, "verdict": f"met: {why}",
                     "source": source})
    return pd.DataFrame(rows)
