"""Predict, then measure: a calibrated per-machine roofline for every sweep point.

The model (one home of these formulas; the per-point utilisation figures MBU/MFU of
:mod:`workbench.stats.metrics` use the same byte and FLOP counts):

- **Decode is memory-bound.** Each decode step reads every weight once plus every row's KV cache
  (Databricks, "LLM Inference Performance Engineering: Best Practices", 2023; Pope et al., "Efficiently
  Scaling Transformer Inference", MLSys 2023, section 2; Yuan et al., "LLM Inference Unveiled: Survey and
  Roofline Model Insights", 2024, section 2): ``memory_s = (weight_bytes + kv_traffic x kv_bytes_per_token x
  batch x context) / bandwidth``; the KV term grows with the context every step. ``kv_traffic`` (fitted, >= 1
  in practice) counts the cache bytes an eager engine moves per cached token and step beyond one read: the
  dynamic cache's concatenation rewrites the cache, grouped-query attention's ``repeat_kv`` materialises
  ``heads / kv_heads`` copies, the mask spans the context. Its arithmetic is ``2 (N + V h)`` FLOPs per row
  (Kaplan et al. 2020, table 1; the LM head ``V x h`` runs every step) plus ``4 n_layers x context x attn_dim``
  for the attention products over the cache.
- **Per-row decode cost.** A batch of ``B`` rows turns each weight read into a ``B``-row GEMV/GEMM, and every
  row pays its own sampling, logits processing and bookkeeping: ``step_row_overhead_s x B`` per step, fitted
  (Kim et al., "Full Stack Optimization of Transformer Inference: a Survey", 2023: the non-matmul operations
  take a sizeable share of runtime, more so at small batch where the matmuls are memory-bound).
- **Prefill is compute-bound.** ``compute_s = prefill_flops / FLOP/s`` with PaLM's count
  (Chowdhery et al. 2022, appendix B; :func:`workbench.stats.metrics.prefill_flops`), the attention products halved
  (a causal kernel skips the masked upper triangle), plus one LM-head row per sequence.
- **Roofline.** Williams, Waterman & Patterson, "Roofline: an insightful visual performance model for
  multicore architectures" (CACM 2009): a phase takes ``max(memory_s, compute_s)`` when data movement and math
  overlap (GPUs); on a CPU the same cores do both, so the terms add (the no-overlap bound); :class:`Device`
  ``overlap`` chooses.
- **Calibration** (:func:`calibrate`, ~15-20 s on a 2-core CPU): a few measured prefills and decode steps fit
  a fixed per-call overhead ``o`` per phase (kernel launches, Python, the ``generate`` loop) and the achieved
  fraction ``eta`` of the probed matmul FLOP/s (prefill); the probed copy bandwidth is taken as achievable.
  Prefill: ``o_p + combine(memory_s, compute_s / eta_p)``. Decode on a CPU (no overlap), one non-negative
  least-squares fit over the calibration runs of ``tpot - weight_bytes / bandwidth - compute_s / eta_p =
  o_d + step_row_overhead_s x B + kv_traffic x kv_bytes / bandwidth + batched_step_overhead_s x [B > 1]``
  (the matmuls run at the prefill's efficiency; what rows add beyond it is the per-row term; the last term is
  the BLAS library's switch from matrix-vector to packed matrix-matrix kernels once a step has two rows). On an
  accelerator (overlap) decode fits ``o_d`` and ``eta_d`` of ``o_d + max(memory_s, compute_s / eta_d)``. TTFT
  adds the measured templating, tokenisation and first-sampling time (``ttft_s - prefill_s`` of the
  calibration runs). The calibration runs span batch 1, 2 and 8 and short and long contexts, so each fitted
  term has its own lever (overheads: short batch-1 runs; the kernel switch: batch 2; per-row cost: batch 8;
  KV traffic: the context).
- **Bound** of a point: the largest of its overhead, memory and compute seconds over the whole request.
- **Its error, out of sample.** The decode fit has four coefficients; the calibration runs six workloads, so
  the fit is not exact, and :func:`fit_calibration` quotes the leave-one-workload-out error (each workload
  predicted by a fit on the others) beside the in-sample one (``Calibration.loo_*_error``).
- **A cached calibration is checked** against today's device probe (:func:`check_calibration`): a calibration
  from a slower day over-predicts a faster one by 30-60%, so when bandwidth or FLOP/s moved by more than 15% it
  is refitted (model loaded) or rescaled (overheads by the FLOP/s ratio, today's probe); ``Calibration.check``
  records which.

Inputs come from the model's ``config.json`` only (:class:`ModelShape`: parameter counts computed from the
config, no weights load) and from :func:`workbench.measure.device.probe_device` (bandwidth, FLOP/s). A calibration is
cached per (model, device, dtype, threads) in ``<cache>/roofline/`` so ``workbench plan`` can use it without
loading the model. Each dtype has its own probe (matmul FLOP/s differ: bfloat16 on a CPU without native bf16
units is slower than float32) and its own calibration (:meth:`Predictor.for_dtype`); a dtype not calibrated
yet borrows the overheads of the calibrated one with its own probed FLOP/s (``calibrated_dtype`` says which).

Assumptions stated where they bite: FLOP/s scale with ``torch_threads / probe threads``; bandwidth is taken as
saturated by any thread count; engine choices (attention kernel, static cache, compilation) do not enter the
prediction, so their effect shows as the residual ``measured / predicted``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.stats import metrics
from workbench.measure.device import probe_device
from workbench.errors import ParameterError

BYTES_PER_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}
BOUNDS = ("overhead", "memory", "compute")


# ----------------------------------------------------------------------------- model shape (config only)


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the roofline needs from a model, read from its config (no weights).

    Attributes:
        num_layers, num_heads, num_kv_heads, head_dim, hidden_size, intermediate_size, vocab_size: config.
        num_params: all parameters (tied embeddings counted once).
        num_non_embedding_params: parameters outside the input embedding and LM head (Kaplan's ``N``).
        dtype: the weights' dtype name.
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int
    num_non_embedding_params: int
    dtype: str = "float32"

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.dtype]

    @property
    def attn_dim(self) -> int:
        """Query heads x head dim (as :attr:`workbench.measure.models.ModelInfo.attn_dim`)."""
        return self.num_heads * self.head_dim

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.bytes_per_element

    @property
    def head_params(self) -> int:
        """The LM head's ``V x h`` matmul, computed for one position per row and step."""
        return self.vocab_size * self.hidden_size

    def kv_cache_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes/element (as ``ModelInfo``)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_element

    def with_dtype(self, dtype: str) -> "ModelShape":
        if dtype not in BYTES_PER_ELEMENT:
            raise ParameterError(f"dtype: must be one of {', '.join(BYTES_PER_ELEMENT)} (got {dtype!r})")
        return dataclasses.replace(self, dtype=dtype)

    @classmethod
    def from_config(cls, cfg: dict, dtype: str = "float32") -> "ModelShape":
        """Shape and parameter counts of a Llama-style decoder (Llama, Mistral, Qwen2/3, SmolLM) from its config.

        Per layer: ``q``/``o`` projections ``h x H d`` each, ``k``/``v`` ``h x H_kv d`` each (plus biases when
        ``attention_bias``), a gated MLP ``3 h I`` (``2 h I`` without a gate, ``hidden_act`` gelu-style GPT MLPs),
        two RMSNorms ``2 h`` (plus ``2 d`` for Qwen3's q/k norms); a final norm ``h``; the embedding ``V h``,
        and an LM head ``V h`` unless ``tie_word_embeddings``.
        """
        cfg = dict(cfg.get("text_config") or cfg)
        h = int(cfg["hidden_size"])
        H = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or H)
        d = int(cfg.get("head_dim") or h // H)
        L = int(cfg["num_hidden_layers"])
        inter = int(cfg.get("intermediate_size") or 4 * h)
        V = int(cfg["vocab_size"])
        gated = cfg.get("model_type") not in ("gpt2", "gpt_neox", "opt", "phi")
        attn = 2 * h * H * d + 2 * h * kv * d
        if cfg.get("attention_bias"):
            attn += H * d + 2 * kv * d + h
        mlp = (3 if gated else 2) * h * inter
        norms = 2 * h + (2 * d if cfg.get("model_type") == "qwen3" else 0)
        non_emb = L * (attn + mlp + norms) + h
        emb = V * h
        head = 0 if cfg.get("tie_word_embeddings", True) else V * h
        return cls(L, H, kv, d, h, inter, V, non_emb + emb + head, non_emb, dtype)

    @classmethod
    def from_model(cls, spec: str, dtype: str = "float32") -> "ModelShape":
        """:meth:`from_config` of a model spec (``default``, a folder, a cached hub id); reads config.json only."""
        from workbench.measure import models

        return cls.from_config(models.read_model_config(spec), dtype)


# ----------------------------------------------------------------------------- device and calibration


@dataclasses.dataclass(frozen=True)
class Device:
    """Probed peaks of a device (:func:`workbench.measure.device.probe_device`).

    Attributes:
        bandwidth_bytes_per_s: copy bandwidth.
        flops_per_s: matmul FLOP/s in the probed dtype.
        threads: torch threads the probe ran with (CPU FLOP/s scale with threads / this).
        overlap: memory and compute time overlap (``max``, accelerators) or add (``sum``, CPUs).
        name, dtype: what was probed.
        noisy: the probe's trials spread beyond :data:`workbench.measure.device.PROBE_SPREAD_LIMIT` (other load ran).
    """

    bandwidth_bytes_per_s: float
    flops_per_s: float
    threads: int = 1
    overlap: bool = False
    name: str = "cpu"
    dtype: str = "float32"
    noisy: bool = False

    @classmethod
    def probe(cls, device: str = "cpu", dtype: str = "float32", trials: int = 7) -> "Device":
        import torch

        p = probe_device(device, dtype) if trials == 7 else probe_device(device, dtype, trials)
        return cls(p["bandwidth_bytes_per_s"], p["flops_per_s"], torch.get_num_threads(),
                   overlap=not device.startswith("cpu"), name=device, dtype=dtype, noisy=bool(p.get("probe_noisy")))

    def flops_at(self, threads: int | None) -> float:
        no_threads = threads is None or (isinstance(threads, float) and math.isnan(threads))
        if no_threads or not self.name.startswith("cpu"):
            return self.flops_per_s
        return self.flops_per_s * min(int(threads), self.threads) / max(self.threads, 1)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Fitted fixed overheads and achieved fractions of the roofline (see the module docstring).

    Attributes:
        prefill_overhead_s: fixed seconds per prefill forward pass.
        prefill_efficiency: achieved fraction of the probed FLOP/s in prefill.
        step_overhead_s: fixed seconds per decode step.
        decode_efficiency: achieved fraction of the probed FLOP/s in decode.
        ttft_overhead_s: templating, tokenisation and first sampling (``ttft_s - prefill_s``).
        step_row_overhead_s: seconds per decode step per batch row beyond the roofline (sampling, logits
            processing, the GEMV's shortfall from peak).
        kv_traffic: KV-cache bytes moved per cached token, row and decode step, in units of
            ``kv_bytes_per_token`` (1: read once).
        batched_step_overhead_s: extra seconds per decode step when the batch has more than one row (CPU):
            at one row every linear layer is a matrix-vector product (a GEMV kernel streaming the weights
            once); at two or more rows the BLAS library switches to GEMM kernels that pack the weight
            panels each call, a fixed cost per step that per-row terms cannot express (measured on this
            2-core EPYC: TPOT 107 ms at batch 1, 208 ms at batch 2, 246 ms at batch 8).
        calibrated: False for the uncalibrated defaults (pure roofline).
        calibration_s: wall seconds the calibration took.
        version: :data:`CALIBRATION_VERSION` of the fit (a cached calibration of another version is refitted).
        workloads: distinct calibration workloads (batch, prompt) the fit saw (the decode fit has
            :data:`DECODE_PARAMETERS` coefficients and needs at least two more).
        in_sample_ttft_error, in_sample_tpot_error: median ``|predicted / measured - 1|`` over the calibration runs
            with the fit that saw them (near 0 for an exact fit: not a measure of accuracy).
        loo_ttft_error, loo_tpot_error: the same, each workload predicted by a fit on the others
            (leave-one-workload-out): the error to quote.
        check: what :func:`check_calibration` did with a cached calibration today (``kept``, ``rescaled``,
            ``refit``, with the probe ratios); empty for a fresh fit.
    """

    prefill_overhead_s: float = 0.0
    prefill_efficiency: float = 1.0
    step_overhead_s: float = 0.0
    decode_efficiency: float = 1.0
    ttft_overhead_s: float = 0.0
    calibrated: bool = False
    calibration_s: float = 0.0
    step_row_overhead_s: float = 0.0
    kv_traffic: float = 1.0
    batched_step_overhead_s: float = 0.0
    version: int = 4
    workloads: int = 0
    in_sample_ttft_error: float = float("nan")
    in_sample_tpot_error: float = float("nan")
    loo_ttft_error: float = float("nan")
    loo_tpot_error: float = float("nan")
    check: str = ""


#: Bumped when the fitted model changes; cached calibrations of another version are ignored (4: six calibration
#: workloads, out-of-sample error).
CALIBRATION_VERSION = 4
#: Coefficients of the CPU decode fit (``o_d``, per-row, KV traffic, the batched-kernel switch).
DECODE_PARAMETERS = 4
#: A cached calibration whose device probe differs from today's by more than this share is rescaled or refitted.
RECALIBRATE_LIMIT = 0.15
#: Beyond this (|today / cached - 1| of bandwidth or FLOP/s) a loaded model is refitted; between
#: :data:`RECALIBRATE_LIMIT` and this the calibration is rescaled to today's probe (cheap, and within 15% of a
#: refit at 1.6x the FLOP/s: ``tests/test_roofline.py``). On the 2-core build VM the matmul FLOP/s of a fresh
#: process varies 112-189 GFLOP/s on a quiet machine, so a 15% refit rule refitted (~20 s) in most new processes.
REFIT_LIMIT = 0.5


# ----------------------------------------------------------------------------- the formulas


def prefill_terms(shape: ModelShape, batch_size: int, prompt_tokens: int) -> tuple[float, float]:
    """``(bytes, flops)`` of one prefill: weights read once plus the KV cache written; PaLM's FLOPs less half
    the attention products (a causal kernel, ``transformers``' default ``sdpa``, computes only the lower
    triangle of the ``L x L`` scores; PaLM's MFU count takes the full matrix) plus one LM-head row per sequence."""
    B, L = int(batch_size), int(prompt_tokens)
    nbytes = shape.weight_bytes + shape.kv_cache_bytes_per_token() * B * L
    flops = metrics.prefill_flops(shape.num_non_embedding_params, shape.num_layers, shape.attn_dim, L, B)
    causal_skip = 2.0 * shape.num_layers * L * L * shape.attn_dim * B
    return float(nbytes), float(flops - causal_skip + 2.0 * shape.head_params * B)


def decode_terms(shape: ModelShape, batch_size: int, context_tokens: float, kv_traffic: float = 1.0
                 ) -> tuple[float, float]:
    """``(bytes, flops)`` of one decode step at ``context_tokens`` cached tokens per row; the KV cache is read
    ``kv_traffic`` times (:class:`Calibration`)."""
    B, c = int(batch_size), float(context_tokens)
    nbytes = shape.weight_bytes + kv_traffic * shape.kv_cache_bytes_per_token() * B * c
    flops = B * (2.0 * (shape.num_non_embedding_params + shape.head_params) + 4.0 * shape.num_layers * c * shape.attn_dim)
    return float(nbytes), float(flops)


def _phase(mem_s: float, comp_s: float, overhead_s: float, overlap: bool) -> tuple[float, dict]:
    """Phase time and its split ``{overhead, memory, compute}`` (with overlap only the larger term counts)."""
    if overlap:
        split = {"overhead": overhead_s, "memory": mem_s if mem_s >= comp_s else 0.0,
                 "compute": comp_s if comp_s > mem_s else 0.0}
    else:
        split = {"overhead": overhead_s, "memory": mem_s, "compute": comp_s}
    return sum(split.values()), split


def predict(shape: ModelShape, device: Device, calib: Calibration, batch_size: int, prompt_tokens: int,
            output_tokens: int, threads: int | None = None) -> dict:
    """Predicted cost of one batch: ``batch_size`` requests of ``prompt_tokens``, ``output_tokens`` each.

    Returns:
        ``predicted_prefill_s``, ``predicted_ttft_s`` (``ttft_overhead + prefill``), ``predicted_tpot_s`` (a decode
        step at the mean context ``prompt + output / 2``: every term is linear in the context, so this is the
        mean step), ``predicted_e2e_s``, ``predicted_output_throughput_tps``
        (``batch x output / e2e``), ``predicted_kv_cache_bytes`` (at the end), ``predicted_peak_memory_bytes``
        (weights + KV + the prefill working set: activations, eager attention scores, logits; the runtime's
        own baseline is not included), ``bound`` (of the whole request), ``prefill_bound``, ``decode_bound``.
    """
    B, L, n = int(batch_size), int(prompt_tokens), max(int(output_tokens), 1)
    flops = device.flops_at(threads)
    bw = device.bandwidth_bytes_per_s
    pb, pf = prefill_terms(shape, B, L)
    prefill_s, psplit = _phase(pb / bw, pf / flops / calib.prefill_efficiency, calib.prefill_overhead_s, device.overlap)
    db, df = decode_terms(shape, B, L + n / 2, calib.kv_traffic)
    tpot_s, dsplit = _phase(db / bw, df / flops / calib.decode_efficiency,
                            calib.step_overhead_s + calib.step_row_overhead_s * B
                            + (calib.batched_step_overhead_s if B > 1 else 0.0), device.overlap)
    ttft = calib.ttft_overhead_s + prefill_s
    e2e = ttft + (n - 1) * tpot_s
    total = {k: psplit[k] + (n - 1) * dsplit[k] for k in BOUNDS}
    total["overhead"] += calib.ttft_overhead_s
    kv = shape.kv_cache_bytes_per_token() * B * (L + n)
    bpe = shape.bytes_per_element
    working = B * L * (4 * shape.hidden_size + 2 * shape.intermediate_size) * bpe \
        + B * shape.num_heads * L * L * bpe + B * shape.vocab_size * 4
    return {
        "predicted_prefill_s": prefill_s,
        "predicted_ttft_s": ttft,
        "predicted_tpot_s": tpot_s if n > 1 else float("nan"),
        "predicted_e2e_s": e2e,
        "predicted_output_throughput_tps": B * n / e2e if e2e > 0 else float("nan"),
        "predicted_kv_cache_bytes": int(kv),
        "predicted_peak_memory_bytes": int(shape.weight_bytes + kv + working),
        "bound": max(BOUNDS, key=lambda k: total[k]),
        "prefill_bound": max(BOUNDS, key=lambda k: psplit[k]),
        "decode_bound": max(BOUNDS, key=lambda k: dsplit[k]),
    }


# ----------------------------------------------------------------------------- calibration


def _fit(roof_mem: Sequence[float], roof_comp: Sequence[float], measured: Sequence[float], overlap: bool
         ) -> tuple[float, float]:
    """``(overhead_s, efficiency)`` minimising the squared error of ``o + combine(mem, comp / eta)``.

    ``eta`` on a log grid in [0.01, 2]; for each, ``o`` is the mean residual clamped at 0 (an overhead is never
    negative).
    """
    mem, comp, y = (np.asarray(v, dtype=float) for v in (roof_mem, roof_comp, measured))
    keep = np.isfinite(y)
    mem, comp, y = mem[keep], comp[keep], y[keep]
    if y.size == 0:
        return 0.0, 1.0
    if not overlap and comp.any():
        # y - mem = o + k comp is linear: least squares, then o >= 0 and k > 0 enforced
        X = np.column_stack([np.ones_like(comp), comp])
        (o, k), *_ = np.linalg.lstsq(X, y - mem, rcond=None)
        if o < 0:
            o, k = 0.0, float((comp * (y - mem)).sum() / (comp**2).sum())
        if k > 0:
            return float(o), float(min(1.0 / k, 2.0))
    best = (math.inf, 0.0, 1.0)
    for grid in (np.geomspace(0.01, 2.0, 200), None):
        if grid is None:  # refine around the coarse optimum
            grid = np.geomspace(best[2] / 1.05, min(best[2] * 1.05, 2.0), 200)
        for eta in grid:
            core = np.maximum(mem, comp / eta) if overlap else mem + comp / eta
            o = max(0.0, float(np.mean(y - core)))
            sse = float(((o + core - y) ** 2).sum())
            if sse < best[0]:
                best = (sse, o, float(eta))
    return best[1], best[2]


def fit_calibration(shape: ModelShape, device: Device, runs: pd.DataFrame) -> Calibration:
    """Fit a :class:`Calibration` from measured runs, with its in-sample and out-of-sample error.

    The out-of-sample error is leave-one-workload-out: each distinct (batch, prompt) workload is predicted by
    a fit on the others, and the median ``|predicted / measured - 1|`` over those held-out runs is the error to
    quote (with four workloads for the decode fit's four coefficients the fit is exact and its in-sample error
    near 0 says nothing; :data:`CALIBRATION_RUNS` has six).

    Args:
        runs: one row per measured request with ``batch_size``, ``prompt_tokens``, ``output_tokens``,
            ``prefill_s``, ``ttft_s``, ``tpot_s``.
    """
    calib = _fit_calibration(shape, device, runs)
    keys = list(zip(runs["batch_size"], runs["prompt_tokens"])) if len(runs) else []
    workloads = list(dict.fromkeys(keys))
    ttft_in, tpot_in = _errors(shape, device, calib, runs)
    held_ttft, held_tpot = [], []
    if len(workloads) > 1:
        for w in workloads:
            out = np.array([k == w for k in keys])
            fit = _fit_calibration(shape, device, runs[~out])
            t, p = _errors(shape, device, fit, runs[out], median=False)
            held_ttft += t
            held_tpot += p
    med = (lambda v: float(np.median(v)) if len(v) else float("nan"))
    return dataclasses.replace(calib, workloads=len(workloads), in_sample_ttft_error=ttft_in,
                               in_sample_tpot_error=tpot_in, loo_ttft_error=med(held_ttft),
                               loo_tpot_error=med(held_tpot))


def _errors(shape: ModelShape, device: Device, calib: Calibration, runs: pd.DataFrame, median: bool = True):
    """``|predicted / measured - 1|`` of TTFT and TPOT over ``runs`` (their medians, or the lists)."""
    ttft, tpot = [], []
    for r in runs.itertuples():
        p = predict(shape, device, calib, r.batch_size, r.prompt_tokens, r.output_tokens)
        for out, m, q in ((ttft, r.ttft_s, p["predicted_ttft_s"]), (tpot, r.tpot_s, p["predicted_tpot_s"])):
            if m and m > 0 and math.isfinite(m) and math.isfinite(q):
                out.append(abs(q / m - 1))
    if not median:
        return ttft, tpot
    return (float(np.median(ttft)) if ttft else float("nan")), (float(np.median(tpot)) if tpot else float("nan"))


def _fit_calibration(shape: ModelShape, device: Device, runs: pd.DataFrame) -> Calibration:
    """The fit itself (see :func:`fit_calibration`)."""
    bw, fl = device.bandwidth_bytes_per_s, device.flops_per_s
    pre = [prefill_terms(shape, r.batch_size, r.prompt_tokens) for r in runs.itertuples()]
    po, pe = _fit([b / bw for b, _ in pre], [f / fl for _, f in pre], runs["prefill_s"], device.overlap)
    tt = float(np.nanmedian(runs["ttft_s"] - runs["prefill_s"])) if len(runs) else 0.0
    ctx = [r.prompt_tokens + r.output_tokens / 2 for r in runs.itertuples()]
    if device.overlap:
        dec = [decode_terms(shape, r.batch_size, c) for r, c in zip(runs.itertuples(), ctx)]
        do, de = _fit([b / bw for b, _ in dec], [f / fl for _, f in dec], runs["tpot_s"], True)
        return Calibration(po, pe, do, de, max(tt, 0.0), True)
    # CPU: tpot - weights/bw - compute/(eta_p F) = o + r B + m kv_bytes/bw, non-negative least squares
    weights_s = shape.weight_bytes / bw
    comp_s = np.array([decode_terms(shape, r.batch_size, c)[1] / fl / pe for r, c in zip(runs.itertuples(), ctx)])
    kv_s = np.array([shape.kv_cache_bytes_per_token() * r.batch_size * c / bw for r, c in zip(runs.itertuples(), ctx)])
    y = np.asarray(runs["tpot_s"], dtype=float) - weights_s - comp_s
    keep = np.isfinite(y)
    if not keep.any():
        return Calibration(po, pe, 0.0, pe, max(tt, 0.0), True)
    batch = np.asarray(runs["batch_size"], dtype=float)
    X = np.column_stack([np.ones(len(y)), batch, kv_s, (batch > 1).astype(float)])[keep]
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)  # nnls on unit-scaled columns (seconds vs bytes/bw)
    from scipy.optimize import nnls

    coef = nnls(X / scale, y[keep])[0] / scale
    return Calibration(po, pe, float(coef[0]), pe, max(tt, 0.0), True, step_row_overhead_s=float(coef[1]),
                       kv_traffic=float(coef[2]), batched_step_overhead_s=float(coef[3]))


#: The calibration workload: (batch, prompt tokens); a short batch-1 prompt pins the fixed overheads, a long
#: batch-1 prompt the prefill compute slope and the KV traffic (context), a short batch of 2 the GEMV -> GEMM
#: switch (``batched_step_overhead_s``), a batch of 8 the per-row cost (the
#: default CPU suite's batches 1-16 are then inter- or mildly extrapolated); a pair of batch 1 and 2 at 64 tokens
#: makes six workloads, two more than the decode fit's four coefficients, so the fit is not exact and each workload
#: can be held out (:func:`fit_calibration`); of the pairs tried on synthetic data with 3% noise, a same-context
#: batch 1/2 pair pinned the kernel-switch term best. 8 new tokens each, one warm-up and two timed repeats: ~25 s
#: on 2 quiet CPU cores (float32, SmolLM2-135M).
CALIBRATION_RUNS = ((1, 32), (1, 384), (2, 32), (8, 96), (1, 64), (2, 64))
#: Half the tokens, same levers: for a dtype the CPU runs without native units (bfloat16 without AVX512-BF16/AMX
#: is ~2-3x slower than float32), so its calibration also stays under ~40 s (with ``repeats=1``).
CALIBRATION_RUNS_SMALL = ((1, 32), (1, 192), (2, 32), (4, 64), (1, 64), (2, 64))
CALIBRATION_NEW_TOKENS = 8


def cache_path(model_path: str, device: str, dtype: str, threads: int) -> Path:
    """Where the calibration of this (model folder, device, dtype, threads) is cached."""
    import hashlib

    from workbench.measure.models import cache_root

    key = hashlib.sha256(f"{Path(model_path).resolve()}|{device}|{dtype}|{threads}".encode()).hexdigest()[:16]
    return cache_root() / "roofline" / f"{key}.json"


def calibrate(loaded, repeats: int = 2, save: bool = True, trials: int = 7,
              runs: Sequence[tuple[int, int]] = CALIBRATION_RUNS) -> tuple[Device, Calibration]:
    """Probe the device (``trials`` per figure) and fit the overheads on the loaded model (``runs``: (batch,
    prompt tokens), ``repeats`` timed runs each), in ~20 s for float32 on 2 CPU cores (a dtype the CPU has no
    native units for, e.g. bfloat16 without AVX512-BF16/AMX, is slower: use :data:`CALIBRATION_RUNS_SMALL`,
    ``repeats=1, trials=3``).

    Returns:
        ``(device, calibration)``; saved to :func:`cache_path` when ``save`` (read back by :func:`load_cached`).
    """
    import torch

    from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
    from workbench.inputs.prompts import build_batch

    t0 = time.perf_counter()
    info = loaded.info
    dev = Device.probe(info.device.split(":")[0] if info.device.startswith("cpu") else info.device, info.dtype,
                       trials)
    shape = shape_of(info)
    settings = GenerationSettings(max_new_tokens=CALIBRATION_NEW_TOKENS, ignore_eos=True)
    rows = []
    for B, L in runs:
        prompts = build_batch(loaded.tokenizer, B, L)
        warm_up(loaded, prompts, settings, 1)
        for _ in range(repeats):
            rec = generate_measured(loaded, prompts, settings).records[0]
            rows.append({"batch_size": B, "prompt_tokens": rec["prompt_tokens"], "output_tokens": rec["output_tokens"],
                         "prefill_s": rec["prefill_s"], "ttft_s": rec["ttft_s"], "tpot_s": rec["tpot_s"]})
    calib = dataclasses.replace(fit_calibration(shape, dev, pd.DataFrame(rows)),
                                calibration_s=time.perf_counter() - t0)
    if save:
        from workbench.measure.models import write_cache_text

        path = cache_path(info.path, dev.name, info.dtype, torch.get_num_threads())
        write_cache_text(path, json.dumps({"device": dataclasses.asdict(dev), "calibration": dataclasses.asdict(calib),
                                           "runs": rows}, indent=1))
        _CHECKED[_checked_key(info.path, dev.name, info.dtype, torch.get_num_threads())] = (dev, calib)
    return dev, calib


def load_cached(model_path: str, device: str, dtype: str, threads: int) -> tuple[Device, Calibration] | None:
    """A saved calibration of this (model folder, device, dtype, threads), or None."""
    path = cache_path(model_path, device, dtype, threads)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data["calibration"].get("version") != CALIBRATION_VERSION:
        return None  # fitted by an older model: refit
    return Device(**data["device"]), Calibration(**data["calibration"])


def check_calibration(cached: tuple[Device, Calibration], today: Device, loaded=None,
                      limit: float = RECALIBRATE_LIMIT, **calibrate_kwargs) -> tuple[Device, Calibration]:
    """Check a cached calibration against today's device probe, and rescale or refit it when the machine moved.

    A calibration fitted on a slower day over-predicts a faster one by 30-60% (overheads and achieved
    FLOP/s are the day's). When today's bandwidth or matmul FLOP/s differs from the cached probe's by more
    than ``limit``: beyond :data:`REFIT_LIMIT` and with ``loaded`` the calibration is refitted (:func:`calibrate`,
    cached again); otherwise (or without a model) it is rescaled: today's probe replaces the cached one and every fixed overhead (seconds of CPU work:
    Python, dispatch, sampling) scales by ``cached FLOP/s / today's FLOP/s``. ``Calibration.check`` records
    which happened (``kept``, ``rescaled``, ``refit``) with the probe ratios.

    Args:
        cached: ``(device, calibration)`` of :func:`load_cached`.
        today: a fresh :meth:`Device.probe` in the same dtype.
        loaded: the model, to refit (None: rescale).
        calibrate_kwargs: passed to :func:`calibrate` when refitting.

    Returns:
        ``(device, calibration)`` to predict with.
    """
    dev, calib = cached
    bw = today.bandwidth_bytes_per_s / dev.bandwidth_bytes_per_s if dev.bandwidth_bytes_per_s else float("nan")
    fl = today.flops_per_s / dev.flops_per_s if dev.flops_per_s else float("nan")
    ratios = f"today's probe / cached: bandwidth {bw:.2f}x, FLOP/s {fl:.2f}x"
    if all(math.isfinite(x) and abs(x - 1) <= limit for x in (bw, fl)):
        return dev, dataclasses.replace(calib, check=f"kept ({ratios}, within {limit:.0%})")
    if loaded is not None and not all(math.isfinite(x) and abs(x - 1) <= REFIT_LIMIT for x in (bw, fl)):
        new_dev, new = calibrate(loaded, **calibrate_kwargs)
        note = f"refit ({ratios}, beyond {limit:.0%})"
        print(f"roofline: cached calibration {note}", file=sys.stderr)
        return new_dev, dataclasses.replace(new, check=note)
    k = 1.0 / fl if math.isfinite(fl) and fl > 0 else 1.0
    scaled = dataclasses.replace(
        calib, prefill_overhead_s=calib.prefill_overhead_s * k, step_overhead_s=calib.step_overhead_s * k,
        ttft_overhead_s=calib.ttft_overhead_s * k, step_row_overhead_s=calib.step_row_overhead_s * k,
        batched_step_overhead_s=calib.batched_step_overhead_s * k,
        check=f"rescaled ({ratios}, beyond {limit:.0%}; overheads x{k:.2f}, today's probe)")
    print(f"roofline: cached calibration {scaled.check}", file=sys.stderr)
    return dataclasses.replace(today, threads=dev.threads, overlap=dev.overlap, name=dev.name), scaled


#: (calibration file, its mtime) -> the ``(device, calibration)`` checked (or fitted) in this process. A
#: run's notebooks share one kernel, so the check - a probe, and a ~20 s refit when the machine moved - is paid
#: once per run; without it each notebook compared the 3-trial probe with the refit's own 7-trial probe and, on a
#: noisy day, refitted again (two refits in notebooks 01-02 of one quick run).
_CHECKED: dict = {}


def _checked_key(model_path, device: str, dtype: str, threads: int) -> tuple:
    """The calibration file and its modification time: a file written since (another process, a test's own
    cache folder) is checked afresh."""
    path = cache_path(model_path, device, dtype, int(threads))
    try:
        return str(path), path.stat().st_mtime_ns
    except OSError:
        return str(path), None


def checked_cached(model_path: str, device: str, dtype: str, threads: int, loaded=None,
                   **calibrate_kwargs) -> tuple[Device, Calibration] | None:
    """:func:`load_cached` checked against today's probe of the device (:func:`check_calibration`): the process's
    one :func:`workbench.measure.device.probe_device` (7 trials, ~1 s), the same the run's environment record takes, or
    None when nothing is cached.

    Once per process: a later call for the same model, device, dtype and threads returns the first one's result
    (or the calibration :func:`calibrate` fitted since). When today's probe is itself noisy (its trials spread
    beyond :data:`workbench.measure.device.PROBE_SPREAD_LIMIT`: other load), a moved machine is rescaled, not refitted:
    a refit measured under that load would be cached and mislead later runs.
    """
    key = _checked_key(model_path, device, dtype, threads)
    if key in _CHECKED:
        return _CHECKED[key]
    cached = load_cached(model_path, device, dtype, threads)
    if cached is None:
        return None
    today = Device.probe(device, dtype)
    noisy = bool(getattr(today, "noisy", False))
    out = check_calibration(cached, today, None if noisy else loaded, **calibrate_kwargs)
    if noisy and loaded is not None and out[1].check.startswith("rescaled"):
        out = out[0], dataclasses.replace(out[1], check=out[1].check + "; today's probe noisy: not refitted")
    _CHECKED[key] = out
    return out


def shape_of(info) -> ModelShape:
    """A :class:`ModelShape` from a loaded model's :class:`workbench.measure.models.ModelInfo`."""
    from workbench.measure import models

    cfg = models.read_model_config(info.path)
    base = ModelShape.from_config(cfg, info.dtype if info.dtype in BYTES_PER_ELEMENT else "float32")
    return dataclasses.replace(base, num_params=int(info.num_params),
                               num_non_embedding_params=int(info.num_non_embedding_params))


# ----------------------------------------------------------------------------- the planner


@dataclasses.dataclass
class Predictor:
    """Predictions for one model on this machine: the shape, the probed device and a calibration (of
    ``shape.dtype``); other dtypes through :meth:`for_dtype`.

    Attributes:
        model_path: the model folder, to find other dtypes' cached calibrations (None: none looked up).
    """

    shape: ModelShape
    device: Device
    calib: Calibration
    probe: bool = True
    model_path: str | None = None
    _devices: dict = dataclasses.field(default_factory=dict)

    def add(self, dtype: str, device: Device, calib: Calibration) -> None:
        """Use this probe and calibration for ``dtype`` points (e.g. a fresh :func:`calibrate` in that dtype)."""
        self._devices[dtype] = (device, calib)

    def for_dtype(self, dtype: str | None) -> tuple[ModelShape, Device, Calibration]:
        """``(shape, device, calibration)`` for ``dtype`` points: the dtype's own cached calibration when there
        is one (:func:`load_cached`), else its probed matmul FLOP/s (2 trials, so ``plan`` stays quick) with the
        base calibration's overheads and the base probe's bandwidth."""
        if not dtype or dtype in ("auto", self.shape.dtype):
            return self.shape, self.device, self.calib
        if dtype not in self._devices:
            cached = load_cached(self.model_path, self.device.name, dtype, _threads()) if self.model_path else None
            if cached is not None and self.probe:
                cached = check_calibration(cached, Device.probe(self.device.name, dtype, trials=2))
            if cached is None:
                dev = self.device
                p = Device.probe(dev.name, dtype, trials=2) if self.probe else dataclasses.replace(dev, dtype=dtype)
                cached = (dataclasses.replace(p, bandwidth_bytes_per_s=dev.bandwidth_bytes_per_s, threads=dev.threads),
                          self.calib)
            self._devices[dtype] = cached
        dev, calib = self._devices[dtype]
        return self.shape.with_dtype(dtype), dev, calib

    def calibrated_dtype(self, dtype: str | None) -> str | None:
        """The dtype whose calibration ``dtype`` points use (None: uncalibrated pure roofline)."""
        _, dev, calib = self.for_dtype(dtype)
        if not calib.calibrated:
            return None
        return self.shape.dtype if calib is self.calib else dtype

    def predict(self, batch_size: int, prompt_tokens: int, output_tokens: int, dtype: str | None = None,
                threads: int | None = None) -> dict:
        """:func:`predict` for a point in ``dtype`` (default: the base dtype), see :meth:`for_dtype`."""
        shape, dev, calib = self.for_dtype(dtype)
        return predict(shape, dev, calib, batch_size, prompt_tokens, output_tokens, threads)

    @classmethod
    def for_model(cls, spec: str = "default", device: str = "cpu", dtype: str = "float32",
                  probe: bool = True) -> "Predictor":
        """Config-only predictor (no weights load): the cached calibration when there is one, else the pure
        roofline on a fresh probe (``probe=False``: nominal 10 GB/s and 50 GFLOP/s, for tests)."""
        import torch

        from workbench.measure import models

        dtype = "float32" if dtype == "auto" and device == "cpu" else dtype
        dtype = "bfloat16" if dtype == "auto" else dtype
        shape = ModelShape.from_model(spec, dtype)
        path = str(models.resolve_model_path(spec))
        cached = load_cached(path, device, dtype, torch.get_num_threads())
        if cached is not None and probe:
            cached = check_calibration(cached, Device.probe(device, dtype))
        if cached is not None:
            return cls(shape, *cached, probe=probe, model_path=path)
        dev = Device.probe(device, dtype) if probe else Device(10e9, 50e9, torch.get_num_threads(),
                                                                overlap=device != "cpu", name=device, dtype=dtype)
        return cls(shape, dev, Calibration(), probe=probe, model_path=path)


def _threads() -> int:
    import torch

    return torch.get_num_threads()
