"""Write notebooks/07_long_output.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_07.py"""
import _nb
import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# 07 Long output: one shot, or outline then sections\n"
       "At one total token budget, compare writing a long text in one request, as an outline plus all sections in one "
       "batch, and as an outline plus sections one after another (each given a summary of the previous): wall time, "
       "time to first visible text, length, section coverage, repetition across sections, throughput.\n\n"
       "CPU defaults (2 cores, SmolLM2-135M): a 256-token budget and 4 sections, English and Chinese, about 2 minutes; "
       "a GPU user passes e.g. `budget_tokens: 4096, n_sections: 8`. Generated texts are saved under `texts/` in the run folder."),
    code('model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
         'device: str = "auto"  # auto | cpu | cuda | mps\n'
         'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
         "budget_tokens: int = 256  # total new tokens per text, equal for every strategy (GPU: 4096)\n"
         "n_sections: int = 4  # sections asked for\n"
         "outline_tokens: int = 0  # outline budget; 0 means about 12 per section, at most a quarter of the budget\n"
         'strategies: list = ["one_shot", "outline_batch", "outline_sequential"]  # strategies compared\n'
         'languages: list = ["en", "zh"]  # prompt languages\n'
         'topic_en: str = "How a city can prepare for a long heat wave"  # English article title\n'
         'topic_zh: str = "城市如何应对持续的高温天气"  # Chinese article title\n'
         "temperature: float = 0.0  # 0 is greedy\n"
         "repeats: int = 1  # timed repetitions per point\n"
         "warmup: int = 1  # untimed warm-up runs before the first point\n"
         "seed: int = 0  # base seed (repeat r uses seed + r)\n"
         'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
         "resume: bool = False  # skip points this run already finished",
         metadata={"tags": ["parameters"]}),
    code("from workbench import models, results, streaming, sweeps\n\n"
         "cfg = streaming.LongOutputConfig.from_namespace(globals())\n"
         "run = results.open_run(run_dir)\n"
         "plan = cfg.plan()\n"
         "run, plan"),
    code("loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
         "points = sweeps.expand_grid(language=cfg.languages, strategy=cfg.strategies)\n"
         "\n"
         "def measure(p):\n"
         "    return streaming.measure_long_output(\n"
         "        loaded, p[\"strategy\"], p[\"language\"], plan, cfg.topic(p[\"language\"]), cfg.repeats, cfg.temperature,\n"
         "        cfg.seed, on_text=lambda name, text: results.save_text(run, name, text),\n"
         "        warmup=cfg.warmup if p == points[0] else 0)\n"
         "\n"
         "sweeps.run_sweep(run, \"long_output\", points, measure, resume=resume, info=loaded.info, config=cfg)\n"
         "req = results.read_requests(run, experiment=\"long_output\")\n"
         "req[[\"language\", \"strategy\", \"ttft_s\", \"first_section_s\", \"e2e_s\", \"output_tokens\", \"chars\",\n"
         "     \"sections_found\", \"coverage\", \"repetition\", \"output_throughput_tps\"]]"),
    code("fig = streaming.long_output_figure(req)\n"
         "results.save_figure(run, \"long_output\", fig)\n"
         "fig.show()"),
    code("for lang in cfg.languages:\n"
         "    for s in cfg.strategies:\n"
         "        path = run / \"texts\" / f\"long_output_{s}_{lang}_r0.md\"\n"
         "        if path.exists():\n"
         "            print(f\"----- {s} ({lang}): {path.name}\\n\" + path.read_text()[:600] + \"\\n\")"),
]
_nb.write(cells, "07_long_output.ipynb", "workbench.streaming:LongOutputConfig")
