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
#     config: workbench.experiments.batch_size:Config
# ---

# %% [markdown]
# # 01 Batch size: TTFT versus throughput
# How many requests should share one `generate` call? Larger batches raise output throughput and goodput
# until TTFT and per-token latency break the SLO; this notebook finds that point.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
batch_sizes: list = [1, 2, 4, 8]  # requests per generate call
prompt_tokens: list = [128, 512]  # prompt lengths in tokens, chat template included
max_new_tokens: int = 32  # new tokens per request
ignore_eos: bool = True  # fixed-length outputs: min_new_tokens set to max_new_tokens
temperature: float = 0.0  # 0 means greedy decoding
top_p: float = 1.0  # nucleus mass, (0, 1]
repeats: int = 2  # interleaved rounds measured before the first look (the design's minimum)
max_rounds: int = 8  # the most rounds, added while a comparison is undecided and the budget allows
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: batch sizes within +-5% throughput are equivalent
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # base seed (repeat r uses seed + r)
slo_ttft_s: float = 2.0  # goodput SLO on time to first token, seconds
slo_tpot_s: float = 0.25  # goodput SLO on time per output token, seconds
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import batch_size

cfg = batch_size.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = batch_size.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=batch_size.EXPERIMENT)
points[["point_id", "status", "ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "output_throughput_tps", "goodput_rps", "mbu"]]

# %%
for name, fig in batch_size.figures(points, requests, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
finding = batch_size.headline(points, requests, run)
results.save_finding(run, batch_size.EXPERIMENT, finding)
print(finding)
