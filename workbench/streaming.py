"""Streaming anatomy and long-output strategies: what the user sees, and when.

Two concerns, both measured on the real model through
:func:`workbench.generation.generate_measured` (never a hand-written decode loop):

1. **Display of a stream.** :class:`IncrementalDetokenizer` turns generated
   token ids into text one id at a time (the windowed prefix/read-offset method
   of vLLM's ``detokenize_incrementally``): a piece is held while the decoded text
   ends in U+FFFD (a multi-byte character split across ids), so no replacement
   character ever reaches the screen; :meth:`IncrementalDetokenizer.finish`
   returns whatever the final ``tokenizer.decode`` has beyond what was shown,
   so the pieces concatenate to the final decode exactly.
   :class:`DisplayBuffer` delivers those pieces at a :class:`Granularity`:
   every token, every N tokens, or every T milliseconds (flushed on the first
   token at least T after the previous update, as a server pushing from its
   decode loop does). It counts updates and each token's display lag (update
   time minus the token's own stamp). :class:`StreamTap` feeds a whole batch
   from ``generate_measured``'s ``on_step`` hook and times its own work (the
   time the display path adds to each decode step).
   :func:`measure_stream` and :func:`measure_granularity` return the measure
   dicts that ``workbench.sweeps.run_sweep`` expects.

2. **Long outputs.** Three ways to spend one token budget on a long text
   (:func:`run_long_output`): ``one_shot`` (one request); ``outline_batch``
   (an outline of N sections, then every section generated together as one
   batch, merged in outline order); ``outline_sequential`` (outline, then the
   sections one after another, each prompt carrying a short extractive summary
   of the previous section: consistency bought with time). Quality proxies on
   the merged text, the same for every strategy: :func:`split_sections`
   (headings found in the text), :func:`section_coverage` (requested sections
   present with a body) and :func:`cross_section_repetition` (share of a
   section's word 3-grams, or CJK character 3-grams, that appear in another
   section). :func:`parse_outline` reads numbered (``1.``, ``1)``, ``1、``),
   bulleted (``-``, ``*``, ``•``) and Chinese-numbered (``一、``, ``（一）``,
   ``第一部分``) outlines and copes with fewer sections than asked.

Notebook configs: :class:`StreamingConfig` (``04_streaming_anatomy``) and
:class:`LongOutputConfig` (``07_long_output``), validated where built.

Figures (plotly, house template): :func:`itl_histogram_figure`,
:func:`itl_position_figure`, :func:`perceived_latency_figure`,
:func:`timeline_figure`, :func:`granularity_figure`, :func:`long_output_figure`.

Measurements return ``run_sweep`` measure dicts; only the configs use
``workbench.sweeps`` (their base class), and nothing here writes files.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from .errors import ParameterError
from .generation import GenerationSettings, generate_measured
from .sweeps import SweepConfig

REPLACEMENT_CHAR = "\ufffd"


# --------------------------------------------------------------------------- detokeniser


class IncrementalDetokenizer:
    """Token ids in, display text out, one id at a time, never a split character.

    Method (vLLM ``detokenize_incrementally``): decode the window
    ``ids[prefix_offset:]`` and the window ``ids[prefix_offset:read_offset]``;
    the new text is the difference. Decoding both windows from the same start
    keeps tokenisers that drop a leading space at a window start (SentencePiece)
    correct. Text is held while it ends in U+FFFD.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        skip_special_tokens: as in ``tokenizer.decode`` (EOS shows no text).

    Attributes:
        ids: every id pushed so far.
        emitted: the text returned so far (their concatenation).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self.mismatch = False

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one id; return the text it makes displayable ("" while held)."""
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            piece = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.emitted += piece
            return piece
        return ""

    def finish(self, cut: bool = False) -> str:
        """Return the rest of the final decode (held bytes, clean-ups).

        Args:
            cut: the stream was cut by the length limit; a character split by
                the cut (a trailing U+FFFD) is dropped, as
                :mod:`workbench.generation` drops it from the record's text.

        After this, ``emitted == tokenizer.decode(ids, skip_special_tokens=...)``
        (minus that trailing U+FFFD when ``cut``) unless the tokenizer rewrote
        text already shown (``mismatch`` is then True; not seen with byte-level
        BPE tokenizers).
        """
        final = self._decode(self.ids)
        if cut:
            final = final.rstrip(REPLACEMENT_CHAR)
        if final.startswith(self.emitted):
            tail = final[len(self.emitted) :]
        else:  # cannot retract shown text; report it
            self.mismatch = True
            tail = ""
        self.emitted += tail
        self.prefix_offset = self.read_offset = len(self.ids)
        return tail


# --------------------------------------------------------------------------- granularity


@dataclass(frozen=True)
class Granularity:
    """How often the display is updated.

    Attributes:
        mode: ``token`` (every token that adds text), ``tokens`` (every
            ``every`` generated tokens) or ``ms`` (first token at least
            ``every`` milliseconds after the previous update).
        every: N for ``tokens``, T in milliseconds for ``ms``; 1 for ``token``.
    """

    mode: str = "token"
    every: float = 1

    def __post_init__(self):
        if self.mode not in ("token", "tokens", "ms"):
            raise ParameterError(f"granularity: mode must be token, tokens or ms (got {self.mode!r})")
        if not (isinstance(self.every, (int, float)) and self.every > 0 and math.isfinite(self.every)):
            raise ParameterError(f"granularity: interval must be a number > 0 (got {self.every!r})")
        if self.mode == "tokens" and int(self.every) != self.every:
            raise ParameterError(f"granularity: token count must be an integer (got {self.every!r})")

    @classmethod
    def parse(cls, spec: "str | Granularity") -> "Granularity":
        """``"token"``, ``"4 tokens"`` / ``"4tok"``, ``"100 ms"`` -> :class:`Granularity`.

        Raises:
            ParameterError: anything else.
        """
        if isinstance(spec, Granularity):
            return spec
        s = str(spec).strip().lower()
        if s in ("token", "1 token", "every token"):
            return cls("token", 1)
        m = re.fullmatch(r"(?:every\s+)?(\d+)\s*(tokens?|tok)", s)
        if m:
            n = int(m.group(1))
            return cls("token", 1) if n == 1 else cls("tokens", n)
        m = re.fullmatch(r"(?:every\s+)?(\d+(?:\.\d+)?)\s*ms", s)
        if m:
            return cls("ms", float(m.group(1)))
        raise ParameterError(f"granularity: use 'token', 'N tokens' or 'T ms' (got {spec!r})")

    @property
    def label(self) -> str:
        if self.mode == "token":
            return "token"
        if self.mode == "tokens":
            return f"{int(self.every)} tokens"
        return f"{self.every:g} ms"


@dataclass
class Update:
    """One display update: when (perf_counter s), what text, how many tokens it covers."""

    t: float
    text: str
    tokens: int


class DisplayBuffer:
    """Collects displayable pieces per token and releases them at a granularity.

    Call :meth:`feed` once per generated token (with the detokeniser's piece,
    possibly ""), then :meth:`close` once. Each token's display lag is the time
    of the update that first shows its text minus the token's own stamp.

    Args:
        granularity: a :class:`Granularity` or its string form.
        t0: clock origin for ``ms`` mode (e.g. the request's submit time):
            the first token flushes at once when it arrives at least T after
            ``t0``. Default: the first token's stamp.
    """

    def __init__(self, granularity="token", t0: float | None = None):
        self.granularity = Granularity.parse(granularity)
        self.t_last = t0
        self.pending = ""
        self.pending_stamps: list[float] = []
        self.updates: list[Update] = []
        self.lags: list[float] = []
        self.n_tokens = 0
        self.closed = False

    def _due(self, t: float) -> bool:
        g = self.granularity
        if g.mode == "token":
            return True
        if g.mode == "tokens":
            return len(self.pending_stamps) >= g.every
        return (t - self.t_last) * 1000.0 >= g.every

    def _flush(self, t: float) -> str:
        text = self.pending
        self.updates.append(Update(t, text, len(self.pending_stamps)))
        self.lags.extend(t - s for s in self.pending_stamps)
        self.pending, self.pending_stamps, self.t_last = "", [], t
        return text

    def feed(self, piece: str, t: float) -> str | None:
        """Add one token's piece stamped ``t``; return the text to show now, or None."""
        if self.t_last is None:
            self.t_last = t
        self.n_tokens += 1
        self.pending += piece
        self.pending_stamps.append(t)
        if self.pending and self._due(t):
            return self._flush(t)
        return None

    def close(self, t: float, tail: str = "") -> str | None:
        """End of stream at ``t``: show everything still held (plus ``tail``)."""
        self.closed = True
        self.pending += tail
        if self.pending:
            return self._flush(t)
        if self.pending_stamps:  # tokens with no text (EOS): shown as "nothing" now
            self.lags.extend(t - s for s in self.pending_stamps)
            self.pending_stamps = []
        return None

    @property
    def text(self) -> str:
        return "".join(u.text for u in self.updates)

    def summary(self, t_submit: float | None = None) -> dict:
        """Counts and lags (seconds) for one stream.

        Returns:
            ``updates``, ``tokens_per_update``, ``display_lag_mean_s``,
            ``display_lag_p90_s``, ``display_lag_max_s`` and, when ``t_submit``
            is given, ``first_display_s`` (submit to first update).
        """
        import numpy as np

        lags = np.asarray(self.lags, dtype=float)
        out = {
            "granularity": self.granularity.label,
            "updates": len(self.updates),
            "tokens_per_update": self.n_tokens / len(self.updates) if self.updates else float("nan"),
            "display_lag_mean_s": float(lags.mean()) if lags.size else float("nan"),
            "display_lag_p90_s": float(np.percentile(lags, 90)) if lags.size else float("nan"),
            "display_lag_max_s": float(lags.max()) if lags.size else float("nan"),
        }
        if t_submit is not None:
            out["first_display_s"] = self.updates[0].t - t_submit if self.updates else float("nan")
        return out


def eos_token_ids(loaded) -> set[int]:
    """The ids that end a request (the model's generation config, else the tokenizer's)."""
    eos = loaded.model.generation_config.eos_token_id
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}


class StreamTap:
    """``on_step`` hook for :func:`generate_measured`: per-row detokenising and display buffers.

    A row stops being fed after its first EOS id (``generate`` pads finished
    rows). The tap times its own work with ``perf_counter``: ``detok_s[row]``
    and ``buffer_s[row][label]`` are the seconds added to that row's decode
    steps by the display path.

    Args:
        tokenizer: the model's tokenizer.
        batch: number of rows.
        granularities: display granularities to run side by side.
        eos_ids: ids that end a row.
        t0: clock origin for ``ms`` buffers (the batch's submit time), or None.
        on_update: optional ``callable(row, label, text, t)`` per display update.
    """

    def __init__(self, tokenizer, batch: int, granularities=("token",), eos_ids=(), t0=None, on_update=None):
        labels = [Granularity.parse(g) for g in granularities]
        self.labels = [g.label for g in labels]
        self.detok = [IncrementalDetokenizer(tokenizer) for _ in range(batch)]
        self.buffers = [{g.label: DisplayBuffer(g, t0) for g in labels} for _ in range(batch)]
        self.eos_ids = set(eos_ids)
        self.done = [False] * batch
        self.on_update = on_update
        self.detok_s = [0.0] * batch
        self.buffer_s = [{lab: 0.0 for lab in self.labels} for _ in range(batch)]
        self.steps = 0

    def __call__(self, ids, t: float) -> None:
        self.steps += 1
        for row, tid in enumerate(ids.tolist()):
            if self.done[row]:
                continue
            a = time.perf_counter()
            piece = self.detok[row].push(tid)
            b = time.perf_counter()
            self.detok_s[row] += b - a
            eos = tid in self.eos_ids
            tail = self.detok[row].finish() if eos else ""
            for lab, buf in self.buffers[row].items():
                c = time.perf_counter()
                out = buf.feed(piece, t)
                if eos:
                    out = (out or "") + (buf.close(t, tail) or "") or None
                self.buffer_s[row][lab] += time.perf_counter() - c
                if out and self.on_update is not None:
                    self.on_update(row, lab, out, t)
            if eos:
                self.done[row] = True

    def close(self, t: float | None = None) -> None:
        """Flush rows that ended by length (call after ``generate`` returns)."""
        t = time.perf_counter() if t is None else t
        for row, det in enumerate(self.detok):
            if self.done[row]:
                continue
            tail = det.finish(cut=True)
            for lab, buf in self.buffers[row].items():
                out = buf.close(t, tail)
                if out and self.on_update is not None:
                    self.on_update(row, lab, out, t)
            self.done[row] = True

    def row_summary(self, row: int, label: str, t_submit: float | None = None) -> dict:
        """Display figures of one row at one granularity (see :meth:`DisplayBuffer.summary`)."""
        buf = self.buffers[row][label]
        out = buf.summary(t_submit)
        n = max(buf.n_tokens, 1)
        out["handler_s_per_token"] = (self.detok_s[row] + self.buffer_s[row][label]) / n
        out["display_text"] = buf.text
        return out


# --------------------------------------------------------------------------- measurements


def _percentile(values, q: float) -> float:
    import numpy as np

    v = np.asarray(list(values), dtype=float)
    return float(np.percentile(v, q)) if v.size else float("nan")


def _warm_up(loaded, prompts, settings, warmup: int, **kwargs) -> float:
    """``warmup`` untimed batches of the same prompts with at most 4 new tokens; returns their seconds."""
    t = time.perf_counter()
    warm = replace(settings, max_new_tokens=min(4, settings.max_new_tokens), min_new_tokens=0)
    for _ in range(warmup):
        generate_measured(loaded, prompts, warm, **kwargs)
    return time.perf_counter() - t


def _run_tapped(loaded, prompts, settings, granularities, **kwargs):
    """One ``generate_measured`` batch with a :class:`StreamTap` attached."""
    tap_box: dict = {}

    def on_step(ids, t):
        if "tap" not in tap_box:  # built lazily; its ms-mode clock origin is t0, read just before the call
            tap_box["tap"] = StreamTap(
                loaded.tokenizer, len(prompts), granularities, eos_token_ids(loaded), t0=tap_box.get("t0")
            )
        tap_box["tap"](ids, t)

    tap_box["t0"] = time.perf_counter()
    batch = generate_measured(loaded, prompts, settings, on_step=on_step, **kwargs)
    tap = tap_box.get("tap") or StreamTap(loaded.tokenizer, len(prompts), granularities, eos_token_ids(loaded))
    tap.close(batch.t_submit + batch.wall_s)
    return batch, tap


def measure_stream(
    loaded, prompts: Sequence, settings: GenerationSettings, repeats: int = 1, warmup: int = 1, **kwargs
) -> dict:
    """Measure one batch per repeat, with every-token display attached.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        prompts: the batch's prompts.
        settings: generation settings; repeat ``r`` uses ``seed + r``.
        repeats: timed batches.
        warmup: untimed batches first.
        **kwargs: passed to :func:`generate_measured`.

    Returns:
        ``{"requests": [...], "wall_s": float, "warmup_s": float, "extra": {...}}``:
        one row per request with the generation record, ``repeat``,
        ``batch_size``, ``t_start_s`` (0: all submitted together),
        ``first_display_s`` (submit to first visible text), and
        ``handler_s_per_token``; ``extra`` holds ``itl_p50_s``, ``itl_p99_s``
        and ``itl_jitter`` (p99 / p50) over all requests.
    """
    warmup_s = _warm_up(loaded, prompts, settings, warmup, **kwargs)
    rows, wall, itls = [], 0.0, []
    for r in range(repeats):
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + r), ["token"], **kwargs)
        wall += batch.wall_s
        for rec in batch.records:
            s = tap.row_summary(rec["request_id"], "token", batch.t_submit)
            row = dict(rec, repeat=r, batch_size=len(prompts), t_start_s=0.0)
            row["first_display_s"] = s["first_display_s"]
            row["handler_s_per_token"] = s["handler_s_per_token"]
            rows.append(row)
            itls.extend(rec["itl_s"])
    p50, p99 = _percentile(itls, 50), _percentile(itls, 99)
    extra = {"itl_p50_s": p50, "itl_p99_s": p99, "itl_jitter": p99 / p50 if p50 and p50 > 0 else float("nan")}
    return {"requests": rows, "wall_s": wall, "warmup_s": warmup_s, "extra": extra}


def measure_granularity(
    loaded,
    prompts: Sequence,
    settings: GenerationSettings,
    granularities: Sequence = ("token", "4 tokens", "100 ms"),
    repeats: int = 1,
    warmup: int = 1,
) -> dict[str, dict]:
    """Run the same batches once with every granularity attached side by side.

    One ``generate`` call per repeat feeds a :class:`DisplayBuffer` per
    granularity, so every granularity sees the same token stamps; the handler
    time of each is measured separately.

    Returns:
        ``{label: measure dict}`` (see :func:`measure_stream`), each request row
        extended with ``granularity``, ``updates``, ``tokens_per_update``,
        ``display_lag_mean_s``, ``display_lag_p90_s``, ``display_lag_max_s``,
        ``first_display_s``, ``added_first_display_s`` (first display minus
        TTFT), ``handler_s_per_token`` and ``text_equal`` (the delivered text
        concatenates to the final decode). ``extra`` holds the medians of those.

    Raises:
        ParameterError: an unreadable granularity.
    """
    labels = [Granularity.parse(g).label for g in granularities]
    if len(set(labels)) != len(labels):
        raise ParameterError(f"granularities: must be distinct (got {list(granularities)!r})")
    warmup_s = _warm_up(loaded, prompts, settings, warmup)
    out = {lab: {"requests": [], "wall_s": 0.0, "warmup_s": warmup_s} for lab in labels}
    for r in range(repeats):
        batch, tap = _run_tapped(loaded, prompts, replace(settings, seed=settings.seed + r), labels)
        for lab in labels:
            out[lab]["wall_s"] += batch.wall_s
            for rec in batch.records:
                s = tap.row_summary(rec["request_id"], lab, batch.t_submit)
                text = s.pop("display_text")
                row = dict(rec, repeat=r, batch_size=len(prompts), t_start_s=0.0, **s)
                row["added_first_display_s"] = s["first_display_s"] - rec["ttft_s"]
                row["text_equal"] = text == rec["text"]
                out[lab]["requests"].append(row)
    cols = ("updates", "tokens_per_update", "display_lag_mean_s", "display_lag_p90_s",
            "added_first_display_s", "handler_s_per_token")
    for lab in labels:
        reqs = out[lab]["requests"]
        out[lab]["extra"] = {f"median_{c}": _percentile([q[c] for q in reqs], 50) for c in cols}
        out[lab]["extra"]["text_equal"] = all(q["text_equal"] for q in reqs)
    return out


def granularity_measure(loaded, prompts, settings, granularities, repeats: int = 1, warmup: int = 1):
    """A ``run_sweep`` measure for points ``{"granularity": label}``.

    The first call runs :func:`measure_granularity` once for every granularity
    (one ``generate`` per repeat, all buffers attached); later calls reuse it,
    and a fully resumed sweep runs nothing.
    """
    cache: dict = {}

    def measure(point):
        if not cache:
            cache.update(measure_granularity(loaded, prompts, settings, granularities, repeats, warmup))
        return cache[Granularity.parse(point["granularity"]).label]

    return measure


# --------------------------------------------------------------------------- long outputs

_CN_NUM = "一二三四五六七八九十百"
_OUTLINE_PATTERNS = [
    # (kind, regex): the title is group "t"
    ("number", re.compile(r"^\s{0,3}(?:#{1,6}\s*)?(?:\*\*)?(?:section|part|chapter)?\s*\d{1,2}\s*[.)、:：．]\s*(?P<t>.+)$", re.I)),
    ("cn_number", re.compile(rf"^\s{{0,3}}(?:#{{1,6}}\s*)?(?:\*\*)?(?:第[{_CN_NUM}\d]+\s*(?:部分|章|节|段|部|篇)?\s*[、:：.．]?|[（(][{_CN_NUM}]+[)）]|[{_CN_NUM}]+\s*[、.．:：])\s*(?P<t>.+)$")),
    ("heading", re.compile(r"^\s{0,3}#{1,6}\s+(?P<t>.+)$")),
    ("bullet", re.compile(r"^\s{0,3}[-*•·–]\s+(?P<t>.+)$")),
]


def _clean_body(t: str) -> str:
    """Strip a section's text, and a character cut in half by the length limit (a trailing U+FFFD)."""
    return t.strip().rstrip(REPLACEMENT_CHAR).rstrip()


def _clean_title(t: str) -> str:
    t = re.sub(r"\*\*|__", "", t).rstrip(REPLACEMENT_CHAR).strip()
    t = t.strip(" :：-–—.").strip()
    return t


def parse_outline(text: str, n_sections: int | None = None) -> list[str]:
    """Section titles from a model-written outline.

    Reads numbered (``1.``, ``1)``, ``1、``, ``Section 1:``), Chinese-numbered
    (``一、``, ``（一）``, ``第一部分：``), markdown-heading and bulleted
    (``-``, ``*``, ``•``) lines. The first kind found in that priority order
    wins, so sub-bullets under numbered items are ignored; lines indented more
    than three spaces are sub-items. Duplicates are dropped.

    Args:
        text: the outline as generated.
        n_sections: keep at most this many (a model may return fewer; the
            caller gets what is there).

    Returns:
        Titles in order (possibly fewer than ``n_sections``, possibly empty).
    """
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    for kind, pat in _OUTLINE_PATTERNS:
        titles, seen = [], set()
        for ln in lines:
            m = pat.match(ln)
            if not m:
                continue
            t = _clean_title(m.group("t"))
            if t and t.lower() not in seen:
                seen.add(t.lower())
                titles.append(t)
        if titles:
            return titles[:n_sections] if n_sections else titles
    return []


_HEADING = re.compile(r"^\s{0,3}(?:#{1,6}\s+(?P<h1>.+)|\*\*(?P<h2>[^*]{1,120})\*\*:?\s*$)")


def split_sections(text: str) -> list[tuple[str, str]]:
    """Split a long text into ``(heading, body)`` pairs.

    Headings are markdown ``#`` lines and whole-line ``**bold**`` lines; only
    when the text has none of those, outline-style numbered / Chinese-numbered
    lines (see :func:`parse_outline`) of at most 80 characters count instead,
    so a numbered list inside a headed section stays in its body. Text before
    the first heading is dropped when a heading exists; with none the whole
    text is one untitled section.
    """
    lines = text.splitlines()

    def heading(ln: str, numbered: bool):
        m = _HEADING.match(ln)
        if m and not numbered:
            return m.group("h1") or m.group("h2")
        if numbered and len(ln.strip()) <= 80:
            for kind, pat in _OUTLINE_PATTERNS[:2]:
                mm = pat.match(ln)
                if mm:
                    return mm.group("t")
        return None

    for numbered in (False, True):
        sections: list[tuple[str, list[str]]] = []
        for ln in lines:
            title = heading(ln, numbered)
            if title is not None and _clean_title(title):
                sections.append((_clean_title(title), []))
            elif sections:
                sections[-1][1].append(ln)
        if sections:
            return [(h, "\n".join(b).strip()) for h, b in sections]
    return [("", text.strip())] if text.strip() else []


_UNIT = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z0-9']+")


def text_units(text: str) -> list[str]:
    """Lower-cased words, with each CJK character its own unit."""
    return [u.lower() for u in _UNIT.findall(text)]


def section_coverage(text: str, n_requested: int, min_body_units: int = 10) -> dict:
    """How many of the requested sections the text delivers.

    A section counts when it has a heading (:func:`split_sections`) and a body
    of at least ``min_body_units`` words / CJK characters.

    Returns:
        ``sections_found`` (headed sections with a body) and ``coverage``
        (``min(found, n_requested) / n_requested``).
    """
    if n_requested < 1:
        raise ParameterError(f"n_requested: must be >= 1 (got {n_requested!r})")
    found = sum(1 for h, b in split_sections(text) if h and len(text_units(b)) >= min_body_units)
    return {"sections_found": found, "coverage": min(found, n_requested) / n_requested}


def cross_section_repetition(bodies: Sequence[str], n: int = 3) -> float:
    """Share of section n-grams (word / CJK-character units) that also occur in another section.

    Averaged over sections that have at least one n-gram; 0.0 with fewer than
    two such sections.
    """
    grams = []
    for b in bodies:
        u = text_units(b)
        grams.append({tuple(u[i : i + n]) for i in range(len(u) - n + 1)})
    grams = [g for g in grams if g]
    if len(grams) < 2:
        return 0.0
    shares = []
    for i, g in enumerate(grams):
        others = set().union(*(h for j, h in enumerate(grams) if j != i))
        shares.append(len(g & others) / len(g))
    return float(sum(shares) / len(shares))


STRATEGIES = ("one_shot", "outline_batch", "outline_sequential")

_PROMPTS = {
    "en": {
        "one_shot": "Write a detailed article titled \"{topic}\" with {n} sections. Start each section with a markdown heading (## Title).",
        "outline": "Write an outline of exactly {n} sections for an article titled \"{topic}\". Reply with a numbered list of section titles only, one per line.",
        "section": "You are writing the article \"{topic}\". Its sections are:\n{outline}\nWrite section {k}, \"{title}\", in full. Write only the text of this section, without a heading.",
        "previous": "\nThe previous section said: {summary}\nContinue from it without repeating it.",
        "fallback": "Part {k}",
    },
    "zh": {
        "one_shot": "写一篇题为《{topic}》的详细文章，分为{n}个部分。每个部分以markdown标题开头（## 标题）。",
        "outline": "为题为《{topic}》的文章写一个恰好{n}个部分的提纲。只用编号列表列出各部分标题，每行一个。",
        "section": "你正在写文章《{topic}》。文章的部分有：\n{outline}\n请完整地写第{k}部分“{title}”。只写这一部分的正文，不要标题。",
        "previous": "\n上一部分写道：{summary}\n请接着写，不要重复。",
        "fallback": "第{k}部分",
    },
}

DEFAULT_TOPICS = {
    "en": "How a city can prepare for a long heat wave",
    "zh": "城市如何应对持续的高温天气",
}


def extractive_summary(text: str, max_units: int = 40) -> str:
    """The first sentences of ``text``, up to about ``max_units`` words / CJK characters."""
    parts = re.split(r"(?<=[.!?。！？])\s*", text.strip())
    out, count = [], 0
    for p in parts:
        if not p:
            continue
        out.append(p)
        count += len(text_units(p))
        if count >= max_units:
            break
    return " ".join(out)[:400]


@dataclass(frozen=True)
class LongOutputPlan:
    """Token split for one budget.

    Attributes:
        budget_tokens: total new-token budget, the same for every strategy.
        n_sections: sections asked for.
        outline_tokens: budget of the outline request.
        section_tokens: budget of each section request
            (``(budget - outline) // n_sections``).
    """

    budget_tokens: int
    n_sections: int
    outline_tokens: int
    section_tokens: int

    @classmethod
    def make(cls, budget_tokens: int, n_sections: int, outline_tokens: int | None = None) -> "LongOutputPlan":
        """Split a budget; the outline gets ``outline_tokens`` (default ~12 per section, at most a quarter).

        Raises:
            ParameterError: a budget too small for the sections.
        """
        if not isinstance(n_sections, int) or n_sections < 1:
            raise ParameterError(f"n_sections: must be an integer >= 1 (got {n_sections!r})")
        if outline_tokens is None:
            outline_tokens = max(8, min(12 * n_sections + 8, budget_tokens // 4))
        section_tokens = (budget_tokens - outline_tokens) // n_sections
        if section_tokens < 8:
            raise ParameterError(
                f"budget_tokens: must leave >= 8 tokens per section after the outline "
                f"(got {budget_tokens} for {n_sections} sections, outline {outline_tokens})"
            )
        return cls(budget_tokens, n_sections, outline_tokens, section_tokens)


@dataclass
class LongOutputResult:
    """What one strategy produced.

    Attributes:
        row: the request row (``ttft_s`` = time to first visible text,
            ``e2e_s`` = ``wall_s``, ``output_tokens`` summed over requests,
            coverage, repetition, throughput, ...).
        text: the merged text, as a reader would get it.
        outline: the outline text ("" for one-shot).
        titles: the section titles used (outline strategies).
        bodies: section bodies in outline order.
    """

    row: dict
    text: str
    outline: str = ""
    titles: list = field(default_factory=list)
    bodies: list = field(default_factory=list)


def _gen(loaded, prompts, settings):
    return generate_measured(loaded, prompts, settings)


def run_long_output(
    loaded,
    strategy: str,
    topic: str,
    plan: LongOutputPlan,
    language: str = "en",
    temperature: float = 0.0,
    seed: int = 0,
    generate: Callable | None = None,
) -> LongOutputResult:
    """Generate one long text with one strategy and measure it.

    Args:
        loaded: :class:`workbench.models.LoadedModel`.
        strategy: one of :data:`STRATEGIES`.
        topic: the article's title.
        plan: :class:`LongOutputPlan` (same budget for every strategy).
        language: ``en`` or ``zh`` (prompt language).
        temperature, seed: sampling settings for every request.
        generate: ``callable(loaded, prompts, settings) -> BatchResult``
            (default :func:`generate_measured`; tests pass a fake).

    Returns:
        :class:`LongOutputResult`. ``row`` has ``strategy``, ``language``,
        ``ttft_s`` (first visible text: the first token of the one-shot answer
        or of the outline), ``first_section_s`` (first token of section body
        text), ``e2e_s`` / ``wall_s``, ``output_tokens`` (all requests),
        ``requests`` (generate calls), ``sections_requested``,
        ``sections_planned`` (outline titles used), ``sections_found``,
        ``coverage``, ``repetition``, ``output_throughput_tps``, ``chars``.

    Raises:
        ParameterError: unknown strategy or language.
    """
    if strategy not in STRATEGIES:
        raise ParameterError(f"strategy: must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    if language not in _PROMPTS:
        raise ParameterError(f"language: must be one of {', '.join(_PROMPTS)} (got {language!r})")
    gen = generate or _gen
    P = _PROMPTS[language]
    n = plan.n_sections

    def settings(tokens, s=seed):
        return GenerationSettings(max_new_tokens=tokens, temperature=temperature, seed=s)

    t0 = time.perf_counter()
    calls = 0
    prompt_tokens = 0
    batch_size = 1
    if strategy == "one_shot":
        b = gen(loaded, [P["one_shot"].format(topic=topic, n=n)], settings(plan.budget_tokens))
        calls = 1
        rec = b.records[0]
        prompt_tokens = rec.get("prompt_tokens", 0)
        text, outline, titles = rec["text"], "", []
        bodies = [body for _, body in split_sections(text)]
        ttft = first_section = (b.t_submit - t0) + rec["ttft_s"]
        tokens = rec["output_tokens"]
    else:
        ob = gen(loaded, [P["outline"].format(topic=topic, n=n)], settings(plan.outline_tokens))
        calls = 1
        orec = ob.records[0]
        prompt_tokens = orec.get("prompt_tokens", 0)
        outline = orec["text"]
        ttft = (ob.t_submit - t0) + orec["ttft_s"]
        tokens = orec["output_tokens"]
        titles = parse_outline(outline, n) or [P["fallback"].format(k=k + 1) for k in range(n)]
        listed = "\n".join(f"{k + 1}. {t}" for k, t in enumerate(titles))
        prompts = [P["section"].format(topic=topic, outline=listed, k=k + 1, title=t) for k, t in enumerate(titles)]
        first_section = None
        bodies = []
        if strategy == "outline_batch":
            sb = gen(loaded, prompts, settings(plan.section_tokens))
            calls += 1
            recs = sorted(sb.records, key=lambda r: r["request_id"])
            batch_size = len(recs)
            prompt_tokens += sum(r.get("prompt_tokens", 0) for r in recs)
            bodies = [_clean_body(r["text"]) for r in recs]
            tokens += sum(r["output_tokens"] for r in recs)
            first_section = (sb.t_submit - t0) + min(r["ttft_s"] for r in recs)
        else:
            for k, p in enumerate(prompts):
                if bodies:
                    p += P["previous"].format(summary=extractive_summary(bodies[-1]))
                sb = gen(loaded, [p], settings(plan.section_tokens, seed + k))
                calls += 1
                r = sb.records[0]
                prompt_tokens += r.get("prompt_tokens", 0)
                bodies.append(_clean_body(r["text"]))
                tokens += r["output_tokens"]
                if first_section is None:
                    first_section = (sb.t_submit - t0) + r["ttft_s"]
        text = "\n\n".join(f"## {t}\n\n{b}" for t, b in zip(titles, bodies))
    wall = time.perf_counter() - t0
    cov = section_coverage(text, n)
    row = {
        "strategy": strategy,
        "language": language,
        "topic": topic,
        "budget_tokens": plan.budget_tokens,
        "outline_tokens": plan.outline_tokens if strategy != "one_shot" else 0,
        "section_tokens": plan.section_tokens if strategy != "one_shot" else plan.budget_tokens,
        "ttft_s": ttft,
        "first_section_s": first_section,
        "e2e_s": wall,
        "wall_s": wall,
        "output_tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "batch_size": batch_size,
        "tpot_s": (wall - ttft) / (tokens - 1) if tokens > 1 else float("nan"),
        "decode_tps": (tokens - 1) / (wall - ttft) if tokens > 1 and wall > ttft else float("nan"),
        "generate_calls": calls,
        "sections_requested": n,
        "sections_planned": len(titles) if strategy != "one_shot" else float("nan"),
        "sections_found": cov["sections_found"],
        "coverage": cov["coverage"],
        "repetition": cross_section_repetition(bodies),
        "output_throughput_tps": tokens / wall if wall > 0 else float("nan"),
        "chars": len(text),
        "temperature": temperature,
        "seed": seed,
    }
    return LongOutputResult(row, text, outline, titles, bodies)


def measure_long_output(
    loaded, strategy: str, language: str, plan: LongOutputPlan, topic: str | None = None,
    repeats: int = 1, temperature: float = 0.0, seed: int = 0, on_text: Callable | None = None, warmup: int = 0,
) -> dict:
    """``run_sweep`` measure dict for one (strategy, language) point.

    Args:
        warmup: untimed 4-token generations of the first prompt before the timed runs.
        on_text: optional ``callable(name, text)`` given each repeat's merged
            text (with outline) to save, e.g. ``results.save_text``.

    Returns:
        ``{"requests": [row per repeat], "wall_s", "extra": {coverage, repetition, ...}}``.
    """
    topic = topic or DEFAULT_TOPICS[language]
    warmup_s = _warm_up(loaded, [topic], GenerationSettings(max_new_tokens=4), warmup) if warmup else 0.0
    rows, wall = [], 0.0
    for r in range(repeats):
        res = run_long_output(loaded, strategy, topic, plan, language, temperature, seed + r)
        row = dict(res.row, repeat=r, request_id=0, itl_s=[])
        rows.append(row)
        wall += res.row["wall_s"]
        if on_text is not None:
            head = f"# {topic}\n\nstrategy: {strategy}, budget {plan.budget_tokens} tokens, repeat {r}\n\n"
            if res.outline:
                head += "## Outline (as generated)\n\n" + res.outline + "\n\n---\n\n"
            on_text(f"texts/long_output_{strategy}_{language}_r{r}.md", head + res.text + "\n")
    keys = ("coverage", "repetition", "sections_found", "first_section_s", "chars")
    extra = {k: _percentile([q[k] for q in rows], 50) for k in keys}
    return {"requests": rows, "wall_s": wall, "warmup_s": warmup_s, "extra": extra}


# --------------------------------------------------------------------------- notebook configs

DEFAULT_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "用三句话介绍长城。",
    "Give three tips for writing clear emails.",
    "What makes a good cup of tea? Answer briefly.",
)


def _int_list(name, values, lo=1):
    if not isinstance(values, (list, tuple)) or not values:
        raise ParameterError(f"{name}: must be a non-empty list (got {values!r})")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ParameterError(f"{name}: every value must be an integer >= {lo} (got {v!r})")


def _int(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ParameterError(f"{name}: must be an integer >= {lo} (got {v!r})")


@dataclass
class StreamingConfig(SweepConfig):
    """Streaming anatomy (notebook ``04_streaming_anatomy``).

    Attributes:
        output_tokens: new tokens per request, one point each (short / medium / long).
        batch_size: requests per ``generate`` call in the anatomy points.
        prompt: the anatomy prompt (a user message).
        ignore_eos: fixed-length anatomy runs (``min_new_tokens = max_new_tokens``).
        temperature, top_p: sampling (0 = greedy).
        granularities: display granularities compared (``token``, ``N tokens``, ``T ms``).
        granularity_tokens: new tokens per request in the granularity / timeline batch.
        timeline_batch: requests in that batch (natural lengths: EOS ends rows).
        http: run the HTTP serving experiment.
        http_concurrency: requests sent together, one point each.
        http_tokens: ``max_tokens`` of each HTTP request (fixed length).
    """

    output_tokens: list = field(default_factory=lambda: [32, 128, 384])
    batch_size: int = 1
    prompt: str = DEFAULT_PROMPTS[0]
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    granularities: list = field(default_factory=lambda: ["token", "4 tokens", "16 tokens", "100 ms", "500 ms"])
    granularity_tokens: int = 64
    timeline_batch: int = 4
    http: bool = True
    http_concurrency: list = field(default_factory=lambda: [1, 4])
    http_tokens: int = 32

    def __post_init__(self):
        super().__post_init__()
        _int_list("output_tokens", self.output_tokens)
        _int("batch_size", self.batch_size, 1)
        _int("granularity_tokens", self.granularity_tokens, 1)
        _int("timeline_batch", self.timeline_batch, 1)
        _int("http_tokens", self.http_tokens, 1)
        _int_list("http_concurrency", self.http_concurrency)
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ParameterError(f"prompt: must be a non-empty string (got {self.prompt!r})")
        if not isinstance(self.granularities, (list, tuple)) or not self.granularities:
            raise ParameterError(f"granularities: must be a non-empty list (got {self.granularities!r})")
        labels = [Granularity.parse(g).label for g in self.granularities]
        if len(set(labels)) != len(labels):
            raise ParameterError(f"granularities: must be distinct (got {self.granularities!r})")
        if max(self.output_tokens) > self.max_context() - 64:
            raise ParameterError(f"output_tokens: must leave room for the prompt in the context (got {self.output_tokens!r})")
        self.settings(1)

    def settings(self, max_new_tokens: int, ignore_eos: bool | None = None) -> GenerationSettings:
        """Generation settings of a point."""
        return GenerationSettings(max_new_tokens=max_new_tokens,
                                  ignore_eos=self.ignore_eos if ignore_eos is None else ignore_eos,
                                  temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def timeline_prompts(self) -> list[str]:
        """``timeline_batch`` prompts cycling through :data:`DEFAULT_PROMPTS` (English and Chinese)."""
        return [DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)] for i in range(self.timeline_batch)]


@dataclass
class LongOutputConfig(SweepConfig):
    """Long-output strategies (notebook ``07_long_output``).

    Attributes:
        budget_tokens: total new-token budget per text, the same for every strategy.
        n_sections: sections asked for.
        outline_tokens: outline budget (0: about 12 per section, at most a quarter of the budget).
        strategies: any of ``one_shot``, ``outline_batch``, ``outline_sequential``.
        languages: ``en`` and / or ``zh``.
        topic_en, topic_zh: the article titles.
        temperature: 0 = greedy.
    """

    budget_tokens: int = 256
    n_sections: int = 4
    outline_tokens: int = 0
    strategies: list = field(default_factory=lambda: list(STRATEGIES))
    languages: list = field(default_factory=lambda: ["en", "zh"])
    topic_en: str = DEFAULT_TOPICS["en"]
    topic_zh: str = DEFAULT_TOPICS["zh"]
    temperature: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        _int("budget_tokens", self.budget_tokens, 16)
        _int("outline_tokens", self.outline_tokens, 0)
        for name, values, allowed in (("strategies", self.strategies, STRATEGIES), ("languages", self.languages, tuple(_PROMPTS))):
            if not isinstance(values, (list, tuple)) or not values or any(v not in allowed for v in values):
                raise ParameterError(f"{name}: must be a non-empty list drawn from {', '.join(allowed)} (got {values!r})")
        GenerationSettings(max_new_tokens=self.budget_tokens, temperature=self.temperature)
        self.plan()

    def plan(self) -> LongOutputPlan:
        """The budget split (raises ParameterError when sections get < 8 tokens)."""
        return LongOutputPlan.make(self.budget_tokens, self.n_sections, self.outline_tokens or None)

    def topic(self, language: str) -> str:
        return {"en": self.topic_en, "zh": self.topic_zh}[language]


# --------------------------------------------------------------------------- figures


def _px():
    import plotly.express as px

    try:  # the house template, when the lead's module is there
        from . import plots  # noqa: F401
    except Exception:
        pass
    return px


def itl_long_form(requests) -> "pandas.DataFrame":
    """One row per inter-token gap: ``position`` (the later token's index, 1-based from the 2nd token) and ``itl_ms``."""
    import pandas as pd

    rows = []
    for _, q in requests.iterrows():
        for i, v in enumerate(list(q["itl_s"])):
            rows.append({"position": i + 1, "itl_ms": 1000 * float(v), "max_new_tokens": q.get("max_new_tokens"),
                         "length": f"{q.get('max_new_tokens')} tokens", "repeat": q.get("repeat", 0),
                         "request_id": q.get("request_id", 0)})
    return pd.DataFrame(rows)


def itl_histogram_figure(requests):
    """Histogram of inter-token latency (ms), one colour per output length."""
    px = _px()
    df = itl_long_form(requests)
    return px.histogram(df, x="itl_ms", color="length", barmode="overlay", nbins=60, opacity=0.6,
                        labels={"itl_ms": "inter-token latency (ms)", "length": "output length"},
                        title="Inter-token latency distribution")


def itl_position_figure(requests):
    """ITL (ms) against token position, one line per output length (first repeat, first request)."""
    px = _px()
    df = itl_long_form(requests)
    df = df[(df["repeat"] == df["repeat"].min()) & (df["request_id"] == df["request_id"].min())]
    return px.line(df, x="position", y="itl_ms", color="length",
                   labels={"position": "token position", "itl_ms": "inter-token latency (ms)", "length": "output length"},
                   title="Inter-token latency vs position in the output")


def perceived_latency_figure(requests):
    """Time to first visible text when streaming vs when waiting for the whole answer, against output tokens."""
    import pandas as pd

    px = _px()
    g = requests.groupby("max_new_tokens", as_index=False).agg(
        output_tokens=("output_tokens", "median"), ttft_s=("ttft_s", "median"),
        first_display_s=("first_display_s", "median"), e2e_s=("e2e_s", "median"))
    long = pd.concat([
        g.assign(mode="streaming (first text at TTFT)", seconds=g["first_display_s"]),
        g.assign(mode="whole answer (text at e2e)", seconds=g["e2e_s"]),
    ])
    return px.line(long, x="output_tokens", y="seconds", color="mode", markers=True,
                   labels={"output_tokens": "output tokens (median)", "seconds": "time until the user sees text (s)"},
                   title="Perceived latency: streaming vs waiting for the whole answer")


def timeline_figure(requests, title: str = "Per-request timeline"):
    """Per-request timeline: a bar from start to first token (TTFT), then a tick per token.

    Args:
        requests: rows with ``request_id``, ``ttft_s``, ``itl_s`` and optional
            ``t_start_s`` (request start relative to the first request's, s).
    """
    import numpy as np
    import plotly.graph_objects as go

    _px()
    fig = go.Figure()
    for _, q in requests.iterrows():
        y = f"req {q['request_id']}"
        start = float(q.get("t_start_s", 0.0) or 0.0)
        first = start + float(q["ttft_s"])
        ticks = first + np.concatenate([[0.0], np.cumsum(np.asarray(list(q["itl_s"]), dtype=float))])
        fig.add_trace(go.Bar(x=[first - start], base=[start], y=[y], orientation="h", name="TTFT",
                             marker_color="#bbbbbb", showlegend=bool(q["request_id"] == requests["request_id"].iloc[0]),
                             legendgroup="ttft"))
        fig.add_trace(go.Scatter(x=ticks, y=[y] * len(ticks), mode="markers", name="token",
                                 marker={"symbol": "line-ns-open", "size": 10}, legendgroup="tok",
                                 showlegend=bool(q["request_id"] == requests["request_id"].iloc[0])))
    fig.update_layout(title=title, xaxis_title="time since first submit (s)", yaxis_title="request",
                      barmode="overlay")
    return fig


def granularity_table(requests):
    """Median display figures per granularity (from :func:`measure_granularity` request rows), in input order."""
    cols = ["updates", "tokens_per_update", "display_lag_mean_s", "display_lag_p90_s", "display_lag_max_s",
            "first_display_s", "added_first_display_s", "handler_s_per_token"]
    order = list(dict.fromkeys(requests["granularity"]))
    t = requests.groupby("granularity")[cols].median().reindex(order)
    t["text_equal"] = requests.groupby("granularity")["text_equal"].all().reindex(order)
    return t.reset_index()


def granularity_figure(requests):
    """Updates, mean display lag and added time to first text per granularity (medians over requests)."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    _px()
    t = granularity_table(requests)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "display updates per request", "mean display lag (ms)", "added time to first text (ms)"))
    x = t["granularity"].astype(str)
    fig.add_trace(go.Bar(x=x, y=t["updates"], name="updates"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=1000 * t["display_lag_mean_s"], name="lag"), row=1, col=2)
    fig.add_trace(go.Bar(x=x, y=1000 * t["added_first_display_s"], name="first text"), row=1, col=3)
    fig.update_layout(title="Display granularity: fewer updates cost lag", showlegend=False)
    fig.update_xaxes(title_text="granularity")
    fig.update_yaxes(title_text="updates", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=1, col=3)
    return fig


def long_output_figure(requests):
    """Time to first visible text, to first section text, and wall time per strategy (medians over repeats)."""
    import pandas as pd

    px = _px()
    keys = [k for k in ("strategy", "language") if k in requests]
    g = requests.groupby(keys, as_index=False, sort=False).agg(
        ttft_s=("ttft_s", "median"), first_section_s=("first_section_s", "median"), e2e_s=("e2e_s", "median"),
        coverage=("coverage", "median"), repetition=("repetition", "median"),
        output_tokens=("output_tokens", "median"))
    long = pd.concat([
        g.assign(measure="first visible text", seconds=g["ttft_s"]),
        g.assign(measure="first section text", seconds=g["first_section_s"]),
        g.assign(measure="wall time", seconds=g["e2e_s"]),
    ])
    return px.bar(long, x="strategy", y="seconds", color="measure", barmode="group",
                  facet_col="language" if "language" in long else None,
                  hover_data=["coverage", "repetition", "output_tokens"],
                  labels={"seconds": "time (s)", "strategy": "strategy"},
                  title="Long output at equal token budget: wait and total time")
