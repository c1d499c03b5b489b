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
#     config: workbench.experiments.context_compression:Config
# ---

# %% [markdown]
# # 06 Context compression: what shrinking the input does to TTFT and to answer quality
# Strategy x target ratio x context length x needle depth on seeded passkey tasks over real text:
# compression ratio, compressor time, TTFT, total time, answer match, gold-answer log-likelihood and
# agreement with the uncompressed answer; a chat experiment compares lossless KV prefix reuse.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
strategies: list = ["none", "head_tail", "bm25", "dense", "prune", "summary"]  # none | head | tail | head_tail | bm25 | dense | summary | prune | kv_reuse
ratios: list = [2, 4]  # target compression ratios, original over compressed tokens, each at least 1
context_lengths: list = [512, 1024]  # haystack lengths in tokens (context only, template excluded)
depths: list = [0.1, 0.5, 0.9]  # needle position as a fraction of the context
task: str = "needle"  # needle (one passkey) | multikey (passkeys with similar-name distractors)
language: str = "en"  # en (Python docs haystack) | zh (Chinese haystack)
summary_lengths: list = [512]  # lengths where summary runs (largest ratio, middle depth); [] skips
chat_lengths: list = [512]  # chat-history lengths (fact in an early turn); [] skips the chat experiment
chat_strategies: list = ["none", "kv_reuse", "tail", "bm25"]  # strategies of the chat experiment
chunk_tokens: int = 64  # retrieval chunk size in tokens
max_new_tokens: int = 16  # answer length in tokens
ignore_eos: bool = True  # fixed-length answers, so total times compare like for like
temperature: float = 0.0  # 0 means greedy
repeats: int = 1  # passes over the tasks; 2+: one design, a round every arm on one task, none again as the A/A control (1: no pairs)
max_rounds: int = 8  # the most passes, added only while a strategy's total time against none is undecided
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own; the suite's applies)
margin: float = 1.05  # equivalence margin: a strategy within +-5% of none's total time is equivalent
warmup: int = 1  # untimed warm-up passes before the sweep
seed: int = 0  # task seed; repeat r samples with seed + r
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import context_compression

cfg = context_compression.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %% [markdown]
# Each point builds its task (seeded), compresses it (`compressor_s`), answers it with the model (TTFT,
# end-to-end) and scores the answer. Lossless strategies run once (ratio 1). Point columns: quality as
# `<metric>_mean` over the repeats, times and token counts as `<column>_p50`. With `repeats` >= 2 the points are one
# design: a round answers every (strategy, ratio, length) arm on one task (depth), the tasks in turn, and `none`
# again as the A/A control; each strategy's total time over `none`'s is the block analysis's (`time_ratio` with its
# simultaneous interval and verdict; figure `compression_time_ratio`), answer match paired over the same tasks.

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points, chat_points = context_compression.run(cfg, run, loaded, resume=resume)
results.save_finding(run, context_compression.EXPERIMENT, context_compression.finding(points, run))
points[["point_id", "status", "achieved_ratio_p50", "compressor_s_p50", "ttft_s_p50", "total_s_p50",
        "substring_match_mean", "gold_logprob_mean", "rouge_l_mean"]]

# %%
for name, fig in context_compression.figures(points, chat_points, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %% [markdown]
# Headlines: the context length at which each strategy starts to save total time over no compression
# (linear fit of total time vs length), and the quality each keeps at the largest ratio.

# %%
break_even = context_compression.break_even(points)
quality = context_compression.quality_at(points, ratio=max(cfg.ratios))
results.save_text(run, "tables/compression_break_even.csv", break_even.to_csv(index=False))
results.save_text(run, "tables/compression_quality.csv", quality.to_csv(index=False))
display(break_even)
display(quality)

# %%
if len(chat_points):
    display(chat_points[["strategy", "ratio", "context_tokens", "prefilled_tokens_p50", "ttft_s_p50",
                         "ttft_total_s_p50", "total_s_p50", "substring_match_mean", "gold_logprob_mean"]])
