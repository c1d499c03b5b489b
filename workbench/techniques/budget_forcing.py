"""Budget forcing: cap, extend and measure a model's thinking tokens.

Budget forcing after s1 (Muennighoff et al. 2025, "s1: Simple test-time
scaling"), built from ``transformers`` generation hooks, not a decode loop of
our own:

- :class:`BudgetForcingProcessor` (a ``LogitsProcessor``) follows each row
  through the phases ``pre`` (thinking not opened yet), ``think``, ``answer``
  and ``done``. It counts the tokens generated since the thinking-open
  delimiter; when the count reaches the budget ``B`` it forces the rest of the
  end-of-thinking delimiter's token sequence, one token per step (every other
  logit set to ``-inf``). Below a minimum budget it suppresses the delimiter's
  first token and EOS, and where the model's top choice was one of those it
  forces a continuation word ("Wait") instead. After the delimiter it forces a
  hand-off phrase ("\\nAnswer:") so the answer has a checkable form. EOS is not
  allowed inside thinking: a row that would stop there is made to close its
  thinking instead. Budget 0 means no thinking: the prompt carries an empty,
  closed thinking block and a native open token is banned.
- :class:`AnswerStoppingCriteria` (a ``StoppingCriteria``) ends a row when its
  answer line is complete (a newline after some text: a stop string) or when
  its answer allowance is spent (truncated). ``max_new_tokens`` is the budget
  plus the delimiters plus the answer allowance, so thinking never eats the
  answer's room.

Thinking formats (:func:`thinking_format`): **native** when the tokenizer's
vocabulary holds ``<think>`` and ``</think>`` (Qwen3 style; ``enable_thinking``
is passed to the chat template when the template reads it), **emulated**
otherwise (the default SmolLM2): the prompt asks for reasoning between the text
delimiters ``<think>`` ... ``</think>``, and the same machinery runs on their
token sequences (taken from the tokenizer). Delimiters are recognised on the
decoded text, not on one id sequence: `` </think>`` (whose first token is
``' </'``, not ``'</'``) or ``</`` + ``think>`` end thinking too. In the answer
phase an open delimiter is banned (any ids that would complete ``<think>``), so
an answer never re-opens reasoning; ``reopen_blocked`` counts the steps where
that ban overrode the model's top choice.

Per batch (:func:`generate_with_budget`) the records of
:func:`workbench.measure.generation.generate_measured` gain ``reasoning_budget``,
``min_budget``, ``answer_allowance``, ``thinking_mode``, ``thinking_tokens``,
``answer_tokens`` (they sum to ``output_tokens``), ``ttfat_s`` (time to first
answer token: the stamp of the first id after the thinking segment),
``answer_truncated``, ``forced_close`` (the budget ended the thinking), ``waits``
(continuations inserted), ``reopen_blocked`` (answer steps whose top choice would
have re-opened thinking), ``batch_size`` (requests in the ``generate`` call),
``thinking_text`` and ``answer_text``. Rows that the
stopping criterion ends are trimmed to the step it fired at (``generate`` pads
them afterwards; that padding is not output) and their timings recomputed with
:func:`workbench.stats.metrics.request_timing`.

The task set that the reasoning-budget experiment answers, and its scoring,
are in :mod:`workbench.inputs.reasoning`; the experiment (notebook
``05_reasoning_budget``) is :mod:`workbench.experiments.reasoning_budget`.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from workbench.checks import check_choice, check_int
from workbench.errors import ParameterError

PRE, THINK, ANSWER, DONE = "pre", "think", "answer", "done"
OPEN_TEXT, CLOSE_TEXT = "<think>", "</think>"
DEFAULT_WAIT = " Wait"
DEFAULT_HANDOFF = "\nAnswer:"
THINKING_MODES = ("auto", "native", "emulated")


# ----------------------------------------------------------------------------- budget spec


@dataclass(frozen=True)
class BudgetSpec:
    """How many thinking tokens a request may spend, and how much room its answer gets.

    Attributes:
        budget: maximum thinking tokens after the open delimiter, before the
            forced end-of-thinking delimiter (>= 0; 0 means no thinking).
        min_budget: minimum thinking tokens; earlier attempts to end thinking
            are replaced by ``wait`` (0 <= min_budget <= budget).
        answer_tokens: answer allowance: tokens after the end-of-thinking
            delimiter, hand-off phrase included (>= 1).
        max_new_tokens: optional explicit cap on generated ids; by default
            budget + delimiters + answer allowance. When given, the budget must
            leave the answer allowance: ``budget <= max_new_tokens - answer_tokens``.
        stop_at_newline: end a row when its answer line is complete.
        wait: the continuation text inserted below ``min_budget``.
        handoff: text forced right after the end-of-thinking delimiter ("" for none).

    Raises:
        ParameterError: a value out of range (one line, before any model loads).
    """

    budget: int = 64
    min_budget: int = 0
    answer_tokens: int = 24
    max_new_tokens: int | None = None
    stop_at_newline: bool = True
    wait: str = DEFAULT_WAIT
    handoff: str = DEFAULT_HANDOFF

    def __post_init__(self):
        check_budget(self.budget, self.min_budget, self.answer_tokens, self.max_new_tokens)
        if not isinstance(self.wait, str) or not self.wait.strip():
            raise ParameterError(f"wait: must be a non-empty string (got {self.wait!r})")
        if not isinstance(self.handoff, str):
            raise ParameterError(f"handoff: must be a string (got {self.handoff!r})")

    def total_new_tokens(self, fmt: "ThinkingFormat", opens_in_output: bool = False) -> int:
        """``max_new_tokens`` for ``generate``: the explicit cap, or budget + delimiter(s) + answer allowance."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        extra = len(fmt.open_ids) if opens_in_output else 0
        return self.budget + len(fmt.close_ids) + extra + self.answer_tokens


def check_budget(budget, min_budget=0, answer_tokens=24, max_new_tokens=None) -> None:
    """Validate a reasoning budget without a model.

    Raises:
        ParameterError: ``budget`` negative or not an integer; ``min_budget``
            outside ``[0, budget]``; ``answer_tokens`` < 1; ``budget`` above
            ``max_new_tokens - answer_tokens`` when ``max_new_tokens`` is given.
    """
    check_int("budget", budget, lo=0)
    check_int("min_budget", min_budget, lo=0, hi=budget)
    check_int("answer_tokens", answer_tokens, lo=1)
    if max_new_tokens is not None:
        check_int("max_new_tokens", max_new_tokens, lo=1)
        if budget > max_new_tokens - answer_tokens:
            raise ParameterError(
                f"budget: must be <= max_new_tokens - answer_tokens = {max_new_tokens - answer_tokens} "
                f"(max_new_tokens={max_new_tokens}) (got {budget!r})"
            )


# ----------------------------------------------------------------------------- thinking formats


def _synthetic_text(tok: int) -> str:
    """The stand-in text of an id without a tokenizer: one private-use character per id, so that text
    matching on a format given only as ids is exactly matching on those ids (ids up to 131,069; larger
    ids have no text)."""
    tok = int(tok)
    return chr(0xF0000 + tok) if 0 <= tok < 0x1FFFE else ""


@dataclass(frozen=True)
class ThinkingFormat:
    """The delimiters of one tokenizer's thinking segment, and the text each token id decodes to.

    Delimiters are matched on **decoded text**, not on exact id sequences: a model that writes
    `` </think>`` (a different first token, ``' </'``) or ``</`` + ``think>`` closes its thinking all the
    same. Formats built by hand from ids alone (tests) give each id a private-use character instead,
    which makes text matching the same as id matching.

    Attributes:
        mode: ``native`` (single vocabulary tokens) or ``emulated`` (text delimiters).
        open_ids, close_ids: the token ids the tokenizer gives for the open / end-of-thinking delimiter
            (what is forced; the canonical spelling).
        template_flag: the chat template reads ``enable_thinking``.
        texts: per token id, its text (``convert_tokens_to_string`` of the one token); empty for a
            format given only as ids.
        close_rests: for ``k`` characters of the end-of-thinking text already written, the ids that
            complete it (emulated: ``encode(close_text[k:])``; native: the ``</think>`` token whatever
            was written; ``close_ids[k:]`` for a format given as ids).
    """

    mode: str
    open_ids: tuple
    close_ids: tuple
    template_flag: bool = False
    texts: tuple = field(default=(), repr=False, compare=False)
    close_rests: tuple = field(default=(), repr=False, compare=False)
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def native(self) -> bool:
        return self.mode == "native"

    def text_of(self, tok: int) -> str:
        """The text one id decodes to."""
        tok = int(tok)
        if self.texts:
            return self.texts[tok] if 0 <= tok < len(self.texts) else ""
        return _synthetic_text(tok)

    @property
    def open_text(self) -> str:
        return OPEN_TEXT if self.texts else "".join(map(_synthetic_text, self.open_ids))

    @property
    def close_text(self) -> str:
        return CLOSE_TEXT if self.texts else "".join(map(_synthetic_text, self.close_ids))

    def close_rest(self, k: int) -> tuple:
        """Ids that complete the end-of-thinking text when its first ``k`` characters are written."""
        if self.close_rests:
            return self.close_rests[k]
        return tuple(self.close_ids[k:])

    def bans(self, vocab_size: int) -> "_BanTable":
        """The id sets that would write (or start) a delimiter, for a vocabulary of ``vocab_size`` logits."""
        if vocab_size not in self._tables:
            self._tables[vocab_size] = _BanTable(self, vocab_size)
        return self._tables[vocab_size]


class _BanTable:
    """Which ids complete a delimiter after a partial one, and which ids start an end of thinking.

    ``complete_open[k]`` / ``complete_close[k]``: ids whose text, appended to the first ``k`` characters
    of the delimiter, contains the whole delimiter (``k = 0``: ids that hold it outright).
    ``start_close``: ids whose text holds the start of the canonical end-of-thinking spelling
    (``'</'``, ``' </'``, ``'></'`` for the default tokenizer; the single ``</think>`` id when native).
    """

    def __init__(self, fmt: ThinkingFormat, vocab_size: int):
        texts = [fmt.text_of(i) for i in range(vocab_size)]
        self.complete_open = self._completing(texts, fmt.open_text)
        self.complete_close = self._completing(texts, fmt.close_text)
        first = fmt.text_of(fmt.close_ids[0]).strip() or fmt.close_text
        self.start_close = sorted({i for i, t in enumerate(texts) if first in t} | set(self.complete_close[0]))

    @staticmethod
    def _completing(texts: list, delim: str) -> list:
        last = delim[-1]
        cands = [i for i, t in enumerate(texts) if last in t]
        return [sorted(i for i in cands if delim in delim[:k] + texts[i]) for k in range(len(delim))]


_FORMATS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def native_thinking_ids(tokenizer) -> tuple[int, int] | None:
    """The ids of ``<think>`` and ``</think>`` when both are single tokens of the vocabulary, else None."""
    from workbench.measure.generation import token_id

    ids = token_id(tokenizer, OPEN_TEXT), token_id(tokenizer, CLOSE_TEXT)
    return ids if None not in ids else None


def token_texts(tokenizer) -> tuple:
    """The text of every id of a tokenizer, one token at a time (``convert_tokens_to_string``)."""
    toks = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return tuple(tokenizer.convert_tokens_to_string([t]) if t is not None else "" for t in toks)


def thinking_format(tokenizer, mode: str = "auto") -> ThinkingFormat:
    """Detect (``auto``) or choose the thinking format of a tokenizer.

    The format (with the text of every id, for delimiter matching) is built once per tokenizer
    object and kept while the tokenizer lives.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        mode: ``auto`` (native when the vocabulary has ``<think>``/``</think>``),
            ``native`` or ``emulated``.

    Raises:
        ParameterError: unknown mode, or ``native`` without thinking tokens.
    """
    check_choice("thinking", mode, THINKING_MODES)
    ids = native_thinking_ids(tokenizer)
    if mode == "native" and ids is None:
        raise ParameterError("thinking: 'native' needs <think> and </think> in the tokenizer's vocabulary")
    cache = _FORMATS.setdefault(tokenizer, {})
    key = (mode, len(tokenizer), getattr(tokenizer, "chat_template", None))
    if key in cache:
        return cache[key]
    template = getattr(tokenizer, "chat_template", None) or ""
    flag = isinstance(template, str) and "enable_thinking" in template
    texts = token_texts(tokenizer)
    rests = tuple(tuple(encode_text(tokenizer, CLOSE_TEXT[k:])) for k in range(len(CLOSE_TEXT)))
    if ids is not None and mode != "emulated":
        # native: the close is always the vocabulary token, even after a stray '<' in the thinking text
        fmt = ThinkingFormat("native", (ids[0],), (ids[1],), flag, texts, ((ids[1],),) * len(CLOSE_TEXT))
    else:
        fmt = ThinkingFormat("emulated", tuple(encode_text(tokenizer, OPEN_TEXT)), rests[0], False, texts, rests)
    cache[key] = fmt
    return fmt


def _partial(tail: str, delim: str) -> int:
    """Length of the longest proper prefix of ``delim`` that ``tail`` ends with."""
    for k in range(min(len(delim) - 1, len(tail)), 0, -1):
        if tail.endswith(delim[:k]):
            return k
    return 0


# ----------------------------------------------------------------------------- per-row state


class _Row:
    """One request's progress through pre -> think -> answer -> done, fed one generated id at a time.

    The row keeps the text of what it generated (each id's text, appended); a delimiter is seen when
    its text appears, whichever ids spelled it.
    """

    def __init__(self, phase: str, fmt: ThinkingFormat, eos_ids: set, handoff_ids: Sequence):
        self.phase = phase
        self.fmt = fmt
        self.eos_ids = eos_ids
        self.handoff_ids = list(handoff_ids)
        self.gen: list[int] = []
        self.text = ""
        self.seg_from = 0  # character where the current segment (thinking, or answer) starts
        self.body = 0  # thinking tokens since the open delimiter (excl. forced close tokens)
        self.closing = False
        self.forced_close = False
        self.waits = 0
        self.reopen_blocked = 0  # answer steps whose top choice would have re-opened thinking
        self.queue: deque = deque()
        self.close_end: int | None = None  # len(gen) when the end-of-thinking delimiter completed
        self.answer_from: int | None = None  # len(gen) when the hand-off phrase completed
        self.stopped_at: int | None = None  # len(gen) when the stopping criterion ended the row
        self.stop_reason: str | None = None
        self.opened = phase == THINK
        if phase == ANSWER:
            self._enter_answer()

    def _enter_answer(self):
        self.phase = ANSWER
        self.close_end = len(self.gen)
        self.seg_from = len(self.text)
        self.queue = deque(self.handoff_ids)
        if not self.queue:
            self.answer_from = len(self.gen)

    def _found(self, delim: str, new_from: int) -> bool:
        """Whether ``delim`` occurs in the current segment, ending in the text added from ``new_from``."""
        return self.text.find(delim, max(self.seg_from, new_from - len(delim) + 1)) >= 0

    def tail(self, delim: str) -> int:
        """How many leading characters of ``delim`` the current segment ends with (a partial delimiter)."""
        return _partial(self.text[max(self.seg_from, len(self.text) - len(delim)):], delim)

    def feed(self, tok: int) -> None:
        if self.phase == DONE or self.stopped_at is not None:
            return
        self.gen.append(tok)
        if tok in self.eos_ids:
            self.phase = DONE
            return
        new_from = len(self.text)
        self.text += self.fmt.text_of(tok)
        if self.queue and self.queue[0] == tok:
            self.queue.popleft()
        elif self.queue:  # a sampled id broke a forced sequence (cannot happen under -inf masking)
            self.queue.clear()
        if self.phase == PRE:
            if self._found(self.fmt.open_text, new_from):
                self.phase, self.opened = THINK, True
                self.seg_from = len(self.text)
        elif self.phase == THINK:
            if not self.closing:
                self.body += 1
            if self._found(self.fmt.close_text, new_from):
                self._enter_answer()
        elif self.phase == ANSWER and self.answer_from is None and not self.queue:
            self.answer_from = len(self.gen)

    def answer_count(self) -> int:
        return 0 if self.close_end is None else len(self.gen) - self.close_end


class BudgetForcingProcessor:
    """A ``transformers`` ``LogitsProcessor`` that enforces a thinking budget per row.

    Delimiters are recognised on the rows' decoded text (see :class:`ThinkingFormat`). In the answer
    phase every id that would complete an open delimiter (``<think>``, however spelled) is banned, so
    an answer never re-opens thinking; ``reopen_blocked`` counts the steps where that ban changed the
    model's top choice. Below ``min_budget`` every id that would start or complete the end of thinking
    is banned (and, where it was the top choice, "Wait" is forced instead).

    Args:
        fmt: the :class:`ThinkingFormat`.
        spec: the :class:`BudgetSpec` (budget, min_budget, ...).
        wait_ids: token ids of ``spec.wait``.
        handoff_ids: token ids of ``spec.handoff`` (may be empty).
        eos_ids: ids that end a row.
        initial_phases: per row, ``pre``, ``think`` or ``answer``: where its prompt leaves it.

    ``__call__(input_ids, scores)``: ``input_ids`` (batch, prompt_len + steps),
    ``scores`` (batch, vocab) float; returns the scores with forced rows
    masked to one finite logit. The first call fixes the prompt length.
    """

    def __init__(self, fmt: ThinkingFormat, spec: BudgetSpec, wait_ids, handoff_ids, eos_ids, initial_phases):
        self.fmt = fmt
        self.spec = spec
        self.wait_ids = list(wait_ids)
        self.eos_ids = set(int(e) for e in eos_ids)
        self.rows = [_Row(p, fmt, self.eos_ids, handoff_ids) for p in initial_phases]
        self.prompt_len: int | None = None
        if not self.wait_ids:
            raise ParameterError("wait: encodes to no tokens")

    def sync(self, input_ids) -> None:
        """Feed the rows every id generated since the last call (the first call fixes the prompt length)."""
        if self.prompt_len is None:
            self.prompt_len, self._fed = int(input_ids.shape[1]), 0
            return
        steps = int(input_ids.shape[1]) - self.prompt_len
        if steps <= self._fed:
            return
        new = input_ids[:, self.prompt_len + self._fed:].tolist()
        for row, toks in zip(self.rows, new):
            for tok in toks:
                row.feed(int(tok))
        self._fed = steps

    @staticmethod
    def _force(scores, r: int, tok: int) -> None:
        scores[r, :] = float("-inf")
        scores[r, tok] = 0.0

    def _close_now(self, row: _Row) -> None:
        """Queue the rest of the end-of-thinking delimiter (completing a partial one already written)."""
        row.queue = deque(self.fmt.close_rest(row.tail(self.fmt.close_text)))
        row.closing = True

    def __call__(self, input_ids, scores):
        self.sync(input_ids)
        spec, fmt = self.spec, self.fmt
        bans = fmt.bans(int(scores.shape[1]))
        ninf = float("-inf")
        top = scores.argmax(dim=-1).tolist()
        for r, row in enumerate(self.rows):
            if row.phase == DONE or row.stopped_at is not None:
                continue
            if row.phase == THINK and not row.closing and row.body >= spec.budget:
                self._close_now(row)
                row.forced_close = True
            if row.queue:
                self._force(scores, r, row.queue[0])
                continue
            if row.phase == PRE:
                if spec.budget == 0:
                    banned = bans.complete_open[row.tail(fmt.open_text)]
                    if banned:
                        scores[r, banned] = ninf
            elif row.phase == ANSWER:
                banned = bans.complete_open[row.tail(fmt.open_text)]
                if banned:
                    row.reopen_blocked += top[r] in set(banned)
                    scores[r, banned] = ninf
            elif row.phase == THINK:
                if row.body < spec.min_budget:
                    ending = set(bans.start_close) | set(bans.complete_close[row.tail(fmt.close_text)]) | self.eos_ids
                    if top[r] in ending:
                        row.queue = deque(self.wait_ids)
                        row.waits += 1
                        self._force(scores, r, row.queue[0])
                        continue
                    scores[r, sorted(ending)] = ninf
                elif top[r] in self.eos_ids:  # the model would stop inside thinking: close it instead
                    self._close_now(row)
                    self._force(scores, r, row.queue[0])
                else:
                    for e in self.eos_ids:
                        scores[r, e] = ninf
        return scores


class AnswerStoppingCriteria:
    """A ``transformers`` ``StoppingCriteria``: ends a row whose answer is complete or out of room.

    A row stops when, after its hand-off phrase, the answer text holds a
    newline after some non-space text (``stop_at_newline``; reason ``stop``),
    or when it has generated ``answer_tokens`` tokens after the end-of-thinking
    delimiter (reason ``length``). Returns a bool tensor of shape (batch,).
    """

    def __init__(self, processor: BudgetForcingProcessor, tokenizer, answer_tokens: int, stop_at_newline: bool = True):
        self.processor = processor
        self.tokenizer = tokenizer
        self.answer_tokens = answer_tokens
        self.stop_at_newline = stop_at_newline

    def __call__(self, input_ids, scores=None, **kwargs):
        import torch

        self.processor.sync(input_ids)
        out = []
        for row in self.processor.rows:
            if row.stopped_at is None and row.phase == ANSWER:
                if row.answer_from is not None and self.stop_at_newline:
                    text = self.tokenizer.decode(row.gen[row.answer_from:], skip_special_tokens=True)
                    if "\n" in text.lstrip():
                        row.stopped_at, row.stop_reason = len(row.gen), "stop"
                if row.stopped_at is None and row.answer_count() >= self.answer_tokens:
                    row.stopped_at, row.stop_reason = len(row.gen), "length"
            out.append(row.phase == DONE or row.stopped_at is not None)
        return torch.tensor(out, dtype=torch.bool, device=input_ids.device)


def replay_thinking(output_ids: Sequence[int], fmt: ThinkingFormat, initial_phase: str, eos_ids=()) -> tuple[int, bool]:
    """(thinking length, whether the thinking segment was closed) of one output."""
    if initial_phase == ANSWER:
        return 0, True
    row = _Row(initial_phase, fmt, set(eos_ids), ())
    for tok in output_ids:
        row.feed(int(tok))
        if row.close_end is not None:
            return row.close_end, True
    return (len(output_ids), False) if row.opened else (0, False)


def split_thinking(output_ids: Sequence[int], fmt: ThinkingFormat, initial_phase: str, eos_ids=()) -> int:
    """Number of leading output ids that belong to the thinking segment.

    The thinking segment runs up to and including the end-of-thinking
    delimiter; when the output never closes an opened thinking segment it is
    all thinking; when the prompt already closed it, or thinking never opened,
    it is empty. Delimiters are matched on the decoded text, as in :class:`BudgetForcingProcessor`.

    Args:
        output_ids: one request's generated ids.
        fmt: the :class:`ThinkingFormat`.
        initial_phase: where the prompt left the request (``pre``/``think``/``answer``).
        eos_ids: ids that end generation.
    """
    return replay_thinking(output_ids, fmt, initial_phase, eos_ids)[0]
