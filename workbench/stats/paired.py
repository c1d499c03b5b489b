"""Paired binary outcomes (docs/design.md section 11): :func:`paired_binary`, a 0/1 outcome of the same tasks under
two arms (accuracy at two budgets, answers with and without compression) compared by McNemar's exact test with the
exact conditional interval of the difference, and an unconditional interval for equivalence.
:mod:`workbench.stats.blocks` re-exports it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from workbench.errors import ParameterError
from workbench.stats.decisions import ALPHA, additive_verdict, level_text


def paired_binary(a: Sequence, b: Sequence, alpha: float = ALPHA, margin: float = 0.10) -> dict:
    """A binary outcome (correct / not) of the same tasks under two arms: the difference of the shares
    ``mean(a) - mean(b)`` with an exact conditional interval and McNemar's exact test
    (``statsmodels.stats.contingency_tables.mcnemar``) on the discordant pairs.

    The interval: given ``k = n10 + n01`` discordant tasks, ``n10 ~ Binomial(k, pi)`` and the difference is
    ``(2 pi - 1) k / n``; the Clopper-Pearson interval of ``pi`` (``statsmodels.stats.proportion.proportion_confint``,
    ``method="beta"``) maps to the difference's (the conditional method behind McNemar's exact test: conservative,
    and a direction exactly when the discordant tasks lean one way beyond chance). That interval holds the share of
    discordant tasks at its observed ``k / n``, which decides a direction (its sign is ``pi``'s) but not an
    equivalence: one task of 12 flipping gives +-8 points where up to ~40% of tasks might flip. Equivalence needs the
    unconditional interval inside ``+-margin``: the difference is ``(2 pi - 1) delta`` with ``delta`` the discordant
    share, bounded over the Clopper-Pearson intervals of ``pi`` and of ``delta`` at ``alpha / 2`` each (Bonferroni);
    with no discordant task it is ``+-`` the upper bound of ``delta`` (60 tasks, none flipping: +-7 points).

    Args:
        a, b: per task 0/1 (or bool), the same tasks in the same order; a pair with a missing side is dropped.
        alpha: the error of the interval (``1 - alpha`` coverage; pass a Bonferroni level for many).
        margin: the equivalence margin on the difference of shares (0.10: +-10 points).

    Returns:
        ``{"difference", "low", "high", "n", "discordant": (n10, n01), "p_mcnemar", "verdict", "direction",
        "method", "unconditional": (low, high)}``: a direction as :func:`additive_verdict` rules on the conditional
        interval; equivalent when the unconditional interval lies inside ``+-margin``.

    Raises:
        ParameterError: ``a`` and ``b`` of different lengths or with values other than 0/1.
    """
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.proportion import proportion_confint

    x = pd.Series(list(a), dtype="float")
    y = pd.Series(list(b), dtype="float")
    if len(x) != len(y):
        raise ParameterError(f"a, b: must pair task by task (got {len(x)} and {len(y)} values)")
    keep = x.notna() & y.notna()
    x, y = x[keep].to_numpy(), y[keep].to_numpy()
    if not (np.isin(x, (0, 1)).all() and np.isin(y, (0, 1)).all()):
        raise ParameterError("a, b: binary outcomes are 0 or 1 per task")
    n = int(x.size)
    nan = float("nan")
    if n == 0:
        return {"difference": nan, "low": nan, "high": nan, "n": 0, "discordant": (0, 0), "p_mcnemar": nan,
                "verdict": "undecided", "direction": "", "method": "no tasks"}
    n11 = int(((x == 1) & (y == 1)).sum())
    n10 = int(((x == 1) & (y == 0)).sum())
    n01 = int(((x == 0) & (y == 1)).sum())
    n00 = int(((x == 0) & (y == 0)).sum())
    k = n10 + n01
    diff = (n10 - n01) / n
    if k == 0:
        lo = hi = 0.0
        p = 1.0
    else:
        plo, phi = proportion_confint(n10, k, alpha=alpha, method="beta")
        lo, hi = (2 * plo - 1) * k / n, (2 * phi - 1) * k / n
        p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue)
    v, direction = additive_verdict(lo, hi, margin)
    dlo, dhi = proportion_confint(k, n, alpha=alpha / 2, method="beta")          # the discordant share
    slo, shi = proportion_confint(n10, k, alpha=alpha / 2, method="beta") if k else (0.0, 1.0)
    ulo, uhi = min((2 * slo - 1) * dlo, (2 * slo - 1) * dhi), max((2 * shi - 1) * dlo, (2 * shi - 1) * dhi)
    if v == "equivalent" or k == 0:
        v = "equivalent" if -margin <= ulo and uhi <= margin else "undecided"
    return {"difference": diff, "low": lo, "high": hi, "n": n, "discordant": (n10, n01), "p_mcnemar": p,
            "verdict": v, "direction": direction, "unconditional": (float(ulo), float(uhi)),
            "method": f"exact conditional interval over {n} paired tasks ({n10}+{n01} discordant), McNemar exact "
                      f"p = {p:.2g}; unconditional {level_text(1 - alpha)} interval {ulo * 100:+.0f} to {uhi * 100:+.0f} "
                      f"points (equivalence)"}
