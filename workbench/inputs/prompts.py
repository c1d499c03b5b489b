"""Prompts of an exact token length, built from real text, and the prompt families of the sweeps.

Sources (``SOURCES``):

- ``en``: the Python documentation text that every CPython installation carries
  (``pydoc_data.topics``), so no download is needed and the token statistics
  are those of real prose and code.
- ``zh``: original Chinese essays shipped in ``data/zh/*.txt`` (written for this
  project; see ``data/zh/README.md``), concatenated in file-name order.
- ``random``: uniformly random non-special token ids, for pure-compute runs;
  only as ids (:func:`build_prompt_ids`; :func:`random_batch` for a measured
  request, templated inside the clock), since random ids do not survive a
  decode / re-encode round trip.

Lengths are counted by the model's tokenizer after the chat template, by the
same path generation uses (:func:`workbench.measure.generation.count_prompt_tokens`).

Method: take ``k`` consecutive tokens of the source starting at ``offset``,
decode them, count the templated prompt, and correct ``k`` by the difference
until the count is exact (re-tokenisation at the cut can shift it by a token or
two). Chinese text is cut on character boundaries instead (a byte-level BPE
token can hold part of a character): a binary search over characters finds the
longest prefix within the target. Either path falls back to trimming characters
and appending one-token fillers when the count oscillates at a merge boundary.

Also here: characters-per-token of a tokenizer (:func:`chars_per_token`) and
the ``max_new_tokens`` a target length in characters needs
(:func:`max_new_tokens_for_chars`); the long-form report prompts
(:func:`report_prompt`) and the factual questions (:func:`load_factual_qa`) of
the temperature sweep; the speed techniques' task prompts (:func:`task_prompts`: an instruction over passages of
the shipped text, :func:`passages`, or a free request).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable

from workbench.checks import check_choice, check_int
from workbench.errors import ParameterError
from workbench.measure.generation import count_prompt_tokens
from workbench.paths import data_dir  # noqa: F401 - prompts.data_dir, read by its callers

SOURCES = ("en", "zh", "random")
TEXT_SOURCES = ("en", "zh")
LANGUAGES = ("en", "zh")


def _check_source(source: str, allowed=SOURCES) -> None:
    if source not in allowed:
        raise ParameterError(f"source: must be one of {', '.join(allowed)} (got {source!r})")


@functools.lru_cache(maxsize=4)
def source_text(source: str = "en") -> str:
    """The raw text of a source: ``en`` is every ``pydoc_data.topics`` entry in key order; ``zh`` the essays."""
    _check_source(source, TEXT_SOURCES)
    if source == "en":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k].strip() for k in sorted(topics))
    files = sorted((data_dir() / "zh").glob("*.txt"))
    if not files:
        raise ParameterError(f"source: no Chinese text found in {data_dir() / 'zh'} (*.txt)")
    return "\n\n".join(f.read_text(encoding="utf-8").strip() for f in files)


_TOKEN_CACHE: dict = {}


def _source_encoding(tokenizer, source: str):
    """Token ids and character offsets of a whole source, cached per tokenizer."""
    key = (id(tokenizer), source)
    if key not in _TOKEN_CACHE:
        enc = tokenizer(source_text(source), add_special_tokens=False, return_offsets_mapping=True)
        _TOKEN_CACHE[key] = (enc["input_ids"], enc["offset_mapping"])
    return _TOKEN_CACHE[key]


def _source_ids(tokenizer, source: str) -> list[int]:
    return _source_encoding(tokenizer, source)[0]


def prompt_overhead(tokenizer, chat: bool = True, instruction: str = "") -> int:
    """Tokens a prompt costs beyond its body: the chat template plus the instruction."""
    return count_prompt_tokens(tokenizer, instruction, chat=chat)


def build_prompt(
    tokenizer,
    n_tokens: int,
    source: str = "en",
    offset: int = 0,
    chat: bool = True,
    instruction: str = "",
) -> str:
    """A prompt whose templated length is exactly ``n_tokens`` tokens.

    Args:
        tokenizer: the target model's tokenizer.
        n_tokens: total prompt tokens the model will see, chat template included.
        source: text source (``en``: Python documentation; ``zh``: the Chinese essays).
        offset: token offset into the source (different offsets give different
            prompts of the same length, e.g. one per row of a batch); taken
            modulo what the source can supply.
        chat: count with the chat template (as generation with ``chat=True`` does).
        instruction: text appended after the body (e.g. "Summarise the text above.").

    Returns:
        The user-message text; ``count_prompt_tokens(tokenizer, text, chat) == n_tokens``.

    Raises:
        ParameterError: unknown or non-text source (use :func:`build_prompt_ids`
            for ``random``), ``n_tokens`` below the template overhead + 1, or
            above what the source can supply.
    """
    if source == "random":
        raise ParameterError("source: 'random' prompts exist only as token ids; use build_prompt_ids")
    _check_source(source, TEXT_SOURCES)
    overhead = prompt_overhead(tokenizer, chat, instruction)
    if not isinstance(n_tokens, int) or isinstance(n_tokens, bool) or n_tokens <= overhead:
        raise ParameterError(f"prompt_tokens: must be an integer > {overhead} (the chat template) (got {n_tokens!r})")
    ids, offsets = _source_encoding(tokenizer, source)
    if n_tokens - overhead + 8 > len(ids):
        raise ParameterError(f"prompt_tokens: the {source!r} source supplies at most {len(ids) - 8} tokens")
    offset = offset % max(1, len(ids) - (n_tokens - overhead) - 8)
    sep = "\n\n" if instruction else ""
    suffix = sep + instruction
    if source == "zh":
        text = source_text(source)[offsets[offset][0] :]
        return _exact_by_chars(tokenizer, text, n_tokens, chat, suffix)

    def make(k: int) -> str:
        return tokenizer.decode(ids[offset : offset + k]) + suffix

    k, seen = n_tokens - overhead, {}
    for _ in range(32):
        text = make(k)
        count = count_prompt_tokens(tokenizer, text, chat=chat)
        if count == n_tokens:
            return text
        seen[k] = count
        k += n_tokens - count
        if k in seen:
            break
    # Oscillation at a merge boundary: take the longest body below target and pad with characters.
    below = max((kk for kk, c in seen.items() if c < n_tokens), default=1)
    body = tokenizer.decode(ids[offset : offset + below])
    extra = tokenizer.decode(ids[offset + below : offset + below + 16])
    for ch in extra:
        body += ch
        count = count_prompt_tokens(tokenizer, body + suffix, chat=chat)
        if count == n_tokens:
            return body + suffix
        if count > n_tokens:
            body = body[:-1]
    for filler in (" a", " .", "a", "."):
        for _ in range(n_tokens):
            count = count_prompt_tokens(tokenizer, body + suffix, chat=chat)
            if count == n_tokens:
                return body + suffix
            if count > n_tokens:
                body = body[: -len(filler)]
                break
            body += filler
    return _exact_by_chars(tokenizer, tokenizer.decode(ids[offset:]), n_tokens, chat, suffix)


_FILLERS = (" ", ".", "。", "a", " a", "的", "\n")


def _exact_by_chars(tokenizer, text: str, n_tokens: int, chat: bool, suffix: str) -> str:
    """The longest character prefix of ``text`` (+ ``suffix``) with exactly ``n_tokens`` templated tokens.

    Binary search for the longest prefix whose count is <= ``n_tokens`` (the
    count is non-decreasing in the prefix length up to merge effects at the cut),
    then, if it falls one or two short, trim up to 3 characters and append
    one-token fillers.
    """

    def count(body: str) -> int:
        return count_prompt_tokens(tokenizer, body + suffix, chat=chat)

    lo, hi = 0, min(len(text), 8 * n_tokens)
    while lo < hi:  # largest c with count(text[:c]) <= n_tokens
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    body = text[:lo]
    if count(body) == n_tokens:
        return body + suffix
    for trim in range(4):
        base = body[: len(body) - trim]
        for filler in _FILLERS:
            for reps in range(1, 5):
                c = count(base + filler * reps)
                if c == n_tokens:
                    return base + filler * reps + suffix
                if c > n_tokens:
                    break
    raise ParameterError(f"prompt_tokens: could not build a prompt of exactly {n_tokens} tokens")


def build_batch(
    tokenizer, batch_size: int, n_tokens: int, source: str = "en", chat: bool = True, instruction: str = ""
):
    """``batch_size`` different prompts of exactly ``n_tokens`` tokens each (disjoint source windows)."""
    stride = max(1, n_tokens)
    return [
        build_prompt(tokenizer, n_tokens, source=source, offset=i * stride, chat=chat, instruction=instruction)
        for i in range(batch_size)
    ]


def _template_parts(tokenizer, chat: bool, instruction: str) -> tuple[list[int], list[int]]:
    """Token ids before and after the user body in a templated prompt (body, then instruction)."""
    sentinel = "\u2063WORKBENCH_BODY\u2063"
    sep = "\n\n" if instruction else ""
    content = sentinel + sep + instruction
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        pre, post = text.split(sentinel)
        ids = tokenizer([pre, post], add_special_tokens=False)["input_ids"]
        return ids[0], ids[1]
    specials = tokenizer("")["input_ids"]
    post = tokenizer(sep + instruction, add_special_tokens=False)["input_ids"] if instruction else []
    return list(specials), post


def _random_body(tokenizer, k: int, seed: int) -> list[int]:
    """``k`` uniformly random non-special token ids, reproducibly from ``seed``."""
    import numpy as np

    special = set(tokenizer.all_special_ids)
    vocab = np.array([i for i in range(len(tokenizer)) if i not in special])
    return np.random.default_rng(seed).choice(vocab, size=k).tolist()


def _random_body_length(tokenizer, n_tokens, chat: bool, instruction: str) -> int:
    pre, post = _template_parts(tokenizer, chat, instruction)
    k = n_tokens - len(pre) - len(post) if isinstance(n_tokens, int) and not isinstance(n_tokens, bool) else -1
    if k < 1:
        raise ParameterError(
            f"prompt_tokens: must be an integer > {len(pre) + len(post)} (the chat template) (got {n_tokens!r})"
        )
    return k


def random_token_ids(tokenizer, n_tokens: int, seed: int = 0, chat: bool = True, instruction: str = "") -> list[int]:
    """A templated prompt of exactly ``n_tokens`` ids whose body is uniformly random non-special token ids.

    The chat template's own ids surround the random body, so the model sees a
    well-formed chat turn; the body carries no language (pure-compute runs).
    For a measured request use :func:`random_batch`, which templates inside the clock.

    Raises:
        ParameterError: ``n_tokens`` not above the template's own length.
    """
    body = _random_body(tokenizer, _random_body_length(tokenizer, n_tokens, chat, instruction), seed)
    pre, post = _template_parts(tokenizer, chat, instruction)
    return pre + body + post


def random_batch(tokenizer, batch_size: int, n_tokens: int, seed: int = 0, chat: bool = True,
                 instruction: str = "") -> Callable[[], list[list[int]]]:
    """``batch_size`` random-token prompts of exactly ``n_tokens`` ids, templated when called.

    The random bodies are drawn now (they are the request's content: random ids have no text to
    tokenise); the chat template is applied and tokenised around them each time the returned callable
    runs. Pass it as ``input_ids`` to :func:`workbench.measure.generation.generate_measured`, which calls it
    after ``t_submit``, so templating counts in TTFT as it does for text prompts (docs/design.md section 4).
    ``random_batch(...)()`` equals :func:`build_batch_ids` with ``source="random"``.

    Raises:
        ParameterError: ``n_tokens`` not above the template's own length, or ``batch_size`` < 1.
    """
    check_int("batch_size", batch_size, lo=1)
    k = _random_body_length(tokenizer, n_tokens, chat, instruction)
    stride = max(1, n_tokens)
    bodies = [_random_body(tokenizer, k, seed + i * stride) for i in range(batch_size)]

    def templated() -> list[list[int]]:
        pre, post = _template_parts(tokenizer, chat, instruction)
        return [pre + body + post for body in bodies]

    return templated


def build_prompt_ids(
    tokenizer,
    n_tokens: int,
    source: str = "en",
    offset: int = 0,
    chat: bool = True,
    instruction: str = "",
    seed: int = 0,
) -> list[int]:
    """Templated token ids of exactly ``n_tokens`` for any source, for ``generate_measured(..., input_ids=...)``.

    Text sources encode :func:`build_prompt`'s text by generation's own path;
    ``random`` uses :func:`random_token_ids` with ``seed + offset``.
    """
    _check_source(source)
    if source == "random":
        return random_token_ids(tokenizer, n_tokens, seed=seed + offset, chat=chat, instruction=instruction)
    from workbench.measure.generation import encode_prompts

    text = build_prompt(tokenizer, n_tokens, source=source, offset=offset, chat=chat, instruction=instruction)
    return encode_prompts(tokenizer, [text], chat=chat)["input_ids"][0].tolist()


def build_batch_ids(
    tokenizer,
    batch_size: int,
    n_tokens: int,
    source: str = "en",
    chat: bool = True,
    instruction: str = "",
    seed: int = 0,
) -> list[list[int]]:
    """``batch_size`` different id prompts of exactly ``n_tokens`` each (disjoint windows or different seeds)."""
    stride = max(1, n_tokens)
    return [
        build_prompt_ids(tokenizer, n_tokens, source, offset=i * stride, chat=chat, instruction=instruction, seed=seed)
        for i in range(batch_size)
    ]


# --- target lengths in characters ------------------------------------------------------------


def chars_per_token(tokenizer, source: str = "en", text: str | None = None) -> float:
    """Characters per token of ``tokenizer`` on ``text`` (default: the whole of ``source``).

    Characters are Unicode code points (``len(str)``), tokens are ids without
    special tokens. SmolLM2's tokenizer gives ~3.5 on the English source and
    well under 1 on Chinese (a CJK character often takes 2 byte-level tokens).
    """
    if text is None:
        text = source_text(source)
        n = len(_source_ids(tokenizer, source))
    else:
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    if n == 0:
        raise ParameterError("text: must contain at least one token")
    return len(text) / n


def max_new_tokens_for_chars(tokenizer, n_chars: int, source: str = "en", margin: float = 1.1) -> int:
    """The ``max_new_tokens`` that lets an answer reach ``n_chars`` characters in ``source``'s language.

    ``ceil(n_chars / chars_per_token * margin)``; ``margin`` covers the spread
    between the measured corpus ratio and a particular answer.
    """
    if not isinstance(n_chars, int) or n_chars < 1:
        raise ParameterError(f"n_chars: must be an integer >= 1 (got {n_chars!r})")
    if not margin > 0:
        raise ParameterError(f"margin: must be > 0 (got {margin!r})")
    return max(1, math.ceil(n_chars / chars_per_token(tokenizer, source) * margin))


# --- prompt families of the temperature sweep -------------------------------------------------

REPORT_TOPICS = {
    "en": [
        "the history of public libraries",
        "how bicycles changed city life",
        "the science of sleep",
        "water supply in dry regions",
        "the economics of renewable energy",
        "how vaccines are developed",
        "the role of bees in agriculture",
        "learning a second language as an adult",
    ],
    "zh": [
        "城市公共交通的发展",
        "茶文化的历史",
        "人工智能对教育的影响",
        "如何保护地下水资源",
        "家庭理财的基本方法",
        "传统节日的现代意义",
        "垃圾分类与城市管理",
        "老龄化社会的挑战",
    ],
}


def report_prompt(topic: str, n_sections: int, language: str = "en") -> str:
    """The long-form writing prompt "write a report in N sections on TOPIC".

    The requested heading format (``## Section k: ...`` / ``## 第k部分：...``) is
    what :func:`workbench.measure.quality.section_coverage` looks for.
    """
    if language not in LANGUAGES:
        raise ParameterError(f"language: must be one of {', '.join(LANGUAGES)} (got {language!r})")
    if not isinstance(n_sections, int) or n_sections < 1:
        raise ParameterError(f"n_sections: must be an integer >= 1 (got {n_sections!r})")
    if language == "zh":
        return (
            f"请写一篇关于“{topic}”的报告，分为{n_sections}个部分。"
            f"每个部分以标题行开头，格式为“## 第k部分：标题”（k 从 1 到 {n_sections}）。"
        )
    return (
        f"Write a report in {n_sections} sections on {topic}. Start each section with a heading line "
        f"'## Section k: <title>' (k from 1 to {n_sections})."
    )


def report_prompts(n_per_language: int, n_sections: int, languages=LANGUAGES) -> list[dict]:
    """The first ``n_per_language`` report prompts per language.

    Returns:
        Dicts with family, language, topic, n_sections, prompt, answers (empty).
    """
    out = []
    for lang in languages:
        topics = REPORT_TOPICS[lang]
        if not 0 < n_per_language <= len(topics):
            raise ParameterError(f"n_report_prompts: must be in [1, {len(topics)}] (got {n_per_language!r})")
        for topic in topics[:n_per_language]:
            out.append(
                {"family": "report", "language": lang, "topic": topic, "n_sections": n_sections,
                 "prompt": report_prompt(topic, n_sections, lang), "answers": []}
            )
    return out


def load_factual_qa(path: str | Path | None = None) -> list[dict]:
    """The factual questions of ``data/factual_qa.jsonl``: dicts with id, language, question, answers (aliases)."""
    path = Path(path) if path else data_dir() / "factual_qa.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        if not r.get("question") or not r.get("answers") or r.get("language") not in LANGUAGES:
            raise ParameterError(f"factual_qa: malformed row {r!r} in {path}")
    return rows


QA_INSTRUCTION = {"en": "Answer in a few words.", "zh": "请用几个字回答。"}


def factual_prompts(n_per_language: int, languages=LANGUAGES, path=None) -> list[dict]:
    """The first ``n_per_language`` factual questions per language, as prompt dicts like :func:`report_prompts`."""
    rows = load_factual_qa(path)
    out = []
    for lang in languages:
        picked = [r for r in rows if r["language"] == lang][:n_per_language]
        if len(picked) < n_per_language or n_per_language < 1:
            raise ParameterError(
                f"n_factual_prompts: must be in [1, {len(picked)}] for {lang} (got {n_per_language!r})"
            )
        for r in picked:
            out.append(
                {"family": "factual", "language": lang, "topic": r["id"], "n_sections": 0,
                 "prompt": f"{r['question']} {QA_INSTRUCTION[lang]}", "answers": list(r["answers"])}
            )
    return out


# ----------------------------------------------------------------------------- the speed techniques' tasks


#: tasks of :func:`task_prompts`: three copy-heavy ones (an instruction over a passage) and a free request
TASKS = ("summarise", "extract", "edit", "free")
INSTRUCTIONS = {
    "summarise": {"en": "Summarise the following text in two or three sentences, reusing its own wording.",
                  "zh": "用两三句话概括下面的文字，尽量使用原文的词句。"},
    "extract": {"en": "Quote, word for word, the first three sentences of the following text.",
                "zh": "逐字摘录下面文字的前三句话。"},
    "edit": {"en": "Rewrite the following text exactly, changing only \"the\" to \"THE\".",
             "zh": "原样重写下面的文字，只把“的”改成“之”。"},
}


FREE = {"en": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "zh": "写一个短故事：一位灯塔看守人捡到了一个漂流瓶。"}


def passages(language: str, n: int, chars: int) -> list[str]:
    """``n`` passages of the shipped text (whole paragraphs, at most ``chars`` characters; Chinese ``chars // 3``),
    taken evenly through the source so different prompts quote different text."""
    limit = chars if language == "en" else max(20, chars // 3)
    paras = [p.strip() for p in source_text(language).split("\n\n") if len(p.strip()) >= limit // 3]
    picked = []
    step = max(1, len(paras) // max(n, 1))
    for i in range(0, len(paras), step):
        text = ""
        for p in paras[i:]:
            if len(text) + len(p) > limit:
                break
            text = f"{text}\n\n{p}" if text else p
        picked.append(text or paras[i][:limit])
        if len(picked) == n:
            break
    return picked


def task_prompts(task: str, language: str, n: int = 1, passage_chars: int = 600) -> list[str]:
    """``n`` prompts of a task: an instruction over a passage of documentation (copy-heavy) or a free request.

    Raises:
        ParameterError: an unknown task or language.
    """
    check_choice("task", task, TASKS)
    check_choice("language", language, LANGUAGES)
    if task == "free":
        return [FREE[language]] * n
    return [f"{INSTRUCTIONS[task][language]}\n\n{p}" for p in passages(language, n, passage_chars)]
