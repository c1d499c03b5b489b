"""Does measuring slow what it measures? Workbench tokens/s versus plain ``model.generate``.

For each batch size, runs the same prompts and settings (fixed-length greedy
outputs) alternately through :func:`workbench.measure.generation.generate_measured`
(streamer + prefill hooks) and through ``model.generate`` with no streamer,
and prints the ratio of median output tokens/s (goal: >= 0.97), plus the MBU
measured at batch 1. Run: ``make benchmark`` or
``python benchmarks/overhead.py --batch-sizes 1 16 --max-new-tokens 64 --repeats 5``.
"""

import argparse
import statistics
import time

import torch

from workbench.inputs import prompts
from workbench.measure import device, models
from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured
from workbench.stats import metrics


def plain_tps(loaded, batch, settings) -> float:
    enc = encode_prompts(loaded.tokenizer, batch)
    cfg = settings.generation_config(loaded.model.generation_config)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(**enc, generation_config=cfg, pad_token_id=loaded.tokenizer.pad_token_id)
    wall = time.perf_counter() - t0
    return (out.shape[1] - enc["input_ids"].shape[1]) * len(batch) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    loaded = models.load_model("default", "cpu", "float32")
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    probe = device.probe_device("cpu", "float32")
    print(f"device {loaded.info.device_name}, threads {torch.get_num_threads()}, "
          f"probe {probe['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, {probe['flops_per_s'] / 1e9:.1f} GFLOP/s")
    for bs in args.batch_sizes:
        batch = prompts.build_batch(loaded.tokenizer, bs, args.prompt_tokens)
        generate_measured(loaded, batch, settings)  # warm-up
        plain, measured, tpots = [], [], []
        for _ in range(args.repeats):  # alternate so drift hits both equally
            plain.append(plain_tps(loaded, batch, settings))
            res = generate_measured(loaded, batch, settings)
            measured.append(sum(r["output_tokens"] for r in res.records) / res.wall_s)
            tpots.append(statistics.median(r["tpot_s"] for r in res.records))
        ratio = statistics.median(measured) / statistics.median(plain)
        line = (f"batch {bs:3d}: workbench {statistics.median(measured):7.1f} tok/s, plain generate "
                f"{statistics.median(plain):7.1f} tok/s, ratio {ratio:.3f}")
        if bs == 1:
            ctx = args.prompt_tokens + args.max_new_tokens / 2
            m = metrics.mbu(loaded.info.weight_bytes, loaded.info.kv_cache_bytes_per_token(), 1, ctx,
                            statistics.median(tpots), probe["bandwidth_bytes_per_s"])
            line += f", MBU {m:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
