"""One column registry (``workbench/stats/columns.csv``): every table and the report derive from it, a recorded
point with a column it lacks fails (the tests run strict, so every experiment test checks what it produces), and
the registry lists nothing that no code produces."""

import re
from pathlib import Path

import pandas as pd
import pytest

from workbench.run import locks, point_result, results
from workbench.share import report
from workbench.stats import columns

PKG = Path(__file__).resolve().parents[2] / "workbench"


def test_the_tests_run_strict():
    import os

    assert os.environ.get(columns.STRICT_ENV) == "1"


def test_request_rows_and_the_report_derive_from_the_registry():
    assert point_result.REQUEST_COLUMNS is columns.REQUEST_COLUMNS
    assert report._POINT_COLUMNS == list(columns.REPORT_POINT_COLUMNS)
    assert {"ttft_s", "itl_s", "tpot_s", "e2e_s", "output_tokens", "finish_reason"} <= set(columns.REQUEST_COLUMNS)
    assert "ttft_s_p50" in columns.REPORT_POINT_COLUMNS and all(columns.is_registered(c)
                                                                  for c in columns.REPORT_POINT_COLUMNS)
    for name, col in columns.COLUMNS.items():
        assert col.label and col.definition, f"{name}: registered without a label or a definition"


def test_aggregates_and_interval_bounds_of_registered_columns_are_registered():
    for name in ("ttft_s_p50", "itl_s_p99", "ttft_s_p50_ci_low", "slo_attainment_low", "power_w_mean"):
        assert columns.is_registered(name), name
    assert columns.unregistered(["ttft_s", "ttft_ms", "made_up_p50"]) == ["made_up_p50", "ttft_ms"]


def test_recording_a_point_with_an_unregistered_column_fails_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "results"))
    run = results.create_run()
    locks.lock_run(run)
    try:
        ok = pd.DataFrame([{"request_id": 0, "ttft_s": 0.1}])
        results.record_point(run, "p/seed=1", ok, {"point_id": "p/seed=1", "status": "ok"}, {"status": "ok"})
        with pytest.raises(ValueError, match=r"point p/seed=2: columns not in workbench/stats/columns.csv: ttft_ms$"):
            results.record_point(run, "p/seed=2", pd.DataFrame([{"ttft_ms": 100}]),
                                 {"point_id": "p/seed=2", "status": "ok"}, {"status": "ok"})
        monkeypatch.delenv(columns.STRICT_ENV)   # a user's run records it anyway
        results.record_point(run, "p/seed=3", pd.DataFrame([{"ttft_ms": 100}]), {"point_id": "p/seed=3"}, {})
    finally:
        locks.unlock_run(run)


def test_the_registry_lists_no_column_that_no_code_produces():
    source = "\n".join(p.read_text(encoding="utf-8") for p in PKG.rglob("*.py"))
    words = set(re.findall(r"\w+", source))   # a name occurs as a whole word, alone or with a statistic's suffix

    def produced(n):
        if n in words or any(f"{n}_{s}" in words for s in columns.STATS):
            return True
        # a compression strategy's details are written as f"detail_{key}" (context_compression): the key in quotes
        return n.startswith("detail_") and re.search(r"[\"']" + re.escape(n[len("detail_"):]) + r"[\"']", source)

    orphans = [n for n in columns.COLUMNS if not produced(n)]
    assert not orphans, f"registered in columns.csv but produced nowhere in workbench/: {orphans}"


def test_a_name_registered_twice_is_refused(monkeypatch):
    import importlib.resources

    class Fake:
        def joinpath(self, _):
            return self

        def read_text(self, encoding=None):
            return "name,unit,higher_is_better,label,definition,row,report\na,s,,A,x,,\na,s,,A,y,,\n"

    monkeypatch.setattr(importlib.resources, "files", lambda _: Fake())
    with pytest.raises(ValueError, match="'a' is registered twice"):
        columns._read_columns()
