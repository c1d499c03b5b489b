"""Is a decode step linear in its rows? A bare ``generate`` step by batch size, interleaved rounds.

The serving twin's cost model (:mod:`workbench.predict.twin_cost`) is linear in the rows plus each measured batch
size's residual, because on the 2-core build VM a step of 3 or 7 rows cost 103-114 ms where 4 to 6 rows cost 74-87
ms (results/LOG.md, 2026-12-06): CPU matrix kernels are blocked by rows. This measures the workbench's own
:func:`workbench.measure.generation.generate_measured` (TPOT: the mean decode step after the first token) at each
batch size, ``--rounds`` rounds in alternating order so a slow stretch of the machine falls on every size alike,
and prints each size's median step and its ratio to the linear interpolation of its neighbours (1.00: on the line).
Run with nothing else on the machine: ``python benchmarks/batch_step.py`` (~2 min on the 2-core build VM).
"""

import argparse
import statistics

from workbench.inputs.prompts import build_batch
from workbench.measure import models
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,2,3,4,5,6,7,8,12,16")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=17)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    sizes = sorted({int(x) for x in args.batch_sizes.split(",")})
    if not sizes or sizes[0] < 1 or args.rounds < 1 or args.new_tokens < 2 or args.prompt_tokens < 1:
        raise SystemExit("batch sizes >= 1, --rounds >= 1, --new-tokens >= 2, --prompt-tokens >= 1")
    loaded = models.load_model("default", args.device, "auto")
    prompts = build_batch(loaded.tokenizer, max(sizes), args.prompt_tokens)
    settings = GenerationSettings(max_new_tokens=args.new_tokens, ignore_eos=True)
    warm_up(loaded, prompts[: max(sizes)], settings, 1)
    steps: dict[int, list[float]] = {b: [] for b in sizes}
    for rnd in range(args.rounds):
        for b in (sizes if rnd % 2 == 0 else sizes[::-1]):
            recs = generate_measured(loaded, prompts[:b], settings).records
            steps[b].append(statistics.median(r["tpot_s"] for r in recs))
    med = {b: statistics.median(v) for b, v in steps.items()}
    print(f"decode step by batch size ({args.prompt_tokens}-token prompts, {args.new_tokens} tokens, "
          f"{args.rounds} interleaved rounds, {loaded.info.device})")
    for i, b in enumerate(sizes):
        line = ""
        if 0 < i < len(sizes) - 1:   # the straight line between the neighbours at b
            lo, hi = sizes[i - 1], sizes[i + 1]
            interp = med[lo] + (med[hi] - med[lo]) * (b - lo) / (hi - lo)
            line = f"  {med[b] / interp:.2f}x its neighbours' line"
        print(f"  B={b:>3}: {med[b] * 1e3:7.1f} ms  (rounds {', '.join(f'{x * 1e3:.1f}' for x in steps[b])}){line}")


if __name__ == "__main__":
    main()
