"""The ``workbench simulate`` arguments (issue 34), apart from :mod:`workbench.predict.twin_study` (what the command
runs) so that building the command line's parser imports nothing heavy (no pandas)."""

from __future__ import annotations


def add_arguments(p) -> None:
    """The ``simulate`` sub-command's arguments (called by :func:`workbench.cli.build_parser`)."""
    p.add_argument("--run", metavar="RUN_DIR", help="calibrate on this run (its twin_calibration.json or its rows)")
    p.add_argument("--calibration", metavar="FILE", help="a twin_calibration.json (someone else's shared run)")
    p.add_argument("--device-profile", metavar="bandwidth=B,flops=F",
                   help="what-if device (bytes/s, FLOP/s) or a JSON file; needs --model-config")
    p.add_argument("--model-config", metavar="config.json", help="the what-if model's config.json")
    p.add_argument("--dtype", default="bfloat16", help="the what-if model's dtype (default bfloat16)")
    p.add_argument("--validate", metavar="RUN_DIR", help="simulate every measured serving/scheduling point of a run "
                   "and write twin_validation.csv and the MAPE into its metrics.json")
    p.add_argument("--engines", default="fifo,static,continuous",
                   help="comma-separated engines to simulate: fifo, static, continuous (default: all three)")
    p.add_argument("--policies", default="fcfs", help="fcfs,priority,sjf,lanes (more than fcfs: notebook 11's mix)")
    p.add_argument("--scheduling-engine", default="fifo", help="engine of the policies' mixed workload")
    p.add_argument("--load-factor", type=float, default=0.9, help="mixed workload: rate over one-at-a-time capacity")
    p.add_argument("--arrival", default="poisson", help="constant, poisson or gamma")
    p.add_argument("--rates", default="", help="comma-separated offered rates (req/s); default: a sweep as notebook 08")
    p.add_argument("--sweep-points", type=int, default=3,
                   help="open-loop rates between the simulated synchronous and throughput rates (without --rates)")
    p.add_argument("--trace", help="replay a JSONL trace (offset_s, prompt_tokens, output_tokens)")
    p.add_argument("--requests", type=int, default=200, help="requests per point")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="prompt tokens of each request (default: --run's notebook 08 setting, else 64)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="output tokens of each request (default: --run's notebook 08 setting, else 16)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="rows an engine batches at most (default: --run's notebook 08 setting, else 8)")
    p.add_argument("--batch-window-s", type=float, default=None,
                   help="static engine: seconds it waits to fill a batch (default: --run's setting, else 0.05)")
    p.add_argument("--max-pending", type=int, default=None, help="admission limit per replica (429 beyond)")
    p.add_argument("--prefix-sharing", action="store_true", help="continuous engine's prefix cache")
    p.add_argument("--max-batch-tokens", type=int, default=512, help="continuous: tokens per forward step")
    p.add_argument("--page-size", type=int, default=32, help="continuous: cache page tokens (prefix sharing's unit)")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas behind the router (default 1)")
    p.add_argument("--router", default="round_robin",
                   help="round_robin, least_outstanding or prefix_affinity (workbench.predict.twin.ROUTERS)")
    p.add_argument("--capacity", action="store_true", help="search the max rate per SLO preset (--slo)")
    p.add_argument("--slo", default="", help="comma-separated presets (default: all)")
    p.add_argument("--target", type=float, default=0.9, help="SLO attainment target")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals (same seed: same trace, same result)")
    p.add_argument("--confirm", type=int, default=0, metavar="K",
                   help="then measure the K most interesting points (knee, the rate past it) for real and print the "
                        "twin's error on them (loads --model)")
    p.add_argument("--confirm-requests", type=int, default=12, help="requests per confirmed point")
    p.add_argument("--model", default="default", help="the model --confirm measures")
    p.add_argument("--out", metavar="RUN_DIR", help="write the simulated points and rows into this run folder")
