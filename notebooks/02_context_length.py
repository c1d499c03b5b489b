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
#     config: workbench.experiments.context_length:Config
# ---

# %% [markdown]
# # 02 Context length: prefill scaling, decode slow-down and KV-cache memory
# How do TTFT, prefill and per-token decode time grow with prompt length L, how well does `prefill_s = a + b*L + c*L^2` describe prefill (and where does the quadratic attention term take over), how big is the KV cache, and where does a long prompt make batching stop paying?

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
context_tokens: list = [128, 512, 1024, 1536, 2048]  # prompt lengths L (template included); at least 5 for the quadratic fit
batch_sizes: list = [1, 4]  # requests per generate call
max_new_tokens: int = 8  # new tokens per request (at least 2, so TPOT exists)
ignore_eos: bool = True  # fixed-length outputs : min_new_tokens set to max_new_tokens
source: str = "en"  # prompt text: en (Python docs) | zh (Chinese essays) | random (token ids)
repeats: int = 3  # rounds measured first: each round every point once, interleaved, plus the A/A control (1: each point on its own)
max_rounds: int = 8  # the most rounds, added only while the fit's decision on the quadratic term is open
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own; the suite's applies)
margin: float = 1.05  # equivalence margin: a quadratic term within +-5% of prefill at the longest length is "none"
warmup: int = 1  # untimed warm-up runs before the first point of each batch size
seed: int = 0  # base seed (repeat r uses seed + r)
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
import pandas as pd

from workbench.measure import models
from workbench.run import results
from workbench.experiments import context_length

cfg = context_length.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = context_length.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=context_length.EXPERIMENT)
requests = requests[requests["output_tokens"] >= 1]
points[["point_id", "status", "ttft_s_p50", "prefill_s_p50", "tpot_s_p50", "output_throughput_tps"]]

# %% [markdown]
# ## Prefill fit
# A fit with errors proportional to the prefill (the noise is a share of each value) over the valid points of each batch size, every round's values over the round's own level (the rounds as blocks: a round the machine slowed cancels). Decided: the fit at the longest length over its straight part `a + bL`, the share attention's quadratic term carries there (a direction, equivalent within the margin, or undecided with the rounds it needs); a crossover `L = b/c` only within the measured lengths. A quadratic needs 5 lengths (3 parameters + 2).

# %%
fits = context_length.fits(points, requests, run)
ttft_fits = context_length.fits(points, requests, run, outcome="ttft_s")
fit_table = pd.concat([context_length.fits_table(fits, "prefill_s"), context_length.fits_table(ttft_fits, "ttft_s")])
results.save_text(run, "context_fit.json", fit_table.to_json(orient="records", indent=1))
fit_table

# %%
for name, fig in context_length.figures(points, requests, fits, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %% [markdown]
# ## KV cache: computed from the config vs measured
# Computed: 2 x layers x kv_heads x head_dim x bytes x tokens x batch. Measured: memory growth while the cache is live (CUDA allocated bytes; on CPU, process RSS, an upper-bound estimate).

# %%
kv = points[points["status"] == "ok"][["batch_size", "context_tokens", "kv_bytes_computed", "kv_bytes_measured", "memory_kind"]].copy()
kv["computed_MiB"] = kv["kv_bytes_computed"] / 2**20
kv["measured_MiB"] = kv["kv_bytes_measured"] / 2**20
kv["measured/computed"] = kv["kv_bytes_measured"] / kv["kv_bytes_computed"]
kv

# %%
finding = context_length.finding(points, requests, run)
results.save_finding(run, context_length.EXPERIMENT, finding)
print(finding)
