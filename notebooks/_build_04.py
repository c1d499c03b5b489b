"""Write notebooks/04_streaming_anatomy.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_04.py"""
import _nb
import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# 04 Streaming anatomy: what the user waits for\n"
       "TTFT, inter-token latency and decode speed for short / medium / long outputs, streaming versus "
       "waiting for the whole answer, display granularity, and what a real OpenAI-compatible HTTP stream adds.\n\n"
       "CPU defaults (2 cores, SmolLM2-135M): 32 / 128 / 384 new tokens instead of 64 / 256 / 1024, so the "
       "whole notebook stays under about 3 minutes; a GPU user passes e.g. `output_tokens: [500, 2000, 5000]`."),
    code('model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
         'device: str = "auto"  # auto | cpu | cuda | mps\n'
         'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
         "output_tokens: list = [32, 128, 384]  # new tokens per request: short / medium / long (GPU: [500, 2000, 5000])\n"
         "batch_size: int = 1  # requests per generate call in the anatomy points\n"
         'prompt: str = "Explain how a refrigerator keeps food cold."  # anatomy prompt (user message)\n'
         "ignore_eos: bool = True  # fixed-length anatomy outputs (min_new_tokens equals max_new_tokens)\n"
         "temperature: float = 0.0  # 0 is greedy\n"
         "top_p: float = 1.0  # nucleus mass, (0, 1]\n"
         'granularities: list = ["token", "4 tokens", "16 tokens", "100 ms", "500 ms"]  # display update policies\n'
         "granularity_tokens: int = 64  # new tokens per request in the granularity / timeline batch\n"
         "timeline_batch: int = 4  # requests in that batch (English and Chinese prompts, natural lengths)\n"
         "http: bool = True  # run the OpenAI-compatible HTTP serving experiment\n"
         "http_concurrency: list = [1, 4]  # streaming requests sent together, one point each\n"
         "http_tokens: int = 32  # max_tokens of each HTTP request (fixed length)\n"
         "repeats: int = 1  # timed repetitions per point\n"
         "warmup: int = 1  # untimed warm-up runs per point\n"
         "seed: int = 0  # base seed (repeat r uses seed + r)\n"
         'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
         "resume: bool = False  # skip points this run already finished",
         metadata={"tags": ["parameters"]}),
    code("from workbench import models, results, serve, streaming, sweeps\n\n"
         "cfg = streaming.StreamingConfig.from_namespace(globals())\n"
         "run = results.open_run(run_dir)\n"
         "run"),
    md("## Short / medium / long outputs\nOne point per output length; every token id is timed as it is produced, "
       "and an every-token display is attached to record when text first becomes visible."),
    code("loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
         "prompts = [cfg.prompt] * cfg.batch_size\n"
         "anatomy = sweeps.run_sweep(\n"
         "    run, \"streaming\", sweeps.expand_grid(max_new_tokens=cfg.output_tokens),\n"
         "    lambda p: streaming.measure_stream(loaded, prompts, cfg.settings(p[\"max_new_tokens\"]), cfg.repeats, cfg.warmup),\n"
         "    resume=resume, info=loaded.info, config=cfg)\n"
         "anatomy[[\"max_new_tokens\", \"status\", \"ttft_s_p50\", \"tpot_s_p50\", \"itl_s_p50\", \"itl_s_p99\", "
         "\"itl_jitter\", \"e2e_s_p50\"]]"),
    code("req = results.read_requests(run, experiment=\"streaming\")\n"
         "for name, fig in [(\"itl_histogram\", streaming.itl_histogram_figure(req)),\n"
         "                  (\"itl_vs_position\", streaming.itl_position_figure(req)),\n"
         "                  (\"perceived_latency\", streaming.perceived_latency_figure(req))]:\n"
         "    results.save_figure(run, name, fig)\n"
         "    fig.show()"),
    md("## Display granularity\nThe same batch is displayed every token, every N tokens and every T ms side by side. "
       "Fewer updates cost display lag; every granularity must concatenate to the final decode exactly (`text_equal`)."),
    code("gran_settings = cfg.settings(cfg.granularity_tokens, ignore_eos=False)\n"
         "measure = streaming.granularity_measure(loaded, cfg.timeline_prompts(), gran_settings, cfg.granularities,\n"
         "                                        cfg.repeats, cfg.warmup)\n"
         "sweeps.run_sweep(run, \"granularity\", sweeps.expand_grid(granularity=cfg.granularities), measure,\n"
         "                 resume=resume, info=loaded.info, config=cfg)\n"
         "gran = results.read_requests(run, experiment=\"granularity\")\n"
         "table = streaming.granularity_table(gran)\n"
         "assert table[\"text_equal\"].all(), \"a granularity lost or changed text\"\n"
         "table"),
    code("first = gran[gran[\"granularity\"] == gran[\"granularity\"].iloc[0]]\n"
         "first = first[first[\"repeat\"] == first[\"repeat\"].min()]\n"
         "for name, fig in [(\"granularity\", streaming.granularity_figure(gran)),\n"
         "                  (\"timeline_batch\", streaming.timeline_figure(first, \"Per-request timeline: one batch\"))]:\n"
         "    results.save_figure(run, name, fig)\n"
         "    fig.show()"),
    md("## Serving path: OpenAI-compatible HTTP streaming\nA server on a loopback port (`workbench.serve`, requests queued "
       "through one worker) is driven by the official `openai` client. Client-side TTFT minus the engine's own TTFT "
       "(arrival to first token, queueing included) is what HTTP, SSE framing and the client add."),
    code("if cfg.http:\n"
         "    with serve.ServerThread(loaded) as srv:\n"
         "        sweeps.run_sweep(\n"
         "            run, \"http\", sweeps.expand_grid(concurrency=cfg.http_concurrency),\n"
         "            lambda p: serve.measure_http(srv.base_url, cfg.timeline_prompts(), p[\"concurrency\"], cfg.http_tokens,\n"
         "                                         cfg.repeats, cfg.warmup, cfg.temperature, cfg.seed),\n"
         "            resume=resume, info=loaded.info, config=cfg)\n"
         "    http_req = results.read_requests(run, experiment=\"http\")\n"
         "    display(serve.transport_table(http_req))"),
    code("if cfg.http:\n"
         "    top = http_req[(http_req[\"concurrency\"] == http_req[\"concurrency\"].max()) & (http_req[\"repeat\"] == 0)]\n"
         "    for name, fig in [(\"http_ttft\", serve.transport_figure(http_req)),\n"
         "                      (\"timeline_http\", streaming.timeline_figure(top, \"Per-request timeline: concurrent HTTP requests (queued)\"))]:\n"
         "        results.save_figure(run, name, fig)\n"
         "        fig.show()"),
]
_nb.write(cells, "04_streaming_anatomy.ipynb", "workbench.streaming:StreamingConfig")
