"""Where a decode step's time goes: a ``torch.profiler`` split of one decode step per rung, beside the
roofline's bytes-at-bandwidth time.

Method (per rung): two profiled greedy ``generate`` calls on the same prompt, one producing 1 token (prefill
plus the first step) and one producing ``1 + steps``; the difference divided by ``steps`` is one decode step,
whatever the rung does inside it (compiled graph, quantized kernels, static cache, the logits processors and
token selection of ``generate``). Each operator's self CPU time is put in one component by its name
(:func:`component`):

- ``matvec``: the weight products (``aten::mm`` / ``addmm`` / ``linear``, torchao's ``_weight_int8pack_mm`` and
  ``_weight_int4pack_mm_for_cpu``, ``quantized::linear_dynamic``); at batch 1 each is a matrix-vector product;
- ``attention``: ``scaled_dot_product_attention`` and its kernels, eager attention's ``bmm`` / ``softmax``,
  the KV-cache update (``index_copy`` / ``cat`` into the cache);
- ``norm_activation``: RMSNorm, SiLU, rotary embedding and the other elementwise operators (inductor's fused
  ``cpp_fused_*`` kernels of a compiled rung land here);
- ``sampling``: the logits processors and token choice (``argmax``, ``topk``, ``sort``, ``multinomial``,
  ``isin``, ``where``...);
- ``overhead``: the profiled step's wall time minus the operators' self time: Python, ``generate``'s loop
  and operator dispatch, whatever the profiler cannot see, and the profiler's own cost (so the components
  add up to the profiled step, ``profiled_step_s``). ``step_s`` is the same two-call difference run without
  the profiler: ``profiled_step_s - step_s`` is what profiling added.

``roofline_s``: the bytes a step must read (weights as stored, :attr:`ModelInfo.weight_bytes`, plus the KV
cache at the step's context) over the probed copy bandwidth (:meth:`workbench.predict.roofline.Device.probe`): the
time a perfectly memory-bound step would take.
"""

from __future__ import annotations

import time

COMPONENTS = ("matvec", "attention", "norm_activation", "sampling", "overhead")
LABELS = {"matvec": "matrix-vector (weights)", "attention": "attention + KV cache",
          "norm_activation": "norms, activations, elementwise", "sampling": "logits processors + token choice",
          "overhead": "Python, dispatch, the rest"}

_MATVEC = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::mv", "int8pack", "int4pack",
           "linear_dynamic", "linear_prepack", "_weight_", "quantized::", "extern_kernels.mm", "mkldnn", "onednn")
_ATTENTION = ("scaled_dot_product", "attention", "bmm", "baddbmm", "softmax", "index_copy", "index_put")
_SAMPLING = ("argmax", "topk", "sort", "multinomial", "isin", "cumsum", "argsort", "aten::max", "aten::any",
             "aten::all", "aten::eq", "aten::ne", "aten::where", "aten::ge", "aten::le")
_CONTAINERS = ("ProfilerStep", "Torch-Compiled Region", "CompiledFunction", "## ", "forward", "generate")


def component(name: str) -> str | None:
    """The component of an operator name (None: a container whose children carry the time)."""
    if any(name.startswith(c) or c in name for c in _CONTAINERS):
        return None
    low = name.lower()
    if any(k in low for k in _MATVEC):
        return "matvec"
    if any(k in low for k in _ATTENTION):
        return "attention"
    if any(k in low for k in _SAMPLING):
        return "sampling"
    return "norm_activation"


def _self_times(fn) -> dict[str, float]:
    """Seconds of operator self CPU time per component while ``fn()`` runs under ``torch.profiler``, and the
    call's wall time (``wall``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    out = {c: 0.0 for c in COMPONENTS if c != "overhead"}
    for evt in prof.key_averages():
        comp = component(evt.key)
        if comp is not None:
            out[comp] += evt.self_cpu_time_total / 1e6
    out["wall"] = wall
    return out


def profile_decode_step(loaded, prompt_tokens: int = 32, steps: int = 8, gen_kwargs: dict | None = None,
                        repeats: int = 3) -> dict:
    """Split one decode step of ``loaded`` (a rung's model) into :data:`COMPONENTS`.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel` as the rung built it.
        prompt_tokens: prompt length (real text, :func:`workbench.inputs.prompts.build_batch`), >= 8.
        steps: decode steps in the difference (>= 2).
        gen_kwargs: the rung's ``generate`` keywords (:func:`workbench.techniques.rungs.generate_kwargs`); a compiled rung
            must have compiled already (call it once before), or its compile lands in the first call.
        repeats: repeats of each call, unprofiled for the wall time and profiled for the components (medians).

    Returns:
        ``{component: seconds per step}`` (the five add up to ``profiled_step_s``, the profiled step's wall
        time), ``profiled_s`` (operator self time per step) and ``step_s`` (the unprofiled step).

    Raises:
        ParameterError: ``prompt_tokens`` < 8 or ``steps`` < 2.
    """
    import statistics

    from workbench import checks
    from workbench.inputs.prompts import build_batch
    from workbench.measure.generation import GenerationSettings, generate_measured

    checks.check_int("prompt_tokens", prompt_tokens, 8)
    checks.check_int("steps", steps, 2)
    prompts = build_batch(loaded.tokenizer, 1, prompt_tokens)
    kw = dict(gen_kwargs or {"disable_compile": True})

    def call(n):
        return lambda: generate_measured(loaded, prompts, GenerationSettings(max_new_tokens=n, ignore_eos=True),
                                         generate_kwargs=kw)

    short, long = call(1), call(1 + steps)
    short(), long()  # warm-up (and a compiled rung's second shape)

    def wall(fn):
        vals = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            vals.append(time.perf_counter() - t0)
        return statistics.median(vals)

    step_s = max(0.0, (wall(long) - wall(short)) / steps)
    def profiled(fn):  # the median of ``repeats`` profiles per component: one profile a side is one sample of a
        runs = [_self_times(fn) for _ in range(repeats)]  # difference that contention can turn negative
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    a, b = profiled(short), profiled(long)
    wall = max(0.0, (b.pop("wall") - a.pop("wall")) / steps)
    out = {c: max(0.0, (b[c] - a[c]) / steps) for c in a}
    out["profiled_s"] = sum(out.values())
    out["overhead"] = max(0.0, wall - out["profiled_s"])
    out["profiled_step_s"] = out["profiled_s"] + out["overhead"]
    out["step_s"] = step_s
    return out


def roofline_step_s(loaded, context_tokens: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds a memory-bound decode step takes: (weights as stored + KV cache at ``context_tokens``) /
    bandwidth (batch 1)."""
    kv = loaded.info.kv_cache_bytes_per_token() * context_tokens
    return (loaded.info.weight_bytes + kv) / bandwidth_bytes_per_s
