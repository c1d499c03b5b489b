"""How well does the calibrated roofline predict this machine? Measured / predicted over the default CPU suite.

Calibrates (:func:`workbench.predict.roofline_calibration.calibrate`, cached per model/device/dtype/threads;
``--recalibrate`` forces a fresh fit and prints its wall time, budget < 30 s), then measures every (batch size, prompt length,
output length) point of the default suite's batch-size and context-length notebooks (``suites/default.yaml``,
notebooks 01 and 02: the same grid the suite runs; ``--batch-sizes`` / ``--prompt-tokens`` replace it) with
fixed-length greedy outputs (one warm-up, ``--repeats`` timed runs) and prints, per point, measured and
predicted TTFT and TPOT, then the median ``|measured/predicted - 1|`` for TTFT and TPOT (target <= 15%) and the
points outside 30% with the bound the model gives. The calibration's own error is quoted out of sample
(leave-one-workload-out over its six workloads), with the in-sample figure beside it. Run it on a quiet machine (~3 min on 2 CPU cores):
``OMP_WAIT_POLICY=PASSIVE python benchmarks/roofline.py --recalibrate``
(``--dtype bfloat16`` checks the bfloat16 calibration; ``--notebooks 01`` only the batch-size grid).
"""

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from workbench.inputs import prompts
from workbench.measure import models
from workbench.measure.generation import GenerationSettings
from workbench.predict import predictions, roofline_calibration
from workbench.run import sweeps
from workbench.stats import metrics

SUITE = Path(__file__).resolve().parents[1] / "suites" / "default.yaml"
NOTEBOOKS = {"01": ("batch_sizes", "prompt_tokens"), "02": ("batch_sizes", "context_tokens")}


def suite_grid(notebooks=("01", "02")) -> list[tuple[int, int, int]]:
    """``(batch, prompt tokens, max_new_tokens)`` of the default suite's notebooks 01 and 02, in suite order."""
    import yaml

    out: list[tuple[int, int, int]] = []
    for e in yaml.safe_load(SUITE.read_text())["notebooks"]:
        nb = Path(e["notebook"]).name[:2]
        if nb in notebooks:
            b_key, l_key = NOTEBOOKS[nb]
            p = e["parameters"]
            for L in p[l_key]:
                for B in p[b_key]:
                    if (B, L, p["max_new_tokens"]) not in out:
                        out.append((B, L, int(p["max_new_tokens"])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebooks", nargs="+", default=["01", "02"], choices=sorted(NOTEBOOKS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", help="replace the suite grid (with --prompt-tokens)")
    ap.add_argument("--prompt-tokens", type=int, nargs="+")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="with --batch-sizes / --prompt-tokens")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--recalibrate", action="store_true")
    args = ap.parse_args()
    if args.batch_sizes or args.prompt_tokens:
        grid = [(B, L, args.max_new_tokens) for L in args.prompt_tokens or [64, 256] for B in args.batch_sizes or [1, 4]]
    else:
        grid = suite_grid(tuple(args.notebooks))
    loaded = models.load_model("default", "cpu", args.dtype)
    info = loaded.info
    small = ({} if args.dtype == "float32"
             else {"repeats": 1, "trials": 3, "runs": roofline_calibration.CALIBRATION_RUNS_SMALL})
    # a cached calibration is checked against today's probe and refitted when off by more than 15%
    cached = None if args.recalibrate else roofline_calibration.checked_cached(info.path, "cpu", info.dtype,
                                                                               torch.get_num_threads(), loaded, **small)
    # as engine_tuning calibrates bf16
    dev, calib = cached if cached else roofline_calibration.calibrate(loaded, **small)
    print(f"device {info.device_name}, {info.dtype}, threads {torch.get_num_threads()}, probe "
          f"{dev.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {dev.flops_per_s / 1e9:.1f} GFLOP/s; calibration "
          f"{'cached' if cached else f'{calib.calibration_s:.1f} s (budget 30 s)'}: prefill "
          f"{calib.prefill_overhead_s * 1e3:.1f} ms + roofline/{calib.prefill_efficiency:.2f}; decode step "
          f"{calib.step_overhead_s * 1e3:.1f} ms + {calib.step_row_overhead_s * 1e3:.1f} ms/row + roofline with KV "
          f"traffic {calib.kv_traffic:.1f}x; ttft extra {calib.ttft_overhead_s * 1e3:.1f} ms"
          f"{'; ' + calib.check if calib.check else ''}", flush=True)
    print(f"calibration error over its {calib.workloads} workloads, median |predicted/measured - 1|: "
          f"leave-one-workload-out TTFT {calib.loo_ttft_error:.1%}, TPOT {calib.loo_tpot_error:.1%} "
          f"(in-sample, not a measure of accuracy: TTFT {calib.in_sample_ttft_error:.1%}, "
          f"TPOT {calib.in_sample_tpot_error:.1%})", flush=True)
    pred = roofline_calibration.Predictor(roofline_calibration.shape_of(info), dev, calib)
    rows = []
    t0 = time.perf_counter()
    for B, L, n in grid:
        batch = prompts.build_batch(loaded.tokenizer, B, L)
        out = sweeps.measure_generation(loaded, batch, GenerationSettings(max_new_tokens=n, ignore_eos=True),
                                        args.repeats, 1)
        req = pd.DataFrame(out.requests)
        p = pred.predict(B, int(req["prompt_tokens"].mean()), n)
        row = {"point_id": f"prompt_tokens={L},batch_size={B},max_new_tokens={n}",
               "ttft_s_p50": metrics.percentiles(req["ttft_s"])["p50"],
               "tpot_s_p50": metrics.percentiles(req["tpot_s"])["p50"], **p}
        row["ttft_ratio"] = row["ttft_s_p50"] / p["predicted_ttft_s"]
        row["tpot_ratio"] = row["tpot_s_p50"] / p["predicted_tpot_s"]
        rows.append(row)
        print(f"{row['point_id']}: TTFT {row['ttft_s_p50']:.3f} s vs {p['predicted_ttft_s']:.3f} predicted "
              f"({row['ttft_ratio']:.2f}x, prefill {p['prefill_bound']}-bound), TPOT {row['tpot_s_p50'] * 1e3:.1f} ms "
              f"vs {p['predicted_tpot_s'] * 1e3:.1f} ({row['tpot_ratio']:.2f}x, decode {p['decode_bound']}-bound)",
              flush=True)
    print(f"\n{len(rows)} points measured in {time.perf_counter() - t0:.0f} s")
    print(predictions.residual_summary(predictions.residual_table(pd.DataFrame(rows))))


if __name__ == "__main__":
    main()
