"""The comparability check printed before any comparison of runs (the workbench's own or imported ones).

:func:`provenance` reads what decides comparability for a run: an imported run's ``imported`` record
(:mod:`workbench.share.formats`), else the workbench's own definitions with the run's ``ignore_eos`` and arrival
pattern, or the serving twin's when its points are simulated. :func:`comparability` compares that provenance
across runs (as inference-perf's ``docs/comparability.md`` lists: token provenance, ignore_eos, warm-up, arrival
pattern; and the percentile and ITL / TPOT definitions) and returns the lines to print and the metrics left out,
each with its reason; :func:`comparable_metrics` is what survives of the report's delta table
(:data:`DELTA_METRICS`), :func:`table_html` the lines on the comparison page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from workbench.run import results
from workbench.share.imported import WORKBENCH_PROVENANCE
from workbench.stats import metrics

#: The metrics of a comparison's delta table (the report's and an imported run's).
DELTA_METRICS = ["ttft_s_p50", "ttft_s_p99", "output_throughput_tps", "goodput_rps"]

#: Metrics the comparison shows (those not left out by :func:`comparability`).
COMPARED = ["ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "itl_s_p50", "output_throughput_tps",
            "request_throughput_rps", "goodput_rps"]

#: ``source`` of the serving twin's points (:data:`workbench.predict.twin.SOURCE`; not imported: this module reads runs)
SIMULATED = "simulated"
#: A simulated run's provenance (``workbench simulate --out``): the twin's virtual clock, no model, no tokenizer
SIMULATED_PROVENANCE = {
    "tool": "workbench twin (simulated: a prediction, not a measurement)",
    "token_counts": "simulated: each request's stated prompt and output tokens (no tokenizer, no EOS)",
    "ignore_eos": True,   # every simulated request runs to its stated output length, as with ignore_eos
    "warmup": "none: a cost model on a virtual clock has nothing to warm up",
    "itl": "simulated: one gap per decode step of the twin's cost model (no token ids)",
    "ttft_from": "the scheduled arrival, on the twin's virtual clock",
}


def provenance(run_dir) -> dict:
    """What decides comparability for a run: the ``imported`` record of an imported run, else the workbench's
    own definitions with the run's ``ignore_eos`` and arrival pattern from its points."""
    manifest = results.read_manifest(run_dir)
    if manifest.get("imported"):
        return dict(manifest["imported"])
    pts = results.read_points(run_dir)
    prov = dict(WORKBENCH_PROVENANCE)
    if "source" in pts and pts["source"].astype(str).eq(SIMULATED).any():
        # the serving twin's points (workbench simulate --out): nothing was generated or measured
        if pts["source"].astype(str).eq(SIMULATED).all():
            return dict(prov, **SIMULATED_PROVENANCE, arrival=", ".join(sorted(set(pts.get(
                "profile", pd.Series(["simulated"])).dropna().astype(str)))))
        prov.update({k: f"mixed: measured and simulated points (the simulated: {v})"
                     for k, v in SIMULATED_PROVENANCE.items()})
    if "ignore_eos" not in pts or pts["ignore_eos"].isna().any():   # recorded before point rows carried it
        pts = metrics.with_request_settings(pts, results.read_requests(run_dir))
    if "ignore_eos" in pts and pts["ignore_eos"].notna().any():
        vals = set(pts["ignore_eos"].dropna().astype(bool))
        prov["ignore_eos"] = vals.pop() if len(vals) == 1 else "mixed"
    else:
        prov["ignore_eos"] = None
    prov["arrival"] = arrival_of(pts)
    return prov


def arrival_of(points: pd.DataFrame) -> str:
    """The arrival pattern of the workbench's ``points`` (their ``arrival`` or load ``profile`` values, else closed
    batches): a run's, or one point's as its export records it (``workbench_arrival``)."""
    for col in ("arrival", "profile"):
        if col in points and points[col].notna().any():
            return ", ".join(sorted(set(points[col].dropna().astype(str))))
    return "closed batches (all requests of a point submitted together)"


def comparability(runs: list[Path]) -> tuple[list[str], dict[str, str]]:
    """The comparability check of several runs (workbench or imported).

    Returns:
        ``(lines, left_out)``: the lines to print before any comparison (one per aspect, each run's value, and
        whether they match), and ``{metric: reason}`` for the metrics of :data:`COMPARED` that cannot be compared
        across these runs.
    """
    provs = [provenance(r) for r in runs]
    names = [f"{chr(65 + i) if i < 26 else i} ({p.get('tool')})" for i, p in enumerate(provs)]
    lines = ["comparability check (inference-perf docs/comparability.md: token provenance, ignore_eos, warm-up, "
             "arrival pattern; and the percentile and ITL/TPOT definitions):"]
    same = {}
    for key, title in (("token_counts", "token counts"), ("ignore_eos", "ignore_eos"), ("arrival", "arrival pattern"),
                       ("warmup", "warm-up"), ("percentiles", "percentiles"), ("itl", "ITL"), ("tpot", "TPOT"),
                       ("ttft_from", "TTFT counted from")):
        vals = [p.get(key) for p in provs]
        same[key] = len({json.dumps(v, default=str) for v in vals}) == 1 and vals[0] is not None
        mark = "same" if same[key] else ("UNKNOWN in some" if any(v is None for v in vals) else "DIFFERENT")
        lines.append(f"  {title}: {mark}: " + "; ".join(f"{n}: {v if v is not None else 'not recorded'}"
                                                         for n, v in zip(names, vals)))
    left: dict[str, str] = {}
    if not same["ignore_eos"]:
        why = "ignore_eos differs or is not recorded: output lengths may differ, so throughput is not comparable"
        left["output_throughput_tps"] = why
        left["request_throughput_rps"] = why
    if not same["arrival"]:
        why = "different arrival patterns load the server differently"
        left.setdefault("output_throughput_tps", why)
        left.setdefault("request_throughput_rps", why)
    if not same["percentiles"]:
        left["ttft_s_p99"] = "percentile definitions differ (tails move most between estimators)"
    if not same["itl"]:
        left["itl_s_p50"] = "ITL means different gaps in these runs (token ids, chunks, or not exported)"
    if any(not str(p.get("tool")).startswith("workbench") for p in provs):   # the twin scores the workbench's SLOs
        left["goodput_rps"] = "the SLO behind goodput is not recorded the same way in these tools"
    for p in provs:
        for metric, why in (p.get("left_out") or {}).items():
            lines.append(f"  left out of {p.get('tool')}: {metric}: {why}")
    lines.append("compared: " + ", ".join(m for m in COMPARED if m not in left))
    for metric, why in left.items():
        lines.append(f"  not compared: {metric}: {why}")
    if not same["token_counts"] or not same["warmup"] or not same["ttft_from"]:
        lines.append("  caution: token counts, warm-up or the TTFT start differ; compare ratios within a run, "
                     "and read absolute differences with that in mind")
    sim = [n.split(" ")[0] for n, p in zip(names, provs) if SIMULATED in str(p.get("tool"))]
    if sim:
        lines.append(f"  caution: run {', '.join(sim)} is the serving twin's prediction, not a measurement: a "
                     "difference from a measured run is the twin's error (or the machine's speed that moment), "
                     "not an effect")
    return lines, left



def table_html(lines: list[str]) -> str:
    """The comparability lines as an HTML block for the comparison page."""
    import html

    return "<h2>Comparability</h2><pre class='meta'>" + html.escape("\n".join(lines)) + "</pre>"


def comparable_metrics(left_out: dict) -> list[str]:
    """The metrics of the delta table that survive the check."""

    return [m for m in list(dict.fromkeys(DELTA_METRICS + ["tpot_s_p50", "e2e_s_p50"])) if m not in left_out]

