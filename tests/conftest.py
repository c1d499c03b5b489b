"""Shared fixtures: offline mode, a results root per test session, the real default model."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads sleep instead of spinning between parallel regions: on a shared 2-core CI machine the test
# process and a papermill kernel would otherwise spin against each other (measured ~10x slower generation).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _results_root(tmp_path, monkeypatch):
    """Every test writes run folders under its own tmp folder, never into the repo's results/."""
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "results"))


@pytest.fixture(scope="session")
def loaded():
    """The embedded SmolLM2-135M-Instruct on CPU in float32 (converted once, then cached)."""
    from workbench import models

    return models.load_model("default", device="cpu", dtype="float32")
