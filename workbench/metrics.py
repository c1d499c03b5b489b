"""Aggregate per-request measurements into per-point figures, and probe the device.

Definitions follow vLLM's serving benchmark (``benchmarks/benchmark_serving.py``)
and NVIDIA GenAI-Perf; DESIGN.md section 4 is the table. Percentiles are
``numpy.percentile`` (linear interpolation) over requests that produced at least
one token; ITL percentiles pool every gap of every such request.

MBU (memory-bandwidth utilisation) follows Databricks, "LLM Inference
Performance Engineering: Best Practices" (2023): bytes that one decode step
must read (all weights + the KV cache of every row) times decode steps per
second, over the measured peak bandwidth. MFU (model FLOPs utilisation) follows
PaLM (Chowdhery et al. 2022, appendix B) with the forward-pass count of Kaplan
et al. 2020 (table 1): ``2 N`` FLOPs per token plus ``2 n_layers n_ctx d_model``
for attention, over the measured peak matmul FLOP/s.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_COLUMNS = ("ttft_s", "prefill_s", "tpot_s", "e2e_s", "itl_s", "decode_tps")


def percentiles(values, qs=PERCENTILES) -> dict:
    """Percentiles of finite values: ``{"p50": .., "p90": .., "p99": ..}``; NaN when there are none."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {f"p{q}": float("nan") for q in qs}
    return {f"p{q}": float(v) for q, v in zip(qs, np.percentile(arr, qs))}


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
    for col in LATENCY_COLUMNS:
        if col not in done:
            continue
        values = [x for lst in done[col] for x in lst] if col == "itl_s" else done[col].tolist()
        for k, v in percentiles(values).items():
            row[f"{col}_{k}"] = v
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
    )
    return row


def pareto_front(points: pd.DataFrame, x: str = "output_throughput_tps", y: str = "ttft_s_p50") -> pd.DataFrame:
    """Rows not dominated by another row (higher ``x`` is better, lower ``y`` is better), sorted by ``x``."""
    df = points.dropna(subset=[x, y]).sort_values([x, y], ascending=[False, True])
    keep, best_y = [], math.inf
    for idx, r in df.iterrows():
        if r[y] < best_y:
            keep.append(idx)
            best_y = r[y]
    return df.loc[keep].sort_values(x)


def recommend_batch_size(points: pd.DataFrame) -> pd.Series | None:
    """The ``ok`` point with the highest ``goodput_rps`` (ties: smaller batch, then higher throughput).

    Returns None when no point has positive goodput.
    """
    ok = points[(points["status"] == "ok") & (points["goodput_rps"] > 0)]
    if ok.empty:
        return None
    ranked = ok.sort_values(["goodput_rps", "batch_size", "output_throughput_tps"], ascending=[False, True, False])
    return ranked.iloc[0]


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@functools.lru_cache(maxsize=8)
def probe_device(device: str = "cpu", dtype: str = "float32") -> dict:
    """Measure peak memory bandwidth and matmul FLOP/s of a device (a one-off, ~1-2 s).

    Bandwidth: a 256 MiB tensor copied into another (read + write = 2 x size
    bytes), best of 5. FLOP/s: an ``n x n`` matmul in ``dtype`` (``2 n^3``
    FLOPs), ``n = 2048`` on CPU and 8192 on CUDA, best of 5, after one warm-up.

    Returns:
        ``{"bandwidth_bytes_per_s": float, "flops_per_s": float, "device": str, "dtype": str}``.
    """
    import torch

    dt = getattr(torch, dtype)
    n_bytes = 256 << 20
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    bandwidth = 2 * n_bytes / best
    del src, dst
    n = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    a @ b
    best = math.inf
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return {"bandwidth_bytes_per_s": bandwidth, "flops_per_s": 2 * n**3 / best, "device": device, "dtype": dtype}


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


def prefill_flops(num_params: int, num_layers: int, hidden_size: int, prompt_tokens: int, batch_size: int = 1) -> float:
    """Forward FLOPs of a prefill (Kaplan et al. 2020, table 1).

    ``batch_size * (2 * N * L + 2 * n_layers * L^2 * d_model)`` for ``L`` prompt
    tokens: the dense part plus the attention score/value products. ``N`` is the
    non-embedding parameter count (``ModelInfo.num_non_embedding_params``).
    """
    L = prompt_tokens
    return batch_size * (2.0 * num_params * L + 2.0 * num_layers * L * L * hidden_size)


def mfu(flops: float, prefill_s: float, peak_flops_per_s: float) -> float:
    """Prefill model-FLOPs utilisation (PaLM, Chowdhery et al. 2022): ``flops / prefill_s / peak``."""
    if not (prefill_s and prefill_s > 0 and peak_flops_per_s > 0) or math.isnan(prefill_s):
        return float("nan")
    return flops / prefill_s / peak_flops_per_s


def peak_memory_bytes(device: str) -> int:
    """CUDA: ``torch.cuda.max_memory_allocated``; elsewhere the process's resident set size now (psutil)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated())
    import psutil

    return int(psutil.Process().memory_info().rss)
