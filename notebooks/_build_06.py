"""Write notebooks/06_context_compression.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_06.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 06 Context compression: what shrinking the input does to TTFT and to answer quality\n"
        "Strategy x target ratio x context length x needle depth on seeded passkey tasks over real text: "
        "compression ratio, compressor time, TTFT, total time, answer match, gold-answer log-likelihood and "
        "agreement with the uncompressed answer; a chat experiment compares lossless KV prefix reuse."
    ),
    nbf.v4.new_code_cell(
        'model: str = "default"  # "default" (embedded SmolLM2-135M-Instruct), a local model dir or a cached hub id\n'
        'device: str = "auto"  # auto | cpu | cuda | mps\n'
        'dtype: str = "auto"  # auto | float32 | bfloat16 | float16\n'
        'strategies: list = ["none", "head_tail", "bm25", "dense", "prune", "summary"]  # none | head | tail | head_tail | bm25 | dense | summary | prune | kv_reuse\n'
        "ratios: list = [2, 4]  # target compression ratios, original over compressed tokens, each at least 1\n"
        "context_lengths: list = [512, 1024]  # haystack lengths in tokens (context only, template excluded)\n"
        "depths: list = [0.1, 0.5, 0.9]  # needle position as a fraction of the context\n"
        'task: str = "needle"  # needle (one passkey) | multikey (passkeys with similar-name distractors)\n'
        'language: str = "en"  # en (Python docs haystack) | zh (Chinese haystack)\n'
        "summary_lengths: list = [512]  # lengths where summary runs (largest ratio, middle depth); [] skips\n"
        "chat_lengths: list = [512]  # chat-history lengths (fact in an early turn); [] skips the chat experiment\n"
        'chat_strategies: list = ["none", "kv_reuse", "tail", "bm25"]  # strategies of the chat experiment\n'
        "chunk_tokens: int = 64  # retrieval chunk size in tokens\n"
        "max_new_tokens: int = 16  # answer length in tokens\n"
        "ignore_eos: bool = True  # fixed-length answers, so total times compare like for like\n"
        "temperature: float = 0.0  # 0 means greedy\n"
        "repeats: int = 1  # timed repetitions per point (each compresses again)\n"
        "warmup: int = 1  # untimed warm-up passes before the sweep\n"
        "seed: int = 0  # task seed; repeat r samples with seed + r\n"
        'run_dir: str = ""  # run folder (set by `workbench run`); empty: a new run under results/\n'
        "resume: bool = False  # skip points this run already finished",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "from workbench import compression, models, results\n\n"
        "cfg = compression.CompressionConfig.from_namespace(globals())\n"
        "run = results.open_run(run_dir)\n"
        "run"
    ),
    nbf.v4.new_markdown_cell(
        "Each point builds its task (seeded), compresses it (`compressor_s`), answers it with the model "
        "(TTFT, end-to-end) and scores the answer. Lossless strategies run once (ratio 1)."
    ),
    nbf.v4.new_code_cell(
        "loaded = models.load_model(cfg.model, cfg.device, cfg.dtype)\n"
        "points, chat_points = compression.run_compression_sweep(cfg, run, loaded, resume=resume)\n"
        'points[["point_id", "status", "achieved_ratio", "compressor_s", "ttft_s_p50", "total_s",\n'
        '        "substring_match", "gold_logprob", "rouge_l"]]'
    ),
    nbf.v4.new_code_cell(
        "for name, fig in compression.figures(points, chat_points).items():\n"
        "    results.save_figure(run, name, fig)\n"
        "    fig.show()"
    ),
    nbf.v4.new_markdown_cell(
        "Headlines: the context length at which each strategy starts to save total time over no compression "
        "(linear fit of total time vs length), and the quality each keeps at the largest ratio."
    ),
    nbf.v4.new_code_cell(
        "break_even = compression.break_even(points)\n"
        "quality = compression.quality_at(points, ratio=max(cfg.ratios))\n"
        'results.save_text(run, "tables/compression_break_even.csv", break_even.to_csv(index=False))\n'
        'results.save_text(run, "tables/compression_quality.csv", quality.to_csv(index=False))\n'
        "print(break_even.to_string(index=False))\n"
        "print(quality.to_string(index=False))"
    ),
    nbf.v4.new_code_cell(
        "if len(chat_points):\n"
        '    display(chat_points[["strategy", "ratio", "context_tokens", "prefilled_tokens", "ttft_s_p50",\n'
        '                         "ttft_total_s", "total_s", "substring_match", "gold_logprob"]])'
    ),
]
_nb.write(cells, "06_context_compression.ipynb", "workbench.compression:CompressionConfig")
