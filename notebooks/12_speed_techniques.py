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
#     config: workbench.experiments.speed_techniques:Config
# ---

# %% [markdown]
# # 12 Speed techniques: prompt lookup, a draft model and int8 weights, each against its baseline
# Which of the three levers practitioners reach for makes decoding faster here, by how much (a 95% interval over repeats), at what quality cost, and where does it stop paying? Prompt-lookup decoding and assisted generation with a draft model run through `transformers`' `generate` on copy-heavy tasks built from the shipped documentation (summarise, extract, edit) and on free generation; int8 dynamic quantization runs with the quality guard (perplexity and KL divergence against float32 on held-out text). Speculative greedy decoding is exact: its output must equal plain greedy token for token. On the embedded model the draft is a layer-truncated copy of the model itself (the smallest of its family), reported for what it is.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
techniques: list = ["none", "prompt_lookup", "draft"]  # none (baseline, always run) | prompt_lookup | draft
draft_tokens: list = [4]  # draft tokens per verification step (k)
tasks: list = ["extract", "free"]  # summarise | extract | edit (copy-heavy) | free
languages: list = ["en"]  # en | zh
quantizations: list = ["none", "int8_dynamic"]  # none | int8_dynamic (torch's CPU kernels)
draft_model: str = "truncated"  # truncated (the model's first draft_layers layers) or a draft model with the same tokenizer
draft_layers: int = 10  # layers of the truncated draft
batch_size: int = 1  # assisted generation runs at batch 1 in transformers
passage_chars: int = 600  # characters of documentation in a copy-heavy prompt (Chinese: a third)
max_new_tokens: int = 32  # new-token cap (greedy)
repeats: int = 3  # rounds measured first: each round every point once plus the first baseline again (A/A); 1: each point on its own
max_rounds: int = 8  # the most rounds, added only while a comparison with its baseline is undecided
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own; the suite's applies)
margin: float = 1.05  # equivalence margin: a technique within +-5% of its baseline is equivalent (does not pay)
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # base seed
guard_prompts: int = 2  # int8 quality-guard prompts
guard_tokens: int = 16  # greedy tokens per guard prompt
guard_text_tokens: int = 512  # held-out tokens per language (English, Chinese) for perplexity and KL
guard_window: int = 128  # tokens per window (the guard's intervals are over windows)
max_perplexity_ratio: float = 1.05  # guard: upper 95% bound of perplexity / float32 perplexity
max_kl_mean: float = 0.05  # guard: upper 95% bound of mean KL(float32 || quantized), nats/token
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import speed_techniques as st

cfg = st.Config.from_namespace(globals())
run = results.open_run(run_dir)
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = st.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=st.EXPERIMENT)
points[["point_id", "status", "task", "language", "technique", "draft_tokens", "quantization", "tpot_s_p50", "e2e_s_p50"]]

# %% [markdown]
# ## Each technique against plain greedy float32
# Speed-up: baseline e2e over the technique's at a fixed output length, from the interleaved rounds analysed as one block design: a simultaneous 95% interval and its verdict (faster / slower, equivalent within the margin, or undecided with the rounds that would decide it). `output_agreement` compares the output with plain greedy token for token; acceptance columns: accepted draft tokens / proposed, mean ids per verification step, target forwards per output id, and the Leviathan et al. (2023) upper bound on the speed-up.

# %%
table = st.speed_table(points, requests)
results.save_text(run, "speed_techniques.csv", table.to_csv(index=False))
results.save_finding(run, st.EXPERIMENT, st.finding(table, points))
table

# %%
for name, fig in st.figures(points, table).items():
    results.save_figure(run, name, fig)
    fig.show()
