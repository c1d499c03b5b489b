"""The model cache under concurrent processes: two sweeps, Ray workers or parallel test workers may start at
the same moment on an empty cache; each must end with a whole cache entry, never a torn file or a crash."""
from pathlib import Path

import pytest

from workbench import paths
from workbench.measure import models


def test_two_processes_converting_the_default_model_at_once_both_end_with_the_published_folder(tmp_path, monkeypatch):
    """The other process publishes its conversion while this one is still writing its own: this one's rename
    fails on the non-empty folder, and its result is the other's folder (its temporary copy removed)."""
    import transformers

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    gguf = tmp_path / "pkg" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(models, "default_gguf_path", lambda: gguf)
    winner = {}

    class Fake:
        config = object()
        hf_quantizer = "gguf"

        def save_pretrained(self, folder, **kw):
            folder = Path(folder)
            folder.mkdir(parents=True)
            (folder / "model.safetensors").write_text("mine")
            other = folder.with_name(folder.name.split(".tmp")[0])        # the other process got there first
            other.mkdir()
            (other / "model.safetensors").write_text("theirs")
            winner["target"] = other

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: Fake()))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        classmethod(lambda cls, *a, **k: type("T", (), {"save_pretrained": lambda self, f: None})()))
    folder = models.default_model_dir()
    assert folder == winner["target"] and (folder / "model.safetensors").read_text() == "theirs"
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]        # no temporary copy left behind
    assert models.default_model_dir() == folder                              # and the next call just finds it


def test_a_foreign_folder_in_the_way_is_not_overwritten(tmp_path):
    tmp, target = tmp_path / "x.tmp1", tmp_path / "x"
    tmp.mkdir()
    (tmp / "model.safetensors").write_text("new")
    target.mkdir()
    (target / "notes.txt").write_text("someone's")
    with pytest.raises(OSError):
        models.publish_folder(tmp, target, "model.safetensors")
    assert (target / "notes.txt").exists() and (tmp / "model.safetensors").exists()


def test_the_tests_calibrate_in_their_own_cache_and_share_the_converted_models():
    """A roofline calibration fitted under the test workers' load never becomes the user's (their next
    `make run` would refit it); the converted default model is the user's own folder, not a second copy."""
    from workbench.predict import roofline_calibration

    root = paths.cache_root()
    assert root.name == "tests" and (root / "models").resolve() == (root.parent / "models").resolve()
    path = roofline_calibration.cache_path(str(models.resolve_model_path("default")), "cpu", "float32", 2)
    assert path.is_relative_to(root) and not path.is_relative_to(root.parent / "roofline")
    assert models.resolve_model_path("default").resolve().is_relative_to((root.parent / "models").resolve())


_RESOLVE = ("import sys; from workbench.measure import models; print(*models.resolve_names(*sys.argv[1:]), "
            "'torch' in sys.modules)")


def _resolve(cache: Path, *args: str, **env) -> list[str]:
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _RESOLVE, *args], capture_output=True, text=True, check=True,
                         env={**os.environ, "WORKBENCH_CACHE": str(cache), **env})
    return out.stdout.split()


def test_a_command_resolves_auto_without_torch_once_this_machine_has(tmp_path):
    """resolve_names (the command line's run identity and config checks): the first process on this machine
    imports torch and keeps the answer; the next reads it without importing torch (~2 s a command), and gives
    pick_device / pick_dtype's names; other visible devices are another key."""
    first = _resolve(tmp_path, "auto", "auto")
    assert first[:2] == [models.pick_device("auto"), str(models.pick_dtype("auto", first[0])).split(".")[-1]]
    assert first[2] == "True"
    assert _resolve(tmp_path, "auto", "auto") == [*first[:2], "False"]
    assert _resolve(tmp_path, "auto", "auto", CUDA_VISIBLE_DEVICES="")[2] == "True"   # another key: resolved anew
    assert _resolve(tmp_path, "cpu", "bfloat16")[:2] == ["cpu", "bfloat16"]


def test_resolve_names_refuses_an_unknown_name_and_keeps_no_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    with pytest.raises(models.ParameterError, match="device: must be one of"):
        models.resolve_names("tpu")
    with pytest.raises(models.ParameterError, match="dtype: must be one of"):
        models.resolve_names("auto", "int8")
    if models.pick_device("auto") != "cuda":
        with pytest.raises(models.ParameterError, match="'cuda' requested"):
            models.resolve_names("cuda")
        assert not (tmp_path / models.RESOLVED_FILE).exists()            # nothing kept for a failure


def test_the_default_models_context_is_read_from_its_gguf_once_per_process(monkeypatch, tmp_path):
    """Before the default model's first conversion its context comes from the GGUF header, and ``gguf.GGUFReader``
    parses the whole file (~4-5 s here): every Config's validation asks, so ``workbench plan default`` on a machine
    that had not run yet took ~96 s (a new user's trial, 2026-12-07). Read once per process now."""
    import types

    import gguf

    calls = []

    class Reader:
        def __init__(self, path):
            calls.append(path)
            self.fields = {"llama.context_length": types.SimpleNamespace(parts=[[8192]], data=[0])}

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))   # no converted model here
    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    models.max_context_tokens.cache_clear()
    try:
        assert [models.max_context_tokens(models.DEFAULT_MODEL) for _ in range(5)] == [8192] * 5
        assert len(calls) == 1
    finally:
        models.max_context_tokens.cache_clear()


@pytest.mark.skipif(not models.gpu_driver_absent(), reason="a GPU driver is present: torch decides")
def test_cuda_on_a_machine_without_a_gpu_driver_is_refused_before_torch_loads():
    """A fresh user's ``-p device cuda`` took 5.7 s to be refused: the import of torch to ask it. With no GPU
    driver's device node (and ``mps`` off macOS) the answer is known without it."""
    import subprocess
    import sys

    code = ("import sys\nfrom workbench.measure import models\n"
            "for d in ('cuda', 'mps'):\n"
            "    try:\n        models.pick_device(d)\n    except models.ParameterError as e:\n        print(e)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("device: 'cuda' requested but this machine has no GPU driver") and "cpu" in lines[0]
    assert lines[1].startswith("device: 'mps' requested") == (sys.platform != "darwin")
