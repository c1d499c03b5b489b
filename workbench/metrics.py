"""Aggregate per-request measurements into per-point figures, and probe the device.

Definitions follow vLLM's serving benchmark (``benchmarks/benchmark_serving.py``)
and NVIDIA GenAI-Perf; DESIGN.md section 4 is the table. Percentiles are
``numpy.percentile`` (linear interpolation) over requests that produced at least
one token; ITL percentiles pool every gap of every such request.

MBU (memory-bandwidth utilisation) follows Databricks, "LLM Inference
Performance Engineering: Best Practices" (2023): bytes that one decode step
must read (all weights + the KV cache of every row) times decode steps per
second, over the measured peak bandwidth. MFU (model FLOPs utilisation) follows
PaLM (Chowdhery et al. 2022, appendix B): ``2 N`` FLOPs per token (Kaplan et al.
2020, table 1) plus ``4 n_layers L attn_dim`` for the attention products, over the
measured peak matmul FLOP/s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
LATENCY_COLUMNS = ("ttft_s", "prefill_s", "tpot_s", "e2e_s", "itl_s", "decode_tps")
STATS = ("p50", "p90", "p99", "mean", "rate", "min", "max")


@dataclasses.dataclass(frozen=True)
class Column:
    """One measured column: its unit, definition, direction and axis label (llmperf ``common_metrics.py``)."""

    name: str
    unit: str
    definition: str
    higher_is_better: bool | None
    label: str


def _c(name, unit, definition, higher, label):
    return Column(name, unit, definition, higher, label)


# The column table: every figure label and report unit comes from here (DESIGN.md section 4).
COLUMNS: dict[str, Column] = {c.name: c for c in [
    _c("ttft_s", "s", "first generated token id minus t_submit (before templating)", False, "TTFT (s)"),
    _c("prefill_s", "s", "the model's forward pass over the prompt", False, "prefill (s)"),
    _c("itl_s", "s", "gaps between consecutive generated token ids", False, "inter-token latency (s)"),
    _c("tpot_s", "s", "(e2e_s - ttft_s) / (output_tokens - 1)", False, "TPOT (s/token)"),
    _c("e2e_s", "s", "last generated token id minus t_submit", False, "end-to-end latency (s)"),
    _c("decode_tps", "tokens/s", "(output_tokens - 1) / (e2e_s - ttft_s)", True, "per-request decode speed (tokens/s)"),
    _c("output_tokens", "tokens", "generated ids, EOS included, padding excluded", None, "output tokens"),
    _c("prompt_tokens", "tokens", "prompt ids including the chat template", None, "prompt tokens"),
    _c("context_tokens", "tokens", "requested context length", None, "context tokens"),
    _c("batch_size", "requests", "requests sharing one generate call", None, "batch size (requests)"),
    _c("max_new_tokens", "tokens", "generation cap", None, "max new tokens"),
    _c("temperature", "", "sampling temperature (0 = greedy)", None, "temperature"),
    _c("top_p", "", "nucleus mass", None, "top-p"),
    _c("output_throughput_tps", "tokens/s", "all output tokens / wall time of the point", True,
       "output throughput (tokens/s)"),
    _c("request_throughput_rps", "requests/s", "completed requests / wall time", True, "request throughput (requests/s)"),
    _c("goodput_rps", "requests/s", "SLO-meeting requests / wall time", True, "goodput (requests/s within SLO)"),
    _c("slo_attainment", "", "share of requests meeting every SLO limit", True, "SLO attainment"),
    _c("mbu", "", "decode bytes per step x steps/s / peak bandwidth", True, "MBU (fraction of peak bandwidth)"),
    _c("mfu", "", "prefill FLOPs / prefill_s / peak FLOP/s", True, "MFU (fraction of peak FLOP/s)"),
    _c("peak_memory_bytes", "bytes", "peak memory of the point", False, "peak memory (bytes)"),
    _c("kv_cache_bytes", "bytes", "KV-cache bytes", False, "KV cache (bytes)"),
    _c("ttfat_s", "s", "time to first answer token (after thinking)", False, "TTFAT (s)"),
    _c("thinking_tokens", "tokens", "output tokens spent thinking", None, "thinking tokens"),
    _c("answer_tokens", "tokens", "output tokens of the answer", None, "answer tokens"),
    _c("reasoning_budget", "tokens", "cap on thinking tokens", None, "reasoning budget (tokens)"),
    _c("queue_s", "s", "arrival at the server to admission into a batch", False, "queue time (s)"),
    _c("chunk_itl_s", "s", "client-side gaps between received text chunks (not tokens)", False,
       "inter-chunk latency (s)"),
    _c("first_text_s", "s", "first visible text of a multi-request strategy", False, "time to first text (s)"),
    _c("wall_s", "s", "wall time of a multi-request strategy or point", False, "wall time (s)"),
    _c("compressor_s", "s", "time spent compressing the context", False, "compressor time (s)"),
    _c("ttft_total_s", "s", "compressor_s + ttft_s of one request", False, "compressor + TTFT (s)"),
    _c("total_s", "s", "compressor_s + e2e_s of one request", False, "total time, compressor + answer (s)"),
    _c("original_tokens", "tokens", "context tokens before compression (target tokenizer)", None,
       "original context tokens"),
    _c("compressed_tokens", "tokens", "context tokens after compression (target tokenizer)", None,
       "compressed context tokens"),
    _c("achieved_ratio", "x", "original_tokens / compressed_tokens", None, "achieved ratio (x)"),
    _c("prefilled_tokens", "tokens", "prompt tokens prefilled for the request (minus a reused prefix cache)", None,
       "prefilled tokens"),
    _c("needle_kept", "", "share of requests whose compressed context still holds the needle sentence", True,
       "needle kept (share)"),
    _c("gold_logprob_per_token", "nats/token", "gold_logprob / gold answer tokens", True,
       "gold-answer log-likelihood per token (nats)"),
    _c("compression_ratio", "", "gzip compression ratio of the output text (repetition)", False, "gzip ratio"),
    _c("exact_match", "", "SQuAD exact match", True, "exact match"),
    _c("substring_match", "", "normalised answer found in the prediction", True, "substring match"),
    _c("rouge_l", "", "ROUGE-L F1 against the reference", True, "ROUGE-L F1"),
    _c("section_coverage", "", "share of requested sections present", True, "section coverage"),
    _c("gold_logprob", "nats", "log-likelihood of the gold answer", True, "gold-answer log-likelihood (nats)"),
    _c("distinct_1", "", "distinct unigrams / unigrams", True, "distinct-1"),
    _c("distinct_2", "", "distinct bigrams / bigrams", True, "distinct-2"),
    _c("repeated_4gram_rate", "", "share of repeated 4-grams", False, "repeated 4-gram rate"),
    _c("perplexity", "", "exp(mean NLL of the output tokens)", None, "perplexity"),
    _c("truncated", "", "1 when the answer hit max_new_tokens (finish_reason = length), else 0", False,
       "truncated (finish_reason = length)"),
    _c("energy_j", "J", "device energy over the timed repeats", False, "energy (J)"),
    _c("energy_j_per_token", "J/token", "energy per output token", False, "energy per token (J)"),
    _c("n_samples", "", "independent timing samples behind the percentiles", None, "samples"),
]}


def base_column(name: str) -> tuple[str, str | None]:
    """Split an aggregate name ``<column>_<stat>`` into ``(column, stat)``; ``(name, None)`` otherwise."""
    for stat in STATS:
        if name.endswith("_" + stat) and name[: -len(stat) - 1] in COLUMNS:
            return name[: -len(stat) - 1], stat
    return name, None


def label(name: str) -> str:
    """Axis label of a column or aggregate (``ttft_s_p50`` -> ``TTFT p50 (s)``); the name itself if unknown."""
    col, stat = base_column(name)
    if col not in COLUMNS:
        return name.replace("_", " ")
    lab = COLUMNS[col].label
    if stat is None:
        return lab
    if "(" in lab:
        head, tail = lab.split("(", 1)
        return f"{head.rstrip()} {stat} ({tail}"
    return f"{lab} {stat}"


def request_timing(stamps: Sequence[float], t_submit: float) -> dict:
    """Per-request timing from the clock reading of each generated token id: the one home of these formulas.

    Args:
        stamps: ``time.perf_counter()`` (or a clock on the same base) of every generated token id of one
            request, in order, EOS included; after device synchronisation on accelerators.
        t_submit: when the request was handed to the workbench (before templating and tokenisation).

    Returns:
        ``output_tokens`` (``len(stamps)``), ``ttft_s`` (``stamps[0] - t_submit``), ``e2e_s``
        (``stamps[-1] - t_submit``), ``itl_s`` (list of the ``n - 1`` gaps), ``tpot_s``
        (``(e2e_s - ttft_s) / (n - 1)``) and ``decode_tps`` (``(n - 1) / (e2e_s - ttft_s)``); definitions
        of vLLM's ``benchmarks/serve.py`` ``calculate_metrics`` and DESIGN.md section 4. Times are NaN
        where undefined (no token; TPOT of one token), never zero.
    """
    stamps = [float(t) for t in stamps]
    n = len(stamps)
    nan = float("nan")
    ttft = stamps[0] - t_submit if n else nan
    e2e = stamps[-1] - t_submit if n else nan
    decode_s = e2e - ttft
    return {
        "output_tokens": n,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "itl_s": [b - a for a, b in zip(stamps, stamps[1:])],
        "tpot_s": decode_s / (n - 1) if n > 1 else nan,
        "decode_tps": (n - 1) / decode_s if n > 1 and decode_s > 0 else nan,
    }


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


def prefill_flops(num_params: int, num_layers: int, attn_dim: int, prompt_tokens: int, batch_size: int = 1) -> float:
    """Forward FLOPs of a prefill, PaLM's count (Chowdhery et al. 2022, appendix B).

    ``batch_size * (2 * N * L + 4 * n_layers * L^2 * attn_dim)`` for ``L`` prompt tokens: ``2 N`` per token
    for the dense matmuls (Kaplan et al. 2020, table 1) plus the two attention products (``Q K^T`` and
    ``A V``, ``2 L^2 attn_dim`` each per layer) over the full ``L x L`` matrix, as PaLM's MFU counts them
    (a causal kernel skips about half). ``N`` is the non-embedding parameter count and ``attn_dim`` is
    query heads x head dim (:attr:`workbench.models.ModelInfo.attn_dim`), which is not always the hidden size.
    """
    L = prompt_tokens
    return batch_size * (2.0 * num_params * L + 4.0 * num_layers * L * L * attn_dim)


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
