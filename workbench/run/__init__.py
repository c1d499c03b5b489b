"""Run machinery and records: how points are measured in order and where they land.

``point_result`` (a point's typed result, :class:`~workbench.run.point_result.PointResult`, and its rows),
``results`` (run folders: ids, locks, manifests, Parquet tables written atomically, ``load``), ``drift`` (the drift
reference and its verdict), ``sweeps`` (shared config fields, grids, the point loop), ``distributed`` (the Ray
executor, passed in by the caller), ``notebooks`` (jupytext sources, parameters cells, suites, papermill in a shared
kernel), ``rung_timing`` (a rung's timed repeats with compile time apart and recompiles counted), ``suite`` (the runner behind
``workbench run`` / ``sweep``: validate, open or resume the run folder under its lock, execute the notebooks, record
each one's status; the report is handed in by the command line), ``metrics_file`` (``metrics.json``: read, merge),
``design`` (the design runner: arms in interleaved rounds with an A/A control, stopped once decided; + ``design_findings``,
a point row's decision said in a finding, ``design_plan``, what a design costs and can decide, both re-exported
by ``design``, ``design_store``, a design's rounds and description in its run folder, and ``design_sweep``, a
design over a sweep's points).
Every piece of a run folder's manifest bookkeeping lives here. Used by the serving job store and by every
experiment; knows nothing of serving, predictions or reports.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["design", "design_sweep", "distributed", "drift", "locks", "metrics_file", "notebooks", "point_result",
           "results", "rung_timing", "suite", "sweeps"]
