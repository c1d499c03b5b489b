"""Write notebooks/05_reasoning_budget.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_05.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 05 Reasoning budget: thinking tokens versus latency and answer quality\n"
        "Cap (and optionally extend) the thinking segment with budget forcing, then measure what each "
        "budget B costs in time to first answer token, end-to-end latency and throughput, and what it buys "
        "in accuracy and gold-answer likelihood."
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        "budgets: list = [0, 16, 64]  # thinking-token budgets B; 0 means no thinking\n"
        "batch_sizes: list = [1, 4]  # requests per generate call\n"
        "min_budget: int = 0  # minimum thinking tokens for every B > 0, the s1 Wait extension\n"
        "answer_tokens: int = 24  # answer allowance after the end of thinking, tokens\n"
        "num_tasks: int = 8  # seeded tasks per point (the same tasks at every point)\n"
        'languages: list = ["en", "zh"]  # task languages\n'
        'task_kinds: list = ["arithmetic", "counting", "logic"]  # task families\n'
        'thinking: str = "auto"  # auto | native (<think> tokens) | emulated (text delimiters)\n'
        "temperature: float = 0.0  # 0 means greedy decoding\n"
        "top_p: float = 1.0  # nucleus mass, (0, 1]\n"
        "stop_at_newline: bool = True  # end an answer at the end of its line\n"
        "repeats: int = 1  # timed passes over the tasks per point\n"
        "warmup: int = 1  # untimed warm-up runs per point\n"
        "seed: int = 0  # task and sampling seed (repeat r uses seed + r)\n"
        'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
        "resume: bool = False  # skip points this run already finished",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "from workbench import models, reasoning, results\n\n"
        "cfg = reasoning.ReasoningConfig.from_namespace(globals())\n"
        "run = results.open_run(run_dir)\n"
        "run"
    ),
    nbf.v4.new_code_cell(
        "loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
        "points = reasoning.run_reasoning_sweep(cfg, run, loaded, resume=resume)\n"
        'requests = results.read_requests(run, experiment="reasoning")\n'
        'points[["point_id", "status", "thinking_mode", "thinking_tokens_mean", "ttft_s_p50", "ttfat_s_p50", '
        '"e2e_s_p50", "output_throughput_tps", "accuracy", "gold_logprob_mean", "answer_truncated_rate"]]'
    ),
    nbf.v4.new_markdown_cell(
        "TTFAT and e2e should grow about linearly with B (each thinking token is one decode step); "
        "TTFT should not. Quality is shown with 95% percentile-bootstrap intervals over tasks."
    ),
    nbf.v4.new_code_cell(
        "for name, fig in reasoning.reasoning_figures(points, requests).items():\n"
        "    results.save_figure(run, name, fig)\n"
        "    fig.show()"
    ),
    nbf.v4.new_code_cell(
        "summary = reasoning.quality_summary(requests)\n"
        'summary.pivot_table(index=["reasoning_budget", "batch_size"], columns="metric", values=["mean", "ci_low", "ci_high"])'
    ),
    nbf.v4.new_code_cell(
        'results.save_text(run, "reasoning/examples.md", reasoning.examples_markdown(requests))\n'
        'print(reasoning.examples_markdown(requests, per_budget=1))'
    ),
]
_nb.write(cells, "05_reasoning_budget.ipynb", "workbench.reasoning:ReasoningConfig")
