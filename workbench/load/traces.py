"""Mixed traces: interactive short chats and background long reports arriving together, made or read, as requests.

:func:`mixed_trace` draws one (stated distributions: each request is ``interactive`` with probability
``short_share``, else ``background``; its prompt length uniform over the class's list of prompt lengths; its output
fixed at the class's ``max_tokens``; priority 0 interactive, 1 background; Poisson arrivals at ``rate_rps``,
:func:`workbench.load.load.arrival_offsets`); :func:`read_mixed_trace` reads one from JSONL
(:func:`workbench.load.load.read_trace`'s fields plus ``request_class`` and ``priority``, ``data/traces/``);
:func:`check_class_slos` checks that every class has a TTFT SLO; :func:`specs_of` turns its rows into the load
generator's :class:`~workbench.load.load.RequestSpec`, and :func:`request_rows` joins a replay's load rows with
their trace rows (class, priority, slowdown, ETA error). On an engine: :func:`calibrate` measures each class's
service alone, :func:`trace_rows` makes (or reads) the trace of one round and :func:`run_policy` replays it on a
fresh engine under a policy (:func:`policy_engine`). Those read a scheduling config
(:class:`workbench.experiments.scheduling.Config`: its classes' prompt lengths and outputs, ``short_share``,
``load_factor``, ``trace``, ``warmup``, the senders' patience and retries, ``engine_options_for()``, ``queue()``,
``settings()``), passed in, never imported. The scheduling study (notebook ``11_scheduling``) and ``workbench
simulate`` replay them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import load, senders
from workbench.serving import engine_kinds, scheduling


def mixed_trace(n: int, short_share: float, short_prompt_tokens, long_prompt_tokens, short_max_tokens: int,
                long_max_tokens: int, rate_rps: float, seed: int = 0, exact: bool = False) -> list[dict]:
    """``n`` rows of a mixed trace (the distributions of the module docstring): ``offset_s`` (Poisson arrivals at
    ``rate_rps``), ``prompt_tokens``, ``output_tokens``, ``request_class`` and ``priority`` (0 interactive, 1
    background). A fixed ``seed`` gives the same trace. ``exact``: exactly ``round(short_share * n)`` interactive
    requests (at least one of each class from ``n`` = 2 on) in a random order, so that a short run's class mix does
    not vary from one seed to the next and each class has a per-run statistic (notebook 11's rounds)."""
    rng = np.random.default_rng(seed)
    offs = load.arrival_offsets("poisson", n, rate_rps, seed=seed)
    mix = None
    if exact:
        k = int(round(short_share * n))
        k = min(max(k, 1), n - 1) if n >= 2 else k
        mix = np.array([True] * k + [False] * (n - k))
        rng.shuffle(mix)
    rows = []
    for i, off in enumerate(offs):
        short = bool(rng.random() < short_share) if mix is None else bool(mix[i])
        rows.append({"offset_s": round(float(off), 3),
                     "prompt_tokens": int(rng.choice(short_prompt_tokens if short else long_prompt_tokens)),
                     "output_tokens": int(short_max_tokens if short else long_max_tokens),
                     "request_class": "interactive" if short else "background", "priority": 0 if short else 1})
    return rows


def read_mixed_trace(path, class_slo_ttft_s: dict) -> list[dict]:
    """A mixed trace: the :func:`workbench.load.load.read_trace` fields plus ``request_class`` (one with a
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


def request_rows(rows: list[dict], trace_rows: list[dict], alone_s: dict) -> list[dict]:
    """The load rows with their trace fields (``request_class``, ``priority``, ``max_tokens``), ``slowdown``
    (``e2e_s`` over the class's service alone) and ``eta_error_s`` (``eta_s - queue_s``); bookkeeping stamps
    dropped."""
    out = []
    for r in rows:
        t = trace_rows[r["request_id"]]
        r = {k: v for k, v in r.items() if k not in ("t_scheduled", "t_sent", "t_done", "t_headers", "t_sent_last")}
        r["engine_batch"] = r.pop("batch_size", None)
        a = alone_s.get(t["request_class"], float("nan"))
        e2e, q, eta = r.get("e2e_s"), r.get("queue_s"), r.get("eta_s")
        r.update(request_class=t["request_class"], priority=t.get("priority", 0), max_tokens=t["output_tokens"],
                 max_new_tokens=t["output_tokens"], context_tokens=t["prompt_tokens"], temperature=0.0,
                 slowdown=e2e / a if e2e is not None and a and a == a and not load.failed(r) else float("nan"),
                 eta_error_s=(eta - q) if eta is not None and q is not None else float("nan"))
        out.append(r)
    return out


# ----------------------------------------------------------------------------- replaying one on an engine


def policy_engine(loaded, cfg, policy: str):
    """A fresh ``cfg.engine`` under ``policy`` (its queue: ``cfg.queue(policy)``), sized for the longest request of
    the mix."""
    max_seq = max(cfg.long_prompt_tokens + cfg.short_prompt_tokens) + cfg.long_max_tokens + 8
    return engine_kinds.make_engine(cfg.engine_options_for(cfg.engine, max_seq_tokens=max_seq), loaded, cfg.queue(policy),
                                   cfg.settings())


def calibrate(loaded, cfg) -> dict:
    """The service alone of each class on an idle ``cfg.engine``: ``{class: seconds}`` (median e2e of two
    requests one at a time, after ``cfg.warmup`` untimed ones), and ``rate_rps``, ``load_factor / E[service]``
    over the mix."""
    from workbench.inputs.prompts import build_prompt

    eng = policy_engine(loaded, cfg, "fcfs")
    tok = loaded.tokenizer
    send = senders.engine_sender(eng, tok, cfg.settings())
    alone = {}
    try:
        for c, p, m in (("interactive", cfg.short_prompt_tokens[0], cfg.short_max_tokens),
                        ("background", cfg.long_prompt_tokens[0], cfg.long_max_tokens)):
            spec = load.RequestSpec(build_prompt(tok, p), m, p)
            for _ in range(cfg.warmup):
                send(spec, time.perf_counter())
            alone[c] = float(np.median([send(spec, time.perf_counter())["e2e_s"] for _ in range(2)]))
    finally:
        eng.stop()
    mean = cfg.short_share * alone["interactive"] + (1 - cfg.short_share) * alone["background"]
    return {"alone_s": alone, "rate_rps": cfg.load_factor / mean}


def trace_rows(cfg, rate: float, replicate: int = 0) -> list[dict]:
    """The mixed workload of ``cfg``: its ``trace`` file (first ``requests_per_point`` rows; the same in every
    round) or :func:`mixed_trace` at ``rate`` requests/s with arrival seed ``cfg.seed + replicate``, its class mix
    exact (``round(short_share * requests_per_point)`` interactive requests in every run)."""
    if cfg.trace:
        return read_mixed_trace(cfg.trace, cfg.class_slo_ttft_s)[: cfg.requests_per_point]
    return mixed_trace(cfg.requests_per_point, cfg.short_share, cfg.short_prompt_tokens, cfg.long_prompt_tokens,
                       cfg.short_max_tokens, cfg.long_max_tokens, rate, cfg.seed + replicate, exact=True)


def run_policy(loaded, cfg, policy: str, rows_in: list[dict], alone_s: dict):
    """Replay the trace rows ``rows_in`` (offsets, classes, priorities) on a fresh ``cfg.engine`` under ``policy``.

    ``cfg.warmup`` x 2 of the requests run first, untimed (the service-rate estimate's first history); the
    senders honour Retry-After (``max_retries``) and ``abandon_share`` of the clients have ``patience_s``.

    Returns:
        ``(rows, load_result, warmup_s)``: :func:`request_rows` of the run, its
        :class:`~workbench.load.load.LoadResult`, the warm-up seconds.
    """
    specs = specs_of(loaded.tokenizer, rows_in)
    if cfg.abandon_share > 0:
        specs = senders.with_patience(specs, cfg.abandon_share, cfg.patience_s, cfg.seed)
    t0 = time.perf_counter()
    eng = policy_engine(loaded, cfg, policy)
    try:
        warm = senders.engine_sender(eng, loaded.tokenizer, cfg.settings())
        for s in specs[: cfg.warmup * 2]:
            warm(dataclasses.replace(s, patience_s=None), time.perf_counter())
        warmup_s = time.perf_counter() - t0
        send = senders.retrying_sender(senders.engine_sender(eng, loaded.tokenizer, cfg.settings(), cfg.max_pending),
                                    cfg.max_retries)
        res = load.run_load(send, specs, "replay", max_wait_s=cfg.max_wait_s)
    finally:
        eng.stop()
    return request_rows(res.rows, rows_in, alone_s), res, warmup_s
