"""The speed ladder on this machine: every rung side by side in one run (issue 33).

Rungs (``--rungs``, :mod:`workbench.techniques.rungs`): float32 eager (the baseline), static cache, static cache +
``torch.compile``, bfloat16 (where the CPU computes it natively; said when not), torchao int8 weight-only
(+ compile), torchao int4 weight-only at group sizes the model's widths take, and ``torch.ao``'s dynamic int8
as a labelled reference. Batch 1, ``--max-new-tokens`` greedy tokens with ``ignore_eos``.

Method:

- Speed: one design (:mod:`workbench.run.design`): every rung once per round, in a fresh seeded order each round,
  after each compiled rung's compile call and warm-up (timed apart as ``compile_s``), float32 eager measured again
  as the A/A arm; ``--rounds`` rounds first, more up to ``--max-rounds`` while a rung is undecided (alpha spent over
  the looks, :mod:`workbench.stats.sequential`). A rung's decode tok/s ratio over float32 eager is the block
  analysis's (rounds as blocks, one pooled variance, Dunnett's simultaneous intervals over every rung and the A/A
  arm; :mod:`workbench.stats.blocks`), with its verdict: faster / slower, equivalent within +-5%, or undecided.
  The recommendation (:func:`workbench.techniques.rungs.recommend`) is a rung decided faster than float32 eager, the
  best of those inside the quality tolerance, compared with its runner-up; none when the A/A control moved.
- MBU: the bytes each rung really reads per step (weights as stored, :func:`workbench.techniques.rungs.step_weight_bytes`,
  plus the KV cache) x steps/s / the probed copy bandwidth.
- Quality (:mod:`workbench.measure.guard`): perplexity ratio and mean KL divergence against float32 on the shipped
  held-out English and Chinese text, teacher-forced top-1 agreement, greedy agreement; a compiled rung shares
  its uncompiled twin's weights, so its figures are the twin's.
- Where the time goes (:mod:`workbench.predict.profile_step`): one decode step of the float32, best-quantized and
  compiled rungs split into matrix-vector work, attention, norms/activations, sampling and overhead, beside
  the roofline's bytes-at-bandwidth time; written as a stacked bar (``--out``).
- llama.cpp: when its server is built (``make llama-server``), its batch-1 decode tok/s on the same GGUF
  through its HTTP server (:mod:`benchmarks.external_endpoint`'s start) over float32 eager's in-process figure,
  in the same rounds; skipped with the reason otherwise.

Run on a quiet machine: ``python benchmarks/ladder.py`` (``make benchmark``); a tiny check:
``python benchmarks/ladder.py --tiny``.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from workbench.errors import ParameterError
from workbench.inputs.prompts import build_batch
from workbench.measure import guard, models
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.predict import profile_step, roofline
from workbench.run import design
from workbench.share import ladder as ladder_figures
from workbench.techniques import rungs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNGS = ["float32", "float32+static", "float32+static+compile", "bfloat16", "int8_weight_only",
                 "int8_weight_only+head", "int8_weight_only+head+static+compile", "int4_weight_only/g64",
                 "int4_weight_only/g64+head", "int4_weight_only/g32", "int8_dynamic", "int8_dynamic+head"]
TINY_RUNGS = ["float32", "float32+static+compile", "bfloat16", "int8_weight_only", "int4_weight_only/g64",
              "int8_dynamic"]


def parse_rung(text: str) -> tuple[str, rungs.Rung]:
    """``float32``, ``bfloat16+static``, ``int8_weight_only+head+static+compile``, ``int4_weight_only/g32`` ->
    ``(dtype, Rung)``; ``+head`` quantizes ``lm_head`` too (else it stays float); quantized rungs run on float32
    weights."""
    parts = text.split("+")
    head, flags = parts[0], set(parts[1:])
    group = 64
    if "/g" in head:
        head, g = head.split("/g")
        group = int(g)
    dtype, quant = (head, "none") if head in ("float32", "bfloat16") else ("float32", head)
    unknown = flags - {"static", "compile", "head"}
    if unknown:
        raise ParameterError(f"--rungs: {text!r}: unknown flag(s) {', '.join(sorted(unknown))} (static, compile, head)")
    cache = "static" if flags & {"static", "compile"} else "dynamic"
    return dtype, rungs.Rung(quantization=quant, group_size=group, cache_implementation=cache,
                             compile="compile" in flags, lm_head="quantize" if "head" in flags else "float")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rungs", nargs="+", default=None, help=f"default: {' '.join(DEFAULT_RUNGS)}")
    ap.add_argument("--model", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="rounds measured first (the design's minimum)")
    ap.add_argument("--max-rounds", type=int, default=10, help="the most rounds, added while a rung is undecided")
    ap.add_argument("--guard-tokens", type=int, default=2048, help="held-out tokens per language")
    ap.add_argument("--guard-window", type=int, default=256)
    ap.add_argument("--profile-steps", type=int, default=8)
    ap.add_argument("--llama-python", default=str(REPO / ".venv-llama" / "bin" / "python"))
    ap.add_argument("--out", default=None, help="folder for ladder.csv, ladder_profile.csv and the figure")
    ap.add_argument("--tiny", action="store_true", help="a quick check: 6 rungs, 8 tokens, 2 rounds, 256 guard tokens")
    a = ap.parse_args()
    if a.tiny:
        a.rungs = a.rungs or TINY_RUNGS
        a.max_new_tokens, a.rounds, a.guard_tokens, a.guard_window, a.profile_steps = 8, 2, 256, 64, 2
        a.max_rounds = 2
    a.rungs = a.rungs or DEFAULT_RUNGS
    return a


def _decode_tps(loaded, prompts, settings, kw) -> float:
    res = generate_measured(loaded, prompts, settings, generate_kwargs=kw)
    return statistics.median(r["decode_tps"] for r in res.records)


def _llama(args, threads: int, log):
    """llama.cpp's server and a function returning one request's decode tok/s, or ``(None, reason)``."""
    if not Path(args.llama_python).exists():
        return None, None, f"llama.cpp not built ({args.llama_python} missing; make llama-server)"
    sys.path.insert(0, str(REPO / "benchmarks"))
    import external_endpoint as ee

    from workbench.load import endpoint, load

    port = ee._free_port()
    proc = ee.start_llama(args.llama_python, port, threads, log)
    ee._wait(f"http://127.0.0.1:{port}/v1/models", proc)
    ep = endpoint.Endpoint.from_param({"url": f"http://127.0.0.1:{port}", "model": ee.ALIAS, "name": "llama.cpp",
                                       "extra_body": {"min_tokens": args.max_new_tokens}})
    spec = [load.RequestSpec("Count from 1 to 200, separated by commas.", args.max_new_tokens)]

    def one() -> float:
        return load.run_load(endpoint.sender(ep), spec, "synchronous").rows[0]["decode_tps"]

    one()  # warm-up
    return proc, one, ""


def main() -> None:
    args = parse_args()
    specs = {name: parse_rung(name) for name in args.rungs}
    if "float32" not in specs:
        specs = {"float32": parse_rung("float32"), **specs}
    threads = torch.get_num_threads()
    f32 = models.load_model(args.model, "cpu", "float32")
    bf16_ok, bf16_why = rungs.bf16_support("cpu")
    print(f"model {f32.info.name}, {threads} threads; {bf16_why}", flush=True)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    prompts = build_batch(f32.tokenizer, 1, args.prompt_tokens)

    built, info = {}, {}
    for name, (dtype, rung) in specs.items():
        base = f32 if dtype == "float32" else models.load_model(args.model, "cpu", dtype)
        try:
            b = rungs.build(base, rung)
        except ParameterError as exc:
            print(f"{name}: refused: {exc}", flush=True)
            continue
        kw = rungs.generate_kwargs(rung.cache_implementation, rung.compile, "cpu")
        row = {"rung": name, "dtype": dtype, **b.columns(), "compile_s": float("nan"), "recompiles": float("nan")}
        if rung.compile:
            before = rungs.compiled_graphs()
            t0 = time.perf_counter()
            generate_measured(b.loaded, prompts, settings, generate_kwargs=kw)
            row["compile_s"] = time.perf_counter() - t0
            generate_measured(b.loaded, prompts, settings, generate_kwargs=kw)  # warm-up at the timed shape
            row["compile_graphs"] = rungs.compiled_graphs() - before
            row["graphs_before_rounds"] = rungs.compiled_graphs()
        else:
            generate_measured(b.loaded, prompts, GenerationSettings(max_new_tokens=4, ignore_eos=True),
                              generate_kwargs=kw)  # warm-up
        built[name] = (b, kw)
        info[name] = row
        print(f"built {name}: {row['quantized_layers']} layers quantized, {row['skipped_layers']} left float, "
              f"{row['weight_bytes'] / 1e6:.0f} MB read per step"
              + (f", compile {row['compile_s']:.1f} s" if rung.compile else ""), flush=True)

    log = tempfile.NamedTemporaryFile("w", prefix="ladder-llama-", suffix=".log", delete=False)
    llama_proc, llama_one, llama_reason = _llama(args, threads, log)
    arms = list(built) + (["llama.cpp"] if llama_one else [])
    decode = design.Outcome("decode_tps", True, "decode tokens/s", "ratio")

    def measure(arm, rnd):
        if arm == "llama.cpp":
            return design.Measured({"decode_tps": llama_one()})
        b, kw = built[arm]
        return design.Measured({"decode_tps": _decode_tps(b.loaded, prompts, settings, kw)})

    ladder = design.Design("ladder", arms, "float32", decode, min_rounds=args.rounds,
                           max_rounds=max(args.max_rounds, args.rounds))
    try:
        result = design.run_design(ladder, measure)
    finally:
        if llama_proc is not None:
            llama_proc.terminate()
            llama_proc.wait(timeout=30)
    for name, row in info.items():
        if "graphs_before_rounds" in row:
            row["recompiles"] = rungs.compiled_graphs() - row.pop("graphs_before_rounds")
    an = result.analysis
    tps = {a: result.table.loc[result.table["arm"] == a, "decode_tps"].tolist() for a in [*arms, design.AA]}
    bw = roofline.Device.probe("cpu", "float32", trials=3).bandwidth_bytes_per_s
    ref = guard.reference(f32, tokens=args.guard_tokens, window=args.guard_window, greedy_prompts=2, greedy_tokens=16)
    judged = {}
    rows = []
    for name, row in info.items():
        b, kw = built[name]
        key = (row["dtype"], row["quantization"], row["lm_head"],
               row["group_size"] if row["quantization"] == "int4_weight_only" else 0)
        if key not in judged:
            judged[key] = guard.judge(b.loaded, ref)
        g = judged[key]
        steps_per_s = statistics.median(tps[name])
        kv = b.loaded.info.kv_cache_bytes_per_token() * (args.prompt_tokens + args.max_new_tokens / 2)
        d = an.arms.get(name) if an is not None else None
        nan = float("nan")
        row.update(decode_tps=steps_per_s, ratio=d.estimate if d else 1.0, ratio_low=d.low if d else nan,
                   ratio_high=d.high if d else nan, verdict=(d.verdict + (f" ({d.direction})" if d.direction else ""))
                   if d else "the baseline", mbu=(row["weight_bytes"] + kv) * steps_per_s / bw,
                   **{k: g[k] for k in guard.COLUMNS})
        rows.append(row)
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    aa = an.aa_decision if an is not None else None
    print(f"\nbatch 1, {args.max_new_tokens} greedy tokens (ignore_eos), {result.rounds} interleaved rounds "
          f"(stopped: {result.stopped}), {threads} threads; {an.evidence() if an is not None else 'no analysis'}; "
          f"A/A control (float32 vs itself): {aa.describe('A/A') if aa else 'none'}")
    print(f"quality: {ref.windows and len(ref.windows)} held-out windows of {args.guard_window} tokens (en + zh); "
          f"guard: upper 95% bounds of perplexity ratio <= {guard.MAX_PERPLEXITY_RATIO}, mean KL <= {guard.MAX_KL_MEAN}")
    print(table[["rung", "decode_tps", "ratio", "ratio_low", "ratio_high", "mbu", "compile_s", "recompiles",
                 "perplexity_ratio", "perplexity_ratio_high", "kl_mean", "top1_agreement", "token_agreement",
                 "guard_passed"]].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for name in info:
        note = rungs.grid_note(f32, built[name][0].rung)
        if note:
            print(f"{name}: {note}")
    if llama_one and an is not None and "llama.cpp" in an.arms:
        print("llama.cpp (Q4_1 GGUF, its HTTP server) / float32 eager (in process): "
              + an.arms["llama.cpp"].describe("decode tok/s", words=("faster", "slower")))
    else:
        print(f"llama.cpp: skipped: {llama_reason}")

    eligible = table.loc[table["guard_passed"].astype(bool) & (table["rung"] != "float32"), "rung"].tolist()
    pick, sentence = rungs.recommend(an, eligible) if an is not None else (None, "no analysis: fewer than 2 rounds")
    quant = table[table["quantization"] != "none"].sort_values("ratio", ascending=False)
    to_profile = ["float32"] + ([quant.iloc[0]["rung"]] if len(quant) else []) + \
        [n for n in table["rung"] if "compile" in n][:1]
    prof_rows = []
    for name in dict.fromkeys(to_profile):
        b, kw = built[name]
        p = profile_step.profile_decode_step(b.loaded, args.prompt_tokens, args.profile_steps, kw, repeats=3)
        p["roofline_s"] = profile_step.roofline_step_s(b.loaded, args.prompt_tokens + 1, bw)
        prof_rows.append({"rung": name, **p})
    prof = pd.DataFrame(prof_rows)
    print("\nwhere one decode step goes (ms):")
    print((prof.set_index("rung")[list(profile_step.COMPONENTS) + ["profiled_step_s", "step_s", "roofline_s"]] * 1e3).to_string(
        float_format=lambda v: f"{v:.2f}"))
    top = prof.set_index("rung").loc["float32", list(profile_step.COMPONENTS)].astype(float).idxmax()
    print(f"\n{sentence}; float32's largest component is {profile_step.LABELS[top]}")
    if pick is not None and not pick.keeps_control and pick.decided:
        best = table.set_index("rung").loc[pick.pick]
        print(f"{pick.pick}: {guard.describe(best)}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "ladder.csv", index=False)
        prof.to_csv(out / "ladder_profile.csv", index=False)
        llama_step = 1 / statistics.median(tps["llama.cpp"]) if llama_one and tps.get("llama.cpp") else None
        ladder_figures.fig_profile(prof, llama_step).write_html(out / "ladder_profile.html", include_plotlyjs=True)
        print(f"wrote {out}/ladder.csv, ladder_profile.csv, ladder_profile.html")


if __name__ == "__main__":
    main()
