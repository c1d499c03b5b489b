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
- **Calibration** (:func:`workbench.predict.roofline_calibration.calibrate`, seconds, once per machine): a few
  measured prefills and decode steps fit a fixed per-call overhead ``o`` per phase (kernel launches, Python, the
  ``generate`` loop) and the achieved fraction ``eta`` of the probed matmul FLOP/s (prefill); the probed copy
  bandwidth is taken as achievable. Prefill: ``o_p + combine(memory_s, compute_s / eta_p)``. Decode on a CPU (no
  overlap), one non-negative least-squares fit over the calibration runs of ``tpot - weight_bytes / bandwidth -
  compute_s / eta_p = o_d + step_row_overhead_s x B + kv_traffic x kv_bytes / bandwidth + batched_step_overhead_s x
  [B > 1]`` (the matmuls run at the prefill's efficiency; what rows add beyond it is the per-row term; the last term
  is the BLAS library's switch from matrix-vector to packed matrix-matrix kernels once a step has two rows). On an
  accelerator (overlap) decode fits ``o_d`` and ``eta_d`` of ``o_d + max(memory_s, compute_s / eta_d)``. TTFT adds
  the measured templating, tokenisation and first-sampling time (``ttft_s - prefill_s`` of the calibration runs).
  The calibration runs span batch 1, 2 and 8 and short and long contexts, so each fitted term has its own lever
  (overheads: short batch-1 runs; the kernel switch: batch 2; per-row cost: batch 8; KV traffic: the context).
- **Bound** of a point: the largest of its overhead, memory and compute seconds over the whole request.
- **Its error, out of sample.** The decode fit has four coefficients; the calibration runs six workloads, so the fit
  is not exact, and :func:`workbench.predict.roofline_calibration.fit_calibration` quotes the leave-one-workload-out
  error (each workload predicted by a fit on the others) beside the in-sample one (``Calibration.loo_*_error``).
- **A cached calibration is checked** against today's device probe
  (:func:`workbench.predict.roofline_calibration.check_calibration`): a calibration from a slower day over-predicts
  a faster one by 30-60%, so when bandwidth or FLOP/s moved by more than 15% it is refitted (model loaded) or
  rescaled (overheads by the FLOP/s ratio, today's probe); ``Calibration.check`` records which.

Inputs come from the model's ``config.json`` only (:class:`ModelShape`: parameter counts computed from the config,
no weights load) and from :func:`workbench.measure.device.probe_device` (bandwidth, FLOP/s). A calibration is cached
per (model, device, dtype, threads) in ``<cache>/roofline/`` so ``workbench plan`` can use it without loading the
model. Each dtype has its own probe (matmul FLOP/s differ: bfloat16 on a CPU without native bf16 units is slower
than float32) and its own calibration (:meth:`workbench.predict.roofline_calibration.Predictor.for_dtype`); a dtype
not calibrated yet borrows the overheads of the calibrated one with its own probed FLOP/s (``calibrated_dtype`` says
which).

Assumptions stated where they bite: FLOP/s scale with ``torch_threads / probe threads``; bandwidth is taken as
saturated by any thread count; engine choices (attention kernel, static cache, compilation) do not enter the
prediction, so their effect shows as the residual ``measured / predicted``.
"""

from __future__ import annotations

import dataclasses
import math

from workbench.errors import ParameterError
from workbench.measure.device import probe_device
from workbench.stats import metrics

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
            panels each call, a fixed cost per step that per-row terms cannot express (the TPOTs that showed it:
            results/LOG.md, 2026-12-06).
        calibrated: False for the uncalibrated defaults (pure roofline).
        calibration_s: wall seconds the calibration took.
        version: :data:`CALIBRATION_VERSION` of the fit (a cached calibration of another version is refitted).
        workloads: distinct calibration workloads (batch, prompt) the fit saw (the decode fit has
            :data:`DECODE_PARAMETERS` coefficients and needs at least two more).
        in_sample_ttft_error, in_sample_tpot_error: median ``|predicted / measured - 1|`` over the calibration runs
            with the fit that saw them (near 0 for an exact fit: not a measure of accuracy).
        loo_ttft_error, loo_tpot_error: the same, each workload predicted by a fit on the others
            (leave-one-workload-out): the error to quote.
        check: what :func:`workbench.predict.roofline_calibration.check_calibration` did with a cached calibration
            today (``kept``, ``rescaled``, ``refit``, with the probe ratios); empty for a fresh fit.
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
#: refit at 1.6x the FLOP/s: ``tests/predict/test_roofline_calibration.py``). A fresh process's matmul FLOP/s varies by more than 15%
#: on a quiet CPU (results/LOG.md, 2026-12-06), so a 15% refit rule refitted in most new processes.
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


def phase_time(mem_s: float, comp_s: float, overhead_s: float, overlap: bool) -> tuple[float, dict]:
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
    prefill_s, psplit = phase_time(pb / bw, pf / flops / calib.prefill_efficiency, calib.prefill_overhead_s, device.overlap)
    db, df = decode_terms(shape, B, L + n / 2, calib.kv_traffic)
    tpot_s, dsplit = phase_time(db / bw, df / flops / calib.decode_efficiency,
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
