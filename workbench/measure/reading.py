"""What a reader sees: reader metrics from a stream's display updates (English and Chinese).

Input is what reaches the screen: display updates ``(t, text)`` (perf_counter seconds, the text each one
adds). They come from a token timeline pushed through the display path of :mod:`workbench.measure.detokenize`
at a display granularity (:func:`display_updates`), or straight from an HTTP client's chunk arrivals.

Per stream (:func:`reader_metrics`; the columns are in :data:`workbench.stats.metrics.COLUMNS`):

- ``first_word_s``: submit to the first update showing a complete word: a CJK character counts at once;
  a word of letters or digits once a character that cannot continue it follows, or the stream ended
  (units as :func:`workbench.measure.quality.units` splits them).
- ``first_sentence_s``: submit to the first update showing a complete sentence: a unit followed by a
  sentence end (``. ! ? …`` followed by white space, or ``。！？``), or by the end of the stream.
- ``stalls``: gaps between consecutive updates longer than ``stall_s`` (250 ms by default: past it a
  reader notices a pause in the text); ``longest_stall_s``: the longest gap between updates.
- ``delivered_units_per_s``: words (or CJK characters) delivered per second after the first update,
  ``(units - units of the first update) / (last update - first update)``;
  ``reading_margin``: that rate over the stated reading speed (> 1: text arrives faster than it is read);
  ``reader_wait_s``: total time a reader who starts at the first update and reads at that speed waits
  for text that has not arrived.

Reading speeds (:data:`READING_SPEEDS`, each with its source): English silent reading of non-fiction,
238 words per minute (Brysbaert 2019, a meta-analysis of 190 studies); Chinese, 255 characters per minute
(IReST, Trauzettel-Klosinski et al. 2012, standardised texts read aloud by native adults). A text counts
as Chinese when most of its units are CJK characters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from workbench.checks import check_float
from workbench.measure.detokenize import DisplayBuffer, Granularity, IncrementalDetokenizer
from workbench.measure.quality import is_cjk, units

STALL_S = 0.25


@dataclass(frozen=True)
class ReadingSpeed:
    """A reading speed: ``per_minute`` units (words, or characters for Chinese) and where it comes from."""

    language: str
    per_minute: float
    unit: str
    source: str


READING_SPEEDS = {
    "en": ReadingSpeed("en", 238.0, "words", "Brysbaert, M. (2019). How many words do we read per minute? A review "
                       "and meta-analysis of reading rate. Journal of Memory and Language 109, 104047 "
                       "(silent reading, English non-fiction: 238 words/min)."),
    "zh": ReadingSpeed("zh", 255.0, "characters", "Trauzettel-Klosinski, S., Dietz, K. et al. (2012). Standardized "
                       "assessment of reading performance: the new International Reading Speed Texts IReST. "
                       "Investigative Ophthalmology & Visual Science 53(9), 5452-5461 (Chinese: 255 characters/min)."),
}

_SENTENCE_END = re.compile(r"[.!?…](?=\s)|[。！？]")


def language_of(text: str) -> str:
    """``zh`` when most units of ``text`` are CJK characters, else ``en``."""
    u = units(text)
    cjk = sum(1 for x in u if len(x) == 1 and is_cjk(x))
    return "zh" if u and cjk * 2 > len(u) else "en"


def _has_word(text: str, ended: bool) -> bool:
    u = units(text)
    if not u:
        return False
    if ended or len(u) > 1 or is_cjk(u[0][0]):
        return True
    return not re.search(r"[^\W_]$", text)  # the one word is followed by something that ends it


def _has_sentence(text: str, ended: bool) -> bool:
    if not units(text):
        return False
    if ended:
        return True
    return any(units(text[:m.start()]) for m in _SENTENCE_END.finditer(text))


def reader_metrics(updates: Sequence[tuple[float, str]], t_submit: float, stall_s: float = STALL_S,
                   speed: ReadingSpeed | None = None) -> dict:
    """Reader metrics of one stream (see the module docstring).

    Args:
        updates: ``(t, text)`` display updates in order (empty texts are ignored).
        t_submit: when the request was sent (same clock).
        stall_s: a gap between updates longer than this is a stall.
        speed: the reading speed; default by the text's language (:data:`READING_SPEEDS`).

    Returns:
        ``first_word_s``, ``first_sentence_s``, ``stalls``, ``longest_stall_s``, ``units``,
        ``delivered_units_per_s``, ``reading_margin``, ``reader_wait_s``, ``language``,
        ``reading_speed_per_min``, ``reading_speed_unit``, ``reading_speed_source``. NaN where undefined.
    """
    check_float("stall_s", stall_s, lo=0)
    ups = [(float(t), s) for t, s in updates if s]
    nan = float("nan")
    text = "".join(s for _, s in ups)
    speed = speed or READING_SPEEDS[language_of(text)]
    out = {"first_word_s": nan, "first_sentence_s": nan, "stalls": 0, "longest_stall_s": nan, "units": len(units(text)),
           "delivered_units_per_s": nan, "reading_margin": nan, "reader_wait_s": nan, "language": speed.language,
           "reading_speed_per_min": speed.per_minute, "reading_speed_unit": speed.unit,
           "reading_speed_source": speed.source}
    if not ups:
        return out
    shown = ""
    for i, (t, s) in enumerate(ups):
        shown += s
        ended = i == len(ups) - 1
        if math.isnan(out["first_word_s"]) and _has_word(shown, ended):
            out["first_word_s"] = t - t_submit
        if math.isnan(out["first_sentence_s"]) and _has_sentence(shown, ended):
            out["first_sentence_s"] = t - t_submit
            break
    gaps = [b[0] - a[0] for a, b in zip(ups, ups[1:])]
    out["stalls"] = sum(1 for g in gaps if g > stall_s)
    out["longest_stall_s"] = max(gaps) if gaps else nan
    rate = speed.per_minute / 60.0
    # units shown after each update (a word split across updates counts once, where it ends)
    cum, shown = [], ""
    for _, s in ups:
        shown += s
        cum.append(len(units(shown)))
    counts = [cum[0]] + [b - a for a, b in zip(cum, cum[1:])]
    span = ups[-1][0] - ups[0][0]
    later = cum[-1] - cum[0]
    out["delivered_units_per_s"] = later / span if span > 0 else (math.inf if later else nan)
    out["reading_margin"] = out["delivered_units_per_s"] / rate if rate > 0 else nan
    free, wait = ups[0][0], 0.0  # when the reader finishes what has been shown so far
    for (t, _), n in zip(ups, counts):
        if t > free:  # everything shown is read: the reader waits for this update
            wait += t - free
            free = t
        free += n / rate
    out["reader_wait_s"] = wait
    return out


def display_updates(tokenizer, token_ids: Sequence[int], stamps: Sequence[float], granularity="token",
                    t0: float | None = None, eos_ids=()) -> list[tuple[float, str]]:
    """The display updates of a token timeline at one granularity.

    The ids go through :class:`~workbench.measure.detokenize.IncrementalDetokenizer` and a
    :class:`~workbench.measure.detokenize.DisplayBuffer` exactly as a server's display path does (an id in
    ``eos_ids`` ends the stream); the updates' texts concatenate to the final decode.
    """
    detok = IncrementalDetokenizer(tokenizer)
    buf = DisplayBuffer(Granularity.parse(granularity), t0)
    eos = set(eos_ids)
    t = t0 or 0.0
    ended = False
    for tok, t in zip(token_ids, stamps):
        piece = detok.push(tok)
        buf.feed(piece, t)
        if tok in eos:
            buf.close(t, detok.finish())
            ended = True
            break
    if not ended:
        buf.close(t, detok.finish(cut=True))
    return [(u.t, u.text) for u in buf.updates]


def reader_rows(tokenizer, token_ids: Sequence[int], stamps: Sequence[float], t_submit: float,
                granularities=("token",), eos_ids=(), stall_s: float = STALL_S) -> list[dict]:
    """:func:`reader_metrics` of one token timeline at each display granularity (one dict each, with
    ``granularity`` and ``updates``)."""
    rows = []
    for g in granularities:
        gran = Granularity.parse(g)
        ups = display_updates(tokenizer, token_ids, stamps, gran, t_submit, eos_ids)
        rows.append({"granularity": gran.label, "updates": len(ups), **reader_metrics(ups, t_submit, stall_s)})
    return rows


def chunk_label(granularity) -> str:
    """A display granularity's label when its unit is an HTTP stream's content chunk, not a token: ``chunk``,
    ``N chunks``, ``T ms`` (the same rule, counted in what the server sends)."""
    gran = Granularity.parse(granularity)
    if gran.mode == "token":
        return "chunk"
    if gran.mode == "tokens":
        return f"{int(gran.every)} chunks"
    return gran.label


def chunk_display_updates(chunks: Sequence[tuple[float, str]], granularity="token",
                          t0: float | None = None) -> list[tuple[float, str]]:
    """The display updates of an HTTP stream's content chunks at one granularity.

    Each chunk ``(t, text)`` (arrival stamp, its ``delta.content``) enters a
    :class:`~workbench.measure.detokenize.DisplayBuffer` as one unit, as a token id does in :func:`display_updates`: the
    text is already decoded by the server, and a chunk may carry more than one token (llama.cpp, vLLM with
    ``stream_interval``) or part of one character's tokens, so ``token`` means every chunk and ``N tokens`` every
    N chunks. The updates' texts concatenate to the streamed text.
    """
    buf = DisplayBuffer(Granularity.parse(granularity), t0)
    t = t0 or 0.0
    for t, text in chunks:
        buf.feed(text, t)
    buf.close(t)
    return [(u.t, u.text) for u in buf.updates]


def chunk_reader_rows(chunks: Sequence[tuple[float, str]], t_submit: float, granularities=("token",),
                      stall_s: float = STALL_S) -> list[dict]:
    """:func:`reader_metrics` of one HTTP stream's chunk timeline at each display granularity (one dict each,
    with ``granularity`` labelled in chunks, :func:`chunk_label`, and ``updates``); see
    :func:`chunk_display_updates` for what differs from a token timeline."""
    rows = []
    for g in granularities:
        ups = chunk_display_updates(chunks, g, t_submit)
        rows.append({"granularity": chunk_label(g), "updates": len(ups), **reader_metrics(ups, t_submit, stall_s)})
    return rows
