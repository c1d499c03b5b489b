"""Reasoning budget: cap, extend and measure a model's thinking tokens.

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
token sequences (taken from the tokenizer). Delimiters are matched on token ids,
the exact sequence the tokenizer gives for the delimiter text.

Per request (:func:`run_reasoning_batch`) the records of
:func:`workbench.generation.generate_measured` gain ``thinking_tokens``,
``answer_tokens`` (they sum to ``output_tokens``), ``ttfat_s`` (time to first
answer token: ``ttft_s + sum(itl_s[:thinking_tokens])``), ``answer_truncated``,
``forced_close`` (the budget ended the thinking), ``waits`` (continuations
inserted), the extracted ``prediction``, ``exact_match`` and ``gold_logprob``:
the log-likelihood (nats) of the gold answer's tokens given the question, the
thinking and the hand-off phrase, from one forward pass of the model. Rows that
the stopping criterion ends are trimmed to the step it fired at (``generate``
pads them afterwards; that padding is not output).

Tasks (:func:`make_tasks`) are generated offline from a seed: multi-step
arithmetic word problems, counting questions and ordering (logic) questions,
in English and Chinese, each with one exact answer.

The notebook ``05_reasoning_budget`` sweeps budget x batch size with
:func:`run_reasoning_sweep`; figure functions are at the end of this module.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from . import sweeps
from .errors import ParameterError

PRE, THINK, ANSWER, DONE = "pre", "think", "answer", "done"
OPEN_TEXT, CLOSE_TEXT = "<think>", "</think>"
DEFAULT_WAIT = " Wait"
DEFAULT_HANDOFF = "\nAnswer:"
THINKING_MODES = ("auto", "native", "emulated")
LANGUAGES = ("en", "zh")
TASK_KINDS = ("arithmetic", "counting", "logic")


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


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_budget(budget, min_budget=0, answer_tokens=24, max_new_tokens=None) -> None:
    """Validate a reasoning budget without a model.

    Raises:
        ParameterError: ``budget`` negative or not an integer; ``min_budget``
            outside ``[0, budget]``; ``answer_tokens`` < 1; ``budget`` above
            ``max_new_tokens - answer_tokens`` when ``max_new_tokens`` is given.
    """
    if not _is_int(budget) or budget < 0:
        raise ParameterError(f"budget: must be an integer >= 0 (got {budget!r})")
    if not _is_int(min_budget) or min_budget < 0:
        raise ParameterError(f"min_budget: must be an integer >= 0 (got {min_budget!r})")
    if min_budget > budget:
        raise ParameterError(f"min_budget: must be <= budget={budget} (got {min_budget!r})")
    if not _is_int(answer_tokens) or answer_tokens < 1:
        raise ParameterError(f"answer_tokens: must be an integer >= 1 (got {answer_tokens!r})")
    if max_new_tokens is not None:
        if not _is_int(max_new_tokens) or max_new_tokens < 1:
            raise ParameterError(f"max_new_tokens: must be an integer >= 1 (got {max_new_tokens!r})")
        if budget > max_new_tokens - answer_tokens:
            raise ParameterError(
                f"budget: must be <= max_new_tokens - answer_tokens = {max_new_tokens - answer_tokens} "
                f"(max_new_tokens={max_new_tokens}) (got {budget!r})"
            )


# ----------------------------------------------------------------------------- thinking formats


@dataclass(frozen=True)
class ThinkingFormat:
    """The delimiters of one tokenizer's thinking segment, as token id sequences.

    Attributes:
        mode: ``native`` (single vocabulary tokens) or ``emulated`` (text delimiters).
        open_ids, close_ids: token ids of the open / end-of-thinking delimiter.
        template_flag: the chat template reads ``enable_thinking``.
    """

    mode: str
    open_ids: tuple
    close_ids: tuple
    template_flag: bool = False

    @property
    def native(self) -> bool:
        return self.mode == "native"


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def native_thinking_ids(tokenizer) -> tuple[int, int] | None:
    """The ids of ``<think>`` and ``</think>`` when both are single tokens of the vocabulary, else None."""
    vocab = tokenizer.get_vocab()
    if OPEN_TEXT in vocab and CLOSE_TEXT in vocab:
        return int(vocab[OPEN_TEXT]), int(vocab[CLOSE_TEXT])
    return None


def thinking_format(tokenizer, mode: str = "auto") -> ThinkingFormat:
    """Detect (``auto``) or choose the thinking format of a tokenizer.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        mode: ``auto`` (native when the vocabulary has ``<think>``/``</think>``),
            ``native`` or ``emulated``.

    Raises:
        ParameterError: unknown mode, or ``native`` without thinking tokens.
    """
    if mode not in THINKING_MODES:
        raise ParameterError(f"thinking: must be one of {', '.join(THINKING_MODES)} (got {mode!r})")
    ids = native_thinking_ids(tokenizer)
    if mode == "native" and ids is None:
        raise ParameterError("thinking: 'native' needs <think> and </think> in the tokenizer's vocabulary")
    template = getattr(tokenizer, "chat_template", None) or ""
    flag = isinstance(template, str) and "enable_thinking" in template
    if ids is not None and mode != "emulated":
        return ThinkingFormat("native", (ids[0],), (ids[1],), flag)
    return ThinkingFormat("emulated", tuple(_encode(tokenizer, OPEN_TEXT)), tuple(_encode(tokenizer, CLOSE_TEXT)), False)


def _ends_with(seq: list, suffix: Sequence) -> bool:
    n = len(suffix)
    return n > 0 and len(seq) >= n and tuple(seq[-n:]) == tuple(suffix)


def _partial_close(seq: list, close: Sequence) -> int:
    """Length of the longest proper prefix of ``close`` that ``seq`` ends with."""
    for k in range(len(close) - 1, 0, -1):
        if _ends_with(seq, close[:k]):
            return k
    return 0


# ----------------------------------------------------------------------------- per-row state


class _Row:
    """One request's progress through pre -> think -> answer -> done, fed one generated id at a time."""

    def __init__(self, phase: str, fmt: ThinkingFormat, eos_ids: set, handoff_ids: Sequence):
        self.phase = phase
        self.fmt = fmt
        self.eos_ids = eos_ids
        self.handoff_ids = list(handoff_ids)
        self.gen: list[int] = []
        self.body = 0  # thinking tokens since the open delimiter (excl. forced close tokens)
        self.closing = False
        self.forced_close = False
        self.waits = 0
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
        self.queue = deque(self.handoff_ids)
        if not self.queue:
            self.answer_from = len(self.gen)

    def feed(self, tok: int) -> None:
        if self.phase == DONE or self.stopped_at is not None:
            return
        self.gen.append(tok)
        if tok in self.eos_ids:
            self.phase = DONE
            return
        if self.queue and self.queue[0] == tok:
            self.queue.popleft()
        elif self.queue:  # a sampled id broke a forced sequence (cannot happen under -inf masking)
            self.queue.clear()
        if self.phase == PRE:
            if _ends_with(self.gen, self.fmt.open_ids):
                self.phase, self.opened = THINK, True
        elif self.phase == THINK:
            if not self.closing:
                self.body += 1
            if _ends_with(self.gen, self.fmt.close_ids):
                self._enter_answer()
        elif self.phase == ANSWER and self.answer_from is None and not self.queue:
            self.answer_from = len(self.gen)

    def answer_count(self) -> int:
        return 0 if self.close_end is None else len(self.gen) - self.close_end


class BudgetForcingProcessor:
    """A ``transformers`` ``LogitsProcessor`` that enforces a thinking budget per row.

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

    def __call__(self, input_ids, scores):
        self.sync(input_ids)
        spec, fmt = self.spec, self.fmt
        ninf = float("-inf")
        top = scores.argmax(dim=-1).tolist()
        for r, row in enumerate(self.rows):
            if row.phase == DONE or row.stopped_at is not None:
                continue
            if row.phase == THINK and not row.closing and row.body >= spec.budget:
                k = _partial_close(row.gen, fmt.close_ids)
                row.queue = deque(fmt.close_ids[k:])
                row.closing = row.forced_close = True
            if row.queue:
                self._force(scores, r, row.queue[0])
                continue
            if row.phase == PRE:
                if spec.budget == 0 and fmt.native:
                    scores[r, fmt.open_ids[0]] = ninf
            elif row.phase == THINK:
                wants_end = top[r] in self.eos_ids or top[r] == fmt.close_ids[0]
                if row.body < spec.min_budget:
                    if wants_end:
                        row.queue = deque(self.wait_ids)
                        row.waits += 1
                        self._force(scores, r, row.queue[0])
                        continue
                    scores[r, fmt.close_ids[0]] = ninf
                    for e in self.eos_ids:
                        scores[r, e] = ninf
                elif top[r] in self.eos_ids:  # the model would stop inside thinking: close it instead
                    k = _partial_close(row.gen, fmt.close_ids)
                    row.queue = deque(fmt.close_ids[k:])
                    row.closing = True
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


def _replay(output_ids: Sequence[int], fmt: ThinkingFormat, initial_phase: str, eos_ids=()) -> tuple[int, bool]:
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
    it is empty. Matching is on token ids, as in :class:`BudgetForcingProcessor`.

    Args:
        output_ids: one request's generated ids.
        fmt: the :class:`ThinkingFormat`.
        initial_phase: where the prompt left the request (``pre``/``think``/``answer``).
        eos_ids: ids that end generation.
    """
    return _replay(output_ids, fmt, initial_phase, eos_ids)[0]


# ----------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Task:
    """One question with one exact answer.

    Attributes:
        task_id: ``<kind>-<language>-<index>``.
        kind: ``arithmetic``, ``counting`` or ``logic``.
        language: ``en`` or ``zh``.
        question: the question text.
        answer: the gold answer as text (an integer, or one of ``choices``).
        choices: for name answers, the names that may be answered.
    """

    task_id: str
    kind: str
    language: str
    question: str
    answer: str
    choices: tuple = ()


_NAMES = {"en": ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry"],
          "zh": ["小明", "小红", "小刚", "小丽", "小华", "小军", "小芳", "小强"]}
_ITEMS = {"en": ["apples", "pencils", "books", "marbles", "cookies", "stamps"],
          "zh": ["个苹果", "支铅笔", "本书", "颗弹珠", "块饼干", "张邮票"]}  # measure word + noun
_FRUITS = {"en": ["apple", "pear", "plum", "peach", "lemon"], "zh": ["苹果", "梨", "李子", "桃子", "柠檬"]}
_WORDS = ["banana", "strawberry", "committee", "mississippi", "balloon", "parallel", "coffee", "bookkeeper"]


def _arithmetic(rng: random.Random, lang: str) -> tuple[str, str]:
    name, it = rng.choice(_NAMES[lang]), rng.choice(_ITEMS[lang])
    cl, noun = (it[0], it[1:]) if lang == "zh" else ("", it)  # Chinese: measure word, noun
    form = rng.randrange(3)
    if form == 0:
        a, b = rng.randint(5, 30), rng.randint(2, 20)
        c = rng.randint(1, a + b - 1)
        ans = a + b - c
        q = {"en": f"{name} has {a} {it}. {name} buys {b} more and then gives away {c}. How many {it} does {name} have now?",
             "zh": f"{name}有{a}{it}。{name}又买了{b}{cl}，然后送出{c}{cl}。{name}现在有几{it}？"}[lang]
    elif form == 1:
        a, b = rng.randint(3, 12), rng.randint(2, 9)
        c = rng.randint(1, a * b - 1)
        ans = a * b - c
        q = {"en": f"A box holds {a} {it}. There are {b} boxes. Then {c} {it} are lost. How many {it} are left?",
             "zh": f"一个盒子装{a}{it}，一共有{b}个盒子。后来丢了{c}{cl}{noun}。还剩几{it}？"}[lang]
    else:
        a, b, c = rng.randint(2, 15), rng.randint(2, 7), rng.randint(1, 20)
        ans = a * b + c
        q = {"en": f"{name} gets {a} {it} every day for {b} days, and then {c} more. How many {it} does {name} get in total?",
             "zh": f"{name}每天得到{a}{it}，连续{b}天，之后又得到{c}{cl}。{name}一共得到几{it}？"}[lang]
    return q, str(ans)


def _counting(rng: random.Random, lang: str) -> tuple[str, str]:
    if rng.random() < 0.5:
        word = rng.choice(_WORDS)
        letter = rng.choice(sorted(set(word)))
        ans = word.count(letter)
        q = {"en": f"How many times does the letter '{letter}' appear in the word '{word}'?",
             "zh": f"字母'{letter}'在单词'{word}'中出现了几次？"}[lang]
    else:
        fruits = _FRUITS[lang]
        seq = [rng.choice(fruits) for _ in range(rng.randint(5, 9))]
        target = rng.choice(seq)
        ans = seq.count(target)
        sep = ", " if lang == "en" else "、"
        q = {"en": f"Here is a list: {sep.join(seq)}. How many times does '{target}' appear in the list?",
             "zh": f"这里有一个列表：{sep.join(seq)}。'{target}'在列表中出现了几次？"}[lang]
    return q, str(ans)


def _logic(rng: random.Random, lang: str) -> tuple[str, str, tuple]:
    names = rng.sample(_NAMES[lang], 3)  # names[0] > names[1] > names[2]
    pairs = [(names[0], names[1]), (names[1], names[2])]
    rng.shuffle(pairs)
    ask_max = rng.random() < 0.5
    ans = names[0] if ask_max else names[2]
    if lang == "en":
        facts = " ".join(f"{a} is taller than {b}." for a, b in pairs)
        q = f"{facts} Who is the {'tallest' if ask_max else 'shortest'}?"
    else:
        facts = "".join(f"{a}比{b}高。" for a, b in pairs)
        q = f"{facts}谁最{'高' if ask_max else '矮'}？"
    return q, ans, tuple(sorted(names))


def make_tasks(n: int, seed: int = 0, languages: Sequence[str] = LANGUAGES, kinds: Sequence[str] = TASK_KINDS) -> list[Task]:
    """Generate ``n`` tasks offline, cycling kind and language, reproducibly from ``seed``.

    Raises:
        ParameterError: ``n`` < 1, or an unknown language or kind.
    """
    if not _is_int(n) or n < 1:
        raise ParameterError(f"num_tasks: must be an integer >= 1 (got {n!r})")
    _check_choices("languages", languages, LANGUAGES)
    _check_choices("task_kinds", kinds, TASK_KINDS)
    rng = random.Random(seed)
    combos = [(k, lang) for k in kinds for lang in languages]
    out = []
    for i in range(n):
        kind, lang = combos[i % len(combos)]
        choices: tuple = ()
        if kind == "arithmetic":
            q, a = _arithmetic(rng, lang)
        elif kind == "counting":
            q, a = _counting(rng, lang)
        else:
            q, a, choices = _logic(rng, lang)
        out.append(Task(f"{kind}-{lang}-{i}", kind, lang, q, a, choices))
    return out


def _check_choices(name: str, values, allowed) -> None:
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values:
        raise ParameterError(f"{name}: must be a non-empty list drawn from {', '.join(allowed)} (got {values!r})")
    for v in values:
        if v not in allowed:
            raise ParameterError(f"{name}: every value must be one of {', '.join(allowed)} (got {v!r})")


_INSTRUCTIONS = {
    ("en", "emulated"): "\nThink step by step between <think> and </think>, then give the final answer on one line as \"Answer: <answer>\".",
    ("zh", "emulated"): "\n请在 <think> 和 </think> 之间逐步思考，然后在一行中写出最终答案，格式为 \"Answer: <答案>\"。",
    ("en", "native"): "\nGive the final answer on one line as \"Answer: <answer>\".",
    ("zh", "native"): "\n请在一行中写出最终答案，格式为 \"Answer: <答案>\"。",
}


def task_prompt(task: Task, fmt: ThinkingFormat) -> str:
    """The user message for a task: the question and the answer-format instruction (same for every budget)."""
    return task.question + _INSTRUCTIONS[(task.language, fmt.mode)]


def _initial_phase(text: str, tail_from: int) -> str:
    tail = text[tail_from:]
    o, c = tail.rfind(OPEN_TEXT), tail.rfind(CLOSE_TEXT)
    if o < 0 and c < 0:
        return PRE
    return THINK if o > c else ANSWER


def build_inputs(tokenizer, tasks: Sequence[Task], fmt: ThinkingFormat, budget: int) -> tuple[list[list[int]], list[str]]:
    """Template and tokenise the tasks for one budget.

    Emulated thinking appends ``<think>\\n`` to the assistant turn (budget > 0)
    or an empty closed block ``<think>\\n</think>`` (budget 0). Native thinking
    passes ``enable_thinking=budget > 0`` to templates that read it; where the
    template leaves thinking open with budget 0, an empty close is appended.

    Returns:
        (token ids per task, initial phase per task: ``pre``/``think``/``answer``).
    """
    ids, phases = [], []
    for task in tasks:
        user = task_prompt(task, fmt)
        kwargs = {"enable_thinking": budget > 0} if fmt.template_flag else {}
        text = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                             tokenize=False, **kwargs)
        tail_from = text.rfind(user) + len(user)
        if fmt.native:
            phase = _initial_phase(text, tail_from)
            if budget == 0 and phase == THINK:
                text, phase = text + CLOSE_TEXT + "\n\n", ANSWER
        else:
            text += OPEN_TEXT + ("\n" if budget > 0 else "\n" + CLOSE_TEXT)
            phase = THINK if budget > 0 else ANSWER
        ids.append(_encode(tokenizer, text))
        phases.append(phase)
    return ids, phases


# ----------------------------------------------------------------------------- scoring


_NUMBER = re.compile(r"-?\d+")


def extract_answer(text: str, task: Task) -> str | None:
    """The predicted answer in an answer segment: the text after the last ``Answer:`` (or all of it),
    then the earliest of ``task.choices`` for name answers, else the first integer. None if absent."""
    for marker in ("Answer:", "答案：", "答案:"):
        i = text.rfind(marker)
        if i >= 0:
            text = text[i + len(marker):]
            break
    if task.choices:
        hits = [(text.find(c), c) for c in task.choices if c in text]
        return min(hits)[1] if hits else None
    m = _NUMBER.search(text.replace(",", ""))
    return m.group(0) if m else None


def gold_logprobs(loaded, contexts: Sequence[Sequence[int]], golds: Sequence[Sequence[int]]) -> list[float]:
    """Sum of log-probabilities (nats) of each gold token sequence after its context, one forward pass.

    Rows are left-padded (position ids from the attention mask) so every gold
    sequence ends the row; only the last ``max(len(gold)) + 1`` positions'
    logits are computed.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        contexts: token ids before the gold answer, per row.
        golds: the gold answer's token ids, per row (each non-empty).

    Returns:
        One float per row.
    """
    import torch

    model = loaded.model
    seqs = [list(c) + list(g) for c, g in zip(contexts, golds)]
    width = max(len(s) for s in seqs)
    pad = loaded.tokenizer.pad_token_id or 0
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    keep = max(len(g) for g in golds) + 1
    with torch.inference_mode():
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                       position_ids=pos.to(model.device), logits_to_keep=keep).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for i, g in enumerate(golds):
        n = len(g)
        pred = logp[i, keep - 1 - n: keep - 1]  # positions predicting the last n tokens
        out.append(float(pred.gather(-1, torch.tensor(g, device=pred.device)[:, None]).sum()))
    return out


def _eos_ids(loaded) -> set[int]:
    eos = loaded.model.generation_config.eos_token_id
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}


def _trim(rec: dict, n: int, finish: str, tokenizer) -> None:
    """Cut a record to its first ``n`` ids (the rest was ``generate``'s padding after a stop), recomputing timings."""
    if n >= rec["output_tokens"]:
        rec["finish_reason"] = finish
        return
    ids = rec["output_ids"][:n]
    itl = rec["itl_s"][: max(n - 1, 0)]
    e2e = rec["ttft_s"] + sum(itl)
    decode_s = e2e - rec["ttft_s"]
    rec.update(
        output_ids=ids, output_tokens=n, itl_s=itl, e2e_s=e2e, finish_reason=finish,
        tpot_s=decode_s / (n - 1) if n > 1 else float("nan"),
        decode_tps=(n - 1) / decode_s if n > 1 and decode_s > 0 else float("nan"),
        text=tokenizer.decode(ids, skip_special_tokens=True),
    )


def run_reasoning_batch(loaded, tasks: Sequence[Task], spec: BudgetSpec, mode: str = "auto",
                        temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                        score: bool = True, extra_processors: Sequence = ()) -> tuple[list[dict], float]:
    """Generate answers for one batch of tasks under a thinking budget, and measure them.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        tasks: the batch (one request each).
        spec: :class:`BudgetSpec`.
        mode: ``auto``, ``native`` or ``emulated`` (see :func:`thinking_format`).
        temperature, top_p, seed: sampling (temperature 0 is greedy).
        score: compute ``gold_logprob`` (one extra forward pass, untimed).
        extra_processors: logits processors run before budget forcing (tests use
            them as a scripted stand-in for a model's preferences).

    Returns:
        (records, wall_s): the :func:`~workbench.generation.generate_measured`
        records with the reasoning columns added (see the module docstring),
        and the batch's wall time in seconds.
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    from .generation import GenerationSettings, generate_measured

    tok = loaded.tokenizer
    fmt = thinking_format(tok, mode)
    ids, phases = build_inputs(tok, tasks, fmt, spec.budget)
    eos = _eos_ids(loaded)
    handoff_ids = _encode(tok, spec.handoff) if spec.handoff else []
    proc = BudgetForcingProcessor(fmt, spec, _encode(tok, spec.wait), handoff_ids, eos, phases)
    stop = AnswerStoppingCriteria(proc, tok, spec.answer_tokens, spec.stop_at_newline)
    settings = GenerationSettings(max_new_tokens=spec.total_new_tokens(fmt, PRE in phases),
                                  temperature=temperature, top_p=top_p, seed=seed)
    res = generate_measured(loaded, [t.question for t in tasks], settings, input_ids=ids,
                            logits_processor=LogitsProcessorList([*extra_processors, proc]),
                            stopping_criteria=StoppingCriteriaList([stop]))
    contexts, golds = [], []
    for rec, row, task, prompt_ids, phase in zip(res.records, proc.rows, tasks, ids, phases):
        if row.stopped_at is not None:
            _trim(rec, row.stopped_at, row.stop_reason, tok)
        n = rec["output_tokens"]
        k, closed = _replay(rec["output_ids"], fmt, phase, eos)
        answer_ids = rec["output_ids"][k:]
        answer_text = tok.decode(answer_ids, skip_special_tokens=True).rstrip("\ufffd")
        pred = extract_answer(answer_text, task)
        rec.update(
            reasoning_budget=spec.budget, min_budget=spec.min_budget, answer_allowance=spec.answer_tokens,
            thinking_mode=fmt.mode, thinking_tokens=k, answer_tokens=n - k,
            ttfat_s=rec["ttft_s"] + sum(rec["itl_s"][:k]) if n > k else float("nan"),
            answer_truncated=rec["finish_reason"] == "length", forced_close=row.forced_close, waits=row.waits,
            thinking_text=tok.decode(rec["output_ids"][:k], skip_special_tokens=True), answer_text=answer_text,
            task_id=task.task_id, task_kind=task.kind, language=task.language, gold=task.answer,
            prediction=pred, exact_match=pred is not None and pred == task.answer,
        )
        thinking = [t for t in rec["output_ids"][:k] if t not in eos]
        if k > 0 and not closed:
            thinking += list(fmt.close_ids)  # thinking cut off: close it before scoring
        contexts.append(list(prompt_ids) + thinking + handoff_ids)
        golds.append(_encode(tok, " " + task.answer))
    if score:
        for rec, lp, g in zip(res.records, gold_logprobs(loaded, contexts, golds), golds):
            rec.update(gold_logprob=lp, gold_tokens=len(g))
    return res.records, res.wall_s


# ----------------------------------------------------------------------------- the sweep


@dataclasses.dataclass
class ReasoningConfig(sweeps.SweepConfig):
    """The reasoning-budget sweep (notebook ``05_reasoning_budget``): budget x batch size.

    Attributes:
        budgets: thinking-token budgets B, each >= 0 (0: no thinking).
        batch_sizes: requests per ``generate`` call, each >= 1.
        min_budget: minimum thinking tokens (s1 "Wait" extension) for every
            budget > 0; must not exceed the smallest such budget.
        answer_tokens: answer allowance after the end of thinking (>= 1).
        num_tasks: tasks per point (the same tasks at every point), >= 1.
        languages: task languages, from ``en``, ``zh``.
        task_kinds: from ``arithmetic``, ``counting``, ``logic``.
        thinking: ``auto`` (native if the tokenizer has ``<think>`` tokens),
            ``native`` or ``emulated``.
        temperature: 0 is greedy.
        top_p: nucleus mass in (0, 1].
        stop_at_newline: end an answer at the end of its line.

    Raises:
        ParameterError: any invalid field, before a model loads.
    """

    budgets: list = dataclasses.field(default_factory=lambda: [0, 16, 64])
    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 4])
    min_budget: int = 0
    answer_tokens: int = 24
    num_tasks: int = 8
    languages: list = dataclasses.field(default_factory=lambda: list(LANGUAGES))
    task_kinds: list = dataclasses.field(default_factory=lambda: list(TASK_KINDS))
    thinking: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    stop_at_newline: bool = True

    def __post_init__(self):
        super().__post_init__()
        sweeps._check_list("budgets", self.budgets, int, lo=0)
        sweeps._check_list("batch_sizes", self.batch_sizes, int, lo=1)
        if len(set(self.budgets)) != len(self.budgets):
            raise ParameterError(f"budgets: must not repeat a value (got {self.budgets!r})")
        positive = [b for b in self.budgets if b > 0]
        for b in self.budgets:
            self.spec(b)
        if positive and self.min_budget > min(positive):
            raise ParameterError(f"min_budget: must be <= the smallest budget > 0, {min(positive)} (got {self.min_budget!r})")
        sweeps._check_int("num_tasks", self.num_tasks, 1)
        _check_choices("languages", self.languages, LANGUAGES)
        _check_choices("task_kinds", self.task_kinds, TASK_KINDS)
        if self.thinking not in THINKING_MODES:
            raise ParameterError(f"thinking: must be one of {', '.join(THINKING_MODES)} (got {self.thinking!r})")
        from .generation import GenerationSettings

        GenerationSettings(max_new_tokens=1, temperature=self.temperature, top_p=self.top_p)
        need = max(self.budgets) + self.answer_tokens + 512  # prompt (< 512 tokens) + budget + answer
        if need > self.max_context():
            raise ParameterError(f"budgets: the largest budget leaves no room in the model's {self.max_context()}-token "
                                 f"context (got {max(self.budgets)})")

    def spec(self, budget: int) -> BudgetSpec:
        """The :class:`BudgetSpec` of one budget (``min_budget`` applies to budgets > 0)."""
        return BudgetSpec(budget=budget, min_budget=self.min_budget if budget > 0 else 0,
                          answer_tokens=self.answer_tokens, stop_at_newline=self.stop_at_newline)

    def tasks(self) -> list[Task]:
        return make_tasks(self.num_tasks, self.seed, self.languages, self.task_kinds)

    def grid(self) -> list[dict]:
        """Points: every (reasoning_budget, batch_size), budget outermost."""
        return sweeps.expand_grid(reasoning_budget=self.budgets, batch_size=self.batch_sizes)


def measure_reasoning_point(loaded, cfg: ReasoningConfig, point: dict, tasks: Sequence[Task]) -> dict:
    """Measure one (budget, batch size) point over all tasks, in consecutive batches.

    ``cfg.warmup`` untimed runs of the first batch (budget <= 2, two answer
    tokens) come first; then ``cfg.repeats`` timed passes over the tasks,
    repeat ``r`` with seed ``cfg.seed + r``.

    Returns:
        The measure-dict of :func:`workbench.sweeps.run_sweep`; ``extra`` holds
        ``accuracy``, ``gold_logprob_mean``, ``thinking_tokens_mean``,
        ``answer_truncated_rate``, ``forced_close_rate`` and ``ttfat_s_p50/p90/p99``.
    """
    import time

    from . import metrics

    budget, bs = point["reasoning_budget"], point["batch_size"]
    spec = cfg.spec(budget)
    batches = [list(tasks[i:i + bs]) for i in range(0, len(tasks), bs)]
    t0 = time.perf_counter()
    warm = BudgetSpec(budget=min(budget, 2), answer_tokens=2, stop_at_newline=False)
    for _ in range(cfg.warmup):
        run_reasoning_batch(loaded, batches[0], warm, cfg.thinking, cfg.temperature, cfg.top_p, cfg.seed, score=False)
    warmup_s = time.perf_counter() - t0
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        for b, batch in enumerate(batches):
            recs, w = run_reasoning_batch(loaded, batch, spec, cfg.thinking, cfg.temperature, cfg.top_p, cfg.seed + r)
            for i, rec in enumerate(recs):
                rec.update(repeat=r, request_id=b * bs + i, batch_index=b, batch_size=len(batch), batch_wall_s=w)
            requests.extend(recs)
            wall += w
    n = len(requests)
    extra = {
        "accuracy": sum(bool(x["exact_match"]) for x in requests) / n,
        "gold_logprob_mean": sum(x["gold_logprob"] for x in requests) / n,
        "thinking_tokens_mean": sum(x["thinking_tokens"] for x in requests) / n,
        "answer_truncated_rate": sum(bool(x["answer_truncated"]) for x in requests) / n,
        "forced_close_rate": sum(bool(x["forced_close"]) for x in requests) / n,
        "thinking_mode": requests[0]["thinking_mode"],
        **{f"ttfat_s_{k}": v for k, v in metrics.percentiles([x["ttfat_s"] for x in requests]).items()},
    }
    return {"requests": requests, "wall_s": wall, "warmup_s": warmup_s, "extra": extra}


def run_reasoning_sweep(cfg: ReasoningConfig, run_dir, loaded, resume: bool = False):
    """Every (budget, batch size) point of ``cfg`` on the same seeded tasks (experiment ``reasoning``).

    Returns:
        The experiment's points DataFrame (see :func:`workbench.sweeps.run_sweep`).
    """
    tasks = cfg.tasks()
    return sweeps.run_sweep(run_dir, "reasoning", cfg.grid(), lambda p: measure_reasoning_point(loaded, cfg, p, tasks),
                            resume=resume, info=loaded.info, config=cfg)


# ----------------------------------------------------------------------------- summaries and figures

QUALITY_METRICS = ("exact_match", "gold_logprob")
LABELS = {
    "reasoning_budget": "reasoning budget B (thinking tokens)",
    "batch_size": "batch size",
    "ttfat_s": "time to first answer token (s)",
    "ttft_s": "time to first token (s)",
    "e2e_s": "end-to-end latency (s)",
    "exact_match": "exact-match accuracy",
    "gold_logprob": "log-likelihood of the gold answer (nats)",
    "thinking_tokens": "thinking tokens per request",
    "output_throughput_tps": "output throughput (tokens/s)",
    "value": "seconds",
}


def quality_summary(requests, by=("reasoning_budget", "batch_size"), confidence: float = 0.95):
    """Mean and percentile-bootstrap CI (``scipy.stats.bootstrap``) of exact match and gold log-likelihood per group.

    Returns:
        Long DataFrame: the ``by`` columns, ``metric``, ``n``, ``mean``, ``ci_low``, ``ci_high``.
    """
    from . import quality

    df = requests.copy()
    df["exact_match"] = df["exact_match"].astype(float)
    return quality.summarize(df, list(by), metrics=list(QUALITY_METRICS), confidence=confidence)


def latency_table(requests):
    """Long table of per-request TTFT, TTFAT and e2e (seconds) by budget and batch size, for box plots."""
    cols = ["reasoning_budget", "batch_size", "ttft_s", "ttfat_s", "e2e_s"]
    df = requests[cols].melt(id_vars=cols[:2], var_name="metric", value_name="value")
    return df.dropna(subset=["value"])


def fig_latency_vs_budget(points):
    """TTFT, TTFAT and e2e medians (p50) vs budget, one colour per metric, one line style per batch size."""
    import plotly.express as px

    from . import plots

    pts = plots.ok_points(points)
    cols = {"ttft_s_p50": "TTFT p50", "ttfat_s_p50": "TTFAT p50", "e2e_s_p50": "e2e p50"}
    df = pts.melt(id_vars=["reasoning_budget", "batch_size"], value_vars=list(cols), var_name="metric",
                  value_name="value")
    df["metric"] = df["metric"].map(cols)
    df["batch_size"] = df["batch_size"].astype(str)
    fig = px.line(df.sort_values("reasoning_budget"), x="reasoning_budget", y="value", color="metric",
                  line_dash="batch_size", markers=True, labels={**LABELS, "value": "latency p50 (s)"},
                  title="Latency vs reasoning budget (p50 over requests)")
    return fig


def fig_quality_vs_budget(summary):
    """Accuracy and gold-answer log-likelihood vs budget with bootstrap CI error bars, colour = batch size."""
    import plotly.express as px

    from . import plots  # noqa: F401

    df = summary.copy()
    df["err_plus"] = df["ci_high"] - df["mean"]
    df["err_minus"] = df["mean"] - df["ci_low"]
    df["batch_size"] = df["batch_size"].astype(str)
    df["metric"] = df["metric"].map({"exact_match": "exact-match accuracy",
                                     "gold_logprob": "gold-answer log-likelihood (nats)"})
    fig = px.line(df.sort_values("reasoning_budget"), x="reasoning_budget", y="mean", color="batch_size",
                  facet_col="metric", error_y="err_plus", error_y_minus="err_minus", markers=True,
                  labels={**LABELS, "mean": "mean (95% bootstrap CI)"},
                  title="Answer quality vs reasoning budget")
    fig.update_yaxes(matches=None, showticklabels=True)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    return fig


def fig_thinking_distribution(requests):
    """Histogram of thinking tokens per request, one colour per budget (forced closes pile up at B + delimiter)."""
    import plotly.express as px

    from . import plots  # noqa: F401

    df = requests.copy()
    df["reasoning_budget"] = df["reasoning_budget"].astype(str)
    return px.histogram(df, x="thinking_tokens", color="reasoning_budget", barmode="overlay", opacity=0.7,
                        labels={**LABELS, "reasoning_budget": "budget B"},
                        title="Thinking tokens per request")


def fig_throughput_vs_budget(points):
    """Output throughput (all tokens / wall time) vs budget, one line per batch size."""
    import plotly.express as px

    from . import plots

    pts = plots.ok_points(points)
    pts["batch_size"] = pts["batch_size"].astype(str)
    return px.line(pts.sort_values("reasoning_budget"), x="reasoning_budget", y="output_throughput_tps",
                   color="batch_size", markers=True, labels=LABELS,
                   title="Output throughput vs reasoning budget, per batch size")


def reasoning_figures(points, requests) -> dict:
    """All figures of the notebook, in report order: ``{name: figure}``."""
    return {
        "reasoning_latency_vs_budget": fig_latency_vs_budget(points),
        "reasoning_quality_vs_budget": fig_quality_vs_budget(quality_summary(requests)),
        "reasoning_thinking_tokens": fig_thinking_distribution(requests),
        "reasoning_throughput_vs_budget": fig_throughput_vs_budget(points),
    }


def examples_markdown(requests, per_budget: int = 2) -> str:
    """Markdown with the first ``per_budget`` requests of each budget: question id, thinking, answer, gold."""
    lines = ["# Reasoning budget: example outputs", ""]
    first = requests[requests["repeat"] == requests["repeat"].min()] if "repeat" in requests else requests
    first = first[first["batch_size"] == first["batch_size"].min()]
    for budget, g in first.groupby("reasoning_budget", sort=True):
        lines += [f"## B = {budget}", ""]
        for _, r in g.head(per_budget).iterrows():
            pred = r["prediction"] if isinstance(r["prediction"], str) else "none"
            lines += [f"**{r['task_id']}** (gold `{r['gold']}`, predicted `{pred}`, "
                      f"{r['thinking_tokens']} thinking + {r['answer_tokens']} answer tokens)", "",
                      "```", f"{r['thinking_text']}{r['answer_text']}", "```", ""]
    return "\n".join(lines)
