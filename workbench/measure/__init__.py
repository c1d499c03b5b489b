"""Instruments: what touches the model and the device, and what a measurement reads.

``device`` (synchronize, the bandwidth / FLOP/s probe, peak memory, environment facts, the cores, dtypes and
attention kernels a device can be tuned over, a body run at a thread count), ``models`` (offline
loading of the embedded default or a local model, model facts), ``generation`` (measured ``generate``,
end-of-turn ids, warm-up), ``streaming`` (``stream_generate``: text as it arrives), ``detokenize`` (incremental text, display granularity),
``memory`` (KV-cache bytes, memory tracker), ``energy`` (NVML energy), ``contention`` (other load on the
machine during a point, from ``/proc/stat``), ``quality`` (text and answer metrics, continuation
log-likelihood), ``guard`` (the quality guard of every technique: perplexity ratio, mean KL and top-1 agreement
against float32 on held-out text), ``config_models`` (``model: config:PATH``: shipped shapes, random weights),
``reading`` (reading speed). Built on :mod:`workbench.stats`; nothing here knows about
techniques, inputs, run folders or experiments.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["config_models", "contention", "detokenize", "device", "energy", "generation", "guard", "memory", "models",
           "quality", "reading", "streaming"]
