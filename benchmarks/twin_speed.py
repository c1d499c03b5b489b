"""The serving twin's speed (issue 34): a 1,000-request trace on 8 replicas, simulated seconds over wall seconds.

The trace: Poisson arrivals (seed 0) at ``--rate`` requests/s, prompts of 64-512 tokens and outputs of 16-256
tokens drawn uniformly (seed 0), on 8 ``continuous`` replicas behind the least-outstanding router, each with a
cost model of this CPU's magnitude (``--run RUN_DIR``: that run's calibration instead; default: decode steps of
about 0.1 s at batch 1, as the roofline's calibration measures on the 2-core build VM). The ratio printed is
the trace's virtual span (first arrival to last completion) over the wall time of :func:`workbench.predict.twin.simulate`
(the issue asks >= 1000x). One run of each engine; ``--repeats`` takes the median wall time. At the default rate
``fifo`` (one request at a time per replica) is past its knee: its queues grow to hundreds, and every operation of
the real :class:`~workbench.serving.scheduling.PolicyQueue` sorts what waits, so it simulates slowest.

Run on a quiet machine: ``python benchmarks/twin_speed.py`` (a few seconds).
"""

import argparse
import statistics
import time

import numpy as np

from workbench.predict import twin, twin_cost, twin_validation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", help="a run folder whose calibration to use")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--rate", type=float, default=1.5,
                    help="offered requests/s over all replicas (default: about 70%% of 8 continuous replicas)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cost = twin_validation.cost_for(args.run) if args.run else twin_cost.StepCost(
        a0=0.03, a1=4e-4, a2=1e-7, b0=0.09, b1=0.004, b2=2e-6, b3=0.09, source="benchmark default (CPU magnitude)")
    rng = np.random.default_rng(0)
    offs = twin.load.arrival_offsets("poisson", args.requests, args.rate, seed=0)
    rows = [{"offset_s": float(o), "prompt_tokens": int(rng.integers(64, 513)),
             "output_tokens": int(rng.integers(16, 257))} for o in offs]
    specs = twin.trace_specs(rows)
    print(f"{cost.describe()}; {args.requests} requests at {args.rate} req/s on {args.replicas} replicas")
    for engine in ("fifo", "static", "continuous"):
        cfg = twin.TwinConfig(engine=engine, replicas=args.replicas, router="least_outstanding")
        walls, res = [], None
        for _ in range(args.repeats):
            t = time.perf_counter()
            res = twin.simulate(cost, specs, cfg, "replay", rate=args.rate)
            walls.append(time.perf_counter() - t)
        wall = statistics.median(walls)
        print(f"{engine:>10}: simulated {res.simulated_s:9.1f} s in {wall:6.3f} s wall: {res.simulated_s / wall:9.0f}x "
              f"real time (e2e p50 {res.summary['e2e_s_p50']:.2f} s, kept up {res.summary['kept_up']})")


if __name__ == "__main__":
    main()
