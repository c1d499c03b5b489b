"""Long outputs: outline parsing and the one-shot / outline + sections technique.

Three ways to spend one token budget on a long text (:func:`run_long_output`):
``one_shot`` (one request); ``outline_batch`` (an outline of N sections, then
every section generated together as one batch, merged in outline order);
``outline_sequential`` (outline, then the sections one after another, each
prompt carrying a short :func:`extractive_summary` of the previous section:
consistency bought with time). The merged text is scored the same way for every
strategy with :mod:`workbench.measure.quality` (:func:`~workbench.measure.quality.section_coverage`
over :func:`split_sections`, :func:`~workbench.measure.quality.cross_section_repetition`).

:func:`parse_outline` reads numbered (``1.``, ``1)``, ``1、``), bulleted (``-``,
``*``, ``•``) and Chinese-numbered (``一、``, ``（一）``, ``第一部分``) outlines
and copes with fewer sections than asked; :func:`split_sections` finds the
headed sections of a text.

A technique, measured through :func:`workbench.measure.generation.generate_measured`;
the experiment (config, sweep, figures) is :mod:`workbench.experiments.long_output`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from workbench.checks import check_choice, check_int
from workbench.errors import ParameterError
from workbench.measure import quality
from workbench.measure.detokenize import REPLACEMENT_CHAR, first_text_index
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.stats import metrics

#: A section needs a body of at least this many words / CJK characters to count as delivered.
MIN_BODY_UNITS = 10

_CN_NUM = "一二三四五六七八九十百"
_OUTLINE_PATTERNS = [
    # (kind, regex): the title is group "t"
    ("number", re.compile(r"^\s{0,3}(?:#{1,6}\s*)?(?:\*\*)?(?:section|part|chapter)?\s*\d{1,2}\s*[.)、:：．]\s*(?P<t>.+)$", re.I)),
    ("cn_number", re.compile(rf"^\s{{0,3}}(?:#{{1,6}}\s*)?(?:\*\*)?(?:第[{_CN_NUM}\d]+\s*(?:部分|章|节|段|部|篇)?\s*[、:：.．]?|[（(][{_CN_NUM}]+[)）]|[{_CN_NUM}]+\s*[、.．:：])\s*(?P<t>.+)$")),
    ("heading", re.compile(r"^\s{0,3}#{1,6}\s+(?P<t>.+)$")),
    ("bullet", re.compile(r"^\s{0,3}[-*•·–]\s+(?P<t>.+)$")),
]


def _clean_body(t: str) -> str:
    """Strip a section's text, and a character cut in half by the length limit (a trailing U+FFFD)."""
    return t.strip().rstrip(REPLACEMENT_CHAR).rstrip()


def _clean_title(t: str) -> str:
    t = re.sub(r"\*\*|__", "", t).rstrip(REPLACEMENT_CHAR).strip()
    t = t.strip(" :：-–—.").strip()
    return t


def parse_outline(text: str, n_sections: int | None = None) -> list[str]:
    """Section titles from a model-written outline.

    Reads numbered (``1.``, ``1)``, ``1、``, ``Section 1:``), Chinese-numbered
    (``一、``, ``（一）``, ``第一部分：``), markdown-heading and bulleted
    (``-``, ``*``, ``•``) lines. The first kind found in that priority order
    wins, so sub-bullets under numbered items are ignored; lines indented more
    than three spaces are sub-items. Duplicates are dropped.

    Args:
        text: the outline as generated.
        n_sections: keep at most this many (a model may return fewer; the
            caller gets what is there).

    Returns:
        Titles in order (possibly fewer than ``n_sections``, possibly empty).
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for kind, pat in _OUTLINE_PATTERNS:
        titles, seen = [], set()
        for ln in lines:
            m = pat.match(ln)
            if not m:
                continue
            t = _clean_title(m.group("t"))
            if t and t.lower() not in seen:
                seen.add(t.lower())
                titles.append(t)
        if titles:
            return titles[:n_sections] if n_sections else titles
    return []


_HEADING = re.compile(r"^\s{0,3}(?:#{1,6}\s+(?P<h1>.+)|\*\*(?P<h2>[^*]{1,120})\*\*:?\s*$)")


def split_sections(text: str) -> list[tuple[str, str]]:
    """Split a long text into ``(heading, body)`` pairs.

    Headings are markdown ``#`` lines and whole-line ``**bold**`` lines; only
    when the text has none of those, outline-style numbered / Chinese-numbered
    lines (see :func:`parse_outline`) of at most 80 characters count instead,
    so a numbered list inside a headed section stays in its body. Text before
    the first heading is dropped when a heading exists; with none the whole
    text is one untitled section.
    """
    lines = text.splitlines()

    def heading(ln: str, numbered: bool):
        m = _HEADING.match(ln)
        if m and not numbered:
            return m.group("h1") or m.group("h2")
        if numbered and len(ln.strip()) <= 80:
            for kind, pat in _OUTLINE_PATTERNS[:2]:
                mm = pat.match(ln)
                if mm:
                    return mm.group("t")
        return None

    for numbered in (False, True):
        sections: list[tuple[str, list[str]]] = []
        for ln in lines:
            title = heading(ln, numbered)
            if title is not None and _clean_title(title):
                sections.append((_clean_title(title), []))
            elif sections:
                sections[-1][1].append(ln)
        if sections:
            return [(h, "\n".join(b).strip()) for h, b in sections]
    return [("", text.strip())] if text.strip() else []


STRATEGIES = ("one_shot", "outline_batch", "outline_sequential")

_PROMPTS = {
    "en": {
        "one_shot": "Write a detailed article titled \"{topic}\" with {n} sections. Start each section with a markdown heading (## Title).",
        "outline": "Write an outline of exactly {n} sections for an article titled \"{topic}\". Reply with a numbered list of section titles only, one per line.",
        "section": "You are writing the article \"{topic}\". Its sections are:\n{outline}\nWrite section {k}, \"{title}\", in full. Write only the text of this section, without a heading.",
        "previous": "\nThe previous section said: {summary}\nContinue from it without repeating it.",
        "fallback": "Part {k}",
    },
    "zh": {
        "one_shot": "写一篇题为《{topic}》的详细文章，分为{n}个部分。每个部分以markdown标题开头（## 标题）。",
        "outline": "为题为《{topic}》的文章写一个恰好{n}个部分的提纲。只用编号列表列出各部分标题，每行一个。",
        "section": "你正在写文章《{topic}》。文章的部分有：\n{outline}\n请完整地写第{k}部分“{title}”。只写这一部分的正文，不要标题。",
        "previous": "\n上一部分写道：{summary}\n请接着写，不要重复。",
        "fallback": "第{k}部分",
    },
}

LANGUAGES = tuple(_PROMPTS)

DEFAULT_TOPICS = {
    "en": "How a city can prepare for a long heat wave",
    "zh": "城市如何应对持续的高温天气",
}


def one_shot_prompt(topic: str, n_sections: int, language: str = "en") -> str:
    """The ``one_shot`` strategy's single user message (also what a ``one_shot`` background job sends)."""
    check_choice("language", language, LANGUAGES)
    return _PROMPTS[language]["one_shot"].format(topic=topic, n=n_sections)


def outline_titles(outline: str, n_sections: int, language: str = "en") -> list[str]:
    """Section titles of a generated outline (:func:`parse_outline`), or ``Part 1..n`` when it has none."""
    return parse_outline(outline, n_sections) or [_PROMPTS[language]["fallback"].format(k=k + 1) for k in range(n_sections)]


def section_piece(k: int, title: str, body: str) -> str:
    """Section ``k`` (0-based) of the merged text: the pieces of all sections concatenate to the text."""
    return ("\n\n" if k else "") + f"## {title}\n\n{body}"


def extractive_summary(text: str, max_units: int = 40) -> str:
    """The first sentences of ``text``, up to about ``max_units`` words / CJK characters."""
    parts = re.split(r"(?<=[.!?。！？])\s*", text.strip())
    out, count = [], 0
    for p in parts:
        if not p:
            continue
        out.append(p)
        count += len(quality.units(p))
        if count >= max_units:
            break
    return " ".join(out)[:400]


@dataclass(frozen=True)
class LongOutputPlan:
    """Token split for one budget.

    Attributes:
        budget_tokens: total new-token budget, the same for every strategy.
        n_sections: sections asked for.
        outline_tokens: budget of the outline request.
        section_tokens: budget of each section request
            (``(budget - outline) // n_sections``).
    """

    budget_tokens: int
    n_sections: int
    outline_tokens: int
    section_tokens: int

    @classmethod
    def make(cls, budget_tokens: int, n_sections: int, outline_tokens: int | None = None) -> "LongOutputPlan":
        """Split a budget; the outline gets ``outline_tokens`` (default ~12 per section, at most a quarter).

        Raises:
            ParameterError: a budget too small for the sections.
        """
        check_int("n_sections", n_sections, lo=1)
        if outline_tokens is None:
            outline_tokens = max(8, min(12 * n_sections + 8, budget_tokens // 4))
        section_tokens = (budget_tokens - outline_tokens) // n_sections
        if section_tokens < 8:
            raise ParameterError(
                f"budget_tokens: must leave >= 8 tokens per section after the outline "
                f"(got {budget_tokens} for {n_sections} sections, outline {outline_tokens})"
            )
        return cls(budget_tokens, n_sections, outline_tokens, section_tokens)


@dataclass
class LongOutputResult:
    """What one strategy produced.

    Attributes:
        row: the request row (``first_text_s``, ``wall_s``, ``output_tokens``
            summed over requests, coverage, repetition, throughput, ...; see
            :func:`run_long_output`).
        text: the merged text, as a reader would get it.
        outline: the outline text ("" for one-shot).
        titles: the section titles used (outline strategies).
        bodies: section bodies in outline order.
    """

    row: dict
    text: str
    outline: str = ""
    titles: list = field(default_factory=list)
    bodies: list = field(default_factory=list)


def _gen(loaded, prompts, settings):
    return generate_measured(loaded, prompts, settings)


def _median(values) -> float:
    """Median of the finite values (NaN when none)."""
    return metrics.percentiles([v for v in values if v is not None], (50,))["p50"]


def _first_text_at(batch, rec: dict, tokenizer=None) -> float | None:
    """``perf_counter`` time at which a record's first visible text was generated (None: no text).

    With the tokenizer and the record's ``output_ids`` this is the id at which
    :func:`workbench.measure.detokenize.first_text_index` first shows non-blank text; otherwise the first id.
    """
    stamps = token_stamps(batch, rec)
    if not stamps:
        return None
    k = 0
    if tokenizer is not None and rec.get("output_ids") is not None:
        k = first_text_index(tokenizer, rec["output_ids"])
        if k is None:
            return None
    return stamps[min(k, len(stamps) - 1)]


def token_stamps(batch, rec: dict) -> list[float]:
    """The ``perf_counter`` time of each generated token id of one record (``t_submit + ttft_s``, then the ITLs)."""
    if not rec["output_tokens"]:
        return []
    t = batch.t_submit + rec["ttft_s"]
    out = [t]
    for gap in rec["itl_s"]:
        t += gap
        out.append(t)
    return out


def run_long_output(
    loaded,
    strategy: str,
    topic: str,
    plan: LongOutputPlan,
    language: str = "en",
    temperature: float = 0.0,
    seed: int = 0,
    generate: Callable | None = None,
    on_section: Callable[[int, str], None] | None = None,
) -> LongOutputResult:
    """Generate one long text with one strategy and measure it.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        strategy: one of :data:`STRATEGIES`.
        topic: the article's title.
        plan: :class:`LongOutputPlan` (same budget for every strategy).
        language: ``en`` or ``zh`` (prompt language).
        temperature, seed: sampling settings for every request.
        generate: ``callable(loaded, prompts, settings) -> BatchResult``
            (default :func:`generate_measured`; tests pass a fake).
        on_section: outline strategies: ``callable(k, piece)`` as soon as section ``k`` (0-based, in order)
            is written; the pieces (:func:`section_piece`) concatenate to the merged text (background jobs
            stream them).

    Returns:
        :class:`LongOutputResult`. ``row`` has ``strategy``, ``language``,
        ``first_text_s`` (start to the first visible text of any request: the
        one-shot answer or the outline), ``first_section_s`` (to the first
        visible section text), ``wall_s`` (until the text is merged),
        ``output_tokens`` and ``prompt_tokens_total`` (all requests),
        ``n_requests``, ``generate_calls``, ``batch_size`` (requests that shared
        a forward pass: the sections of ``outline_batch``, else 1),
        ``prompt_tokens`` (mean prompt of those requests), ``sections_requested``,
        ``sections_planned`` (outline titles used), ``sections_found``,
        ``coverage``, ``repetition``, ``output_throughput_tps``, ``chars``.
        Per-request token-id timings keep their standard names only where they
        are one request's: ``one_shot`` rows carry that request's ``ttft_s``,
        ``e2e_s``, ``itl_s``, ``tpot_s``, ``decode_tps``, ``prefill_s``; outline
        rows leave ``ttft_s`` / ``e2e_s`` empty and ``itl_s`` None (several
        requests have no single one) and give ``tpot_s``, ``decode_tps`` and
        ``prefill_s`` as medians over the requests run at ``batch_size``.

    Raises:
        ParameterError: unknown strategy or language.
    """
    check_choice("strategy", strategy, STRATEGIES)
    check_choice("language", language, LANGUAGES)
    gen = generate or _gen
    P = _PROMPTS[language]
    n = plan.n_sections
    tokenizer = getattr(loaded, "tokenizer", None)

    def settings(tokens, s=seed):
        return GenerationSettings(max_new_tokens=tokens, temperature=temperature, seed=s)

    t0 = time.perf_counter()
    calls = 0
    done: list[tuple] = []  # (batch, record) of every request, in order
    if strategy == "one_shot":
        b = gen(loaded, [one_shot_prompt(topic, n, language)], settings(plan.budget_tokens))
        calls = 1
        rec = b.records[0]
        done.append((b, rec))
        text, outline, titles = rec["text"], "", []
        bodies = [body for _, body in split_sections(text)]
        first_section = _first_text_at(b, rec, tokenizer)
        first_section = None if first_section is None else first_section - t0
        shared = [rec]  # the requests that ran together at the row's batch size
    else:
        ob = gen(loaded, [P["outline"].format(topic=topic, n=n)], settings(plan.outline_tokens))
        calls = 1
        orec = ob.records[0]
        done.append((ob, orec))
        outline = orec["text"]
        titles = outline_titles(outline, n, language)
        listed = "\n".join(f"{k + 1}. {t}" for k, t in enumerate(titles))
        prompts = [P["section"].format(topic=topic, outline=listed, k=k + 1, title=t) for k, t in enumerate(titles)]
        first_section = None
        bodies = []
        if strategy == "outline_batch":
            sb = gen(loaded, prompts, settings(plan.section_tokens))
            calls += 1
            recs = sorted(sb.records, key=lambda r: r["request_id"])
            done += [(sb, r) for r in recs]
            bodies = [_clean_body(r["text"]) for r in recs]
            for k, (t, b) in enumerate(zip(titles, bodies)):
                if on_section is not None:
                    on_section(k, section_piece(k, t, b))
            at = [t for t in (_first_text_at(sb, r, tokenizer) for r in recs) if t is not None]
            first_section = min(at) - t0 if at else None
            shared = recs  # decoded together: one forward pass per step for all sections
        else:
            for k, p in enumerate(prompts):
                if bodies:
                    p += P["previous"].format(summary=extractive_summary(bodies[-1]))
                sb = gen(loaded, [p], settings(plan.section_tokens, seed + k))
                calls += 1
                r = sb.records[0]
                done.append((sb, r))
                bodies.append(_clean_body(r["text"]))
                if on_section is not None:
                    on_section(k, section_piece(k, titles[k], bodies[-1]))
                if first_section is None:
                    at = _first_text_at(sb, r, tokenizer)
                    first_section = None if at is None else at - t0
            shared = [r for _, r in done]  # one request at a time, the outline included
        text = "".join(section_piece(k, t, b) for k, (t, b) in enumerate(zip(titles, bodies)))
    wall = time.perf_counter() - t0
    firsts = [t for t in (_first_text_at(b, r, tokenizer) for b, r in done) if t is not None]
    tokens = sum(int(r["output_tokens"]) for _, r in done)
    prompts_all = [int(r.get("prompt_tokens", 0)) for _, r in done]
    nan = float("nan")
    row = {
        "strategy": strategy,
        "language": language,
        "topic": topic,
        "budget_tokens": plan.budget_tokens,
        "outline_tokens": plan.outline_tokens if strategy != "one_shot" else 0,
        "section_tokens": plan.section_tokens if strategy != "one_shot" else plan.budget_tokens,
        "first_text_s": min(firsts) - t0 if firsts else nan,
        "first_section_s": nan if first_section is None else first_section,
        "wall_s": wall,
        "output_tokens": tokens,
        "prompt_tokens": round(float(np.mean([int(r.get("prompt_tokens", 0)) for r in shared]))),
        "prompt_tokens_total": sum(prompts_all),
        "batch_size": len(shared) if strategy == "outline_batch" else 1,
        "n_requests": len(done),
        "generate_calls": calls,
        "sections_requested": n,
        "sections_planned": len(titles) if strategy != "one_shot" else nan,
        "sections_found": quality.sections_with_body(text, split_sections, MIN_BODY_UNITS),
        "coverage": quality.section_coverage(text, n, split=split_sections, min_body_units=MIN_BODY_UNITS),
        "repetition": quality.cross_section_repetition(bodies),
        "output_throughput_tps": tokens / wall if wall > 0 else nan,
        "chars": len(text),
        "temperature": temperature,
        "seed": seed,
    }
    if strategy == "one_shot":  # the row is one request: its own token-id timings
        rec = done[0][1]
        row.update({k: rec[k] for k in ("ttft_s", "e2e_s", "itl_s", "tpot_s", "decode_tps")},
                   prefill_s=rec.get("prefill_s", nan))
    else:  # several requests merged: no single TTFT / e2e / ITL list; per-request medians of the shared batch
        row.update(ttft_s=nan, e2e_s=nan, itl_s=None,
                   tpot_s=_median([r.get("tpot_s") for r in shared]),
                   decode_tps=_median([r.get("decode_tps") for r in shared]),
                   prefill_s=_median([r.get("prefill_s") for r in shared]))
    return LongOutputResult(row, text, outline, titles, bodies)


