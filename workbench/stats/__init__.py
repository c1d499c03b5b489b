"""Numbers in, numbers out: the field's formulas and the statistics behind every verdict.

``metrics`` (request timing - TTFT, ITL, TPOT, e2e -, percentiles, point summaries, MBU/MFU, speculative acceptance
and its speed-up bound), ``evidence`` (usable points, fit support, t / ratio / Wilson intervals, verdicts,
:class:`~workbench.stats.evidence.Finding`, repeat statistics), ``slo`` (SLO presets, attainment, the rate search, a
configuration's verdict at the SLO's percentile), ``columns`` (the one column registry, read from
``columns.csv``), ``comparison`` (interleaved designs, the A/A control, Holm over arms), ``replicates`` (queue
experiments: runs paired by arrival seed), ``classes`` (a mixed workload's rows per request class, the prefix
cache's hit rate and what sharing saved), ``blocks`` (a design's rounds analysed as a randomised block design,
the best-of pick; + ``decisions``, Dunnett's critical values and a comparison's three verdicts, and ``paired``,
paired binary outcomes, both re-exported by ``blocks``), ``sequential`` (the looks and their spent alpha), ``validity`` (which
points a move of the machine's speed leaves valid: an interleaved design's rounds as blocks). Nothing
here loads a model, touches a device or reads a clock of its own: each formula has one
home here and every path calls it. Imports only the ground floor (``workbench.errors``, ``workbench.checks``).
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["blocks", "classes", "columns", "comparison", "evidence", "metrics", "replicates", "sequential", "slo",
           "validity"]
