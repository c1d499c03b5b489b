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
#     config: workbench.experiments.long_output:Config
# ---

# %% [markdown]
# # 07 Long output: one shot, or outline then sections
# At one total token budget, compare writing a long text in one request, as an outline plus all sections in one
# batch, and as an outline plus sections one after another (each given a summary of the previous): wall time,
# time to first visible text, length, section coverage, repetition across sections, throughput. A strategy row
# merges several requests, so its waits are `first_text_s` and `wall_s`; `batch_size` counts the requests that
# shared a forward pass (the sections decoded together), and `tpot_s` is per request, never per merged text.
#
# Design (issue 49): with `repeats` >= 2 the strategies are measured as one design (each round writes every (language,
# strategy) text once and the first language's `one_shot` again, the A/A control, in a shuffled order; rounds are added
# while a comparison is undecided, up to `max_rounds`). The primary outcome is the wall time over `one_shot`, analysed as
# a block design (rounds as blocks, simultaneous intervals). The finding names the fastest strategy per language and
# decides it against `one_shot` and against its runner-up (a direction, equivalent within the margin, or undecided with
# the rounds it would need); `one_shot` itself is kept only when every other strategy is slower beyond noise or
# equivalent. The time to first visible text is secondary, with its own verdict. One repeat measures point by point and
# decides nothing.
#
# CPU defaults (2 cores, SmolLM2-135M): a 256-token budget and 4 sections, English and Chinese, 2-4 rounds, 5-10 minutes;
# a GPU user passes e.g. `budget_tokens: 4096, n_sections: 8`. Generated texts are saved under `texts/` in the run folder.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
budget_tokens: int = 256  # total new tokens per text, equal for every strategy (GPU: 4096)
n_sections: int = 4  # sections asked for
outline_tokens: int = 0  # outline budget; 0 means about 12 per section, at most a quarter of the budget
strategies: list = ["one_shot", "outline_batch", "outline_sequential"]  # strategies compared
languages: list = ["en", "zh"]  # prompt languages
topic_en: str = "How a city can prepare for a long heat wave"  # English article title
topic_zh: str = "城市如何应对持续的高温天气"  # Chinese article title
temperature: float = 0.0  # 0 is greedy
repeats: int = 2  # rounds before the first look: each text once per round, with the A/A control (1: point by point)
max_rounds: int = 4  # the most rounds, added while a comparison is undecided and the budget allows
budget_s: float = 0.0  # the most seconds the rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: strategies within +-5% of one another's wall time are equivalent
warmup: int = 1  # untimed warm-up runs before the first point
seed: int = 0  # base seed (repeat r uses seed + r)
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from IPython.display import Markdown

from workbench.measure import models
from workbench.run import results
from workbench.experiments import long_output

cfg = long_output.Config.from_namespace(globals())
run = results.open_run(run_dir)
plan = cfg.plan()
run, plan

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = long_output.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run)
results.save_finding(run, long_output.EXPERIMENT, long_output.finding(requests, points, run))
long_output.request_table(requests)

# %%
for name, fig in long_output.figures(requests, points, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
for lang in cfg.languages:
    for s in cfg.strategies:
        path = run / "texts" / f"long_output_{s}_{lang}_r0.md"
        if path.exists():
            display(Markdown(f"**{s} ({lang})**: `{path.name}`\n\n" + path.read_text()[:600]))
