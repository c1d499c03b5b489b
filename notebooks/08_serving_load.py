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
#     config: workbench.experiments.serving_load:Config
# ---

# %% [markdown]
# # 08 Serving under load: engines, arrival processes, SLO attainment and the knee
# Requests arrive at a rate; an engine (`fifo` one at a time, `static` batching window, `continuous`
# batching from `transformers`) schedules them. Per engine: synchronous, maximum throughput, then open-loop
# rates between; TTFT and TPOT against achieved throughput, goodput and SLO attainment against offered rate
# with the knee, queue time, a per-request timeline and time slices, and the engine to pick per SLO preset.
# The engines compared under one load (with `repeats` of 2 or more): each round runs every engine of
# `compare_engines` once on the same arrival trace at `compare_load` times the control's one-at-a-time rate, a fresh
# engine per run, and the control again as the A/A arm; the run is the unit, its TTFT p50 the outcome (its output
# throughput beside), decided with three verdicts: faster / slower, equivalent within `margin`, or undecided with the
# rounds it would take.
# Set through `serving_load.Config` only (defaults): `burstiness` 1.0 (gamma shape), `warmup_s` / `cooldown_s` 0
# (excluded windows), `search_steps` 4, `search_tolerance` 0.1. `benchmarks/serving.py` runs the SLO search.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
engines: list = ["fifo", "static", "continuous"]  # schedulers to compare; "endpoint": the external endpoint below
endpoint: dict = None  # external OpenAI-compatible server: {url, model, api_key_env (a variable's NAME), name}
transport: str = "inprocess"  # inprocess (engine directly) | http (through the server)
requests_per_point: int = 12  # requests per load point
closed_loop_requests: int = None  # requests of the synchronous and throughput points (None: requests_per_point)
synchronous_requests: int = None  # requests of the synchronous point alone (None: closed_loop_requests)
prompt_tokens: int = 64  # prompt tokens, chat template included
max_new_tokens: int = 16  # fixed output length (ignore_eos)
max_batch_size: int = 8  # batch limit of static and continuous
batch_window_s: float = 0.05  # static batching window, seconds
sweep_points: int = 2  # open-loop rates between synchronous and maximum
arrival: str = "poisson"  # constant | poisson | gamma
slice_s: float = 2.0  # time-slice width, seconds
max_in_flight: int = 32  # over-saturation: stop above this many in flight
max_wait_s: float = 60.0  # over-saturation: stop when one waits longer, seconds
slo_presets: list = ["interactive_chat", "code_completion", "rag", "batch_offline", "mlperf_server", "mlperf_interactive"]  # workbench/stats/slo.py
slo_ttft_s: float = 2.0  # custom SLO: TTFT limit, seconds
slo_tpot_s: float = 0.25  # custom SLO: TPOT limit, seconds
attainment_target: float = 0.9  # share of requests that must meet an SLO
search: bool = False  # bisection search for the highest rate meeting search_slo
search_slo: str = "custom"  # preset for the search (or custom)
rounds: int = 1  # replicate runs of the open-loop points: round k uses arrival seed seed + k, a fresh engine per run
aa_control: bool = False  # the A/A control: the first engine's open-loop points twice per round (the noise floor)
compare_engines: list = ["fifo", "static", "continuous"]  # engines compared under one load (with 2 or more repeats)
compare_control: str = "fifo"  # the comparison's control, run again each round as the A/A arm
compare_requests: int = 8  # requests per comparison run (and of the control's synchronous probe)
compare_load: float = 4.0  # the comparison's offered rate / the control's one-at-a-time rate (4: a burst)
compare_arrival: str = "constant"  # the comparison's arrivals: constant (the same every round) | poisson | gamma
repeats: int = 1  # comparison rounds before its first look (1: no comparison; each round: every engine once)
max_rounds: int = 8  # the most comparison rounds, added while an engine's comparison is undecided
budget_s: float = 0.0  # the most seconds the comparison's rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: engines within +-5% of the control's TTFT p50 are equivalent
warmup: int = 1  # untimed warm-up batches per engine
seed: int = 0  # arrival-schedule seed
engine_options: dict = {}  # other EngineOptions fields (workbench/serving/options.py), e.g. {max_seq_tokens: 512}
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.run import results
from workbench.experiments import serving_load

cfg = serving_load.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %%
serving_load.check_targets(cfg)  # an external endpoint: one-line errors before anything loads
loaded = serving_load.load_for(cfg)  # the model, or the tokenizer alone for an endpoint-only run
points = serving_load.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=serving_load.EXPERIMENT)
points[["point_id", "status", "offered_rps", "request_throughput_rps", "ttft_s_p50", "tpot_s_p50", "queue_s_p50",
        "slo_attainment", "goodput_rps", "stopped_early"]]

# %%
for name, fig in serving_load.figures(points, requests, cfg.attainment_target, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
serving_load.recommend(points, cfg.attainment_target)

# %%
finding = serving_load.finding(points, cfg.attainment_target, run)
results.save_finding(run, serving_load.EXPERIMENT, finding)
print(finding)

# %% [markdown]
# ## The serving twin beside the measurement
# The twin (`workbench.predict.twin`: a prediction from this run's own calibration) beside the measured rates,
# its error per point, and the finding saved again with where the two part most; `workbench simulate` runs the twin
# past this machine (rates, replicas, a device profile).

# %%
from workbench.share import figures_twin

twin_table = figures_twin.show_section(run, serving_load.EXPERIMENT, finding)
