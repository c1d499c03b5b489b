"""A/A trials: how often does each comparison design claim a direction between IDENTICAL arms?

The design runner (issue 49, the default): each generation design of the workbench (engine tuning, speed
techniques) is measured with three identical arms and the A/A arm by :func:`workbench.run.design.run_design` on the
real default model, ``--trials`` times, exactly as an experiment runs it: interleaved rounds (3 first, then the
looks at 6 and 8 while undecided), the pooled block analysis with Dunnett's simultaneous intervals, O'Brien-Fleming
alpha spending over the looks. A trial claims a direction when ANY of its three comparisons (B, C and the A/A arm
against A) does; the design holds its error when that happens in at most 5% of trials. Prints per design the count,
its Wilson 95% interval, the verdicts' mix and the rounds used. ``python benchmarks/aa.py --trials 40`` (quiet
machine; minutes a design).

``--old``: the issue-32 comparison of the two designs before the runner, two ways:

- old, blocked: arm A's ``--repeats`` requests back to back, then arm B's; Welch's t over the repeats as
  independent samples (:func:`workbench.stats.comparison.blocked_interval`), what engine tuning and speed
  techniques did before: its interval sees only the noise inside a block, so drift between the blocks reads
  as an effect;
- new, interleaved: ``--repeats`` rounds of A and B in an order shuffled per round, the paired within-round
  log ratios, t over rounds (:func:`workbench.stats.comparison.compare`).

A trial "claims a direction" when its 95% interval of B / A excludes 1; a design that works does so in about
5% of trials. Prints, per design, the share for old and new side by side. Each request is tiny: engine tuning
a 32-token prompt and 8 new tokens (float32, sdpa, dynamic cache), speed techniques the ``extract`` task with
prompt lookup and 16 new tokens, both at a fixed output length. Run on a quiet machine:
``python benchmarks/aa.py --trials 20`` (about 80 requests a trial and design; minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import pandas as pd

from workbench.experiments import engine_tuning as et
from workbench.experiments import speed_techniques as st
from workbench.inputs.prompts import build_batch, task_prompts
from workbench.measure import models
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.run import design
from workbench.stats import comparison, evidence


def designs(loaded) -> dict:
    """Per design: ``(model, prompts, settings, generate kwargs)`` of its one (identical) arm."""
    dev = models.pick_device("auto")
    engine = {"dtype": "float32", "attn_implementation": "sdpa", "cache_implementation": "dynamic", "compile": False}
    return {
        "engine tuning": (loaded, build_batch(loaded.tokenizer, 1, 32), GenerationSettings(max_new_tokens=8, ignore_eos=True),
                          et.generate_kwargs(engine, dev)),
        "speed techniques": (loaded, task_prompts("extract", "en", 1, 300),
                             GenerationSettings(max_new_tokens=16, ignore_eos=True),
                             st.generate_kwargs({"technique": "prompt_lookup", "draft_tokens": 4}, None)),
    }


def e2e(arm, seed: int) -> float:
    """Mean ``e2e_s`` of one request batch of an arm."""
    model, prompts, settings, kw = arm
    recs = generate_measured(model, prompts, dataclasses.replace(settings, seed=seed),
                             generate_kwargs=kw).records
    return sum(r["e2e_s"] for r in recs) / len(recs)


def trial(arm, repeats: int, seed: int) -> tuple[bool, bool]:
    """One A/A trial both ways: ``(old blocked design claimed a direction, new interleaved design did)``."""
    a = [e2e(arm, r) for r in range(repeats)]  # old: A's block, then B's block (the same arm)
    b = [e2e(arm, r) for r in range(repeats)]
    old = comparison.claims_direction(comparison.blocked_interval(b, a))
    rows = [{"arm": name, "round": rnd, "value": e2e(arm, rnd)}
            for rnd, name in comparison.schedule(["A", "B"], repeats, seed)]
    new = comparison.compare(pd.DataFrame(rows), "A", aa=None).arms["B"].verdict in ("higher", "lower")
    return old, new


def runner_trial(arm, seed: int, min_rounds: int = 3, max_rounds: int = 8) -> design.DesignResult:
    """One A/A trial through the design runner: arms A, B, C (all ``arm``) and the A/A arm, e2e lower is better."""
    d = design.Design("aa", ["A", "B", "C"], "A", design.Outcome("e2e_s", False, "time per request"),
                      min_rounds=min_rounds, max_rounds=max_rounds, seed=seed)
    return design.run_design(d, lambda a, rnd: design.Measured({"e2e_s": e2e(arm, seed * 1000 + rnd)}),
                             progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40, help="A/A trials per design (>= 40 for the closing note)")
    ap.add_argument("--repeats", type=int, default=10, help="--old: requests per arm per trial")
    ap.add_argument("--min-rounds", type=int, default=3, help="the design's rounds before its first look")
    ap.add_argument("--max-rounds", type=int, default=8, help="the most rounds it may take")
    ap.add_argument("--designs", nargs="*", default=None, help="designs to run (default: all)")
    ap.add_argument("--old", action="store_true", help="the issue-32 comparison: blocked Welch vs interleaved paired")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    loaded = models.load_model("default", args.device, "float32")
    if args.old:
        return old_main(args, loaded)
    print(f"A/A trials through the design runner: {args.trials} per design, 3 identical arms + the A/A arm, "
          f"{args.min_rounds}-{args.max_rounds} rounds; a trial claims a direction when any comparison does "
          f"(nominal: at most 5%)")
    print(f"{'design':18s} {'claimed a direction':>30s} {'equivalent / undecided (arms)':>31s} {'rounds':>7s}   time")
    for name, arm in designs(loaded).items():
        if args.designs and name not in args.designs:
            continue
        warm_up(arm[0], arm[1], arm[2], 2, generate_kwargs=arm[3])
        t0, claimed, eq, und, rounds = time.perf_counter(), 0, 0, 0, []
        for t in range(args.trials):
            r = runner_trial(arm, t, args.min_rounds, args.max_rounds)
            verdicts = [d.verdict for d in r.analysis.arms.values()]
            claimed += "direction" in verdicts
            eq += verdicts.count("equivalent")
            und += verdicts.count("undecided")
            rounds.append(r.rounds)
        iv = evidence.wilson_interval(claimed, args.trials)
        share = f"{claimed}/{args.trials} ({claimed / args.trials:.1%}; 95% {iv.low:.1%}-{iv.high:.1%})"
        print(f"{name:18s} {share:>30s} {f'{eq} / {und}':>31s} {sum(rounds) / len(rounds):7.1f}   "
              f"{time.perf_counter() - t0:.0f} s", flush=True)


def old_main(args, loaded) -> None:
    """The issue-32 comparison: the blocked design against the interleaved paired one (no runner)."""
    print(f"A/A trials: {args.trials} per design, {args.repeats} requests per arm and design; a direction is "
          f"claimed when the 95% interval of B / A excludes 1 (nominal 5%)")
    print(f"{'design':18s} {'old: blocked, Welch':>22s} {'new: interleaved, paired':>26s}   time")
    for name, arm in designs(loaded).items():
        if args.designs and name not in args.designs:
            continue
        warm_up(arm[0], arm[1], arm[2], 2, generate_kwargs=arm[3])
        t0, old, new = time.perf_counter(), 0, 0
        for t in range(args.trials):
            o, n = trial(arm, args.repeats, seed=t)
            old, new = old + o, new + n
        print(f"{name:18s} {f'{old}/{args.trials} ({old / args.trials:.0%})':>22s} "
              f"{f'{new}/{args.trials} ({new / args.trials:.0%})':>26s}   {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
