"""Memory instruments: KV-cache bytes from the model config, and memory growth measured while generating.

Used by any experiment that reports memory (notebook ``02_context_length`` first).

Methods:

- KV cache from the config: ``2 (K and V) x layers x kv_heads x head_dim x
  bytes/element x tokens x batch`` (:meth:`workbench.measure.models.ModelInfo.kv_cache_bytes_per_token`).
- KV cache measured (:class:`MemoryTracker`): memory at the first generated
  step (the prompt's cache is complete, the prefill's temporaries freed) minus a
  baseline read just before the timed batch. CUDA: ``torch.cuda.memory_allocated``
  (live tensors only). CPU: process RSS (``psutil``), with glibc
  ``malloc_trim(0)`` (:func:`malloc_trim`) before the baseline and at the first
  step so freed memory leaves the RSS; it still counts allocator slack and a
  step's activations, so on CPU it reads a few MiB above the cache. The largest
  growth over all steps (the cache growing, plus fragmentation from the cache's
  re-allocations) is kept as well.
"""

from __future__ import annotations

import gc


def kv_cache_bytes(info, tokens: int, batch_size: int = 1) -> int:
    """KV-cache bytes for ``batch_size`` sequences of ``tokens`` each, from the model config.

    ``2 x num_layers x num_kv_heads x head_dim x bytes/element x tokens x batch_size``.

    Args:
        info: :class:`workbench.measure.models.ModelInfo` (anything with ``kv_cache_bytes_per_token()``).
        tokens: cached tokens per sequence.
        batch_size: sequences.

    Returns:
        Bytes (int).
    """
    return int(info.kv_cache_bytes_per_token()) * int(tokens) * int(batch_size)


def malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc ``malloc_trim(0)``; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


class MemoryTracker:
    """Memory growth over a baseline, sampled on every generated step.

    Use ``tracker.start()`` right before the timed batch and pass
    ``tracker.on_step`` as ``generate_measured(..., on_step=...)``.

    At the first generated step the prompt's KV cache is complete and the
    prefill's temporaries are freed; on CPU the tracker then calls glibc
    ``malloc_trim(0)`` once (milliseconds, which land in the second token's ITL) so
    that freed memory leaves the RSS, and reads the growth: that reading is the
    measured KV cache (``first_step_growth_bytes``). Later steps only update
    ``max_growth_bytes`` (the cache's growth plus allocator fragmentation).

    Attributes:
        kind: ``cuda_allocated`` or ``rss``.
        baseline: bytes at ``start()``.
        first_step_growth_bytes: growth at the first generated step (None before it).
        max_growth_bytes: largest growth over all steps.
        peak_bytes: CUDA: ``max_memory_allocated`` since ``start()`` minus
            baseline (prefill activations included); CPU: ``max_growth_bytes``.
    """

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")
        self.kind = "cuda_allocated" if self.cuda else "rss"
        self.baseline = 0
        self.first_step_growth_bytes: int | None = None
        self.max_growth_bytes = 0

    def _now(self) -> int:
        if self.cuda:
            import torch

            return int(torch.cuda.memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)

    def start(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            malloc_trim()
        self.baseline = self._now()
        self.first_step_growth_bytes = None
        self.max_growth_bytes = 0

    def on_step(self, ids, t) -> None:
        if self.first_step_growth_bytes is None:
            if not self.cuda:
                malloc_trim()
            self.first_step_growth_bytes = self._now() - self.baseline
            growth = self.first_step_growth_bytes
        else:
            growth = self._now() - self.baseline
        self.max_growth_bytes = max(self.max_growth_bytes, growth)

    @property
    def peak_bytes(self) -> int:
        if self.cuda:
            import torch

            return int(torch.cuda.max_memory_allocated()) - self.baseline
        return self.max_growth_bytes
