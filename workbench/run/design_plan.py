"""What a design costs and can decide, for ``workbench plan`` (:mod:`workbench.run.design`, docs/design.md section
11): :func:`remember_spread` keeps the spread a finished design measured on this machine, :func:`recalled_spread`
reads it back, :func:`smallest_effect` is the smallest ratio a design of that spread can call a direction and
:func:`plan_text` says it in one line (with :data:`DEFAULT_SIGMA` before any run measured one).
:mod:`workbench.run.design` re-exports them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.stats import blocks, sequential

if TYPE_CHECKING:
    from workbench.run.design import DesignResult

DEFAULT_SIGMA = 0.05      # the log-scale spread assumed by ``workbench plan`` before any run has measured one


def _spread_file() -> Path:
    from workbench.paths import cache_root

    return cache_root() / "design_spread.json"


def _suite_of(run_dir) -> str:
    """The name of the suite a run folder was started from (its manifest's ``suite``: ``default``, ``quick``, a YAML
    file's stem), or ``""`` (a ``workbench sweep``, no folder)."""
    try:
        from workbench.run import results

        suite = results.read_manifest(Path(run_dir)).get("suite") or ""
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return Path(str(suite)).stem if suite else ""


def remember_spread(result: DesignResult, run_dir=None) -> None:
    """Keep what this design measured on this machine (the primary's residual SD on the log scale, the seconds per
    round and per arm-measurement) for ``workbench plan`` (:func:`recalled_spread`), as the experiment's latest and
    as its latest in the run's suite (its seconds are those of that suite's parameters: a quick run's rounds are not
    a default run's); best effort, never raises.

    Args:
        result: the finished design.
        run_dir: its run folder (its name is the record's ``run_id``, its manifest's suite the record's ``suite``), or
            a run id, or None.
    """
    an = result.analysis
    if an is None or not (an.sigma > 0) or not result.rounds:
        return
    try:
        path = _spread_file()
        data = json.loads(path.read_text()) if path.exists() else {}
        suite = _suite_of(run_dir) if run_dir is not None else ""
        record = {
            "sigma": float(an.sigma), "arms": len(result.design.measured_arms()),
            "seconds_per_round": float(result.seconds_per_round),
            "seconds_per_measurement": float(result.seconds_per_round / len(result.design.measured_arms())),
            "run_id": Path(str(run_dir)).name if run_dir is not None else "", "suite": suite,
            # a folder (not a bare run id): where the run lies, for the clones that share this machine's record
            "run_dir": str(Path(run_dir).resolve()) if isinstance(run_dir, Path) or "/" in str(run_dir) else "",
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data[result.design.experiment] = record
        if suite:
            data[f"{result.design.experiment}@{suite}"] = record
        from workbench.paths import write_cache_text

        write_cache_text(path, json.dumps(data, indent=1))
    except (OSError, ValueError):
        pass


def recalled_spread(experiment: str, suite: str = "") -> dict | None:
    """What the last design of ``experiment`` on this machine measured (:func:`remember_spread`): in a run of
    ``suite`` when there is one, else its latest in any run; None when none."""
    try:
        data = json.loads(_spread_file().read_text())
    except (OSError, ValueError):
        return None
    return (data.get(f"{experiment}@{suite}") if suite else None) or data.get(experiment)


def _where(known: dict) -> str:
    """Where the run a recalled spread came from lies, when not in this checkout's results (the record is the
    machine's, :func:`workbench.paths.cache_root`, shared by every clone): ``" (in /other/clone/results)"``,
    ``" (no longer on disk)"``, or ``""``."""
    from workbench.run import results

    recorded = known.get("run_dir")
    if not recorded:
        return ""
    folder = Path(recorded)
    if not folder.is_dir():
        return " (no longer on disk)"
    return "" if folder.parent == results.results_root() else f" (in {folder.parent})"


def smallest_effect(sigma: float, n_arms: int, rounds: int, alpha: float = blocks.ALPHA) -> float:
    """The smallest ratio a balanced design of ``n_arms`` measured arms (the A/A one included) and ``rounds`` rounds
    can call a direction at the observed spread: ``exp(c * sigma * sqrt(2 / rounds))`` with Dunnett's value over the
    ``n_arms - 1`` comparisons (:func:`workbench.stats.blocks.planning_critical_value`) at ``alpha``."""
    if not (sigma > 0) or rounds < 2 or n_arms < 2:
        return float("nan")
    dof = (rounds - 1) * (n_arms - 1)
    c = blocks.planning_critical_value(n_arms - 1, dof, alpha)
    return float(math.exp(c * sigma * math.sqrt(2 / rounds)))


def plan_text(experiment: str, n_arms: int, min_rounds: int, max_rounds: int, aa: bool = True,
              seconds_per_measurement: float | None = None, suite: str = "") -> str:
    """One line for ``workbench plan``: the smallest effect the design can decide at its last look (from the spread
    the last run of the experiment on this machine measured, in ``suite`` when one did, or :data:`DEFAULT_SIGMA`)
    and the time its rounds take: that run's seconds a measurement when it ran ``suite``, else
    ``seconds_per_measurement`` (the roofline's prediction for these parameters); a design that cannot decide an
    effect below 2x says so."""
    measured = n_arms + (1 if aa else 0)
    known = recalled_spread(experiment, suite)
    same = bool(known) and bool(suite) and known.get("suite") == suite
    sigma = known["sigma"] if known else DEFAULT_SIGMA
    other = ((f", in a run of suite {known['suite']}" if known.get("suite") else ", with other parameters")
             if known and suite and not same else "")
    source = f"the spread run {known.get('run_id') or '?'}{_where(known)} measured on this machine{other}" \
        if known else f"no run on this machine yet: an assumed spread of {DEFAULT_SIGMA:g} on the log scale"
    plan = sequential.looks(min_rounds, max_rounds)
    last = sequential.look_alpha(max_rounds, plan)
    eff = smallest_effect(sigma, measured, max_rounds, last)
    per = ((known or {}).get("seconds_per_measurement") if same or not suite else None) or seconds_per_measurement
    rounds = f"{min_rounds}-{max_rounds} rounds" if max_rounds > min_rounds else f"{max_rounds} rounds"
    secs = (f", {rounds} ~{per * measured * min_rounds:.0f}"
            f"{f'-{per * measured * max_rounds:.0f}' if max_rounds > min_rounds else ''} s" if per else f", {rounds}")
    warn = "  (cannot decide an effect below 2x: add rounds or cut the spread)" if not eff < 2 else ""
    return (f"{experiment}: {n_arms} arms{' + A/A' if aa else ''}{secs}; smallest decidable effect: {eff:.2f}x "
            f"at {max_rounds} rounds ({source}){warn}")
