"""Timing a rung of the speed ladder (:mod:`workbench.techniques.rungs`) with its compile time kept apart.

A compiled rung's first call is timed alone as ``compile_s`` (the field's convention: warm up, and each new
shape when compiled, before measuring; docs/design.md section 4), then one full-length warm-up runs at the timed
runs' own static-cache shape, then :func:`workbench.run.sweeps.measure_generation` runs the timed repeats; graphs
``torch._dynamo`` compiles during those repeats are counted (``recompiles``, 0 expected).
"""

from __future__ import annotations

import time

from workbench.techniques.rungs import compiled_graphs


def measure(loaded, prompts, settings, repeats: int, warmup: int, gen_kwargs: dict, compiled: bool,
            logits_processor=None, clock=time.perf_counter):
    """Time a rung: a compiled rung's first call alone is timed as ``compile_s`` and doubles as its warm-up;
    then :func:`workbench.run.sweeps.measure_generation` runs the (remaining) warm-up and the timed repeats.

    Args:
        loaded, prompts, settings: as :func:`workbench.measure.generation.generate_measured`.
        repeats, warmup: timed repeats and untimed warm-up runs (uncompiled; a compiled rung runs exactly one
            full-length warm-up after its compile call).
        gen_kwargs: :func:`generate_kwargs`.
        compiled: whether the rung compiles.
        logits_processor: optional, passed through.
        clock: the clock of ``compile_s``.

    Returns:
        ``(PointResult, {"compile_s", "recompiles", "compile_graphs"})``: ``compile_s`` NaN uncompiled;
        ``recompiles`` the graphs dynamo compiled during the timed repeats (0 expected; NaN uncompiled);
        ``compile_graphs`` those compiled by the compile call and warm-up. The compile call's time is in
        neither ``requests`` nor ``wall_s``.
    """
    from workbench.measure import generation
    from workbench.run.sweeps import measure_generation

    extra = {"compile_s": float("nan"), "recompiles": float("nan")}
    if not compiled:
        return measure_generation(loaded, prompts, settings, repeats, warmup, generate_kwargs=gen_kwargs,
                                  logits_processor=logits_processor), extra
    before = compiled_graphs()
    t0 = clock()
    generation.generate_measured(loaded, prompts, settings, generate_kwargs=gen_kwargs,
                                 logits_processor=logits_processor)
    extra["compile_s"] = clock() - t0
    # one more full-length untimed call: warm-up at the timed runs' own static-cache shape (a shorter warm-up
    # would size the cache differently and compile again inside the first timed repeat)
    t1 = clock()
    generation.generate_measured(loaded, prompts, settings, generate_kwargs=gen_kwargs,
                                 logits_processor=logits_processor)
    warmup_s = clock() - t1
    mid = compiled_graphs()
    out = measure_generation(loaded, prompts, settings, repeats, 0, generate_kwargs=gen_kwargs,
                             logits_processor=logits_processor)
    out.warmup_s = warmup_s
    extra["recompiles"] = compiled_graphs() - mid
    extra["compile_graphs"] = mid - before
    return out, extra
