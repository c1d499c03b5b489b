"""One experiment per numbered notebook: a module named after it, or, where the experiment has parts of its own, a
small folder, its ``__init__`` the experiment's face (``context_length/``: + its fits and charts;
``streaming_anatomy/``: + its summaries and charts; ``context_compression/``: + its summaries and charts;
``serving_load/``: + its runs and engine comparison, summaries and charts; ``engine_tuning/``: + its design rounds,
summaries, charts and coordinate search; ``scheduling/``: + its per-run statistics, policy design and prefix
design). Each holds that experiment only: its typed config,
``measure_point(loaded, cfg, point, state) -> workbench.run.point_result.PointResult`` (the one signature: ``state`` is
a dict shared by the points of one sweep, for warm-up bookkeeping, references, caches, servers), ``run(cfg,
run_dir, loaded)``, its summaries and figures. Experiments never import each other; a folder's own modules import
each other (``tests/test_layout.py`` enforces it); a Ray worker finds an experiment by the module of its ``Config``, so ``Config`` and ``measure_point`` stay in the
face."""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["batch_size", "context_compression", "context_length", "engine_tuning", "explorer", "long_output",
           "reasoning_budget", "scheduling", "serving_load", "speed_techniques", "streaming_anatomy",
           "streaming_reader", "temperature"]
