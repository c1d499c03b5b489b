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
#     config: workbench.experiments.streaming_anatomy:Config
# ---

# %% [markdown]
# # 04 Streaming anatomy: what the user waits for
# TTFT, inter-token latency and decode speed for short / medium / long outputs, streaming versus waiting for the
# whole answer, display granularity, and what a real OpenAI-compatible HTTP stream adds.
#
# The finding's decision: does decoding slow as the output grows? The output lengths are measured as one design
# (interleaved rounds: each round every length once and the shortest again, the A/A control, in a shuffled order; rounds
# added while undecided, up to `max_rounds`), and the time per output token of the longest over the shortest is
# decided as a block design: slower or faster (a direction), equivalent within the margin, or undecided with the rounds
# it would need. That streaming shows the first token long before the whole answer is reported as a measurement: it
# cannot come out the other way, so it is not counted as a decision.
#
# CPU defaults (2 cores, SmolLM2-135M): 32 / 128 / 384 new tokens instead of 64 / 256 / 1024, 2-4 rounds, so the whole
# notebook stays under about 4 minutes; a GPU user passes e.g. `output_tokens: [500, 2000, 5000]`.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
output_tokens: list = [32, 128, 384]  # new tokens per request: short / medium / long (GPU: [500, 2000, 5000])
batch_size: int = 1  # requests per generate call in the anatomy points
prompt: str = "Explain how a refrigerator keeps food cold."  # anatomy prompt (user message)
ignore_eos: bool = True  # fixed-length anatomy outputs (min_new_tokens equals max_new_tokens)
temperature: float = 0.0  # 0 is greedy
top_p: float = 1.0  # nucleus mass, (0, 1]
granularities: list = ["token", "4 tokens", "16 tokens", "100 ms", "500 ms"]  # display update policies
granularity_tokens: int = 64  # new tokens per request in the granularity / timeline batch
timeline_batch: int = 4  # requests in that batch (English and Chinese prompts, natural lengths)
http: bool = True  # run the OpenAI-compatible HTTP serving experiment
http_concurrency: list = [1, 4]  # streaming requests sent together, one point each
http_tokens: int = 32  # max_tokens of each HTTP request (fixed length)
repeats: int = 2  # rounds of the output lengths before the first look; timed repeats of the other points
max_rounds: int = 4  # the most rounds of the output lengths, added while their comparison is undecided
budget_s: float = 0.0  # the most seconds those rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: a TPOT within +-5% of the shortest output's is equivalent
warmup: int = 1  # untimed warm-up runs per point
seed: int = 0  # base seed (repeat r uses seed + r)
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.measure import models
from workbench.run import results
from workbench.experiments import streaming_anatomy

cfg = streaming_anatomy.Config.from_namespace(globals())
run = results.open_run(run_dir)
run

# %% [markdown]
# Three sweeps, one run:
#
# - **streaming**: one point per output length; every token id is timed as it is produced, and an every-token
#   display is attached to record when text first becomes visible.
# - **granularity**: the same batch displayed every token, every N tokens and every T ms side by side. Fewer
#   updates cost display lag; every granularity must concatenate to the final decode exactly (`text_equal`).
# - **http**: a server on a loopback port (`workbench.serving.server`, requests queued through one worker)
#   driven by the official `openai` client. The client's first text chunk minus the engine's first text
#   (arrival to first text handed to the response, queueing included) is what HTTP, SSE framing and the client
#   add. A chunk is not a token: gaps between chunks are `chunk_itl_s`, the client's `tpot_s` is over the decode
#   steps between its first and last chunk, and `batch_size` is 1 (the server serves one request at a time).

# %%
loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)
points = streaming_anatomy.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run)
results.save_finding(run, streaming_anatomy.EXPERIMENT, streaming_anatomy.finding(points, requests))
streaming_anatomy.anatomy_table(points)

# %%
table = streaming_anatomy.granularity_table(requests)
assert table["text_equal"].all(), "a granularity lost or changed text"
table

# %%
streaming_anatomy.transport_table(requests) if cfg.http else None

# %%
for name, fig in streaming_anatomy.figures(requests, points, run).items():
    results.save_figure(run, name, fig)
    fig.show()
