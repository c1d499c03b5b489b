"""Conversations and shared-prefix groups sent to one engine: the workloads that reuse a prompt's prefix.

:func:`multiturn` runs several conversations at once whose every turn sends the whole history (so the prompt grows
turn by turn); :func:`shared_prefix_group` sends requests one after another that open with the same system document
(many users of one system prompt or document). Both prime the engine first with untimed requests that share no cache
page with the measured ones (:func:`prime`) and return rows of the engine sender's figures keyed by ``conversation``
and ``turn`` (:func:`turn_row`), the pairing key between prefix sharing on and off. The scheduling study (notebook
``11_scheduling``) measures them with the ``continuous`` engine's prefix cache on and off.
"""

from __future__ import annotations

import threading
import time

from workbench.load import load


def prime(send, tokenizer, warmup: int, prompt_tokens: int, max_tokens: int) -> None:
    """``warmup`` untimed requests that share no cache page with the measured ones (a system message and a
    source window of their own), so a fresh engine's first-call costs stay out of the first turn."""
    from workbench.inputs.prompts import build_prompt

    for i in range(warmup):
        user = build_prompt(tokenizer, prompt_tokens, offset=20_000 + 128 * i, chat=False)
        send(load.RequestSpec([{"role": "system", "content": "Warm-up."}, {"role": "user", "content": user}],
                              max_tokens), time.perf_counter())


def turn_row(row: dict, max_tokens: int, conversation: int, turn: int) -> dict:
    """A multi-turn or shared-prefix row: the engine sender's figures (bookkeeping stamps dropped) with its
    ``conversation`` and ``turn`` (the pairing key between prefix sharing on and off)."""
    out = dict({k: v for k, v in row.items() if k not in ("t_sent", "t_done", "t_headers")},
               conversation=conversation, turn=turn, request_class="interactive", priority=0,
               max_tokens=max_tokens, max_new_tokens=max_tokens, temperature=0.0,
               context_tokens=row.get("prompt_tokens"))
    out["engine_batch"] = out.pop("batch_size", None)
    return out


def multiturn(send, tokenizer, *, conversations: int, turns: int, prompt_tokens: int, max_tokens: int,
              shared_prefix_tokens: int = 0, warmup: int = 0, max_wait_s: float = 120.0) -> tuple[list, float, float]:
    """``conversations`` conversations at once, ``turns`` turns each: turn ``k`` sends the whole history (each
    earlier user message of ``prompt_tokens`` tokens and a fixed assistant reply of ``max_tokens`` words), so its
    prompt grows turn by turn; with ``shared_prefix_tokens`` every conversation opens with the same system document.
    ``warmup`` priming requests first (:func:`prime`); each conversation thread is waited for up to
    ``max_wait_s * turns``.

    Returns:
        ``(rows, warmup_s, t0)``: rows with ``conversation`` and ``turn`` (from 1) and the engine sender's figures
        (:func:`turn_row`), the priming seconds, and the ``time.perf_counter()`` reading when the turns began.
    """
    from workbench.inputs.prompts import build_prompt

    rows, lock = [], threading.Lock()
    reply = " ".join(["ok"] * max_tokens)
    shared = build_prompt(tokenizer, shared_prefix_tokens, offset=10_000, chat=False) if shared_prefix_tokens else ""

    def talk(conv):
        history = [{"role": "system", "content": shared}] if shared else []
        for turn in range(1, turns + 1):
            user = build_prompt(tokenizer, prompt_tokens, offset=(conv * turns + turn) * 128, chat=False)
            history.append({"role": "user", "content": user})
            row = send(load.RequestSpec(list(history), max_tokens), time.perf_counter())
            history.append({"role": "assistant", "content": reply})
            with lock:
                rows.append(turn_row(row, max_tokens, conv, turn))

    t = time.perf_counter()
    prime(send, tokenizer, warmup, prompt_tokens, max_tokens)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=talk, args=(c,), daemon=True) for c in range(conversations)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max_wait_s * turns)
    return rows, t0 - t, t0


def shared_prefix_group(send, tokenizer, *, requests: int, prefix_tokens: int, prompt_tokens: int, max_tokens: int,
                        warmup: int = 0) -> tuple[list, float, float]:
    """A shared-prefix group: ``requests`` requests, one after another (each sent when the previous one ended: a
    closed loop, so a request's prefix pages are complete before the next one looks for them), each opening with
    the same system document of ``prefix_tokens`` tokens and asking its own question of ``prompt_tokens`` tokens.
    ``warmup`` priming requests first (:func:`prime`).

    Returns:
        ``(rows, warmup_s, t0)``: rows with ``conversation`` (the request's index) and ``turn`` 1 and the engine
        sender's figures (:func:`turn_row`), the priming seconds, and the ``time.perf_counter()`` reading when the
        group began.
    """
    from workbench.inputs.prompts import build_prompt

    doc = build_prompt(tokenizer, prefix_tokens, offset=10_000, chat=False)
    rows = []
    t = time.perf_counter()
    prime(send, tokenizer, warmup, prompt_tokens, max_tokens)
    t0 = time.perf_counter()
    for i in range(requests):
        user = build_prompt(tokenizer, prompt_tokens, offset=30_000 + 128 * i, chat=False)
        spec = load.RequestSpec([{"role": "system", "content": doc}, {"role": "user", "content": user}], max_tokens)
        rows.append(turn_row(send(spec, time.perf_counter()), max_tokens, i, 1))
    return rows, t0 - t, t0
