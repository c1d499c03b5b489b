"""Answering over a compressed context: :func:`answer` generates the answer to a
:class:`workbench.techniques.compression.CompressionResult`'s prompt (one measured request, after :func:`check_fits`
has checked it fits the model's context with the answer), through the prefix cache for ``kv_reuse``:
:func:`build_prefix_cache` prefills the unchanged history once into a ``DynamicCache`` and
:func:`generate_with_prefix_cache` generates on a copy of it, prefilling only the new tokens. :func:`gold_logprob`
scores the gold answer's log-likelihood under the prompt (:func:`workbench.measure.quality.continuation_logprobs`,
from the cache for ``kv_reuse``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from workbench.errors import ParameterError
from workbench.measure import quality
from workbench.measure.generation import GenerationSettings, cache_kwarg, encode_prompts, generate_measured

if TYPE_CHECKING:
    from workbench.techniques.compression import CompressionResult


def prompt_ids(tokenizer, messages) -> list[int]:
    """Token ids of ``messages`` as the model sees them: chat template and generation prompt applied."""
    return encode_prompts(tokenizer, [messages], chat=True)["input_ids"][0].tolist()


# ----------------------------------------------------------------------------- KV prefix reuse


def build_prefix_cache(loaded, ids: list[int]):
    """Prefill ``ids`` once into a fresh ``DynamicCache`` and return it."""
    import torch
    from transformers import DynamicCache

    model = loaded.model
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids], device=model.device), use_cache=True, **{cache_kwarg(model): cache})
    return cache


def generate_with_prefix_cache(loaded, messages, cache, prefix_ids, settings: GenerationSettings) -> dict:
    """Generate one answer reusing a prefix ``DynamicCache``; timed by :func:`generate_measured`.

    ``generate`` receives a ``copy.deepcopy`` of the cache and prefills only the
    tokens after the prefix. The copy is made before ``t_submit``: it stands in
    for a server's in-place prefix cache, which costs no copy, so it is not TTFT.

    Returns:
        The request record of :func:`workbench.measure.generation.generate_measured`
        plus ``cached_tokens`` and ``prefilled_tokens``.

    Raises:
        ParameterError: the prompt does not start with the cached prefix.
    """
    full = prompt_ids(loaded.tokenizer, messages)
    if full[: len(prefix_ids)] != list(prefix_ids) or len(prefix_ids) >= len(full):
        raise ParameterError("cache: the prompt does not extend the cached prefix; rebuild the cache")
    past = copy.deepcopy(cache)
    res = generate_measured(loaded, [messages], settings, generate_kwargs={cache_kwarg(loaded.model): past})
    rec = res.records[0]
    rec["cached_tokens"] = len(prefix_ids)
    rec["prefilled_tokens"] = len(full) - len(prefix_ids)
    return rec


# ----------------------------------------------------------------------------- answering and quality


def check_fits(loaded, messages, max_new_tokens: int, context_tokens: int | None = None) -> int:
    """Count the templated prompt and check it fits the model's context with the answer.

    Returns:
        The prompt's token count.

    Raises:
        ParameterError: prompt + ``max_new_tokens`` exceeds the model's maximum
            context; the message names the smallest ratio that would fit.
    """
    n = len(prompt_ids(loaded.tokenizer, messages))
    limit = loaded.info.max_context_tokens
    if n + max_new_tokens > limit:
        hint = ""
        if context_tokens:
            room = limit - max_new_tokens - (n - context_tokens)
            hint = f"; compress it (ratio >= {context_tokens / max(1, room):.1f})" if room > 0 else ""
        raise ParameterError(f"context: the prompt has {n} tokens, which with max_new_tokens={max_new_tokens} "
                             f"exceeds the model's maximum context of {limit} tokens{hint}")
    return n


def answer(loaded, result: CompressionResult, settings: GenerationSettings) -> dict:
    """Generate the answer for a compressed context (one measured request).

    Returns:
        A request record (see :func:`generate_measured`) with ``prefilled_tokens``
        (tokens the model prefilled for this request) and ``cached_tokens``.
    """
    msgs = result.messages()
    check_fits(loaded, msgs, settings.max_new_tokens, result.original_tokens)
    if result.prefix_cache is not None:
        return generate_with_prefix_cache(loaded, msgs, result.prefix_cache, result.prefix_ids, settings)
    rec = generate_measured(loaded, [msgs], settings, chat=True).records[0]
    rec["cached_tokens"] = 0
    rec["prefilled_tokens"] = rec["prompt_tokens"]
    return rec


def gold_logprob(loaded, messages, gold: str, cache=None, prefix_ids=None) -> dict:
    """Log-likelihood of the gold answer as the assistant's reply (:func:`workbench.measure.quality.continuation_logprobs`).

    Args:
        loaded: the model.
        messages: the prompt (its chat template and generation prompt are applied).
        gold: the reference answer text.
        cache, prefix_ids: optional prefix cache (``kv_reuse``): only the tokens
            after the prefix are run, on a copy of the cache (ignored when the
            prompt does not start with ``prefix_ids``).

    Returns:
        ``gold_logprob`` (sum, nats), ``gold_tokens``, ``gold_logprob_per_token``.
    """
    prompt = prompt_ids(loaded.tokenizer, messages)
    target = loaded.tokenizer(gold, add_special_tokens=False)["input_ids"]
    kwargs = {}
    if cache is not None and prefix_ids and len(prefix_ids) < len(prompt) + len(target) \
            and (prompt + target)[: len(prefix_ids)] == list(prefix_ids):
        kwargs = {"past_key_values": cache, "prefix_len": len(prefix_ids)}
    total = float(sum(quality.continuation_logprobs(loaded, [prompt], [target], **kwargs)[0]))
    return {"gold_logprob": total, "gold_tokens": len(target), "gold_logprob_per_token": total / max(1, len(target))}


__all__ = ["prompt_ids", "build_prefix_cache", "generate_with_prefix_cache", "check_fits", "answer", "gold_logprob"]
