"""Generation-quality metrics for long-form and factual outputs, with 95% intervals of their means.

Every metric takes plain text (or token units) and returns a float, NaN when it
is undefined (e.g. distinct-2 of a one-word text); its definition and source
are in its docstring. :func:`text_metrics` and :func:`score_output` bundle them
per generated answer; :func:`summarize` turns a tidy table of per-request scores
into mean and a 95% interval per group (Wilson for shares, Student t otherwise; :mod:`workbench.stats.evidence`).

"Words" (:func:`units`): a run of letters/digits in alphabetic scripts, and a
single character in CJK scripts, where text has no spaces between words; the
common convention of character-level n-gram metrics for Chinese (e.g. ROUGE
and BLEU for Chinese summarisation and translation are computed on characters).

Nothing here loads a model except :func:`perplexity`, which takes one.

The quality guard of a speed technique lives in :mod:`workbench.measure.guard` (perplexity and KL divergence against
the float32 reference); :func:`token_agreement`, its strict greedy view, and :func:`perplexity_from_nll` are here.
"""

from __future__ import annotations

import functools
import gzip
import math
import re
import string
import unicodedata
from typing import Iterable, Sequence

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_UNIT_RE = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")

#: Per-request metric columns written by :func:`score_output`, and whether higher is better.
HIGHER_IS_BETTER = {
    "output_tokens": None,
    "output_chars": None,
    "truncated": False,
    "distinct_1": True,
    "distinct_2": True,
    "repeated_4gram_rate": False,
    "compression_ratio": False,
    "section_coverage": True,
    "exact_match": True,
    "substring_match": True,
    "rouge_l": True,
    "perplexity": None,
}


def units(text: str) -> list[str]:
    """Lower-cased "words" of ``text``: runs of letters/digits, or single CJK characters; punctuation dropped.

    >>> units("Hello, world 42!")
    ['hello', 'world', '42']
    >>> units("我爱北京 ok")
    ['我', '爱', '北', '京', 'ok']
    """
    return _UNIT_RE.findall(unicodedata.normalize("NFKC", text).lower())


def is_cjk(ch: str) -> bool:
    """True when ``ch`` is one character of a CJK script: a character :func:`units` counts on its own."""
    return len(ch) == 1 and bool(re.match(rf"[{_CJK}]", ch))


def _ngrams(seq: Sequence, n: int) -> list[tuple]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def _as_units(x) -> list:
    return units(x) if isinstance(x, str) else list(x)


def distinct_n(text_or_units, n: int) -> float:
    """distinct-n: distinct n-grams / all n-grams of one output (NaN if it has none).

    Source: Li et al. 2016, "A Diversity-Promoting Objective Function for Neural
    Conversation Models" (NAACL), section 4.1. Computed per output here; 1.0 is
    no repetition at all.

    Args:
        text_or_units: a string (split by :func:`units`) or a sequence of units / token ids.
        n: n-gram order (>= 1).
    """
    grams = _ngrams(_as_units(text_or_units), n)
    return len(set(grams)) / len(grams) if grams else float("nan")


def repeated_ngram_rate(text_or_units, n: int = 4) -> float:
    """Share of n-grams that repeat an n-gram seen earlier in the same output: ``1 - distinct_n``.

    Source: "seq-rep-n" of Welleck et al. 2020, "Neural Text Generation with
    Unlikelihood Training" (ICLR), section 6.1 (n = 4 there). 0 is no repetition;
    a greedy loop drives it towards 1.
    """
    d = distinct_n(text_or_units, n)
    return 1.0 - d if not math.isnan(d) else float("nan")


def cross_section_repetition(bodies: Sequence[str], n: int = 3) -> float:
    """Share of a section's n-grams (of :func:`units`) that also occur in another section, averaged.

    This project's repetition proxy for long texts written section by section
    (``workbench.techniques.long_form``): a section that restates another scores high even
    when neither repeats itself. Averaged over sections with at least one
    n-gram; 0.0 with fewer than two such sections.
    """
    grams = [g for g in (set(_ngrams(units(b), n)) for b in bodies) if g]
    if len(grams) < 2:
        return 0.0
    shares = []
    for i, g in enumerate(grams):
        others = set().union(*(h for j, h in enumerate(grams) if j != i))
        shares.append(len(g & others) / len(g))
    return float(sum(shares) / len(shares))


def compression_ratio(text: str) -> float:
    """UTF-8 bytes / gzip-compressed bytes of ``text`` (NaN for empty text).

    Repetitive, degenerate text compresses well, so a high ratio flags
    degeneration: Whisper (Radford et al. 2022, ``transcribe.py``) treats a
    ratio above 2.4 (zlib) as a failed, looping decode. The gzip header adds ~20
    bytes, so very short texts score below 1.
    """
    data = text.encode("utf-8")
    if not data:
        return float("nan")
    return len(data) / len(gzip.compress(data, compresslevel=9, mtime=0))


_NUM_ZH = {"一": 1, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_HEADING_RE = re.compile(
    r"^(?P<lead>[ \t>*_-]*(?P<hash>#+)?[ \t*_]*)(?P<kw>section|part|chapter|第)?[ \t]*"
    r"(?P<num>\d+|[一二三四五六七八九十])[ \t]*(?:部分|节|章|部)?[ \t]*(?:[.:)：、．\-*#]|$)",
    re.IGNORECASE | re.MULTILINE,
)


def section_numbers(text: str) -> set[int]:
    """Section numbers that head a line: ``## Section 2: ..``, ``**Part 3.**``, ``## 第二部分：..``, ``2. ..``.

    Headings with a markdown ``#`` or a keyword (section / part / chapter / 第)
    win: bare numbered lines (``2. ..``) count only when no such heading exists,
    so a numbered list inside a section does not pass for sections.
    """
    strong, weak = set(), set()
    for m in _HEADING_RE.finditer(text):
        tok = m.group("num")
        k = int(tok) if tok.isdigit() else _NUM_ZH[tok]
        (strong if m.group("hash") or m.group("kw") else weak).add(k)
    return strong or weak


def sections_with_body(text: str, split, min_body_units: int = 10) -> int:
    """Headed sections of ``text`` whose body has at least ``min_body_units`` :func:`units`.

    Args:
        split: ``split(text) -> [(heading, body)]`` (e.g. :func:`workbench.techniques.long_form.split_sections`);
            a pair with an empty heading is not a section.
    """
    return sum(1 for h, b in split(text) if h and len(units(b)) >= min_body_units)


def section_coverage(text: str, sections, split=None, min_body_units: int = 10) -> float:
    """Share of the requested sections present in a "write a report in N sections" answer.

    Args:
        text: the answer.
        sections: ``N`` (an int): a section ``k`` counts when a line starts with
            a heading numbered ``k`` in 1..N (see :func:`section_numbers`); or a
            list of titles: a title counts when its :func:`units` appear
            contiguously in the answer's units (case-insensitive).
        split: with an int ``sections``, for texts whose headings carry titles rather than numbers
            (long outputs): count :func:`sections_with_body` of ``split`` instead, capped at ``N``.
        min_body_units: the body a section needs to count under ``split``.

    Returns:
        Found / requested, in [0, 1]. Definition: this project's (the
        "section coverage" of docs/design.md section 7); it measures whether a
        truncated or rambling answer delivered the structure it was asked for.
    """
    if isinstance(sections, int):
        if sections < 1:
            raise ValueError("sections: must be >= 1")
        if split is not None:
            return min(sections_with_body(text, split, min_body_units), sections) / sections
        return len(section_numbers(text) & set(range(1, sections + 1))) / sections
    titles = list(sections)
    if not titles:
        raise ValueError("sections: must name at least one section")
    body = " ".join(units(text))
    return sum(1 for t in titles if " ".join(units(t)) and " ".join(units(t)) in body) / len(titles)


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation, extended to Chinese.

    Lower-case, drop ASCII and Unicode punctuation, drop English articles
    (a/an/the), collapse whitespace (``normalize_answer`` of the SQuAD v1.1
    evaluation script, Rajpurkar et al. 2016); then remove the spaces next to CJK
    characters, so "北 京" and "北京" compare equal.
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    text = " ".join(text.split())
    return re.sub(rf"\s*([{_CJK}])\s*", r"\1", text)


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals a normalised answer, else 0.0 (SQuAD EM)."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def substring_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 when a normalised answer occurs in the normalised prediction, else 0.0.

    The lenient match used for chatty models that wrap the answer in a sentence
    (e.g. "accuracy" of open-domain QA in Kandpal et al. 2023 / PopQA, Mallen et
    al. 2023). English answers must match whole words ("7" does not match "17").
    """
    pred = normalize_answer(prediction)
    for a in answers:
        a = normalize_answer(a)
        if not a:
            continue
        if re.search(rf"[{_CJK}]", a):
            if a in pred:
                return 1.0
        elif re.search(rf"(?<![^\W_{_CJK}]){re.escape(a)}(?![^\W_{_CJK}])", pred):  # CJK may touch it
            return 1.0
    return 0.0


class _UnitTokenizer:
    """``rouge_score`` tokenizer that splits with :func:`units` (its default drops non-ASCII text)."""

    def tokenize(self, text):
        return units(text)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (Lin 2004) via ``rouge_score``, on :func:`units` (CJK characters as words).

    ``rouge_score``'s own tokenizer keeps only ``[a-z0-9]``, which would score
    every Chinese text 0, so the unit tokenizer is passed in. Both texts without any unit: 1.0.
    """
    if not units(prediction) and not units(reference):
        return 1.0
    return float(_rouge_scorer().score(reference, prediction)["rougeL"].fmeasure)


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_UnitTokenizer())


def text_metrics(text: str) -> dict:
    """Length and repetition metrics of one output: ``output_chars``, ``distinct_1``, ``distinct_2``,
    ``repeated_4gram_rate``, ``compression_ratio`` (see each function)."""
    u = units(text)
    return {
        "output_chars": len(text),
        "distinct_1": distinct_n(u, 1),
        "distinct_2": distinct_n(u, 2),
        "repeated_4gram_rate": repeated_ngram_rate(u, 4),
        "compression_ratio": compression_ratio(text),
    }


def score_output(text: str, finish_reason: str, n_sections: int = 0, answers: Sequence[str] = ()) -> dict:
    """Every text-only metric of one answer, as columns for its request row.

    Args:
        text: the generated text.
        finish_reason: ``stop`` or ``length``; ``truncated`` is 1.0 for ``length``.
        n_sections: requested sections of a report prompt (0: not a report; coverage NaN).
        answers: accepted answers of a factual question (empty: not factual; matches NaN).

    Returns:
        :func:`text_metrics` plus ``truncated``, ``section_coverage``,
        ``exact_match``, ``substring_match``, ``rouge_l`` (best over the accepted answers).
    """
    row = text_metrics(text)
    row["truncated"] = 1.0 if finish_reason == "length" else 0.0
    row["section_coverage"] = section_coverage(text, int(n_sections)) if n_sections else float("nan")
    answers = list(answers)
    if answers:
        row["exact_match"] = exact_match(text, answers)
        row["substring_match"] = substring_match(text, answers)
        row["rouge_l"] = max(rouge_l(text, a) for a in answers)
    else:
        row["exact_match"] = row["substring_match"] = row["rouge_l"] = float("nan")
    return row


def continuation_logprobs(loaded, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                          past_key_values=None, prefix_len: int = 0) -> list[list[float]]:
    """Log-probability (nats) of every continuation token given its context: the one such forward pass.

    One batched forward pass over ``context + continuation`` per row, left-padded with an attention mask
    and explicit position ids, so each row scores as if run alone (lm-evaluation-harness
    ``loglikelihood``). Raw logits (temperature 1: the model's own distribution).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel` (or an object with ``model`` and ``tokenizer``).
        contexts: ``B`` lists of token ids (templated prompt, no padding), each >= 1 id unless a
            prefix cache supplies it.
        continuations: ``B`` lists of token ids to score.
        past_key_values: optional KV cache of the first ``prefix_len`` ids of the (single) context,
            as built for prefix reuse; it is deep-copied, never mutated. Needs ``B == 1``.
        prefix_len: tokens of ``contexts[0]`` covered by ``past_key_values``.

    Returns:
        ``B`` lists of floats, ``len(continuations[i])`` each (empty continuation: empty list).

    Raises:
        ValueError: mismatched lengths, a cache with ``B > 1``, or an empty context without a cache.
    """
    import copy

    import torch

    if len(contexts) != len(continuations):
        raise ValueError("contexts and continuations: need one context per continuation")
    if past_key_values is not None and len(contexts) != 1:
        raise ValueError("past_key_values: a prefix cache scores one row at a time")
    model = loaded.model
    rows = [(list(c), list(g)) for c, g in zip(contexts, continuations)]
    out: list[list[float]] = [[] for _ in rows]
    live = [i for i, (c, g) in enumerate(rows) if g]
    if not live:
        return out
    seqs = [(rows[i][0] + rows[i][1])[prefix_len:] for i in live]
    if any(len(rows[i][0]) - prefix_len < 1 for i in live) and past_key_values is None:
        raise ValueError("contexts: every context needs at least one token")
    width = max(len(s) for s in seqs)
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, seq in enumerate(seqs):
        ids[r, width - len(seq):] = torch.tensor(seq)
        mask[r, width - len(seq):] = 1
    kwargs = {}
    if past_key_values is not None:
        from workbench.measure.generation import cache_kwarg

        kwargs = {cache_kwarg(model): copy.deepcopy(past_key_values), "use_cache": True}
        mask = torch.cat([torch.ones((1, prefix_len), dtype=torch.long), mask], dim=1)
        pos = torch.arange(prefix_len, prefix_len + width)[None]
    else:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                       position_ids=pos.to(model.device), **kwargs).logits
    for r, i in enumerate(live):
        n = len(rows[i][1])
        pred = torch.log_softmax(logits[r, width - 1 - n: width - 1].float(), dim=-1)
        target = torch.tensor(rows[i][1], device=pred.device)[:, None]
        out[i] = pred.gather(-1, target)[:, 0].tolist()
    return out


def token_nlls(loaded, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[float]:
    """Negative log-likelihood (nats) of each output token given the prompt and the outputs before it.

    :func:`continuation_logprobs` of one row, negated.
    """
    return [-x for x in continuation_logprobs(loaded, [prompt_ids], [output_ids])[0]]


def perplexity(loaded, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> float:
    """Perplexity of a generated answer under the model: ``exp(mean NLL of the output tokens)``.

    The standard definition (e.g. Jelinek et al. 1977; Hugging Face
    "Perplexity of fixed-length models"), conditioned on the prompt and read at
    temperature 1. Low values with high repetition flag degenerate loops
    (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", figure
    4: greedy text has unnaturally low perplexity); high values flag incoherent
    high-temperature samples. NaN for an empty output.

    Args:
        loaded: the model (``model`` and ``tokenizer``).
        prompt_ids: the templated prompt's ids (no padding), >= 1 id.
        output_ids: the generated ids (EOS included when emitted).
    """
    return perplexity_from_nll(token_nlls(loaded, prompt_ids, output_ids))


def perplexities(loaded, prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]],
                 batch_size: int = 8) -> list[float]:
    """:func:`perplexity` of many answers, ``batch_size`` rows a forward pass (:func:`continuation_logprobs` pads
    each batch on the left with explicit positions, so a row scores as if run alone; the same values as one call
    per answer up to float rounding, in a fraction of the time on a CPU).

    Args:
        loaded: the model (``model`` and ``tokenizer``).
        prompt_ids: ``N`` templated prompts' ids (no padding), each >= 1 id.
        output_ids: ``N`` generated answers' ids.
        batch_size: rows a forward pass (>= 1).

    Returns:
        ``N`` perplexities (NaN for an empty answer).
    """
    if len(prompt_ids) != len(output_ids):
        raise ValueError("prompt_ids and output_ids: need one prompt per answer")
    step = max(int(batch_size), 1)
    out: list[float] = []
    for i in range(0, len(prompt_ids), step):
        lps = continuation_logprobs(loaded, prompt_ids[i:i + step], output_ids[i:i + step])
        out += [perplexity_from_nll([-x for x in lp]) for lp in lps]
    return out


def perplexity_from_nll(nll: Sequence[float]) -> float:
    """``exp(mean NLL)`` of per-token negative log-likelihoods (nats): the one perplexity formula (NaN when
    empty). :func:`perplexity` and the quality guard (:mod:`workbench.measure.guard`) both use it."""
    nll = list(nll)
    return math.exp(sum(nll) / len(nll)) if nll else float("nan")


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of the finite values and an interval whose coverage holds at a sweep point's small samples:
    ``(mean, low, high)``.

    A share (every value 0 or 1: exact match, truncated) gets Wilson's score interval, any other metric a
    Student-t interval (:func:`workbench.stats.evidence.mean_interval`). They replace the percentile bootstrap,
    which covers well under its nominal level at a handful of prompts. One value: ``(v, nan, nan)``; none:
    all NaN.
    """
    from workbench.stats.evidence import mean_interval

    iv = mean_interval([v for v in values if v is not None], confidence)
    return iv.estimate, iv.low, iv.high


def summarize(df, by: Sequence[str], metrics: Sequence[str] | None = None, confidence: float = 0.95, seed: int = 0):
    """Long table of mean and 95% interval (:func:`mean_ci`: Wilson for shares, t otherwise) of each metric per group.

    Args:
        df: one row per request with the ``by`` columns and metric columns.
        by: grouping columns (e.g. ``["family", "temperature", "top_p"]``).
        metrics: metric columns (default: those of :data:`HIGHER_IS_BETTER` present in ``df``).
        confidence: CI level.
        seed: unused (kept for callers; the intervals are not resampled).

    Returns:
        ``pandas.DataFrame`` with the ``by`` columns, ``metric``, ``n`` (finite
        values), ``mean``, ``ci_low``, ``ci_high``.
    """
    import pandas as pd

    metrics = [m for m in (metrics or HIGHER_IS_BETTER) if m in df]
    rows = []
    for key, g in df.groupby(list(by), sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            vals = pd.to_numeric(g[m], errors="coerce")
            mean, lo, hi = mean_ci(vals.tolist(), confidence)
            rows.append({**dict(zip(by, key)), "metric": m, "n": int(vals.notna().sum()),
                         "mean": mean, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the guard's strict view (workbench.measure.guard)


def token_agreement(reference_ids: list[list[int]], ids: list[list[int]]) -> tuple[float, int]:
    """``(share of identical tokens, first divergence)``: position by position against the reference (a
    missing token is a mismatch); the first divergence is the minimum over prompts (the reference length when
    all agree)."""
    same = total = 0
    first = min((len(r) for r in reference_ids), default=0)
    for r, o in zip(reference_ids, ids):
        for i, t in enumerate(r):
            total += 1
            if i < len(o) and o[i] == t:
                same += 1
            else:
                first = min(first, i)
                break
        else:
            continue
        total += len(r) - i - 1
        same += sum(1 for j in range(i + 1, len(r)) if j < len(o) and o[j] == r[j])
    return (same / total if total else float("nan")), int(first)
