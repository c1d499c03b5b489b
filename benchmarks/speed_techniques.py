"""Do the speed techniques pay on this machine? Ratios measured side by side in one run.

Batch 1, greedy, the embedded model in float32 on the CPU. Each comparison alternates the baseline and the
technique ``--repeats`` times (so drift hits both alike) and prints the ratio of geometric means with a
Welch 95% interval (:func:`workbench.stats.evidence.ratio_interval`), "faster" / "slower" only when it excludes 1:

- prompt lookup (``prompt_lookup_num_tokens = k``) vs plain greedy, on a copy-heavy task (quote the
  documentation) and on free generation: e2e speed-up, acceptance, and whether the output equals plain greedy;
- the draft model (the model's first ``--draft-layers`` layers, :func:`workbench.techniques.speed.truncated_draft`) vs
  plain, on the copy-heavy task: the same figures plus the Leviathan bound;
- int8 dynamic quantization vs float32: decode tokens/s ratio and the quality guard's verdict (perplexity
  ratio and mean KL against float32 on held-out text, :mod:`workbench.measure.guard`).

Run: ``make benchmark`` or ``python benchmarks/speed_techniques.py --max-new-tokens 48 --repeats 5``.
"""

import argparse

import torch

from workbench.experiments import speed_techniques as st
from workbench.inputs.prompts import task_prompts
from workbench.measure import guard, models, quality
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.stats import evidence, metrics
from workbench.techniques import speed


def side_by_side(loaded, prompt, settings, repeats, base_kwargs, kwargs, base_model=None, model=None):
    """Alternate baseline and technique; returns the two lists of records."""
    base_model, model = base_model or loaded, model or loaded
    generate_measured(base_model, prompt, settings, generate_kwargs=base_kwargs)  # warm-up
    generate_measured(model, prompt, settings, generate_kwargs=kwargs)
    a, b = [], []
    for _ in range(repeats):
        a.append(generate_measured(base_model, prompt, settings, generate_kwargs=base_kwargs).records[0])
        b.append(generate_measured(model, prompt, settings, generate_kwargs=kwargs).records[0])
    return a, b


def speculative_line(name, base, spec, k, cost_ratio) -> str:
    iv = evidence.ratio_interval([r["e2e_s"] for r in base], [r["e2e_s"] for r in spec])
    acc = metrics.acceptance([r["draft_proposed"] for r in spec], [r["draft_emitted"] for r in spec])
    same, first = quality.token_agreement([r["output_ids"] for r in base], [r["output_ids"] for r in spec])
    exact = "identical to plain greedy" if same == 1 else f"DIVERGES at token {first} (agreement {same:.2f})"
    bound = metrics.speedup_bound(acc["acceptance_rate"], k, cost_ratio)
    return (f"{name:34s} {evidence.describe_ratio(iv, 'e2e speed-up')}; acceptance {acc['acceptance_rate']:.2f}, "
            f"{acc['accepted_length']:.2f} ids/step, bound {bound:.2f}x; output {exact}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--draft-layers", type=int, default=10)
    ap.add_argument("--passage-chars", type=int, default=600)
    ap.add_argument("--guard-prompts", type=int, default=2)
    ap.add_argument("--guard-tokens", type=int, default=16)
    args = ap.parse_args()
    loaded = models.load_model("default", "cpu", "float32")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)
    k = args.draft_tokens
    print(f"{loaded.info.name} float32 on {loaded.info.device_name}, threads {torch.get_num_threads()}, batch 1, "
          f"greedy, {args.max_new_tokens} new tokens, {args.repeats} alternating repeats, k = {k}")
    copy_prompt = task_prompts("extract", "en", 1, args.passage_chars)
    free_prompt = task_prompts("free", "en")
    lookup = {"prompt_lookup_num_tokens": k}
    for task, prompt in (("copy-heavy (extract)", copy_prompt), ("free generation", free_prompt)):
        base, spec = side_by_side(loaded, prompt, settings, args.repeats, None, lookup)
        print(speculative_line(f"prompt lookup, {task}", base, spec, k, 0.0), flush=True)
    draft = speed.truncated_draft(loaded, args.draft_layers)
    kwargs = st.generate_kwargs({"technique": "draft", "draft_tokens": k}, draft)
    base, spec = side_by_side(loaded, copy_prompt, settings, args.repeats, None, kwargs)
    print(speculative_line(f"draft ({args.draft_layers} layers), copy-heavy", base, spec, k,
                           draft.info.weight_bytes / loaded.info.weight_bytes), flush=True)
    int8 = speed.quantize_int8(loaded)
    base, q = side_by_side(loaded, free_prompt, settings, args.repeats, None, None, loaded, int8)
    iv = evidence.ratio_interval([r["decode_tps"] for r in q], [r["decode_tps"] for r in base])
    ref = guard.reference(loaded, greedy_prompts=args.guard_prompts, greedy_tokens=args.guard_tokens)
    g = guard.judge(int8, ref)
    verdict = "passed" if g["guard_passed"] else f"FAILED ({g['guard_reason']})"
    print(f"{'int8 dynamic vs float32':34s} {evidence.describe_ratio(iv, 'decode tokens/s ratio')}; weights read "
          f"{int8.info.weight_bytes / 1e6:.0f} vs {loaded.info.weight_bytes / 1e6:.0f} MB per step; guard {verdict}: "
          f"{guard.describe(g)}", flush=True)


if __name__ == "__main__":
    main()
