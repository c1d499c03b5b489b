"""Live views in a notebook: a throttled view of a request as it is generated, and whether a frontend is there.

:class:`LiveState` holds the text and counters of the request being shown (TTFT, tokens/s, token count, elapsed
time from the clock reading of every generated step through :func:`workbench.stats.metrics.request_timing`, the
formulas of the final records), written by the measuring thread and rendered at most every ``min_interval_s``
by :class:`Throttle`, whatever the token rate, so the kernel's output channel is never flooded;
:func:`counters_html` is its counters line. :func:`headless` and :func:`has_frontend` decide whether widgets can
be shown at all (the runner's ``WORKBENCH_HEADLESS``, jupyter-server's ``JPY_SESSION_NAME``). The interactive
explorer (notebook ``00_explorer``) draws its live view with them.
"""

from __future__ import annotations

import html
import os
import threading
import time
from typing import Callable

from workbench.stats import metrics


def headless() -> bool:
    """Whether the runner started this kernel without a frontend (``WORKBENCH_HEADLESS`` set and not ``0``)."""
    return os.environ.get("WORKBENCH_HEADLESS", "").strip() not in ("", "0")


def has_frontend(mode: str = "auto") -> bool:
    """Whether widgets can be shown: ``widgets`` -> True, ``static`` -> False, ``auto`` -> not
    :func:`headless` and a kernel started by jupyter-server (``JPY_SESSION_NAME`` set). The runner's
    ``WORKBENCH_HEADLESS=1`` wins over ``JPY_SESSION_NAME``, which papermill kernels inherit from a
    JupyterLab terminal. ``WORKBENCH_EXPLORER_MODE`` overrides ``auto``."""
    mode = os.environ.get("WORKBENCH_EXPLORER_MODE", mode) if mode == "auto" else mode
    if mode == "widgets":
        return True
    if mode == "static":
        return False
    return not headless() and bool(os.environ.get("JPY_SESSION_NAME"))


class Throttle:
    """Lets an update through at most once per ``min_interval_s`` (forced updates always pass).

    ``due(now)`` returns True and remembers ``now`` when at least ``min_interval_s``
    passed since the last update that went through.
    """

    def __init__(self, min_interval_s: float = 0.1, clock: Callable[[], float] = time.perf_counter):
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.last: float | None = None

    def due(self, force: bool = False, now: float | None = None) -> bool:
        now = self.clock() if now is None else now
        if force or self.last is None or now - self.last >= self.min_interval_s:
            self.last = now
            return True
        return False


class LiveState:
    """Text and counters of the request being shown, written by the worker thread, rendered throttled.

    Counters come from the clock reading of every generated step (:meth:`on_step`, both paths) through
    :func:`workbench.stats.metrics.request_timing`, with ``t_submit`` the time of :meth:`reset`; text comes
    from the streamed pieces (batch 1, :meth:`on_event`) or from decoding row 0's ids (batches).

    Args:
        render: ``render(snapshot: dict)``, called at most every ``min_interval_s`` (and once at the end).
        decode: ``decode(ids) -> str`` used for batches (row 0 ids); batch 1 receives text pieces.
    """

    def __init__(self, render: Callable[[dict], None] | None = None, min_interval_s: float = 0.1,
                 decode: Callable[[list], str] | None = None, clock: Callable[[], float] = time.perf_counter):
        self.render = render
        self.decode = decode
        self.throttle = Throttle(min_interval_s, clock)
        self.clock = clock
        self.lock = threading.Lock()
        self.renders = 0
        self.reset("")

    def reset(self, status: str) -> None:
        with self.lock:
            self.pieces: list[str] = []
            self.ids: list[int] = []
            self.stamps: list[float] = []
            self.record: dict | None = None
            self.t0 = self.clock()
            self.status = status
        self.refresh(force=True)

    def on_event(self, ev) -> None:
        """A :class:`workbench.measure.streaming.StreamEvent` (batch 1): its text piece."""
        with self.lock:
            if ev.text:
                self.pieces.append(ev.text)
        self.refresh()

    def on_stamp(self, ids, t: float) -> None:
        """``on_step`` of the streamed batch 1: stamp the step (text comes from :meth:`on_event`)."""
        with self.lock:
            self.stamps.append(float(t))

    def on_step(self, ids, t: float) -> None:
        """``generate_measured``'s ``on_step`` (batches): stamp the step, keep row 0's id."""
        with self.lock:
            self.stamps.append(float(t))
            self.ids.append(int(ids[0]))
        self.refresh()

    def finish(self, record: dict | None, status: str) -> None:
        """Show the final text and the measured counters of ``record`` (row 0)."""
        with self.lock:
            if record is not None:
                self.pieces, self.ids = [record.get("text") or ""], []
                self.record = record
            self.status = status
        self.refresh(force=True)

    def snapshot(self) -> dict:
        """``text``, ``output_tokens``, ``ttft_s``, ``elapsed_s``, ``tokens_per_s`` (decode speed so far), ``status``.

        Before :meth:`finish`: :func:`workbench.stats.metrics.request_timing` of the steps stamped so far
        (``elapsed_s`` is the last step's time since :meth:`reset`); after it, the record's own values.
        """
        with self.lock:
            text = "".join(self.pieces)
            if self.ids and self.decode is not None:
                text = self.decode(list(self.ids))
            timing = self.record if self.record is not None else metrics.request_timing(self.stamps, self.t0)
            n = int(timing.get("output_tokens") or 0)
            ttft, el, tps = timing.get("ttft_s"), timing.get("e2e_s"), timing.get("decode_tps")
            return {"text": text, "output_tokens": n, "ttft_s": _finite(ttft),
                    "elapsed_s": _finite(el) or 0.0, "tokens_per_s": _finite(tps), "status": self.status}

    def refresh(self, force: bool = False) -> None:
        if self.render is not None and self.throttle.due(force):
            self.renders += 1
            self.render(self.snapshot())


def _finite(x) -> float | None:
    """``x`` as a float, or None when it is missing or NaN (nothing to show yet)."""
    return None if x is None or x != x else float(x)


def counters_html(snap: dict) -> str:
    """The live counters line: TTFT, tokens/s, token count, elapsed time, status."""
    ttft = "-" if snap["ttft_s"] is None else f"{snap['ttft_s']:.3f} s"
    tps = "-" if snap["tokens_per_s"] is None else f"{snap['tokens_per_s']:.1f}"
    return (f"<b>TTFT</b> {ttft} &nbsp; <b>tokens/s</b> {tps} &nbsp; <b>tokens</b> {snap['output_tokens']} "
            f"&nbsp; <b>elapsed</b> {snap['elapsed_s']:.2f} s &nbsp; <i>{html.escape(snap['status'])}</i>")
