"""The speed techniques' model builders: a draft model for speculative decoding and int8 dynamic quantization.

:func:`truncated_draft` (the target's first layers as its own draft), :func:`check_draft_tokenizer` (assisted
generation needs one vocabulary), :func:`check_quantization` / :func:`quantize_int8` (``torch.ao`` dynamic int8 on
every ``nn.Linear``) and :func:`quantized_weight_bytes` (what a quantized model really reads per step). Each returns
a :class:`~workbench.measure.models.LoadedModel` beside the loaded one; loading itself is :mod:`workbench.measure.models`.
"""

from __future__ import annotations

import dataclasses

from workbench.errors import ParameterError
from workbench.measure.models import LoadedModel, non_embedding_params, resolve_model_path


def truncated_draft(loaded: LoadedModel, layers: int) -> LoadedModel:
    """A draft for assisted generation: the first ``layers`` decoder layers of ``loaded``, sharing its modules.

    No weights are copied: the draft's embedding, first ``layers`` blocks, final norm, rotary embedding and LM
    head ARE the target's (same objects), so the draft costs no memory and its tokenizer is the target's. It
    is an honest stand-in where the family has no smaller model (SmolLM2-135M is its smallest): a
    layer-truncated copy was not trained to exit early, so its acceptance is what it is, and it is reported
    as such (``draft_model = "truncated"``). Each ``generate`` keeps a separate KV cache for draft and target.

    Args:
        loaded: the target model (a decoder with ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``: the
            Llama / Qwen / Mistral layout of ``transformers``).
        layers: decoder layers kept, 1 .. ``num_layers - 1``.

    Returns:
        :class:`LoadedModel` with ``info.num_layers = layers`` and ``info.weight_bytes`` the bytes one draft
        step reads (its layers, final norm and the LM head; the embedding contributes one row and is not
        counted, as for the target, whose tied head is the embedding matrix).

    Raises:
        ParameterError: ``layers`` out of range or a model without that layout.
    """
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from workbench.checks import check_int

    n = loaded.info.num_layers
    check_int("draft_layers", layers, 1, n - 1)
    model = loaded.model
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        raise ParameterError("draft_model: layer truncation needs a decoder with embed_tokens, layers, norm and "
                             "rotary_emb (Llama-style); pass a draft model path instead")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = layers
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(cfg)
    dbase = getattr(draft, draft.base_model_prefix)
    dbase.embed_tokens, dbase.norm, dbase.rotary_emb = base.embed_tokens, base.norm, base.rotary_emb
    dbase.layers = torch.nn.ModuleList(list(base.layers[:layers]))
    draft.lm_head = model.lm_head
    draft.generation_config = copy.deepcopy(model.generation_config)
    draft.eval()
    read = [p for p in dbase.layers.parameters()] + list(dbase.norm.parameters()) + list(draft.lm_head.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in read}.values())
    info = dataclasses.replace(loaded.info, name=f"{loaded.info.name} (first {layers} of {n} layers)",
                               num_layers=layers, weight_bytes=weight_bytes,
                               num_params=sum(p.numel() for p in draft.parameters()),
                               num_non_embedding_params=non_embedding_params(draft))
    return LoadedModel(model=draft, tokenizer=loaded.tokenizer, info=info)


#: quantization schemes this workbench can run, and the ones it knows but has no CPU kernel for here
QUANTIZATIONS = ("none", "int8_dynamic")
UNSUPPORTED_QUANTIZATIONS = ("int4", "int4_weight_only", "nf4", "fp8", "int8_static", "gptq", "awq")


def check_quantization(scheme: str, device: str) -> None:
    """Refuse a quantization scheme with no kernel on ``device`` (one line, before any model loads).

    ``int8_dynamic`` is ``torch.ao.quantization.quantize_dynamic`` on ``nn.Linear`` (int8 weights, activations
    quantized per call; fbgemm / onednn / qnnpack CPU kernels), CPU only. int4 and the other schemes need
    torchao or optimum-quanto kernels, which this environment does not install.

    Raises:
        ParameterError: an unknown scheme, one without a kernel here, or int8 off the CPU.
    """
    if scheme in QUANTIZATIONS:
        if scheme != "none" and device != "cpu":
            raise ParameterError(f"quantization: {scheme!r} uses torch's CPU kernels; device must be cpu (got {device})")
        return
    if scheme in UNSUPPORTED_QUANTIZATIONS:
        raise ParameterError(f"quantization: {scheme!r} has no CPU kernel here (torch's own kernels cover int8 "
                             f"dynamic only; torchao / optimum-quanto are not installed); use one of "
                             f"{', '.join(QUANTIZATIONS)}")
    raise ParameterError(f"quantization: must be one of {', '.join(QUANTIZATIONS)} (got {scheme!r})")


def quantized_weight_bytes(model) -> int:
    """Bytes one decode step of a dynamically quantized model reads: int8 weights (+ float bias, scale and
    zero point) of every quantized ``Linear`` and the float parameters outside the input embedding (of which a
    step reads one row)."""
    import torch

    total, seen = 0, set()
    emb = model.get_input_embeddings()
    skip = {id(p) for p in emb.parameters()} if emb is not None else set()
    for mod in model.modules():
        if isinstance(mod, torch.ao.nn.quantized.dynamic.Linear):
            w = mod.weight()
            total += w.numel() * w.element_size() + 8 * (w.q_per_channel_scales().numel()
                                                         if w.qscheme() in (torch.per_channel_affine,) else 1)
            b = mod.bias()
            total += 0 if b is None else b.numel() * b.element_size()
    for p in model.parameters():
        if id(p) not in skip and id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def quantize_int8(loaded: LoadedModel) -> LoadedModel:
    """A weight-int8 copy of a float32 CPU model: ``torch.ao.quantization.quantize_dynamic`` on every
    ``nn.Linear`` (LM head included; the embedding stays float32).

    torch's dynamic kernels (fbgemm / onednn) also quantize each Linear's input activations per call (per
    tensor, 7-bit range on x86 with ``reduce_range``), then accumulate in int32 and dequantize: weight-int8
    with dynamic activation quantization, not pure weight-only. The activation rounding is most of its
    log-prob drift; the per-call quantize / dequantize is extra work that a small memory-light model on a CPU
    may not win back from reading a quarter of the weight bytes. Pure int8 weight-only needs torchao (absent).

    ``info.weight_bytes`` is what a decode step reads (:func:`quantized_weight_bytes`), so MBU counts the
    bytes the quantized model really moves; the KV cache and activations stay float32 (``info.dtype``).

    Raises:
        ParameterError: the model is not float32 on the CPU.
    """
    import copy
    import warnings

    import torch

    if loaded.info.device != "cpu" or loaded.info.dtype != "float32":
        raise ParameterError(f"quantization: int8_dynamic quantizes a float32 CPU model (got {loaded.info.dtype} "
                             f"on {loaded.info.device})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notice pointing at torchao
        model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(loaded.model), {torch.nn.Linear},
                                                       dtype=torch.qint8)
    model.eval()
    info = dataclasses.replace(loaded.info, name=f"{loaded.info.name} (int8 dynamic)",
                               weight_bytes=quantized_weight_bytes(model))
    return LoadedModel(model=model, tokenizer=loaded.tokenizer, info=info)


def check_draft_tokenizer(target: str, draft: str) -> None:
    """Refuse a draft model whose tokenizer differs from the target's (reads the two tokenizers only).

    Assisted generation verifies the draft's token ids as the target's own: a different vocabulary makes
    every proposal meaningless (``transformers``' universal assisted generation re-tokenizes text instead,
    which this workbench does not measure).

    Raises:
        ParameterError: the vocabularies differ.
    """
    from transformers import AutoTokenizer

    vocabs = []
    for spec in (target, draft):
        path = resolve_model_path(spec)
        vocabs.append(AutoTokenizer.from_pretrained(str(path)).get_vocab())
    if vocabs[0] != vocabs[1]:
        raise ParameterError(f"draft_model: its tokenizer does not match the target's ({len(vocabs[1])} vs "
                             f"{len(vocabs[0])} tokens, or different ids); assisted generation needs the same vocabulary")
