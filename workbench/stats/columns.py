"""The one column registry: every column a run folder's tables carry, its unit, definition and direction.

``columns.csv`` beside this file is the only list (one line a column: ``name, unit, higher_is_better, label,
definition, row, report``; ``report`` is ``ORDER`` or ``ORDER:stat stat ...``). Everything else derives from it: the figure labels (:func:`label`), the columns every
request row carries (:data:`REQUEST_COLUMNS`, ``row = request``), the report's point table
(:data:`REPORT_POINT_COLUMNS`, ``report`` = its order), and the check that a table holds no column the registry
lacks (:func:`unregistered`, run on every point a run folder records when ``$WORKBENCH_STRICT_COLUMNS`` is set, as
the tests set it). Aggregates are named ``<column>_<stat>`` (``ttft_s_p50``) and their interval bounds
``<aggregate>_ci_low`` / ``_ci_high``; experiment parameters and per-experiment names follow the same table.
Column names follow vLLM's benchmark and GenAI-Perf (``docs/design.md`` section 4); the idea of one table of
metric metadata is llmperf's ``common_metrics.py``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable

STATS = ("p50", "p90", "p99", "mean", "rate", "min", "max", "sd", "median")
#: suffixes of an interval's bounds around any registered column or aggregate
BOUNDS = ("_ci_low", "_ci_high", "_low", "_high")
#: suffixes of a design's decision around a registered ratio column (workbench.run.design.DesignResult.point_columns):
#: its interval's level, how it was computed, the verdict and its direction
DECISION = ("_level", "_method", "_verdict", "_direction")
STRICT_ENV = "WORKBENCH_STRICT_COLUMNS"
#: the request classes of a mixed workload: ``<column>_<class>`` is that column over one class (``ttft_s_p90_interactive``)
REQUEST_CLASSES = ("interactive", "background")


@dataclasses.dataclass(frozen=True)
class Column:
    """One registered column: its unit, definition, direction, axis label, and where it appears.

    Attributes:
        name: the column name (units in the name: ``ttft_s``, ``output_throughput_tps``).
        unit: ``s``, ``tokens``, ``tok/s``, ``bytes``, ... (blank: a count, a ratio or a label).
        definition: one line, the field's definition (DESIGN section 4 where it has one).
        higher_is_better: True / False, or None where the direction is not a quality.
        label: the axis label with its unit (``TTFT (s)``).
        row: ``request`` when every request row carries it (None where an experiment has no value), else ''.
        report: its position in the report's point table (0: not shown there).
        report_stats: the aggregates of it shown there (``("p50", "p99")``: ``ttft_s_p50``, ``ttft_s_p99``);
            empty: the column itself.
    """

    name: str
    unit: str
    definition: str
    higher_is_better: bool | None
    label: str
    row: str = ""
    report: int = 0
    report_stats: tuple = ()


def _read_columns() -> dict[str, Column]:
    """The registry from ``columns.csv``.

    Raises:
        ValueError: a name registered twice.
    """
    import csv
    from importlib import resources

    text = resources.files("workbench.stats").joinpath("columns.csv").read_text(encoding="utf-8")
    out = {}
    for r in csv.DictReader(text.splitlines()):
        if r["name"] in out:
            raise ValueError(f"columns.csv: {r['name']!r} is registered twice")
        higher = {"yes": True, "no": False}.get(r["higher_is_better"])
        order, _, stats = (r.get("report") or "").partition(":")
        out[r["name"]] = Column(r["name"], r["unit"], r["definition"], higher, r["label"], (r.get("row") or "").strip(),
                                int(order or 0), tuple(stats.split()))
    return out


#: The registry: ``{name: Column}`` in the file's order. A new column is one line of ``columns.csv``.
COLUMNS: dict[str, Column] = _read_columns()
#: Columns every request row carries, in the registry's order (None where an experiment has no value).
REQUEST_COLUMNS: tuple[str, ...] = tuple(n for n, c in COLUMNS.items() if c.row == "request")
#: The report's point table, in its order (aggregates expanded: ``ttft_s`` -> ``ttft_s_p50``, ...).
REPORT_POINT_COLUMNS: tuple[str, ...] = tuple(
    name for c in sorted((c for c in COLUMNS.values() if c.report), key=lambda c: c.report)
    for name in ([f"{c.name}_{s}" for s in c.report_stats] or [c.name]))


def base_column(name: str) -> tuple[str, str | None]:
    """Split an aggregate name ``<column>_<stat>`` into ``(column, stat)``; ``(name, None)`` otherwise. A per-request
    aggregate aggregated again over the point (``display_lag_s_mean_p50``) resolves to its column too."""
    for stat in STATS:
        if name.endswith("_" + stat):
            stem = name[: -len(stat) - 1]
            if stem in COLUMNS:
                return stem, stat
            inner, inner_stat = base_column(stem) if any(stem.endswith("_" + s) for s in STATS) else (stem, None)
            if inner_stat is not None and inner in COLUMNS:
                return inner, f"{inner_stat} {stat}"
    return name, None


def qualifiers() -> tuple[str, ...]:
    """Suffixes that qualify a registered column: an SLO preset's name or ``custom`` (``slo_attainment_rag``, the
    attainment under that preset) and a request class (:data:`REQUEST_CLASSES`)."""
    from workbench.stats import slo

    return tuple(slo.PRESETS) + ("custom",) + REQUEST_CLASSES


def is_registered(name: str) -> bool:
    """Whether ``name`` is a registered column, an aggregate of one, an interval bound of either, a design's decision
    column of one (:data:`DECISION`), or any of those qualified by an SLO preset or a request class (:func:`qualifiers`)."""
    for q in qualifiers():
        if name.endswith("_" + q) and len(name) > len(q) + 1 and _registered(name[: -len(q) - 1]):
            return True
    return _registered(name)


def _registered(name: str) -> bool:
    if name in COLUMNS or base_column(name)[0] in COLUMNS:
        return True
    for suffix in BOUNDS + DECISION:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if stem in COLUMNS or base_column(stem)[0] in COLUMNS:
                return True
    return False


def unregistered(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that the registry lacks (sorted), for the check on every recorded point."""
    return sorted({str(n) for n in names if not is_registered(str(n))})


def check_registered(names: Iterable[str], where: str) -> None:
    """Raise when ``$WORKBENCH_STRICT_COLUMNS`` is set and a table holds a column the registry lacks.

    Raises:
        ValueError: naming the table and the unregistered columns (add them to ``workbench/stats/columns.csv``).
    """
    if os.environ.get(STRICT_ENV, "") not in ("", "0"):
        missing = unregistered(names)
        if missing:
            raise ValueError(f"{where}: columns not in workbench/stats/columns.csv: {', '.join(missing)}")


def label(name: str) -> str:
    """Axis label of a column or aggregate (``ttft_s_p50`` -> ``TTFT p50 (s)``); the name itself if unknown."""
    col, stat = base_column(name)
    if col not in COLUMNS:
        return name.replace("_", " ")
    lab = COLUMNS[col].label
    if stat is None:
        return lab
    if "(" in lab:
        head, tail = lab.split("(", 1)
        return f"{head.rstrip()} {stat} ({tail}"
    return f"{lab} {stat}"
