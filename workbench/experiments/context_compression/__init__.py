"""Context compression experiment: what shrinking the input does to TTFT and to answer quality.

What it measures (notebook ``06_context_compression``): strategy x target ratio x context length x needle depth on
seeded passkey tasks over real text (:mod:`workbench.inputs.haystack`). Each request compresses its task with
:func:`workbench.techniques.compression.compress` (``compressor_s``), answers it with the model (TTFT, end-to-end;
fixed-length answers so total times compare like for like) and scores the answer: substring and exact match
(:func:`workbench.measure.quality.substring_match`, :func:`workbench.measure.quality.exact_match`), the gold answer's
log-likelihood (:func:`workbench.techniques.answering.gold_logprob`) and ROUGE-L against the uncompressed run's answer
(:func:`workbench.measure.quality.rouge_l`). A chat experiment compares lossless KV prefix reuse with compression of
a chat history whose fact sits in an early turn.

Design (issue 32; :mod:`workbench.stats.comparison`): with 2+ document points and ``repeats`` >= 2 the document
points are arms measured interleaved by round (:func:`measure_interleaved`): round ``r`` measures every (strategy,
ratio, context length, depth) point once at seed ``seed + r``, plus ``none`` a second time on every task (the A/A
control: one request per task per round, not a point), in an order shuffled per round from the seed. Per context
length, each (strategy, ratio)'s total time (compressor + answer) over ``none``'s is judged from paired log ratios
whose unit is the (round, task) pair (a task is a depth: both answer the same task in the same round), Holm over
the length's arms (:func:`compare_lengths`: ``time_ratio`` columns on every point of the arm); every point carries
its length's A/A columns (:data:`workbench.stats.comparison.COLUMNS`; ``rounds`` counts rounds, ``round_drift`` is
``none``'s largest change between neighbouring rounds on one task), the noise floor :func:`finding` prints beside
the time claim and ``compression_time_ratio`` shades. Quality stays per request (greedy answers repeat). With one
repeat nothing pairs: each point runs on its own (:func:`measure_point`) and the finding says so. The chat sweep
(``compression_chat``) stays point by point.

Point columns beyond :func:`workbench.stats.metrics.summarize_point`: ``<quality>_mean`` over the repeats
(:data:`QUALITY_COLUMNS`) and ``<time or count>_p50`` (:data:`TIME_COLUMNS`). Entry points: :class:`Config`,
:func:`evaluate`, :func:`measure_point`, :func:`run`, the summaries :func:`summarise`, :func:`break_even`,
:func:`quality_at`, :func:`best_strategy`, :func:`finding`, and :func:`figures`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from workbench.stats import comparison, evidence
from workbench.measure import generation, quality
from workbench.share import plots
from workbench.experiments.context_compression import charts as fc
from workbench.experiments.context_compression.charts import (ACHIEVED, COMPRESSOR, LOGPROB, MATCH,  # noqa: F401
                                                               PREFILLED, ROUGE, TOTAL, TTFT, TTFT_TOTAL)
from workbench.checks import check_bool, check_choice, check_choice_list, check_float_list, check_int, check_int_list
from workbench.techniques.answering import answer, gold_logprob
from workbench.techniques.compression import LOSSLESS, STRATEGIES, compress, embedder
from workbench.measure.generation import GenerationSettings
from workbench.run import point_result
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, block_share, run_sweep
from workbench.inputs import haystack

EXPERIMENT = "compression"
CHAT_EXPERIMENT = "compression_chat"
TASKS = ("needle", "multikey")

#: Per-request columns averaged per point (``<name>_mean``) and those summarised by their median (``<name>_p50``).
QUALITY_COLUMNS = ("substring_match", "exact_match", "gold_logprob", "gold_logprob_per_token", "rouge_l",
                   "needle_kept")
TIME_COLUMNS = ("compressor_s", "total_s", "ttft_total_s", "achieved_ratio", "compressed_tokens", "original_tokens",
                "prefilled_tokens")


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

    strategies: list = dataclasses.field(default_factory=lambda: ["none", "head_tail", "bm25", "dense", "prune",
                                                                  "summary"])
    ratios: list = dataclasses.field(default_factory=lambda: [2, 4])
    context_lengths: list = dataclasses.field(default_factory=lambda: [512, 1024])
    depths: list = dataclasses.field(default_factory=lambda: [0.1, 0.5, 0.9])
    task: str = "needle"
    language: str = "en"
    summary_lengths: list = dataclasses.field(default_factory=lambda: [512])
    chat_lengths: list = dataclasses.field(default_factory=lambda: [512])
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
        pts = [{"strategy": s, "ratio": r, "context_tokens": n, "depth": d}
               for s in sorted(self.strategies, key=lambda s: s != "none") if s != "summary"
               for r in ([1] if s in LOSSLESS else self.ratios) for n in self.context_lengths for d in self.depths]
        if "summary" in self.strategies:
            mid = sorted(self.depths)[len(self.depths) // 2]
            for n in self.summary_lengths:
                pts.append({"strategy": "summary", "ratio": max(self.ratios), "context_tokens": n, "depth": mid})
        return pts

    def plan_points(self) -> list[tuple[str, dict]]:
        """``(experiment, point)`` of both sweeps :func:`run` measures (``workbench plan`` counts them): the
        document points, then the chat points when ``chat_lengths`` and ``chat_strategies`` are set."""
        chat = self.chat_grid() if self.chat_lengths and self.chat_strategies else []
        return [(EXPERIMENT, p) for p in self.grid()] + [(CHAT_EXPERIMENT, p) for p in chat]

    def chat_grid(self) -> list[dict]:
        """Chat points (fact in the turn at depth 0.1): strategies x ratios x ``chat_lengths``."""
        return [{"strategy": s, "ratio": r, "context_tokens": n, "depth": 0.1}
                for s in sorted(self.chat_strategies, key=lambda s: s != "none")
                for r in ([1] if s in LOSSLESS else ([max(self.ratios)] if s == "summary" else self.ratios))
                for n in self.chat_lengths]


# ----------------------------------------------------------------------------- one request, one point


def answer_scores(prediction: str, gold: str) -> dict:
    """``substring_match`` and ``exact_match`` of an answer against the one gold answer (:mod:`workbench.measure.quality`)."""
    return {"substring_match": quality.substring_match(prediction, [gold]),
            "exact_match": quality.exact_match(prediction, [gold])}


def evaluate(loaded, task, strategy: str, ratio: float, settings: GenerationSettings, reference: str | None = None,
             score: bool = True, scores: dict | None = None, **options) -> dict:
    """Compress ``task``, answer it, and score the answer: one request row.

    Args:
        loaded: the model.
        task: :class:`workbench.inputs.haystack.Task`.
        strategy, ratio: see :func:`workbench.techniques.compression.compress` (ratio ignored by lossless strategies).
        settings: generation settings of the answer.
        reference: the uncompressed run's answer text, for ``rouge_l`` (NaN when None).
        score: False skips the gold answer's log-likelihood (an untimed pass; the A/A control is not scored).
        scores: log-likelihoods by prompt, shared by a sweep: a prompt scored before (a later repeat's, greedy or
            not: the score is a function of the prompt and the gold answer) is not scored again.
        options: passed to :func:`workbench.techniques.compression.compress`.

    Returns:
        The request record plus the result's columns, ``total_s`` (compressor + end-to-end), ``ttft_total_s``
        (compressor + TTFT), the quality columns and the task's columns (``task_kind``, ``answer_gold``, ...).
    """
    kw = {} if strategy in LOSSLESS else {"ratio": ratio}
    result = compress(task.context, task.question, loaded.tokenizer, strategy, loaded=loaded, **kw, **options)
    rec = answer(loaded, result, settings)
    rec.update(result.to_record())
    rec["total_s"] = result.compressor_s + rec["e2e_s"]
    rec["ttft_total_s"] = result.compressor_s + rec["ttft_s"]
    rec.update(answer_scores(rec["text"], task.answer))
    if score:
        key = (repr(result.messages()), task.answer) if scores is not None and result.prefix_cache is None else None
        got = scores.get(key) if key is not None else None
        if got is None:
            got = gold_logprob(loaded, result.messages(), task.answer, result.prefix_cache, result.prefix_ids)
            if key is not None:
                scores[key] = got
        rec.update(got)
    rec["rouge_l"] = quality.rouge_l(rec["text"], reference) if reference is not None else float("nan")
    rec.update(task_kind=task.kind, language=task.language, answer_gold=task.answer, depth=task.depth,
               needle_kept=float(task.needle in result.text))
    return rec


def _task(loaded, cfg: Config, kind: str, p: dict):
    return haystack.make_task(kind, loaded.tokenizer, p["context_tokens"], p["depth"], seed=cfg.seed, language=cfg.language)


def _reference(loaded, cfg: Config, task, references: dict) -> str:
    """The uncompressed answer of ``task`` (ROUGE-L's reference): the ``none`` point's when it ran, else generated
    once, untimed."""
    key = (task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.temperature, cfg.seed)
    if key not in references:
        plain = compress(task.context, task.question, loaded.tokenizer)
        references[key] = answer(loaded, plain, cfg.settings())["text"]
    return references[key]


def _request(rec: dict, r: int, task) -> dict:
    rec.update(repeat=r, batch_size=1)
    rec.pop("depth", None)  # the point's requested depth column wins; the measured one is kept below
    rec["fact_depth"] = task.depth
    return rec


def _point_extra(requests: list[dict], kind: str) -> dict:
    """:data:`QUALITY_COLUMNS` as ``_mean`` and :data:`TIME_COLUMNS` as ``_p50`` over a point's requests, ``task``."""
    extra = {f"{c}_mean": statistics.fmean(float(x[c]) for x in requests) for c in QUALITY_COLUMNS}
    extra.update({f"{c}_p50": statistics.median(float(x[c]) for x in requests) for c in TIME_COLUMNS})
    extra["task"] = kind
    fallbacks = [x["detail_retrieval_fallback"] for x in requests if "detail_retrieval_fallback" in x]
    if fallbacks:  # retrieval whose chunks all scored the same fell back to head truncation (recorded)
        extra["retrieval_fallback_rate"] = sum(f != "none" for f in fallbacks) / len(fallbacks)
    return extra


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """Measure one point: ``cfg.repeats`` requests (compress + answer + score), back to back.

    Args:
        loaded: the model.
        cfg: the sweep config.
        point: ``strategy``, ``ratio``, ``context_tokens``, ``depth``.
        state: shared across the points of one run: ``state["task"]``, the task kind (``cfg.task``, the
            default, or ``chat``), and ``state["references"]``, uncompressed answers by task (for ROUGE-L):
            taken from the ``none`` point when it ran first, else generated once, untimed.

    Returns:
        :class:`workbench.run.point_result.PointResult`: ``requests``, ``wall_s`` and ``extra`` (:func:`_point_extra`).
    """
    kind = state.get("task", cfg.task)
    references = state.setdefault("references", {})
    task = _task(loaded, cfg, kind, point)
    key = (task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.temperature, cfg.seed)
    reference = references.get(key) if point["strategy"] == "none" else _reference(loaded, cfg, task, references)
    requests = []
    for r in range(cfg.repeats):
        rec = evaluate(loaded, task, point["strategy"], point["ratio"], cfg.settings(cfg.seed + r), reference=reference,
                       scores=state.setdefault("scores", {}), chunk_tokens=cfg.chunk_tokens)
        if point["strategy"] == "none" and r == 0:  # the task's reference, for this point's later repeats too
            references[key] = reference = rec["text"]
            rec["rouge_l"] = 1.0
        requests.append(_request(rec, r, task))
    return PointResult(requests=requests, wall_s=sum(x["total_s"] for x in requests),
                       extra=_point_extra(requests, kind))


def compare_lengths(table) -> dict:
    """Per context length, each (strategy, ratio) arm's total time over ``none``'s from the interleaved rounds.

    Args:
        table: one row per timed request: ``context_tokens``, ``depth``, ``round``, ``arm`` (``(strategy,
            ratio)``, or :data:`workbench.stats.comparison.AA` for ``none`` measured again) and ``value``
            (``total_s``).

    Returns:
        ``{(context_tokens, (strategy, ratio)): columns}``: the arm's ``time_ratio`` columns (pairs within (round,
        task) units, the task the depth; Holm over the length's arms) and the length's A/A columns (none without
        ``none``).
    """
    out = {}
    for n, g in table.groupby("context_tokens"):
        base = next((a for a in g["arm"] if a != comparison.AA and a[0] == "none"), None)
        if base is not None:
            comp = comparison.compare(g, base, task="depth")
            for a in dict.fromkeys(g["arm"]):
                if a != comparison.AA:
                    out[(n, a)] = {**comparison.arm_columns(comp, a), **comp.columns()}
    return out


def measure_interleaved(loaded, cfg: Config, points: list[dict], state: dict) -> dict[str, PointResult]:
    """Every document point as an interleaved arm (:mod:`workbench.stats.comparison`), with the A/A control.

    ``cfg.repeats`` rounds: round ``r`` measures every point once (:func:`evaluate` at seed ``cfg.seed + r``)
    plus ``none`` a second time on every task (:data:`workbench.stats.comparison.AA`: timed, neither scored nor
    stored), in an order shuffled per round from ``cfg.seed``; then :func:`compare_lengths` on the ``total_s``.
    ROUGE-L is scored afterwards against ``none``'s round-0 answer of the task (no untimed reference request
    where ``none`` was measured).

    Args: as :func:`measure_point`'s, with ``points`` the document grid (:meth:`Config.grid`).

    Returns:
        ``{point_id: PointResult}``: a row per round (``repeat`` = round), ``extra`` as :func:`measure_point`'s
        plus the ``time_ratio`` and A/A columns (NaN at a length without ``none``).
    """
    import pandas as pd

    kind = state.get("task", cfg.task)
    references = state.setdefault("references", {})
    by_pid = {point_result.point_id(EXPERIMENT, p): p for p in points}
    tasks = {}
    for p in points:
        tasks.setdefault((p["context_tokens"], p["depth"]), _task(loaded, cfg, kind, p))
    arms = [*by_pid, *[(comparison.AA, pid) for pid, p in by_pid.items() if p["strategy"] == "none"]]
    got, table = {pid: [] for pid in by_pid}, []
    for rnd, arm in comparison.schedule(arms, cfg.repeats, cfg.seed):
        again = isinstance(arm, tuple)
        p = by_pid[arm[1] if again else arm]
        task = tasks[(p["context_tokens"], p["depth"])]
        rec = evaluate(loaded, task, p["strategy"], p["ratio"], cfg.settings(cfg.seed + rnd), score=not again,
                       scores=state.setdefault("scores", {}), chunk_tokens=cfg.chunk_tokens)
        table.append({"context_tokens": p["context_tokens"], "depth": p["depth"], "round": rnd,
                      "arm": comparison.AA if again else (p["strategy"], p["ratio"]), "value": rec["total_s"]})
        if not again:
            got[arm].append(_request(rec, rnd, task))
    for pid, p in by_pid.items():  # none's first answer is the task's reference
        if p["strategy"] == "none":
            task = tasks[(p["context_tokens"], p["depth"])]
            references[(task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.temperature, cfg.seed)] = got[pid][0]["text"]
    ratios = compare_lengths(pd.DataFrame(table))
    out = {}
    for pid, p in by_pid.items():
        reference = _reference(loaded, cfg, tasks[(p["context_tokens"], p["depth"])], references)
        for rec in got[pid]:
            first_none = p["strategy"] == "none" and rec["repeat"] == 0
            rec["rouge_l"] = 1.0 if first_none else quality.rouge_l(rec["text"], reference)
        extra = {**_point_extra(got[pid], kind), **ratios.get((p["context_tokens"], (p["strategy"], p["ratio"])), {})}
        out[pid] = PointResult(requests=got[pid], wall_s=sum(x["total_s"] for x in got[pid]), extra=extra)
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Run the document experiment (``compression``) and the chat experiment (``compression_chat``).

    First ``cfg.warmup`` untimed warm-ups (:func:`workbench.measure.generation.warm_up`, a scoring pass, and the
    embedder when ``dense`` runs). With 2+ document points and ``repeats`` >= 2 the document points are measured
    interleaved with the A/A control (:func:`measure_interleaved`) and reach the disk together when the last round
    ends; else, and for the chat sweep, point by point (:func:`measure_point`).

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
    grid = cfg.grid()

    def measure(p):
        if len(grid) < 2 or cfg.repeats < 2:
            return measure_point(loaded, cfg, p, doc_state)
        return block_share(doc_state, point_result.point_id(EXPERIMENT, p),
                           lambda: measure_interleaved(loaded, cfg, grid, doc_state))

    doc = run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded, config=cfg)
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

    Answers have a fixed length (``ignore_eos``), so decode time cancels and the saving is prefill. Method, from the
    measured points: fit TTFT against prefilled tokens over all points of the experiment (``ttft = a + b * tokens``,
    least squares; pooling every point makes the per-token prefill cost ``b`` robust to noise), fit each strategy's
    compressor time against context length (``c + d * L``), and solve ``c + d * L = b * L * (1 - 1 / ratio)`` with
    the strategy's mean achieved ratio: ``L* = c / (b * (1 - 1/ratio) - d)``. ``inf`` when the compressor grows at
    least as fast as the prefill it saves, 0 when it costs nothing. ``direct_tokens`` is the crossing of straight
    lines through the measured total times (``none`` vs the strategy), for comparison;
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


def _arm(at, strategy, ratio):
    """The points of one (strategy, ratio) arm among one length's points (a lossless strategy has one ratio)."""
    return at[(at["strategy"] == strategy) & ((at["ratio"] == ratio) | at["strategy"].isin(LOSSLESS))]


def _label(strategy, ratio) -> str:
    return strategy + (f" at ratio {ratio:g}" if strategy not in LOSSLESS and ratio == ratio else "")


def _versus_none(at, strategy, ratio, level: float, paired: bool, name: str) -> tuple[str, str, str, str]:
    """One arm against ``none`` at one length: ``(match verdict, time verdict, match phrase, time clause)``. Match:
    Newcombe interval of the difference of shares over the tasks at ``level``; time: the points' paired ratio
    (``paired``: :func:`workbench.stats.comparison.verdict_columns`, its clause with the A/A noise floor), else a
    Welch ratio over the tasks at ``level``."""
    mine, none = _arm(at, strategy, ratio), at[at["strategy"] == "none"]
    k, n, k0, n0 = int(round(mine[MATCH].sum())), len(mine), int(round(none[MATCH].sum())), len(none)
    mv = evidence.difference_verdict(evidence.difference_interval(k, n, k0, n0, level))
    word = {"higher": "better than", "lower": "worse than"}.get(mv, "no different beyond noise from")
    vs = f"{word} none's {k0} of {n0}"
    if paired:
        return mv, comparison.verdict_columns(mine.iloc[0]), vs, comparison.describe_columns(mine.iloc[0], name)
    t = evidence.ratio_interval(mine[TOTAL], none[TOTAL], level, unit="tasks")
    return mv, evidence.ratio_verdict(t), vs, evidence.describe_ratio(t, name)


def finding(points) -> "evidence.Finding":
    """Per context length: the best strategy (answer match, then likelihood, then total time, valid points only),
    with its evidence against ``none``: answer match over the tasks (one per depth; Newcombe interval of the
    difference of shares, at Holm's first level ``1 - 0.05 / m`` for the best of ``m`` arms) and total time: from
    interleaved rounds the points' paired ratio (``time_ratio``: (round, task) units, Holm over the arms) with the
    A/A noise floor beside it; from one repeat (nothing paired, no control; said so) a Welch ratio over the tasks.

    A pick other than ``none`` is backed when its match is better or its total time shorter beyond noise; ``none``
    itself when every other arm is worse in match or slower beyond noise; with an A/A control that moved nothing is
    ("not supported: the A/A control moved"). The finding is supported only when every length's pick is backed; a
    pick that is not says why in the first sentence, so that its mark agrees.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    usable = evidence.usable_points(points)
    best = best_strategy(usable)
    if best.empty:
        return evidence.Finding("No valid compression point finished.", "", False)
    parts, clauses, ev, supported, ids = [], [], [], True, []
    for _, r in best.iterrows():
        L, pick = int(r["context_tokens"]), (r["strategy"], r["ratio"])
        at = usable[usable["context_tokens"] == L]
        paired = "time_ratio" in at and "design" in at and bool((at["design"].notna() & at["time_ratio"].notna()).any())
        others = [a for a in dict.fromkeys(zip(at["strategy"], at["ratio"])) if a[0] != "none"]
        level = 1 - (1 - evidence.CONFIDENCE) / max(1, len(others))  # the best of m arms: Holm's first step
        ids += list(evidence.point_ids(_arm(at, *pick))) + list(evidence.point_ids(at[at["strategy"] == "none"]))
        k, n = int(round(_arm(at, *pick)[MATCH].sum())), len(_arm(at, *pick))  # one task per point
        text = f"{L} tokens: {_label(*pick)} (match {k} of {n} tasks"
        moved = paired and comparison.aa_moved_columns(at[at["design"].notna()].iloc[0])
        has_none = bool((at["strategy"] == "none").any())
        if pick[0] != "none" and has_none:
            name = f"{_label(*pick)} at {L} tokens, total time vs none"
            mv, tv, vs, clause = _versus_none(at, *pick, level, paired, name)
            clauses.append(clause)
            text += f", {vs}, total {r[TOTAL]:.2f} s vs {r['none_' + TOTAL]:.2f} s)"
            why = (comparison.AA_MOVED if moved else "" if mv == "higher" or tv == "lower" else
                   "not supported: match not better and total time not shorter than none's beyond noise")
            ev.append(f"{L} tokens: {n} and {int((at['strategy'] == 'none').sum())} tasks (one per depth); the best of "
                      f"{len(others)} arms, match interval at {level:.1%} (Holm's first step)")
        else:
            text += f", total {r[TOTAL]:.2f} s)"
            verdicts = [_versus_none(at, *a, level, paired, "")[:2] for a in others]
            why = (comparison.AA_MOVED if moved else "not supported: none not measured at this length" if not has_none
                   else "not supported: no strategy compared" if not others else
                   "" if all(mv == "lower" or tv == "higher" for mv, tv in verdicts) else
                   "not supported: not better than every other strategy beyond noise (match or total time)")
            ev.append(f"{L} tokens: {n} tasks; no strategy beat none on match, likelihood and time")
        supported &= not why
        parts.append(text + (f": {why}" if why else ""))
        if paired:
            ev[-1] += f"; total time paired within {int(at['rounds'].dropna().iloc[0])} interleaved rounds x tasks"
    text = "Best strategy per context length - " + "; ".join(parts) + "."
    if clauses:
        text += " " + " ".join(c + "." for c in clauses)
    if "design" not in usable or not usable["design"].notna().any():
        text += " Measured point by point (one repeat): no paired ratios, no A/A control."
    elif not clauses:
        aa = comparison.aa_from_columns(usable[usable["design"].notna()].iloc[0])
        text += f" {comparison.noise_floor_text(aa, 'interleaved', aa.n if aa else None)}."
    return evidence.Finding(text, "valid points only; " + "; ".join(ev), supported, tuple(dict.fromkeys(ids)))


# ----------------------------------------------------------------------------- figures


@plots.split_by_device
def figures(points, chat_points=None) -> dict:
    """The experiment's figures, by name, in report order (:mod:`.charts`).

    - ``quality_vs_ratio``: answer match, gold log-likelihood and ROUGE-L vs achieved ratio;
    - ``time_vs_ratio``: TTFT (model only), compressor + TTFT, and total time vs target ratio;
    - ``total_vs_length`` and ``break_even``: total time vs context length, and the fitted break-even;
    - ``depth_length_heatmap``: gold log-likelihood per needle depth x context length;
    - ``best_strategy``: the best strategy per context length;
    - ``compression_time_ratio``: total time over none with the A/A band, from interleaved rounds;
    - ``chat``: the chat experiment (TTFT, prefilled tokens, match), when given.
    """
    s = summarise(points)
    figs = {"quality_vs_ratio": fc.quality_vs_ratio(s), "time_vs_ratio": fc.time_vs_ratio(s),
            "total_vs_length": fc.total_vs_length(s),
            "break_even": fc.table_figure(break_even(points), "Break-even context length (tokens): where compressor "
                                          "time is repaid by the prefill it saves (fits over all points)"),
            "depth_length_heatmap": fc.depth_length_heatmap(points),
            "best_strategy": fc.table_figure(best_strategy(points), "Best strategy per context length")}
    if "time_ratio" in points and points["time_ratio"].notna().any():  # interleaved rounds (issue 32)
        figs["compression_time_ratio"] = fc.time_ratio(points)
    if chat_points is not None and len(chat_points):
        figs["chat"] = fc.chat(chat_points)
    return figs


__all__ = [
    "EXPERIMENT", "CHAT_EXPERIMENT", "Config", "answer_scores", "evaluate", "measure_point", "run",
    "measure_interleaved", "compare_lengths", "summarise", "break_even", "quality_at", "best_strategy", "finding",
    "figures",
]
