"""A context cut into pieces that decode to whole characters, and put back together.

The ground the compression strategies (:mod:`workbench.techniques.compression`) and retrieval (:mod:`workbench.techniques.retrieval`)
stand on: a document or chat history becomes :class:`Segment` s (one per message) of *units*, token ids grouped
so that each decodes to complete UTF-8 text (Chinese never comes out with U+FFFD); :func:`render` rebuilds the
context from per-unit keep flags; :func:`fit` shrinks a selection until it counts within a token budget;
:func:`cut_rank` and :func:`chunks` place cuts between words and sentences, never inside a word or number.
"""

from __future__ import annotations

from dataclasses import dataclass

SENT_END = tuple(".!?。！？\n")


def count_tokens(tokenizer, context) -> int:
    """Tokens of a context: a string's ids, or the sum over a chat history's message contents."""
    if isinstance(context, list):
        return sum(count_tokens(tokenizer, m["content"]) for m in context)
    return len(tokenizer(context, add_special_tokens=False)["input_ids"]) if context else 0


@dataclass
class Segment:
    """One message of a chat history (``role``) or the whole document (``role`` None), cut into units: lists of
    token ids that each decode to whole characters (``unit_texts``)."""

    role: "str | None"
    text: str
    units: list  # list of lists of token ids, each decoding to whole characters
    unit_texts: list

    @property
    def n_tokens(self) -> int:
        return sum(len(u) for u in self.units)


def split_units(tokenizer, text: str) -> tuple[list, list]:
    """``(units, unit_texts)``: group a text's token ids into units that decode to complete characters (no U+FFFD)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    pieces = tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    units, texts, cur = [], [], []
    for i, piece in zip(ids, pieces):
        cur.append(i)
        t = piece if len(cur) == 1 else tokenizer.decode(cur, clean_up_tokenization_spaces=False)
        if "\ufffd" in t and len(cur) < 8:  # a split multi-byte character: wait for its other bytes
            continue
        units.append(cur)
        texts.append(t)
        cur = []
    if cur:
        units.append(cur)
        texts.append(tokenizer.decode(cur, clean_up_tokenization_spaces=False))
    return units, texts


def segments(tokenizer, context) -> list[Segment]:
    """A document (str: one segment, ``role`` None) or a chat history (one segment per message) as segments."""
    if isinstance(context, list):
        return [Segment(m["role"], m["content"], *split_units(tokenizer, m["content"])) for m in context]
    return [Segment(None, context, *split_units(tokenizer, context))]


def glue(left: str, right: str, gap: str) -> str:
    """What goes between two non-adjacent kept pieces: ``gap``, or one space between Latin letters/digits."""
    if gap:
        return gap
    a, b = left[-1:], right[:1]
    return " " if a.isascii() and b.isascii() and a.isalnum() and b.isalnum() else ""


def render(segs: list[Segment], keep: list[list[bool]], gap: str, as_chat: bool):
    """Rebuild the context from per-unit keep flags; removed runs become ``gap``."""
    texts = []
    for seg, flags in zip(segs, keep):
        out, prev = [], None
        for i, kept in enumerate(flags):
            if not kept:
                continue
            piece = seg.unit_texts[i]
            if prev is not None and i != prev + 1:
                out.append(glue(out[-1], piece, gap))
            out.append(piece)
            prev = i
        texts.append("".join(out))
    if as_chat:
        return [{"role": s.role, "content": t} for s, t in zip(segs, texts) if t.strip()]
    return texts[0]


def fit(select, tokenizer, budget: int):
    """Call ``select(b)`` with a shrinking inner budget until the output counts at most ``budget`` tokens."""
    b = budget
    for _ in range(16):
        out = select(b)
        n = count_tokens(tokenizer, out)
        if n <= budget:
            return out, n
        b -= max(1, n - budget)
        if b <= 0:
            break
    out = select(0)
    return out, count_tokens(tokenizer, out)


# ----------------------------------------------------------------------------- cuts and chunks


@dataclass
class Chunk:
    """A retrieval chunk: units ``[start, end)`` of segment ``segment``; ``n_tokens`` counted on its own text."""

    segment: int
    start: int
    end: int
    text: str
    n_tokens: int


def is_cjk(ch: str) -> bool:
    """A CJK ideograph, kana or Hangul syllable: each is a word of its own (no spaces between them)."""
    o = ord(ch)
    return 0x2E80 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x2FA1F


#: Characters that join two word characters into one word or number (``3.14``, ``71,432``, ``don't``, ``e-mail``).
JOINERS = ".,:'\u2019-_/"


def cut_rank(text: str, pos: int) -> int:
    """How good a cut of ``text`` before character ``pos`` is: 3 at a sentence or paragraph end, 2 at
    whitespace, 1 elsewhere between words (after punctuation, between CJK characters), 0 inside a word or
    a number (``7143|2``, ``3.|14``, ``71,|432``, ``do|n't``); the ends of ``text`` rank 3.
    """
    if pos <= 0 or pos >= len(text):
        return 3
    left, right = text[max(0, pos - 64):pos], text[pos:pos + 2]  # a window: ranks of a long text stay linear
    x, y = left[-1], right[0]
    if x.isspace() or y.isspace():
        stripped = left.rstrip(" \t")
        return 3 if stripped and stripped[-1] in SENT_END else 2
    if x in "\u3002\uff01\uff1f":  # CJK full stops need no space after them
        return 3
    if x.isalnum() and y.isalnum():
        return 1 if is_cjk(x) or is_cjk(y) else 0
    if x in JOINERS and y.isalnum() and len(left) > 1 and left[-2].isalnum() and not is_cjk(left[-2]):
        return 0
    if y in JOINERS and x.isalnum() and len(right) > 1 and right[1].isalnum() and not is_cjk(x):
        return 0
    return 1


def unit_ranks(seg: Segment) -> list[int]:
    """:func:`cut_rank` of a cut before each unit of a segment, and after the last (``len(units) + 1`` values)."""
    offsets, pos = [], 0
    for t in seg.unit_texts:
        offsets.append(pos)
        pos += len(t)
    full = "".join(seg.unit_texts)
    return [cut_rank(full, o) for o in offsets] + [3]


def cut_chunks(segs: list[Segment], tokenizer, chunk_tokens: int) -> list[Chunk]:
    """Cut each segment into chunks of at most ``chunk_tokens`` tokens at the best boundary inside the budget.

    From the current position, the chunk takes as many units as fit and ends at the last cut of the highest
    :func:`cut_rank` among them: a sentence or paragraph end when there is one (whole sentences are packed
    together), else whitespace (a sentence longer than the chunk is split between words), else another
    boundary between words. A chunk never ends inside a word or number unless that word alone is longer than
    a chunk. Each chunk's text is tokenised on its own and cut again (at its best boundary nearest the
    middle) if it exceeds the size, so no chunk is longer.
    """
    out: list[Chunk] = []

    def emit(si, start, end, rank):
        seg = segs[si]
        text = "".join(seg.unit_texts[start:end])
        n = count_tokens(tokenizer, text)
        if n > chunk_tokens and end - start > 1:
            mid = (start + end) / 2
            cut = max(range(start + 1, end), key=lambda c: (rank[c], -abs(c - mid)))
            emit(si, start, cut, rank)
            emit(si, cut, end, rank)
        elif text:
            out.append(Chunk(si, start, end, text, n))

    for si, seg in enumerate(segs):
        rank = unit_ranks(seg)
        start, n_units = 0, len(seg.units)
        while start < n_units:
            end, used = start, 0
            while end < n_units and (end == start or used + len(seg.units[end]) <= chunk_tokens):
                used += len(seg.units[end])
                end += 1
            if end < n_units:
                best = max(rank[c] for c in range(start + 1, end + 1))
                if best > 0:  # the last cut of the best rank; rank 0 (a word longer than a chunk): cut at the limit
                    end = max(c for c in range(start + 1, end + 1) if rank[c] == best)
            emit(si, start, end, rank)
            start = end
    return out
