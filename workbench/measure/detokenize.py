"""Display of a stream: token ids in, text pieces out, delivered at a chosen granularity.

:class:`IncrementalDetokenizer` turns generated token ids into text one id at a
time (the windowed prefix/read-offset method of vLLM's
``detokenize_incrementally``): a piece is held while the decoded text ends in
U+FFFD (a multi-byte character split across ids), so no replacement character
ever reaches the screen; :meth:`IncrementalDetokenizer.finish` returns whatever
the final ``tokenizer.decode`` has beyond what was shown, so the pieces
concatenate to the final decode exactly.

:class:`DisplayBuffer` delivers those pieces at a :class:`Granularity`: every
token, every N tokens, or every T milliseconds (flushed on the first token at
least T after the previous update, as a server pushing from its decode loop
does). It counts updates and each token's display lag (update time minus the
token's own stamp). :class:`StreamTap` feeds a whole batch from
:func:`workbench.measure.generation.generate_measured`'s ``on_step`` hook and times its
own work (the time the display path adds to each decode step).

An instrument: nothing here generates, writes files or plots.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from workbench.checks import check_choice, check_float
from workbench.errors import ParameterError
from workbench.stats import metrics

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
                :mod:`workbench.measure.generation` drops it from the record's text.

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


def first_text_index(tokenizer, ids) -> int | None:
    """Index of the generated id at which visible text (not only whitespace) first reaches the display.

    The ids are pushed through :class:`IncrementalDetokenizer`, so a character split across ids counts
    at the id that completes it, and an end-of-sequence id shows nothing. None when no id shows text.
    """
    detok = IncrementalDetokenizer(tokenizer)
    for i, tok in enumerate(ids):
        detok.push(tok)
        if detok.emitted.strip():
            return i
    return None


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
        check_choice("granularity", self.mode, ("token", "tokens", "ms"))
        check_float("granularity", self.every, lo=0, lo_open=True)
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
            ``updates``, ``tokens_per_update``, ``display_lag_s_mean``,
            ``display_lag_s_p90``, ``display_lag_s_max`` and, when ``t_submit``
            is given, ``first_display_s`` (submit to first update).
        """
        nan = float("nan")
        lags = self.lags
        out = {
            "granularity": self.granularity.label,
            "updates": len(self.updates),
            "tokens_per_update": self.n_tokens / len(self.updates) if self.updates else nan,
            "display_lag_s_mean": sum(lags) / len(lags) if lags else nan,
            "display_lag_s_p90": metrics.percentiles(lags, (90,))["p90"],
            "display_lag_s_max": max(lags) if lags else nan,
        }
        if t_submit is not None:
            out["first_display_s"] = self.updates[0].t - t_submit if self.updates else float("nan")
        return out


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

