"""The scheduling experiment's arms and outcomes, and the per-run statistics its two designs judge
(:mod:`workbench.experiments.scheduling`, notebook ``11_scheduling``).

The run is the unit: :func:`run_values` and :func:`run_statistics` reduce a run (point) to the statistics the
policy design and the prefix design decide on; :func:`usable_runs`, :func:`designed_arms` and :func:`verdict_word`
are what the policies' and the prefix design's tables read the points with (:mod:`.policies`, :mod:`.prefix`).
"""

from __future__ import annotations

import pandas as pd

from workbench.run import design
from workbench.serving import options
from workbench.stats import blocks, evidence, metrics
from workbench.stats.classes import served_rows

EXPERIMENT = "scheduling"
PREFIX_DESIGN = "scheduling_prefix"   # the prefix-sharing design's name (design/scheduling_prefix.parquet)
CONTROL = "fcfs"             # the policies' marked control
AA_ARM = "fcfs_aa"           # the A/A control's second fcfs arm (its runs' points)
PREFIX_AA_ARM = "off_aa"     # the prefix design's A/A arm: sharing off again (its runs' points)
#: the policies' per-run outcomes: the interactive class's mean TTFT (primary) and the background class's mean e2e
INTERACTIVE = design.Outcome("ttft_s_mean_interactive", False, "interactive TTFT (the class's mean per run)",
                             "interactive_ttft_ratio")
BACKGROUND = design.Outcome("e2e_s_mean_background", False, "background e2e (the class's mean per run)",
                            "background_e2e_ratio")
#: the prefix design's per-run outcome: the mean TTFT of the run's served requests (sharing on over off)
SHARING = design.Outcome("ttft_s_mean", False, "run TTFT (the mean of its requests)", "sharing_ttft_ratio")
WORKLOADS = ("mixed", "multiturn", "shared_prefix")
PREFIX_WORKLOADS = ("multiturn", "shared_prefix")
#: the engines that can apply every policy (:func:`workbench.serving.options.engines_taking`)
ENGINES = options.engines_taking("sjf")
TRACE_FIELDS = ("offset_s", "prompt_tokens", "output_tokens", "request_class")
TIME_WORDS = ("slower", "faster")   # a ratio of times above / below 1


def mean_of(values) -> float:
    """The mean of ``values`` read as numbers, non-numbers and NaN left out; NaN when none is left."""
    v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").dropna()
    return float(v.mean()) if len(v) else float("nan")


def run_values(rows) -> dict:
    """A mixed run's statistics (the policy design's outcomes): the interactive class's mean TTFT and the background
    class's mean e2e over the run's served requests (:func:`workbench.stats.classes.served_rows`), seconds; NaN for a
    class without a served request."""
    g = served_rows(pd.DataFrame(rows))
    cls = g["request_class"] if "request_class" in g else pd.Series("interactive", index=g.index)
    return {INTERACTIVE.name: mean_of(g.loc[cls == "interactive", "ttft_s"]) if "ttft_s" in g else float("nan"),
            BACKGROUND.name: mean_of(g.loc[cls == "background", "e2e_s"]) if "e2e_s" in g else float("nan")}


def positive_values(values: dict, what: str) -> dict:
    """``values`` when each is a positive number, else a one-line error naming the run (a design needs a value of
    each outcome from every run)."""
    bad = [k for k, v in values.items() if not (v == v and v > 0)]
    if bad:
        raise RuntimeError(f"{what}: no served request for {', '.join(bad)} (every request failed or was abandoned)")
    return values


def _p(values, pct: int) -> float:
    return metrics.percentiles(pd.to_numeric(values, errors="coerce"), (pct,))[f"p{pct}"]


def usable_runs(points: pd.DataFrame) -> pd.DataFrame:
    """The usable points (:func:`workbench.stats.evidence.usable_points`; serving rules for the mixed workload)."""
    if points is None or points.empty:
        return pd.DataFrame()
    use = evidence.usable_points(points)
    mixed = use.get("workload", pd.Series("mixed", index=use.index)) == "mixed"
    return pd.concat([evidence.usable_points(use[mixed], serving=True), use[~mixed]])


def _arm_of(r: dict) -> str:
    arm = r.get("arm")
    if isinstance(arm, str) and arm:
        return arm
    share = bool(r.get("prefix_sharing") or False) if r.get("prefix_sharing") == r.get("prefix_sharing") else False
    return ("on" if share else "off") if r.get("workload") in PREFIX_WORKLOADS else str(r.get("policy"))


def run_statistics(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per usable run (point; :func:`usable_runs`): ``point_id``, ``workload``, ``arm`` (the policy,
    :data:`AA_ARM`, or ``off`` / ``on`` / :data:`PREFIX_AA_ARM` for prefix sharing), ``replicate`` (its round, 0 in
    runs before rounds), ``prefix_sharing`` and the per-run statistics the designs judge, over the run's served requests: the
    interactive class's mean TTFT and the background class's mean e2e (:func:`run_values`) and the mean TTFT of all
    of them (``ttft_s_mean``), seconds."""
    cols = ["point_id", "workload", "arm", "replicate", "prefix_sharing", INTERACTIVE.name, BACKGROUND.name,
            SHARING.name]
    use = usable_runs(points)
    if use.empty or requests is None or requests.empty or "point_id" not in requests:
        return pd.DataFrame(columns=cols)
    out = []
    for r in use.to_dict("records"):
        rows = requests[requests["point_id"] == r["point_id"]]
        g = served_rows(rows)
        rep = r.get("replicate")
        share = r.get("prefix_sharing")
        out.append({"point_id": r["point_id"], "workload": r.get("workload", "mixed"), "arm": _arm_of(r),
                    "replicate": int(rep) if rep is not None and rep == rep else 0,
                    "prefix_sharing": bool(share) if share == share and share is not None else False,
                    **run_values(rows), SHARING.name: mean_of(g.get("ttft_s", []))})
    return pd.DataFrame(out, columns=cols)


def designed_arms(points: pd.DataFrame, outcome: design.Outcome, workloads, usable: bool = True) -> pd.DataFrame:
    """Usable points of ``workloads`` that carry a design's decision columns of ``outcome``, one row per arm (its
    runs carry the same decision), indexed by the arm: the policy (or :data:`AA_ARM`) for the mixed workload,
    ``<workload>_<arm>`` (``multiturn_on``, ``multiturn_off_aa``, ...) for a prefix workload. ``usable``: usable
    points only (:func:`usable_runs`), else every finished one."""
    use = usable_runs(points) if usable else (points[points["status"].eq("ok")] if points is not None and len(points)
                                          and "status" in points else pd.DataFrame())
    if use.empty or "design" not in use or f"{outcome.prefix}_verdict" not in use:
        return pd.DataFrame()
    use = use[use.get("workload", pd.Series("mixed", index=use.index)).isin(workloads) & use["design"].notna()]
    if use.empty:
        return use
    keys = [_arm_of(r) if r.get("workload", "mixed") == "mixed" else f"{r['workload']}_{_arm_of(r)}"
            for r in use.to_dict("records")]
    return use.assign(_arm=keys).drop_duplicates("_arm").set_index("_arm")


def verdict_word(d: blocks.Decision | None, lower: str = "faster", higher: str = "slower") -> str:
    """A decision's verdict in one word: ``faster`` / ``slower`` (a direction), ``equivalent`` or ``undecided``."""
    if d is None:
        return "undecided"
    if d.verdict == "direction":
        return lower if d.direction == "lower" else higher
    return d.verdict
