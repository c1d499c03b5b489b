"""The experiments' tests share one drift reference per model and worker."""

import pytest


@pytest.fixture(autouse=True)
def one_drift_reference(monkeypatch):
    """A drift reference (~1.8 s: the fastest of 3 short requests) stands for the machine's speed through these
    tests (``REFERENCE_REUSE_S`` raised): each sweep's start reference reuses the last one and gets no end reference,
    and a speed probe reads it too. What the experiments do is tested here; what a drift does to a sweep's points in
    ``run/test_drift.py`` and ``run/test_sweeps.py`` (stand-in references, :func:`conftest.fake_references`, which
    follows this window), and the references themselves by the command's sessions in ``test_faults.py``."""
    from workbench.run import drift

    monkeypatch.setattr(drift, "REFERENCE_REUSE_S", 3600.0)
