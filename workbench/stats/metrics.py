"""Aggregate per-request measurements into per-point figures: percentiles, summaries, MBU / MFU.

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
import math
import time
from typing import Sequence

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)
# a percentile is reported only from enough independent samples: p99 from fewer than 100 values is one value
MIN_SAMPLES = {"p50": 1, "p90": 10, "p99": 100}
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


def _read_columns() -> dict[str, Column]:
    """The column table, ``workbench/stats/columns.csv`` (name, unit, higher_is_better yes/no/blank, label, definition)."""
    import csv
    from importlib import resources

    text = resources.files("workbench.stats").joinpath("columns.csv").read_text(encoding="utf-8")
    out = {}
    for r in csv.DictReader(text.splitlines()):
        higher = {"yes": True, "no": False}.get(r["higher_is_better"])
        out[r["name"]] = Column(r["name"], r["unit"], r["definition"], higher, r["label"])
    return out


# The column table: every figure label and report unit comes from here (DESIGN.md section 4). A new
# column is one line of columns.csv.
COLUMNS: dict[str, Column] = _read_columns()


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


def request_timing(stamps: Sequence[float], t_submit: float, decode_steps: int | None = None) -> dict:
    """Per-request timing from the clock reading of each generated token id: the one home of these formulas.

    Args:
        stamps: ``time.perf_counter()`` (or a clock on the same base) of every generated token id of one
            request, in order, EOS included; after device synchronisation on accelerators.
        t_submit: when the request was handed to the workbench (before templating and tokenisation).
        decode_steps: decode steps between the first and the last stamp, when a stamp is not one token id
            (an HTTP client's text chunks; :func:`workbench.serving.client.stream_chat` counts them from
            ``usage`` and the tokenizer). Default ``len(stamps) - 1``. Only ``tpot_s`` and ``decode_tps``
            use it; ``itl_s`` stays the gaps between stamps.

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
    steps = n - 1 if decode_steps is None else int(decode_steps)
    return {
        "output_tokens": n,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "itl_s": [b - a for a, b in zip(stamps, stamps[1:])],
        "tpot_s": decode_s / steps if n > 1 and steps > 0 else nan,
        "decode_tps": steps / decode_s if n > 1 and steps > 0 and decode_s > 0 else nan,
    }


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
    """Interval of a column's median over repeats: a Student-t interval over the per-repeat medians.

    Repeats are the independent units (rows of one repeat share the machine's state and, in a batch, one
    stamp per step), so each repeat contributes one value, its median, and the interval is
    :func:`workbench.stats.evidence.t_interval` over them. Its coverage holds at two repeats and up
    (tests/test_evidence.py simulates it); the percentile bootstrap over repeats it replaces was, with two
    repeats, the range of two medians (about 50% coverage). Fewer than two repeats: ``(nan, nan)``.

    Returns:
        ``(low, high)`` in the column's unit.
    """
    from workbench.stats.evidence import t_interval

    if column not in requests or "repeat" not in requests:
        return float("nan"), float("nan")
    medians = [float(np.median(v)) for _, g in requests.groupby("repeat")
               if (v := pd.to_numeric(g[column], errors="coerce").dropna().to_numpy()).size]
    iv = t_interval(medians, confidence, unit="repeat medians")
    return iv.low, iv.high


OTHERS_LOAD_LIMIT = 0.25  # cores' worth of CPU time used by other processes while a point ran
STEAL_LIMIT = 0.05        # share of CPU time stolen by the hypervisor
#: The shortest window whose contamination figures are read: ``/proc/stat`` counts in clock ticks (10 ms at
#: the usual 100 Hz), so over a few milliseconds one tick of anybody's work reads as tens of cores. Shorter
#: points get NaN figures and no verdict from them (a 0.2 s window resolves about 0.1 core).
MIN_LOAD_WINDOW_S = 0.2


def _cpu_jiffies() -> tuple[int, int] | None:
    """``(busy, steal)`` jiffies of all CPUs from ``/proc/stat`` (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal, steal


SERVED_BY_PIDS: set = set()  # processes whose CPU time is the measurement's own work (a loopback endpoint's server)


class LoadMonitor:
    """CPU time that other processes (and the hypervisor) took while a point was measured.

    Reads ``/proc/stat`` (all CPUs' busy and steal jiffies) and this process tree's own CPU time
    (``psutil``, all threads, no child processes) at start and :meth:`stop`; others' load is the difference, in cores (CPU seconds per
    wall second). Elsewhere (no ``/proc``), and over windows too short for the tick counts to resolve
    (:data:`MIN_LOAD_WINDOW_S`), the figures are NaN and no verdict is drawn from them.
    The processes in :data:`SERVED_BY_PIDS` (a server on this machine that the point loads over HTTP, registered
    by :mod:`workbench.serving.endpoint`) count as own work, not as other load.
    GPU: other processes on an NVIDIA device are not yet counted.
    """

    def __init__(self):
        import os

        import psutil

        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._proc = psutil.Process()
        self._served = []
        for pid in sorted(SERVED_BY_PIDS):
            try:
                self._served.append(psutil.Process(pid))
            except psutil.Error:
                pass
        self._t0 = time.perf_counter()
        self._own0 = self._own()
        self._cpu0 = _cpu_jiffies()

    def _own(self) -> float:
        """CPU seconds of this process (all its threads) and of the served-by processes; other child processes
        count as other load."""
        import psutil

        t = self._proc.cpu_times()
        own = t.user + t.system
        for p in self._served:
            try:
                c = p.cpu_times()
                own += c.user + c.system
            except psutil.Error:  # it ended: its time so far is lost, the verdict errs towards "other load"
                pass
        return own

    def stop(self) -> dict:
        """``others_cpu_load`` (cores) and ``steal_frac`` (share of busy time) since construction; both NaN
        (no verdict) without ``/proc/stat`` or over a window shorter than :data:`MIN_LOAD_WINDOW_S`."""
        wall = time.perf_counter() - self._t0
        cpu1 = _cpu_jiffies()
        if self._cpu0 is None or cpu1 is None or wall < MIN_LOAD_WINDOW_S:
            return {"others_cpu_load": float("nan"), "steal_frac": float("nan")}
        busy_s = (cpu1[0] - self._cpu0[0]) / self._hz
        steal_s = (cpu1[1] - self._cpu0[1]) / self._hz
        own_s = self._own() - self._own0
        return {"others_cpu_load": max(0.0, busy_s - own_s - steal_s) / wall,
                "steal_frac": steal_s / busy_s if busy_s > 0 else 0.0}


def verdict(row: dict) -> dict:
    """A point's validity: ``{"valid": bool, "invalid_reason": str}`` from its contamination figures.

    Invalid when other processes used more than :data:`OTHERS_LOAD_LIMIT` cores, or the hypervisor
    stole more than :data:`STEAL_LIMIT` of the CPU time, while it was measured. (Drift of the reference
    point is judged after the sweep, see :mod:`workbench.run.drift`.)
    """
    reasons = []
    load, steal = row.get("others_cpu_load"), row.get("steal_frac")
    if load is not None and load == load and load > OTHERS_LOAD_LIMIT:
        reasons.append(f"other processes used {load:.2f} CPU cores during the point (limit {OTHERS_LOAD_LIMIT})")
    if steal is not None and steal == steal and steal > STEAL_LIMIT:
        reasons.append(f"hypervisor stole {steal:.0%} of CPU time (limit {STEAL_LIMIT:.0%})")
    return {"valid": not reasons, "invalid_reason": "; ".join(reasons)}


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
