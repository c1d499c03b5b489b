"""Energy instrument: device energy over the timed repeats, from NVML's total-energy counter.

NVIDIA GPUs (Volta and later) keep a monotonic counter of the energy the board drew since the driver
loaded (``nvmlDeviceGetTotalEnergyConsumption``, millijoules; ``nvidia-ml-py`` provides ``pynvml``).
:class:`EnergyMeter` reads it right before and right after each **timed** repeat (the device
synchronised first), so warm-up, prompt building and scoring never count. A point's figures
(:func:`point_columns`):

- ``energy_j``: the sum of those differences over the timed repeats,
- ``energy_j_per_token``: ``energy_j`` / the output tokens of the timed requests,
- ``power_w_mean``: ``energy_j`` / the summed wall time of the timed repeats.

Elsewhere (CPU, Apple MPS, no NVIDIA driver, ``pynvml`` missing, a GPU without the counter) the
columns are NaN, never zero, and :attr:`EnergyMeter.reason` says why (recorded in the manifest).
"""

from __future__ import annotations

import math
import os

NAN = float("nan")


def _nvml():
    """The ``pynvml`` module, initialised; raises with a readable reason otherwise."""
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise RuntimeError(f"NVML unavailable ({type(exc).__name__}: {exc})") from None
    return pynvml


def _handle(pynvml, device: str):
    """The NVML handle of torch device ``cuda[:i]``: by UUID (right under ``CUDA_VISIBLE_DEVICES``, as Ray
    sets it), else the i-th visible index mapped through ``CUDA_VISIBLE_DEVICES``."""
    index = int(device.split(":")[1]) if ":" in device else 0
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(index).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - older torch without .uuid, MIG: fall back to indices
        pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        index = int(visible[index])
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class EnergyMeter:
    """Energy of the timed repeats of one point on one device.

    Use ``meter.begin()`` right before a timed repeat and ``meter.end(wall_s)`` right after it;
    :meth:`result` gives the totals. Unavailable meters (``reason`` set) accumulate nothing.

    Attributes:
        device: torch device string (``cuda:0``, ``cpu``, ...).
        reason: why energy is not measured (None when it is).
        energy_j: joules summed over the timed repeats so far.
        timed_s: wall seconds of those repeats.
        repeats: how many were read.
    """

    def __init__(self, device: str, nvml=None):
        self.device = str(device)
        self.reason: str | None = None
        self.energy_j = 0.0
        self.timed_s = 0.0
        self.repeats = 0
        self._start_mj: int | None = None
        self._nvml = None
        self._h = None
        if not self.device.startswith("cuda"):
            self.reason = f"no NVIDIA GPU: the device is {self.device} (NVML measures NVIDIA GPUs only)"
            return
        try:
            self._nvml = nvml if nvml is not None else _nvml()
            self._h = _handle(self._nvml, self.device)
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._h)  # unsupported before Volta: raises
        except Exception as exc:  # noqa: BLE001 - any failure leaves the columns empty, with the reason
            self.reason = str(exc) if isinstance(exc, RuntimeError) else \
                f"NVML energy counter unreadable on {self.device} ({type(exc).__name__}: {exc})"
            self._nvml = self._h = None

    @property
    def available(self) -> bool:
        return self.reason is None

    def _read_mj(self) -> int:
        if self.device.startswith("cuda"):
            from workbench.measure.device import synchronize

            synchronize("cuda")
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._h))

    def begin(self) -> None:
        """Read the counter just before a timed repeat."""
        if self.available:
            self._start_mj = self._read_mj()

    def end(self, wall_s: float) -> None:
        """Read the counter just after a timed repeat of ``wall_s`` seconds; add the difference."""
        if not self.available or self._start_mj is None:
            return
        self.energy_j += (self._read_mj() - self._start_mj) / 1000.0
        self.timed_s += float(wall_s)
        self.repeats += 1
        self._start_mj = None

    def result(self) -> dict:
        """``{"energy_j", "timed_s", "repeats", "reason"}``; ``energy_j`` is NaN when unavailable."""
        ok = self.available and self.repeats > 0
        return {"energy_j": self.energy_j if ok else NAN, "timed_s": self.timed_s if ok else NAN,
                "repeats": self.repeats, "reason": self.reason if self.reason or ok else "no timed repeat was read"}


def status(device: str) -> dict:
    """``{"available": bool, "reason": str | None, "device": device}`` for the manifest."""
    m = EnergyMeter(device)
    return {"available": m.available, "reason": m.reason, "device": str(device)}


def point_columns(energy: dict | None, requests) -> dict:
    """A point's energy columns from a measure's ``energy`` entry and its timed request rows.

    Args:
        energy: :meth:`EnergyMeter.result` (None: the experiment measured no energy).
        requests: the point's request rows (timed repeats only); ``output_tokens`` is summed.

    Returns:
        ``energy_j``, ``energy_j_per_token``, ``power_w_mean`` (NaN when unmeasured, never 0 for "unknown").
    """
    if not energy:
        return {"energy_j": NAN, "energy_j_per_token": NAN, "power_w_mean": NAN}
    joules = float(energy.get("energy_j", NAN))
    tokens = float(requests["output_tokens"].sum()) if requests is not None and "output_tokens" in requests \
        and len(requests) else 0.0
    timed = float(energy.get("timed_s", NAN))
    return {
        "energy_j": joules,
        "energy_j_per_token": joules / tokens if tokens > 0 and math.isfinite(joules) else NAN,
        "power_w_mean": joules / timed if math.isfinite(joules) and timed and timed > 0 else NAN,
    }
