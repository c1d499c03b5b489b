"""Context compression experiment: what shrinking the input does to TTFT and to answer quality.

What it measures (notebook ``06_context_compression``): strategy x target ratio x context length x needle depth on
seeded passkey tasks over real text (:mod:`workbench.inputs.haystack`). Each request compresses its task with
:func:`workbench.techniques.compression.compress` (``compressor_s``), answers it with the model (TTFT, end-to-end;
fixed-length answers so total times compare like for like) and scores the answer: substring and exact match
(:func:`workbench.measure.quality.substring_match`, :func:`workbench.measure.quality.exact_match`), the gold answer's
log-likelihood (:func:`workbench.techniques.answering.gold_logprob`) and ROUGE-L against the uncompressed run's answer
(:func:`workbench.measure.quality.rouge_l`). A chat experiment compares lossless KV prefix reuse with compression of
a chat history whose fact sits in an early turn.

Design (issue 49; :mod:`workbench.run.design`): with 2+ document points and ``repeats`` >= 2 the arms are the
(strategy, ratio, context length) triples, each length's ``none`` their marked control, the first length's ``none``
again as the A/A arm (:func:`document_design`, :func:`measure_design`). Round ``k`` answers every arm's task at depth
``depths[k % T]``: the tasks are taken in turn, so the arms of a round answer the same task and a round is a (pass,
task) unit; the rounds are the blocks of the analysis (:mod:`workbench.stats.blocks`: one pooled variance,
simultaneous intervals, three verdicts), rounds added while a strategy is undecided. The primary outcome is the
total time (compressor + answer, a fixed answer length), ``time_ratio`` on every point of the arm. Answer quality is
a paired analysis over the same tasks (:func:`quality_versus_none`: McNemar with an exact interval; a task's match the
majority over its passes, greedy answers repeating). ``summary`` (one depth only) and the chat sweep
(``compression_chat``) are measured point by point; with one repeat every point is.

Point columns beyond :func:`workbench.stats.metrics.summarize_point`: ``<quality>_mean`` over the repeats
(:data:`QUALITY_COLUMNS`) and ``<time or count>_p50`` (:data:`TIME_COLUMNS`). Entry points: :class:`Config`,
:func:`evaluate`, :func:`measure_point`, :func:`run`, the summaries :func:`summarise`, :func:`break_even`,
:func:`quality_at`, :func:`best_strategy`, :func:`finding`, and :func:`figures`.

Parts (this module is the experiment's face and re-exports them): :mod:`.summaries` (the design's arms and outcome,
the summaries and the finding), :mod:`.charts` (the figures from the point tables).
"""

from __future__ import annotations

import dataclasses
import statistics

from workbench.checks import check_bool, check_choice, check_choice_list, check_float_list, check_int, check_int_list
from workbench.errors import ParameterError
from workbench.experiments.context_compression import charts as fc
from workbench.experiments.context_compression.charts import (  # noqa: F401
    ACHIEVED,
    COMPRESSOR,
    LOGPROB,
    MATCH,
    PREFILLED,
    ROUGE,
    TOTAL,
    TTFT,
    TTFT_TOTAL,
)
from workbench.experiments.context_compression.summaries import (
    EXPERIMENT,
    TOTAL_TIME,
    arm_key,
    arm_label,
    best_strategy,
    break_even,
    finding,
    quality_at,
    quality_versus_none,
    summarise,
    task_matches,
)
from workbench.inputs import haystack
from workbench.measure import generation, quality
from workbench.measure.generation import GenerationSettings
from workbench.run import design, point_result, results
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, run_sweep
from workbench.share import plots
from workbench.techniques.answering import answer, gold_logprob
from workbench.techniques.compression import LOSSLESS, STRATEGIES, compress, embedder

CHAT_EXPERIMENT = "compression_chat"
TASKS = ("needle", "multikey")

#: Per-request columns averaged per point (``<name>_mean``) and those summarised by their median (``<name>_p50``).
QUALITY_COLUMNS = ("substring_match", "exact_match", "gold_logprob", "gold_logprob_per_token", "rouge_l",
                   "needle_kept")
TIME_COLUMNS = ("compressor_s", "total_s", "ttft_total_s", "achieved_ratio", "compressed_tokens", "original_tokens",
                "prefilled_tokens")


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The context-compression sweep (notebook ``06_context_compression``).

    With 2+ document points and ``repeats`` >= 2 they are one design (:func:`document_design`): ``repeats`` passes
    over the tasks (depths) first, then up to ``max_rounds`` passes while a strategy's total time against ``none``
    is undecided and ``budget_s`` allows; ``margin`` is the equivalence margin.

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
        self.check_design()
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

    def planned_design(self) -> tuple[str, int, int, int] | None:
        """The design (``workbench plan``): one arm per (strategy, ratio, context length) but ``summary``, a round
        per task (depth), ``repeats`` passes over the tasks first."""
        arms = len({(p["strategy"], p["ratio"], p["context_tokens"]) for p in self.grid() if p["strategy"] != "summary"})
        tasks = len(self.depths)
        return ((EXPERIMENT, arms, int(self.repeats) * tasks, int(self.max_rounds) * tasks)
                if arms >= 2 and self.repeats >= 2 else None)

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


def designed_points(cfg: Config, points: list[dict]) -> list[dict]:
    """The document points measured as the design's arms: every point but ``summary``'s (run at one depth only, so
    it has no task in every round; measured point by point)."""
    return [p for p in points if p["strategy"] != "summary"]


def document_design(cfg: Config, points: list[dict]) -> design.Design:
    """The document points as one design (:func:`measure_design`): the arms are the (strategy, ratio, context
    length) triples (:func:`arm_key`), each length's ``none`` the marked control of its arms (groups), the first
    length's ``none`` again as the A/A arm; the primary outcome the request's total time (compressor + answer). Round
    ``k`` answers every arm's task at depth ``depths[k % T]`` (T depths, in turn), so a round is a (pass, task) unit:
    the arms of a round answer the same task, and the tasks' different times sit in the round's block effect.
    ``repeats`` passes first (``repeats * T`` rounds), up to ``max_rounds`` passes."""
    pts = designed_points(cfg, points)
    arms = list(dict.fromkeys(arm_key(p) for p in pts))
    groups: dict = {}
    for p in pts:
        groups.setdefault(int(p["context_tokens"]), []).append(arm_key(p))
    controls = {}
    for L, members in groups.items():
        base = f"none@1@{L}"
        if base in members:
            controls[base] = list(dict.fromkeys(members))
    if not controls:
        raise ParameterError("strategies: the design compares with none; add 'none' to strategies")
    t = len(cfg.depths)
    kw = cfg.design_kwargs()
    kw.update(min_rounds=cfg.repeats * t, max_rounds=max(cfg.max_rounds, cfg.repeats) * t)
    members = [a for m in controls.values() for a in m]
    return design.Design(EXPERIMENT, [a for a in arms if a in members], next(iter(controls)), TOTAL_TIME,
                         groups=controls, **kw)


def measure_design(loaded, cfg: Config, points: list[dict], state: dict, run_dir=None) -> dict[str, PointResult]:
    """Every document point measured through one design (:func:`document_design`, :func:`workbench.run.design.run_design`).

    Round ``k`` answers each arm's task at depth ``depths[k % T]`` (:func:`evaluate`, the pass ``k // T`` at seed
    ``cfg.seed + k // T``), in an order shuffled per round, and ``none`` at the first length again (the A/A arm,
    timed, kept apart). ROUGE-L is scored afterwards against ``none``'s first answer of the task.

    Args: as :func:`measure_point`'s, with ``points`` the document grid (:meth:`Config.grid`) and ``run_dir`` the run
        folder (rounds stored and resumed there).

    Returns:
        ``{point_id: PointResult}`` of the designed points: a request per pass (``repeat`` = pass), ``extra`` as
        :func:`measure_point`'s plus the arm's design columns (``time_ratio`` with its simultaneous interval and
        verdict, the A/A columns, ``rounds``: the design's (pass, task) rounds).
    """
    kind = state.get("task", cfg.task)
    references = state.setdefault("references", {})
    pts = designed_points(cfg, points)
    d = document_design(cfg, points)
    t = len(cfg.depths)
    by_arm = {}
    for p in pts:
        by_arm.setdefault(arm_key(p), p)
    tasks: dict = {}

    def task_of(L, depth):
        if (L, depth) not in tasks:
            tasks[(L, depth)] = _task(loaded, cfg, kind, {"context_tokens": L, "depth": depth})
        return tasks[(L, depth)]

    def measure(arm, rnd):
        p = by_arm[arm]
        depth = cfg.depths[rnd % t]
        task = task_of(int(p["context_tokens"]), depth)
        rec = evaluate(loaded, task, p["strategy"], p["ratio"], cfg.settings(cfg.seed + rnd // t),
                       scores=state.setdefault("scores", {}), chunk_tokens=cfg.chunk_tokens)
        rec = _request(rec, rnd // t, task)
        rec["_depth"] = depth
        return design.Measured({TOTAL_TIME.name: rec["total_s"]}, [rec], rec["e2e_s"])

    result = design.run_design(d, measure, None, run_dir=run_dir)
    design.remember_spread(result, run_dir)
    state["design"] = result
    out = {}
    got = {}
    for arm in d.arms:
        for rec in result.requests.get(arm, []):
            rec["repeat"] = int(rec["repeat"]) // t        # the runner's round -> the pass over the tasks
            got.setdefault((arm, rec.pop("_depth")), []).append(rec)
    for p in pts:     # none's first answer is the task's reference
        if p["strategy"] == "none":
            first = sorted(got.get((arm_key(p), p["depth"]), []), key=lambda r: r["repeat"])
            task = task_of(int(p["context_tokens"]), p["depth"])
            if first:
                references[(task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.temperature, cfg.seed)] = first[0]["text"]
    for p in pts:
        arm, pid = arm_key(p), point_result.point_id(EXPERIMENT, p)
        recs = sorted(got.get((arm, p["depth"]), []), key=lambda r: r["repeat"])
        reference = _reference(loaded, cfg, task_of(int(p["context_tokens"]), p["depth"]), references)
        for rec in recs:
            first_none = p["strategy"] == "none" and rec["repeat"] == 0
            rec["rouge_l"] = 1.0 if first_none else quality.rouge_l(rec["text"], reference)
        extra = {**_point_extra(recs, kind), **result.point_columns(arm)}
        out[pid] = PointResult(requests=recs, wall_s=sum(x["total_s"] for x in recs), extra=extra)
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Run the document experiment (``compression``) and the chat experiment (``compression_chat``).

    First ``cfg.warmup`` untimed warm-ups (:func:`workbench.measure.generation.warm_up`, a scoring pass, and the
    embedder when ``dense`` runs). With 2+ document points and ``repeats`` >= 2 the document points are measured
    as one design (:func:`measure_design`; every finished round on disk, a resume continues from the last) and
    reach the points table when it stops; else, and for ``summary`` and the chat sweep, point by point
    (:func:`measure_point`).

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
    made: dict = {}
    if "none" in cfg.strategies and len(designed_points(cfg, grid)) >= 2 and cfg.repeats >= 2:   # one design
        done = results.finished_points(run_dir) if resume else set()
        if any(point_result.point_id(EXPERIMENT, p) not in done for p in designed_points(cfg, grid)):
            made = measure_design(loaded, cfg, grid, doc_state, run_dir)

    def measure(p):
        pid = point_result.point_id(EXPERIMENT, p)
        return made[pid] if pid in made else measure_point(loaded, cfg, p, doc_state)

    doc = run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded, config=cfg)
    chat = pd.DataFrame()
    if cfg.chat_lengths and cfg.chat_strategies:
        chat_state = {"task": "chat", "references": references}
        chat = run_sweep(run_dir, CHAT_EXPERIMENT, cfg.chat_grid(),
                         lambda p: measure_point(loaded, cfg, p, chat_state), resume=resume,
                         info=loaded.info, loaded=loaded, config=cfg)
    return doc, chat


# ----------------------------------------------------------------------------- figures


def time_ratio_figure(points, run_dir=None):
    """Each (strategy, ratio)'s total time over ``none``'s at its context length with the simultaneous interval its
    verdict was read from, each round's ratio faint, the equivalence band and the A/A control
    (:func:`workbench.share.figures_design.ratio_figure`)."""
    from workbench.share import figures_design

    df = plots.ok_points(points).drop_duplicates(["strategy", "ratio", "context_tokens"])
    df = df.assign(point_id=df.apply(arm_key, axis=1), arm=df.apply(lambda r: arm_label(r["strategy"], r["ratio"]),
                                                                   axis=1))
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, TOTAL_TIME.name)
    return figures_design.ratio_figure(
        df, "arm", TOTAL_TIME.prefix, rounds, group="context_tokens", name=lambda n: f"{n:g} tokens",
        x_title="strategy (target ratio)", y_title="total time / none's (x)",
        title="Total time (compressor + answer) over none (simultaneous 95% intervals; faint: each round)")


@plots.split_by_device
def figures(points, chat_points=None, run_dir=None) -> dict:
    """The experiment's figures, by name, in report order (:mod:`.charts`).

    - ``quality_vs_ratio``: answer match, gold log-likelihood and ROUGE-L vs achieved ratio;
    - ``time_vs_ratio``: TTFT (model only), compressor + TTFT, and total time vs target ratio;
    - ``total_vs_length`` and ``break_even``: total time vs context length, and the fitted break-even;
    - ``depth_length_heatmap``: gold log-likelihood per needle depth x context length;
    - ``best_strategy``: the best strategy per context length;
    - ``compression_time_ratio``: total time over none with the design's intervals, each round faint (``run_dir``);
    - ``chat``: the chat experiment (TTFT, prefilled tokens, match), when given.
    """
    s = summarise(points)
    figs = {"quality_vs_ratio": fc.quality_vs_ratio(s), "time_vs_ratio": fc.time_vs_ratio(s),
            "total_vs_length": fc.total_vs_length(s),
            "break_even": fc.table_figure(break_even(points), "Break-even context length (tokens): where compressor "
                                          "time is repaid by the prefill it saves (fits over all points)"),
            "depth_length_heatmap": fc.depth_length_heatmap(points),
            "best_strategy": fc.table_figure(best_strategy(points), "Best strategy per context length")}
    if "time_ratio" in points and points["time_ratio"].notna().any():  # one design (issue 49)
        figs["compression_time_ratio"] = time_ratio_figure(points, run_dir)
    if chat_points is not None and len(chat_points):
        figs["chat"] = fc.chat(chat_points)
    return figs


__all__ = [
    "EXPERIMENT", "CHAT_EXPERIMENT", "Config", "answer_scores", "evaluate", "measure_point", "run", "TOTAL_TIME",
    "arm_key", "arm_label", "designed_points", "document_design", "measure_design", "quality_versus_none",
    "task_matches", "summarise", "break_even", "quality_at", "best_strategy", "finding", "time_ratio_figure",
    "figures",
]
