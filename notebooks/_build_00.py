"""Write notebooks/00_explorer.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_00.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 00 Explorer: try settings by hand, watch tokens arrive\n"
        "Pick a model, batch size, prompt length, sampling, reasoning budget and compression, press **Run**: the "
        "text streams in with live TTFT and tokens/s, and every run adds a point to the TTFT-vs-throughput figure. "
        "**Save points** writes them as a run folder (`workbench report` and `results.load()` read it). "
        "Without a frontend (papermill) it measures the parameters below once and shows static output."
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        "batch_size: int = 1  # requests per generate call\n"
        "prompt_tokens: int = 128  # prompt length in tokens, chat template included\n"
        "max_new_tokens: int = 32  # new tokens per request\n"
        "ignore_eos: bool = False  # fixed-length outputs : min_new_tokens set to max_new_tokens\n"
        "temperature: float = 0.0  # 0 means greedy\n"
        "top_p: float = 1.0  # nucleus mass, (0, 1]\n"
        "reasoning_budget: int = -1  # thinking-token cap (budget forcing); -1 means plain generation\n"
        'compression: str = "none"  # none | head | tail | head_tail | bm25 | dense | summary | prune\n'
        "compression_ratio: float = 4.0  # target original / compressed tokens (at least 1)\n"
        "repeats: int = 1  # timed repetitions per point\n"
        "warmup: int = 1  # untimed warm-up runs before a new shape\n"
        "seed: int = 0  # base seed (repeat r uses seed + r)\n"
        'mode: str = "auto"  # auto: widgets with a frontend, one static measurement without | widgets | static\n'
        'run_dir: str = ""  # run folder for saved points (set by `workbench run`); empty: a new run on save\n'
        "resume: bool = False  # unused here (the explorer has one point per run); kept for the CLI",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "from workbench import widgets\n\n"
        "cfg = widgets.ExplorerConfig.from_namespace(globals())\n"
        "explorer = widgets.Explorer(cfg, run_dir=run_dir)  # the run folder is opened on the first save"
    ),
    nbf.v4.new_code_cell("explorer.show()"),
    nbf.v4.new_markdown_cell(
        "The explored points as a table (run this cell again after exploring); "
        "`explorer.save()` does what the **Save points** button does."
    ),
    nbf.v4.new_code_cell("explorer.frame()"),
]
_nb.write(cells, "00_explorer.ipynb", "workbench.widgets:ExplorerConfig")
