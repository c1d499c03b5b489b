"""Cross-tool decisions on per-request data: run B against run A, beside the comparability verdict.

:func:`cross_tool` matches the points of two runs measured under the same load and decides, per matched point and
per metric of :data:`CROSS_METRICS`, the ratio of the per-request medians with a bootstrap interval and the ratio
of geometric means with Welch's interval on the log scale, beside :func:`workbench.share.comparability.comparability`'s
verdict on the aspects that move that metric; :func:`cross_tool_lines` and :func:`cross_tool_html` write the rows
for the command line and the comparison page.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from workbench.run import results
from workbench.share.comparability import comparability

if TYPE_CHECKING:
    import numpy as np


#: Per-request metrics the cross-tool view decides on (seconds).
CROSS_METRICS = ("ttft_s", "e2e_s")
#: Fewest completed requests per side for an interval (a bootstrap below this is no interval at all).
CROSS_MIN_N = 5
#: The comparability aspects (:func:`comparability`'s titles) that move each cross-tool metric.
CROSS_ASPECTS = {"ttft_s": ("arrival pattern", "warm-up", "TTFT counted from"),
                 "e2e_s": ("arrival pattern", "warm-up", "TTFT counted from", "ignore_eos", "token counts")}


def _request_values(run: Path, pid: str, metric: str) -> np.ndarray:
    import numpy as np

    req = results.read_requests(run)
    if req.empty or metric not in req or "point_id" not in req:
        return np.array([])
    req = req[req["point_id"].astype(str) == pid]
    if "error" in req:
        req = req[req["error"].isna() | (req["error"].astype(str) == "")]
    vals = pd.to_numeric(req[metric], errors="coerce").to_numpy(dtype=float)
    return vals[np.isfinite(vals) & (vals > 0)]


def _pairs(a: Path, b: Path) -> list[tuple[str, str]]:
    """Points of run ``a`` and ``b`` measured under the same load: the same point id; else the single point of
    each; else the one point of each side with the same concurrency (a closed-loop synchronous point counts
    as concurrency 1)."""
    pa_, pb_ = results.read_points(a), results.read_points(b)
    if "point_id" not in pa_ or "point_id" not in pb_:
        return []
    ida, idb = list(pa_["point_id"].astype(str)), list(pb_["point_id"].astype(str))
    common = [p for p in ida if p in idb]
    if common:
        return [(p, p) for p in common]
    if len(ida) == 1 and len(idb) == 1:
        return [(ida[0], idb[0])]

    ca, cb = _concurrency(pa_), _concurrency(pb_)
    out = []
    for value in {v for v in ca.values() if v is not None} & {v for v in cb.values() if v is not None}:
        xa = [p for p, v in ca.items() if v == value]
        xb = [p for p, v in cb.items() if v == value]
        if len(xa) == 1 and len(xb) == 1:
            out.append((xa[0], xb[0]))
    return out


def _concurrency(pts: pd.DataFrame) -> dict:
    """``{point_id: requests in flight}`` of a run's finished closed-loop points (a synchronous point: 1), None
    where unknown."""
    c = pd.to_numeric(pts.get("concurrency", pd.Series(index=pts.index, dtype=float)), errors="coerce")
    if "profile" in pts:
        c = c.where(~pts["profile"].astype(str).eq("synchronous"), 1.0)
    if "status" in pts:
        c = c.where(pts["status"].astype(str).eq("ok"))
    return {k: (float(v) if v == v else None) for k, v in zip(pts["point_id"].astype(str), c)}


def _median_ratio_interval(a, b, confidence: float, seed: int):
    """``median(b) / median(a)`` with scipy's bootstrap interval over the two independent samples (BCa; the
    percentile interval where BCa is undefined)."""
    import numpy as np
    from scipy import stats

    def stat(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis)

    est = float(np.median(b) / np.median(a))
    for method in ("BCa", "percentile"):
        try:
            with np.errstate(all="ignore"):
                res = stats.bootstrap((a, b), stat, paired=False, vectorized=True, n_resamples=4999,
                                      confidence_level=confidence, method=method, random_state=seed)
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if np.isfinite(lo) and np.isfinite(hi):
                return est, lo, hi, f"bootstrap ({method}, 4999 resamples, {len(a)}+{len(b)} requests)"
        except (ValueError, FloatingPointError):
            continue
    return est, float("nan"), float("nan"), "bootstrap failed"


def cross_tool(runs: list[Path], confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Cross-tool decisions: for each run after the first (B) against the first (A), per matched point
    (:func:`_pairs`) and per metric of :data:`CROSS_METRICS`, the ratio B / A of the per-request medians with a
    bootstrap interval, and the ratio of geometric means with Welch's t on the log scale
    (:func:`workbench.stats.evidence.ratio_interval`), beside the comparability check's verdict.

    Where a side has no per-request values (a summary-only import) the row says "summary only: no interval"
    and carries the ratio of the summary medians only.

    Returns:
        Rows ``{run_a, run_b, point_a, point_b, metric, n_a, n_b, median_a, median_b, ratio, low, high, method,
        gm_ratio, gm_low, gm_high, gm_method, verdict, comparability}``.
    """
    import numpy as np

    from workbench.stats import evidence

    with_points = [r for r in runs if "point_id" in results.read_points(r)]   # runs without points take no part
    if len(with_points) < 2:
        return []
    out = []
    base = with_points[0]
    for other in with_points[1:]:
        lines, _ = comparability([base, other])
        differ = [ln.split(":")[0].strip() for ln in lines[1:9] if ": DIFFERENT" in ln or ": UNKNOWN" in ln]
        pts_a, pts_b = results.read_points(base), results.read_points(other)
        conc_a, conc_b = _concurrency(pts_a), _concurrency(pts_b)
        for pa_id, pb_id in _pairs(base, other):
            same_load = conc_a.get(pa_id) is not None and conc_a.get(pa_id) == conc_b.get(pb_id)
            for metric in CROSS_METRICS:
                # the aspects that move this metric; the arrival pattern matches when both points held the same
                # number of requests in flight (a synchronous point is concurrency 1)
                relevant = [d for d in differ if d in CROSS_ASPECTS[metric]
                            and not (d == "arrival pattern" and same_load)]
                verdict_cmp = ("comparable (" + ", ".join(CROSS_ASPECTS[metric]) + " the same)" if not relevant else
                               "caution: " + ", ".join(relevant) + " differ or are not recorded")
                a, b = _request_values(base, pa_id, metric), _request_values(other, pb_id, metric)
                row = {"run_a": base.name, "run_b": other.name, "point_a": pa_id, "point_b": pb_id, "metric": metric,
                       "n_a": int(a.size), "n_b": int(b.size), "comparability": verdict_cmp}
                if a.size and b.size:
                    row.update(median_a=float(np.median(a)), median_b=float(np.median(b)))
                if a.size < CROSS_MIN_N or b.size < CROSS_MIN_N:
                    sa = _summary(pts_a, pa_id, metric)
                    sb = _summary(pts_b, pb_id, metric)
                    row.update(ratio=(sb / sa) if sa and sb else float("nan"), low=float("nan"), high=float("nan"),
                               method="", verdict="summary only: no interval" if not (a.size and b.size) else
                               f"too few requests for an interval ({a.size}+{b.size}; {CROSS_MIN_N} per side needed)")
                    out.append(row)
                    continue
                est, lo, hi, method = _median_ratio_interval(a, b, confidence, seed)
                gm = evidence.ratio_interval(b, a, confidence, unit="requests")
                iv = evidence.Interval(est, lo, hi, int(a.size + b.size), method, confidence)
                row.update(ratio=est, low=lo, high=hi, method=method, gm_ratio=gm.estimate, gm_low=gm.low,
                           gm_high=gm.high, gm_method=gm.method, verdict=evidence.ratio_verdict(iv))
                out.append(row)
    return out


def _summary(points: pd.DataFrame, pid: str, metric: str):
    col = f"{metric}_p50"
    row = points[points["point_id"].astype(str) == pid]
    if row.empty or col not in row:
        return None
    v = pd.to_numeric(row[col], errors="coerce").iloc[0]
    return float(v) if v == v else None


def cross_tool_lines(rows: list[dict]) -> list[str]:
    """The cross-tool decisions as lines to print (one per matched point and metric)."""
    if not rows:
        return []
    out = ["cross-tool decisions on per-request data (B / A; interval 95%; the comparability verdict beside):"]
    for r in rows:
        head = f"  {r['metric']} {r['point_b']} (B) / {r['point_a']} (A): "
        if r.get("method"):
            out.append(head + f"median ratio {r['ratio']:.3f}x, {r['low']:.3f}-{r['high']:.3f}x ({r['method']}); "
                       f"geometric-mean ratio {r['gm_ratio']:.3f}x, {r['gm_low']:.3f}-{r['gm_high']:.3f}x "
                       f"({r['gm_method']}); {r['verdict']}; {r['comparability']}")
        else:
            ratio = f"summary median ratio {r['ratio']:.3f}x; " if r.get("ratio") == r.get("ratio") and \
                r.get("ratio") is not None else ""
            out.append(head + f"{ratio}{r['verdict']}; {r['comparability']}")
    return out


def cross_tool_html(rows: list[dict]) -> str:
    """The cross-tool decisions as an HTML block for the comparison page (empty when no point is matched)."""
    import html

    if not rows:
        return ""
    return ("<h2>Cross-tool decisions on per-request data</h2><p class='meta'>Ratio B / A of per-request medians "
            "with a bootstrap interval, and of geometric means with Welch's t on the log scale; summary-only imports "
            "have no interval. The comparability check's verdict beside each.</p><pre class='meta'>"
            + html.escape("\n".join(cross_tool_lines(rows)[1:])) + "</pre>")
