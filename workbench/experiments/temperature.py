"""Temperature x top-p sweep: output length, repetition, quality and speed per sampling setting.

What it measures (notebook ``03_temperature``): for every (prompt family,
temperature, top_p) point, one batch of prompts of that family (English and
Chinese) generated ``repeats`` times with seeds ``seed + r`` (the samples), and
for each answer the metrics of :mod:`workbench.measure.quality` (length, truncation,
distinct-n, repeated 4-gram rate, gzip ratio, section coverage for reports,
exact / substring match and ROUGE-L for factual questions, perplexity under the
model at temperature 1). Speed comes from the same records (TPOT, e2e,
throughput per point).

Design (issue 32; :mod:`workbench.stats.comparison`): with 2+ points and ``repeats`` >= 2 the points are
measured interleaved by round (:func:`measure_interleaved`): round ``r`` generates the family's batch once
for every point, at seed ``seed + r`` (the same prompts and seed for every arm of a round), plus the first
family's greedy point a second time, the A/A control, in an order shuffled per round from the seed. Each
point's time per answer (e2e) over its family's baseline (the lowest temperature) is the paired
within-round ratio, Holm over the family's arms (``time_ratio`` columns), and every point carries the A/A
columns (:data:`workbench.stats.comparison.COLUMNS`): the noise floor the finding prints beside the ratio.
The text outcomes (truncation, repetition, length) keep their intervals over answers: a machine's drift
does not change a text.

Families (:mod:`workbench.inputs.prompts`): ``report`` ("write a report in N sections
on TOPIC", long-form) and ``factual`` (short questions with known answers from
``data/factual_qa.jsonl``).

Temperature 0 is greedy decoding and ignores top_p, so the grid holds it once,
recorded with ``top_p = 1.0``.

Entry points: :class:`Config`, :func:`measure_point`, :func:`run`,
:func:`quality_summary`, :func:`headline` and :func:`figures`.
"""

from __future__ import annotations

import dataclasses

from workbench.run import point_result
from workbench.share import plots
from workbench.predict import predictions
from workbench.measure import quality
from workbench.checks import check_bool, check_choice_list, check_float_list, check_int
from workbench.errors import ParameterError
from workbench.measure import energy
from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured, warm_up
from workbench.run.point_result import PointResult
from workbench.run.sweeps import SweepConfig, block_share, measure_generation, run_sweep
from workbench.stats import comparison

EXPERIMENT = "temperature"
FAMILIES = ("report", "factual")


@dataclasses.dataclass
class Config(SweepConfig):
    """The temperature / top-p sweep (notebook ``03_temperature``).

    Attributes:
        temperatures: sampling temperatures, each a finite number >= 0 (0 = greedy).
        top_ps: nucleus masses, each in (0, 1] (unused at temperature 0).
        families: prompt families, from ``report`` and ``factual``.
        languages: prompt languages, from ``en`` and ``zh``.
        n_report_prompts: report prompts per language (1..8).
        n_sections: sections each report is asked for (>= 1).
        n_factual_prompts: factual questions per language (1..20).
        max_new_tokens: new-token cap of report answers (>= 1).
        factual_max_new_tokens: new-token cap of factual answers (>= 1); the embedded model ends its
            English answers within ~36 tokens (greedy), so 48 leaves room for sampled ones.
        repeats: samples per setting (seeds ``seed .. seed + repeats - 1``).
        perplexity: score each answer's perplexity under the model (one forward pass each).
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
    perplexity: bool = True
    target_chars: int = 2000

    def __post_init__(self):
        super().__post_init__()
        check_float_list("temperatures", self.temperatures, lo=0)
        check_float_list("top_ps", self.top_ps, lo=0, hi=1, lo_open=True)
        check_choice_list("families", self.families, FAMILIES)
        check_choice_list("languages", self.languages, ("en", "zh"))
        check_int("n_sections", self.n_sections, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_int("factual_max_new_tokens", self.factual_max_new_tokens, 1)
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
        if with_perplexity:
            i = rec["request_id"]
            if i not in prompt_ids:
                prompt_ids[i] = encode_prompts(loaded.tokenizer, [pd_["prompt"]])["input_ids"][0].tolist()
            rec["perplexity"] = quality.perplexity(loaded, prompt_ids[i], rec["output_ids"])
        else:
            rec["perplexity"] = float("nan")


def _point_extra(requests: list[dict], n_prompts: int) -> dict:
    """A point's ``extra``: ``truncated_rate``, ``output_tokens_mean`` and the batch's shape."""
    n = len(requests)
    return {
        "truncated_rate": sum(r["truncated"] for r in requests) / n if n else float("nan"),
        "output_tokens_mean": sum(r["output_tokens"] for r in requests) / n if n else float("nan"),
        # the shape every forward pass of the family's batch ran at (left padding to the longest prompt):
        # what the roofline's prediction beside the measured points needs
        "batch_size": n_prompts,
        "prompt_tokens": max((r["prompt_tokens"] for r in requests), default=float("nan")),
    }


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> PointResult:
    """One (family, temperature, top_p) point: ``repeats`` seeded samples of the family's batch, scored.

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


def _mean_e2e(records: list[dict]) -> float:
    """The time per answer of one batch: the mean e2e over its answers (NaN when none produced a token)."""
    done = [r["e2e_s"] for r in records if r.get("output_tokens", 0) >= 1 and r.get("e2e_s") == r.get("e2e_s")]
    return sum(done) / len(done) if done else float("nan")


def measure_interleaved(loaded, cfg: Config, points: list[dict]) -> dict[str, PointResult]:
    """Every point as an interleaved arm (:mod:`workbench.stats.comparison`), with the A/A control.

    Each point is warmed up ``cfg.warmup`` times, then ``cfg.repeats`` rounds: round ``r`` generates its family's
    batch once for every point at seed ``cfg.seed + r`` (every arm of a round answers the same prompts with the
    same seed), plus the first family's baseline (:func:`baselines`: greedy) a second time
    (:data:`workbench.stats.comparison.AA`), in an order shuffled per round from ``cfg.seed``. The A/A batches
    are timed, never scored nor stored. Per family, every point's time per answer (mean e2e of a batch) is
    judged against the family's baseline from the paired within-round ratios, Holm over the family's arms
    (:func:`workbench.stats.comparison.compare`).

    Returns:
        ``{point_id: PointResult}``: requests scored as in :func:`measure_point` (``repeat`` = round), ``extra`` with
        its columns, the ``time_ratio`` columns (:func:`workbench.stats.comparison.arm_columns`) and the A/A columns
        (:data:`workbench.stats.comparison.COLUMNS`, the first family's control, the experiment's noise floor).
    """
    pids = [point_result.point_id(EXPERIMENT, p) for p in points]
    by_pid = dict(zip(pids, points))
    base_pid = {fam: point_result.point_id(EXPERIMENT, p) for fam, p in baselines(points).items()}
    first_base = base_pid[points[0]["family"]]
    dicts = {fam: cfg.prompts(fam) for fam in base_pid}
    texts = {fam: [d["prompt"] for d in ds] for fam, ds in dicts.items()}
    settings = {pid: cfg.settings(p) for pid, p in by_pid.items()}
    got = {pid: {"requests": [], "wall_s": 0.0, "meter": energy.EnergyMeter(loaded.info.device),
                 "warmup_s": warm_up(loaded, texts[p["family"]], settings[pid], cfg.warmup)}
           for pid, p in by_pid.items()}
    rows = []
    for rnd, arm in comparison.schedule([*pids, comparison.AA], cfg.repeats, cfg.seed):
        pid = first_base if arm == comparison.AA else arm
        s = settings[pid]
        prompts = texts[by_pid[pid]["family"]]
        meter = got[pid]["meter"] if arm != comparison.AA else None
        if meter is not None:
            meter.begin()
        res = generate_measured(loaded, prompts, dataclasses.replace(s, seed=s.seed + rnd))
        if meter is not None:
            meter.end(res.wall_s)
        rows.append({"arm": arm, "round": rnd, "value": _mean_e2e(res.records)})
        if arm != comparison.AA:
            for rec in res.records:
                rec.update(repeat=rnd, batch_size=len(prompts), batch_wall_s=res.wall_s)
            got[pid]["requests"] += res.records
            got[pid]["wall_s"] += res.wall_s
    import pandas as pd

    table = pd.DataFrame(rows)
    groups = {base: [pid for pid in pids if by_pid[pid]["family"] == fam]  # the A/A's group first
              for fam, base in sorted(base_pid.items(), key=lambda kv: kv[1] != first_base)}
    ratio_cols, aa_cols = comparison.compare_groups(table, groups)
    out = {}
    for pid, p in by_pid.items():
        g = got[pid]
        score_records(loaded, g["requests"], dicts[p["family"]], cfg.perplexity)
        extra = {**_point_extra(g["requests"], len(dicts[p["family"]])), **ratio_cols[pid], **aa_cols}
        out[pid] = PointResult(requests=g["requests"], wall_s=g["wall_s"], warmup_s=g["warmup_s"],
                               energy=g["meter"].result(), extra=extra)
    return out


def run(cfg: Config, run_dir, loaded, resume: bool = False):
    """Every point of ``cfg.grid()`` through :func:`workbench.run.sweeps.run_sweep`; returns the points DataFrame.

    With 2+ points and ``repeats`` >= 2 the points are measured interleaved by round with the A/A control
    (:func:`measure_interleaved`) and reach the disk together when the last round ends (an interrupt before that
    keeps none of them); with one repeat there is nothing to pair and each point is measured, and written, on
    its own (:func:`measure_point`).
    """
    state: dict = {}
    grid = cfg.grid()

    def measure(p):
        if len(grid) < 2 or cfg.repeats < 2:
            return measure_point(loaded, cfg, p, state)
        return block_share(state, point_result.point_id(EXPERIMENT, p),
                           lambda: measure_interleaved(loaded, cfg, grid))

    return run_sweep(run_dir, EXPERIMENT, grid, measure, resume=resume, info=loaded.info, loaded=loaded, config=cfg)


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


def _change(name: str, verdict: str, before: str, after: str) -> str:
    """``"<name> rises 0.01 -> 0.20"`` for a direction, else ``"<name>: no difference beyond noise (...)"``."""
    move = {"higher": "rises", "lower": "falls"}.get(verdict)
    return f"{name} {move} {before} -> {after}" if move else f"{name}: {verdict} ({before} -> {after})"


def finding(summary, requests=None, points=None):
    """From the lowest to the highest temperature: the change in truncation (Newcombe interval of two shares)
    and in the repeated 4-gram rate and output length (Welch intervals), each with a direction only when
    its interval excludes 0; "not supported" when most greedy answers are cut by ``max_new_tokens``
    (:data:`TRUNCATION_LIMIT`: then the outputs cannot show what temperature does to length or repetition).
    Interleaved runs add the time per answer's paired ratio with the A/A noise floor (:func:`time_clauses`), after
    the text outcomes: it never sets the mark.

    Args:
        summary: :func:`quality_summary` (used when ``requests`` is None: truncation only).
        requests: this experiment's requests with the quality columns (the independent answers).
        points: its points, so that only usable (valid) points count.

    Returns:
        :class:`workbench.stats.evidence.Finding`.
    """
    from workbench.stats import evidence

    if requests is None or requests.empty or "truncated" not in requests:
        df = summary[summary["metric"] == "truncated"]
        if df.empty:
            return evidence.Finding("No quality metrics recorded.", "", False)
        k = (df["mean"] * df["n"]).groupby(df["temperature"]).sum().round().astype(int)
        n = df.groupby("temperature")["n"].sum().astype(int)
        samples = None
    else:
        samples = _samples(requests, points)
        if samples.empty:
            return evidence.Finding("No valid temperature point.", "", False)
        trunc = samples["truncated"].astype(float)
        k = trunc.groupby(samples["temperature"]).sum().round().astype(int)
        n = trunc.groupby(samples["temperature"]).count().astype(int)
    lo, hi = min(n.index), max(n.index)
    ids = evidence.point_ids(evidence.usable_points(points)) if points is not None else ()
    greedy_share = k[lo] / n[lo] if n[lo] else float("nan")
    evidence_parts = [f"{n[lo]} answers at temperature {lo:g}, {n[hi]} at {hi:g}"
                      + (" (greedy repeats counted once, valid points only)" if samples is not None else "")]
    timing, timing_ev = time_clauses(points)
    evidence_parts += timing_ev
    if not greedy_share <= TRUNCATION_LIMIT:
        return evidence.Finding(
            f"Temperature's effect on length and repetition: not supported: {greedy_share:.0%} of the answers at "
            f"temperature {lo:g} ({k[lo]} of {n[lo]}) hit max_new_tokens, so the outputs are too short to show it; "
            f"raise max_new_tokens." + timing, "; ".join(evidence_parts), False, ids)
    parts, supported, moved = [], False, []
    d = evidence.difference_interval(int(k[hi]), int(n[hi]), int(k[lo]), int(n[lo]))
    v = evidence.difference_verdict(d)
    supported |= v in ("higher", "lower")
    moved.append(v in ("higher", "lower"))
    parts.append(_change("the share of answers cut by max_new_tokens", v, f"{k[lo] / n[lo]:.0%}",
                         f"{k[hi] / n[hi]:.0%}"))
    evidence_parts.append(f"truncation change {d.describe('{:+.2f}')}")
    if samples is not None:
        for col, name, fmt in (("repeated_4gram_rate", "the repeated 4-gram rate", "{:.3f}"),
                               ("output_tokens", "the answer length (tokens)", "{:.1f}")):
            if col not in samples:
                continue
            a = samples.loc[samples["temperature"] == hi, col].astype(float)
            b = samples.loc[samples["temperature"] == lo, col].astype(float)
            iv = evidence.mean_difference_interval(a, b, unit="answers")
            v = evidence.difference_verdict(iv)
            supported |= v in ("higher", "lower")
            moved.append(v in ("higher", "lower"))
            parts.append(_change(name, v, fmt.format(b.mean()), fmt.format(a.mean())))
            evidence_parts.append(f"{col} change {iv.describe(fmt.replace(':', ':+'))}")
    parts = [p for _, p in sorted(zip(moved, parts), key=lambda mp: not mp[0])]  # a change beyond noise leads
    return evidence.Finding(f"From temperature {lo:g} to {hi:g}, " + "; ".join(parts) + "." + timing,
                            "; ".join(evidence_parts), supported, ids)


def time_clauses(points) -> tuple[str, list[str]]:
    """The timing part of the finding, from the points' ``time_ratio`` and A/A columns (interleaved runs):
    per family, the time per answer (e2e) at its highest temperature (largest top_p) over its baseline, with
    the A/A noise floor beside it (:func:`workbench.stats.comparison.describe_columns`: "not supported: the A/A
    control moved" when the control's interval excludes 1). It follows the text outcomes and never sets the
    finding's mark. Returns ``(" sentence." or "", evidence parts)``."""
    from workbench.stats import evidence

    if points is None or len(points) == 0 or "time_ratio" not in points or "design" not in points:
        return "", []
    ok = evidence.usable_points(points)
    ok = ok[ok["design"].notna()] if "design" in ok else ok.iloc[0:0]
    if ok.empty:
        return "", []
    clauses, ev = [], []
    fams = list(dict.fromkeys(ok["family"]))
    for fam in fams:
        g = ok[ok["family"] == fam]
        base = baselines(g.to_dict("records"))[fam]
        top = g[g["temperature"] == g["temperature"].max()].sort_values("top_p").iloc[-1]
        if top["temperature"] == base["temperature"]:
            continue
        name = (f"time per answer (e2e) at temperature {top['temperature']:g} vs {base['temperature']:g}"
                + (f" ({fam})" if len(fams) > 1 else ""))
        clauses.append(comparison.describe_columns(top, name[0].upper() + name[1:]))
        ev.append(f"{fam} e2e ratios paired within {int(top['rounds'])} interleaved rounds"
                  if top.get("rounds") == top.get("rounds") else f"{fam} e2e ratios paired within rounds")
    if not clauses:
        aa = comparison.aa_from_columns(ok.iloc[0])
        return f" {comparison.noise_floor_text(aa, 'interleaved', aa.n if aa else None)}.", ev
    return " " + " ".join(c + "." for c in clauses), ev


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


def fig_time_ratio(points):
    """Time per answer (e2e) of every point over its family's baseline (paired within rounds, its interval at
    the point's Holm level) vs temperature, with the A/A noise floor shaded."""
    fig = comparison.ratio_figure(plots.ok_points(points).sort_values("temperature"), "temperature",
                                  group=["family", "top_p"], name=lambda k: f"{k[0]}, top_p {k[1]:g}",
                                  mode="lines+markers", sort=True)
    fig.update_layout(title="Time per answer over the lowest temperature (paired within rounds; grey band: the A/A "
                            "noise floor)", xaxis_title=_T_LABEL, yaxis_title="e2e ratio vs baseline (x)")
    return plots.legend_below(fig)


@plots.split_by_device
def figures(summary, points) -> dict:
    """Every figure of the notebook, by name, in report order (families absent from the run are skipped)."""
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
    if "time_ratio" in points and points["time_ratio"].notna().any():  # interleaved rounds (issue 32)
        figs["temperature_time_ratio"] = fig_time_ratio(points)
    return figs
