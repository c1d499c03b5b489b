"""How well does the calibrated roofline predict this machine? Measured / predicted over a small CPU grid.

Calibrates (:func:`workbench.roofline.calibrate`, cached per model/device/dtype/threads; ``--recalibrate``
forces a fresh fit), then measures every (batch size, prompt length) point with fixed-length greedy outputs
(one warm-up, ``--repeats`` timed runs) and prints, per point, measured and predicted TTFT and TPOT, then the
median ``|measured/predicted - 1|`` for TTFT and TPOT (target <= 15%) and the points outside 30% with the bound
the model gives. Run:
``OMP_WAIT_POLICY=PASSIVE python benchmarks/roofline.py --batch-sizes 1 4 --prompt-tokens 64 256 --max-new-tokens 16``.
"""

import argparse
import time

import pandas as pd
import torch

from workbench import metrics, models, prompts, roofline, sweeps
from workbench.generation import GenerationSettings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--recalibrate", action="store_true")
    args = ap.parse_args()
    loaded = models.load_model("default", "cpu", "float32")
    info = loaded.info
    cached = None if args.recalibrate else roofline.load_cached(info.path, "cpu", info.dtype, torch.get_num_threads())
    t0 = time.perf_counter()
    dev, calib = cached if cached else roofline.calibrate(loaded)
    print(f"device {info.device_name}, threads {torch.get_num_threads()}, probe {dev.bandwidth_bytes_per_s / 1e9:.1f} GB/s, "
          f"{dev.flops_per_s / 1e9:.1f} GFLOP/s; calibration {'cached' if cached else f'{time.perf_counter() - t0:.1f} s'}: "
          f"prefill {calib.prefill_overhead_s * 1e3:.1f} ms + roofline/{calib.prefill_efficiency:.2f}, "
          f"step {calib.step_overhead_s * 1e3:.1f} ms + roofline/{calib.decode_efficiency:.2f}, "
          f"ttft extra {calib.ttft_overhead_s * 1e3:.1f} ms", flush=True)
    pred = roofline.Predictor(roofline.shape_of(info), dev, calib)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    rows = []
    for L in args.prompt_tokens:
        for B in args.batch_sizes:
            batch = prompts.build_batch(loaded.tokenizer, B, L)
            out = sweeps.measure_generation(loaded, batch, settings, args.repeats, 1)
            req = pd.DataFrame(out["requests"])
            p = pred.predict(B, int(req["prompt_tokens"].mean()), args.max_new_tokens)
            row = {"point_id": f"prompt_tokens={L},batch_size={B}",
                   "ttft_s_p50": metrics.percentiles(req["ttft_s"])["p50"],
                   "tpot_s_p50": metrics.percentiles(req["tpot_s"])["p50"], **p}
            row["ttft_ratio"] = row["ttft_s_p50"] / p["predicted_ttft_s"]
            row["tpot_ratio"] = row["tpot_s_p50"] / p["predicted_tpot_s"]
            rows.append(row)
            print(f"{row['point_id']}: TTFT {row['ttft_s_p50']:.3f} s vs {p['predicted_ttft_s']:.3f} predicted "
                  f"({row['ttft_ratio']:.2f}x), TPOT {row['tpot_s_p50'] * 1e3:.1f} ms vs "
                  f"{p['predicted_tpot_s'] * 1e3:.1f} ({row['tpot_ratio']:.2f}x), {p['bound']}-bound", flush=True)
    print(roofline.residual_summary(roofline.residual_table(pd.DataFrame(rows))))


if __name__ == "__main__":
    main()
