"""Temperature x top-p sweep: output length, repetition, quality and speed per sampling setting.

What it measures (notebook ``03_temperature``): for every (prompt family,
temperature, top_p) point, one batch of prompts of that family (English and
Chinese) generated once per round with seed ``seed + round`` (the samples), and
for each answer the metrics of :mod:`workbench.measure.quality` (length, truncation,
distinct-n, repeated 4-gram rate, gzip ratio, section coverage for reports,
exact / substring match and ROUGE-L for factual questions, perplexity under the
model at temperature 1). Speed comes from the same records (TPOT, e2e,
throughput per point).

Design (issue 49; :mod:`workbench.run.design`): with 2+ points and ``repeats`` >= 2 the points are the arms of one
design (:func:`sweep_design`): every round generates each family's batch once per point at seed ``seed + round``
(the same prompts and seed for every arm of a round) and the first family's baseline (the lowest temperature,
greedy when the grid holds 0; marked, not taken from the row order) a second time, the A/A control, in an order
shuffled per round; ``repeats`` rounds first, then more while the primary comparison is undecided, up to
``max_rounds`` and within ``budget_s``. Each family's points are a group against the family's baseline.

- **Primary outcome** (it alone sets the finding's verdict): the time per output token (TPOT, the batch's median
  row) over the baseline's, block analysis of the rounds (:mod:`workbench.stats.blocks`): what sampling costs the
  engine per token. Not the time per answer: a sampled answer's length changes from round to round while a greedy
  one's does not, so the e2e of the sampled arms spreads far more than the baseline's and one pooled variance
  would misstate it.
- **Secondary outcomes**, each with its own verdict and never the mark: the time per answer (e2e, the batch's
  mean; it carries the length change) from the same design at the secondary level, and the text outcomes over
  independent answers (truncation share, repeated 4-gram rate, answer length: greedy repeats counted once),
  Bonferroni over those three (:data:`TEXT_OUTCOMES`). A machine's drift does not change a text, so the text
  outcomes need no rounds.

Families (:mod:`workbench.inputs.prompts`): ``report`` ("write a report in N sections
on TOPIC", long-form) and ``factual`` (short questions with known answers from
``data/factual_qa.jsonl``).

Temperature 0 is greedy decoding and ignores top_p, so the grid holds it once,
recorded with ``top_p = 1.0``.

Entry points: :class:`Config`, :func:`measure_point`, :func:`run`,
:func:`quality_summary`, :func:`headline`, :func:`finding` and :func:`figures`.
"""

from __future__ import annotations

import dataclasses
import math

from workbench.checks import check_bool, check_choice_list, check_float_list, check_int
from workbench.errors import ParameterError
from workbench.measure import quality
from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured, warm_up
from workbench.predict import predictions
from workbench.run import design, design_sweep, point_result
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, measure_generation, run_sweep
from workbench.share import figures_design, plots
from workbench.stats import blocks

EXPERIMENT = "temperature"
FAMILIES = ("report", "factual")


@dataclasses.dataclass
class Config(SweepConfig, design.DesignFields):
    """The temperature / top-p sweep (notebook ``03_temperature``).

    With 2+ points and ``repeats`` >= 2 the points are the arms of one design (:func:`sweep_design`): ``repeats``
    rounds first, up to ``max_rounds`` while the primary comparison is undecided and ``budget_s`` allows.

    Attributes:
        temperatures: sampling temperatures, each a finite number >= 0 (0 = greedy).
        top_ps: nucleus masses, each in (0, 1] (unused at temperature 0).
        families: prompt families, from ``report`` and ``factual``.
        languages: prompt languages, from ``en`` and ``zh``.
        n_report_prompts: report prompts per language (1..8).
        n_sections: sections each report is asked for (>= 1).
        n_factual_prompts: factual questions per language (1..20).
        max_new_tokens: new-token cap of report answers (>= 2: a time per output token needs two tokens).
        factual_max_new_tokens: new-token cap of factual answers (>= 2); the embedded model ends its
            English answers within ~36 tokens (greedy), so 48 leaves room for sampled ones.
        repeats: rounds measured before the first look (seeds ``seed .. seed + repeats - 1``): each round is one
            sample per setting.
        perplexity: score each answer's perplexity under the model (batched forward passes, untimed).
        target_chars: a target answer length in characters, turned into a
            ``max_new_tokens`` per language in the notebook (report only).
    """

    temperatures: list = dataclasses.field(default_factory=lambda: [0.0, 0.7, 1.2])
    top_ps: list = dataclasses.field(default_factory=lambda: [0.9, 1.0])
    families: list = dataclasses.field(default_factory=lambda: ["report", "factual"])
    languages: list = dataclasses.field(default_factory=lambda: ["en", "zh"])
    n_report_prompts: int = 1
    n_sections: int = 3
    n_factual_prompts: int = 2
    max_new_tokens: int = 48
    factual_max_new_tokens: int = 48
    repeats: int = 2
    max_rounds: int = 6
    perplexity: bool = True
    target_chars: int = 2000

    def __post_init__(self):
        super().__post_init__()
        self.check_design()
        check_float_list("temperatures", self.temperatures, lo=0)
        check_float_list("top_ps", self.top_ps, lo=0, hi=1, lo_open=True)
        check_choice_list("families", self.families, FAMILIES)
        check_choice_list("languages", self.languages, ("en", "zh"))
        check_int("n_sections", self.n_sections, 1)
        check_int("max_new_tokens", self.max_new_tokens, 2)
        check_int("factual_max_new_tokens", self.factual_max_new_tokens, 2)
        check_int("n_report_prompts", self.n_report_prompts, 1, 8)
        check_int("n_factual_prompts", self.n_factual_prompts, 1, 20)
        check_bool("perplexity", self.perplexity)
        check_int("target_chars", self.target_chars, 1)
        limit = self.max_context()
        if max(self.max_new_tokens, self.factual_max_new_tokens) + 256 > limit:
            raise ParameterError(f"max_new_tokens: must leave room for the prompt within the model maximum {limit}")

    def grid(self) -> list[dict]:
        """Points: family outermost, then temperature, then top_p; temperature 0 once (top_p 1.0)."""
        out = []
        for fam in self.families:
            for t in self.temperatures:
                for p in ([1.0] if t == 0 else self.top_ps):
                    pt = {"family": fam, "temperature": float(t), "top_p": float(p)}
                    if pt not in out:
                        out.append(pt)
        return out

    def prompts(self, family: str) -> list[dict]:
        """The prompt dicts of a family (see :func:`workbench.inputs.prompts.report_prompts`)."""
        from workbench.inputs.prompts import factual_prompts, report_prompts

        if family == "report":
            return report_prompts(self.n_report_prompts, self.n_sections, self.languages)
        return factual_prompts(self.n_factual_prompts, self.languages)

    def settings(self, point: dict) -> GenerationSettings:
        cap = self.max_new_tokens if point["family"] == "report" else self.factual_max_new_tokens
        return GenerationSettings(max_new_tokens=cap, temperature=point["temperature"], top_p=point["top_p"],
                                  seed=self.seed)


def score_records(loaded, records: list[dict], prompt_dicts: list[dict], with_perplexity: bool = True) -> None:
    """Add the prompt's columns and :func:`workbench.measure.quality.score_output` (+ ``perplexity``) to each record, in place.

    ``record["request_id"]`` indexes ``prompt_dicts``; the prompt text itself is
    not stored (family, language and topic identify it).
    """
    prompt_ids = {}
    for rec in records:
        pd_ = prompt_dicts[rec["request_id"]]
        rec.update(family=pd_["family"], language=pd_["language"], topic=pd_["topic"], n_sections=pd_["n_sections"],
                   sample=rec.get("repeat", 0))
        rec.update(quality.score_output(rec["text"], rec["finish_reason"], pd_["n_sections"], pd_["answers"]))
        rec["perplexity"] = float("nan")
        i = rec["request_id"]
        if with_perplexity and i not in prompt_ids:
            prompt_ids[i] = encode_prompts(loaded.tokenizer, [pd_["prompt"]])["input_ids"][0].tolist()
    if with_perplexity and records:   # the answers scored in batches (quality.perplexities), not one pass each
        values = quality.perplexities(loaded, [prompt_ids[r["request_id"]] for r in records],
                                      [list(r["output_ids"]) for r in records])
        for rec, value in zip(records, values):
            rec["perplexity"] = value


def _point_extra(requests: list[dict], n_prompts: int) -> dict:
    """A point's ``extra``: ``truncated_rate``, ``output_tokens_mean`` and the batch's shape."""
    n = len(requests)
    return {
        "truncated_rate": sum(bool(r["truncated"]) for r in requests) / n if n else float("nan"),
        "output_tokens_mean": sum(r["output_tokens"] for r in requests) / n if n else float("nan"),
        # the shape every forward pass of the family's batch ran at (left padding to the longest prompt):
        # what the roofline's prediction beside the measured points needs
        "batch_size": n_prompts,
        "prompt_tokens": max((r["prompt_tokens"] for r in requests), default=float("nan")),
    }


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One (family, temperature, top_p) point: ``repeats`` seeded samples of the family's batch, scored (the
    one-repeat fallback of :func:`run`: one round pairs nothing).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the sweep's config.
        point: ``{"family", "temperature", "top_p"}``.
        state: the sweep's shared state (unused: every point warms up itself).

    Returns:
        :class:`workbench.run.point_result.PointResult`; ``extra`` holds ``truncated_rate`` (share of
        answers cut by ``max_new_tokens``) and ``output_tokens_mean``.
    """
    prompt_dicts = cfg.prompts(point["family"])
    out = measure_generation(loaded, [p["prompt"] for p in prompt_dicts], cfg.settings(point), cfg.repeats, cfg.warmup)
    score_records(loaded, out.requests, prompt_dicts, cfg.perplexity)
    out.extra = _point_extra(out.requests, len(prompt_dicts))
    return out


def baselines(points: list[dict]) -> dict[str, dict]:
    """Per family, its baseline point: the lowest temperature (greedy when the grid holds 0), the largest top_p."""
    out = {}
    for p in points:
        b = out.get(p["family"])
        if b is None or (p["temperature"], -p["top_p"]) < (b["temperature"], -b["top_p"]):
            out[p["family"]] = p
    return out


def hottest(points: list[dict]) -> dict[str, dict]:
    """Per family, the point its finding compares with the baseline: the highest temperature, the largest top_p."""
    out = {}
    for p in points:
        b = out.get(p["family"])
        if b is None or (p["temperature"], p["top_p"]) > (b["temperature"], b["top_p"]):
            out[p["family"]] = p
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _mean_e2e(records: list[dict]) -> float:
    """The time per answer of one batch: the mean e2e over its answers (NaN when none produced a token)."""
    done = [r["e2e_s"] for r in records if r.get("output_tokens", 0) >= 1 and _finite(r.get("e2e_s"))]
    return sum(done) / len(done) if done else float("nan")


def _median_tpot(records: list[dict]) -> float:
    """The time per output token of one batch: the median of its rows' TPOT (the rows step together; NaN when no
    row has two tokens)."""
    import numpy as np

    vals = [r["tpot_s"] for r in records if _finite(r.get("tpot_s"))]
    return float(np.median(vals)) if vals else float("nan")


#: The primary outcome: it alone sets the finding's verdict (the engine's cost of sampling, per token).
TPOT = design.Outcome("tpot_s", False, "time per output token (TPOT)", "tpot_vs_control")
#: A secondary outcome from the same rounds: the time per answer, which also carries the answers' length change.
E2E = design.Outcome("e2e_s", False, "time per answer (e2e)", "time_ratio")


def sweep_design(loaded, cfg: Config, points: list[dict]) -> design_sweep.SweepDesign:
    """The points as one design (:mod:`workbench.run.design`): round ``r`` generates each point's family batch once
    at seed ``cfg.seed + r`` (every arm of a round answers the same prompts with the same seed), and the first
    family's baseline a second time (the A/A control: timed, neither scored nor stored). Each family's points are a
    group against the family's baseline (:func:`baselines`, marked); the primary outcome is the batch's TPOT
    (:data:`TPOT`), the time per answer (:data:`E2E`) secondary; the design stops early once every family's hottest
    point (:func:`hottest`) is decided. The answers are scored after the design (:func:`score_records`, each arm's
    own requests), so the rounds time generation only.

    Returns:
        :class:`workbench.run.design_sweep.SweepDesign` for :func:`workbench.run.sweeps.run_sweep`.
    """
    pid = (lambda p: point_result.point_id(EXPERIMENT, p))
    by_id = {pid(p): p for p in points}
    fams = list(dict.fromkeys(p["family"] for p in points))
    dicts = {fam: cfg.prompts(fam) for fam in fams}
    texts = {fam: [d["prompt"] for d in ds] for fam, ds in dicts.items()}
    base = {fam: pid(p) for fam, p in baselines(points).items()}

    def measure(p, rnd):
        s = cfg.settings(p)
        prompts = texts[p["family"]]
        res = generate_measured(loaded, prompts, dataclasses.replace(s, seed=s.seed + rnd))
        for rec in res.records:
            rec.update(batch_size=len(prompts), batch_wall_s=res.wall_s)
        return design.Measured({TPOT.name: _median_tpot(res.records), E2E.name: _mean_e2e(res.records)},
                               res.records, res.wall_s)

    def extra(point_id, result):
        p = by_id[point_id.split("@cfg-")[0]]      # a changed config's ids carry a suffix (resume_check)
        recs = result.requests.get(point_id, [])
        score_records(loaded, recs, dicts[p["family"]], cfg.perplexity)
        return _point_extra(recs, len(dicts[p["family"]]))

    groups = {base[fam]: [pid(p) for p in points if p["family"] == fam] for fam in fams}
    decide = [pid(p) for p in hottest(points).values() if pid(p) not in groups]
    d = design.Design(EXPERIMENT, [pid(p) for p in points], base[fams[0]], TPOT, (E2E,), groups=groups,
                      decide=decide or None, **cfg.design_kwargs())
    return design_sweep.SweepDesign(d, measure, lambda p: warm_up(loaded, texts[p["family"]], cfg.settings(p), cfg.warmup),
                              extra)


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every point of ``cfg.grid()`` through :func:`workbench.run.sweeps.run_sweep`; returns the points DataFrame.

    With 2+ points and ``repeats`` >= 2 the points are one design (:func:`sweep_design`): every finished round is on
    disk (``design/temperature.parquet``) and a resume continues from the last one; the points are recorded when the
    design stops. With one repeat there is nothing to pair and each point is measured, and written, on its own
    (:func:`measure_point`).
    """
    state: dict = {}
    grid = cfg.grid()
    designed = sweep_design(loaded, cfg, grid) if len(grid) >= 2 and cfg.repeats >= 2 else None
    return run_sweep(run_dir, EXPERIMENT, grid, lambda p: measure_point(loaded, cfg, p, state), resume=resume,
                     info=loaded.info, loaded=loaded, config=cfg, design=designed)


QUALITY_BY = ("family", "language", "temperature", "top_p")


def quality_summary(requests, by=QUALITY_BY, confidence: float = 0.95):
    """Mean and 95% interval (Wilson for shares, t otherwise) of every quality metric per (family, language,
    temperature, top_p)."""
    return quality.summarize(requests, list(by), confidence=confidence)


def headline(summary, metrics=("truncated", "repeated_4gram_rate", "distinct_2", "compression_ratio")):
    """Wide table: per family and temperature (top_p pooled by taking the largest), mean [CI] of key metrics."""
    df = summary[summary["metric"].isin(metrics)].copy()
    df = df[df["top_p"] == df.groupby(["family", "temperature"])["top_p"].transform("max")]
    df["value"] = df.apply(lambda r: f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]", axis=1)
    return df.pivot_table(index=["family", "language", "temperature", "top_p"], columns="metric", values="value",
                          aggfunc="first")


TRUNCATION_LIMIT = 0.5  # above this share of greedy answers cut by max_new_tokens, length and repetition say nothing

#: The text outcomes over independent answers (secondary: reported with their own verdicts, never the mark):
#: ``(column, name, format)``; their intervals are Bonferroni over the three (:data:`TEXT_LEVEL`).
TEXT_OUTCOMES = (("truncated", "the share of answers cut by max_new_tokens", "{:.0%}"),
                 ("repeated_4gram_rate", "the repeated 4-gram rate", "{:.3f}"),
                 ("output_tokens", "the answer length (tokens)", "{:.1f}"))
TEXT_LEVEL = 1 - blocks.ALPHA / len(TEXT_OUTCOMES)


def _samples(requests, points=None):
    """Independent answers: rows of usable points only, one row per prompt at temperature 0 (greedy
    repeats are the same answer again), the largest top_p per temperature (greedy ignores top_p)."""
    from workbench.stats import evidence

    df = requests
    if points is not None and "point_id" in df:
        df = df[df["point_id"].isin(evidence.usable_points(points)["point_id"])]
    if "top_p" in df:
        df = df[(df["temperature"] == 0) | (df["top_p"] == df.groupby("temperature")["top_p"].transform("max"))]
    if "repeat" in df:
        df = df[(df["temperature"] != 0) | (df["repeat"] == df["repeat"].min())]
    return df


def _change(name: str, interval, before: str, after: str) -> str:
    """``"<name> rises 0.01 -> 0.20"`` when the interval of the change excludes 0 (with a spread:
    :func:`workbench.stats.blocks.additive_verdict`), else ``"<name>: undecided (0.01 -> 0.02)"``."""
    verdict, direction = blocks.additive_verdict(interval.low, interval.high)
    if verdict == "direction":
        return f"{name} {'rises' if direction == 'higher' else 'falls'} {before} -> {after}"
    return f"{name}: undecided ({before} -> {after})"


def text_clauses(samples, lo: float, hi: float) -> tuple[list[str], list[str]]:
    """The text outcomes (:data:`TEXT_OUTCOMES`) from temperature ``lo`` to ``hi`` over independent answers, each
    with its own verdict at :data:`TEXT_LEVEL`: the truncation share's change (Newcombe), the repeated 4-gram rate's
    and the answer length's (Welch). When most answers at ``lo`` hit ``max_new_tokens`` (:data:`TRUNCATION_LIMIT`)
    length and repetition cannot show temperature's effect: said instead of their verdicts.

    Returns:
        ``(clauses, evidence parts)``.
    """
    from workbench.stats import evidence

    at = {t: samples[samples["temperature"] == t] for t in (lo, hi)}
    k = {t: int(at[t]["truncated"].astype(float).sum()) for t in (lo, hi)}
    n = {t: int(at[t]["truncated"].notna().sum()) for t in (lo, hi)}
    d = evidence.difference_interval(k[hi], n[hi], k[lo], n[lo], confidence=TEXT_LEVEL)
    clauses = [_change(TEXT_OUTCOMES[0][1], d, f"{k[lo] / n[lo]:.0%}" if n[lo] else "?",
                       f"{k[hi] / n[hi]:.0%}" if n[hi] else "?")]
    ev = [f"truncation change {d.describe('{:+.2f}')}"]
    share = k[lo] / n[lo] if n[lo] else float("nan")
    if not share <= TRUNCATION_LIMIT:
        clauses.append(f"length and repetition cannot show it: {share:.0%} of the answers at temperature {lo:g} "
                       f"({k[lo]} of {n[lo]}) hit max_new_tokens (raise max_new_tokens)")
        return clauses, ev
    for col, name, fmt in TEXT_OUTCOMES[1:]:
        if col not in samples:
            continue
        a, b = at[hi][col].astype(float), at[lo][col].astype(float)
        iv = evidence.mean_difference_interval(a, b, confidence=TEXT_LEVEL, unit="answers")
        clauses.append(_change(name, iv, fmt.format(b.mean()), fmt.format(a.mean())))
        ev.append(f"{col} change {iv.describe(fmt.replace(':', ':+').replace('%', ''))}")
    return clauses, ev


def _design_rows(points):
    """The usable points measured as a design (their decision columns), or None."""
    from workbench.stats import evidence

    if points is None or len(points) == 0 or "design" not in points or TPOT.prefix not in points:
        return None
    ok = evidence.usable_points(points)
    ok = ok[ok["design"].map(lambda v: isinstance(v, str) and bool(v))]
    return ok if len(ok) else None


def primary_decisions(points) -> list[tuple]:
    """Per family, the hottest point's (:func:`hottest`) primary decision against the family's baseline, from the
    design's point columns: ``[(family, baseline row, hottest row, Decision or None)]`` (families with one
    temperature left out)."""
    rows = _design_rows(points)
    if rows is None:
        return []
    out = []
    for fam, g in rows.groupby("family", sort=False):
        recs = g.to_dict("records")
        base, top = baselines(recs)[fam], hottest(recs)[fam]
        if top["point_id"] == base["point_id"]:
            continue
        out.append((fam, base, top, design.decision_from_row(top, TPOT)))
    return out


def finding(summary, requests=None, points=None):
    """What temperature costs and changes, with ONE primary comparison setting the verdict.

    The primary comparison, per family: the hottest point's time per output token against the family's baseline
    (greedy), the design's block analysis (:data:`TPOT`; the verdict of the family that is least decided,
    :func:`workbench.run.design.weakest`; an A/A control that moved leaves it undecided). Secondary, each with its
    own verdict and never the mark: the time per answer (e2e) from the same rounds, and from the lowest to the
    highest temperature over independent answers the truncation share, the repeated 4-gram rate and the answer
    length (:func:`text_clauses`, Bonferroni over the three). A run without a design (one repeat) decides nothing:
    undecided.

    Args:
        summary: :func:`quality_summary` (used when ``requests`` is None: truncation only).
        requests: this experiment's requests with the quality columns (the independent answers).
        points: its points, so that only usable (valid) points count and the design's decisions are read.

    Returns:
        :class:`workbench.stats.evidence.Finding` with its verdict.
    """
    from workbench.stats import evidence

    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    if requests is None or requests.empty or "truncated" not in requests:
        df = summary[summary["metric"] == "truncated"] if len(summary) else summary
        if df.empty:
            return evidence.Finding("No quality metrics recorded.", "", False, verdict="undecided")
        samples = None
        temps = sorted(set(df["temperature"]))
    else:
        samples = _samples(requests, points)
        if samples.empty:
            return evidence.nothing_valid("temperature point", points)
        temps = sorted(set(samples["temperature"]))
    lo, hi = temps[0], temps[-1]
    decisions = primary_decisions(points)
    clauses, second, ev = [], [], []
    for fam, base, top, dec in decisions:
        tag = f" ({fam})" if len(decisions) > 1 else ""
        t0, t1 = f"{base['temperature']:g}", f"{top['temperature']:g}"
        spr = float(top.get("seconds_per_round", float("nan")))
        if dec is None:
            clauses.append(f"TPOT at temperature {t1} vs {t0}{tag}: undecided: no decision recorded")
            continue
        clauses.append(dec.describe(f"Time per output token (TPOT) at temperature {t1} vs {t0}{tag}",
                                    words=TPOT.words, seconds_per_round=spr))
        sec = design.secondary_clause(top, E2E, f"time per answer (e2e) at temperature {t1} vs {t0}{tag}")
        if sec is not None:
            second.append(sec)
    rows = _design_rows(points)
    if rows is not None:
        first = rows.iloc[0]
        ev.append(f"primary: TPOT (the batch's median row) per round, {design.evidence_text(first)}")
        others = [f"{r['family']} T={r['temperature']:g} top_p {r['top_p']:g}: {r[TPOT.prefix + '_verdict']} "
                  f"{r[TPOT.prefix]:.2f}x" for _, r in rows.iterrows()
                  if isinstance(r.get(TPOT.prefix + "_verdict"), str) and r.get(TPOT.prefix + "_verdict")]
        if others:
            ev.append("TPOT vs the family's baseline, every arm: " + ", ".join(others))
    if samples is not None and lo != hi:
        n = samples.groupby("temperature")["truncated"].count()
        text_part, text_ev = text_clauses(samples, lo, hi)
        second.append(f"from temperature {lo:g} to {hi:g} over answers ({TEXT_LEVEL:.1%} intervals, Bonferroni over "
                      f"{len(TEXT_OUTCOMES)}): " + "; ".join(text_part))
        ev += [f"{n[lo]} answers at temperature {lo:g}, {n[hi]} at {hi:g} (greedy repeats counted once, valid points "
               f"only)", *text_ev]
    weakest = design.weakest([d for *_, d in decisions])
    if weakest is None:
        text = (f"Time per output token (TPOT) from temperature {lo:g} to {hi:g}: undecided: no comparison "
                f"(one round pairs nothing: repeats >= 2 measure the temperatures as a design).")
        fields = {"verdict": "undecided"}
    else:
        row = next(top for *_, top, d in decisions if d is weakest)
        text = "; ".join(clauses) + "."
        fields = design.finding_fields(row, weakest)
        if row.get("aa_verdict") == "direction":
            text += " The A/A control moved (greedy against itself shows a direction): drift, not effects."
            fields["verdict"] = "undecided"
    if second:
        text += " Secondary, each with its own verdict: " + "; ".join(second) + "."
    return evidence.Finding(text, "; ".join(ev), True, ids, **fields)


def length_targets(tokenizer, target_chars: int, languages=("en", "zh")):
    """Characters per token of the tokenizer per language and the ``max_new_tokens`` a target length needs.

    Returns:
        ``pandas.DataFrame``: language, chars_per_token, target_chars, max_new_tokens
        (:func:`workbench.inputs.prompts.max_new_tokens_for_chars`, 10% margin).
    """
    import pandas as pd

    from workbench.inputs.prompts import chars_per_token, max_new_tokens_for_chars

    return pd.DataFrame([
        {"language": lang, "chars_per_token": chars_per_token(tokenizer, lang), "target_chars": target_chars,
         "max_new_tokens": max_new_tokens_for_chars(tokenizer, target_chars, lang)}
        for lang in languages
    ])


def samples_markdown(requests, max_chars: int = 600) -> str:
    """The generated texts as Markdown, grouped by family, language, topic and setting (for reading, not scoring)."""
    cols = ["family", "language", "topic", "temperature", "top_p", "sample"]
    lines = ["# Generated samples", ""]
    for _, r in requests.sort_values(cols).iterrows():
        text = str(r["text"])
        text = text if len(text) <= max_chars else text[:max_chars] + " [...]"
        lines += [f"## {r['family']} / {r['language']} / {r['topic']} / T={r['temperature']:g} top_p={r['top_p']:g} "
                  f"sample {r['sample']} (seed {r['seed']}, {r['output_tokens']} tokens, {r['finish_reason']})",
                  "", "```", text, "```", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures


_T_LABEL = "temperature (0 = greedy)"


def _greedy_on_every_top_p(df):
    """Copy temperature-0 rows to every top_p present, so each top_p line starts at greedy (top_p is unused there)."""
    import pandas as pd

    greedy, rest = df[df["temperature"] == 0], df[df["temperature"] != 0]
    tops = sorted(set(rest["top_p"])) or sorted(set(greedy["top_p"]))
    return pd.concat([rest] + [greedy.assign(top_p=p) for p in tops], ignore_index=True)


def fig_metrics_vs_temperature(summary, family: str, metrics: list[str], title: str):
    """Mean with 95% interval error bars vs temperature, one panel per metric, colour = language, dash = top_p.

    The greedy (temperature 0) point is drawn on every top_p line.
    """
    import plotly.express as px

    df = _greedy_on_every_top_p(summary[(summary["family"] == family) & summary["metric"].isin(metrics)])
    df["metric"] = df["metric"].map(plots.label)
    df["err_plus"] = df["ci_high"] - df["mean"]
    df["err_minus"] = df["mean"] - df["ci_low"]
    df["top_p"] = df["top_p"].map(lambda p: f"top_p {p:g}")
    df = df.sort_values("temperature")
    orders = {"metric": [plots.label(m) for m in metrics], "language": sorted(set(df["language"])),
              "top_p": sorted(set(df["top_p"]), reverse=True)}
    fig = px.line(df, x="temperature", y="mean", color="language", line_dash="top_p", markers=True,
                  category_orders=orders,
                  error_y="err_plus", error_y_minus="err_minus", facet_col="metric", facet_col_wrap=3,
                  facet_row_spacing=0.12, labels={"temperature": _T_LABEL, "mean": "mean, 95% interval (Wilson / t)"},
                  title=title)
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    return plots.legend_below(fig)


def fig_speed_vs_temperature(points):
    """TPOT p50, e2e p50 and output throughput vs temperature, per family."""
    import pandas as pd
    import plotly.express as px

    df = predictions.predict_rows(_greedy_on_every_top_p(plots.ok_points(points)))
    cols = {c: plots.label(c) for c in ("tpot_s_p50", "e2e_s_p50", "output_throughput_tps", "output_tokens_mean")}
    long = pd.concat([df.assign(metric=label, value=df[c]) for c, label in cols.items() if c in df]
                     + [df.assign(metric=cols[c], value=df[f"predicted_{q}"], family=df["family"] + " (predicted)")
                        for c, q in (("tpot_s_p50", "tpot_s"), ("e2e_s_p50", "e2e_s"),
                                     ("output_throughput_tps", "output_throughput_tps"))
                        if c in df and df[f"predicted_{q}"].notna().any()])  # the roofline's line per family
    long["top_p"] = long["top_p"].map(lambda p: f"top_p {p:g}")
    long = long.sort_values("temperature")
    orders = {"metric": [label for c, label in cols.items() if c in df], "family": list(FAMILIES),
              "top_p": sorted(set(long["top_p"]), reverse=True)}
    fig = px.line(long, x="temperature", y="value", color="family", line_dash="top_p", markers=True,
                  category_orders=orders,
                  facet_col="metric", facet_col_wrap=2, facet_row_spacing=0.12,
                  labels={"temperature": _T_LABEL, "value": ""},
                  title="Speed vs temperature (sampling cost and output length)")
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    return plots.legend_below(fig)


def fig_ratio(points, outcome: design.Outcome, run_dir=None):
    """An outcome of the design (:data:`TPOT` or :data:`E2E`) of every point over its family's baseline, with the
    simultaneous interval its verdict was read from, each round's ratio faint, the equivalence band and the A/A
    control's interval (:func:`workbench.share.figures_design.ratio_figure`), against temperature, one line per
    (family, top_p)."""
    rounds = figures_design.round_ratios(run_dir, EXPERIMENT, outcome.name)
    fig = figures_design.ratio_figure(
        plots.ok_points(points), "temperature", outcome.prefix, rounds, group=["family", "top_p"],
        name=lambda k: f"{k[0]}, top_p {k[1]:g}", x_title=_T_LABEL, y_title=f"{outcome.label} / greedy's (x)",
        title=f"{outcome.label[0].upper() + outcome.label[1:]} over the lowest temperature (simultaneous 95% "
              f"intervals; faint: each round)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(summary, points, run_dir=None) -> dict:
    """Every figure of the notebook, by name, in report order (families absent from the run are skipped;
    ``run_dir``: the design's rounds for the ratio figures' faint points)."""
    figs = {}
    fams = set(summary["family"]) if len(summary) else set()
    if "report" in fams:
        figs["temperature_report_repetition"] = fig_metrics_vs_temperature(
            summary, "report", ["truncated", "output_tokens", "distinct_2", "repeated_4gram_rate", "compression_ratio",
                                "perplexity"],
            "Long-form reports: length, truncation and repetition vs temperature")
        figs["temperature_report_sections"] = fig_metrics_vs_temperature(
            summary, "report", ["section_coverage", "distinct_1"], "Long-form reports: section coverage vs temperature")
    if "factual" in fams:
        figs["temperature_factual_accuracy"] = fig_metrics_vs_temperature(
            summary, "factual", ["substring_match", "exact_match", "rouge_l", "perplexity", "truncated"],
            "Factual questions: accuracy vs temperature")
    figs["temperature_speed"] = fig_speed_vs_temperature(points)
    if TPOT.prefix in points and points[TPOT.prefix].notna().any():  # measured as a design (issue 49)
        figs["temperature_tpot_ratio"] = fig_ratio(points, TPOT, run_dir)
    if E2E.prefix in points and points[E2E.prefix].notna().any():
        figs["temperature_time_ratio"] = fig_ratio(points, E2E, run_dir)
    return figs
