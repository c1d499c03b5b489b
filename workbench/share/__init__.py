"""What leaves the run folder: figures, the report, and the forms researchers share a run in.

``plots`` (the house plotly template, labels with units, one colour per engine / configuration), ``report`` (the
self-contained HTML report of one run or a comparison of runs), ``findings`` (the report's findings: claim, per-arm
figures, evidence, links to the points), ``csv_export`` (``requests.csv`` and ``points.json`` beside the report),
``static_figures`` (every figure as PNG / SVG / PDF at a paper-column size), ``run_summary`` (``metrics.json``:
headline figures and findings a pipeline can depend on), ``cost`` ($/Mtok from a device-hour price; tokens/s per
user vs per device), ``export`` (MLflow, llm-d's Benchmark Report v0.2, ``vllm bench serve`` JSON; the documents
built in ``export_points`` and ``export_mlflow``), ``formats`` (GuideLLM, AIPerf and vLLM results read in as runs of
their own; the readers in ``importers`` and ``importers_other``, what they return in ``imported``),
``comparability`` (the check printed before any comparison of runs, the metrics it leaves out), ``cross_tool``
(ratios of per-request medians and geometric means across tools, with intervals), ``ladder`` (the speed ladder's
profile figure), ``live`` (a throttled live view of a request in a notebook; whether a frontend is there),
``figures_serving`` (load sweeps per engine, mixed workloads per policy; notebooks 08 and 11 share them) and
``figures_twin`` (the serving twin beside the measurement). An experiment's own figures live in its folder
(``workbench.experiments.context_compression.charts``, ``workbench.experiments.engine_tuning.charts``). Reads run
folders and predictions; the experiments draw their figures with ``plots``.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["comparability", "cost", "cross_tool", "export", "figures_design", "figures_serving", "figures_twin",
           "formats", "ladder", "live", "plots", "report", "static_figures"]
