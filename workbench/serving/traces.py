"""Mixed traces: interactive short chats and background long reports arriving together, made or read, as requests.

:func:`mixed_trace` draws one (stated distributions: each request is ``interactive`` with probability
``short_share``, else ``background``; its prompt length uniform over the class's list of prompt lengths; its output
fixed at the class's ``max_tokens``; priority 0 interactive, 1 background; Poisson arrivals at ``rate_rps``,
:func:`workbench.serving.load.arrival_offsets`); :func:`read_mixed_trace` reads one from JSONL
(:func:`workbench.serving.load.read_trace`'s fields plus ``request_class`` and ``priority``, ``data/traces/``);
:func:`check_class_slos` checks that every class has a TTFT SLO; :func:`specs_of` turns its rows into the load
generator's :class:`~workbench.serving.load.RequestSpec`. The scheduling study (notebook ``11_scheduling``) and
``workbench simulate`` replay them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench import checks
from workbench.errors import ParameterError
from workbench.serving import load, scheduling


def mixed_trace(n: int, short_share: float, short_prompt_tokens, long_prompt_tokens, short_max_tokens: int,
                long_max_tokens: int, rate_rps: float, seed: int = 0) -> list[dict]:
    """``n`` rows of a mixed trace (the distributions of the module docstring): ``offset_s`` (Poisson arrivals at
    ``rate_rps``), ``prompt_tokens``, ``output_tokens``, ``request_class`` and ``priority`` (0 interactive, 1
    background). A fixed ``seed`` gives the same trace."""
    rng = np.random.default_rng(seed)
    offs = load.arrival_offsets("poisson", n, rate_rps, seed=seed)
    rows = []
    for off in offs:
        short = bool(rng.random() < short_share)
        rows.append({"offset_s": round(float(off), 3),
                     "prompt_tokens": int(rng.choice(short_prompt_tokens if short else long_prompt_tokens)),
                     "output_tokens": int(short_max_tokens if short else long_max_tokens),
                     "request_class": "interactive" if short else "background", "priority": 0 if short else 1})
    return rows


def read_mixed_trace(path, class_slo_ttft_s: dict) -> list[dict]:
    """A mixed trace: the :func:`workbench.serving.load.read_trace` fields plus ``request_class`` (one with a
    TTFT SLO in ``class_slo_ttft_s``) and an integer ``priority`` (default 0).

    Raises:
        ParameterError: what ``read_trace`` refuses, a missing class, a class with no SLO, a bad priority (one line).
    """
    base = load.read_trace(path)
    lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    out = []
    for i, (row, obj) in enumerate(zip(base, lines), 1):
        c = obj.get("request_class")
        if not isinstance(c, str) or not c:
            raise ParameterError(f"trace: line {i}: missing field request_class")
        if c not in class_slo_ttft_s:
            raise ParameterError(f"trace: line {i}: request_class {c!r} has no SLO in class_slo_ttft_s "
                                 f"({', '.join(map(str, class_slo_ttft_s))})")
        prio = obj.get("priority", 0)
        try:
            scheduling.check_priority(prio)
        except ParameterError as exc:
            raise ParameterError(f"trace: line {i}: {exc}") from None
        out.append(dict(row, request_class=c, priority=int(prio)))
    return out


def specs_of(tokenizer, rows: list[dict]) -> list[load.RequestSpec]:
    """Request specs of trace rows: prompts of exactly ``prompt_tokens`` (chat template included), disjoint
    source windows."""
    from workbench.inputs.prompts import build_prompt

    return [load.RequestSpec(build_prompt(tokenizer, r["prompt_tokens"], offset=i * 128), r["output_tokens"],
                             r["prompt_tokens"], r["offset_s"], priority=r.get("priority", 0),
                             request_class=r["request_class"]) for i, r in enumerate(rows)]


def check_class_slos(class_slo_ttft_s, classes) -> dict:
    """Every class in ``classes`` has a TTFT SLO in ``class_slo_ttft_s`` (seconds > 0); one-line ParameterError."""
    if not isinstance(class_slo_ttft_s, dict):
        raise ParameterError(f"class_slo_ttft_s: must be a mapping class -> seconds (got {class_slo_ttft_s!r:.80})")
    for c in classes:
        if c not in class_slo_ttft_s:
            raise ParameterError(f"class_slo_ttft_s: class {c!r} has no SLO (classes with one: "
                                 f"{', '.join(map(str, class_slo_ttft_s)) or 'none'})")
        checks.check_float(f"class_slo_ttft_s[{c}]", class_slo_ttft_s[c], lo=0, lo_open=True)
    return class_slo_ttft_s
