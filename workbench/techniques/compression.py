"""Context compression strategies: shrink a long input before prefill.

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
  or both halves (middle replaced by ``\\n...\\n``), cut between words.
- ``bm25`` / ``dense``: retrieval top-k. The context is split into chunks of
  at most ``chunk_tokens`` tokens, cut at sentence or paragraph ends (whole
  sentences packed together), a sentence longer than a chunk cut between
  words, never inside a word or number (:func:`cut_rank`); a chunk's own
  tokenisation is never longer than the chunk size and never crosses a message;
  ranked by BM25+ (Lv & Zhai 2011, "Lower-bounding term frequency
  normalization"; ``rank_bm25.BM25Plus``, IDF ``log((N + 1) / n)``) or by
  cosine similarity of all-MiniLM-L6-v2 embeddings (``sentence-transformers``,
  the shipped folder :func:`workbench.measure.models.default_embedder_path`) against
  the question, and the best chunks that fit the budget are kept in their
  original order. BM25+ rather than Okapi BM25: Okapi's IDF
  ``log((N - n + 0.5) / (n + 0.5))`` is 0 for a term in half the chunks, so
  with two chunks every score is 0. When every chunk scores the same the
  ranking carries nothing; the strategy then keeps chunks from the start
  (head truncation) and says so: ``details["retrieval_fallback"]`` is
  ``"head"`` (``"none"`` when the ranking decided).
- ``summary``: for a chat history, a rolling summary (older turns folded into
  a running summary one group at a time, recent turns verbatim); for a
  document, a hierarchical map-reduce summary (chunks summarised as one batch,
  then summaries of summaries until the result fits). Summaries are generated
  by the target model through :func:`workbench.measure.generation.generate_measured`.
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

Using a result: :func:`workbench.techniques.answering.answer` generates the answer to a compressed prompt
(one measured request, through the prefix cache for ``kv_reuse``) and
:func:`workbench.techniques.answering.gold_logprob` scores the gold answer's log-likelihood under it
(:func:`workbench.measure.quality.continuation_logprobs`, from the cache for
``kv_reuse``). Answer metrics live in :mod:`workbench.measure.quality`; the experiment
that sweeps these strategies (notebook 06) is
:mod:`workbench.experiments.context_compression`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from workbench.checks import check_choice, check_float, check_int
from workbench.errors import ParameterError
from workbench.measure import quality
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.techniques.answering import build_prefix_cache, check_fits, prompt_ids
from workbench.techniques.retrieval import (
    bm25_scores,
    dense_scores,
    embedder,
    lexical_tokens,
    retrieve,
    sentence_scores,
)
from workbench.techniques.segments import (
    Chunk,
    Segment,
    count_tokens,
    cut_chunks,
    cut_rank,
    fit,
    render,
    segments,
    unit_ranks,
)

STRATEGIES = ("none", "head", "tail", "head_tail", "bm25", "dense", "summary", "prune", "kv_reuse")
LOSSLESS = ("none", "kv_reuse")
NEEDS_MODEL = ("summary", "prune", "kv_reuse")

_GAP = "\n...\n"  # marks removed middle text (truncation)
_SUMMARY_PREFIX = {"en": "Summary of the earlier conversation: ", "zh": "之前对话的摘要："}


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


def _language(text: str) -> str:
    return "zh" if any(quality.is_cjk(c) for c in text) else "en"


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
    return check_float("ratio", ratio, 1)


def check_budget(budget) -> int:
    """Validate a token budget: an integer >= 1.

    Raises:
        ParameterError: anything else.
    """
    return check_int("budget", budget, 1)


def check_strategy(strategy) -> str:
    """Validate a strategy name (one of :data:`STRATEGIES`)."""
    return check_choice("strategy", strategy, STRATEGIES)


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
        loaded: :class:`workbench.measure.models.LoadedModel`, needed by ``summary``,
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
    check_int("chunk_tokens", chunk_tokens, 8)
    if top_k is not None:
        check_int("top_k", top_k, 1)
    check_int("summary_chunk_tokens", summary_chunk_tokens, 32)
    check_float("recent_share", recent_share, 0, 1)
    check_int("window", window, 16)
    if strategy == "dense":
        embedder()  # load once, outside the timed region

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
    segs = segments(tokenizer, context)
    as_chat = isinstance(context, list)
    details: dict = {}
    if strategy in ("head", "tail", "head_tail"):
        out, n = fit(lambda b: _truncate(segs, b, strategy, as_chat), tokenizer, budget)
    elif strategy in ("bm25", "dense"):
        size = min(chunk_tokens, max(8, budget // 2))  # at least two chunks fit the budget
        chunks = cut_chunks(segs, tokenizer, size)
        details["chunk_tokens"] = size
        scores = bm25_scores(chunks, question) if strategy == "bm25" else dense_scores(chunks, question)
        scores = sentence_scores(chunks, scores)
        tied = max(scores) - min(scores) <= 1e-9 * max(1.0, abs(max(scores)))
        details["retrieval_fallback"] = "head" if tied else "none"  # all tied: document order, recorded
        if tied:
            scores = [0.0] * len(chunks)
        out, n = fit(lambda b: retrieve(segs, chunks, scores, b, top_k, as_chat, details), tokenizer, budget)
        details["chunks"] = len(chunks)
    elif strategy == "prune":
        info = [_self_information(loaded, [i for u in s.units for i in u], window) for s in segs]
        words = _words(segs, info)
        out, n = fit(lambda b: _prune(segs, words, b, as_chat), tokenizer, budget)
        details["words"] = len(words)
    else:  # summary
        if as_chat:
            out, n = _rolling_summary(segs, tokenizer, loaded, budget, summary_chunk_tokens, recent_share, details)
        else:
            out, n = _map_reduce_summary(segs, tokenizer, loaded, budget, summary_chunk_tokens, details)
    return CompressionResult(context=out, compressed_tokens=n, compressor_s=time.perf_counter() - t0,
                             details=details, **common)


# ----------------------------------------------------------------------------- truncation


def _truncate(segs: list[Segment], b: int, mode: str, as_chat: bool):
    """Keep the head, the tail or both within ``b`` tokens; a cut backs off to the nearest boundary between words
    (:func:`cut_rank`), so the kept text never ends inside a word or number (unless one word exceeds the budget)."""
    flat = [(si, ui, len(u)) for si, s in enumerate(segs) for ui, u in enumerate(s.units)]
    keep = [[False] * len(s.units) for s in segs]
    ranks = [unit_ranks(s) for s in segs]

    def take(order, limit, forward):
        used, taken, cut = 0, [], False
        for si, ui, n in order:
            if used + n > limit:
                cut = True
                break
            taken.append((si, ui))
            used += n
        k = len(taken)
        while cut and k and ranks[taken[k - 1][0]][taken[k - 1][1] + (1 if forward else 0)] == 0:
            k -= 1
        for si, ui in taken[:k] if k else taken:
            keep[si][ui] = True

    if mode == "head":
        take(flat, b, True)
    elif mode == "tail":
        take(reversed(flat), b, False)
    else:
        take(flat, b // 2, True)
        take(reversed(flat), b - b // 2, False)
    return render(segs, keep, _GAP, as_chat)


# ----------------------------------------------------------------------------- retrieval


def retrieval_chunks(context, tokenizer, chunk_tokens: int = 64) -> list[Chunk]:
    """The chunks ``bm25``/``dense`` rank (public for inspection and tests)."""
    _check_context(context)
    return cut_chunks(segments(tokenizer, context), tokenizer, chunk_tokens)


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


def _words(segs: list[Segment], info: list[list[float]]) -> list[tuple[int, list[int], int, float]]:
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
    return render(segs, keep, "", as_chat)


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
    segs = segments(tokenizer, text)
    out, _ = fit(lambda b: _truncate(segs, b, "head", False), tokenizer, budget)
    return out


_MAP_PROMPT = ("Summarise the following text in at most {words} words. Keep every number, name and key fact. "
               "Write in the language of the text.\n\nText:\n{text}")
_ROLL_PROMPT = ("Here is a summary of a conversation so far:\n{summary}\n\nHere are the next turns:\n{turns}\n\n"
                "Write an updated summary of the whole conversation in at most {words} words. "
                "Keep every number, name and fact the user gave.")


def _map_reduce_summary(segs, tokenizer, loaded, budget, chunk_tokens, details):
    pieces = [c.text for c in cut_chunks(segs, tokenizer, chunk_tokens)]
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
        out, n = fit(lambda b: _truncate(segments(tokenizer, recent or msgs), b, "tail", True), tokenizer, budget)
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


def _prefix_ids(tokenizer, context, question) -> list[int]:
    """Token ids of the prompt up to the end of the context: the longest common prefix of the full
    prompt's ids and the ids of the prompt rendered without the question."""
    full = prompt_ids(tokenizer, prompt_messages(context, question))
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


def _kv_reuse(context, question, loaded, common):
    check_fits(loaded, prompt_messages(context, question), 1, common["original_tokens"])
    ids = _prefix_ids(loaded.tokenizer, context, question)
    t0 = time.perf_counter()
    cache = build_prefix_cache(loaded, ids) if ids else None
    prefill_s = time.perf_counter() - t0
    details = {"cached_tokens": len(ids), "prefix_prefill_s": prefill_s}
    return CompressionResult(context=context, compressed_tokens=common["original_tokens"], compressor_s=0.0,
                             details=details, prefix_cache=cache, prefix_ids=ids, **common)


__all__ = [
    "STRATEGIES", "LOSSLESS", "NEEDS_MODEL", "CompressionResult", "Chunk", "compress", "count_tokens",
    "prompt_messages", "retrieval_chunks", "lexical_tokens", "cut_rank", "embedder", "check_ratio", "check_budget",
    "check_strategy",
]
