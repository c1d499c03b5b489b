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
#     config: workbench.experiments.explorer:Config
# ---

# %% [markdown]
# # 00 Explorer: try settings by hand, watch tokens arrive
# Pick a model, batch size, prompt length, sampling, reasoning budget and compression, press **Run**: the text streams in with live TTFT and tokens/s, and every run adds a point to the TTFT-vs-throughput figure. **Save points** writes them as a run folder (`workbench report` and `results.load()` read it). Without a frontend (papermill) it measures the parameters below once and shows static output.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
batch_size: int = 1  # requests per generate call
prompt_tokens: int = 128  # prompt length in tokens, chat template included
max_new_tokens: int = 32  # new tokens per request
ignore_eos: bool = False  # fixed-length outputs : min_new_tokens set to max_new_tokens
temperature: float = 0.0  # 0 means greedy
top_p: float = 1.0  # nucleus mass, (0, 1]
reasoning_budget: int = -1  # thinking-token cap (budget forcing); -1 means plain generation
compression: str = "none"  # none | head | tail | head_tail | bm25 | dense | summary | prune
compression_ratio: float = 4.0  # target original / compressed tokens (at least 1)
repeats: int = 1  # timed repetitions per point
warmup: int = 1  # untimed warm-up runs before a new shape
seed: int = 0  # base seed (repeat r uses seed + r)
mode: str = "auto"  # auto: widgets with a frontend, one static measurement without | widgets | static
run_dir: str = ""  # run folder for saved points (set by `workbench run`); empty: a new run on save
resume: bool = False  # unused here (the explorer has one point per run); kept for the CLI

# %%
from workbench.experiments.explorer import Config, Explorer

cfg = Config.from_namespace(globals())
explorer = Explorer(cfg, run_dir=run_dir)  # the run folder is opened on the first save

# %%
explorer.show()

# %% [markdown]
# The explored points as a table (run this cell again after exploring); `explorer.save()` does what the **Save points** button does.

# %%
explorer.frame()
