"""One module per numbered notebook. Each holds that experiment only: its typed config,
``measure_point(loaded, cfg, point, state) -> workbench.run.point_result.PointResult`` (the one signature: ``state`` is
a dict shared by the points of one sweep, for warm-up bookkeeping, references, caches, servers), ``run(cfg,
run_dir, loaded)``, its summaries and figures. Experiment modules never import each other
(``tests/test_layout.py`` enforces it); a Ray worker finds an experiment by the module of its ``Config``."""
