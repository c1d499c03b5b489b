"""Summaries of a served mixed workload's request rows by request class (notebook ``11_scheduling``, ``workbench
simulate``).

A mixed workload (:mod:`workbench.load.traces`) sends interactive and background requests to one engine; its rows
carry ``request_class``, ``policy``, ``max_tokens``, ``slowdown`` and the queue's ETA. :func:`class_columns` gives a
point's per-class columns (TTFT / queue percentiles, e2e p50, SLO attainment and goodput under the class's TTFT SLO,
the longest wait, the ETA error, abandoned and retried requests); :func:`class_summary` and :func:`bucket_summary`
the per-policy tables of the ``mixed`` rows by class and by output length; :func:`mixed_rows` and
:func:`served_rows` select rows; :func:`paired_ratio` pairs one class's requests across two policies' runs of the
same trace (the old, request-paired design ``benchmarks/scheduling.py`` prints beside the run as the unit);
:func:`cache_columns` is the prefix cache's hit rate over rows (cached over prompt tokens). What prefix sharing saved
is the prefix design's decision (:func:`workbench.experiments.scheduling.prefix_savings`).
"""

from __future__ import annotations

import pandas as pd

from workbench.stats import evidence, metrics, slo

CLASSES = ("interactive", "background")  # a mixed workload's request classes (workbench.load.traces)


def class_columns(rows: pd.DataFrame, class_slo_ttft_s: dict, window_s: float) -> dict:
    """A point's per-class columns: ``ttft_s_p50_<c>``, ``ttft_s_p90_<c>``, ``queue_s_p50_<c>``, ``queue_s_p90_<c>``,
    ``e2e_s_p50_<c>``, ``requests_<c>``, ``slo_attainment_<c>`` and ``goodput_rps_<c>`` (the class's TTFT SLO,
    :func:`workbench.stats.slo.evaluate` over its rows and the window); and ``queue_s_max`` (the longest wait),
    ``eta_abs_error_s_p50``, ``abandoned`` and ``retried`` over all rows."""
    out = {}
    for c, g in rows.groupby("request_class") if not rows.empty else []:
        for col in ("ttft_s", "queue_s"):
            for k, v in metrics.percentiles(g[col], (50, 90)).items():
                out[f"{col}_{k}_{c}"] = v
        out[f"e2e_s_p50_{c}"] = metrics.percentiles(g["e2e_s"], (50,))["p50"]
        out[f"requests_{c}"] = int(len(g))
        if c in class_slo_ttft_s:
            ev = slo.evaluate(g, slo.get("custom", class_slo_ttft_s[c], None), window_s, len(g))
            out[f"slo_attainment_{c}"], out[f"goodput_rps_{c}"] = ev["slo_attainment"], ev["goodput_rps"]
    q = pd.to_numeric(rows.get("queue_s", pd.Series(dtype=float)), errors="coerce")
    err = pd.to_numeric(rows.get("eta_error_s", pd.Series(dtype=float)), errors="coerce").abs()
    out.update(queue_s_max=float(q.max()) if q.notna().any() else float("nan"),
               eta_abs_error_s_p50=metrics.percentiles(err, (50,))["p50"],
               abandoned=int(rows.get("abandoned", pd.Series(dtype=bool)).fillna(False).astype(bool).sum()),
               retried=int((pd.to_numeric(rows.get("retries", pd.Series(dtype=float)), errors="coerce") > 0).sum()))
    return out


def class_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per policy and class of the ``mixed`` rows: ``requests``, ``ttft_s_p50``, ``ttft_s_p90``, ``queue_s_p50``,
    ``queue_s_p90``, ``e2e_s_p50`` and ``queue_s_max`` (failed and abandoned rows left out of the latencies)."""
    df = mixed_rows(requests)
    out = []
    for (p, c), g in df.groupby(["policy", "request_class"]):
        ok = g[g["error"].isna() & (pd.to_numeric(g["output_tokens"], errors="coerce") >= 1)]
        row = {"policy": p, "request_class": c, "requests": int(len(g))}
        for col in ("ttft_s", "queue_s"):
            row.update({f"{col}_{k}": v for k, v in metrics.percentiles(ok[col], (50, 90)).items()})
        row["e2e_s_p50"] = metrics.percentiles(ok["e2e_s"], (50,))["p50"]
        row["queue_s_max"] = float(pd.to_numeric(g["queue_s"], errors="coerce").max())
        out.append(row)
    return pd.DataFrame(out)


def bucket_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per policy and length bucket (``max_tokens``) of the ``mixed`` rows: ``requests``, ``slowdown_p50`` and
    ``slowdown_p90``."""
    df = mixed_rows(requests)
    out = []
    for (p, m), g in df.groupby(["policy", "max_tokens"]):
        row = {"policy": p, "max_tokens": int(m), "requests": int(len(g))}
        row.update({f"slowdown_{k}": v for k, v in metrics.percentiles(g["slowdown"], (50, 90)).items()})
        out.append(row)
    return pd.DataFrame(out)


def mixed_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The ``mixed`` workload's rows of ``requests`` (an empty table with the columns the summaries read when there
    are none)."""
    if requests is None or requests.empty or "workload" not in requests:
        return pd.DataFrame(columns=["policy", "request_class", "max_tokens", "ttft_s", "queue_s", "e2e_s",
                                     "slowdown", "error", "output_tokens", "request_id"])
    return requests[requests["workload"] == "mixed"]


def served_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that produced at least one token without error (failed and abandoned ones left out)."""
    err = rows["error"].isna() if "error" in rows else pd.Series(True, index=rows.index)
    return rows[err & (pd.to_numeric(rows.get("output_tokens"), errors="coerce") >= 1)]


def cache_columns(rows: pd.DataFrame, prefix_sharing: bool) -> dict:
    """``cache_hit_rate`` (prompt tokens served from the prefix cache over all prompt tokens of the rows, from their
    ``cached_tokens``) and ``cache_note``; NaN with the reason when the engine does not report cached tokens."""
    cached = pd.to_numeric(rows.get("cached_tokens", pd.Series(dtype=float)), errors="coerce")
    prompt = pd.to_numeric(rows.get("prompt_tokens", pd.Series(dtype=float)), errors="coerce")
    if not cached.notna().any() or not prompt.sum() > 0:
        return {"cache_hit_rate": float("nan"), "prefix_sharing": prefix_sharing,
                "cache_note": "not available: the engine reports no cached_tokens"}
    return {"cache_hit_rate": float(cached.fillna(0).sum() / prompt.sum()), "prefix_sharing": prefix_sharing,
            "cache_note": "prefix sharing on" if prefix_sharing else "prefix sharing off"}


def paired_ratio(requests: pd.DataFrame, policy: str, column: str, request_class: str,
                 base: str = "fcfs") -> evidence.Interval:
    """``column`` under ``policy`` over ``base`` for the class's requests, matched by ``request_id`` (the same
    request at the same arrival time): :func:`workbench.stats.evidence.paired_ratio_interval`. Requests within one run
    share the engine, so they are not fully independent: the interval is a guide, the method says so."""
    df = mixed_rows(requests)
    df = df[df["request_class"] == request_class]
    a = df[df["policy"] == policy].set_index("request_id")[column]
    b = df[df["policy"] == base].set_index("request_id")[column]
    both = a.index.intersection(b.index)
    return evidence.paired_ratio_interval(a.loc[both], b.loc[both], unit="requests of one run (not independent)")
