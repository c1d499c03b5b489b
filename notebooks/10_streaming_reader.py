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
#     config: workbench.experiments.streaming_reader:Config
# ---

# %% [markdown]
# # 10 Streaming to a reader: proxies, keep-alive, and what the reader sees
# The reader part times each greedy answer as displayed at several granularities: time to first word and to
# first complete sentence, stalls over 250 ms, the longest stall, and the margin over a stated reading speed
# (English 238 words/min, Brysbaert 2019; Chinese 255 characters/min, IReST 2012). The proxy part puts a real
# nginx between client and server: buffering on (buffers of `nginx_buffer_kb`, larger than the answer, as a
# production config with large `proxy_buffers` has), on with nginx's default one-page buffers, off, and on
# with the server's `X-Accel-Buffering: no`. nginx sends a buffer when it is full or the upstream ended, so
# buffering turns TTFT into end-to-end latency (or into "a page of tokens"); the header restores it. That
# needs nginx's default `proxy_http_version 1.0`: with 1.1 the chunked upstream is passed on chunk by chunk.
# The paths are one design (with 2 or more `repeats` and `direct` among them): each round streams the same request
# along every path, and `direct` a second time as the A/A control, in a shuffled order; rounds are added (up to
# `max_rounds`, within `budget_s`) while the leading mode's comparison is undecided. Each mode's client TTFT over
# direct comes from one block analysis of the rounds with three verdicts: slower / faster, equivalent within
# `margin`, or undecided with the rounds it would take; a moved A/A control leaves it undecided. One repeat
# measures each path on its own and decides nothing.
# The keep-alive part shows a client read timeout on a queued request, with and without `: keep-alive`.
# With `endpoint` set, all three parts run against that OpenAI-compatible server and no weights load: the reader
# part times the chunks it sends (a chunk may carry several tokens: granularity `chunk`, `N chunks`, `T ms`), the
# keep-alive part measures it as it is, and the server-side columns it does not report stay empty, said so.

# %% tags=["parameters"]
model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id
device: str = "auto"  # auto | cpu | cuda | mps
dtype: str = "auto"  # auto | float32 | bfloat16 | float16
max_new_tokens: int = 64  # tokens per request (greedy, fixed length)
languages: list = ["en", "zh"]  # prompts of the reader part
granularities: list = ["token", "4 tokens", "100 ms"]  # display granularities of the reader part
proxy_modes: list = ["direct", "buffering_default", "buffering_on", "buffering_off", "header"]  # paths
nginx_buffer_kb: int = 64  # proxy_buffer_size and 8 proxy_buffers of this size (KiB), all modes but default
nginx_upstream_http: str = "1.0"  # nginx proxy_http_version to the server: 1.0 (nginx default) | 1.1
client_timeout_s: float = 1.0  # the keep-alive part's client read timeout, seconds
keepalive_s: float = 0.25  # the server's keep-alive comment interval in that part, seconds
blocker_tokens: int = 48  # length of the request the probe queues behind (0: skip the keep-alive part)
stall_s: float = 0.25  # a gap between display updates longer than this is a stall, seconds
endpoint: dict = None  # every part against an external OpenAI-compatible server: {url, model, api_key_env, name}
repeats: int = 2  # timed requests per point (proxy part: the design's rounds before its first look, 2 or more)
max_rounds: int = 8  # proxy part: the most rounds, added while the leading mode's comparison is undecided
budget_s: float = 0.0  # proxy part: the most seconds its rounds may take (0: no budget of its own)
margin: float = 1.05  # equivalence margin: paths within +-5% client TTFT of direct are equivalent
warmup: int = 1  # untimed warm-up requests per proxy path
seed: int = 0  # base seed
run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/
resume: bool = False  # skip points this run already finished

# %%
from workbench.run import results
from workbench.experiments import streaming_reader

cfg = streaming_reader.Config.from_namespace(globals())
run = results.open_run(run_dir)
nginx, reason = streaming_reader.nginx_status()
print(f"nginx: {nginx}" if nginx else f"nginx part skipped: {reason}")
run

# %%
streaming_reader.check_targets(cfg)  # an external endpoint: one-line errors before the model loads
loaded = streaming_reader.load_for(cfg)  # the model, or with an endpoint the tokenizer alone (no weights)
points = streaming_reader.run(cfg, run, loaded, resume=resume)
requests = results.read_requests(run, experiment=streaming_reader.EXPERIMENT)
streaming_reader.proxy_table(requests)

# %%
for name, fig in streaming_reader.figures(points, requests, run).items():
    results.save_figure(run, name, fig)
    fig.show()

# %%
finding = streaming_reader.finding(requests, points)
results.save_finding(run, streaming_reader.EXPERIMENT, finding)
print(finding)
