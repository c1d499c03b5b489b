"""The contention instrument: did other processes (or the hypervisor) take the CPU while a point was measured?

:class:`LoadMonitor` reads ``/proc/stat`` and this process tree's CPU time around a point; :func:`verdict` turns its
figures into the point's ``valid`` / ``invalid_reason`` (DESIGN: "points measured while other load ran are marked
invalid, not averaged in"). :data:`SERVED_BY_PIDS` holds the processes whose CPU time is the measurement's own work
(a loopback endpoint's server, registered by :mod:`workbench.load.endpoint`).
"""

from __future__ import annotations

import time

OTHERS_LOAD_LIMIT = 0.25  # cores' worth of CPU time used by other processes while a point ran
STEAL_LIMIT = 0.05        # share of CPU time stolen by the hypervisor
#: The shortest window whose contamination figures are read: ``/proc/stat`` counts in clock ticks (10 ms at
#: the usual 100 Hz), so over a few milliseconds one tick of anybody's work reads as tens of cores. Shorter
#: points get NaN figures and no verdict from them (a 0.2 s window resolves about 0.1 core).
MIN_LOAD_WINDOW_S = 0.2


def _cpu_jiffies() -> tuple[int, int] | None:
    """``(busy, steal)`` jiffies of all CPUs from ``/proc/stat`` (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal, steal


SERVED_BY_PIDS: set = set()  # processes whose CPU time is the measurement's own work (a loopback endpoint's server)


class LoadMonitor:
    """CPU time that other processes (and the hypervisor) took while a point was measured.

    Reads ``/proc/stat`` (all CPUs' busy and steal jiffies) and this process tree's own CPU time
    (``psutil``, all threads, no child processes) at start and :meth:`stop`; others' load is the difference, in cores (CPU seconds per
    wall second). Elsewhere (no ``/proc``), and over windows too short for the tick counts to resolve
    (:data:`MIN_LOAD_WINDOW_S`), the figures are NaN and no verdict is drawn from them.
    The processes in :data:`SERVED_BY_PIDS` (a server on this machine that the point loads over HTTP, registered
    by :mod:`workbench.load.endpoint`) count as own work, not as other load.
    GPU: other processes on an NVIDIA device are not yet counted.
    """

    def __init__(self):
        import os

        import psutil

        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._proc = psutil.Process()
        self._served = []
        for pid in sorted(SERVED_BY_PIDS):
            try:
                self._served.append(psutil.Process(pid))
            except psutil.Error:
                pass
        self._t0 = time.perf_counter()
        self._own0 = self._own()
        self._cpu0 = _cpu_jiffies()

    def _own(self) -> float:
        """CPU seconds of this process (all its threads) and of the served-by processes; other child processes
        count as other load."""
        import psutil

        t = self._proc.cpu_times()
        own = t.user + t.system
        for p in self._served:
            try:
                c = p.cpu_times()
                own += c.user + c.system
            except psutil.Error:  # it ended: its time so far is lost, the verdict errs towards "other load"
                pass
        return own

    def stop(self) -> dict:
        """``others_cpu_load`` (cores) and ``steal_frac`` (share of busy time) since construction; both NaN
        (no verdict) without ``/proc/stat`` or over a window shorter than :data:`MIN_LOAD_WINDOW_S`."""
        wall = time.perf_counter() - self._t0
        cpu1 = _cpu_jiffies()
        if self._cpu0 is None or cpu1 is None or wall < MIN_LOAD_WINDOW_S:
            return {"others_cpu_load": float("nan"), "steal_frac": float("nan")}
        busy_s = (cpu1[0] - self._cpu0[0]) / self._hz
        steal_s = (cpu1[1] - self._cpu0[1]) / self._hz
        own_s = self._own() - self._own0
        return {"others_cpu_load": max(0.0, busy_s - own_s - steal_s) / wall,
                "steal_frac": steal_s / busy_s if busy_s > 0 else 0.0}


def verdict(row: dict) -> dict:
    """A point's validity: ``{"valid": bool, "invalid_reason": str}`` from its contamination figures.

    Invalid when other processes used more than :data:`OTHERS_LOAD_LIMIT` cores, or the hypervisor
    stole more than :data:`STEAL_LIMIT` of the CPU time, while it was measured. (Drift of the reference
    point is judged after the sweep, see :mod:`workbench.run.drift`.)
    """
    reasons = []
    load, steal = row.get("others_cpu_load"), row.get("steal_frac")
    if load is not None and load == load and load > OTHERS_LOAD_LIMIT:
        reasons.append(f"other processes used {load:.2f} CPU cores during the point (limit {OTHERS_LOAD_LIMIT})")
    if steal is not None and steal == steal and steal > STEAL_LIMIT:
        reasons.append(f"hypervisor stole {steal:.0%} of CPU time (limit {STEAL_LIMIT:.0%})")
    return {"valid": not reasons, "invalid_reason": "; ".join(reasons)}
