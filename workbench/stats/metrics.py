"""Aggregate per-request measurements into per-point figures: percentiles, summaries, MBU / MFU.

Definitions follow vLLM's serving benchmark (``benchmarks/benchmark_serving.py``)
and NVIDIA GenAI-Perf; docs/design.md section 4 is the table. Percentiles are
``numpy.percentile`` (linear interpolation) over requests that produced at least
one token; ITL percentiles pool every gap of every such request.

MBU (memory-bandwidth utilisation) follows Databricks, "LLM Inference
Performance Engineering: Best Practices" (2023): bytes that one decode step
must read (all weights + the KV cache of every row) times decode steps per
second, over the measured peak bandwidth. MFU (model FLOPs utilisation) follows
PaLM (Chowdhery et al. 2022, appendix B): ``2 N`` FLOPs per token (Kaplan et al.
2020, table 1) plus ``4 n_layers L attn_dim`` for the attention products, over the
measured peak matmul FLOP/s. A speculative point's MBU counts per verification step instead
(:func:`verification_mbu`), and its acceptance figures and speed-up bound are :func:`acceptance` and
:func:`speedup_bound`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
# a percentile is reported only from enough independent samples: p99 from fewer than 100 values is one value
MIN_SAMPLES = {"p50": 1, "p90": 10, "p99": 100}
LATENCY_COLUMNS = ("ttft_s", "prefill_s", "tpot_s", "e2e_s", "itl_s", "decode_tps")


def request_timing(stamps: Sequence[float], t_submit: float, decode_steps: int | None = None) -> dict:
    """Per-request timing from the clock reading of each generated token id: the one home of these formulas.

    Args:
        stamps: ``time.perf_counter()`` (or a clock on the same base) of every generated token id of one
            request, in order, EOS included; after device synchronisation on accelerators.
        t_submit: when the request was handed to the workbench (before templating and tokenisation).
        decode_steps: decode steps between the first and the last stamp, when a stamp is not one token id
            (an HTTP client's text chunks; :func:`workbench.load.client.stream_chat` counts them from
            ``usage`` and the tokenizer). Default ``len(stamps) - 1``. Only ``tpot_s`` and ``decode_tps``
            use it; ``itl_s`` stays the gaps between stamps.

    Returns:
        ``output_tokens`` (``len(stamps)``), ``ttft_s`` (``stamps[0] - t_submit``), ``e2e_s``
        (``stamps[-1] - t_submit``), ``itl_s`` (list of the ``n - 1`` gaps), ``tpot_s``
        (``(e2e_s - ttft_s) / (n - 1)``) and ``decode_tps`` (``(n - 1) / (e2e_s - ttft_s)``); definitions
        of vLLM's ``benchmarks/serve.py`` ``calculate_metrics`` and docs/design.md section 4. Times are NaN
        where undefined (no token; TPOT of one token), never zero.
    """
    stamps = [float(t) for t in stamps]
    n = len(stamps)
    nan = float("nan")
    ttft = stamps[0] - t_submit if n else nan
    e2e = stamps[-1] - t_submit if n else nan
    decode_s = e2e - ttft
    steps = n - 1 if decode_steps is None else int(decode_steps)
    return {
        "output_tokens": n,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "itl_s": [b - a for a, b in zip(stamps, stamps[1:])],
        "tpot_s": tpot_of(ttft, e2e, steps + 1) if n > 1 else nan,
        "decode_tps": steps / decode_s if n > 1 and steps > 0 and decode_s > 0 else nan,
    }


def step_gaps(itl_s: Sequence[float], step_sizes: Sequence[int]) -> list[float]:
    """Inter-token latency of a speculative request as gaps between verification steps (the definition of
    vLLM's and AIPerf's speculative ITL): a step emitting ``k`` ids stamps them at once, so its ``k - 1`` zero
    gaps are dropped and each remaining gap is the time from one step's output to the next.

    Args:
        itl_s: the per-id gaps of :func:`request_timing` (``output_tokens - 1`` values).
        step_sizes: ids each step emitted, in order (summing to ``output_tokens``; ``draft_emitted``).

    Returns:
        ``len(step_sizes) - 1`` gaps in seconds; their sum equals ``sum(itl_s)`` (``ttft_s + sum == e2e_s``).

    Raises:
        ParameterError: step sizes that do not add up to the ids behind ``itl_s``.
    """
    from workbench.errors import ParameterError

    sizes = [int(k) for k in step_sizes]
    if any(k < 1 for k in sizes) or sum(sizes) != len(itl_s) + 1:
        raise ParameterError(f"step_sizes: each >= 1 and summing to output_tokens ({len(itl_s) + 1}); got {sizes}")
    out, i = [], 0
    for k in sizes[:-1]:  # the gap from a step's first id to the next step's first id
        out.append(float(sum(itl_s[i:i + k])))
        i += k
    return out


def tpot_of(ttft_s, e2e_s, output_tokens) -> float:
    """One request's TPOT from its first- and last-token times and its output tokens: ``(e2e_s - ttft_s) /
    (output_tokens - 1)`` seconds (vLLM's ``benchmarks/serve.py`` definition, :func:`request_timing`'s); NaN where
    undefined (a missing time, one token, a last token before the first)."""
    try:
        ttft, e2e, n = float(ttft_s), float(e2e_s), float(output_tokens)
    except (TypeError, ValueError):
        return float("nan")
    if not (math.isfinite(ttft) and math.isfinite(e2e) and n > 1 and e2e >= ttft):
        return float("nan")
    return (e2e - ttft) / (n - 1)


def decode_tps_of(tpot_s: float) -> float:
    """One request's decode speed from its TPOT: ``1 / tpot_s`` tokens/s (docs/design.md section 4's ``decode_tps``
    equals ``(output_tokens - 1) / (e2e_s - ttft_s)`` = ``1 / tpot_s``); NaN for a missing or non-positive TPOT."""
    return 1.0 / tpot_s if tpot_s == tpot_s and tpot_s is not None and tpot_s > 0 else float("nan")


def percentiles(values, qs=PERCENTILES) -> dict:
    """Percentiles of finite values: ``{"p50": .., "p90": .., "p99": ..}``; NaN when there are none."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {f"p{q}": float("nan") for q in qs}
    return {f"p{q}": float(v) for q, v in zip(qs, np.percentile(arr, qs))}


def n_samples(requests: pd.DataFrame) -> int:
    """Independent timing samples behind a point's per-request percentiles.

    Rows of one batch share one stamp per decode step, so they are one sample, not ``batch_size``:
    ``round(requests / batch_size)`` over requests that produced a token (all rows when no
    ``batch_size`` is recorded).
    """
    if requests.empty:
        return 0
    if "batch_size" not in requests:
        return int(len(requests))
    batch = pd.to_numeric(requests["batch_size"], errors="coerce").fillna(1).clip(lower=1)
    return int(round(float((1.0 / batch).sum())))


def itl_samples(requests: pd.DataFrame) -> int:
    """Independent inter-token gaps: every gap of every request, divided by the rows that shared it."""
    if requests.empty or "itl_s" not in requests:
        return 0
    gaps = requests["itl_s"].map(lambda x: len(x) if x is not None else 0)
    batch = pd.to_numeric(requests.get("batch_size", 1), errors="coerce")
    batch = batch.fillna(1).clip(lower=1) if isinstance(batch, pd.Series) else 1
    return int(round(float((gaps / batch).sum())))


def repeat_ci(requests: pd.DataFrame, column: str, confidence: float = 0.95) -> tuple[float, float]:
    """Interval of a column's median over repeats: a Student-t interval over the per-repeat medians, on the log
    scale.

    Repeats are the independent units (rows of one repeat share the machine's state and, in a batch, one
    stamp per step), so each repeat contributes one value, its median, and the interval is
    :func:`workbench.stats.evidence.t_interval` over them. Its coverage holds at two repeats and up
    (tests/stats/test_evidence.py simulates it); the percentile bootstrap over repeats it replaces was, with two
    repeats, the range of two medians (about 50% coverage). A latency is positive and its noise multiplicative (a
    slower moment scales it), so the interval is taken over the medians' logs and brought back (a geometric-mean
    interval, as the workbench's ratios are): over two medians 20 ms and 120 ms the arithmetic t interval ran to
    -0.4 s, a latency no request can have. A median of 0 or less (not a latency) keeps the arithmetic interval.
    Fewer than two repeats: ``(nan, nan)``.

    Returns:
        ``(low, high)`` in the column's unit.
    """
    from workbench.stats.evidence import t_interval

    if column not in requests or "repeat" not in requests:
        return float("nan"), float("nan")
    medians = [float(np.median(v)) for _, g in requests.groupby("repeat")
               if (v := pd.to_numeric(g[column], errors="coerce").dropna().to_numpy()).size]
    if len(medians) >= 2 and min(medians) > 0:
        iv = t_interval(np.log(medians), confidence, unit="repeat medians (log)")
        return float(np.exp(iv.low)), float(np.exp(iv.high))
    iv = t_interval(medians, confidence, unit="repeat medians")
    return iv.low, iv.high


def meets_slo(requests: pd.DataFrame, slo_ttft_s: float | None, slo_tpot_s: float | None) -> pd.Series:
    """Boolean per request: produced a token, ``ttft_s <= slo_ttft_s`` and ``tpot_s <= slo_tpot_s``.

    A request with one output token has no TPOT and meets the TPOT part. A
    ``None`` SLO is not applied.
    """
    ok = requests["output_tokens"] >= 1
    if slo_ttft_s is not None:
        ok &= requests["ttft_s"] <= slo_ttft_s
    if slo_tpot_s is not None:
        ok &= requests["tpot_s"].isna() | (requests["tpot_s"] <= slo_tpot_s)
    return ok


def slo_met(requests: pd.DataFrame, slo_ttft_s: float | None, slo_tpot_s: float | None) -> pd.Series:
    """Boolean per request: :func:`meets_slo` and no ``error`` (a failed request is a miss)."""
    ok = meets_slo(requests, slo_ttft_s, slo_tpot_s)
    if "error" in requests:
        ok &= requests["error"].isna() | (requests["error"].astype(str) == "")
    return ok


def slo_attainment(requests: pd.DataFrame, slo_ttft_s: float | None, slo_tpot_s: float | None) -> float:
    """Share of requests meeting every given SLO limit (:func:`slo_met`); failed requests (an ``error``, or
    no output token) count as misses. NaN when there are no requests. Over the requests *planned* for a
    serving window, with its interval: :func:`workbench.stats.slo.attainment`."""
    if requests is None or len(requests) == 0:
        return float("nan")
    return float(slo_met(requests, slo_ttft_s, slo_tpot_s).mean())


def saturation_knee(offered_rps: Sequence[float], achieved_rps: Sequence[float], tolerance: float = 0.1) -> float:
    """The knee of a load sweep: the highest offered request rate whose achieved request rate is still within
    ``tolerance`` of it (``achieved >= (1 - tolerance) * offered``), below the first rate that falls short.
    Past it the server no longer keeps up and its queue grows. NaN when even the lowest rate falls short."""
    pairs = sorted((float(o), float(a)) for o, a in zip(offered_rps, achieved_rps) if o == o and o > 0)
    knee = float("nan")
    for o, a in pairs:
        if not (a == a and a >= (1 - tolerance) * o):
            break
        knee = o
    return knee


def summarize_point(
    requests: pd.DataFrame,
    wall_s: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict:
    """Aggregate one sweep point's requests.

    Args:
        requests: one row per request (all repeats), with ``output_tokens``,
            ``ttft_s``, ``prefill_s``, ``tpot_s``, ``e2e_s``, ``decode_tps`` and
            ``itl_s`` (list of seconds).
        wall_s: seconds from first submit to last completion, summed over the
            timed repeats (warm-up excluded).
        slo_ttft_s, slo_tpot_s: the SLO for goodput (seconds); None skips a part.

    Returns:
        ``{col}_p50/_p90/_p99`` for every latency column, ``requests``,
        ``completed``, ``output_tokens``, ``wall_s``, ``output_throughput_tps``
        (all output tokens / wall_s), ``request_throughput_rps`` (completed
        requests / wall_s), ``goodput_rps`` (SLO-meeting requests / wall_s;
        NaN when no SLO is given).
    """
    done = requests[requests["output_tokens"] >= 1]
    row: dict = {}
    n = n_samples(done)
    n_itl = itl_samples(done)
    notes = []
    for col in LATENCY_COLUMNS:
        if col not in done:
            continue
        values = ([x for lst in done[col] if isinstance(lst, (list, tuple, np.ndarray)) for x in lst]
                  if col == "itl_s" else done[col].tolist())  # rows without per-token gaps carry None
        have = n_itl if col == "itl_s" else n
        for k, v in percentiles(values).items():
            need = MIN_SAMPLES[k]
            if have < need:
                v = float("nan")
                notes.append(f"{col}_{k}")
            row[f"{col}_{k}"] = v
    row["n_samples"] = n
    row["percentile_note"] = (f"left empty, too few independent samples ({n}; p90 needs {MIN_SAMPLES['p90']}, "
                              f"p99 needs {MIN_SAMPLES['p99']}): " + ", ".join(notes)) if notes else ""
    for col in ("ttft_s", "tpot_s"):
        if col in done:
            lo, hi = repeat_ci(done, col)
            row[f"{col}_p50_ci_low"], row[f"{col}_p50_ci_high"] = lo, hi
    total_tokens = int(requests["output_tokens"].sum())
    good = int(meets_slo(requests, slo_ttft_s, slo_tpot_s).sum())
    row.update(
        requests=int(len(requests)),
        completed=int(len(done)),
        output_tokens=total_tokens,
        wall_s=float(wall_s),
        output_throughput_tps=total_tokens / wall_s if wall_s > 0 else float("nan"),
        request_throughput_rps=len(done) / wall_s if wall_s > 0 else float("nan"),
        goodput_rps=good / wall_s if wall_s > 0 and (slo_ttft_s is not None or slo_tpot_s is not None)
        else float("nan"),
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        ignore_eos=common_value(requests["ignore_eos"]) if "ignore_eos" in requests else None,
    )
    return row


def common_value(values):
    """The one value a setting took over a point's requests (``ignore_eos``: every request generated the same
    way), as a Python scalar; None when the requests disagree or none recorded it.

    Args:
        values: a pandas Series (or any iterable) of the requests' values; None / NaN are not recorded ones.

    Returns:
        The common value, or None.
    """
    kept = {v.item() if hasattr(v, "item") else v for v in values
            if v is not None and not (isinstance(v, float) and math.isnan(v))}
    return kept.pop() if len(kept) == 1 else None


def with_request_settings(points: pd.DataFrame, requests: pd.DataFrame,
                          settings: tuple[str, ...] = ("ignore_eos",)) -> pd.DataFrame:
    """``points`` with each of ``settings`` filled from its requests where the point row lacks it (points recorded
    before :func:`summarize_point` carried ``ignore_eos``; a notebook whose grid does not vary it): the requests'
    :func:`common_value` per ``point_id``. The rows are not otherwise changed.

    Args:
        points: a run's points table (``point_id`` column); requests: its requests table.
        settings: the request columns to lift.

    Returns:
        A copy of ``points``.
    """
    out = points.copy()
    if out.empty or requests is None or requests.empty or "point_id" not in requests:
        return out
    for col in settings:
        if col not in requests:
            continue
        by_point = requests.groupby("point_id")[col].agg(common_value)
        lifted = out["point_id"].map(by_point)
        if col in out:
            have = out[col].map(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)))
            out[col] = out[col].where(have, lifted).astype(object)
        else:
            out[col] = lifted.astype(object)
        out[col] = out[col].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    return out


def pareto_front(points: pd.DataFrame, x: str = "output_throughput_tps", y: str = "ttft_s_p50") -> pd.DataFrame:
    """Rows not dominated by another row (higher ``x`` is better, lower ``y`` is better), sorted by ``x``."""
    df = points.dropna(subset=[x, y]).sort_values([x, y], ascending=[False, True])
    keep, best_y = [], math.inf
    for idx, r in df.iterrows():
        if r[y] < best_y:
            keep.append(idx)
            best_y = r[y]
    return df.loc[keep].sort_values(x)


def mbu(
    weight_bytes: int,
    kv_bytes_per_token: int,
    batch_size: int,
    mean_context_tokens: float,
    tpot_s: float,
    peak_bandwidth_bytes_per_s: float,
) -> float:
    """Decode memory-bandwidth utilisation (Databricks 2023).

    ``(weight_bytes + kv_bytes_per_token * batch_size * mean_context_tokens) / tpot_s / peak``:
    each decode step reads every weight once and every row's KV cache; one step
    takes ``tpot_s`` seconds. ``mean_context_tokens`` is the average KV length
    during decode (prompt + half the output). Returns NaN on missing input.
    """
    if not (tpot_s and tpot_s > 0 and peak_bandwidth_bytes_per_s > 0) or math.isnan(tpot_s):
        return float("nan")
    step_bytes = weight_bytes + kv_bytes_per_token * batch_size * mean_context_tokens
    return step_bytes / tpot_s / peak_bandwidth_bytes_per_s


def prefill_flops(num_params: int, num_layers: int, attn_dim: int, prompt_tokens: int, batch_size: int = 1) -> float:
    """Forward FLOPs of a prefill, PaLM's count (Chowdhery et al. 2022, appendix B).

    ``batch_size * (2 * N * L + 4 * n_layers * L^2 * attn_dim)`` for ``L`` prompt tokens: ``2 N`` per token
    for the dense matmuls (Kaplan et al. 2020, table 1) plus the two attention products (``Q K^T`` and
    ``A V``, ``2 L^2 attn_dim`` each per layer) over the full ``L x L`` matrix, as PaLM's MFU counts them
    (a causal kernel skips about half). ``N`` is the non-embedding parameter count and ``attn_dim`` is
    query heads x head dim (:attr:`workbench.measure.models.ModelInfo.attn_dim`), which is not always the hidden size.
    """
    L = prompt_tokens
    return batch_size * (2.0 * num_params * L + 4.0 * num_layers * L * L * attn_dim)


def mfu(flops: float, prefill_s: float, peak_flops_per_s: float) -> float:
    """Prefill model-FLOPs utilisation (PaLM, Chowdhery et al. 2022): ``flops / prefill_s / peak``."""
    if not (prefill_s and prefill_s > 0 and peak_flops_per_s > 0) or math.isnan(prefill_s):
        return float("nan")
    return flops / prefill_s / peak_flops_per_s


def utilisation(requests: pd.DataFrame, summary: dict, info, env: dict) -> dict:
    """MBU (decode) and MFU (prefill) of a point, from its medians and the probed device peaks.

    The batch is the recorded ``batch_size`` of the requests (how many shared one forward pass), never
    the number of rows of a repeat: a point that runs 8 tasks one at a time is batch 1. Without a
    recorded batch size the figures are left empty rather than guessed.

    Args:
        requests: the point's request rows (``batch_size``, ``prompt_tokens``, ``output_tokens``; optional
            ``n_requests`` for a row standing for several requests and ``prefilled_tokens`` for a reused
            prefix cache).
        summary: :func:`summarize_point` of those rows (``tpot_s_p50``, ``prefill_s_p50``).
        info: :class:`workbench.measure.models.ModelInfo` (weights, KV bytes per token, parameters, layers), or None.
        env: the measuring device's probed peaks (``bandwidth_bytes_per_s``, ``flops_per_s``,
            :func:`workbench.measure.device.probe_device`).

    Returns:
        ``{"mbu", "mfu", "peak_bandwidth_bytes_per_s", "peak_flops_per_s"}`` (:func:`mbu`, :func:`mfu`), or
        ``{}`` without a model, a probe, rows or a recorded batch size.
    """
    req = requests
    if info is None or "bandwidth_bytes_per_s" not in env or req.empty or "batch_size" not in req:
        return {}
    batch = pd.to_numeric(req["batch_size"], errors="coerce").median()
    prompt = pd.to_numeric(req["prompt_tokens"], errors="coerce").mean()
    if not (math.isfinite(prompt) and math.isfinite(batch) and batch >= 1):
        return {}
    batch = int(batch)
    out = pd.to_numeric(req["output_tokens"], errors="coerce")
    if "n_requests" in req:  # a row standing for several requests (long-output strategies): per-request output
        out = out / pd.to_numeric(req["n_requests"], errors="coerce").fillna(1).clip(lower=1)
    ctx = prompt + float(out.mean()) / 2
    # with a reused prefix cache only the new tokens are prefilled (compression's kv_reuse)
    prefilled = pd.to_numeric(req["prefilled_tokens"], errors="coerce").mean() if "prefilled_tokens" in req else math.nan
    prefill_tokens = prefilled if math.isfinite(prefilled) else prompt
    return {
        "mbu": mbu(info.weight_bytes, info.kv_cache_bytes_per_token(), batch, ctx,
                   summary.get("tpot_s_p50", float("nan")), env["bandwidth_bytes_per_s"]),
        "mfu": mfu(prefill_flops(info.num_non_embedding_params, info.num_layers, info.attn_dim,
                                 int(prefill_tokens), batch),
                   summary.get("prefill_s_p50", float("nan")), env["flops_per_s"]),
        "peak_bandwidth_bytes_per_s": env["bandwidth_bytes_per_s"],
        "peak_flops_per_s": env["flops_per_s"],
    }


def acceptance(proposed: list[list[int]], emitted: list[list[int]]) -> dict:
    """Acceptance figures of speculative requests from their per-step counts.

    Args:
        proposed: per request, the draft tokens each verification step checked (>= 0 each).
        emitted: per request, the ids each step added to the output (>= 1 each; the last step may be cut at
            EOS or the length cap).

    Returns:
        ``proposed_tokens``, ``accepted_tokens`` (per step ``min(emitted - 1, proposed)``), ``verify_steps``,
        ``output_tokens``; ``acceptance_rate`` (accepted / proposed, NaN with no proposal), ``accepted_length``
        (output ids / steps: mean ids per verification step), ``verify_steps_per_token`` (steps / output ids)
        and ``acceptance_by_position`` (list: position ``i`` accepted / proposed, over steps that proposed
        at least ``i + 1`` tokens); ``drafting_steps`` (steps that proposed at least one token),
        ``mean_acceptance_length`` (``1 + accepted / drafting_steps``: vLLM's ``mean_acceptance_length`` and
        AIPerf's acceptance length, over the steps that proposed; NaN with none) and ``mean_draft_tokens``
        (``proposed / drafting_steps``: ``transformers`` adapts the number of draft tokens step by step).
    """
    prop = acc = steps = out = drafting = 0
    by_prop: list[int] = []
    by_acc: list[int] = []
    for p_req, e_req in zip(proposed, emitted):
        for p, e in zip(p_req, e_req):
            a = max(0, min(e - 1, p))
            prop, acc, steps, out = prop + p, acc + a, steps + 1, out + e
            drafting += p > 0
            while len(by_prop) < p:
                by_prop.append(0)
                by_acc.append(0)
            for i in range(p):
                by_prop[i] += 1
                by_acc[i] += i < a
    nan = float("nan")
    return {"proposed_tokens": prop, "accepted_tokens": acc, "verify_steps": steps, "output_tokens": out,
            "acceptance_rate": acc / prop if prop else nan,
            "accepted_length": out / steps if steps else nan,
            "verify_steps_per_token": steps / out if out else nan,
            "acceptance_by_position": [a / p for a, p in zip(by_acc, by_prop)],
            "drafting_steps": drafting,
            "mean_acceptance_length": 1 + acc / drafting if drafting else nan,
            "mean_draft_tokens": prop / drafting if drafting else nan}


def speedup_bound(mean_acceptance_length: float, draft_tokens: float, cost_ratio: float) -> float:
    """Upper bound of the speed-up of speculative decoding from the measured acceptance length (Leviathan et al.
    2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1 and theorem 3.8, with the measured
    tokens per step in place of their ``(1 - a^(k+1)) / (1 - a)``).

    ``tau / (1 + k c)``: ``tau`` the mean ids a drafting step yields (:func:`acceptance`'s
    ``mean_acceptance_length``, vLLM's and AIPerf's definition), over its cost in target decode steps (``k``
    draft forwards at ``c`` each plus one verification, assumed to cost one decode step). ``k`` is the mean
    number of draft tokens a step proposed (``transformers`` changes it step by step). The closed form with
    the acceptance rate ``a = accepted / proposed`` assumes each position is accepted independently with
    probability ``a``; real acceptance is all-or-nothing far more often, and that form fell 13-36% below
    speed-ups actually measured (issue 32). Steps that proposed nothing emit one id at one step's cost, so
    ``tau`` is at least the tokens per step achieved over all steps.

    Returns:
        The bound (x); NaN on missing input or ``k`` < 0.
    """
    t, k, c = mean_acceptance_length, draft_tokens, cost_ratio
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (t, k, c)) or k < 0:
        return float("nan")
    return t / (1 + k * c)


def verification_mbu(loaded, requests: list[dict], acc: dict, draft, peaks: dict) -> dict:
    """MBU of a speculative point per verification step: each step reads the target's weights and its KV cache
    once and runs the draft ``mean_draft_tokens`` times (its weights each time; prompt lookup reads none), in
    the median time of a decode verification step (``(e2e_s - ttft_s) / (steps - 1)`` of each request). The
    draft's own KV reads are left out (a lower bound on the bytes). Counting one weight read per output id, as
    a plain point does, overstated it by about the acceptance length (issue 32).

    Returns:
        ``mbu``, ``mbu_note``, ``peak_bandwidth_bytes_per_s``; ``mbu`` NaN (with the note) when no request had
        two verification steps.
    """
    nan = float("nan")
    step_s = []
    for r in requests:
        steps = len(r.get("draft_emitted") or [])
        if steps >= 2 and r.get("e2e_s") == r.get("e2e_s") and r.get("ttft_s") == r.get("ttft_s"):
            step_s.append((r["e2e_s"] - r["ttft_s"]) / (steps - 1))
    note = "per verification step: target weights + KV + the draft's weight reads (its KV left out)"
    if not step_s:
        return {"mbu": nan, "mbu_note": "no request with two verification steps: not computed"}
    info = loaded.info
    prompt = sum(r.get("prompt_tokens", 0) or 0 for r in requests) / len(requests)
    out = sum(r.get("output_tokens", 0) or 0 for r in requests) / len(requests)
    k = acc.get("mean_draft_tokens", nan)
    draft_bytes = (draft.info.weight_bytes * k) if draft is not None and k == k else 0.0
    return {"mbu": mbu(info.weight_bytes + draft_bytes, info.kv_cache_bytes_per_token(), 1,
                       prompt + out / 2, float(pd.Series(step_s).median()), peaks["bandwidth_bytes_per_s"]),
            "mbu_note": note, "peak_bandwidth_bytes_per_s": peaks["bandwidth_bytes_per_s"]}
