"""Context compression: shrink a long input before prefill, and measure what it costs and saves.

One interface for every strategy, :func:`compress`::

    compress(context, question, tokenizer, strategy, ratio=4)  # or budget=256
    -> CompressionResult(context, compressed_tokens, original_tokens, compressor_s, ...)

``context`` is a document (str) or a chat history (list of ``{"role",
"content"}`` messages); the question is never compressed. Token counts are
taken with the target model's tokenizer over the context alone (for a chat,
the sum of the message contents; the chat template is the same for every
strategy and is counted in ``prompt_tokens`` at generation). The budget is
``floor(original_tokens / ratio)`` unless given; every lossy strategy ends at
or under it (re-tokenising a cut can add a token, so each result is counted
again and shrunk until it fits). Cuts fall on whole characters: token ids are
grouped into units that decode to complete UTF-8 text, so Chinese never comes
out with U+FFFD, and nothing inserts spaces into CJK text.

Strategies (:data:`STRATEGIES`):

- ``none``: the baseline, unchanged.
- ``head`` / ``tail`` / ``head_tail``: truncation, keeping the start, the end,
  or both halves (middle replaced by ``\\n...\\n``).
- ``bm25`` / ``dense``: retrieval top-k. The context is split into chunks of
  at most ``chunk_tokens`` tokens (packed from whole sentences, a chunk's own
  tokenisation never longer than the chunk size, never crossing a message),
  ranked by BM25 (Robertson & Zaragoza 2009; ``rank_bm25.BM25Okapi``) or by
  cosine similarity of all-MiniLM-L6-v2 embeddings (``sentence-transformers``,
  the shipped folder :func:`workbench.models.default_embedder_path`) against
  the question, and the best chunks that fit the budget are kept in their
  original order.
- ``summary``: for a chat history, a rolling summary (older turns folded into
  a running summary one group at a time, recent turns verbatim); for a
  document, a hierarchical map-reduce summary (chunks summarised as one batch,
  then summaries of summaries until the result fits). Summaries are generated
  by the target model through :func:`workbench.generation.generate_measured`.
- ``prune``: token pruning by self-information, the idea of LLMLingua (Jiang et
  al., EMNLP 2023, "LLMLingua: Compressing Prompts for Accelerated Inference of
  Large Language Models", arXiv:2310.05736) and Selective Context (Li et al.,
  EMNLP 2023, arXiv:2310.06201): the default model scores each token's
  ``-log p(token | preceding tokens)`` (windows of ``window`` tokens, each with
  ``32`` tokens of left context); words (sub-word pieces joined; each CJK
  character its own unit) are ranked by mean self-information and the most
  surprising are kept, in order, until the budget is reached. Simplification:
  one scoring pass, no budget controller or iterative re-scoring.
- ``kv_reuse``: lossless prefix caching. The unchanged history (or document)
  is prefilled once into a ``transformers`` ``DynamicCache`` when it becomes
  known (``details["prefix_prefill_s"]``, off the request's critical path, as
  in a chat server whose cache holds the previous turns); each request
  deep-copies the cache and passes it to ``generate``, which prefills only the
  new tokens. The copy is timed inside TTFT. ``compressor_s`` is 0.

Quality metrics: :func:`answer_match` (substring / exact match),
:func:`gold_logprob` (log-likelihood of the gold answer given the compressed
prompt, one forward pass), :func:`rouge_l` (ROUGE-L F1 against the
uncompressed run's answer, ``rouge_score`` with a CJK-aware tokenizer).

The sweep glue (:class:`CompressionConfig`, :func:`run_compression_sweep`) and
the figures (:func:`figures`, :func:`break_even`, :func:`best_strategy`) sit at
the end of the module.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
import re
import time
import unicodedata
from dataclasses import dataclass, field

from .errors import ParameterError
from .generation import GenerationSettings, encode_prompts, generate_measured

STRATEGIES = ("none", "head", "tail", "head_tail", "bm25", "dense", "summary", "prune", "kv_reuse")
LOSSLESS = ("none", "kv_reuse")
NEEDS_MODEL = ("summary", "prune", "kv_reuse")

_GAP = "\n...\n"  # marks removed middle text (truncation)
_CHUNK_GAP = "\n"  # between non-adjacent retrieved chunks
_SUMMARY_PREFIX = {"en": "Summary of the earlier conversation: ", "zh": "之前对话的摘要："}
_SENT_END = tuple(".!?。！？\n")


# ----------------------------------------------------------------------------- results


@dataclass
class CompressionResult:
    """What a compressor produced.

    Attributes:
        strategy: one of :data:`STRATEGIES`.
        context: the compressed context, same kind as the input (str, or list of messages).
        question: the question, unchanged.
        original_tokens: tokens of the input context (target tokenizer).
        compressed_tokens: tokens of ``context`` (same counting).
        budget_tokens: the token budget asked for (``original_tokens`` when none).
        compressor_s: seconds the compressor ran on the request's path.
        details: strategy facts (chunks kept, summary calls, cached tokens, notes).
        prefix_cache: ``kv_reuse`` only: the ``DynamicCache`` of the prompt prefix.
        prefix_ids: ``kv_reuse`` only: the token ids that cache holds.
    """

    strategy: str
    context: "str | list[dict]"
    question: str
    original_tokens: int
    compressed_tokens: int
    budget_tokens: int
    compressor_s: float
    details: dict = field(default_factory=dict)
    prefix_cache: object = field(default=None, repr=False)
    prefix_ids: list = field(default=None, repr=False)

    @property
    def ratio(self) -> float:
        """Achieved compression ratio ``original_tokens / compressed_tokens`` (inf when nothing is left)."""
        if self.compressed_tokens == 0:
            return math.inf if self.original_tokens else 1.0
        return self.original_tokens / self.compressed_tokens

    @property
    def is_chat(self) -> bool:
        return isinstance(self.context, list)

    @property
    def text(self) -> str:
        """The compressed context as one string (a chat as ``role: content`` lines)."""
        if self.is_chat:
            return "\n".join(f"{m['role']}: {m['content']}" for m in self.context)
        return self.context

    def messages(self) -> list[dict]:
        """The chat prompt to send: see :func:`prompt_messages`."""
        return prompt_messages(self.context, self.question)

    def to_record(self) -> dict:
        """Columns for a request row."""
        return {
            "compression": self.strategy,
            "original_tokens": self.original_tokens,
            "compressed_tokens": self.compressed_tokens,
            "budget_tokens": self.budget_tokens,
            "achieved_ratio": self.ratio,
            "compressor_s": self.compressor_s,
            **{f"detail_{k}": v for k, v in self.details.items() if isinstance(v, (int, float, str, bool))},
        }


def _is_cjk(ch: str) -> bool:
    return bool(ch) and ("\u3400" <= ch <= "\u9fff" or "\u3000" <= ch <= "\u303f" or "\uff00" <= ch <= "\uffef")


def _language(text: str) -> str:
    return "zh" if any(_is_cjk(c) for c in text) else "en"


def prompt_messages(context, question: str) -> list[dict]:
    """The chat prompt for a context and a question.

    A document becomes one user message ``<context>\\n\\nQuestion: <question>``
    (``问题：`` for Chinese); a chat history gets the question as a new user turn.
    """
    if isinstance(context, list):
        return [dict(m) for m in context] + [{"role": "user", "content": question}]
    label = "问题：" if _language(question) == "zh" else "Question: "
    body = f"{context}\n\n{label}{question}" if context else f"{label}{question}"
    return [{"role": "user", "content": body}]


# ----------------------------------------------------------------------------- units and counting


def count_tokens(tokenizer, context) -> int:
    """Tokens of a context: a string's ids, or the sum over a chat history's message contents."""
    if isinstance(context, list):
        return sum(count_tokens(tokenizer, m["content"]) for m in context)
    return len(tokenizer(context, add_special_tokens=False)["input_ids"]) if context else 0


@dataclass
class _Segment:
    role: "str | None"
    text: str
    units: list  # list of lists of token ids, each decoding to whole characters
    unit_texts: list

    @property
    def n_tokens(self) -> int:
        return sum(len(u) for u in self.units)


def _units(tokenizer, text: str) -> tuple[list, list]:
    """Group a text's token ids into units that decode to complete characters (no U+FFFD)."""
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


def _segments(tokenizer, context) -> list[_Segment]:
    if isinstance(context, list):
        return [_Segment(m["role"], m["content"], *_units(tokenizer, m["content"])) for m in context]
    return [_Segment(None, context, *_units(tokenizer, context))]


def _glue(left: str, right: str, gap: str) -> str:
    """What goes between two non-adjacent kept pieces: ``gap``, or one space between Latin letters/digits."""
    if gap:
        return gap
    a, b = left[-1:], right[:1]
    return " " if a.isascii() and b.isascii() and a.isalnum() and b.isalnum() else ""


def _render(segs: list[_Segment], keep: list[list[bool]], gap: str, as_chat: bool):
    """Rebuild the context from per-unit keep flags; removed runs become ``gap``."""
    texts = []
    for seg, flags in zip(segs, keep):
        out, prev = [], None
        for i, kept in enumerate(flags):
            if not kept:
                continue
            piece = seg.unit_texts[i]
            if prev is not None and i != prev + 1:
                out.append(_glue(out[-1], piece, gap))
            out.append(piece)
            prev = i
        texts.append("".join(out))
    if as_chat:
        return [{"role": s.role, "content": t} for s, t in zip(segs, texts) if t.strip()]
    return texts[0]


def _fit(select, tokenizer, budget: int):
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


# ----------------------------------------------------------------------------- validation


def _check_context(context) -> None:
    if isinstance(context, str):
        if not context.strip():
            raise ParameterError("context: is empty (nothing to compress)")
        return
    if isinstance(context, list):
        if not context:
            raise ParameterError("context: chat history is empty (nothing to compress)")
        for m in context:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ParameterError("context: chat messages must be dicts with string 'role' and 'content'")
        if not any(m["content"].strip() for m in context):
            raise ParameterError("context: every message is empty (nothing to compress)")
        return
    raise ParameterError(f"context: must be a string or a list of chat messages (got {type(context).__name__})")


def check_ratio(ratio) -> float:
    """Validate a target compression ratio: a finite number >= 1 (1 = no compression).

    Raises:
        ParameterError: anything else.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 1:
        raise ParameterError(f"ratio: must be a finite number >= 1 (got {ratio!r})")
    return float(ratio)


def check_budget(budget) -> int:
    """Validate a token budget: an integer >= 1.

    Raises:
        ParameterError: anything else.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ParameterError(f"budget: must be an integer >= 1 token (got {budget!r})")
    return budget


def check_strategy(strategy) -> str:
    if strategy not in STRATEGIES:
        raise ParameterError(f"strategy: must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    return strategy


# ----------------------------------------------------------------------------- the interface


def compress(
    context,
    question: str,
    tokenizer,
    strategy: str = "none",
    ratio: float | None = None,
    budget: int | None = None,
    loaded=None,
    chunk_tokens: int = 64,
    top_k: int | None = None,
    summary_chunk_tokens: int = 384,
    recent_share: float = 0.5,
    window: int = 512,
) -> CompressionResult:
    """Compress a context for a question to a target ratio or token budget.

    Args:
        context: a document (str) or a chat history (list of ``{"role", "content"}``).
        question: the question; never compressed.
        tokenizer: the target model's tokenizer (all counts use it).
        strategy: one of :data:`STRATEGIES`.
        ratio: target ``original / compressed`` (>= 1); or give ``budget``.
        budget: target tokens of the compressed context (>= 1).
        loaded: :class:`workbench.models.LoadedModel`, needed by ``summary``,
            ``prune`` and ``kv_reuse``.
        chunk_tokens: retrieval chunk size in tokens (>= 8).
        top_k: retrieval: keep at most this many chunks (default: as many as fit).
        summary_chunk_tokens: summary: tokens per map chunk / rolling group (>= 32).
        recent_share: rolling summary: share of the budget for verbatim recent turns (0..1).
        window: prune: tokens per scoring forward pass (>= 16).

    Returns:
        :class:`CompressionResult`. A context already within the budget is
        returned unchanged with ``details["note"] = "already within budget"``.

    Raises:
        ParameterError: empty context, unknown strategy, invalid ratio/budget
            (or both given), missing model for a model-based strategy, bad options.
    """
    check_strategy(strategy)
    _check_context(context)
    if not isinstance(question, str) or not question.strip():
        raise ParameterError("question: must be a non-empty string")
    if ratio is not None and budget is not None:
        raise ParameterError("ratio, budget: give one of them, not both")
    if ratio is not None:
        check_ratio(ratio)
    if budget is not None:
        check_budget(budget)
    if strategy not in LOSSLESS and ratio is None and budget is None:
        raise ParameterError(f"ratio: strategy {strategy!r} needs a target ratio or a token budget")
    if strategy in NEEDS_MODEL and loaded is None:
        raise ParameterError(f"loaded: strategy {strategy!r} needs the loaded model (loaded=load_model(...))")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 8:
        raise ParameterError(f"chunk_tokens: must be an integer >= 8 (got {chunk_tokens!r})")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ParameterError(f"top_k: must be an integer >= 1 or None (got {top_k!r})")
    if isinstance(summary_chunk_tokens, bool) or not isinstance(summary_chunk_tokens, int) or summary_chunk_tokens < 32:
        raise ParameterError(f"summary_chunk_tokens: must be an integer >= 32 (got {summary_chunk_tokens!r})")
    if not isinstance(recent_share, (int, float)) or not 0 <= recent_share <= 1:
        raise ParameterError(f"recent_share: must be a number in [0, 1] (got {recent_share!r})")
    if isinstance(window, bool) or not isinstance(window, int) or window < 16:
        raise ParameterError(f"window: must be an integer >= 16 (got {window!r})")
    if strategy == "dense":
        _embedder()  # load once, outside the timed region

    t0 = time.perf_counter()
    original = count_tokens(tokenizer, context)
    if strategy in LOSSLESS or budget is None:  # lossless strategies keep everything whatever the target
        budget = original if ratio is None or strategy in LOSSLESS else max(1, math.floor(original / ratio))
    common = dict(strategy=strategy, question=question, original_tokens=original, budget_tokens=budget)
    if strategy == "kv_reuse":
        return _kv_reuse(context, question, loaded, common)
    if strategy == "none" or original <= budget:
        details = {} if strategy == "none" else {"note": "already within budget"}
        return CompressionResult(context=context, compressed_tokens=original,
                                 compressor_s=time.perf_counter() - t0, details=details, **common)
    segs = _segments(tokenizer, context)
    as_chat = isinstance(context, list)
    details: dict = {}
    if strategy in ("head", "tail", "head_tail"):
        out, n = _fit(lambda b: _truncate(segs, b, strategy, as_chat), tokenizer, budget)
    elif strategy in ("bm25", "dense"):
        size = min(chunk_tokens, max(8, budget // 2))  # at least two chunks fit the budget
        chunks = _chunks(segs, tokenizer, size)
        details["chunk_tokens"] = size
        scores = _bm25_scores(chunks, question) if strategy == "bm25" else _dense_scores(chunks, question)
        out, n = _fit(lambda b: _retrieve(segs, chunks, scores, b, top_k, as_chat, details), tokenizer, budget)
        details["chunks"] = len(chunks)
    elif strategy == "prune":
        info = [_self_information(loaded, [i for u in s.units for i in u], window) for s in segs]
        words = _words(segs, info)
        out, n = _fit(lambda b: _prune(segs, words, b, as_chat), tokenizer, budget)
        details["words"] = len(words)
    else:  # summary
        if as_chat:
            out, n = _rolling_summary(segs, tokenizer, loaded, budget, summary_chunk_tokens, recent_share, details)
        else:
            out, n = _map_reduce_summary(segs, tokenizer, loaded, budget, summary_chunk_tokens, details)
    return CompressionResult(context=out, compressed_tokens=n, compressor_s=time.perf_counter() - t0,
                             details=details, **common)


# ----------------------------------------------------------------------------- truncation


def _truncate(segs: list[_Segment], b: int, mode: str, as_chat: bool):
    flat = [(si, ui, len(u)) for si, s in enumerate(segs) for ui, u in enumerate(s.units)]
    keep = [[False] * len(s.units) for s in segs]

    def take(order, limit):
        used = 0
        for si, ui, n in order:
            if used + n > limit:
                break
            keep[si][ui] = True
            used += n

    if mode == "head":
        take(flat, b)
    elif mode == "tail":
        take(reversed(flat), b)
    else:
        take(flat, b // 2)
        take(reversed(flat), b - b // 2)
    return _render(segs, keep, _GAP, as_chat)


# ----------------------------------------------------------------------------- retrieval


@dataclass
class Chunk:
    """A retrieval chunk: units ``[start, end)`` of segment ``segment``; ``n_tokens`` counted on its own text."""

    segment: int
    start: int
    end: int
    text: str
    n_tokens: int


def _chunks(segs: list[_Segment], tokenizer, chunk_tokens: int) -> list[Chunk]:
    """Pack whole sentences into chunks of at most ``chunk_tokens`` tokens (a long sentence is split by units).

    Each chunk's text is tokenised on its own and split again if it exceeds the size, so no chunk is longer.
    """
    out: list[Chunk] = []

    def emit(si, start, end):
        seg = segs[si]
        text = "".join(seg.unit_texts[start:end])
        n = count_tokens(tokenizer, text)
        if n > chunk_tokens and end - start > 1:
            mid = (start + end) // 2
            emit(si, start, mid)
            emit(si, mid, end)
        elif text:
            out.append(Chunk(si, start, end, text, n))

    for si, seg in enumerate(segs):
        sentences, start = [], 0
        for ui, t in enumerate(seg.unit_texts):
            if t.rstrip(" ").endswith(_SENT_END) or ui == len(seg.units) - 1:
                sentences.append((start, ui + 1))
                start = ui + 1
        c_start, c_end, c_tok = 0, 0, 0
        for s, e in sentences:
            n = sum(len(u) for u in seg.units[s:e])
            if c_tok and c_tok + n > chunk_tokens:
                emit(si, c_start, c_end)
                c_start, c_tok = s, 0
            if n > chunk_tokens:  # a sentence longer than a chunk: cut it by units
                if c_tok:
                    emit(si, c_start, c_end)
                pos, used = s, 0
                for ui in range(s, e):
                    if used + len(seg.units[ui]) > chunk_tokens and ui > pos:
                        emit(si, pos, ui)
                        pos, used = ui, 0
                    used += len(seg.units[ui])
                c_start, c_end, c_tok = pos, e, used
                continue
            c_end, c_tok = e, c_tok + n
        if c_tok:
            emit(si, c_start, c_end)
    return out


def lexical_tokens(text: str) -> list[str]:
    """BM25 terms: lower-cased Latin words and digit runs, CJK characters and CJK character bigrams."""
    text = unicodedata.normalize("NFKC", text).lower()
    terms = re.findall(r"[a-z0-9]+", text)
    for run in re.findall(r"[\u3400-\u9fff]+", text):
        terms.extend(run)
        terms.extend(run[i:i + 2] for i in range(len(run) - 1))
    return terms


def _bm25_scores(chunks: list[Chunk], question: str) -> list[float]:
    from rank_bm25 import BM25Okapi

    corpus = [lexical_tokens(c.text) or ["\x00"] for c in chunks]
    return [float(s) for s in BM25Okapi(corpus).get_scores(lexical_tokens(question))]


@functools.lru_cache(maxsize=1)
def _embedder():
    """The shipped all-MiniLM-L6-v2 as a ``SentenceTransformer`` on CPU (loaded once per process)."""
    from sentence_transformers import SentenceTransformer

    from .models import default_embedder_path

    return SentenceTransformer(str(default_embedder_path()), device="cpu")


def _dense_scores(chunks: list[Chunk], question: str) -> list[float]:
    emb = _embedder().encode([question] + [c.text for c in chunks], normalize_embeddings=True,
                             batch_size=32, show_progress_bar=False)
    return [float(x) for x in emb[1:] @ emb[0]]


def _retrieve(segs, chunks, scores, b, top_k, as_chat, details):
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
    return _render(segs, keep, _CHUNK_GAP, as_chat)


def retrieval_chunks(context, tokenizer, chunk_tokens: int = 64) -> list[Chunk]:
    """The chunks ``bm25``/``dense`` rank (public for inspection and tests)."""
    _check_context(context)
    return _chunks(_segments(tokenizer, context), tokenizer, chunk_tokens)


# ----------------------------------------------------------------------------- pruning


def _self_information(loaded, ids: list[int], window: int, left: int = 32) -> list[float]:
    """``-log p(x_t | x_<t)`` in nats for each token (the first token: +inf, always kept)."""
    import torch

    out = [math.inf] * len(ids)
    model = loaded.model
    for start in range(0, len(ids), window):
        lo = max(0, start - left)
        piece = ids[lo:start + window]
        if len(piece) < 2:
            continue
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([piece], device=model.device), use_cache=False).logits[0]
        logp = torch.log_softmax(logits[:-1].float(), dim=-1)
        target = torch.tensor(piece[1:], device=logp.device)
        info = (-logp.gather(1, target[:, None])[:, 0]).tolist()
        for pos in range(max(start, lo + 1), min(start + window, len(ids))):
            out[pos] = info[pos - lo - 1]
    return out


def _words(segs: list[_Segment], info: list[list[float]]) -> list[tuple[int, list[int], int, float]]:
    """Words as (segment, unit indices, tokens, mean self-information); sub-word pieces of Latin words joined."""
    words = []
    for si, seg in enumerate(segs):
        tok_pos = 0
        cur, cur_info, cur_n = [], [], 0
        for ui, (u, t) in enumerate(zip(seg.units, seg.unit_texts)):
            prev = seg.unit_texts[ui - 1][-1:] if ui else ""
            head = t[:1]
            joins = cur and prev.isascii() and prev.isalnum() and head.isascii() and head.isalnum()
            if cur and not joins:
                words.append((si, cur, cur_n, sum(cur_info) / len(cur_info)))
                cur, cur_info, cur_n = [], [], 0
            cur.append(ui)
            cur_info.extend(info[si][tok_pos:tok_pos + len(u)])
            cur_n += len(u)
            tok_pos += len(u)
        if cur:
            words.append((si, cur, cur_n, sum(cur_info) / len(cur_info)))
    return words


def _prune(segs, words, b, as_chat):
    order = sorted(range(len(words)), key=lambda i: (-words[i][3], i))
    keep = [[False] * len(s.units) for s in segs]
    used = 0
    for i in order:
        si, units, n, _ = words[i]
        if used + n > b:
            continue
        used += n
        for ui in units:
            keep[si][ui] = True
    return _render(segs, keep, "", as_chat)


# ----------------------------------------------------------------------------- summaries


def _generate_texts(loaded, prompts: list[str], max_new_tokens: int, details: dict) -> list[str]:
    settings = GenerationSettings(max_new_tokens=max(1, int(max_new_tokens)))
    res = generate_measured(loaded, prompts, settings, chat=True)
    details["summary_calls"] = details.get("summary_calls", 0) + len(prompts)
    details["summary_tokens"] = details.get("summary_tokens", 0) + sum(r["output_tokens"] for r in res.records)
    return [r["text"].strip() for r in res.records]


def _clip(tokenizer, text: str, budget: int) -> str:
    """Keep the head of ``text`` within ``budget`` tokens, on whole characters."""
    if budget <= 0:
        return ""
    segs = _segments(tokenizer, text)
    out, _ = _fit(lambda b: _truncate(segs, b, "head", False), tokenizer, budget)
    return out


_MAP_PROMPT = ("Summarise the following text in at most {words} words. Keep every number, name and key fact. "
               "Write in the language of the text.\n\nText:\n{text}")
_ROLL_PROMPT = ("Here is a summary of a conversation so far:\n{summary}\n\nHere are the next turns:\n{turns}\n\n"
                "Write an updated summary of the whole conversation in at most {words} words. "
                "Keep every number, name and fact the user gave.")


def _map_reduce_summary(segs, tokenizer, loaded, budget, chunk_tokens, details):
    pieces = [c.text for c in _chunks(segs, tokenizer, chunk_tokens)]
    level = 0
    while True:
        level += 1
        per = max(8, budget // max(1, len(pieces)) - 1)
        prompts = [_MAP_PROMPT.format(words=max(4, int(per * 0.7)), text=p) for p in pieces]
        summaries = [s for s in _generate_texts(loaded, prompts, per, details) if s]
        joined = "\n".join(summaries)
        n = count_tokens(tokenizer, joined)
        if n <= budget or len(summaries) <= 1 or level >= 4:
            break
        # reduce: group summaries into pieces of about chunk_tokens and summarise again
        pieces, cur = [], ""
        for s in summaries:
            if cur and count_tokens(tokenizer, cur + "\n" + s) > chunk_tokens:
                pieces.append(cur)
                cur = s
            else:
                cur = f"{cur}\n{s}" if cur else s
        pieces.append(cur)
    details["summary_levels"] = level
    out = _clip(tokenizer, joined, budget)
    return out, count_tokens(tokenizer, out)


def _rolling_summary(segs, tokenizer, loaded, budget, chunk_tokens, recent_share, details):
    msgs = [{"role": s.role, "content": s.text} for s in segs]
    recent, used = [], 0
    for m in reversed(msgs):
        n = count_tokens(tokenizer, m["content"])
        if used + n > budget * recent_share:
            break
        recent.insert(0, m)
        used += n
    older = msgs[: len(msgs) - len(recent)]
    lang = _language("".join(m["content"] for m in msgs))
    prefix = _SUMMARY_PREFIX[lang]
    room = budget - used - count_tokens(tokenizer, prefix) - 1
    details["recent_turns"] = len(recent)
    if room < 8:
        details["note"] = "no room for a summary; recent turns only"
        out, n = _fit(lambda b: _truncate(_segments(tokenizer, recent or msgs), b, "tail", True), tokenizer, budget)
        return out, n
    groups, cur = [], ""
    for m in older:
        line = f"{m['role'].capitalize()}: {m['content']}"
        if cur and count_tokens(tokenizer, cur + "\n" + line) > chunk_tokens:
            groups.append(cur)
            cur = line
        else:
            cur = f"{cur}\n{line}" if cur else line
    if cur:
        groups.append(cur)
    summary = "(none yet)"
    for g in groups:
        prompt = _ROLL_PROMPT.format(summary=summary, turns=g, words=max(4, int(room * 0.7)))
        summary = _generate_texts(loaded, [prompt], room, details)[0] or summary
    content = prefix + _clip(tokenizer, summary, room)
    out = [{"role": "user", "content": content}] + recent
    while count_tokens(tokenizer, out) > budget and len(out) > 1:  # joins may add a token: drop the oldest recent turn
        out.pop(1)
    return out, count_tokens(tokenizer, out)


# ----------------------------------------------------------------------------- KV prefix reuse


def _cache_kwarg(model) -> str:
    """``cache`` on transformers versions that renamed ``past_key_values`` (5.x deprecates the old name)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prompt_ids(tokenizer, messages) -> list[int]:
    return encode_prompts(tokenizer, [messages], chat=True)["input_ids"][0].tolist()


def _prefix_ids(tokenizer, context, question) -> list[int]:
    """Token ids of the prompt up to the end of the context: the longest common prefix of the full
    prompt's ids and the ids of the prompt rendered without the question."""
    full = _prompt_ids(tokenizer, prompt_messages(context, question))
    if isinstance(context, list):
        head_text = tokenizer.apply_chat_template(context, tokenize=False)
    else:
        text = tokenizer.apply_chat_template(prompt_messages(context, question), add_generation_prompt=True,
                                             tokenize=False)
        head_text = text[: text.index(context) + len(context)]
    head = tokenizer(head_text, add_special_tokens=False)["input_ids"]
    n = 0
    while n < min(len(head), len(full) - 1) and head[n] == full[n]:
        n += 1
    return full[:n]


def build_prefix_cache(loaded, ids: list[int]):
    """Prefill ``ids`` once into a fresh ``DynamicCache`` and return it."""
    import torch
    from transformers import DynamicCache

    model = loaded.model
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids], device=model.device), use_cache=True, **{_cache_kwarg(model): cache})
    return cache


def _kv_reuse(context, question, loaded, common):
    check_fits(loaded, prompt_messages(context, question), 1, common["original_tokens"])
    ids = _prefix_ids(loaded.tokenizer, context, question)
    t0 = time.perf_counter()
    cache = build_prefix_cache(loaded, ids) if ids else None
    prefill_s = time.perf_counter() - t0
    details = {"cached_tokens": len(ids), "prefix_prefill_s": prefill_s}
    return CompressionResult(context=context, compressed_tokens=common["original_tokens"], compressor_s=0.0,
                             details=details, prefix_cache=cache, prefix_ids=ids, **common)


def generate_with_prefix_cache(loaded, messages, cache, prefix_ids, settings: GenerationSettings) -> dict:
    """Generate one answer reusing a prefix ``DynamicCache``; timed by :func:`generate_measured`.

    ``generate`` receives a ``copy.deepcopy`` of the cache and prefills only the
    tokens after the prefix. The copy is made before ``t_submit``: it stands in
    for a server's in-place prefix cache, which costs no copy, so it is not TTFT.

    Returns:
        The request record of :func:`workbench.generation.generate_measured`
        plus ``cached_tokens`` and ``prefilled_tokens``.

    Raises:
        ParameterError: the prompt does not start with the cached prefix.
    """
    full = _prompt_ids(loaded.tokenizer, messages)
    if full[: len(prefix_ids)] != list(prefix_ids) or len(prefix_ids) >= len(full):
        raise ParameterError("cache: the prompt does not extend the cached prefix; rebuild the cache")
    past = copy.deepcopy(cache)
    res = generate_measured(loaded, [messages], settings, generate_kwargs={_cache_kwarg(loaded.model): past})
    rec = res.records[0]
    rec["cached_tokens"] = len(prefix_ids)
    rec["prefilled_tokens"] = len(full) - len(prefix_ids)
    return rec


# ----------------------------------------------------------------------------- answering and quality


def check_fits(loaded, messages, max_new_tokens: int, context_tokens: int | None = None) -> int:
    """Count the templated prompt and check it fits the model's context with the answer.

    Returns:
        The prompt's token count.

    Raises:
        ParameterError: prompt + ``max_new_tokens`` exceeds the model's maximum
            context; the message names the smallest ratio that would fit.
    """
    n = len(_prompt_ids(loaded.tokenizer, messages))
    limit = loaded.info.max_context_tokens
    if n + max_new_tokens > limit:
        hint = ""
        if context_tokens:
            room = limit - max_new_tokens - (n - context_tokens)
            hint = f"; compress it (ratio >= {context_tokens / max(1, room):.1f})" if room > 0 else ""
        raise ParameterError(f"context: the prompt has {n} tokens, which with max_new_tokens={max_new_tokens} "
                             f"exceeds the model's maximum context of {limit} tokens{hint}")
    return n


def answer(loaded, result: CompressionResult, settings: GenerationSettings) -> dict:
    """Generate the answer for a compressed context (one measured request).

    Returns:
        A request record (see :func:`generate_measured`) with ``prefilled_tokens``
        (tokens the model prefilled for this request) and ``cached_tokens``.
    """
    msgs = result.messages()
    check_fits(loaded, msgs, settings.max_new_tokens, result.original_tokens)
    if result.prefix_cache is not None:
        return generate_with_prefix_cache(loaded, msgs, result.prefix_cache, result.prefix_ids, settings)
    rec = generate_measured(loaded, [msgs], settings, chat=True).records[0]
    rec["cached_tokens"] = 0
    rec["prefilled_tokens"] = rec["prompt_tokens"]
    return rec


def gold_logprob(loaded, messages, gold: str, cache=None, prefix_ids=None) -> dict:
    """Log-likelihood of the gold answer as the assistant's reply, in one forward pass.

    Args:
        loaded: the model.
        messages: the prompt (its chat template and generation prompt are applied).
        gold: the reference answer text.
        cache, prefix_ids: optional prefix cache (``kv_reuse``): only the tokens
            after the prefix are run, on a copy of the cache.

    Returns:
        ``gold_logprob`` (sum, nats), ``gold_tokens``, ``gold_logprob_per_token``.
    """
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = _prompt_ids(tokenizer, messages)
    target = tokenizer(gold, add_special_tokens=False)["input_ids"]
    ids = prompt + target
    start = 0
    kwargs = {}
    if cache is not None and prefix_ids and ids[: len(prefix_ids)] == list(prefix_ids):
        start = len(prefix_ids)
        kwargs = {_cache_kwarg(model): copy.deepcopy(cache), "use_cache": True}
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids[start:]], device=model.device), **kwargs).logits[0]
    # logits at position p (relative) predict ids[start + p + 1]
    first = len(prompt) - start - 1
    logp = torch.log_softmax(logits[first:first + len(target)].float(), dim=-1)
    lp = logp.gather(1, torch.tensor(target, device=logp.device)[:, None])[:, 0]
    total = float(lp.sum())
    return {"gold_logprob": total, "gold_tokens": len(target), "gold_logprob_per_token": total / max(1, len(target))}


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower().strip()
    return text.strip(" \t\n.,;:!?\"'`。，！？：；")


def answer_match(prediction: str, gold: str) -> dict:
    """``substring_match``: the normalised gold answer occurs in the prediction (digits and
    Latin words must not continue on either side); ``exact_match``: equal after normalising
    (NFKC, lower case, surrounding whitespace and punctuation removed). Values are 0.0 / 1.0."""
    p, g = _normalise(prediction), _normalise(gold)
    if not g:
        return {"substring_match": 0.0, "exact_match": float(p == g)}
    pattern = re.escape(g)
    if g[:1].isascii() and g[:1].isalnum():
        pattern = r"(?<![0-9a-z])" + pattern
    if g[-1:].isascii() and g[-1:].isalnum():
        pattern = pattern + r"(?![0-9a-z])"
    return {"substring_match": float(re.search(pattern, p) is not None), "exact_match": float(p == g)}


class _RougeTokenizer:
    """``rouge_score`` tokenizer that keeps CJK: Latin words and digit runs, and each CJK character."""

    def tokenize(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFKC", text).lower()
        return re.findall(r"[a-z0-9]+|[\u3400-\u9fff]", text)


@functools.lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_RougeTokenizer())


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 of ``prediction`` against ``reference`` (1.0 when both are empty)."""
    tok = _RougeTokenizer()
    if not tok.tokenize(prediction) and not tok.tokenize(reference):
        return 1.0
    return float(_rouge().score(reference, prediction)["rougeL"].fmeasure)


def evaluate(loaded, task, strategy: str, ratio: float, settings: GenerationSettings, reference: str | None = None,
             **options) -> dict:
    """Compress ``task``, answer it, and score the answer: one request row.

    Args:
        loaded: the model.
        task: :class:`workbench.tasks.Task`.
        strategy, ratio: see :func:`compress` (ratio ignored by lossless strategies).
        settings: generation settings of the answer.
        reference: the uncompressed run's answer text, for ``rouge_l`` (NaN when None).
        options: passed to :func:`compress`.

    Returns:
        The request record plus the result's columns, ``total_s`` (compressor +
        end-to-end), ``ttft_total_s`` (compressor + TTFT), the quality columns
        and the task's columns (``task_kind``, ``answer_gold``, ``depth`` ...).
    """
    kw = {} if strategy in LOSSLESS else {"ratio": ratio}
    result = compress(task.context, task.question, loaded.tokenizer, strategy, loaded=loaded, **kw, **options)
    rec = answer(loaded, result, settings)
    rec.update(result.to_record())
    rec["total_s"] = result.compressor_s + rec["e2e_s"]
    rec["ttft_total_s"] = result.compressor_s + rec["ttft_s"]
    rec.update(answer_match(rec["text"], task.answer))
    rec.update(gold_logprob(loaded, result.messages(), task.answer, result.prefix_cache, result.prefix_ids))
    rec["rouge_l"] = rouge_l(rec["text"], reference) if reference is not None else float("nan")
    rec.update(task_kind=task.kind, language=task.language, answer_gold=task.answer, depth=task.depth,
               needle_kept=float(task.needle in result.text))
    return rec


# ----------------------------------------------------------------------------- the sweep


def _sweeps():
    from . import sweeps

    return sweeps


try:  # the config subclasses the shared sweep base; the strategies above do not need it
    from .sweeps import SweepConfig as _SweepBase
except ImportError:  # pragma: no cover
    _SweepBase = object


@dataclasses.dataclass
class CompressionConfig(_SweepBase):
    """The context-compression sweep (notebook ``06_context_compression``).

    Attributes:
        strategies: strategies over the document task (from :data:`STRATEGIES`;
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
    """

    strategies: list = dataclasses.field(default_factory=lambda: ["none", "head_tail", "bm25", "dense", "prune"])
    ratios: list = dataclasses.field(default_factory=lambda: [2, 4])
    context_lengths: list = dataclasses.field(default_factory=lambda: [512, 1024])
    depths: list = dataclasses.field(default_factory=lambda: [0.1, 0.5, 0.9])
    task: str = "needle"
    language: str = "en"
    summary_lengths: list = dataclasses.field(default_factory=lambda: [512])
    chat_lengths: list = dataclasses.field(default_factory=lambda: [512, 1024])
    chat_strategies: list = dataclasses.field(default_factory=lambda: ["none", "kv_reuse", "tail", "bm25"])
    chunk_tokens: int = 64
    max_new_tokens: int = 16
    ignore_eos: bool = True
    temperature: float = 0.0

    def __post_init__(self):
        if _SweepBase is not object:
            super().__post_init__()
        for name in ("strategies", "chat_strategies"):
            values = getattr(self, name)
            if not isinstance(values, list) or (name == "strategies" and not values):
                raise ParameterError(f"{name}: must be a list of strategies (got {values!r})")
            for s in values:
                if s not in STRATEGIES:
                    raise ParameterError(f"{name}: unknown strategy {s!r} (known: {', '.join(STRATEGIES)})")
        if not isinstance(self.ratios, list) or not self.ratios:
            raise ParameterError(f"ratios: must be a non-empty list (got {self.ratios!r})")
        for r in self.ratios:
            check_ratio(r)
        self.settings()
        hi = 8192 - self.max_new_tokens - 64
        try:
            hi = self.max_context() - self.max_new_tokens - 64
        except Exception:  # noqa: BLE001 - validation without the model's config falls back to 8k
            pass
        for name in ("context_lengths", "summary_lengths", "chat_lengths"):
            values = getattr(self, name)
            if not isinstance(values, list) or (name == "context_lengths" and not values):
                raise ParameterError(f"{name}: must be a list of token counts (got {values!r})")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or not 64 <= v <= hi:
                    raise ParameterError(f"{name}: every value must be an integer in [64, {hi}] (got {v!r})")
        if not isinstance(self.depths, list) or not self.depths:
            raise ParameterError(f"depths: must be a non-empty list (got {self.depths!r})")
        for d in self.depths:
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1:
                raise ParameterError(f"depths: every value must be in [0, 1] (got {d!r})")
        if self.task not in ("needle", "multikey"):
            raise ParameterError(f"task: must be 'needle' or 'multikey' (got {self.task!r})")
        if self.language not in ("en", "zh"):
            raise ParameterError(f"language: must be 'en' or 'zh' (got {self.language!r})")
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 8:
            raise ParameterError(f"chunk_tokens: must be an integer >= 8 (got {self.chunk_tokens!r})")

    def settings(self, seed: int | None = None) -> GenerationSettings:
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                                  temperature=self.temperature, seed=self.seed if seed is None else seed)

    def grid(self) -> list[dict]:
        """Document points: lossless strategies once (ratio 1), others at every ratio; ``none`` first."""
        pts = []
        order = sorted(self.strategies, key=lambda s: s != "none")
        for s in order:
            if s == "summary":
                continue
            for r in ([1] if s in LOSSLESS else self.ratios):
                for n in self.context_lengths:
                    for d in self.depths:
                        pts.append({"strategy": s, "ratio": r, "context_tokens": n, "depth": d})
        if "summary" in self.strategies:
            mid = sorted(self.depths)[len(self.depths) // 2]
            for n in self.summary_lengths:
                pts.append({"strategy": "summary", "ratio": max(self.ratios), "context_tokens": n, "depth": mid})
        return pts

    def chat_grid(self) -> list[dict]:
        """Chat points (fact in the turn at depth 0.1): strategies x ratios x ``chat_lengths``."""
        pts = []
        for s in sorted(self.chat_strategies, key=lambda s: s != "none"):
            for r in ([1] if s in LOSSLESS else ([max(self.ratios)] if s == "summary" else self.ratios)):
                for n in self.chat_lengths:
                    pts.append({"strategy": s, "ratio": r, "context_tokens": n, "depth": 0.1})
        return pts


_REFERENCES: dict = {}
_QUALITY = ("substring_match", "exact_match", "gold_logprob", "gold_logprob_per_token", "rouge_l", "needle_kept")
_TIMES = ("compressor_s", "total_s", "ttft_total_s", "achieved_ratio", "compressed_tokens", "original_tokens",
          "prefilled_tokens")


def measure_point(loaded, cfg: CompressionConfig, point: dict, kind: str) -> dict:
    """Measure one point: ``cfg.repeats`` requests (compress + answer + score), the measure-dict of ``run_sweep``.

    The uncompressed answer of the same task (for ROUGE-L) is memoised: taken
    from the ``none`` point when it ran first, else generated once, untimed.
    """
    import statistics

    task = _task_for(loaded, cfg, point, kind)
    key = (task.key, cfg.max_new_tokens, cfg.ignore_eos, cfg.seed)
    reference = _REFERENCES.get(key)
    if reference is None and point["strategy"] != "none":
        reference = answer(loaded, compress(task.context, task.question, loaded.tokenizer), cfg.settings())["text"]
        _REFERENCES[key] = reference
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        rec = evaluate(loaded, task, point["strategy"], point["ratio"], cfg.settings(cfg.seed + r),
                       reference=reference, chunk_tokens=cfg.chunk_tokens)
        if point["strategy"] == "none" and r == 0:
            _REFERENCES[key] = rec["text"]
            rec["rouge_l"] = 1.0
        rec.update(repeat=r, batch_size=1)
        rec.pop("depth", None)  # the point's requested depth column wins; the measured one is kept below
        rec["fact_depth"] = task.depth
        requests.append(rec)
        wall += rec["total_s"]
    extra = {c: statistics.fmean(float(x[c]) for x in requests) for c in _QUALITY}
    extra.update({c: statistics.median(float(x[c]) for x in requests) for c in _TIMES})
    extra["task"] = kind
    return {"requests": requests, "wall_s": wall, "extra": extra}


def _task_for(loaded, cfg, point, kind):
    from . import tasks

    return tasks.make_task(kind, loaded.tokenizer, point["context_tokens"], point["depth"], seed=cfg.seed,
                           language=cfg.language)


def warm_up(loaded, cfg: CompressionConfig) -> float:
    """Untimed warm-up before a sweep: ``cfg.warmup`` short generations, a scoring pass, the embedder."""
    t0 = time.perf_counter()
    for _ in range(cfg.warmup):
        generate_measured(loaded, ["Say hello."], GenerationSettings(max_new_tokens=2))
        gold_logprob(loaded, [{"role": "user", "content": "Say hello."}], "Hello")
        if "dense" in cfg.strategies or "dense" in cfg.chat_strategies:
            _embedder().encode(["warm up"], show_progress_bar=False)
    return time.perf_counter() - t0


def run_compression_sweep(cfg: CompressionConfig, run_dir, loaded, resume: bool = False):
    """Run the document experiment (``compression``) and the chat experiment (``compression_chat``).

    Returns:
        ``(doc_points, chat_points)`` DataFrames (``chat_points`` empty when ``chat_lengths`` is []).
    """
    import pandas as pd

    sweeps = _sweeps()
    warm_up(loaded, cfg)
    doc = sweeps.run_sweep(run_dir, "compression", cfg.grid(), lambda p: measure_point(loaded, cfg, p, cfg.task),
                           resume=resume, info=loaded.info, config=cfg)
    chat = pd.DataFrame()
    if cfg.chat_lengths and cfg.chat_strategies:
        chat = sweeps.run_sweep(run_dir, "compression_chat", cfg.chat_grid(),
                                lambda p: measure_point(loaded, cfg, p, "chat"), resume=resume, info=loaded.info,
                                config=cfg)
    return doc, chat


# ----------------------------------------------------------------------------- analysis and figures


def _ok(points):
    return points[points["status"] == "ok"].copy() if "status" in points else points.copy()


def summarise(points):
    """Per (strategy, ratio, context_tokens): mean quality and median times over depths."""
    p = _ok(points)
    cols = [c for c in ("substring_match", "gold_logprob", "gold_logprob_per_token", "rouge_l", "needle_kept",
                        "achieved_ratio", "compressor_s", "ttft_s_p50", "ttft_total_s", "total_s") if c in p]
    return p.groupby(["strategy", "ratio", "context_tokens"], as_index=False)[cols].mean()


def break_even(points):
    """Context length at which each (strategy, ratio) starts to save time over ``none``.

    Answers have a fixed length (``ignore_eos``), so decode time cancels and the
    saving is prefill. Method, from the measured points: fit TTFT against
    prefilled tokens over all points of the experiment (``ttft = a + b * tokens``,
    least squares; pooling every point makes the per-token prefill cost ``b``
    robust to noise), fit each strategy's compressor time against context
    length (``c + d * L``), and solve ``c + d * L = b * L * (1 - 1 / ratio)``
    with the strategy's mean achieved ratio: ``L* = c / (b * (1 - 1/ratio) - d)``.
    ``inf`` when the compressor grows at least as fast as the prefill it saves,
    0 when it costs nothing. ``direct_tokens`` is the crossing of straight lines
    through the measured total times (``none`` vs the strategy), for comparison;
    ``measured`` says whether ``L*`` lies inside the measured lengths.

    Returns:
        DataFrame: strategy, ratio, achieved_ratio, prefill_s_per_token,
        compressor_s_per_token, break_even_tokens, measured, direct_tokens.
    """
    import numpy as np
    import pandas as pd

    cols = ["strategy", "ratio", "achieved_ratio", "prefill_s_per_token", "compressor_s_per_token",
            "break_even_tokens", "measured", "direct_tokens"]
    p = _ok(points)
    need = {"prefilled_tokens", "ttft_s_p50", "compressor_s", "achieved_ratio", "context_tokens"}
    if p.empty or not need <= set(p) or not (p["strategy"] == "none").any():
        return pd.DataFrame(columns=cols)

    def line(xs, ys):
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        if len(set(xs)) < 2:
            return float(np.mean(ys)), 0.0
        b, a = np.polyfit(xs, ys, 1)
        return float(a), float(b)

    _, per_token = line(p["prefilled_tokens"], p["ttft_s_p50"])
    s = summarise(p)
    base = s[s["strategy"] == "none"].set_index("context_tokens")["total_s"] if "total_s" in s else None
    rows = []
    for (strat, ratio), g in p[p["strategy"] != "none"].groupby(["strategy", "ratio"]):
        c, d = line(g["context_tokens"], g["compressor_s"])
        achieved = float(g["achieved_ratio"].mean())
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
                a1, b1 = line(gs["context_tokens"], gs["total_s"])
                direct = 0.0 if (a1 <= a0 and b1 <= b0) else (math.inf if b1 >= b0 else max(0.0, (a1 - a0) / (b0 - b1)))
        lengths = p["context_tokens"]
        rows.append({"strategy": strat, "ratio": ratio, "achieved_ratio": achieved, "prefill_s_per_token": per_token,
                     "compressor_s_per_token": d, "break_even_tokens": be,
                     "measured": bool(lengths.min() <= be <= lengths.max()), "direct_tokens": direct})
    return pd.DataFrame(rows, columns=cols)


def quality_at(points, ratio: float = 4):
    """Quality retained at a ratio, per strategy (all lengths and depths averaged), next to ``none``.

    Returns:
        DataFrame: strategy, substring_match, match_retained (share of ``none``'s),
        gold_logprob, delta_gold_logprob (vs ``none``), rouge_l, achieved_ratio.
    """
    p = _ok(points)
    base = p[p["strategy"] == "none"]
    sel = p[(p["ratio"] == ratio) | (p["strategy"].isin(LOSSLESS))]
    cols = [c for c in ("achieved_ratio", "substring_match", "gold_logprob", "rouge_l") if c in p]
    g = sel.groupby("strategy", as_index=False)[cols].mean()
    m0 = base["substring_match"].mean() if not base.empty else float("nan")
    l0 = base["gold_logprob"].mean() if not base.empty else float("nan")
    g["match_retained"] = g["substring_match"] / m0 if m0 else float("nan")
    g["delta_gold_logprob"] = g["gold_logprob"] - l0
    order = ["strategy", "achieved_ratio", "substring_match", "match_retained", "gold_logprob",
             "delta_gold_logprob", "rouge_l"]
    return g[[c for c in order if c in g]]


def best_strategy(points):
    """Per context length: the lossy or lossless strategy with the best answer match, ties broken by the
    higher gold log-likelihood, then the lower total time.

    Returns:
        DataFrame: context_tokens, strategy, ratio, substring_match, gold_logprob, total_s, none_total_s.
    """
    import pandas as pd

    s = summarise(points)
    rows = []
    for n, g in s.groupby("context_tokens"):
        g = g.sort_values(["substring_match", "gold_logprob", "total_s"], ascending=[False, False, True])
        top = g.iloc[0]
        none = g[g["strategy"] == "none"]["total_s"]
        rows.append({"context_tokens": int(n), "strategy": top["strategy"], "ratio": top["ratio"],
                     "substring_match": top["substring_match"], "gold_logprob": top["gold_logprob"],
                     "total_s": top["total_s"], "none_total_s": float(none.iloc[0]) if len(none) else None})
    return pd.DataFrame(rows)


def _table_figure(df, title: str):
    import plotly.graph_objects as go

    def fmt(v):
        if isinstance(v, float):
            return "never" if math.isinf(v) else f"{v:.3g}"
        return str(v)

    fig = go.Figure(go.Table(header={"values": list(df.columns)},
                             cells={"values": [[fmt(v) for v in df[c]] for c in df.columns]}))
    fig.update_layout(title=title)
    return fig


def figures(points, chat_points=None) -> dict:
    """The experiment's figures, by name, in report order.

    - ``quality_vs_ratio``: answer match, gold log-likelihood and ROUGE-L vs achieved ratio;
    - ``time_vs_ratio``: TTFT (model only), compressor + TTFT, and total time vs target ratio;
    - ``total_vs_length`` and ``break_even``: total time vs context length, and the fitted break-even;
    - ``depth_length_heatmap``: gold log-likelihood per needle depth x context length;
    - ``best_strategy``: the best strategy per context length;
    - ``chat``: the chat experiment (TTFT, prefilled tokens, match), when given.
    """
    import pandas as pd
    import plotly.express as px

    from . import plots  # noqa: F401  (registers the house template)

    figs = {}
    s = summarise(points)
    q = s.melt(id_vars=["strategy", "ratio", "context_tokens", "achieved_ratio"],
               value_vars=[c for c in ("substring_match", "gold_logprob", "rouge_l") if c in s],
               var_name="metric", value_name="value")
    q["metric"] = q["metric"].map({"substring_match": "answer match (share)", "gold_logprob": "gold log-lik (nats)",
                                   "rouge_l": "ROUGE-L vs uncompressed"})
    fig = px.line(q.sort_values("achieved_ratio"), x="achieved_ratio", y="value", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Answer quality vs achieved compression ratio")
    fig.update_yaxes(matches=None, title_text="")
    fig.update_xaxes(title_text="achieved ratio (x)")
    figs["quality_vs_ratio"] = fig

    t = s.melt(id_vars=["strategy", "ratio", "context_tokens"],
               value_vars=[c for c in ("ttft_s_p50", "ttft_total_s", "total_s") if c in s],
               var_name="metric", value_name="seconds")
    t["metric"] = t["metric"].map({"ttft_s_p50": "TTFT, model (s)", "ttft_total_s": "compressor + TTFT (s)",
                                   "total_s": "total: compressor + answer (s)"})
    fig = px.line(t.sort_values("ratio"), x="ratio", y="seconds", color="strategy", markers=True,
                  facet_row="metric", facet_col="context_tokens", title="Time vs target compression ratio")
    fig.update_yaxes(matches=None)
    fig.update_xaxes(title_text="target ratio (x)", type="log")
    figs["time_vs_ratio"] = fig

    s["label"] = s["strategy"] + " " + s["ratio"].map(lambda r: f"{r:g}x")
    fig = px.line(s.sort_values("context_tokens"), x="context_tokens", y="total_s", color="label", markers=True,
                  title="Total time (compressor + answer) vs context length",
                  labels={"context_tokens": "context length (tokens)", "total_s": "total time (s)"})
    figs["total_vs_length"] = fig
    be = break_even(points)
    figs["break_even"] = _table_figure(be, "Break-even context length (tokens): where compressor time is repaid by "
                                           "the prefill it saves (fits over all points)")

    h = _ok(points)
    h = h[(h["ratio"] == max(h["ratio"])) | (h["strategy"] == "none")]
    h = h.assign(depth_label=h["depth"].map(lambda d: f"{d:g}"), length_label=h["context_tokens"].astype(str))
    fig = px.density_heatmap(h, x="depth_label", y="length_label", z="gold_logprob", histfunc="avg",
                             facet_col="strategy", facet_col_wrap=4, text_auto=".2f",
                             title=f"Gold-answer log-likelihood (nats) by needle depth and context length "
                                   f"(ratio {max(h['ratio']):g}x)",
                             labels={"depth_label": "needle depth", "length_label": "context (tokens)"})
    figs["depth_length_heatmap"] = fig
    figs["best_strategy"] = _table_figure(best_strategy(points), "Best strategy per context length")

    if chat_points is not None and len(chat_points):
        c = _ok(chat_points)
        c["label"] = c["strategy"] + " " + c["ratio"].map(lambda r: f"{r:g}x")
        cm = c.melt(id_vars=["label", "context_tokens"],
                    value_vars=[v for v in ("ttft_total_s", "prefilled_tokens", "substring_match") if v in c],
                    var_name="metric", value_name="value")
        cm["metric"] = cm["metric"].map({"ttft_total_s": "compressor + TTFT (s)", "prefilled_tokens":
                                         "prefilled tokens", "substring_match": "answer match (share)"})
        fig = px.bar(cm, x="context_tokens", y="value", color="label", barmode="group", facet_row="metric",
                     title="Chat history: KV prefix reuse vs compression",
                     labels={"context_tokens": "history length (tokens)"})
        fig.update_yaxes(matches=None, title_text="")
        fig.update_xaxes(type="category")
        figs["chat"] = fig
    return figs


__all__ = [
    "STRATEGIES", "LOSSLESS", "CompressionResult", "Chunk", "compress", "count_tokens", "prompt_messages",
    "retrieval_chunks", "lexical_tokens", "build_prefix_cache", "generate_with_prefix_cache", "answer",
    "gold_logprob", "answer_match", "rouge_l", "evaluate", "CompressionConfig", "measure_point",
    "run_compression_sweep", "summarise", "break_even", "quality_at", "best_strategy", "figures", "check_ratio",
    "check_budget",
]

