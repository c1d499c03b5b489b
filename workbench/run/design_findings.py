"""A design's decision as a point row carries it, said in a finding (:mod:`workbench.run.design`, docs/design.md
section 11): :func:`decision_from_row` (the row's :class:`workbench.stats.blocks.Decision`), :func:`secondary_clause`
(a secondary outcome's clause), :func:`evidence_text` (the design's evidence in one line), :func:`finding_fields` (a
:class:`workbench.stats.evidence.Finding`'s decision fields) and :func:`weakest` (the decision that sets the verdict of
a finding resting on several). Every experiment reads them as ``design.<name>``: :mod:`workbench.run.design`
re-exports them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from workbench import checks
from workbench.stats import blocks

if TYPE_CHECKING:
    from workbench.run.design import Outcome


def decision_from_row(row, outcome: Outcome) -> blocks.Decision | None:
    """The decision a point row carries (:meth:`workbench.run.design.DesignResult.point_columns`), None when the row
    has none (the control, an arm not compared, a point measured without a design)."""
    p = outcome.prefix
    verdict = row.get(f"{p}_verdict")
    if not isinstance(verdict, str) or verdict not in blocks.VERDICTS:
        return None
    num = (lambda k: checks.float_or_nan(row.get(k)))
    need = num("rounds_needed")
    return blocks.Decision(str(row.get("point_id", "")), "", num(p), num(f"{p}_low"), num(f"{p}_high"),
                           num(f"{p}_level"), verdict, str(row.get(f"{p}_direction") or ""), num("margin"),
                           int(num("rounds")) if math.isfinite(num("rounds")) else 0, float("nan"),
                           str(row.get(f"{p}_method") or ""), float("nan"),
                           int(need) if math.isfinite(need) else (0 if verdict != "undecided" else None),
                           "" if math.isfinite(num(f"{p}_low")) else str(row.get(f"{p}_method") or ""))


def secondary_clause(row, outcome: Outcome, name: str, words: tuple[str, str] | None = None) -> str | None:
    """A secondary outcome's decision as a point row carries it, as a clause: its verdict and simultaneous interval
    (:meth:`workbench.stats.blocks.Decision.describe`, ``words`` the names of a ratio above / below 1, by default
    the outcome's), without a rounds estimate: the row's ``rounds_needed`` is the primary outcome's, the one the
    design adds rounds for. None when the row has no decision of ``outcome``."""
    d = decision_from_row(row, outcome)
    if d is None:
        return None
    if d.decided:
        return d.describe(name, words=words or outcome.words)
    return f"{name}: undecided: " + (f"{d.interval_text()} ({d.method})" if d.shown else d.interval_text())


def evidence_text(row) -> str:
    """A design's evidence as a point row carries it: ``"3 interleaved rounds (stopped: decided), 42 s; A/A
    1.01x (0.96-1.06x), undecided; equivalence margin +-5%"``."""
    num = (lambda k: checks.float_or_nan(row.get(k)))
    rounds = int(num("rounds")) if math.isfinite(num("rounds")) else 0
    aa = (f"A/A control {num('aa_ratio'):.2f}x ({num('aa_low'):.2f}-{num('aa_high'):.2f}x), "
          f"{row.get('aa_verdict') or 'no verdict'}" if math.isfinite(num("aa_low")) else "no A/A interval")
    margin = num("margin")
    return (f"{rounds} {row.get('design') or 'interleaved'} rounds (stopped: {row.get('design_stopped') or '?'}), "
            f"{num('design_seconds'):.0f} s; {aa}; equivalence margin +-{margin - 1:.0%}")


def finding_fields(row, decision: blocks.Decision | None = None, *, verdict: str | None = None,
                   rounds_needed: int | None = None) -> dict:
    """The decision fields of a :class:`workbench.stats.evidence.Finding` from a point row of a design:
    ``verdict``, ``margin``, ``rounds``, ``seconds`` and, undecided, ``rounds_needed`` / ``seconds_needed``
    (``decision`` overrides the row's own verdict, e.g. a pick judged against its runner-up; ``verdict`` and
    ``rounds_needed`` override both, for a finding that combines several decisions)."""
    num = (lambda k: checks.float_or_nan(row.get(k)))
    need = decision.rounds_needed if decision is not None else None
    if verdict is not None:
        need = rounds_needed
    verdict = verdict or (decision.verdict if decision is not None else str(row.get("verdict") or "undecided"))
    secs = num("seconds_per_round")
    out = {"verdict": verdict, "margin": num("margin") if math.isfinite(num("margin")) else None,
           "rounds": int(num("rounds")) if math.isfinite(num("rounds")) else 0,
           "seconds": num("design_seconds") if math.isfinite(num("design_seconds")) else None}
    if verdict == "undecided":
        out["rounds_needed"] = need
        out["seconds_needed"] = (max(need - out["rounds"], 0) * secs if need is not None and math.isfinite(secs)
                                 else None)
    return out


def weakest(decisions: Sequence[blocks.Decision | None]) -> blocks.Decision | None:
    """The decision that sets the verdict of a finding resting on several comparisons (one per prompt family,
    language or batch size): an undecided one, the one needing the most rounds (None, "more than any", first);
    else a direction; else an equivalent one. None when there is no decision.

    Args:
        decisions: the comparisons' decisions (None entries are left out).
    """
    got = [d for d in decisions if d is not None]
    if not got:
        return None
    open_ = [d for d in got if not d.decided]
    if open_:
        return max(open_, key=lambda d: math.inf if d.rounds_needed is None else d.rounds_needed)
    return next((d for d in got if d.verdict == "direction"), got[0])
