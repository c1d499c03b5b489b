"""Long-context tasks with known answers, generated offline from a seed over real text.

Three kinds, each a :class:`Task` (context, question, gold answer):

- ``needle``: a passkey sentence placed at a chosen depth (0 = start, 1 = end)
  of a haystack (the passkey-retrieval test of Mohtashami & Jaggi 2023,
  "Landmark Attention", and the needle-in-a-haystack test);
- ``multikey``: several passkeys for similar names (``red harbor`` vs
  ``red garden`` vs ``blue harbor``); the question names one, the others are
  distractors placed at seeded random depths;
- ``chat``: a multi-turn chat history whose fact (a locker number) is given in
  one early turn (its position set by ``depth``), followed by filler turns; the
  question is the new user turn.

Haystacks: English is the Python documentation shipped with every CPython
(``pydoc_data.topics``), read from a seeded start; Chinese is
``data/compression/zh_haystack.txt`` (original text written for this project),
its lines shuffled with the seed and repeated as needed. Lengths are counted
with the target model's tokenizer on the context alone (no chat template):
:attr:`Task.context_tokens` is the measured count, at most the requested one
and within a sentence of it. Cuts fall on whole characters (never half a
multi-byte character), so contexts never contain U+FFFD.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from workbench.checks import check_choice, check_float, check_int
from workbench.errors import ParameterError
from workbench.paths import data_dir

KINDS = ("needle", "multikey", "chat")
LANGUAGES = ("en", "zh")
#: the Chinese haystack text, under :func:`workbench.paths.data_dir` (``$WORKBENCH_DATA`` overrides it)
ZH_HAYSTACK = Path("compression") / "zh_haystack.txt"

_EN_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+|\n+")
_ZH_SENTENCE_END = re.compile(r"(?<=[。！？])|\n+")


@dataclass
class Task:
    """One long-context question with a known answer.

    Attributes:
        kind: ``needle``, ``multikey`` or ``chat``.
        language: ``en`` or ``zh``.
        context: the document (str) or, for ``chat``, the history
            (list of ``{"role", "content"}`` messages, user first).
        question: the question (the new user turn for ``chat``).
        answer: the gold answer (a 5-digit number as a string).
        depth: where the fact sits, as a fraction of the context (0..1).
        context_tokens: measured tokens of the context (message contents for ``chat``).
        requested_tokens: the length asked for.
        seed: the seed that generated it.
        needle: the sentence holding the fact.
        distractors: sentences holding similar, wrong facts (``multikey``).
    """

    kind: str
    language: str
    context: "str | list[dict]"
    question: str
    answer: str
    depth: float
    context_tokens: int
    requested_tokens: int
    seed: int
    needle: str
    distractors: list = field(default_factory=list)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.context, list)

    @property
    def key(self) -> tuple:
        """Identity of the task (for caching reference answers)."""
        return (self.kind, self.language, self.requested_tokens, round(self.depth, 6), self.seed)

    def to_record(self) -> dict:
        """Columns for a request row (the context itself is left out)."""
        d = asdict(self)
        d.pop("context")
        d["distractors"] = len(self.distractors)
        return d


# ----------------------------------------------------------------------------- haystack text


@functools.lru_cache(maxsize=2)
def haystack_text(language: str = "en") -> str:
    """The raw haystack of a language: ``en`` all ``pydoc_data.topics`` entries in key order, ``zh`` the data file."""
    _check_language(language)
    if language == "en":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k].strip() for k in sorted(topics))
    return (data_dir() / ZH_HAYSTACK).read_text(encoding="utf-8")


def _check_language(language) -> None:
    check_choice("language", language, LANGUAGES)


def _sentences(text: str, language: str) -> list[str]:
    """Split into sentences, keeping each sentence's trailing separator so joins are exact."""
    if language == "zh":
        parts = [p.strip() for p in _ZH_SENTENCE_END.split(text)]
        return [p for p in parts if p]
    out, start = [], 0
    for m in _EN_SENTENCE_END.finditer(text):
        piece = text[start:m.end()]
        if piece.strip():
            out.append(piece)
        start = m.end()
    if text[start:].strip():
        out.append(text[start:])
    return out


def _filler_sentences(language: str, rng: random.Random, start_fraction: float | None = None):
    """An endless stream of haystack sentences: English in document order from a seeded start,
    Chinese as seeded shuffles of the lines."""
    sents = _sentences(haystack_text(language), language)
    if language == "en":
        i = int((rng.random() if start_fraction is None else start_fraction) * len(sents))
        while True:
            yield sents[i % len(sents)]
            i += 1
    while True:
        order = list(sents)
        rng.shuffle(order)
        yield from order


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0


def _take_sentences(tokenizer, stream, n_tokens: int, language: str) -> list[str]:
    """Sentences from ``stream`` whose joined text has at most ``n_tokens`` tokens (as many as fit)."""
    out, total = [], 0
    while True:
        s = next(stream)
        t = _count(tokenizer, s)
        if total + t > n_tokens:
            # fill the rest with a whole-character prefix of the sentence
            rest = n_tokens - total
            if rest > 2:
                out.append(_prefix_within(tokenizer, s, rest))
            break
        out.append(s)
        total += t
    while out and _count(tokenizer, "".join(out)) > n_tokens:  # joins can re-tokenise by a token or two
        out[-1] = _prefix_within(tokenizer, out[-1], max(0, _count(tokenizer, out[-1]) - 2))
        if not out[-1]:
            out.pop()
    return out


def _prefix_within(tokenizer, text: str, n_tokens: int) -> str:
    """The longest whole-character prefix of ``text`` that has at most ``n_tokens`` tokens."""
    if n_tokens <= 0:
        return ""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= n_tokens:
        return text
    cut = tokenizer.decode(ids[:n_tokens], clean_up_tokenization_spaces=False).rstrip("\ufffd")
    while cut and _count(tokenizer, cut) > n_tokens:
        cut = cut[:-1]
    return cut


def _check_common(tokenizer, context_tokens, depth, seed, language) -> None:
    if tokenizer is None:
        raise ParameterError("tokenizer: a tokenizer is needed to measure lengths")
    check_int("context_tokens", context_tokens, 64)
    check_float("depth", depth, 0, 1)
    check_int("seed", seed, 0)
    _check_language(language)


def _insert_at_depth(sents: list[str], facts: list[tuple[float, str]], language: str) -> str:
    """Insert fact sentences between haystack sentences at fractional depths (by characters)."""
    total = sum(len(s) for s in sents) or 1
    bounds, acc = [0], 0
    for s in sents:
        acc += len(s)
        bounds.append(acc)
    slots: dict[int, list[str]] = {}
    for depth, fact in facts:
        idx = min(range(len(bounds)), key=lambda i: abs(bounds[i] - depth * total))
        slots.setdefault(idx, []).append(fact)
    pieces = []
    for i in range(len(sents) + 1):
        for fact in slots.get(i, []):
            if language == "en" and pieces and not pieces[-1][-1:].isspace():
                pieces.append(" ")
            pieces.append(fact if language == "zh" else fact + " ")
        if i < len(sents):
            pieces.append(sents[i])
    return "".join(pieces).strip()


def _fit_document(tokenizer, context_tokens, language, rng, facts, start_fraction=None) -> tuple[str, int]:
    """Haystack with facts inserted, at most ``context_tokens`` tokens (shrinks the haystack if joins overflow)."""
    fact_tokens = sum(_count(tokenizer, f) + 1 for _, f in facts)
    budget = context_tokens - fact_tokens
    if budget < 16:
        raise ParameterError(f"context_tokens: {context_tokens} is too short to hold the facts ({fact_tokens} tokens)")
    state = rng.getstate()
    for _ in range(8):
        rng.setstate(state)
        sents = _take_sentences(tokenizer, _filler_sentences(language, rng, start_fraction), budget, language)
        text = _insert_at_depth(sents, facts, language)
        n = _count(tokenizer, text)
        if n <= context_tokens:
            return text, n
        budget -= n - context_tokens
    raise RuntimeError("could not fit the haystack to the requested length")  # pragma: no cover


def _passkey(rng: random.Random, taken: set) -> str:
    while True:
        k = str(rng.randint(10000, 99999))
        if k not in taken:
            taken.add(k)
            return k


# ----------------------------------------------------------------------------- the three kinds


def needle_task(tokenizer, context_tokens: int, depth: float = 0.5, seed: int = 0, language: str = "en") -> Task:
    """A passkey sentence at ``depth`` in a haystack of ``context_tokens`` tokens.

    Args:
        tokenizer: the target model's tokenizer (lengths are counted with it).
        context_tokens: requested context length in tokens (>= 64).
        depth: fact position as a fraction of the haystack (0..1).
        seed: haystack start and passkey.
        language: ``en`` (Python docs) or ``zh``.

    Returns:
        :class:`Task` with ``answer`` the 5-digit passkey.

    Raises:
        ParameterError: bad length, depth, seed or language.
    """
    _check_common(tokenizer, context_tokens, depth, seed, language)
    rng = random.Random(f"needle/{seed}/{language}")
    key = _passkey(rng, set())
    if language == "zh":
        needle = f"档案室的通行密码是{key}。"
        question = "档案室的通行密码是多少？只回答数字。"
    else:
        needle = f"The passkey to the archive room is {key}."
        question = "What is the passkey to the archive room? Answer with the number only."
    text, n = _fit_document(tokenizer, context_tokens, language, rng, [(depth, needle)])
    return Task("needle", language, text, question, key, float(depth), n, context_tokens, seed, needle)


_EN_COLORS = ("red", "blue", "green", "yellow", "black", "white")
_EN_PLACES = ("harbor", "garden", "library", "tower", "cellar", "workshop")
_ZH_COLORS = ("红", "蓝", "绿", "黄", "黑", "白")
_ZH_PLACES = ("码头", "花园", "书房", "塔楼", "地窖", "工坊")


def multikey_task(
    tokenizer, context_tokens: int, depth: float = 0.5, seed: int = 0, language: str = "en", n_distractors: int = 3
) -> Task:
    """Several passkeys for similar names; the question names one (placed at ``depth``).

    Distractors share the colour or the place of the target (``red harbor`` vs
    ``red garden`` / ``blue harbor``) and sit at seeded random depths.

    Raises:
        ParameterError: as :func:`needle_task`, or ``n_distractors`` outside 1..8.
    """
    _check_common(tokenizer, context_tokens, depth, seed, language)
    check_int("n_distractors", n_distractors, 1, 8)
    rng = random.Random(f"multikey/{seed}/{language}")
    colors, places = (_ZH_COLORS, _ZH_PLACES) if language == "zh" else (_EN_COLORS, _EN_PLACES)
    ci, pi = rng.randrange(len(colors)), rng.randrange(len(places))
    names = []
    others = [(c, pi) for c in range(len(colors)) if c != ci] + [(ci, p) for p in range(len(places)) if p != pi]
    rng.shuffle(others)
    names = [(ci, pi)] + others[:n_distractors]
    taken: set = set()
    keys = [_passkey(rng, taken) for _ in names]

    def sentence(c, p, k):
        if language == "zh":
            return f"{colors[c]}色{places[p]}的通行密码是{k}。"
        return f"The passkey for the {colors[c]} {places[p]} room is {k}."

    sents = [sentence(c, p, k) for (c, p), k in zip(names, keys)]
    facts = [(float(depth), sents[0])] + [(rng.random(), s) for s in sents[1:]]
    if language == "zh":
        question = f"{colors[ci]}色{places[pi]}的通行密码是多少？只回答数字。"
    else:
        question = f"What is the passkey for the {colors[ci]} {places[pi]} room? Answer with the number only."
    text, n = _fit_document(tokenizer, context_tokens, language, rng, facts)
    return Task("multikey", language, text, question, keys[0], float(depth), n, context_tokens, seed, sents[0],
                distractors=sents[1:])


def chat_task(
    tokenizer, context_tokens: int, depth: float = 0.1, seed: int = 0, language: str = "en", turn_tokens: int = 96
) -> Task:
    """A chat history of about ``context_tokens`` tokens with a fact in one early turn.

    The history alternates user questions about the haystack's subject and
    assistant answers drawn from the haystack (about ``turn_tokens`` tokens
    each). The fact (a locker number) is stated by the user in the turn at
    ``depth`` of the history; the assistant acknowledges it without repeating
    the number. The question asks for it back.

    Returns:
        :class:`Task` whose ``context`` is a list of messages and whose
        ``context_tokens`` is the sum of the messages' content tokens.

    Raises:
        ParameterError: as :func:`needle_task`, or ``turn_tokens`` outside 16..1024.
    """
    _check_common(tokenizer, context_tokens, depth, seed, language)
    check_int("turn_tokens", turn_tokens, 16, 1024)
    rng = random.Random(f"chat/{seed}/{language}")
    key = _passkey(rng, set())
    if language == "zh":
        fact_user = f"顺便说一下，我的储物柜号码是{key}，请记住。"
        fact_reply = "好的，我记住了。"
        asks = ["再给我讲讲小镇的事情吧。", "后来呢？", "镇上还有什么有趣的地方？", "能多说一点吗？"]
        question = "我的储物柜号码是多少？只回答数字。"
    else:
        fact_user = f"By the way, my locker number is {key}. Please remember it."
        fact_reply = "Noted, I will remember your locker number."
        asks = ["Can you explain this part of Python?", "Tell me more.", "What comes next in the reference?",
                "Could you go on with the documentation?"]
        question = "What is my locker number? Answer with the number only."
    stream = _filler_sentences(language, rng)
    fact_tokens = _count(tokenizer, fact_user) + _count(tokenizer, fact_reply)
    # filler turns: (ask, answer) pairs until the budget is spent
    pairs, total = [], fact_tokens
    while True:
        ask = asks[len(pairs) % len(asks)]
        room = context_tokens - total - _count(tokenizer, ask)
        if room < 16:
            break
        sents = _take_sentences(tokenizer, stream, min(turn_tokens, room), language)
        reply = "".join(sents).strip()
        if not reply:
            break
        pairs.append((ask, reply))
        total += _count(tokenizer, ask) + _count(tokenizer, reply)
    if not pairs:
        raise ParameterError(f"context_tokens: {context_tokens} is too short for a chat history")
    pos = min(len(pairs), round(depth * len(pairs)))
    pairs.insert(pos, (fact_user, fact_reply))
    history = []
    for ask, reply in pairs:
        history += [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
    n = sum(_count(tokenizer, m["content"]) for m in history)
    real_depth = pos / max(1, len(pairs) - 1)
    return Task("chat", language, history, question, key, float(real_depth), n, context_tokens, seed, fact_user)


def make_task(kind: str, tokenizer, context_tokens: int, depth: float = 0.5, seed: int = 0, language: str = "en") -> Task:
    """Dispatch to :func:`needle_task`, :func:`multikey_task` or :func:`chat_task`.

    Raises:
        ParameterError: unknown ``kind`` (or the builder's own checks).
    """
    builders = {"needle": needle_task, "multikey": multikey_task, "chat": chat_task}
    check_choice("task", kind, KINDS)
    return builders[kind](tokenizer, context_tokens, depth=depth, seed=seed, language=language)
