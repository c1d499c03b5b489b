"""Repeated looks at a comparison without inflating its error: when to look, and the alpha each look may spend.

A design that adds rounds until its comparison is decided looks at the data several times; deciding at the first
look whose interval excludes 1 would claim a direction far more often than ``alpha`` when the arms are identical.
The rule here is **alpha spending** (Lan and DeMets 1983, "Discrete sequential boundaries for clinical trials"):
a spending function ``f(t)`` with ``f(0) = 0`` and ``f(1) = alpha`` gives the error that may have been spent by
the information fraction ``t = rounds / max_rounds``, and look ``k`` is analysed at ``f(t_k) - f(t_{k-1})``.

Each look's intervals are simultaneous over its arms at that look's level (:func:`workbench.stats.blocks.analyse`),
and the looks are combined by the union bound (Bonferroni over looks): the chance that ANY look's interval misses
its true ratio is at most ``sum_k alpha_k = alpha``. That covers every decision read off the intervals at once, a
false direction and a false equivalence alike, whatever the stopping rule, at the price of being conservative
(the exact group-sequential boundaries would use the looks' correlation). With the O'Brien-Fleming-type spending
function (the default) early looks spend almost nothing, so a comparison is stopped early only for a large effect
and the last look keeps most of ``alpha``; the looks are few (:func:`looks`: the first, then doubling), which is
what keeps the union bound close to exact. ``tests/stats/test_sequential.py`` simulates the error rates.

- :func:`looks`: the rounds at which a design looks (``min_rounds``, then doubling, then ``max_rounds``).
- :func:`spent`: the spending function (``obrien-fleming`` or ``pocock``, Lan-DeMets forms).
- :func:`look_alpha`: the alpha of one look.
"""

from __future__ import annotations

import functools
import math

from workbench.errors import ParameterError

ALPHA = 0.05
SPENDING = ("obrien-fleming", "pocock")


def looks(min_rounds: int, max_rounds: int) -> list[int]:
    """The rounds after which a design analyses its table: ``min_rounds``, then doubling, then ``max_rounds``
    (e.g. 3, 6, 12 for 3..12; 3, 5 for 3..5; just 4 when both are 4).

    Raises:
        ParameterError: ``min_rounds`` below 1, or ``max_rounds`` below ``min_rounds``.
    """
    if not isinstance(min_rounds, int) or isinstance(min_rounds, bool) or min_rounds < 1:
        raise ParameterError(f"min_rounds: an integer >= 1 (got {min_rounds!r})")
    if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < min_rounds:
        raise ParameterError(f"max_rounds: an integer >= min_rounds ({min_rounds}) (got {max_rounds!r})")
    out, r = [], min_rounds
    while r < max_rounds:
        out.append(r)
        r *= 2
    return out + [max_rounds]


@functools.lru_cache(maxsize=4096)   # a design looks at a handful of fractions; simulations call it ~10^4 times
def spent(t: float, alpha: float = ALPHA, kind: str = "obrien-fleming") -> float:
    """The error spent by information fraction ``t`` (Lan and DeMets 1983).

    ``obrien-fleming``: ``2 - 2 * Phi(z_{1 - alpha/2} / sqrt(t))``; ``pocock``: ``alpha * ln(1 + (e - 1) t)``.

    Args:
        t: information fraction in [0, 1] (rounds so far / the most rounds the design may take).
        alpha: the total error.
        kind: one of :data:`SPENDING`.

    Raises:
        ParameterError: an unknown kind, or alpha outside (0, 1).
    """
    from scipy import stats

    if kind not in SPENDING:
        raise ParameterError(f"spending: must be one of {', '.join(SPENDING)} (got {kind!r})")
    if not 0 < alpha < 1:
        raise ParameterError(f"alpha: must be in (0, 1) (got {alpha})")
    t = min(max(float(t), 0.0), 1.0)
    if t <= 0:
        return 0.0
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))


def look_alpha(rounds: int, plan: list[int], alpha: float = ALPHA, kind: str = "obrien-fleming") -> float:
    """The error one look may spend: ``spent(t_k) - spent(t_{k-1})`` with ``t = rounds / plan[-1]``.

    Args:
        rounds: the rounds at this look (one of ``plan``; a look between planned ones spends up to its rounds,
            from the planned look before it).
        plan: the design's looks (:func:`looks`), ascending; the last is the most rounds it may take.
        alpha: the total error over every look.

    Returns:
        The look's alpha (> 0).

    Raises:
        ParameterError: an empty plan, or ``rounds`` beyond the plan's last look.
    """
    if not plan:
        raise ParameterError("plan: at least one look")
    if rounds > plan[-1]:
        raise ParameterError(f"rounds: {rounds} is beyond the design's last look ({plan[-1]} rounds)")
    before = max((r for r in plan if r < rounds), default=0)
    total = plan[-1]
    return max(spent(rounds / total, alpha, kind) - spent(before / total, alpha, kind), 1e-12)
