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
#     config: workbench.experiments.reasoning_budget:Config
# ---

# %% [markdown]
# # 05 Reasoning budget: thinking tokens versus latency and answer quality
# Cap (and optionally extend) the thinking segment with budget forcing, then measure what each budget B costs in time to first answer token, end-to-end latency and throughput, and what it buys in accuracy and gold-answer likelihood.
#
# The budgets are measured as one design (interleaved rounds): a round is one chunk of the tasks that every budget
# answers once (same tasks, same seed), plus the smallest budget a second time as the A/A control, in a shuffled order;
# rounds are added while the primary comparison is undecided (up to `max_rounds`). The primary comparison, the one that
# sets the finding's verdict, is the time to first answer token over the smallest budget per batch size, analysed as a
# block design (rounds as blocks, simultaneous intervals; a direction, equivalent within the margin, or undecided with
# the rounds it would need). Accuracy is secondary, with its own verdict: the same tasks answered under two budgets are
# pairs (McNemar's exact test), and more tasks, not more rounds, decide it.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
budgets: list = [0, 16, 64]  # thinking-token budgets B; 0 means no thinking
batch_sizes: list = [1, 4]  # requests per generate call
min_budget: int = 0  # minimum thinking tokens for every B > 0, the s1 Wait extension
answer_tokens: int = 24  # answer allowance after the end of thinking, tokens
num_tasks: int = 8  # seeded tasks per point (the same tasks at every point)
languages: list = ["en", "zh"]  # task languages
task_kinds: list = ["arithmetic", "counting", "logic"]  # multi-step kinds; one-step: lookup, copy, list_count
thinking: str = "auto"  # auto | native (<think> tokens) | emulated (text delimiters)
temperature: float = 0.0  # 0 means greedy decoding
top_p: float = 1.0  # nucleus mass, (0, 1]
stop_at_newline: bool = True  # end an answer at the end of its line
repeats: int = 1  # passes over the tasks before the first look (each pass: one round per chunk of tasks)
max_rounds: int = 6  # the most rounds (chunks), added while the primary comparison is undecided and the budget allows
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: a time to first answer within +-5% of the smallest budget's is equivalent
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # task and sampling seed (repeat r uses seed + r)
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from IPython.display import Markdown

from workbench.measure import models
from workbench.run import results
from workbench.experiments import reasoning_budget as exp

cfg = exp.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = exp.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=exp.EXPERIMENT)
results.save_finding(run, exp.EXPERIMENT, exp.finding(points, requests))
points[["point_id", "status", "thinking_mode", "thinking_tokens_mean", "ttft_s_p50", "ttfat_s_p50", "e2e_s_p50",
        "output_throughput_tps", "exact_match_mean", "gold_logprob_mean", "answer_truncated_rate"]]

# %% [markdown]
# TTFAT and e2e should grow about linearly with B (each thinking token is one decode step); TTFT should not. Quality is shown with 95% intervals over tasks (Wilson for accuracy, Student t for log-likelihood).

# %%
for name, fig in exp.figures(points, requests, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
summary = exp.quality_summary(requests)
summary.pivot_table(index=["reasoning_budget", "batch_size"], columns="metric", values=["mean", "ci_low", "ci_high"])

# %%
results.save_text(run, "reasoning/examples.md", exp.examples_markdown(requests))
display(Markdown(exp.examples_markdown(requests, per_budget=1)))  # rendered here; a headless run's console stays quiet
