"""Every experiment whose points were all marked invalid says why and the way on (stats.evidence.nothing_valid), not
only that nothing is there: issue 49's run I, whose drift left batch size and context length without a valid point
and told the researcher to relax the SLO."""
import pandas as pd
import pytest

from workbench.experiments import long_output, reasoning_budget, streaming_anatomy, temperature
from workbench.experiments.context_compression import summaries as compression

REASON = "reference TPOT drifted 55% (59.0 -> 91.6 ms)"


def _points(**cols) -> pd.DataFrame:
    return pd.DataFrame({"point_id": ["p0", "p1"], "status": ["ok", "ok"], "valid": [False, False],
                         "invalid_reason": [REASON, REASON], **cols})


@pytest.mark.parametrize("name,finding", [
    ("reasoning", lambda pts: reasoning_budget.finding(pts.assign(reasoning_budget=[0, 32]))),
    ("compression", lambda pts: compression.finding(pts.assign(strategy=["none", "bm25"]), "results/r1")),
    ("streaming", lambda pts: streaming_anatomy.finding(pts.assign(sweep=["streaming", "streaming"]))),
    ("long output", lambda pts: long_output.finding(
        pd.DataFrame({"point_id": ["p0", "p1"], "strategy": ["one_shot", "outline_batch"], "language": ["en", "en"],
                      "wall_s": [1.0, 0.8]}), pts, "results/r1")),
    ("temperature", lambda pts: temperature.finding(
        pd.DataFrame({"metric": ["truncated"], "temperature": [0.0]}),
        pd.DataFrame({"point_id": ["p0", "p1"], "temperature": [0.0, 1.2], "truncated": [False, False]}), pts)),
])
def test_an_experiment_with_every_point_invalid_names_the_reason_and_the_rerun(name, finding):
    f = finding(_points())
    assert f.verdict == "undecided" and not f.supported, (name, f.text)
    assert "0 of 2 valid" in f.text and REASON in f.text and "--rerun-invalid" in f.text, (name, f.text)
