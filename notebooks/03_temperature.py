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
#     config: workbench.experiments.temperature:Config
# ---

# %% [markdown]
# # 03 Temperature and top-p: length, repetition, quality and speed
# How do temperature (0 means greedy) and top-p change how long answers get, how often `max_new_tokens` truncates them, how repetitive they are, whether factual answers stay right, and what sampling costs in time? Long-form reports and short factual questions, English and Chinese, several seeded samples each, 95% intervals (Wilson for shares, Student t for scores).
#
# The settings are measured as one design (interleaved rounds): each round answers the same prompts once per setting
# (same seed), plus greedy a second time as the A/A control, in a shuffled order; rounds are added while the primary
# comparison is undecided (up to `max_rounds`). The primary comparison, the one that sets the finding's verdict, is
# the time per output token (TPOT) over greedy per family: what sampling costs the engine per token, analysed as a
# block design (rounds as blocks, simultaneous intervals; a direction, equivalent within the margin, or undecided with
# the rounds it would need). Secondary, each with its own verdict: the time per answer (e2e, which also carries the
# answers' length change) and the text outcomes over answers (truncation, repetition, length).

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
temperatures: list = [0.0, 0.7, 1.2]  # sampling temperatures; 0 means greedy
top_ps: list = [0.9, 1.0]  # nucleus masses in (0, 1]; unused when greedy
families: list = ["report", "factual"]  # prompt families: report (long-form) | factual (short answers)
languages: list = ["en", "zh"]  # prompt languages
n_report_prompts: int = 1  # report topics per language (1..8)
n_sections: int = 3  # sections each report is asked for
n_factual_prompts: int = 2  # factual questions per language (1..20)
max_new_tokens: int = 48  # new-token cap for reports
factual_max_new_tokens: int = 48  # new-token cap for factual answers (English ones end within ~36)
repeats: int = 2  # interleaved rounds before the first look; each round is one seeded sample per setting
max_rounds: int = 6  # the most rounds, added while the primary comparison is undecided and the budget allows
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: a TPOT within +-5% of greedy's is equivalent
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # base seed
perplexity: bool = True  # score each answer's perplexity under the model (temperature 1)
target_chars: int = 2000  # a target answer length in characters, turned into max_new_tokens per language
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import temperature

cfg = temperature.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %% [markdown]
# ## Target lengths in characters
# Characters per token of this model's tokenizer (measured on the English and Chinese sources) and the `max_new_tokens` a target length needs (10% margin).

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
temperature.length_targets(loaded.tokenizer, cfg.target_chars, cfg.languages)

# %%
points = temperature.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=temperature.EXPERIMENT)
results.save_text(run, "texts/temperature_samples.md", temperature.samples_markdown(requests))
points[["point_id", "status", "tpot_s_p50", "e2e_s_p50", "output_throughput_tps", "truncated_rate", "output_tokens_mean"]]

# %% [markdown]
# ## Quality with 95% intervals (Wilson for shares, t for scores)
# Per family, language, temperature and top_p; `truncated` is the share of answers cut by `max_new_tokens`.

# %%
summary = temperature.quality_summary(requests)
results.save_text(run, "quality_summary.csv", summary.to_csv(index=False))
results.save_finding(run, temperature.EXPERIMENT, temperature.finding(summary, requests, points))
temperature.headline(summary)

# %%
for name, fig in temperature.figures(summary, points, run).items():
    results.save_figure(run, name, fig)
    fig.show()
