"""Streaming one request: its text as it arrives, with live counters, from the same measured ``generate``.

:func:`stream_generate` yields :class:`StreamEvent` s (text pieces from ``transformers.TextIteratorStreamer``, the
token count and TTFT so far) while :func:`workbench.measure.generation.generate_measured` times every token id in a
background thread; the last event carries the request's record. The streamed text, concatenated, equals the final
decode (docs/design.md section 4).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

from workbench.measure.generation import GenerationSettings, criteria_classes, generate_measured


@dataclass
class StreamEvent:
    """One display update of :func:`stream_generate`.

    Attributes:
        text: new text since the previous event (concatenation of all events'
            ``text`` equals the final decode).
        elapsed_s: seconds since submission.
        output_tokens: token ids generated so far.
        ttft_s: time to first token once known, else None.
        record: the request's final record on the last event, else None.
    """

    text: str
    elapsed_s: float
    output_tokens: int
    ttft_s: float | None
    record: dict | None = None


def stream_generate(
    loaded, prompt, settings: GenerationSettings, chat: bool = True, system_prompt: str | None = None,
    on_step=None, **kwargs
) -> Iterator[StreamEvent]:
    """Generate one request and yield its text as it arrives, with live counters.

    Display text comes from ``transformers.TextIteratorStreamer`` (word-level
    pieces; a piece is held while it would end in a split multi-byte character),
    fed from the same ``generate`` call that the :class:`TokenTimer` measures.
    Generation runs in a background thread; the last event carries the record.

    ``kwargs`` (e.g. ``logits_processor``) go to :func:`generate_measured`; ``on_step(ids, t)``, when
    given, is also called at every generated step (from the generation thread), as there.

    Closing the generator (``close()``, a ``break``, garbage collection) stops the generation at its
    next step through a stopping criterion, so an abandoned stream does not keep decoding.

    Yields:
        :class:`StreamEvent`; the last one has ``record`` set and empty ``text``.
    """
    from transformers import StoppingCriteriaList, TextIteratorStreamer

    text_streamer = TextIteratorStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    counter = {"n": 0, "t_first": None}
    caller_on_step = on_step

    def on_step(ids, t):
        counter["n"] += 1
        if counter["t_first"] is None:
            counter["t_first"] = t
        if caller_on_step is not None:
            caller_on_step(ids, t)

    result: dict = {}
    t0 = time.perf_counter()
    closed = threading.Event()
    stops = list(kwargs.pop("stopping_criteria", None) or []) + [criteria_classes()[0](closed)]

    def work():
        try:
            result["batch"] = generate_measured(
                loaded, [prompt], settings, chat=chat, system_prompt=system_prompt,
                extra_streamer=text_streamer, on_step=on_step, stopping_criteria=StoppingCriteriaList(stops),
                **kwargs,
            )
        except BaseException as exc:  # surfaced in the caller's thread below
            result["error"] = exc
            text_streamer.end()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    held = None  # one piece behind, so a character cut by max_new_tokens can be dropped from the last one
    try:
        for piece in text_streamer:
            if not piece:
                continue
            if held is not None:
                yield held
            t_first = counter["t_first"]
            held = StreamEvent(piece, time.perf_counter() - t0, counter["n"], None if t_first is None else t_first - t0)
    finally:  # the consumer stopped reading (close(), break, garbage collection): stop decoding too
        closed.set()
        thread.join()
    if "error" in result:
        raise result["error"]
    rec = result["batch"].records[0]
    if held is not None:
        held.text = held.text.rstrip("\ufffd") if rec["finish_reason"] == "length" else held.text
        yield held
    yield StreamEvent("", time.perf_counter() - t0, rec["output_tokens"], rec["ttft_s"], record=rec)
