"""Write notebooks/03_temperature.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_03.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 03 Temperature and top-p: length, repetition, quality and speed\n"
        "How do temperature (0 means greedy) and top-p change how long answers get, how often `max_new_tokens` "
        "truncates them, how repetitive they are, whether factual answers stay right, and what sampling costs in "
        "time? Long-form reports and short factual questions, English and Chinese, several seeded samples each, "
        "95% bootstrap confidence intervals."
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        "temperatures: list = [0.0, 0.7, 1.2]  # sampling temperatures; 0 means greedy\n"
        "top_ps: list = [0.9, 1.0]  # nucleus masses in (0, 1]; unused when greedy\n"
        'families: list = ["report", "factual"]  # prompt families: report (long-form) | factual (short answers)\n'
        'languages: list = ["en", "zh"]  # prompt languages\n'
        "n_report_prompts: int = 1  # report topics per language (1..8)\n"
        "n_sections: int = 3  # sections each report is asked for\n"
        "n_factual_prompts: int = 2  # factual questions per language (1..20)\n"
        "max_new_tokens: int = 48  # new-token cap for reports\n"
        "factual_max_new_tokens: int = 24  # new-token cap for factual answers\n"
        "repeats: int = 2  # seeded samples per setting (seed, seed + 1, ...)\n"
        "warmup: int = 1  # untimed warm-up runs per point\n"
        "seed: int = 0  # base seed\n"
        "perplexity: bool = True  # score each answer's perplexity under the model (temperature 1)\n"
        "target_chars: int = 2000  # a target answer length in characters, turned into max_new_tokens per language\n"
        'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
        "resume: bool = False  # skip points this run already finished",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "from workbench import models, results, temperature\n\n"
        "cfg = temperature.TemperatureConfig.from_namespace(globals())\n"
        "run = results.open_run(run_dir)\n"
        "run"
    ),
    nbf.v4.new_markdown_cell(
        "## Target lengths in characters\n"
        "Characters per token of this model's tokenizer (measured on the English and Chinese sources) and the "
        "`max_new_tokens` a target length needs (10% margin)."
    ),
    nbf.v4.new_code_cell(
        "loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
        "temperature.length_targets(loaded.tokenizer, cfg.target_chars, cfg.languages)"
    ),
    nbf.v4.new_code_cell(
        "points = temperature.run_temperature_sweep(cfg, run, loaded, resume=resume)\n"
        'requests = results.read_requests(run, experiment="temperature")\n'
        'results.save_text(run, "texts/temperature_samples.md", temperature.samples_markdown(requests))\n'
        'points[["point_id", "status", "tpot_s_p50", "e2e_s_p50", "output_throughput_tps", "truncated_share", '
        '"mean_output_tokens"]]'
    ),
    nbf.v4.new_markdown_cell(
        "## Quality with 95% bootstrap CIs\n"
        "Per family, language, temperature and top_p; `truncated` is the share of answers cut by `max_new_tokens`."
    ),
    nbf.v4.new_code_cell(
        "summary = temperature.quality_summary(requests)\n"
        'results.save_text(run, "quality_summary.csv", summary.to_csv(index=False))\n'
        "temperature.headline(summary)"
    ),
    nbf.v4.new_code_cell(
        "for name, fig in temperature.temperature_figures(summary, points).items():\n"
        "    results.save_figure(run, name, fig)\n"
        "    fig.show()"
    ),
]
_nb.write(cells, "03_temperature.ipynb", "workbench.temperature:TemperatureConfig")
