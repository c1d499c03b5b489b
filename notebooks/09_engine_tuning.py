# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   language_info:
#     name: python
#     pygments_lexer: ipython3
#   workbench:
#     config: workbench.experiments.engine_tuning:Config
# ---

# %% [markdown]
# # 09 Engine tuning: dtype, attention kernel, quantization, static cache + compile, threads
# The speed ladder's knobs, each measured beside its calibrated roofline prediction and checked by the quality
# guard (perplexity and KL divergence against the float32 eager reference on held-out English and Chinese text).
# A configuration that fails the guard is shown, marked, and never recommended.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # dtype of the notebook's model (drift probe, roofline calibration); the axis is dtypes
dtypes: list = ["float32", "bfloat16"]  # float32, bfloat16 on CPU; bfloat16, float16 on CUDA (the first is the baseline)
attn_implementations: list = ["sdpa", "eager"]  # attention kernels (eager, sdpa; flash/flex on CUDA)
cache_implementations: list = ["dynamic", "static"]  # KV cache: dynamic and/or static
compile: list = [False]  # [False], [True] or both: torch.compile the decode forward (needs static)
torch_threads: list = []  # intra-op threads to sweep on CPU (1..cores); empty: not an axis
quantizations: list = ["none"]  # none, int8_weight_only, int4_weight_only (torchao), int8_dynamic (torch.ao reference)
group_size: int = 64  # int4 weights per scale group (32, 64, 128, 256; must divide every layer's input width)
lm_head: str = "float"  # float (head kept in float) or quantize
batch_sizes: list = [1]  # workloads: batch sizes
prompt_tokens: list = [128]  # workloads: prompt lengths in tokens
max_new_tokens: int = 16  # fixed-length greedy outputs
guard_prompts: int = 2  # guard's greedy view: held-out prefixes (reported, not judged)
guard_tokens: int = 16  # greedy tokens per prefix
guard_text_tokens: int = 512  # held-out tokens per language (English, Chinese) for perplexity and KL
guard_window: int = 128  # tokens per window (the intervals are over windows)
max_perplexity_ratio: float = 1.05  # guard: upper 95% bound of perplexity / float32 perplexity
max_kl_mean: float = 0.05  # guard: upper 95% bound of mean KL(float32 || config), nats/token
slo_preset: str = "custom"  # a workbench.stats.slo preset, or custom (slo_ttft_s / slo_tpot_s)
slo_ttft_s: float = 2.0  # custom SLO on TTFT p50, seconds
slo_tpot_s: float = 0.25  # custom SLO on TPOT p50, seconds
search: str = "grid"  # grid (every configuration) or adaptive (coordinate descent, at most a third of the grid)
calibrate: bool = True  # fit the roofline per swept dtype when none is cached (~20 s each, once per machine)
order: str = "interleaved"  # interleaved (every configuration kept loaded) or blocks (one loaded at a time, A B B A)
repeats: int = 2  # rounds measured first: each round every configuration once plus the baseline again (A/A)
max_rounds: int = 8  # the most rounds, added only while a comparison with the baseline is undecided
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own; the suite's applies)
margin: float = 1.05  # equivalence margin: configurations within +-5% of the baseline are equivalent
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # base seed
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import engine_tuning

cfg = engine_tuning.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = engine_tuning.run(cfg, run, loaded, resume=resume)
configs = engine_tuning.configurations(points, cfg.slo())
configs[["config", "baseline", "status", "e2e_s_p50", "predicted_e2e_s", "speedup_vs_baseline", "compile_s", "recompiles",
         "perplexity_ratio", "perplexity_ratio_high", "kl_mean", "top1_agreement", "token_agreement", "guard_passed",
         "meets_slo", "eligible"]]

# %%
for name, fig in engine_tuning.figures(points, configs, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
search = engine_tuning.replay_search(configs, cfg.axes()) if cfg.search == "grid" else None
finding = engine_tuning.finding(configs, search, points, run)
results.save_finding(run, engine_tuning.EXPERIMENT, finding)
print(finding)
