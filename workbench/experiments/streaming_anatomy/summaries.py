"""The outcomes, tables and finding of the streaming-anatomy experiment (:mod:`workbench.experiments.streaming_anatomy`,
notebook ``04_streaming_anatomy``), from its points and requests.

The outcomes its two designs decide: :data:`TPOT` (the streaming design's lengths) and :data:`CLIENT_TTFT` (the HTTP
design's concurrencies, the primary comparison). The tables: :func:`anatomy_table` (per output length),
:func:`granularity_table` (per display granularity), :func:`transport_table` (client vs engine per concurrency);
:func:`sweep_rows` picks one sweep's rows. The decision: :func:`finding`. The experiment re-exports them all.
"""

from __future__ import annotations

import pandas as pd

from workbench import checks
from workbench.run import design
from workbench.stats import evidence

#: The primary outcome: the time per output token (a round's batch: its median request), longest over shortest.
TPOT = design.Outcome("tpot_s", False, "time per output token (TPOT)", "tpot_vs_control")

#: The primary outcome of the HTTP design: the client TTFT of a round's requests at one concurrency (their median).
CLIENT_TTFT = design.Outcome("ttft_s", False, "client TTFT", "ttft_vs_control")

ANATOMY_COLUMNS = ("max_new_tokens", "status", "ttft_s_p50", "tpot_s_p50", "itl_s_p50", "itl_s_p99", "itl_jitter",
                   "e2e_s_p50")


def sweep_rows(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Rows of one sweep (``experiment``: ``streaming``, ``granularity`` or ``http``) of a points or requests table;
    a run folder may hold every notebook of a suite, so the tables, the finding and the figures read their sweep's
    rows through this."""
    return df[df["experiment"] == experiment].reset_index(drop=True) if "experiment" in df else df


def anatomy_table(points: pd.DataFrame) -> pd.DataFrame:
    """The streaming sweep's points: TTFT, TPOT, ITL p50 / p99, jitter and e2e per output length (seconds)."""
    df = sweep_rows(points, "streaming")
    return df[[c for c in ANATOMY_COLUMNS if c in df]]


def _http_primary(points: pd.DataFrame) -> tuple[str, dict, str] | None:
    """The HTTP design's decision (:func:`workbench.experiments.streaming_anatomy.http_design`): ``(sentence, finding
    fields, evidence)``, or None when the http points were not measured as a design."""
    df = evidence.usable_points(sweep_rows(points, "http"))
    if df.empty or "design" not in df or not df["design"].map(lambda v: isinstance(v, str)).any():
        return None
    df = df.sort_values("concurrency")
    lo, hi = df.iloc[0], df.iloc[-1]
    dec = design.decision_from_row(hi, CLIENT_TTFT)
    if dec is None:
        return None
    name = (f"Client TTFT with {int(hi['concurrency'])} requests sent together vs one alone "
            f"({hi['ttft_s_p50']:.2f} vs {lo['ttft_s_p50']:.2f} s, HTTP streaming, the run the unit)")
    text = dec.describe(name, words=CLIENT_TTFT.words,
                        seconds_per_round=checks.float_or_nan(hi.get("seconds_per_round"))) + "."
    fields = design.finding_fields(hi, dec)
    if hi.get("aa_verdict") == "direction":
        text += " The A/A control moved (one request alone against itself shows a direction): drift, not effects."
        fields["verdict"] = "undecided"
    queue = hi.get("engine_queue_s_p50")
    if checks.float_or_nan(queue) == checks.float_or_nan(queue):
        text += f" The engine's queue wait at {int(hi['concurrency'])}: {queue:.2f} s (median request)."
    return text, fields, f"primary: client TTFT per run (its requests' median), {design.evidence_text(hi)}"


def finding(points: pd.DataFrame, requests: pd.DataFrame | None = None) -> evidence.Finding:
    """What a concurrent request does to the first token, decided; whether decoding slows as the output grows,
    decided beside it; how much sooner streaming shows text, measured.

    The primary comparison (it alone sets the verdict), when the http points were measured as a design
    (:func:`workbench.experiments.streaming_anatomy.http_design`): the client TTFT with the most requests sent
    together over one request alone (:data:`CLIENT_TTFT`, the run the unit; an A/A control that moved leaves it
    undecided). Beside it, with its own verdict: the time per output token at the longest output over the shortest
    (:data:`TPOT`, the streaming design) - a direction, equivalent within the margin, or undecided with how many
    rounds; without the http design it is the primary. And a measurement that decides nothing: the longest output's first token against its whole
    answer (medians; e2e exceeds TTFT for any answer longer than one token, so it cannot come out the other way).
    One output length and no http design compares nothing: a measurement (verdict ``""``); lengths measured
    without a design (one repeat): undecided.

    Args:
        points: the points of :func:`workbench.experiments.streaming_anatomy.run` (the ``streaming`` and ``http``
            sweeps are used).
        requests: their requests (unused since the design runner; kept for callers).

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    served = _http_primary(points)
    df = evidence.usable_points(sweep_rows(points, "streaming"))
    if df.empty and served is None:
        return evidence.nothing_valid("streaming point finished", points)
    ids = evidence.point_ids(pd.concat([df, evidence.usable_points(sweep_rows(points, "http"))]))
    parts, shown, tpot = [], "", None
    if not df.empty:
        df = df.sort_values("max_new_tokens")
        lo, hi = df.iloc[0], df.iloc[-1]
        shown = (f" Streaming shows the first token after {hi['ttft_s_p50']:.2f} s instead of {hi['e2e_s_p50']:.1f} s "
                 f"for a {int(hi['max_new_tokens'])}-token answer (a measurement, not a decision: e2e exceeds TTFT "
                 f"for any answer longer than one token).")
        parts.append(f"{checks.int_or(hi.get('batch_size'), 1)} request(s) per batch; TTFT and e2e p50 of the "
                     f"longest output over its rounds")
        name = (f"Time per output token (TPOT) at {int(hi['max_new_tokens'])} vs {int(lo['max_new_tokens'])} output "
                f"tokens ({hi['tpot_s_p50'] * 1e3:.0f} vs {lo['tpot_s_p50'] * 1e3:.0f} ms)")
        dec = design.decision_from_row(hi, TPOT) if len(df) >= 2 and isinstance(hi.get("design"), str) else None
        if len(df) < 2:
            tpot = (" One output length: no comparison of decode speed.", None, None)
        elif dec is None:
            tpot = (f"{name}: undecided: one round pairs nothing (repeats >= 2 measure the lengths as a design).",
                    {"verdict": "undecided"}, None)
        else:
            text = dec.describe(name, words=TPOT.words,
                                seconds_per_round=checks.float_or_nan(hi.get("seconds_per_round"))) + "."
            fields = design.finding_fields(hi, dec)
            if hi.get("aa_verdict") == "direction":
                text += (" The A/A control moved (the shortest output against itself shows a direction): drift, not "
                         "effects.")
                fields["verdict"] = "undecided"
            tpot = (text, fields, f"TPOT per round (the batch's median request), {design.evidence_text(hi)}")
    if served is not None:
        text, fields, ev = served
        parts.insert(0, ev)
        if tpot is not None and tpot[1] is not None:
            text += f" Beside it, with its own verdict ({tpot[1]['verdict']}): {tpot[0]}"
            if tpot[2]:
                parts.append(tpot[2])
        return evidence.Finding(text + shown, "; ".join(parts), True, ids, **fields)
    if tpot is None or tpot[1] is None:
        return evidence.Finding(shown.strip() + (tpot[0] if tpot else ""), "; ".join(parts), True, ids, verdict="")
    text, fields, ev = tpot
    if ev:
        parts.insert(0, f"primary: {ev}")
    return evidence.Finding(text + shown, "; ".join(parts), True, ids, **fields)


def granularity_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Medians per granularity (``<column>_p50``, seconds) of
    :func:`workbench.experiments.streaming_anatomy.measure_granularity` rows, in input order."""
    requests = sweep_rows(requests, "granularity")
    cols = ["updates", "tokens_per_update", "display_lag_s_mean", "display_lag_s_p90", "display_lag_s_max",
            "first_display_s", "added_first_display_s", "handler_s_per_token"]
    order = list(dict.fromkeys(requests["granularity"]))
    t = requests.groupby("granularity")[cols].median().reindex(order).add_suffix("_p50")
    t["text_equal"] = requests.groupby("granularity")["text_equal"].all().reindex(order)
    return t.reset_index()


def transport_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Medians per concurrency (seconds): client vs engine TTFT, the transport share, queueing, per-token times.

    Args:
        requests: :func:`~workbench.load.client.measure_http` rows (other sweeps' rows are ignored).

    Returns:
        ``concurrency``, ``requests``, ``ttft_s_p50`` (client), ``engine_ttft_s_p50``,
        ``transport_ttft_s_p50`` (client first chunk minus engine first text), ``transport_ttft_s_max``,
        ``engine_queue_s_p50``, ``tpot_s_p50`` (client: first-to-last chunk over the decode steps between
        them), ``engine_tpot_s_p50``, ``transport_e2e_s_p50``, ``chunks_per_token``.
    """
    g = sweep_rows(requests, "http").groupby("concurrency")
    out = g.agg(
        requests=("ttft_s", "size"),
        ttft_s_p50=("ttft_s", "median"),
        engine_ttft_s_p50=("engine_ttft_s", "median"),
        **({"engine_first_text_s_p50": ("engine_first_text_s", "median")} if "engine_first_text_s" in requests else {}),
        transport_ttft_s_p50=("transport_ttft_s", "median"),
        transport_ttft_s_max=("transport_ttft_s", "max"),
        engine_queue_s_p50=("engine_queue_s", "median"),
        tpot_s_p50=("tpot_s", "median"),
        engine_tpot_s_p50=("engine_tpot_s", "median"),
        transport_e2e_s_p50=("transport_e2e_s", "median"),
    )
    out["chunks_per_token"] = g["chunks"].sum() / g["output_tokens"].sum()
    return out.reset_index()


