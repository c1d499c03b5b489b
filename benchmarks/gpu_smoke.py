"""GPU smoke check: the measurement path on a CUDA machine, offline, in under 4 minutes.

Builds a Qwen3-style model with random weights (no download: the config is written here, the tokenizer is
the embedded default model's), runs a small batch-size sweep and a context-length sweep through the
experiments' own ``run`` into a run folder, then checks docs/design.md section 4's invariants:

- token counts: every request produced ``max_new_tokens`` ids (fixed length) and ``len(itl_s) == output_tokens - 1``;
- ``ttft_s <= e2e_s``, and ``ttft_s + sum(itl_s) == e2e_s`` (within 1 ms);
- per-point peak memory grows with batch size (same prompt length);

and prints MBU, MFU, energy per token (NVML), and the TTFT measured with CUDA synchronisation before the
clock vs without it (what an unsynchronised timer would report).

Run: ``python benchmarks/gpu_smoke.py`` (``--layers``, ``--keep`` to keep the run folder). On a machine
without CUDA it says so and exits 0. ``--device cpu`` runs the same path on a tiny model and tiny grids (about a
minute on 2 cores) to check the script itself without a GPU; the peak-memory check is then informational (the
CPU peak is the process's resident high-water mark, which never falls between points) and the sync/unsync
TTFT difference is zero by construction (CPU work is synchronous).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


#: Qwen3-style shapes: ``cuda`` about 175 M parameters at 8 layers (0.6B-like widths, fewer layers); ``cpu`` tiny.
SHAPES = {"cuda": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128),
          "cpu": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=32)}


def build_model(folder: Path, layers: int, device: str = "cuda") -> Path:
    """A Qwen3-style causal LM with random weights and the default model's tokenizer, saved to ``folder``."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from workbench.measure import models

    tok = AutoTokenizer.from_pretrained(models.default_model_dir())
    cfg = Qwen3Config(vocab_size=len(tok), num_hidden_layers=layers, **SHAPES[device], max_position_embeddings=16384,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def check(ok: bool, what: str, failures: list) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the random model (default 8)")
    ap.add_argument("--keep", action="store_true", help="keep the run folder and print its path")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a tiny model and grids, to check this script without a GPU (default cuda)")
    args = ap.parse_args(argv)
    import torch

    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA GPU on this machine; nothing to check (run it on a machine with an NVIDIA GPU)")
        return 0
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="workbench-gpu-smoke-"))
    os.environ["WORKBENCH_RESULTS"] = str(tmp / "results")
    from workbench.experiments import batch_size, context_length
    from workbench.measure import generation, models
    from workbench.run import results

    layers = args.layers if gpu else min(args.layers, 2)
    dtype = "bfloat16" if gpu else "float32"
    model_dir = build_model(tmp / "qwen3-random", layers, args.device)
    loaded = models.load_model(str(model_dir), device=args.device, dtype=dtype)
    print(f"model: Qwen3-style, {layers} layers, {loaded.info.num_params / 1e6:.0f} M params, random weights, "
          f"{dtype} on {loaded.info.device_name}")
    run = results.create_run("gpu-smoke")
    common = dict(model=str(model_dir), device=args.device, dtype=dtype, repeats=2 if gpu else 1, warmup=1 if gpu else 0)
    if gpu:
        bs_cfg = batch_size.Config(batch_sizes=[1, 4, 16, 64], prompt_tokens=[256], max_new_tokens=32, **common)
        cl_cfg = context_length.Config(batch_sizes=[1], context_tokens=[512, 2048, 8192], max_new_tokens=16, **common)
    else:
        bs_cfg = batch_size.Config(batch_sizes=[1, 2], prompt_tokens=[32], max_new_tokens=4, **common)
        cl_cfg = context_length.Config(batch_sizes=[1], context_tokens=[64, 128], max_new_tokens=4, **common)
    bs_pts = batch_size.run(bs_cfg, run, loaded)
    cl_pts = context_length.run(cl_cfg, run, loaded)
    req = results.read_requests(run)

    failures: list[str] = []
    print("invariants (docs/design.md section 4):")
    check(bool((bs_pts["status"] == "ok").all() and (cl_pts["status"] == "ok").all()), "every point ok", failures)
    want = req["experiment"].map({"batch_size": bs_cfg.max_new_tokens, "context_length": cl_cfg.max_new_tokens})
    check(bool((req["output_tokens"] == want).all()), "output_tokens == max_new_tokens (fixed length)", failures)
    n_itl = req["itl_s"].map(len)
    check(bool((n_itl == req["output_tokens"] - 1).all()), "len(itl_s) == output_tokens - 1", failures)
    check(bool((req["ttft_s"] <= req["e2e_s"]).all()), "ttft_s <= e2e_s", failures)
    gap = (req["ttft_s"] + req["itl_s"].map(sum) - req["e2e_s"]).abs()
    check(bool((gap < 1e-3).all()), f"ttft_s + sum(itl_s) == e2e_s (max gap {gap.max() * 1e3:.3f} ms)", failures)
    peaks = bs_pts.sort_values("batch_size")["peak_memory_bytes"].astype(float).tolist()
    grows = all(b >= a for a, b in zip(peaks, peaks[1:])) and peaks[-1] > peaks[0]
    check(grows or not gpu, "peak memory grows with batch: " + ", ".join(f"{p / 2**20:.0f}" for p in peaks) + " MiB"
          + ("" if gpu else " (CPU: process high-water mark, informational)"), failures)

    print("figures:")
    for _, r in bs_pts.sort_values("batch_size").iterrows():
        print(f"  batch {int(r.batch_size):>3}: MBU {r.get('mbu', math.nan):.3f}  MFU {r.get('mfu', math.nan):.3f}  "
              f"{r.output_throughput_tps:8.0f} tok/s  energy/token {r.get('energy_j_per_token', math.nan):.4f} J  "
              f"power {r.get('power_w_mean', math.nan):.0f} W")
    for _, r in cl_pts.sort_values("context_tokens").iterrows():
        print(f"  context {int(r.context_tokens):>5}: TTFT p50 {r.ttft_s_p50 * 1e3:.1f} ms  MFU {r.get('mfu', math.nan):.3f}  "
              f"energy/token {r.get('energy_j_per_token', math.nan):.4f} J")
    energy = results.read_manifest(run).get("energy", {}).get("batch_size", {})
    if not energy.get("available"):
        print(f"  energy: not measured ({energy.get('reason')})")

    # TTFT with vs without CUDA synchronisation before the clock (the rule of docs/design.md section 4)
    from workbench.inputs.prompts import build_batch
    from workbench.measure.generation import GenerationSettings, generate_measured

    prompts = build_batch(loaded.tokenizer, 16, 2048) if gpu else build_batch(loaded.tokenizer, 2, 64)
    settings = GenerationSettings(max_new_tokens=4, ignore_eos=True)
    generation.warm_up(loaded, prompts, settings, 1)

    def ttft(n=5):
        return sorted(generate_measured(loaded, prompts, settings).records[0]["ttft_s"] for _ in range(n))[n // 2]

    synced = ttft()
    real_sync = generation.synchronize
    generation.synchronize = lambda device_type: None
    try:
        unsynced = ttft()
    finally:
        generation.synchronize = real_sync
    print(f"  TTFT (batch {len(prompts)} prompts): synchronised {synced * 1e3:.2f} ms, unsynchronised {unsynced * 1e3:.2f} ms "
          f"(difference {(synced - unsynced) * 1e3:+.2f} ms)")

    wall = time.perf_counter() - t_start
    check(wall < 240, f"finished in {wall:.0f} s (< 240 s)", failures)
    if args.keep:
        print(f"run folder: {run}")
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    print("gpu_smoke: " + ("all checks passed" if not failures else f"{len(failures)} check(s) failed"))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
