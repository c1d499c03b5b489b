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
# # 09 Engine tuning: dtype, attention kernel, static cache + compile, threads
# Knobs that change speed without changing the model, each measured beside its calibrated roofline prediction
# and checked by a quality guard (greedy agreement and log-prob drift against the float32 eager reference).
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
batch_sizes: list = [1]  # workloads: batch sizes
prompt_tokens: list = [128]  # workloads: prompt lengths in tokens
max_new_tokens: int = 16  # fixed-length greedy outputs
guard_prompts: int = 3  # quality-guard prompts
guard_tokens: int = 16  # greedy tokens per guard prompt
min_token_agreement: float = 0.9  # guard: share of tokens identical to the reference
max_logprob_drift: float = 0.05  # guard: mean |log-prob drift| of the reference continuation, nats
slo_preset: str = "custom"  # a workbench.stats.slo preset, or custom (slo_ttft_s / slo_tpot_s)
slo_ttft_s: float = 2.0  # custom SLO on TTFT p50, seconds
slo_tpot_s: float = 0.25  # custom SLO on TPOT p50, seconds
search: str = "grid"  # grid (every configuration) or adaptive (coordinate descent, at most a third of the grid)
calibrate: bool = True  # fit the roofline per swept dtype when none is cached (~20 s each, once per machine)
repeats: int = 2  # timed repetitions per point
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
configs[["config", "status", "e2e_s_p50", "predicted_e2e_s", "speedup_vs_baseline", "compile_s",
         "token_agreement", "first_divergence", "logprob_drift", "guard_passed", "meets_slo", "eligible"]]

# %%
for name, fig in engine_tuning.figures(points, configs).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
search = engine_tuning.replay_search(configs, cfg.axes()) if cfg.search == "grid" else None
finding = engine_tuning.finding(configs, search, points)
results.save_finding(run, engine_tuning.EXPERIMENT, finding)
print(finding)
