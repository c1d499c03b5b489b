"""Retrieval for context compression: rank a context's chunks against a question and keep the best that fit.

Terms for BM25+ (:func:`lexical_tokens`: words, and for Chinese characters and character bigrams), BM25+ scores
(Lv & Zhai 2011; ``rank_bm25.BM25Plus``), dense scores (cosine of all-MiniLM-L6-v2 embeddings,
``sentence-transformers``), pieces of one sentence sharing its best score, and the budgeted selection in the
context's order. Used by :func:`workbench.techniques.compression.compress` (strategies ``bm25`` and ``dense``).
"""

from __future__ import annotations

import functools
import itertools
import unicodedata

from workbench.measure import quality
from workbench.techniques.segments import Chunk, Segment, cut_rank, render

CHUNK_GAP = "\n"  # between non-adjacent retrieved chunks


def lexical_tokens(text: str) -> list[str]:
    """BM25 terms: the words of :func:`workbench.measure.quality.units` outside CJK text, then, for each run of
    adjacent CJK characters, its characters and its character bigrams (Chinese has no spaces, so bigrams
    stand in for words)."""
    text = unicodedata.normalize("NFKC", text).lower()
    words, cjk = [], []
    for is_cjk, group in itertools.groupby(text, key=quality.is_cjk):
        run = "".join(group)
        if is_cjk:
            cjk.extend(run)
            cjk.extend(run[i:i + 2] for i in range(len(run) - 1))
        else:
            words.extend(quality.units(run))
    return words + cjk


def bm25_scores(chunks: list[Chunk], question: str) -> list[float]:
    """BM25+ scores of the chunks for the question (``rank_bm25.BM25Plus``: an IDF that stays positive,
    so a term in half of two chunks still counts)."""
    from rank_bm25 import BM25Plus

    corpus = [lexical_tokens(c.text) or ["\x00"] for c in chunks]
    return [float(s) for s in BM25Plus(corpus).get_scores(lexical_tokens(question))]


@functools.lru_cache(maxsize=1)
def embedder():
    """The shipped all-MiniLM-L6-v2 as a ``SentenceTransformer`` on CPU (loaded once per process)."""
    from sentence_transformers import SentenceTransformer

    from workbench.measure.models import default_embedder_path

    return SentenceTransformer(str(default_embedder_path()), device="cpu")


def dense_scores(chunks: list[Chunk], question: str) -> list[float]:
    """Cosine similarity of each chunk's embedding to the question's (:func:`embedder`, normalised vectors)."""
    emb = embedder().encode([question] + [c.text for c in chunks], normalize_embeddings=True,
                             batch_size=32, show_progress_bar=False)
    return [float(x) for x in emb[1:] @ emb[0]]


def sentence_scores(chunks: list[Chunk], scores: list[float]) -> list[float]:
    """Give the pieces of one sentence (a sentence longer than a chunk, cut between words) the best score
    among them, so a kept piece pulls in the rest of its sentence (``The pass key is`` | ``71432.``: the
    number alone shares no term with the question)."""
    out = list(scores)
    run = [0]
    for i in range(1, len(chunks) + 1):
        a, b = chunks[i - 1], chunks[i] if i < len(chunks) else None
        same = (b is not None and a.segment == b.segment and a.end == b.start
                and cut_rank(a.text + b.text, len(a.text)) < 3)
        if same:
            run.append(i)
            continue
        best = max(scores[j] for j in run)
        for j in run:
            out[j] = best
        run = [i]
    return out


def retrieve(segs: list[Segment], chunks: list[Chunk], scores: list[float], b: int, top_k, as_chat: bool,
             details: dict):
    """The context keeping the best-scored chunks that fit ``b`` tokens (at most ``top_k``), in their original
    order, non-adjacent ones separated by :data:`CHUNK_GAP`; ``details`` gets ``chunks_kept`` and
    ``kept_chunk_ids``."""
    order = sorted(range(len(chunks)), key=lambda i: (-scores[i], i))
    chosen, used = set(), 0
    for i in order:
        if top_k is not None and len(chosen) >= top_k:
            break
        cost = chunks[i].n_tokens + (1 if chosen else 0)  # a separator token before all but the first
        if used + cost <= b:
            chosen.add(i)
            used += cost
    keep = [[False] * len(s.units) for s in segs]
    for i in chosen:
        c = chunks[i]
        for ui in range(c.start, c.end):
            keep[c.segment][ui] = True
    details["chunks_kept"] = len(chosen)
    details["kept_chunk_ids"] = ",".join(str(i) for i in sorted(chosen))
    return render(segs, keep, CHUNK_GAP, as_chat)
