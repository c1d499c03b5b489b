"""Which points a move of the machine's speed leaves valid: the arms of an interleaved design whose rounds absorb it.

A drift of a sweep's reference pair (:func:`workbench.run.drift.check`) and other load or CPU steal measured over a
whole design (:func:`workbench.run.point_result.point_rows`) mark a point invalid, except an arm of an interleaved
design whose control stayed steady between neighbouring rounds and whose A/A control did not move
(:func:`absorbed_by_rounds`; docs/design.md section 11).
"""

from __future__ import annotations

import math

from workbench.checks import float_or_nan
from workbench.stats.evidence import DRIFT_LIMIT


def absorbed_by_rounds(row: dict) -> bool:
    """Whether a move of the machine's speed across a design leaves ``row`` valid - a drift of the sweep's reference
    pair (:func:`workbench.run.drift.check`) or other load and CPU steal measured over the whole design
    (:func:`workbench.run.point_result.point_rows`): the point is an arm of an interleaved
    design (``design`` set by :mod:`workbench.run.design`) whose control moved at most :data:`DRIFT_LIMIT` between
    neighbouring rounds and whose A/A control did not show a direction. The control's move is the smaller of its
    two readings, each a time that a change of the machine's speed moves alike: its requests' median TPOT
    (``round_speed_drift``: the decode step, what the reference pair measures) and its primary outcome
    (``round_drift``). Each also moves by its own noise - a queue's TTFT with the load (149% between rounds where
    the TPOT moved 12%), a TPOT over 3 decode gaps or a short answer (33% where the time to first answer token moved
    4%) - so the steadier one bounds the speed's move; finite only with 2 rounds or more.

    The pair measured before and after a sweep says the machine's speed moved across it; a design measures its control
    every round (a reference at the rounds' pace) and analyses the rounds as blocks, so a move across the rounds is
    a block effect that its ratios do not carry, and only a move *within* a round - seen as the control's change
    between neighbouring rounds - or the A/A control moving makes its points untrustworthy (issue 49: a sweep-wide
    drift of 27-49% on a busy VM marked whole designed experiments invalid while their controls moved by a few
    percent a round). Other load and steal are measured over the whole design, the same figure for every arm, and
    slow every arm's rounds alike on average (the order within a round is shuffled): a block effect as well, and a
    burst that hit one arm's measurement shows as the control's step or in the A/A control. A point measured on
    its own, with one round, or without a control reading stays judged by the pair and by its own load."""
    return (isinstance(row.get("design"), str) and bool(row.get("design")) and math.isfinite(design_step(row))
            and design_step(row) <= DRIFT_LIMIT and row.get("aa_verdict") != "direction")


def design_step(row: dict) -> float:
    """The control's largest move between neighbouring rounds (:func:`absorbed_by_rounds`): the smaller of its two
    readings, NaN when neither is known."""
    steps = [v for v in (float_or_nan(row.get("round_speed_drift")), float_or_nan(row.get("round_drift")))
             if math.isfinite(v)]
    return min(steps) if steps else float("nan")


__all__ = ["absorbed_by_rounds", "design_step"]
