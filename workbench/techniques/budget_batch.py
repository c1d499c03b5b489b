"""A measured batch under a thinking budget: template the requests for one budget, generate them with
:class:`~workbench.techniques.budget_forcing.BudgetForcingProcessor` on the measured ``generate``, and split each
record into thinking and answer (``thinking_tokens``, ``answer_tokens``, ``ttfat_s``).

:func:`build_inputs` (emulated ``<think>`` blocks or a template's native ``enable_thinking``),
:func:`generate_with_budget` -> :class:`BudgetBatch`. The budget forcing itself (caps, forced close, the thinking
formats) is :mod:`workbench.techniques.budget_forcing`; the method is s1's budget forcing (Muennighoff et al. 2025).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from workbench.stats import metrics
from workbench.techniques.budget_forcing import (
    ANSWER,
    CLOSE_TEXT,
    OPEN_TEXT,
    PRE,
    THINK,
    AnswerStoppingCriteria,
    BudgetForcingProcessor,
    BudgetSpec,
    ThinkingFormat,
    encode_text,
    replay_thinking,
    thinking_format,
)


def _initial_phase(text: str, tail_from: int) -> str:
    tail = text[tail_from:]
    o, c = tail.rfind(OPEN_TEXT), tail.rfind(CLOSE_TEXT)
    if o < 0 and c < 0:
        return PRE
    return THINK if o > c else ANSWER


def build_inputs(tokenizer, messages: Sequence[str], fmt: ThinkingFormat,
                 budget: int) -> tuple[list[list[int]], list[str]]:
    """Template and tokenise user messages for one budget.

    Emulated thinking appends ``<think>\\n`` to the assistant turn (budget > 0)
    or an empty closed block ``<think>\\n</think>`` (budget 0). Native thinking
    passes ``enable_thinking=budget > 0`` to templates that read it; where the
    template leaves thinking open with budget 0, an empty close is appended.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        messages: one user message per request (e.g. :func:`workbench.inputs.reasoning.task_prompt`).
        fmt: the :class:`ThinkingFormat`.
        budget: the thinking budget (only ``budget > 0`` matters here).

    Returns:
        (token ids per message, initial phase per message: ``pre``/``think``/``answer``).
    """
    ids, phases = [], []
    for user in messages:
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
        ids.append(encode_text(tokenizer, text))
        phases.append(phase)
    return ids, phases


def _stamps(rec: dict) -> list[float]:
    """A record's token stamps relative to its submission (``ttft_s``, then ``ttft_s`` + each ``itl_s`` gap)."""
    if not rec["output_tokens"]:
        return []
    out = [rec["ttft_s"]]
    for gap in rec["itl_s"]:
        out.append(out[-1] + gap)
    return out


def _trim(rec: dict, n: int, finish: str, tokenizer) -> None:
    """Cut a record to its first ``n`` ids (the rest was ``generate``'s padding after a stop).

    Timings are recomputed by :func:`workbench.stats.metrics.request_timing` from the kept ids' stamps.
    """
    if n >= rec["output_tokens"]:
        rec["finish_reason"] = finish
        return
    ids = rec["output_ids"][:n]
    rec.update(metrics.request_timing(_stamps(rec)[:n], 0.0), output_ids=ids, finish_reason=finish,
               text=tokenizer.decode(ids, skip_special_tokens=True))


@dataclass
class BudgetBatch:
    """What :func:`generate_with_budget` produced.

    Attributes:
        records: per request, the :func:`~workbench.measure.generation.generate_measured` record with the
            budget-forcing columns (see the module docstring).
        wall_s: the batch's wall time in seconds.
        fmt: the :class:`ThinkingFormat` used.
        answer_contexts: per request, the token ids an answer follows: prompt, thinking (EOS
            dropped; closed with the delimiter when the budget cut it off) and the hand-off
            phrase, for scoring a gold answer's likelihood after them.
    """

    records: list
    wall_s: float
    fmt: ThinkingFormat
    answer_contexts: list = field(default_factory=list)


def generate_with_budget(loaded, messages: Sequence[str], spec: BudgetSpec, mode: str = "auto",
                         temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         extra_processors: Sequence = ()) -> BudgetBatch:
    """Generate one batch of user messages under a thinking budget, and measure them.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        messages: the batch (one user message per request).
        spec: :class:`BudgetSpec`.
        mode: ``auto``, ``native`` or ``emulated`` (see :func:`thinking_format`).
        temperature, top_p, seed: sampling (temperature 0 is greedy).
        extra_processors: logits processors run before budget forcing (tests use
            them as a scripted stand-in for a model's preferences).

    Returns:
        :class:`BudgetBatch`.
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    from workbench.measure.device import synchronize
    from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured

    tok = loaded.tokenizer
    fmt = thinking_format(tok, mode)
    synchronize(loaded.model.device.type)
    t_submit = time.perf_counter()  # the request arrives: templating and tokenisation below count in TTFT
    ids, phases = build_inputs(tok, messages, fmt, spec.budget)
    eos = eos_token_ids(loaded)
    handoff_ids = encode_text(tok, spec.handoff) if spec.handoff else []
    proc = BudgetForcingProcessor(fmt, spec, encode_text(tok, spec.wait), handoff_ids, eos, phases)
    stop = AnswerStoppingCriteria(proc, tok, spec.answer_tokens, spec.stop_at_newline)
    settings = GenerationSettings(max_new_tokens=spec.total_new_tokens(fmt, PRE in phases),
                                  temperature=temperature, top_p=top_p, seed=seed)
    res = generate_measured(loaded, list(messages), settings, input_ids=ids,
                            logits_processor=LogitsProcessorList([*extra_processors, proc]),
                            stopping_criteria=StoppingCriteriaList([stop]), t_submit=t_submit)
    contexts = []
    for rec, row, prompt_ids, phase in zip(res.records, proc.rows, ids, phases):
        if row.stopped_at is not None:
            _trim(rec, row.stopped_at, row.stop_reason, tok)
        n = rec["output_tokens"]
        k, closed = replay_thinking(rec["output_ids"], fmt, phase, eos)
        answer_ids = rec["output_ids"][k:]
        rec.update(
            reasoning_budget=spec.budget, min_budget=spec.min_budget, answer_allowance=spec.answer_tokens,
            thinking_mode=fmt.mode, thinking_tokens=k, answer_tokens=n - k,
            ttfat_s=_stamps(rec)[k] if n > k else float("nan"),
            answer_truncated=rec["finish_reason"] == "length", forced_close=row.forced_close, waits=row.waits,
            reopen_blocked=row.reopen_blocked, batch_size=len(messages),
            thinking_text=tok.decode(rec["output_ids"][:k], skip_special_tokens=True),
            answer_text=tok.decode(answer_ids, skip_special_tokens=True).rstrip("\ufffd"),
        )
        thinking = [t for t in rec["output_ids"][:k] if t not in eos]
        if k > 0 and not closed:
            thinking += list(fmt.close_ids)  # thinking cut off: close it before scoring
        contexts.append(list(prompt_ids) + thinking + handoff_ids)
    return BudgetBatch(res.records, res.wall_s, fmt, contexts)
