"""The queue half of the A/A benchmark (issue 32): identical arms under the old and the new design, side by side.

Each design below compares an arm with itself (the same policy, the same traces) on a fake one-at-a-time engine
whose waiting queue is the real :class:`workbench.serving.scheduling.PolicyQueue` on a virtual clock, with
measured-like service times (:mod:`workbench.load.aa_sim`: prefill and decode costs of the embedded model on
this CPU, a per-request jitter and a per-run speed factor). Every direction claimed is a false one. Printed per
design: the share of trials that claimed a direction under

- old: one run per arm, requests paired across the two runs (t over request log ratios), and
- new: ``--rounds`` arrival seeds, one run per arm and seed, the interactive TTFT p90 per run, runs paired by
  seed (:func:`workbench.stats.replicates.paired_log_ratio`).

The new design should claim about 5% (at most 10%). No model is loaded and nothing is timed: a few seconds per
design. ``python benchmarks/aa_queue.py [--trials 200] [--rounds 5]``.
"""

import argparse

from workbench.load import aa_sim

DESIGNS = {
    "scheduling fcfs vs fcfs (mixed trace, 24 requests, load 0.9)": ("fcfs", aa_sim.Workload()),
    "scheduling sjf vs sjf (mixed trace, 24 requests, load 0.9)": ("sjf", aa_sim.Workload()),
    "scheduling lanes vs lanes (mixed trace, 24 requests, load 0.9)": ("lanes", aa_sim.Workload()),
    "serving one engine twice (one class, 40 requests, load 0.8)":
        ("fcfs", aa_sim.Workload(short_share=1.0, requests=40, load_factor=0.8)),
    "serving near the knee (one class, 40 requests, load 1.0)":
        ("fcfs", aa_sim.Workload(short_share=1.0, requests=40, load_factor=1.0)),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="A/A trials per design (>= 20)")
    ap.add_argument("--rounds", type=int, default=5, help="arrival seeds per trial in the new design")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.trials < 20:
        ap.error("--trials: at least 20")
    print(f"Queue A/A: share of {a.trials} trials claiming a direction (nominal 5%); new design: {a.rounds} seeds")
    print(f"{'design':<66} {'old':>6} {'new':>6}")
    for name, (policy, w) in DESIGNS.items():
        kw = {"lane_threshold_tokens": 16} if policy == "lanes" else {}
        share = aa_sim.aa_share(w, policy, a.trials, a.rounds, a.seed, **kw)
        flag = "" if share["new"] <= 0.10 else "  <- new design above 10%"
        print(f"{name:<66} {share['old']:>6.0%} {share['new']:>6.0%}{flag}")


if __name__ == "__main__":
    main()
