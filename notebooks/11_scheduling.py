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
#     config: workbench.experiments.scheduling:Config
# ---

# %% [markdown]
# # 11 Scheduling policies and what a waiting user sees
# Interactive short chats and background long reports share one engine. Per policy (`fcfs`, `priority`,
# `sjf` with aging, `lanes` with a long-lane cap) the same requests arrive at the same times near the knee;
# TTFT and queue time per class, slowdown against length, the longest wait, the ETA each request was told
# against its actual wait, goodput per class under its own SLO, TTFT by turn of multi-turn conversations,
# the cache hit rate of prefix sharing next to the TTFT it saved (multi-turn and a shared-prefix group, the
# continuous engine with sharing off and on), and the policy to pick with its cost to the long requests.
# Set through `scheduling.Config` only (defaults): `abandon_share` 0, `patience_s` 30, `max_pending` none,
# `max_retries` 3, `trace` "" (generated). `benchmarks/scheduling.py` prints the short/long ratios side by side.
#
# The run is the unit under a queue: with `rounds` of 2 or more the policies are the arms of one design (fcfs the
# control, fcfs again the A/A arm), each round replaying one arrival trace under every arm on a fresh engine; the
# outcome is the interactive class's mean TTFT per run (the background class's mean e2e beside it), decided with
# three verdicts: faster / slower, equivalent within `margin`, or undecided with the rounds it would take. The
# prefix points measured with sharing off and on are a design of their own (the run's mean TTFT).
#
# Engine: `fifo` serves one request at a time, so near its knee a queue forms and the order a policy picks is
# what the short requests wait for. A `static` engine batches up to `max_batch_size` waiting requests: at the
# same load factor (of the one-at-a-time capacity) its batches raise the capacity, the queue rarely holds more
# than one batch, every waiting request joins the next batch whatever the order, and a short row still waits
# for the running batch's longest row, so the policies show no difference there (only a higher load would).

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
policies: list = ["fcfs", "priority", "sjf", "lanes"]  # workbench/serving/scheduling.py
engine: str = "fifo"  # fifo | static (continuous: the library's own FIFO admission)
requests_per_point: int = 16  # requests of the mixed workload per policy
short_share: float = 0.7  # share of interactive requests
short_prompt_tokens: list = [32, 48]  # interactive prompt lengths (uniform)
long_prompt_tokens: list = [64, 96]  # background prompt lengths (uniform)
short_max_tokens: int = 6  # interactive output tokens
long_max_tokens: int = 32  # background output tokens
load_factor: float = 0.9  # offered rate / one-at-a-time capacity on the mix
max_batch_size: int = 4  # static batch limit
batch_window_s: float = 0.05  # static batching window, seconds
aging_s: float = 20.0  # sjf / lanes: served in arrival order after this wait
lane_threshold_tokens: int = 16  # lanes: max_tokens at or above is long
long_cap: int = 1  # lanes: long requests at once
sjf_predictor: str = "proxy"  # sjf job size: proxy (max_tokens, prompt length) | fitted (on the engine's own history)
class_slo_ttft_s: dict = {"interactive": 2.0, "background": 30.0}  # TTFT SLO per class, seconds
turns: int = 3  # multi-turn point: turns per conversation (0: none)
conversations: int = 2  # multi-turn point: conversations at once
multiturn_prefix_sharing: list = [False]  # multi-turn / shared-prefix points; [false, true]: continuous, off / on
shared_prefix_tokens: int = 0  # a system document of this many tokens shared by every conversation and group request
prefix_group_requests: int = 0  # shared-prefix group: requests sharing the document, one after another (0: none)
rounds: int = 1  # replicate runs per arm, the designs' rounds before their first look (1: one run, nothing decided)
max_rounds: int = 8  # the most rounds, added while a comparison is undecided and the budget allows
prefix_rounds: int = None  # the prefix design's rounds before its first look (None: rounds)
budget_s: float = 0.0  # the most seconds each design's rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: arms within +-5% of their control are equivalent
aa_control: bool = False  # the A/A control: fcfs (and sharing off) run twice per round with the same seeds
warmup: int = 1  # untimed warm-up requests per class
seed: int = 0  # trace seed
engine_options: dict = {}  # other EngineOptions fields (workbench/serving/options.py), e.g. {max_seq_tokens: 512}
policy_options: dict = {}  # other PolicyOptions fields (workbench/serving/options.py)
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import scheduling

cfg = scheduling.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = scheduling.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=scheduling.EXPERIMENT)
scheduling.class_summary(requests)

# %%
for name, fig in scheduling.figures(points, requests, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
scheduling.recommend(points, requests)

# %%
scheduling.prefix_savings(points, requests)

# %%
finding = scheduling.finding(points, requests, run)
results.save_finding(run, scheduling.EXPERIMENT, finding)
print(finding)

# %% [markdown]
# ## The serving twin beside the measurement
# The twin (`workbench.predict.twin`: a prediction from this run's own calibration) beside the measured points,
# its error per point, and the finding saved again with where the two part most; `workbench simulate` runs the twin
# past this machine (rates, replicas, a device profile).

# %%
from workbench.share import figures_twin

twin_table = figures_twin.show_section(run, scheduling.EXPERIMENT, finding)
