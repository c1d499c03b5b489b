"""Write notebooks/02_context_length.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_02.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 02 Context length: prefill scaling, decode slow-down and KV-cache memory\n"
        "How do TTFT, prefill and per-token decode time grow with prompt length L, how well does "
        "`prefill_s = a + b*L + c*L^2` describe prefill (and where does the quadratic attention term take over), "
        "how big is the KV cache, and where does a long prompt make batching stop paying?"
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        "context_tokens: list = [128, 512, 1024, 2048]  # prompt lengths L in tokens, chat template included\n"
        "batch_sizes: list = [1, 4]  # requests per generate call\n"
        "max_new_tokens: int = 8  # new tokens per request (at least 2, so TPOT exists)\n"
        "ignore_eos: bool = True  # fixed-length outputs : min_new_tokens set to max_new_tokens\n"
        'source: str = "en"  # prompt text: en (Python docs) | zh (Chinese essays) | random (token ids)\n'
        "repeats: int = 1  # timed repetitions per point\n"
        "warmup: int = 1  # untimed warm-up runs before the first point of each batch size\n"
        "seed: int = 0  # base seed (repeat r uses seed + r)\n"
        'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
        "resume: bool = False  # skip points this run already finished",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "import pandas as pd\n\n"
        "from workbench import context, models, results\n\n"
        "cfg = context.ContextConfig.from_namespace(globals())\n"
        "run = results.open_run(run_dir)\n"
        "run"
    ),
    nbf.v4.new_code_cell(
        "loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
        "points = context.run_context_sweep(cfg, run, loaded, resume=resume)\n"
        'requests = results.read_requests(run, experiment="context_length")\n'
        'requests = requests[requests["output_tokens"] >= 1]\n'
        'points[["point_id", "status", "ttft_s_p50", "prefill_s_p50", "tpot_s_p50", "output_throughput_tps"]]'
    ),
    nbf.v4.new_markdown_cell(
        "## Prefill fit\n"
        "Least squares over every request of each batch size; the crossover `L = b/c` is where attention's "
        "quadratic cost equals the linear (weight) cost."
    ),
    nbf.v4.new_code_cell(
        "fits = context.fit_by_batch(requests, y=\"prefill_s\")\n"
        "ttft_fits = context.fit_by_batch(requests, y=\"ttft_s\")\n"
        "fit_table = pd.concat([context.fits_table(fits, \"prefill_s\"), context.fits_table(ttft_fits, \"ttft_s\")])\n"
        'results.save_text(run, "context_fit.json", fit_table.to_json(orient="records", indent=1))\n'
        "fit_table"
    ),
    nbf.v4.new_code_cell(
        "for name, fig in context.context_figures(points, requests, fits).items():\n"
        "    results.save_figure(run, name, fig)\n"
        "    fig.show()"
    ),
    nbf.v4.new_markdown_cell(
        "## KV cache: computed from the config vs measured\n"
        "Computed: 2 x layers x kv_heads x head_dim x bytes x tokens x batch. Measured: memory growth while the "
        "cache is live (CUDA allocated bytes; on CPU, process RSS, an upper-bound estimate)."
    ),
    nbf.v4.new_code_cell(
        'kv = points[points["status"] == "ok"][["batch_size", "context_tokens", "kv_bytes_computed", '
        '"kv_bytes_measured", "memory_kind"]].copy()\n'
        'kv["computed_MiB"] = kv["kv_bytes_computed"] / 2**20\n'
        'kv["measured_MiB"] = kv["kv_bytes_measured"] / 2**20\n'
        'kv["measured/computed"] = kv["kv_bytes_measured"] / kv["kv_bytes_computed"]\n'
        "kv"
    ),
    nbf.v4.new_code_cell(
        "for bs, f in sorted(fits.items()):\n"
        "    cross = f\"{f.crossover_tokens:.0f}\" if f.crossover_tokens != float(\"inf\") else \"never (c <= 0)\"\n"
        "    beyond = \" (beyond the measured range)\" if f.crossover_tokens > max(cfg.context_tokens) else \"\"\n"
        "    print(f\"batch {bs}: prefill_s = {f.a:.4g} + {f.b:.4g}*L + {f.c:.4g}*L^2, R^2 = {f.r2:.4f}, \"\n"
        "          f\"quadratic term overtakes linear at L = {cross}{beyond}\")"
    ),
]
_nb.write(cells, "02_context_length.ipynb", "workbench.context:ContextConfig")
