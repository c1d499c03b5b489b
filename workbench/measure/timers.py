"""The instruments that ride along one ``transformers`` ``generate`` call and read the clock: :class:`TokenTimer` (a
streamer) stamps every generated token id, :class:`StreamerGroup` lets it share ``generate``'s one streamer slot,
:class:`PrefillTimer` times the model's first forward (the prompt pass) with forward hooks, and :class:`VerifyCounter`
counts the draft tokens each verification step of assisted generation checked. The timers synchronise the device
before reading ``time.perf_counter()``; :func:`workbench.measure.generation.generate_measured` turns their readings
into request records (the method is in that module's docstring).
"""

from __future__ import annotations

import time

from workbench.measure.device import synchronize


class TokenTimer:
    """A ``generate`` streamer that stamps the time of every generated token id.

    ``put(value)``: the first call carries the prompt ids (shape ``(batch, seq)``)
    and is skipped; each later call carries one step's ids: shape ``(batch,)`` in
    plain decoding, ``(1, k)`` in assisted / prompt-lookup decoding (``k`` ids
    verified in one step). Stores ``times`` (perf_counter seconds, one per id
    position: the ``k`` ids of one step share one stamp), ``steps`` (one
    ``(batch,)`` tensor per id position) and ``step_sizes`` (ids per ``put``).
    ``on_step(ids, t)``, if given, is called for each id position.
    """

    def __init__(self, device_type: str = "cpu", on_step=None):
        self.device_type = device_type
        self.on_step = on_step
        self.prompt_seen = False
        self.times: list[float] = []
        self.steps: list = []
        self.step_sizes: list[int] = []
        self.t_end: float | None = None

    def _now(self) -> float:
        synchronize(self.device_type)
        return time.perf_counter()

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        t = self._now()
        columns = [value.reshape(-1)] if value.dim() < 2 else [value[:, j] for j in range(value.shape[1])]
        self.step_sizes.append(len(columns))
        for ids in columns:
            self.times.append(t)
            self.steps.append(ids)
            if self.on_step is not None:
                self.on_step(ids, t)

    def end(self) -> None:
        self.t_end = self._now()


class StreamerGroup:
    """Forward ``put``/``end`` to several streamers (``generate`` takes only one)."""

    def __init__(self, *streamers):
        self.streamers = [s for s in streamers if s is not None]

    def put(self, value) -> None:
        for s in self.streamers:
            s.put(value)

    def end(self) -> None:
        for s in self.streamers:
            s.end()


class PrefillTimer:
    """Times the model's first forward call (the prompt pass) with forward hooks."""

    def __init__(self, model, device_type: str):
        self.device_type = device_type
        self.t0 = self.t1 = None
        self.handles = [
            model.register_forward_pre_hook(self._pre),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, module, args):
        if self.t0 is None:
            synchronize(self.device_type)
            self.t0 = time.perf_counter()

    def _post(self, module, args, output):
        if self.t1 is None:
            synchronize(self.device_type)
            self.t1 = time.perf_counter()
            self.remove()

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    @property
    def seconds(self) -> float:
        return float("nan") if self.t1 is None else self.t1 - self.t0



class VerifyCounter:
    """Counts, per verification step of assisted generation, the draft tokens the target model checked.

    A forward pre-hook on the target model reads each forward's new positions: the first forward holds the
    prompt plus the step's candidates, every later one the last accepted id plus the candidates. So
    ``proposed = new positions - 1`` (``- prompt width`` on the first), one entry per target forward, which is
    one verification step (a step with no candidate, e.g. prompt lookup finding no match, proposes 0). Only
    the target's own forwards are seen: a draft model is a different module.
    """

    def __init__(self, model, prompt_width: int):
        self.prompt_width = prompt_width
        self.proposed: list[int] = []
        self.handle = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds", args[0] if args else None)
        n = int(x.shape[1])
        self.proposed.append(n - (self.prompt_width if not self.proposed else 1))

    def remove(self):
        self.handle.remove()

