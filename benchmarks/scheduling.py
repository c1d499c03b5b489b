"""Scheduling policies side by side in one run, at one offered load near the knee of the mixed workload (issue 24).

The mixed workload of :mod:`workbench.experiments.scheduling` (interactive short chats and background long
reports, Poisson arrivals): the service alone of each class is measured once on an idle engine, the offered rate
is ``--load-factor`` times the one-at-a-time capacity on the mix (0.9: just under the knee of a ``fifo`` engine;
a ``static`` engine's batching raises its knee, so ``--engine static`` needs a higher factor to queue). The same
requests at the same times are then replayed under ``fcfs``, ``sjf`` and ``lanes``, once per round on that round's
arrival seed (a fresh engine per run, the order rotating so drift of the shared machine does not favour one
policy), and the script prints, over fcfs, with the run as the unit (one statistic per run, runs paired by round,
:func:`workbench.stats.replicates.paired_log_ratio`):

- the interactive (short) requests' TTFT p90 under ``sjf`` and under ``lanes`` (the gain), and
- the background (long) requests' e2e p50 under each (the cost),

each with its 95% t interval over the rounds (beside it, for comparison only, the old interval over requests paired
across runs, which claims a direction far too often: ``benchmarks/aa_queue.py``), plus the longest wait and the
median ETA error per policy.

Run on a quiet machine: ``OMP_WAIT_POLICY=PASSIVE python benchmarks/scheduling.py`` (estimated 3-6 minutes on a
2-core CPU: 12 runs of 12 requests at about 0.5-1 request/s, plus the calibration) or ``--quick`` (about 1 minute; a smoke run, not a result). A negative result is a result: on 2 cores
a static batch of short rows is not much faster than one long row's steps, so ``lanes`` can show no gain; the
script says "no difference beyond noise" when the interval includes 1. ``--sjf-predictor fitted`` orders ``sjf`` by a
least-squares fit of the service time on prompt and output tokens from the engine's own finished requests
(:class:`workbench.serving.scheduling.ServiceFit`) instead of the plain proxy: run both to compare them.
"""

import argparse
import os

import numpy as np
import pandas as pd

from workbench.experiments import scheduling
from workbench.load import traces
from workbench.measure import models
from workbench.stats import classes, evidence, metrics, replicates

QUICK = dict(requests=6, rounds=2, long_max_tokens=16)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 1 minute: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--engine", default="fifo", choices=list(scheduling.ENGINES))
    ap.add_argument("--requests", type=int, default=12, help="requests of the mixed workload per policy and round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (arrival seeds) of the three policies (rotating order)")
    ap.add_argument("--load-factor", type=float, default=0.9, help="offered rate / one-at-a-time capacity on the mix")
    ap.add_argument("--short-max-tokens", type=int, default=6)
    ap.add_argument("--long-max-tokens", type=int, default=32)
    ap.add_argument("--lane-threshold", type=int, default=16)
    ap.add_argument("--aging-s", type=float, default=30.0)
    ap.add_argument("--sjf-predictor", default="proxy", choices=["proxy", "fitted"],
                    help="sjf's job size: max_tokens and prompt length, or a fit on the engine's own history")
    ap.add_argument("--max-batch-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    return a


def main():
    a = parse_args()
    policies = ["fcfs", "sjf", "lanes"]
    cfg = scheduling.Config(policies=policies, engine=a.engine, requests_per_point=a.requests, load_factor=a.load_factor,
                            short_max_tokens=a.short_max_tokens, long_max_tokens=a.long_max_tokens,
                            lane_threshold_tokens=a.lane_threshold, aging_s=a.aging_s, max_batch_size=a.max_batch_size,
                            sjf_predictor=a.sjf_predictor, turns=0, seed=a.seed, device="cpu", dtype="float32")
    loaded = models.load_model("default", "cpu", "float32")
    cal = traces.calibrate(loaded, cfg)
    rows_in = traces.trace_rows(cfg, cal["rate_rps"])
    print(f"engine {a.engine}; service alone: " + ", ".join(f"{c} {s:.2f} s" for c, s in cal["alone_s"].items())
          + f"; offered {cal['rate_rps']:.2f} req/s (load factor {a.load_factor}); {len(rows_in)} requests per run "
          f"x {a.rounds} rounds (arrival seed {a.seed} + round, a fresh engine per run)")
    tables, runs = [], []
    for k in range(a.rounds):
        rows_k = traces.trace_rows(cfg, cal["rate_rps"], k)
        for p in policies[k % 3:] + policies[: k % 3]:
            rows, res, _ = traces.run_policy(loaded, cfg, p, rows_k, cal["alone_s"])
            df = pd.DataFrame(rows).assign(policy=p, workload="mixed", round=k,
                                           request_id=lambda d: d["request_id"] + k * len(rows_in))
            tables.append(df)
            ok = df[df["error"].isna()]
            runs.append({"policy": p, "round": k,
                         "short": metrics.percentiles(ok.loc[ok["request_class"] == "interactive", "ttft_s"], (90,))["p90"],
                         "long": metrics.percentiles(ok.loc[ok["request_class"] == "background", "e2e_s"], (50,))["p50"]})
            print(f"  round {k} {p}: stopped early: {res.summary['stopped_early']}, wall {res.summary['wall_s']:.1f} s")
    req = pd.concat(tables, ignore_index=True)
    summ = classes.class_summary(req).set_index(["policy", "request_class"])
    per_run = pd.DataFrame(runs)

    def stat(p, c, col):
        return summ.loc[(p, c), col] if (p, c) in summ.index else float("nan")

    def by_round(p, col):
        return per_run[per_run["policy"] == p].set_index("round")[col].sort_index()

    # the run is the unit: one statistic per run, runs paired by round (workbench.stats.replicates); the requests of one
    # run paired across policies are not independent (benchmarks/aa_queue.py), shown beside it for comparison only
    print("\nratio over fcfs   short TTFT p90 (runs paired by round, 95%)   long e2e p50 (runs paired, 95%)   "
          "[old: short TTFT paired by request]")
    for p in ("sjf", "lanes"):
        short = replicates.paired_log_ratio(by_round(p, "short"), by_round("fcfs", "short"))
        long = replicates.paired_log_ratio(by_round(p, "long"), by_round("fcfs", "long"))
        old = classes.paired_ratio(req, p, "ttft_s", "interactive")
        print(f"  {p:<14} {replicates.describe(*short):>30} {replicates.verdict(*short[1:]):<26} "
              f"{replicates.describe(*long):>24}   [{evidence.describe_ratio(old, 'old')}]")
    print("\nper policy: longest wait (s), median |ETA error| (s), short TTFT p90 (s), long e2e p50 (s)")
    for p in policies:
        g = req[req["policy"] == p]
        err = metrics.percentiles(np.abs(pd.to_numeric(g["eta_error_s"], errors="coerce")), (50,))["p50"]
        print(f"  {p:<6} {pd.to_numeric(g['queue_s'], errors='coerce').max():8.2f} {err:10.2f} "
              f"{stat(p, 'interactive', 'ttft_s_p90'):10.2f} {stat(p, 'background', 'e2e_s_p50'):10.2f}")
    print(f"\ncommand: OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '')} python benchmarks/scheduling.py "
          f"--engine {a.engine} --requests {a.requests} --rounds {a.rounds} --load-factor {a.load_factor} "
          f"--sjf-predictor {a.sjf_predictor}")


if __name__ == "__main__":
    main()
