"""Searching a configuration grid without measuring all of it: coordinate descent, one axis at a time.

:func:`coordinate_search` walks a grid of knobs (``{axis: [values]}``, :func:`workbench.run.sweeps.expand_grid`)
from a start configuration, trying every value of one axis while holding the others and keeping the best, the way
a tuner bisects one knob at a time; it stops when a pass changes nothing or its budget of evaluations is spent,
and says which. Axes that only exist together (``joint``, e.g. ``torch.compile`` only with a static cache) are
searched as one. The cost of a configuration is the caller's (a measurement, or a lookup in a measured grid to
replay a search afterwards; :mod:`workbench.experiments.engine_tuning`).
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Sequence

from workbench.run import sweeps


def coordinate_search(axes: dict[str, list], evaluate: Callable[[dict], float], start: dict | None = None,
                      budget: int | None = None, is_valid: Callable[[dict], bool] = lambda c: True,
                      joint: Sequence[str] = ()) -> tuple[dict, dict]:
    """Coordinate descent over a configuration grid: from ``start`` (default: the first value of each axis),
    try every value of one axis while holding the others, keep the best, go to the next axis; repeat passes
    until a pass changes nothing or the budget is spent. The ``joint`` axes, when all are in ``axes``, are
    searched as one axis of their valid combinations (engine tuning's ``cache_implementation`` and ``compile``:
    ``dynamic``, ``static``, ``static+compile``, since compile only exists with a static cache).

    The result is the grid's optimum only when the knobs do not interact; ``converged`` says whether the last
    pass tried every neighbour of the result (a coordinate-wise optimum) or the budget cut the search short
    (then the result may be beaten by a configuration the search never measured).

    Args:
        axes: ``{axis: [values]}``.
        evaluate: cost of a configuration (lower is better; ``inf`` for one that fails the SLO or guard).
        budget: most configurations evaluated (default: a third of the valid grid, but at least one full pass,
            the baseline plus every other value of every axis once).
        is_valid: False for a configuration that cannot run (never evaluated; default: every one can).
        joint: axes searched together (default: none).

    Returns:
        ``(best configuration, {config key: cost} of every evaluated configuration, converged)``.
    """
    names = list(axes)
    grid = [c for c in sweeps.expand_grid(**axes) if is_valid(c)]
    wanted = tuple(joint)
    joint = [a for a in wanted if a in axes]
    search_axes: dict[str, list] = {}
    for a in names:
        if a in joint and len(joint) == len(wanted):
            if a == joint[0]:
                search_axes["+".join(joint)] = [v for v in itertools.product(*(axes[j] for j in joint))
                                                if is_valid(dict(zip(joint, v)))]
        else:
            search_axes[a] = list(axes[a])
    if budget is None:
        budget = max(1, len(grid) // 3, 1 + sum(len(v) - 1 for v in search_axes.values()))

    def expand(c: dict) -> dict:
        out = {}
        for a, v in c.items():
            out.update(dict(zip(joint, v)) if "+" in a else {a: v})
        return out

    seen: dict = {}
    refused = [False]  # the budget refused a configuration in this pass

    def cost(c):
        full = expand(c)
        key = tuple(full[a] for a in names)
        if key not in seen:
            if not is_valid(full):
                return math.inf
            if len(seen) >= budget:
                refused[0] = True
                return math.inf
            seen[key] = evaluate(dict(full))
        return seen[key]

    current = {a: v[0] for a, v in search_axes.items()}
    if start:
        current = {a: (tuple(start[j] for j in joint) if "+" in a else start[a]) for a in search_axes}
    best = cost(current)
    changed = True
    while changed:  # configurations already measured cost nothing; unmeasured ones past the budget are refused
        changed, refused[0] = False, False
        for a, values in search_axes.items():
            for v in values:
                cand = {**current, a: v}
                c = cost(cand)
                if c < best:
                    current, best, changed = cand, c, True
    return expand(current), seen, not refused[0]
