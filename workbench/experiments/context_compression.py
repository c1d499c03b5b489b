"""Context compression experiment: what shrinking the input does to TTFT and to answer quality.

What it measures (notebook ``06_context_compression``): strategy x target
ratio x context length x needle depth on seeded passkey tasks over real text
(:mod:`workbench.inputs.haystack`). Each request compresses its task with
:func:`workbench.techniques.compression.compress` (``compressor_s``), answers it with the
model (TTFT, end-to-end; fixed-length answers so total times compare like for
like) and scores the answer: substring and exact match
(:func:`workbench.measure.quality.substring_match`, :func:`workbench.measure.quality.exact_match`),
the gold answer's log-likelihood (:func:`workbench.techniques.answering.gold_logprob`)
and ROUGE-L against the uncompressed run's answer (:func:`workbench.measure.quality.rouge_l`).
A chat experiment compares lossless KV prefix reuse with compression of a chat
history whose fact sits in an early turn.

Two experiments are written to the run: ``compression`` (documents) and
``compression_chat``. Point columns beyond :func:`workbench.stats.metrics.summarize_point`:
``<quality>_mean`` over the repeats (``substring_match``, ``exact_match``,
``gold_logprob``, ``gold_logprob_per_token``, ``rouge_l``, ``needle_kept``) and
``<time or count>_p50`` (``compressor_s``, ``total_s``, ``ttft_total_s``,
``achieved_ratio``, ``compressed_tokens``, ``original_tokens``, ``prefilled_tokens``).

Entry points: :class:`Config`, :func:`evaluate`, :func:`measure_point`,
:func:`run`, the summaries :func:`summarise`, :func:`break_even`,
:func:`quality_at`, :func:`best_strategy`, and :func:`figures`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from workbench.stats import evidence
from workbench.measure import generation, quality
from workbench.share import plots
from workbench.checks import check_bool, check_choice, check_choice_list, check_float_list, check_int, check_int_list
from workbench.techniques.answering import answer, gold_logprob
from workbench.techniques.compression import LOSSLESS, STRATEGIES, compress, embedder
from workbench.measure.generation import GenerationSettings
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, run_sweep
from workbench.inputs import haystack

EXPERIMENT = "compression"
CHAT_EXPERIMENT = "compression_chat"
TASKS = ("needle", "multikey")

#: Per-request columns averaged per point (``<name>_mean``) and those summarised by their median (``<name>_p50``).
QUALITY_COLUMNS = ("substring_match", "exact_match", "gold_logprob", "gold_logprob_per_token", "rouge_l",
                   "needle_kept")
TIME_COLUMNS = ("compressor_s", "total_s", "ttft_total_s", "achieved_ratio", "compressed_tokens", "original_tokens",
                "prefilled_tokens")

# point columns the summaries and figures read
MATCH, LOGPROB, ROUGE = "substring_match_mean", "gold_logprob_mean", "rouge_l_mean"
ACHIEVED, COMPRESSOR, TTFT, TTFT_TOTAL, TOTAL, PREFILLED = (
    "achieved_ratio_p50", "compressor_s_p50", "ttft_s_p50", "ttft_total_s_p50", "total_s_p50", "prefilled_tokens_p50")


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass
class Config(SweepConfig):
    """The context-compression sweep (notebook ``06_context_compression``).

    Attributes:
        strategies: strategies over the document task (from :data:`workbench.techniques.compression.STRATEGIES`;
            ``summary`` is run only at ``summary_lengths``).
        ratios: target compression ratios (each >= 1); lossless strategies run once at ratio 1.
        context_lengths: context lengths in tokens (>= 64).
        depths: needle depths (0..1).
        task: ``needle`` or ``multikey``.
        language: ``en`` (Python docs haystack) or ``zh``.
        summary_lengths: lengths at which ``summary`` runs (largest ratio, middle depth); [] skips.
        chat_lengths: history lengths of the chat experiment (fact in an early turn); [] skips it.
        chat_strategies: strategies of the chat experiment.
        chunk_tokens: retrieval chunk size in tokens (>= 8).
        max_new_tokens: answer length (>= 1).
        ignore_eos: fixed-length answers, so total times compare like for like.
        temperature: 0 means greedy.

    Raises:
        ParameterError: any invalid field (one line, before a model loads).
    """

    strategies: list = dataclasses.field(default_factory=lambda: ["none", "head_tail", "bm25", "dense", "prune"])
    ratios: list = dataclasses.field(default_factory=lambda: [2, 4])
    context_lengths: list = dataclasses.field(default_factory=lambda: [512, 1024])
    depths: list = dataclasses.field(default_factory=lambda: [0.1, 0.5, 0.9])
    task: str = "needle"
    language: str = "en"
    summary_lengths: list = dataclasses.field(default_factory=lambda: [512])
    chat_lengths: list = dataclasses.field(default_factory=lambda: [512, 1024])
    chat_strategies: list = dataclasses.field(default_factory=lambda: ["none", "kv_reuse", "tail", "bm25"])
    chunk_tokens: int = 64
    max_new_tokens: int = 16
    ignore_eos: bool = True
    temperature: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_choice_list("strategies", self.strategies, STRATEGIES)
        check_choice_list("chat_strategies", self.chat_strategies, STRATEGIES, allow_empty=True)
        check_float_list("ratios", self.ratios, 1)  # validated only: the values (2, not 2.0) name the points
        check_bool("ignore_eos", self.ignore_eos)
        self.settings()
        hi = 8192 - self.max_new_tokens - 64
        try:
            hi = self.max_context() - self.max_new_tokens - 64
        except Exception:  # noqa: BLE001 - validation without the model's config falls back to 8k
            pass
        check_int_list("context_lengths", self.context_lengths, 64, hi)
        check_int_list("summary_lengths", self.summary_lengths, 64, hi, allow_empty=True)
        check_int_list("chat_lengths", self.chat_lengths, 64, hi, allow_empty=True)
        check_float_list("depths", self.depths, 0, 1)
        check_choice("task", self.task, TASKS)
        check_choice("language", self.language, haystack.LANGUAGES)
        check_int("chunk_tokens", self.chunk_tokens, 8)

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """Generation settings of every answer (repeat ``r`` passes ``seed + r``)."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                                  temperature=self.temperature, seed=self.seed if seed is None else seed)

    def grid(self) -> list[dict]:
        """Document points: lossless strategies once (ratio 1), others at every ratio; ``none`` first."""
        pts = []
        order = sorted(self.strategies, key=lambda s: s != "none")
        for s in order:
            if s == "summary":
                continue
            for r in ([1] if s in LOSSLESS else self.ratios):
                for n in self.context_lengths:
                    for d in self.depths:
                        pts.append({"strategy": s, "ratio": r, "context_tokens": n, "depth": d})
        if "summary" in self.strategies:
            mid = sorted(self.depths)[len(self.depths) // 2]
            for n in self.summary_lengths:
                pts.append({"strategy": "summary", "ratio": max(self.ratios), "context_tokens": n, "depth": mid})
        return pts

    def chat_grid(self) -> list[dict]:
        """Chat points (fact in the turn at depth 0.1): strategies x ratios x ``chat_lengths``."""
        pts = []
        for s in sorted(self.chat_strategies, key=lambda s: s != "none"):
            for r in ([1] if s in LOSSLESS else ([max(self.ratios)] if s == "summary" else self.ratios)):
                for n in self.chat_lengths:
                    pts.append({"strategy": s, "ratio": r, "context_tokens": n, "depth": 0.1})
        return pts


# ----------------------------------------------------------------------------- one request, one point


def answer_scores(prediction: str, gold: str) -> dict:
    """``substring_match`` and ``exact_match`` of an answer against the one gold answer (:mod:`workbench.measure.quality`)."""
    return {"substring_match": quality.substring_match(prediction, [gold]),
            "exact_match": quality.exact_match(prediction, [gold])}


def evaluate(loaded, task, strategy: str, ratio: float, settings: GenerationSettings, reference: str | None = None,
             **options) -> dict:
    """Compress ``task``, answer it, and score the answer: one request row.

    Args:
        loaded: the model.
        task: :class:`workbench.inputs.haystack.Task`.
        strategy, ratio: see :func:`workbench.techniques.compression.compress` (ratio ignored by lossless strategies).
        settings: generation settings of the answer.
        reference: the uncompressed run's answer text, for ``rouge_l`` (NaN when None).
        options: passed to :func:`workbench.techniques.compression.compress`.

    Returns:
        The request record plus the result's columns, ``total_s`` (compressor +
        end-to-end), ``ttft_total_s`` (compressor + TTFT), the quality columns
        and the task's columns (``task_kind``, ``answer_gold``, ``depth`` ...).
    """
    kw = {} if strategy in LOSSLESS else {"ratio": ratio}
    result = compress(task.context, task.question, loaded.tokenizer, strategy, loaded=loaded, **kw, **options)
    rec = answer(loaded, result, settings)
    rec.update(result.to_record())
    rec["total_s"] = result.compressor_s + rec["e2e_s"]
    rec["ttft_total_s"] = result.compressor_s + rec["ttft_s"]
    rec.update(answer_scores(rec["text"], task.answer))
    rec.update(gold_logprob(loaded, result.messages(), task.answer, result.prefix_cache, result.prefix_ids))
    rec["rouge_l"] = quality.rouge_l(rec["text"], reference) if reference is not None else float("nan")
    rec.update(task_kind=task.kind, language=task.language, answer_gold=task.answer, depth=task.depth,
               needle_kept=float(task.needle in result.text))
    return rec


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one point: ``cfg.repeats`` requests (compress + answer + score).

    Args:
        loaded: the model.
        cfg: the sweep config.
        point: ``strategy``, ``ratio``, ``context_tokens``, ``depth``.
        state: shared across the points of one run: ``state["task"]``, the task kind (``cfg.task``, the
            default, or ``chat``), and ``state["references"]``, uncompressed answers by task (for ROUGE-L):
            taken from the ``none`` point when it ran first, else generated once, untimed.

    Returns:
        :class:`workbench.run.point_result.PointResult`: ``requests``, ``wall_s`` and ``extra`` (:data:`QUALITY_COLUMNS` as ``_mean``,
        :data:`TIME_COLUMNS` as ``_p50``, and ``task``).
    """
    kind = state.get("task", cfg.task)
    references = state.setdefault("references", {})
    task = haystack.make_task(kind, loaded.tokenizer, point["context_tokens"], point["depth"], seed=cfg.seed,
                              language=cfg.language)
    key = (task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.temperature, cfg.seed)
    reference = references.get(key)
    if reference is None and point["strategy"] != "none":
        reference = answer(loaded, compress(task.context, task.question, loaded.tokenizer), cfg.settings())["text"]
        references[key] = reference
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        rec = evaluate(loaded, task, point["strategy"], point["ratio"], cfg.settings(cfg.seed + r),
                       reference=reference, chunk_tokens=cfg.chunk_tokens)
        if point["strategy"] == "none" and r == 0:
            references[key] = rec["text"]
            rec["rouge_l"] = 1.0
        rec.update(repeat=r, batch_size=1)
        rec.pop("depth", None)  # the point's requested depth column wins; the measured one is kept below
        rec["fact_depth"] = task.depth
        requests.append(rec)
        wall += rec["total_s"]
    extra = {f"{c}_mean": statistics.fmean(float(x[c]) for x in requests) for c in QUALITY_COLUMNS}
    extra.update({f"{c}_p50": statistics.median(float(x[c]) for x in requests) for c in TIME_COLUMNS})
    extra["task"] = kind
    fallbacks = [x["detail_retrieval_fallback"] for x in requests if "detail_retrieval_fallback" in x]
    if fallbacks:  # retrieval whose chunks all scored the same fell back to head truncation (recorded)
        extra["retrieval_fallback_rate"] = sum(f != "none" for f in fallbacks) / len(fallbacks)
    return PointResult(requests=requests, wall_s=wall, extra=extra)


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Run the document experiment (``compression``) and the chat experiment (``compression_chat``).

    First ``cfg.warmup`` untimed warm-ups (:func:`workbench.measure.generation.warm_up`, a scoring pass, and the
    embedder when ``dense`` runs).

    Returns:
        ``(points, chat_points)`` DataFrames (``chat_points`` empty when ``chat_lengths`` or
        ``chat_strategies`` is []).
    """
    import pandas as pd

    hello = [{"role": "user", "content": "Say hello."}]
    generation.warm_up(loaded, [hello], cfg.settings(), n=cfg.warmup)  # untimed, before any point
    for _ in range(cfg.warmup):  # the scoring pass and the embedder, untimed too
        gold_logprob(loaded, hello, "Hello")
        if "dense" in cfg.strategies or "dense" in cfg.chat_strategies:
            embedder().encode(["warm up"], show_progress_bar=False)
    references: dict = {}  # shared by both sweeps
    doc_state = {"task": cfg.task, "references": references}
    doc = run_sweep(run_dir, EXPERIMENT, cfg.grid(), lambda p: measure_point(loaded, cfg, p, doc_state),
                    resume=resume, info=loaded.info, loaded=loaded, config=cfg)
    chat = pd.DataFrame()
    if cfg.chat_lengths and cfg.chat_strategies:
        chat_state = {"task": "chat", "references": references}
        chat = run_sweep(run_dir, CHAT_EXPERIMENT, cfg.chat_grid(),
                         lambda p: measure_point(loaded, cfg, p, chat_state), resume=resume,
                         info=loaded.info, loaded=loaded, config=cfg)
    return doc, chat


# ----------------------------------------------------------------------------- summaries


def summarise(points):
    """Per (strategy, ratio, context_tokens): point columns averaged over depths (same names as the points)."""
    p = plots.ok_points(points)
    cols = [c for c in (MATCH, LOGPROB, "gold_logprob_per_token_mean", ROUGE, "needle_kept_mean", ACHIEVED,
                        COMPRESSOR, TTFT, TTFT_TOTAL, TOTAL) if c in p]
    return p.groupby(["strategy", "ratio", "context_tokens"], as_index=False)[cols].mean()


def break_even(points):
    """Context length at which each (strategy, ratio) starts to save time over ``none``.

    Answers have a fixed length (``ignore_eos``), so decode time cancels and the
    saving is prefill. Method, from the measured points: fit TTFT against
    prefilled tokens over all points of the experiment (``ttft = a + b * tokens``,
    least squares; pooling every point makes the per-token prefill cost ``b``
    robust to noise), fit each strategy's compressor time against context
    length (``c + d * L``), and solve ``c + d * L = b * L * (1 - 1 / ratio)``
    with the strategy's mean achieved ratio: ``L* = c / (b * (1 - 1/ratio) - d)``.
    ``inf`` when the compressor grows at least as fast as the prefill it saves,
    0 when it costs nothing. ``direct_tokens`` is the crossing of straight lines
    through the measured total times (``none`` vs the strategy), for comparison;
    ``measured`` says whether ``L*`` lies inside the measured lengths.

    Returns:
        DataFrame: strategy, ratio, achieved_ratio, prefill_s_per_token,
        compressor_s_per_token, break_even_tokens, measured, direct_tokens.
    """
    import numpy as np
    import pandas as pd

    cols = ["strategy", "ratio", "achieved_ratio", "prefill_s_per_token", "compressor_s_per_token",
            "break_even_tokens", "measured", "direct_tokens"]
    p = evidence.usable_points(points)  # a fit uses valid points only
    need = {PREFILLED, TTFT, COMPRESSOR, ACHIEVED, "context_tokens"}
    if p.empty or not need <= set(p) or not (p["strategy"] == "none").any():
        return pd.DataFrame(columns=cols)

    def line(xs, ys):
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        if len(set(xs)) < 2:
            return float(np.mean(ys)), 0.0
        b, a = np.polyfit(xs, ys, 1)
        return float(a), float(b)

    _, per_token = line(p[PREFILLED], p[TTFT])
    s = summarise(p)
    base = s[s["strategy"] == "none"].set_index("context_tokens")[TOTAL] if TOTAL in s else None
    rows = []
    for (strat, ratio), g in p[p["strategy"] != "none"].groupby(["strategy", "ratio"]):
        c, d = line(g["context_tokens"], g[COMPRESSOR])
        achieved = float(g[ACHIEVED].mean())
        gain = per_token * (1 - 1 / achieved) - d if achieved > 0 else -d
        if c <= 0 and gain >= 0:
            be = 0.0
        elif gain <= 0:
            be = math.inf
        else:
            be = max(0.0, c / gain)
        direct = math.nan
        if base is not None:
            gs = s[(s["strategy"] == strat) & (s["ratio"] == ratio) & s["context_tokens"].isin(base.index)]
            if len(gs) >= 2:
                a0, b0 = line(base.index, base.to_numpy())
                a1, b1 = line(gs["context_tokens"], gs[TOTAL])
                direct = 0.0 if (a1 <= a0 and b1 <= b0) else (math.inf if b1 >= b0 else max(0.0, (a1 - a0) / (b0 - b1)))
        lengths = p["context_tokens"]
        rows.append({"strategy": strat, "ratio": ratio, "achieved_ratio": achieved, "prefill_s_per_token": per_token,
                     "compressor_s_per_token": d, "break_even_tokens": be,
                     "measured": bool(lengths.min() <= be <= lengths.max()), "direct_tokens": direct})
    return pd.DataFrame(rows, columns=cols)


def quality_at(points, ratio: float = 4):
    """Quality retained at a ratio, per strategy (all lengths and depths averaged), next to ``none``.

    Returns:
        DataFrame: strategy, achieved_ratio_p50, substring_match_mean, match_retained (share of
        ``none``'s), gold_logprob_mean, delta_gold_logprob (vs ``none``), rouge_l_mean.
    """
    p = plots.ok_points(points)
    base = p[p["strategy"] == "none"]
    sel = p[(p["ratio"] == ratio) | (p["strategy"].isin(LOSSLESS))]
    cols = [c for c in (ACHIEVED, MATCH, LOGPROB, ROUGE) if c in p]
    g = sel.groupby("strategy", as_index=False)[cols].mean()
    m0 = base[MATCH].mean() if not base.empty else float("nan")
    l0 = base[LOGPROB].mean() if not base.empty else float("nan")
    g["match_retained"] = g[MATCH] / m0 if m0 else float("nan")
    g["delta_gold_logprob"] = g[LOGPROB] - l0
    order = ["strategy", ACHIEVED, MATCH, "match_retained", LOGPROB, "delta_gold_logprob", ROUGE]
    return g[[c for c in order if c in g]]


def best_strategy(points):
    """Per context length: the lossy or lossless strategy with the best answer match, ties broken by the
    higher gold log-likelihood, then the lower total time; over valid points only
    (:func:`workbench.stats.evidence.usable_points`).

    Returns:
        DataFrame: context_tokens, strategy, ratio, substring_match_mean, gold_logprob_mean, total_s_p50,
        none_total_s_p50.
    """
    import pandas as pd

    s = summarise(evidence.usable_points(points))  # a best-of choice uses valid points only
    rows = []
    for n, g in s.groupby("context_tokens"):
        g = g.sort_values([MATCH, LOGPROB, TOTAL], ascending=[False, False, True])
        top = g.iloc[0]
        none = g[g["strategy"] == "none"][TOTAL]
        rows.append({"context_tokens": int(n), "strategy": top["strategy"], "ratio": top["ratio"],
                     MATCH: top[MATCH], LOGPROB: top[LOGPROB], TOTAL: top[TOTAL],
                     "none_" + TOTAL: float(none.iloc[0]) if len(none) else None})
    return pd.DataFrame(rows)


def finding(points) -> "evidence.Finding":
    """Per context length: the best strategy (answer match, then likelihood, then total time, valid points
    only), with its evidence against ``none``: answer match over the tasks (one per depth; Newcombe interval of
    the difference of shares) and total time (Welch ratio over the tasks); a direction only beyond noise. The
    best is a pick of the ``m`` strategies measured beside ``none``, so both intervals are at ``1 - 0.05 / m``
    (Holm's first step, issue 32).

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    usable = evidence.usable_points(points)
    best = best_strategy(usable)
    if best.empty:
        return evidence.Finding("No valid compression point finished.", "", False)
    parts, ev, supported, ids = [], [], False, []
    for _, r in best.iterrows():
        L = int(r["context_tokens"])
        at = usable[usable["context_tokens"] == L]
        mine = at[(at["strategy"] == r["strategy"]) & ((at["ratio"] == r["ratio"]) | at["strategy"].isin(LOSSLESS))]
        none = at[at["strategy"] == "none"]
        ids += list(evidence.point_ids(mine)) + list(evidence.point_ids(none))
        ratio = f" at ratio {r['ratio']:g}" if r["ratio"] == r["ratio"] and r["strategy"] not in LOSSLESS else ""
        k, n = int(round(mine[MATCH].sum())), len(mine)  # one task per point: its answer matched or not
        text = f"{L} tokens: {r['strategy']}{ratio} (match {k} of {n} tasks"
        if r["strategy"] != "none" and len(none):
            k0, n0 = int(round(none[MATCH].sum())), len(none)
            # the best of m strategies: its comparison with none is tested at Holm's first level, 1 - alpha / m
            m = max(1, int(at.loc[at["strategy"] != "none", "strategy"].nunique()))
            level = 1 - (1 - evidence.CONFIDENCE) / m
            diff = evidence.difference_interval(k, n, k0, n0, level)
            t = evidence.ratio_interval(mine[TOTAL], none[TOTAL], level, unit="tasks")
            tv = evidence.ratio_verdict(t)
            mv = evidence.difference_verdict(diff)
            supported |= tv in ("higher", "lower") or mv in ("higher", "lower")
            match_word = {"higher": "better than", "lower": "worse than"}.get(mv, "no different beyond noise from")
            text += f", {match_word} none's {k0} of {n0}; " + evidence.describe_ratio(t, "total time vs none") + ")"
            ev.append(f"{L} tokens: match change {diff.describe('{:+.2f}')}; {n} and {n0} tasks (one per depth); "
                      f"the best of {m} strategies, so both intervals at {level:.1%} (Holm's first step)")
        else:
            text += f", total {r[TOTAL]:.2f} s)"
            ev.append(f"{L} tokens: {n} tasks; no strategy beat none on match")
        parts.append(text)
    return evidence.Finding("Best strategy per context length - " + "; ".join(parts) + ".",
                            "valid points only; " + "; ".join(ev), supported, tuple(dict.fromkeys(ids)))


# ----------------------------------------------------------------------------- figures


def _table_figure(df, title: str):
    import plotly.graph_objects as go

    def fmt(v):
        if isinstance(v, float):
            return "never" if math.isinf(v) else f"{v:.3g}"
        return str(v)

    fig = go.Figure(go.Table(header={"values": list(df.columns)},
                             cells={"values": [[fmt(v) for v in df[c]] for c in df.columns]}))
    fig.update_layout(title=title)
    return fig


@plots.split_by_device
def figures(points, chat_points=None) -> dict:
    """The experiment's figures, by name, in report order.

    - ``quality_vs_ratio``: answer match, gold log-likelihood and ROUGE-L vs achieved ratio;
    - ``time_vs_ratio``: TTFT (model only), compressor + TTFT, and total time vs target ratio;
    - ``total_vs_length`` and ``break_even``: total time vs context length, and the fitted break-even;
    - ``depth_length_heatmap``: gold log-likelihood per needle depth x context length;
    - ``best_strategy``: the best strategy per context length;
    - ``chat``: the chat experiment (TTFT, prefilled tokens, match), when given.
    """
    import plotly.express as px

    figs = {}
    s = summarise(points)
    q = s.melt(id_vars=["strategy", "ratio", "context_tokens", ACHIEVED],
               value_vars=[c for c in (MATCH, LOGPROB, ROUGE) if c in s],
               var_name="metric", value_name="value")
    q["metric"] = q["metric"].map({MATCH: "answer match (share)", LOGPROB: "gold log-lik (nats)",
                                   ROUGE: "ROUGE-L vs uncompressed"})
    fig = px.line(q.sort_values(ACHIEVED), x=ACHIEVED, y="value", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Answer quality vs achieved compression ratio")
    fig.update_yaxes(matches=None, title_text="")
    fig.update_xaxes(title_text="achieved ratio (x)")
    figs["quality_vs_ratio"] = fig

    t = s.melt(id_vars=["strategy", "ratio", "context_tokens"],
               value_vars=[c for c in (TTFT, TTFT_TOTAL, TOTAL) if c in s],
               var_name="metric", value_name="seconds")
    t["metric"] = t["metric"].map({TTFT: "TTFT, model (s)", TTFT_TOTAL: "compressor + TTFT (s)",
                                   TOTAL: "total: compressor + answer (s)"})
    fig = px.line(t.sort_values("ratio"), x="ratio", y="seconds", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Time vs target compression ratio")
    fig.update_yaxes(matches=None)
    fig.update_xaxes(title_text="target ratio (x)", type="log")
    figs["time_vs_ratio"] = fig

    s["label"] = s["strategy"] + " " + s["ratio"].map(lambda r: f"{r:g}x")
    fig = px.line(s.sort_values("context_tokens"), x="context_tokens", y=TOTAL, color="label", markers=True,
                  title="Total time (compressor + answer) vs context length",
                  labels={"context_tokens": "context length (tokens)", TOTAL: "total time (s)"})
    figs["total_vs_length"] = fig
    be = break_even(points)
    figs["break_even"] = _table_figure(be, "Break-even context length (tokens): where compressor time is repaid by "
                                           "the prefill it saves (fits over all points)")

    h = plots.ok_points(points)
    h = h[(h["ratio"] == max(h["ratio"])) | (h["strategy"] == "none")]
    h = h.assign(depth_label=h["depth"].map(lambda d: f"{d:g}"), length_label=h["context_tokens"].astype(str))
    fig = px.density_heatmap(h, x="depth_label", y="length_label", z=LOGPROB, histfunc="avg",
                             facet_col="strategy", facet_col_wrap=4, text_auto=".2f",
                             title=f"Gold-answer log-likelihood (nats) by needle depth and context length "
                                   f"(ratio {max(h['ratio']):g}x)",
                             labels={"depth_label": "needle depth", "length_label": "context (tokens)",
                                     LOGPROB: plots.label(LOGPROB)})
    figs["depth_length_heatmap"] = fig
    figs["best_strategy"] = _table_figure(best_strategy(points), "Best strategy per context length")

    if chat_points is not None and len(chat_points):
        c = plots.ok_points(chat_points)
        c["label"] = c["strategy"] + " " + c["ratio"].map(lambda r: f"{r:g}x")
        cm = c.melt(id_vars=["label", "context_tokens"],
                    value_vars=[v for v in (TTFT_TOTAL, PREFILLED, MATCH) if v in c],
                    var_name="metric", value_name="value")
        cm["metric"] = cm["metric"].map({TTFT_TOTAL: "compressor + TTFT (s)", PREFILLED: "prefilled tokens",
                                         MATCH: "answer match (share)"})
        fig = px.bar(cm, x="context_tokens", y="value", color="label", barmode="group", facet_row="metric",
                     title="Chat history: KV prefix reuse vs compression",
                     labels={"context_tokens": "history length (tokens)"})
        fig.update_yaxes(matches=None, title_text="")
        fig.update_xaxes(type="category")
        figs["chat"] = fig
    return figs


__all__ = [
    "EXPERIMENT", "CHAT_EXPERIMENT", "Config", "answer_scores", "evaluate", "measure_point", "run",
    "summarise", "break_even", "quality_at", "best_strategy", "figures",
]
