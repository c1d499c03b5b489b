"""The client side of serving: the official ``openai`` client, and per-request timing over HTTP.

:func:`stream_chat` streams one chat completion from an OpenAI-compatible
server (:mod:`workbench.serving.server`, or any other) and stamps each content
chunk with ``perf_counter`` on arrival; the timing columns come from
:func:`workbench.metrics.request_timing` over those stamps (vLLM's request
functions in ``vllm/benchmarks/lib/endpoint_request_func.py`` stamp the same
way). A chunk is not a token: one chunk per token, except that a multi-byte
character split across tokens arrives as one chunk and an end-of-sequence id
sends none, so ``output_tokens`` is the server's ``usage`` count while the
timings are per chunk. The server's own figures (``engine_*``) come back in the
final chunk, so ``transport_ttft_s = ttft_s - engine_ttft_s`` is what HTTP, SSE
framing and the client add.

:func:`measure_http` sends ``concurrency`` streaming requests together from
threads and returns the measure dict of :func:`workbench.sweeps.run_sweep`.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from .. import metrics
from ..checks import check_int
from ..errors import ParameterError
from .server import SERVED_MODEL


def openai_client(base_url: str, timeout: float = 600.0):
    """The official ``openai`` client pointed at ``base_url`` (no retries, dummy key)."""
    import openai

    return openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="workbench", max_retries=0, timeout=timeout)


def stream_chat(client, prompt, max_tokens: int, temperature: float = 0.0, seed: int = 0,
                ignore_eos: bool = False, model: str = SERVED_MODEL) -> dict:
    """Stream one chat completion with the ``openai`` client and time it on the client side.

    Args:
        client: from :func:`openai_client`.
        prompt: a user message string or a list of messages.
        max_tokens, temperature, seed: request fields; ``ignore_eos`` is the vLLM extension.
        model: the ``model`` field of the request.

    Returns:
        A row: ``t_send`` (perf_counter), ``ttft_s`` (send to first content
        chunk), ``itl_s`` (gaps between content chunks), ``e2e_s`` (send to
        last chunk), ``tpot_s`` and ``decode_tps`` (over chunks), ``chunks``,
        ``text``, ``prompt_tokens``, ``output_tokens`` (``usage``),
        ``finish_reason``, ``engine_*`` (the server's figures) and
        ``transport_ttft_s`` / ``transport_e2e_s``.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    t_send = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": ignore_eos},
    )
    stamps, parts, engine, usage, finish = [], [], {}, None, None
    for ch in stream:
        t = time.perf_counter()
        extra = getattr(ch, "model_extra", None) or {}
        if extra.get("engine"):
            engine = extra["engine"]
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            if c.delta is not None and c.delta.content:
                stamps.append(t)
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    t_end = time.perf_counter()
    timing = metrics.request_timing(stamps, t_send)
    if not stamps:  # no visible text: the request still took this long
        timing["e2e_s"] = t_end - t_send
    nan = float("nan")

    def eng(key):
        v = engine.get(key)
        return nan if v is None else v

    return {
        "t_send": t_send,
        "ttft_s": timing["ttft_s"],
        "itl_s": timing["itl_s"],
        "e2e_s": timing["e2e_s"],
        "tpot_s": timing["tpot_s"],
        "decode_tps": timing["decode_tps"],
        "chunks": len(stamps),
        "text": "".join(parts),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "output_tokens": usage.completion_tokens if usage else len(stamps),
        "finish_reason": finish,
        "engine_ttft_s": eng("engine_ttft_s"),
        "engine_queue_s": eng("queue_s"),
        "engine_prefill_s": eng("prefill_s"),
        "engine_e2e_s": eng("e2e_s"),
        "engine_tpot_s": eng("tpot_s"),
        "transport_ttft_s": timing["ttft_s"] - eng("engine_ttft_s"),
        "transport_e2e_s": (t_end - t_send) - eng("e2e_s"),
    }


def measure_http(base_url: str, prompts: Sequence, concurrency: int, max_tokens: int, repeats: int = 1,
                 warmup: int = 1, temperature: float = 0.0, seed: int = 0, ignore_eos: bool = True) -> dict:
    """``run_sweep`` measure dict: ``concurrency`` streaming requests sent together, per repeat.

    Requests start together (a thread barrier) and the server queues them, so
    later requests' TTFT includes waiting for earlier ones; the engine's TTFT
    includes the same wait, leaving ``transport_ttft_s`` as the HTTP cost.

    Returns:
        ``{"requests": rows (see :func:`stream_chat`) with ``repeat``,
        ``request_id``, ``concurrency``, ``t_start_s`` (send time after the
        repeat's first send); "wall_s": first send to last completion, summed
        over repeats; "warmup_s"; "extra": ``transport_ttft_s_p50``,
        ``engine_ttft_s_p50``, ``engine_queue_s_p50``}``.

    Raises:
        ParameterError: ``concurrency`` < 1 or no prompts.
    """
    check_int("concurrency", concurrency, lo=1)
    if not prompts:
        raise ParameterError("prompts: need at least one prompt")
    client = openai_client(base_url)
    t = time.perf_counter()
    for _ in range(warmup):
        stream_chat(client, prompts[0], max_tokens, temperature, seed, ignore_eos)
    warmup_s = time.perf_counter() - t
    rows, wall = [], 0.0
    for r in range(repeats):
        barrier = threading.Barrier(concurrency)
        out: list = [None] * concurrency

        def one(i):
            barrier.wait()
            try:
                out[i] = stream_chat(client, prompts[i % len(prompts)], max_tokens, temperature, seed + r, ignore_eos)
            except Exception as exc:
                out[i] = {"error": f"{type(exc).__name__}: {exc}"}

        threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        ok = [o for o in out if "error" not in o]
        if len(ok) < len(out):
            raise RuntimeError(next(o["error"] for o in out if "error" in o))
        t0 = min(o["t_send"] for o in ok)
        t1 = max(o["t_send"] + o["e2e_s"] for o in ok)
        wall += t1 - t0
        for i, o in enumerate(out):
            rows.append(dict(o, repeat=r, request_id=i, concurrency=concurrency, t_start_s=o["t_send"] - t0,
                             max_new_tokens=max_tokens, temperature=temperature))
    extra = {f"{col}_p50": metrics.percentiles([q[col] for q in rows], (50,))["p50"]
             for col in ("transport_ttft_s", "engine_ttft_s", "engine_queue_s")}
    return {"requests": rows, "wall_s": wall, "warmup_s": warmup_s, "extra": extra}
