"""Write notebooks/01_batch_size.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_01.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 01 Batch size: TTFT versus throughput\n"
        "How many requests should share one `generate` call? Larger batches raise output throughput "
        "and goodput until TTFT and per-token latency break the SLO; this notebook finds that point."
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        "batch_sizes: list = [1, 2, 4, 8]  # requests per generate call\n"
        "prompt_tokens: list = [128, 512]  # prompt lengths in tokens, chat template included\n"
        "max_new_tokens: int = 32  # new tokens per request\n"
        "ignore_eos: bool = True  # fixed-length outputs: min_new_tokens set to max_new_tokens\n"
        "temperature: float = 0.0  # 0 means greedy decoding\n"
        "top_p: float = 1.0  # nucleus mass, (0, 1]\n"
        "repeats: int = 2  # timed repetitions per point\n"
        "warmup: int = 1  # untimed warm-up runs per point\n"
        "seed: int = 0  # base seed (repeat r uses seed + r)\n"
        "slo_ttft_s: float = 2.0  # goodput SLO on time to first token, seconds\n"
        "slo_tpot_s: float = 0.25  # goodput SLO on time per output token, seconds\n"
        'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
        "resume: bool = False  # skip points this run already finished",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "from workbench import metrics, models, plots, results, sweeps\n\n"
        "cfg = sweeps.BatchSizeConfig.from_namespace(globals())\n"
        "run = results.open_run(run_dir)\n"
        "run"
    ),
    nbf.v4.new_code_cell(
        "loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
        "points = sweeps.run_batch_size_sweep(cfg, run, loaded, resume=resume)\n"
        "requests = results.read_requests(run, experiment=\"batch_size\")\n"
        "points[[\"point_id\", \"status\", \"ttft_s_p50\", \"ttft_s_p99\", \"tpot_s_p50\", "
        "\"output_throughput_tps\", \"goodput_rps\", \"mbu\"]]"
    ),
    nbf.v4.new_code_cell(
        "for name, fig in plots.batch_size_figures(points, requests).items():\n"
        "    results.save_figure(run, name, fig)\n"
        "    fig.show()"
    ),
    nbf.v4.new_code_cell(
        "best = metrics.recommend_batch_size(points)\n"
        "if best is None:\n"
        "    print(\"No batch size met the SLO: relax slo_ttft_s / slo_tpot_s or shorten the prompts.\")\n"
        "else:\n"
        "    print(f\"Recommended batch size: {int(best.batch_size)} at {int(best.prompt_tokens)} prompt tokens \"\n"
        "          f\"({best.goodput_rps:.2f} req/s within the SLO, {best.output_throughput_tps:.1f} tok/s, \"\n"
        "          f\"TTFT p50 {best.ttft_s_p50:.2f} s)\")"
    ),
]
_nb.write(cells, "01_batch_size.ipynb", "workbench.sweeps:BatchSizeConfig")
