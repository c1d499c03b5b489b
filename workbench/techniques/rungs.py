"""The speed ladder's rungs: weight quantization (torchao), head handling, static cache + ``torch.compile``,
bfloat16 and threads, built on a loaded model and measured with compile time kept apart.

A rung (:class:`Rung`) is one configuration of the same model. :func:`build` applies its quantization to a
copy of a loaded model and says what it did (:class:`Built`: the layers quantized, the layers left in float
and why); :func:`generate_kwargs` turns its cache and compile choice into ``generate`` keywords;
:func:`workbench.run.rung_timing.measure` times it, with the first compiled call timed apart as ``compile_s`` and
never mixed into the timed repeats, and counts graphs compiled after that call (``recompiles``, 0 expected).

Quantization schemes (``quantization``; docs/design.md section 10's names):

- ``none``: the model as loaded (its dtype).
- ``int8_weight_only``: torchao ``Int8WeightOnlyConfig`` (per-channel symmetric int8 weights, activations
  in float; Jacob et al. 2018's affine scheme without activation quantization).
- ``int4_weight_only``: torchao groupwise asymmetric int4 weights (tinygemm layout): on CPU
  ``PrototypeInt4WeightOnlyConfig`` (``_weight_int4pack_mm_for_cpu``), on CUDA ``Int4WeightOnlyConfig``
  (``tile_packed_to_4d``, bfloat16). ``group_size`` must divide every quantized layer's input width;
  torchao itself skips a layer it cannot take with a log line, so :func:`build` checks first and refuses,
  naming the layers and the group sizes that fit (:func:`check_group_size`).
- ``int8_dynamic``: ``torch.ao.quantization.quantize_dynamic`` (deprecated; int8 weights and per-call int8
  activations), kept only as a labelled reference for notebook 12's earlier figures.

``lm_head``: ``float`` keeps the output head in float (the usual choice: the head of a small model is a large
share of its weights and its rounding moves every logit), ``quantize`` quantizes it too. The input embedding
always stays float: a decode step reads one row of it, so quantizing it saves no bandwidth.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path

from workbench import checks
from workbench.errors import ParameterError

QUANTIZATIONS = ("none", "int8_weight_only", "int4_weight_only", "int8_dynamic")
LM_HEAD = ("float", "quantize")
GROUP_SIZES = (32, 64, 128, 256)
CACHE_IMPLEMENTATIONS = ("dynamic", "static")


@dataclasses.dataclass(frozen=True)
class Rung:
    """One rung of the ladder, validated where built.

    Attributes:
        quantization: one of :data:`QUANTIZATIONS`.
        group_size: int4 weights per scale group (one of :data:`GROUP_SIZES`; ignored by the other schemes).
        lm_head: ``float`` (kept in float) or ``quantize``.
        cache_implementation: ``dynamic`` or ``static`` KV cache.
        compile: ``torch.compile`` the decode forward (needs the static cache's fixed shapes).
        threads: torch intra-op threads (None: the process's setting).
    """

    quantization: str = "none"
    group_size: int = 64
    lm_head: str = "float"
    cache_implementation: str = "dynamic"
    compile: bool = False
    threads: int | None = None

    def __post_init__(self):
        checks.check_choice("quantization", self.quantization, QUANTIZATIONS)
        checks.check_choice("group_size", self.group_size, GROUP_SIZES)
        checks.check_choice("lm_head", self.lm_head, LM_HEAD)
        checks.check_choice("cache_implementation", self.cache_implementation, CACHE_IMPLEMENTATIONS)
        checks.check_bool("compile", self.compile)
        if self.compile and self.cache_implementation != "static":
            raise ParameterError("compile: torch.compile needs cache_implementation 'static' (fixed shapes)")
        if self.threads is not None:
            checks.check_int("threads", self.threads, 1)

    def name(self) -> str:
        """``int4_weight_only/g64+head/static+compile/2t``-style short name."""
        q = self.quantization + (f"/g{self.group_size}" if self.quantization == "int4_weight_only" else "")
        q += "+head" if self.lm_head == "quantize" and self.quantization != "none" else ""
        c = self.cache_implementation + ("+compile" if self.compile else "")
        return f"{q}/{c}" + (f"/{self.threads}t" if self.threads else "")


@dataclasses.dataclass
class Built:
    """A rung's model and what building it did.

    Attributes:
        loaded: :class:`workbench.measure.models.LoadedModel` (a copy when quantized; ``info.weight_bytes`` is what a
            decode step reads: quantized weights, scales and zero points, float parameters but the embedding).
        rung: the :class:`Rung`.
        quantized_layers: names of the ``Linear`` layers quantized.
        skipped_layers: ``{name: reason}`` of the ``Linear`` layers left in float.
    """

    loaded: object
    rung: Rung
    quantized_layers: list
    skipped_layers: dict

    def columns(self) -> dict:
        """Row columns: ``quantization``, ``group_size`` (NaN unless int4), ``lm_head``, ``quantized_layers``
        and ``skipped_layers`` (counts), ``weight_bytes``."""
        return {"quantization": self.rung.quantization, "lm_head": self.rung.lm_head,
                "group_size": self.rung.group_size if self.rung.quantization == "int4_weight_only" else float("nan"),
                "quantized_layers": len(self.quantized_layers), "skipped_layers": len(self.skipped_layers),
                "weight_bytes": self.loaded.info.weight_bytes}


# ----------------------------------------------------------------------------- checks before loading


def check_device(quantization: str, device: str) -> None:
    """Refuse a scheme with no kernel on ``device`` (one line, before any model loads).

    Raises:
        ParameterError: ``int8_dynamic`` off the CPU, a torchao scheme on MPS, or torchao missing.
    """
    checks.check_choice("quantization", quantization, QUANTIZATIONS)
    if quantization == "int8_dynamic" and device != "cpu":
        raise ParameterError(f"quantization: 'int8_dynamic' uses torch's CPU kernels; device must be cpu (got {device})")
    if quantization in ("int8_weight_only", "int4_weight_only"):
        if device == "mps":
            raise ParameterError(f"quantization: {quantization!r} has no torchao kernel on mps; use cpu or cuda")
        import importlib.util

        if importlib.util.find_spec("torchao") is None:
            raise ParameterError(f"quantization: {quantization!r} needs torchao (pip install torchao==0.18.0)")


def linear_in_features(config: dict) -> dict[str, int]:
    """Input widths of a decoder's ``Linear`` layer kinds from its ``config.json`` (Llama / Qwen / Mistral
    layout): ``q/k/v/gate/up_proj`` and ``lm_head`` read ``hidden_size``, ``o_proj`` reads ``heads x
    head_dim``, ``down_proj`` reads ``intermediate_size``."""
    hidden = int(config["hidden_size"])
    heads = int(config.get("num_attention_heads") or 1)
    head_dim = int(config.get("head_dim") or hidden // heads)
    out = {k: hidden for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")}
    out["o_proj"] = heads * head_dim
    if config.get("intermediate_size"):
        out["down_proj"] = int(config["intermediate_size"])
    return out


def model_widths(spec: str) -> dict[str, int] | None:
    """:func:`linear_in_features` of a model spec read without loading weights (``config:PATH`` included);
    None when the config is not on disk yet (the embedded default before its first conversion: :func:`build`
    checks the loaded layers then)."""
    import json

    from workbench import paths
    from workbench.measure import models

    try:
        if spec.startswith("config:"):
            from workbench.measure.config_models import read_config

            return linear_in_features(read_config(spec))
        if spec == models.DEFAULT_MODEL:
            found = list((paths.cache_root() / "models").glob(f"{models.DEFAULT_MODEL_NAME}-*/config.json"))
            return linear_in_features(json.loads(found[0].read_text())) if found else None
        return linear_in_features(models.read_model_config(spec))
    except (OSError, KeyError, ValueError, ParameterError):
        return None


def fitting_group_sizes(widths) -> list[int]:
    """The group sizes of :data:`GROUP_SIZES` that divide every width."""
    return [g for g in GROUP_SIZES if all(w % g == 0 for w in widths)]


def check_group_size(group_size: int, widths: dict[str, int], lm_head: str = "float") -> None:
    """Refuse an int4 group size that does not divide the input width of every layer it would quantize.

    Args:
        group_size: weights per group.
        widths: ``{layer kind or name: input width}`` (:func:`linear_in_features` or a loaded model's layers).
        lm_head: ``float`` leaves ``lm_head`` out of the check.

    Raises:
        ParameterError: naming the layers that cannot take it and the group sizes that fit all of them.
    """
    widths = {k: w for k, w in widths.items() if lm_head == "quantize" or not k.endswith("lm_head")}
    bad = sorted(k for k, w in widths.items() if w % group_size)
    if bad:
        shown = ", ".join(f"{k} ({widths[k]})" for k in bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
        fit = fitting_group_sizes(widths.values())
        raise ParameterError(f"group_size: {group_size} does not divide the input width of {shown}; int4 would leave "
                             f"them in float. Sizes that fit every layer: {', '.join(map(str, fit)) or 'none'}")


def on_int4_grid(weight, group_size: int, levels: int = 16, tol: float = 1e-3) -> bool:
    """Whether a float weight already lies on an asymmetric int4 grid of ``group_size`` weights per group, so that
    int4 quantization at that group size reproduces it (up to float rounding) and costs no quality.

    That is the case for a model loaded from a GGUF file of 4-bit blocks: ``Q4_1`` stores 32 weights per block as
    ``d * q + m`` with ``q`` in 0..15 (ggml's ``block_q4_1``, ggml-common.h), the grid torchao's asymmetric int4
    at group 32 quantizes onto (minimum and maximum per group); the default model is such a file, so its int4
    group-32 rung measures the kernels' speed with the quality of float.

    Args:
        weight: ``(out_features, in_features)`` float tensor; ``in_features`` divisible by ``group_size``.
        group_size: weights per group.
        levels: grid levels (16 for 4 bits).
        tol: tolerance in grid steps (float rounding of ``d * q + m``).

    Returns:
        True when every weight is within ``tol`` steps of its group's grid.
    """
    import torch

    w = weight.detach().float().reshape(weight.shape[0], -1, group_size)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    step = ((hi - lo) / (levels - 1)).clamp_min(torch.finfo(torch.float32).tiny)
    q = (w - lo) / step
    return bool(((q - q.round()).abs() <= tol).all())


def grid_note(loaded, rung: "Rung") -> str:
    """A sentence for an int4 rung whose model already lies on its grid (:func:`on_int4_grid`, checked on every
    decoder ``Linear`` the rung quantizes by default), else ``""``."""
    if rung.quantization != "int4_weight_only":
        return ""
    head = loaded.model.get_output_embeddings()
    lin = [m for m in _linears(loaded.model).values() if m is not head]
    if lin and all(m.in_features % rung.group_size == 0 and on_int4_grid(m.weight, rung.group_size) for m in lin):
        return (f"the model's weights already lie on an int4 grid of {rung.group_size} (a 4-bit GGUF such as Q4_1, "
                f"dequantized on load): this rung loses no quality, and measures the int4 kernels' speed alone")
    return ""


# ----------------------------------------------------------------------------- hardware


def bf16_support(device: str = "cpu") -> tuple[bool, str]:
    """Whether ``device`` computes bfloat16 natively, with the evidence: on x86 CPUs the ``avx512_bf16`` or
    ``amx_bf16`` flag (without them torch emulates bfloat16 through float32 conversions), on ARM ``bf16``;
    on CUDA ``torch.cuda.is_bf16_supported()``."""
    if device == "cuda":
        import torch

        ok = torch.cuda.is_bf16_supported()
        return ok, "CUDA device supports bfloat16" if ok else "this CUDA device lacks bfloat16"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False, "CPU flags unreadable (/proc/cpuinfo); bfloat16 support unknown"
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
            break
    native = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    if native:
        return True, f"native bfloat16 on this CPU ({', '.join(native)})"
    return False, "no native bfloat16 on this CPU (no avx512_bf16 / amx_bf16): torch emulates it via float32"


# ----------------------------------------------------------------------------- building


def _tensor_bytes(t) -> int:
    """Bytes a tensor holds; a torchao tensor subclass counts its inner tensors (data, scales, zero points)."""
    if hasattr(t, "__tensor_flatten__") and type(t).__name__ not in ("Tensor", "Parameter"):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def step_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter once (quantized data, scales and zero points
    counted), the input embedding excluded unless it is also the output head (tied); a dynamically quantized
    ``torch.ao`` model goes to :func:`workbench.techniques.speed.quantized_weight_bytes`."""
    import torch

    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules()):
        from workbench.techniques.speed import quantized_weight_bytes

        tied_float_head = (isinstance(head, torch.nn.Linear) and emb is not None
                           and any(p is head.weight for p in emb.parameters()))
        return quantized_weight_bytes(model) + (_tensor_bytes(head.weight) if tied_float_head else 0)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    skip = {id(p) for p in emb.parameters() if id(p) not in head_ids} if emb is not None else set()
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in skip or id(p) in seen:
            continue
        seen.add(id(p))
        total += _tensor_bytes(p)
    return total


def _linears(model) -> dict:
    import torch

    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def build(loaded, rung: Rung) -> Built:
    """Apply a rung's quantization to a copy of ``loaded`` (``none``: ``loaded`` itself, untouched).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel` in the rung's dtype (float32 for ``int8_dynamic``).
        rung: :class:`Rung`.

    Returns:
        :class:`Built`; under a quantization every ``Linear`` is either in ``quantized_layers`` or in
        ``skipped_layers`` with its reason (``lm_head kept float``), never silently left in float (``none``:
        both empty).

    Raises:
        ParameterError: a group size some layer cannot take (:func:`check_group_size`), ``int8_dynamic`` on
            a non-float32 model, or a scheme with no kernel on the model's device.
    """
    import torch

    device = str(loaded.info.device).split(":")[0]
    check_device(rung.quantization, device)
    lin = _linears(loaded.model)
    head = loaded.model.get_output_embeddings()
    head_names = {n for n, m in lin.items() if m is head}
    if rung.quantization == "none":
        return Built(loaded, rung, [], {})
    targets = {n for n in lin if rung.lm_head == "quantize" or n not in head_names}
    skipped = {n: "lm_head kept float (lm_head='float')" for n in lin if n not in targets}
    if rung.quantization == "int4_weight_only":
        check_group_size(rung.group_size, {n: lin[n].in_features for n in targets}, "quantize")
    model = copy.deepcopy(loaded.model)
    if rung.quantization == "int8_dynamic":
        if loaded.info.dtype != "float32":
            raise ParameterError(f"quantization: int8_dynamic quantizes a float32 model (got {loaded.info.dtype})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's deprecation notice pointing at torchao
            qconfig = torch.ao.quantization.default_dynamic_qconfig
            model = torch.ao.quantization.quantize_dynamic(model, {n: qconfig for n in targets}, dtype=torch.qint8)
    else:
        from torchao.quantization import quantize_

        if head_names and rung.lm_head == "quantize":
            # a tied head shares its Parameter with the embedding: untie so the embedding stays float
            for n in head_names:
                m = dict(model.named_modules())[n]
                m.weight = torch.nn.Parameter(m.weight.detach().clone(), requires_grad=False)
        config = _torchao_config(rung, device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_(model, config, filter_fn=lambda m, fqn: fqn in targets)
        left = [n for n in targets if type(dict(model.named_modules())[n].weight).__name__ in ("Parameter", "Tensor")
                and not hasattr(dict(model.named_modules())[n].weight, "__tensor_flatten__")]
        if left:  # torchao skipped a layer on its own (it only logs): say so rather than measure a float layer
            raise ParameterError(f"quantization: torchao left {len(left)} layer(s) in float ({', '.join(left[:4])}); "
                                 f"the scheme cannot take their shapes")
    model.eval()
    name = f"{loaded.info.name} ({rung.quantization})"
    info = dataclasses.replace(loaded.info, name=name, weight_bytes=step_weight_bytes(model))
    from workbench.measure.models import LoadedModel

    return Built(LoadedModel(model=model, tokenizer=loaded.tokenizer, info=info), rung, sorted(targets), skipped)


def _torchao_config(rung: Rung, device: str):
    if rung.quantization == "int8_weight_only":
        from torchao.quantization import Int8WeightOnlyConfig

        return Int8WeightOnlyConfig()
    if device == "cpu":
        from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=rung.group_size, set_inductor_config=False)
    from torchao.quantization import Int4WeightOnlyConfig

    return Int4WeightOnlyConfig(group_size=rung.group_size, int4_packing_format="tile_packed_to_4d",
                                set_inductor_config=False)


# ----------------------------------------------------------------------------- generating and timing


def generate_kwargs(cache_implementation: str = "dynamic", compile: bool = False, device: str = "cpu") -> dict:
    """``generate`` keywords of a cache / compile choice: the cache implementation, and either a
    ``CompileConfig`` (on CPU with ``_compile_all_devices``: ``transformers`` auto-compiles only on
    accelerators; ``reduce-overhead``, i.e. CUDA graphs, on CUDA) or ``disable_compile=True`` (a static cache
    alone must not compile behind the caller's back).

    Raises:
        ParameterError: ``compile`` without a static cache.
    """
    if compile and cache_implementation != "static":
        raise ParameterError("compile: torch.compile needs cache_implementation 'static'")
    out: dict = {}
    if cache_implementation == "static":
        out["cache_implementation"] = "static"
    if compile:
        from transformers import CompileConfig

        cc = CompileConfig(mode="default" if device == "cpu" else "reduce-overhead")
        cc._compile_all_devices = True
        out["compile_config"] = cc
    else:
        out["disable_compile"] = True
    return out


def set_generation_defaults(loaded, cache_implementation: str = "dynamic", compile: bool = False) -> None:
    """Make a rung's cache and compile choice the model's own ``generation_config`` defaults, for callers that
    do not pass :func:`generate_kwargs` (the server's engines). Mutates ``loaded.model.generation_config``.

    Raises:
        ParameterError: ``compile`` without a static cache.
    """
    kw = generate_kwargs(cache_implementation, compile, str(loaded.info.device).split(":")[0])
    gc = loaded.model.generation_config
    gc.cache_implementation = kw.get("cache_implementation")
    if compile:
        gc.compile_config = kw["compile_config"]
    gc.disable_compile = not compile


def compiled_graphs() -> int:
    """Graphs ``torch._dynamo`` has compiled in this process so far (its ``unique_graphs`` counter)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - no dynamo: nothing compiled
        return 0


# ----------------------------------------------------------------------------- the ladder's recommendation


def recommend(analysis, eligible, baseline: str = "float32", versus_runner_up: bool = True) -> tuple:
    """The speed ladder's recommendation (``benchmarks/ladder.py``): a rung decided faster than the baseline, the
    best of the rungs inside the quality tolerance, compared with its runner-up.

    The decision is :func:`workbench.stats.blocks.best_of` over the baseline and ``eligible`` (decode tokens/s,
    higher is better) on the ladder's design (:mod:`workbench.run.design`: interleaved rounds, the A/A arm, the block
    analysis's simultaneous intervals over every rung, the sequential looks). A rung is recommended only when its
    comparison with the baseline is a direction "higher" (faster beyond noise at the family's level): the older
    ladder recommended the best of ~11 rungs on its unadjusted lower bound (11% of null runs against a nominal
    2.5%) and never read its own A/A control; a moved A/A control recommends nothing.

    Args:
        analysis: :class:`workbench.stats.blocks.Analysis` of decode tokens/s, the baseline its control.
        eligible: the rungs inside the quality tolerance (the guard passed).
        baseline: the baseline rung.
        versus_runner_up: compare the pick with its runner-up (False: skip the Tukey interval, a simulation).

    Returns:
        ``(pick or None, sentence)``: :class:`workbench.stats.blocks.Pick` and the recommendation in words.
    """
    from workbench.stats import blocks

    cands = [baseline] + [r for r in eligible if r != baseline and r in analysis.arms]
    pick = blocks.best_of(analysis, cands, higher_is_better=True, versus_runner_up=versus_runner_up)
    words = ("faster", "slower")
    if analysis.aa_moved:
        return pick, (f"no recommendation: the A/A control moved ({analysis.aa_decision.interval_text()}): the "
                      f"machine drifted between rounds, rerun on a quiet machine")
    if pick.keeps_control:
        why = {"direction": "every rung inside the quality tolerance is slower beyond noise or equivalent",
               "equivalent": "every rung inside the quality tolerance is equivalent within the margin",
               "undecided": f"none is shown faster ({', '.join(map(str, pick.open))} undecided"
                            + (f"; about {pick.rounds_needed} rounds would decide it" if pick.rounds_needed else "")
                            + ")"}[pick.verdict]
        return pick, f"keep {baseline}: {why}"
    vs = pick.versus_control
    if not (vs.verdict == "direction" and vs.direction == "higher"):
        return pick, (f"no recommendation: the best rung inside the quality tolerance, "
                      f"{vs.describe(str(pick.pick), words=words)}, is not decided faster than {baseline}")
    text = f"recommended: {vs.describe(f'{pick.pick} vs {baseline}', words=words)}"
    if pick.versus_runner_up is not None:
        text += "; " + pick.versus_runner_up.describe(f"against the runner-up {pick.runner_up}", words=words)
    return pick, text
