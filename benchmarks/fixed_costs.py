"""Fixed costs the 2026-12-07 stops cut, each against its old path in the same tree, alternated:

- **a command before its first kernel**: a fresh interpreter validating 01_batch_size's parameters and taking the
  run identity (:func:`workbench.run.resume_check.run_identity`), with ``auto`` read from the machine-shared answer
  (:func:`workbench.measure.models.resolve_names`) against the same with torch imported to resolve it (the old
  path: :func:`workbench.measure.models.pick_device`);
- **the quality guard of two configurations**: :func:`workbench.measure.guard.reference` and the float32 and
  bfloat16 judgements with the reference's log-probabilities kept, against recomputed at every judgement
  (:data:`workbench.measure.guard.REFERENCE_LOG_PROBS_BYTES` at 0);
- **the temperature experiment's perplexity scoring**: one measurement's answers (the default suite's 6 factual
  prompts, 40 new tokens at temperature 1.2) scored in batches (:func:`workbench.measure.quality.perplexities`)
  against one forward pass each (:func:`workbench.measure.quality.perplexity`);
- **the spread check of a decision** (:func:`workbench.stats.blocks.spread_check`): scipy's ``bartlett`` without its
  nan/axis argument wrapper against the public one, over 2,000 tables of 4 arms and 8 rounds;
- **the planning critical value's per-comparison error** (:func:`workbench.stats.blocks.per_comparison_alpha`,
  behind every "rounds needed" of an undecided comparison) at 2, 5 and 12 comparisons: the equicorrelated normal's
  one-dimensional integral against scipy's multivariate normal CDF (Genz's quasi-Monte Carlo, the old path), each
  solved for the same 1 - alpha by Brent's method;
- **Dunnett's critical value of a decision** (:func:`workbench.stats.blocks.critical_value`, every interval of a
  pooled block analysis) at 4, 8 and 12 balanced comparisons and 10-30 dof: the equicorrelated t's exact coverage
  (:func:`workbench.stats.blocks.equicorrelated_t_coverage`) against scipy's multivariate t CDF (Genz's quasi-Monte
  Carlo with a fixed seed, the old path), each solved by Brent's method;
- **a notebook kernel's first figure**: a fresh interpreter importing the workbench and plotly's renderers (what a
  kernel's first ``fig.show()`` imports: nbformat, jsonschema) with rfc3987_syntax's Lark grammar kept out
  (workbench/__init__.py) against the same with it imported (the old path).

Prints the median seconds of each path and their ratio. Run: ``python benchmarks/fixed_costs.py --repeats 3``
(nothing else on the CPU: the figures on a shared 2-core VM move with its load; results/LOG.md 2026-12-07).
"""

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np
from scipy import stats

from workbench.measure import guard, models, quality
from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured
from workbench.run import notebooks
from workbench.stats import blocks

COMMAND = """
import sys, time
t = time.perf_counter()
{resolve}
from workbench.run import notebooks, resume_check
e = [{{"notebook": {nb!r}, "parameters": {{"batch_sizes": [1, 2]}}}}]
notebooks.validate_parameters(e[0]["notebook"], e[0]["parameters"])
resume_check.run_identity(e)
print(time.perf_counter() - t)
"""
# the old path: torch imported to resolve "auto" before the validation (what sweeps and resume_check did)
OLD = "from workbench.measure import models; models.pick_device('auto'); models.pick_dtype('auto', 'cpu')"


def command_seconds(old: bool) -> float:
    nb = str(notebooks.REPO / "notebooks" / "01_batch_size.ipynb")
    code = COMMAND.format(resolve=OLD if old else "", nb=nb)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def guard_seconds(keep: bool) -> float:
    guard.REFERENCE_LOG_PROBS_BYTES = 256 * 2**20 if keep else 0
    ref_model = models.load_model("default", "cpu", "float32", attn_implementation="eager")
    configs = [models.load_model("default", "cpu", "float32"), models.load_model("default", "cpu", "bfloat16")]
    t0 = time.perf_counter()
    ref = guard.reference(ref_model, tokens=256, window=128, greedy_prompts=2, greedy_tokens=8)  # the default suite's
    for c in configs:
        guard.judge(c, ref)
    return time.perf_counter() - t0


def scoring_inputs() -> tuple:
    """The default suite's temperature measurement: its 6 factual prompts' ids and one sampled answer each."""
    from workbench.experiments import temperature

    loaded = models.load_model("default", "cpu", "float32")
    cfg = temperature.Config(temperatures=[0.0, 1.2], top_ps=[1.0], families=["factual"], languages=["en"],
                             n_factual_prompts=6, factual_max_new_tokens=40)
    texts = [p["prompt"] for p in cfg.prompts("factual")]
    answers = generate_measured(loaded, texts, GenerationSettings(max_new_tokens=40, temperature=1.2, seed=1))
    prompts = [encode_prompts(loaded.tokenizer, [t])["input_ids"][0].tolist() for t in texts]
    return loaded, prompts, [r["output_ids"] for r in answers.records]


def scoring_seconds(inputs: tuple, batched: bool) -> float:
    loaded, prompts, answers = inputs
    t0 = time.perf_counter()
    if batched:
        quality.perplexities(loaded, prompts, answers)
    else:
        [quality.perplexity(loaded, p, a) for p, a in zip(prompts, answers)]
    return time.perf_counter() - t0


def spread_check_seconds(unwrapped: bool, tables: int = 2000) -> float:
    rng = np.random.default_rng(0)
    ys = [rng.normal(0, 0.2, (8, 1)) + rng.normal(0, 0.05, (8, 4)) for _ in range(tables)]
    public = stats.bartlett
    if not unwrapped:   # the old path: the public function, argument wrapper and all
        stats.bartlett = lambda *groups: public(*groups)
    try:
        t0 = time.perf_counter()
        for y in ys:
            blocks.spread_check(y)
        return time.perf_counter() - t0
    finally:
        stats.bartlett = public


def planning_alpha_seconds(exact: bool, ms=(2, 5, 12), alpha: float = 0.05) -> float:
    from scipy import optimize

    t0 = time.perf_counter()
    for m in ms:
        if exact:
            blocks.per_comparison_alpha.__wrapped__(m, alpha)   # the cache bypassed: solved every time
            continue
        mvn = stats.multivariate_normal(mean=np.zeros(m), cov=blocks.balanced_corr(m))   # the old path, as it was
        optimize.brentq(lambda c: float(mvn.cdf(c * np.ones(m), lower_limit=-c * np.ones(m))) - (1 - alpha),
                        float(stats.norm.ppf(1 - alpha / 2)) * 0.999, float(stats.norm.ppf(1 - alpha / (2 * m))) + 0.1,
                        xtol=1e-4)
    return time.perf_counter() - t0


_CALLS = 0


def decision_critical_seconds(exact: bool, cases=((4, 10), (8, 20), (12, 30)), alpha: float = 0.05) -> float:
    from scipy import optimize

    global _CALLS
    _CALLS += 1
    t0 = time.perf_counter()
    for m, dof in cases:
        corr = blocks.balanced_corr(m)
        if exact:   # a dof a hair apart each call: the value's cache never answers
            blocks.critical_value(corr, dof + _CALLS * 1e-9, alpha)
            continue
        dist = stats.multivariate_t(loc=np.zeros(m), shape=corr, df=dof, allow_singular=True)   # the old path
        lo, hi = stats.t.ppf(1 - alpha / 2, dof), stats.t.ppf(1 - alpha / (2 * m), dof) * 1.05 + 0.1
        optimize.brentq(lambda c: float(dist.cdf(c * np.ones(m), lower_limit=-c * np.ones(m), maxpts=10_000 * m,
                                                 random_state=np.random.default_rng(0))) - (1 - alpha),
                        lo * 0.999, hi, xtol=1e-3)
    return time.perf_counter() - t0


FIRST_FIGURE = """
import sys, time
t = time.perf_counter()
{grammar}
import workbench.share.plots, plotly.io._renderers
print(time.perf_counter() - t)
"""


def first_figure_seconds(with_grammar: bool) -> float:
    code = FIRST_FIGURE.format(grammar="import rfc3987_syntax" if with_grammar else "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def compare(name: str, seconds, repeats: int, old_label: str, new_label: str) -> None:
    """Time ``seconds(True)`` (the old path) and ``seconds(False)`` (the new one) alternated ``repeats`` times and
    print their medians and the ratio new / old."""
    old, new = [], []
    for _ in range(repeats):
        old.append(seconds(True))
        new.append(seconds(False))
    a, b = statistics.median(old), statistics.median(new)
    print(f"{name}: {old_label} {a:.2f} s, {new_label} {b:.2f} s (medians of {repeats}); ratio {b / a:.2g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-guard", action="store_true", help="only the costs without a model load")
    args = ap.parse_args()
    n = args.repeats
    models.resolve_names()                     # this machine's answer kept, as after any earlier command
    compare("a command before its first kernel", command_seconds, n, "torch imported", "auto read")
    compare("planning alpha at 2, 5, 12 comparisons", lambda old: planning_alpha_seconds(not old), n, "Genz QMC",
            "exact integral")
    compare("Dunnett's value at 4, 8, 12 comparisons", lambda old: decision_critical_seconds(not old), n,
            "Genz QMC", "exact integral")
    compare("a kernel's first figure imports", first_figure_seconds, n, "with the Lark grammar", "without")
    if args.skip_guard:
        return
    guard_seconds(True)                        # loads and warm-up outside the timings
    compare("the guard of float32 and bfloat16", lambda old: guard_seconds(not old), n, "reference recomputed",
            "reference kept")
    inputs = scoring_inputs()
    scoring_seconds(inputs, True)              # warm-up outside the timings
    compare("perplexity of 6 answers", lambda old: scoring_seconds(inputs, not old), n, "one pass each", "batched")
    compare("2,000 spread checks", lambda old: spread_check_seconds(not old), n, "bartlett wrapped",
            "bartlett unwrapped")


if __name__ == "__main__":
    main()
