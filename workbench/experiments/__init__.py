"""One module per numbered notebook. Each holds that experiment only: its typed config,
``measure_point``, ``run(cfg, run_dir, loaded)``, its summaries and figures. Experiment modules
never import each other (``tests/test_layout.py`` enforces it)."""
