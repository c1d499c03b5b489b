"""Reasoning tasks: short questions with one exact answer, generated offline from a seed.

Six kinds, in English and Chinese, each a :class:`Task` (question, gold answer). Three need a
few steps of reasoning (for models of about a billion parameters and up):

- ``arithmetic``: multi-step word problems (buy, give away, multiply);
- ``counting``: letters in a word, or items in a list;
- ``logic``: ordering questions over three names ("A is taller than B ... who is the tallest?").

Three are one-step lookups and copies that a ~100M-parameter chat model solves some of the time
without thinking, so a budget sweep on the embedded SmolLM2-135M can move its accuracy either way
(the default suite's tasks; the hard kinds above stay at 0% on it at every budget):

- ``lookup``: the value of one key in a three-entry table ("Codes: red = 4, blue = 7, green = 2.
  What is the code for blue?");
- ``copy``: repeat a five-digit number exactly;
- ``list_count``: how many animals a list of two to five distinct ones holds.

The embedded model answers the one-step kinds far more often than the multi-step ones at budget 0 (greedy,
``make_tasks(36, seed=0, kinds=...)``; the rates: results/LOG.md, 2026-12-06).

:func:`task_prompt` adds the answer-format instruction ("Answer: <answer>"),
:func:`extract_answer` reads the prediction back out of an answer segment, and
:func:`run_reasoning_batch` answers a batch of tasks under a thinking budget
(:func:`workbench.techniques.budget_batch.generate_with_budget`) and scores each request:
``prediction``, ``exact_match`` (:func:`workbench.measure.quality.exact_match`) and
``gold_logprob``, the log-likelihood (nats) of the gold answer's tokens given the
question, the thinking and the hand-off phrase
(:func:`workbench.measure.quality.continuation_logprobs`, summed over the answer's tokens).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Sequence

from workbench.checks import check_choice_list, check_int
from workbench.measure import quality
from workbench.techniques.budget_batch import build_inputs, generate_with_budget
from workbench.techniques.budget_forcing import BudgetSpec, ThinkingFormat, thinking_format

LANGUAGES = ("en", "zh")
TASK_KINDS = ("arithmetic", "counting", "logic", "lookup", "copy", "list_count")
#: the multi-step kinds: a default for models that can reason (the notebook's default)
REASONING_KINDS = ("arithmetic", "counting", "logic")


@dataclass(frozen=True)
class Task:
    """One question with one exact answer.

    Attributes:
        task_id: ``<kind>-<language>-<index>``.
        kind: one of :data:`TASK_KINDS`.
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


_COLOURS = {"en": ["red", "blue", "green", "black", "white", "yellow", "pink", "brown"],
            "zh": ["红色", "蓝色", "绿色", "黑色", "白色", "黄色", "粉色", "棕色"]}
_ANIMALS = {"en": ["cat", "dog", "bird", "fish", "horse", "cow", "duck", "sheep"],
            "zh": ["猫", "狗", "鸟", "鱼", "马", "牛", "鸭", "羊"]}


def _lookup(rng: random.Random, lang: str) -> tuple[str, str]:
    """A three-entry table of colour -> one-digit code (distinct codes) and the code of one colour."""
    keys = rng.sample(_COLOURS[lang], 3)
    vals = rng.sample(range(1, 10), 3)
    i = rng.randrange(3)
    if lang == "en":
        table = ", ".join(f"{k} = {v}" for k, v in zip(keys, vals))
        q = f"Codes: {table}. What is the code for {keys[i]}?"
    else:
        table = "，".join(f"{k} = {v}" for k, v in zip(keys, vals))
        q = f"代码：{table}。{keys[i]}的代码是多少？"
    return q, str(vals[i])


def _copy(rng: random.Random, lang: str) -> tuple[str, str]:
    """A five-digit number to repeat exactly (the answer is the number)."""
    number = str(rng.randint(10 ** 4, 10 ** 5 - 1))
    q = {"en": f"Repeat this number exactly: {number}.", "zh": f"请原样写出这个数字：{number}。"}[lang]
    return q, number


def _list_count(rng: random.Random, lang: str) -> tuple[str, str]:
    """Two to five distinct animals; the answer is how many."""
    items = rng.sample(_ANIMALS[lang], rng.randint(2, 5))
    if lang == "en":
        q = f"How many animals are in this list: {', '.join(items)}?"
    else:
        q = f"这个列表里有几种动物：{'、'.join(items)}？"
    return q, str(len(items))


def make_tasks(n: int, seed: int = 0, languages: Sequence[str] = LANGUAGES,
               kinds: Sequence[str] = REASONING_KINDS) -> list[Task]:
    """Generate ``n`` tasks offline, cycling kind and language, reproducibly from ``seed``.

    Raises:
        ParameterError: ``n`` < 1, or an unknown language or kind.
    """
    check_int("num_tasks", n, lo=1)
    check_choice_list("languages", languages, LANGUAGES)
    check_choice_list("task_kinds", kinds, TASK_KINDS)
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
        elif kind == "logic":
            q, a, choices = _logic(rng, lang)
        else:
            q, a = {"lookup": _lookup, "copy": _copy, "list_count": _list_count}[kind](rng, lang)
        out.append(Task(f"{kind}-{lang}-{i}", kind, lang, q, a, choices))
    return out


_INSTRUCTIONS = {
    ("en", "emulated"): "\nThink step by step between <think> and </think>, then give the final answer on one line as \"Answer: <answer>\".",
    ("zh", "emulated"): "\n请在 <think> 和 </think> 之间逐步思考，然后在一行中写出最终答案，格式为 \"Answer: <答案>\"。",
    ("en", "native"): "\nGive the final answer on one line as \"Answer: <answer>\".",
    ("zh", "native"): "\n请在一行中写出最终答案，格式为 \"Answer: <答案>\"。",
}


def task_prompt(task: Task, fmt: ThinkingFormat) -> str:
    """The user message for a task: the question and the answer-format instruction (same for every budget)."""
    return task.question + _INSTRUCTIONS[(task.language, fmt.mode)]


def task_inputs(tokenizer, tasks: Sequence[Task], fmt: ThinkingFormat,
                budget: int) -> tuple[list[list[int]], list[str]]:
    """Templated token ids and initial phases of the tasks' prompts for one budget (see
    :func:`workbench.techniques.budget_batch.build_inputs`)."""
    return build_inputs(tokenizer, [task_prompt(t, fmt) for t in tasks], fmt, budget)


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


def run_reasoning_batch(loaded, tasks: Sequence[Task], spec: BudgetSpec, mode: str = "auto",
                        temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                        score: bool = True, extra_processors: Sequence = ()) -> tuple[list[dict], float]:
    """Answer one batch of tasks under a thinking budget, measure and score them.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        tasks: the batch (one request each).
        spec: :class:`workbench.techniques.budget_forcing.BudgetSpec`.
        mode: ``auto``, ``native`` or ``emulated`` (see :func:`workbench.techniques.budget_forcing.thinking_format`).
        temperature, top_p, seed: sampling (temperature 0 is greedy).
        score: compute ``gold_logprob`` and ``gold_tokens`` (one extra forward pass, untimed).
        extra_processors: logits processors run before budget forcing (tests use
            them as a scripted stand-in for a model's preferences).

    Returns:
        (records, wall_s): the :func:`~workbench.techniques.budget_batch.generate_with_budget` records with
        ``task_id``, ``task_kind``, ``language``, ``gold``, ``prediction``, ``exact_match`` (and
        ``gold_logprob``, ``gold_tokens`` when scored) added, and the batch's wall time in seconds.
    """
    tok = loaded.tokenizer
    fmt = thinking_format(tok, mode)
    batch = generate_with_budget(loaded, [task_prompt(t, fmt) for t in tasks], spec, fmt.mode,
                                 temperature, top_p, seed, extra_processors)
    for rec, task in zip(batch.records, tasks):
        pred = extract_answer(rec["answer_text"], task)
        rec.update(task_id=task.task_id, task_kind=task.kind, language=task.language, gold=task.answer,
                   prediction=pred, exact_match=quality.exact_match(pred, [task.answer]) if pred is not None else 0.0)
    if score:
        golds = [list(tok.encode(" " + t.answer, add_special_tokens=False)) for t in tasks]
        lps = quality.continuation_logprobs(loaded, batch.answer_contexts, golds)
        for rec, lp, g in zip(batch.records, lps, golds):
            rec.update(gold_logprob=float(sum(lp)), gold_tokens=len(g))
    return batch.records, batch.wall_s
