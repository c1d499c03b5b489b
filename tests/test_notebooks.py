"""Notebook parameters, suites, YAML parsing and papermill's view of the parameters cells."""
import json
from pathlib import Path

import pytest

from workbench import ParameterError, notebooks

NB = Path(__file__).resolve().parents[1] / "notebooks" / "01_batch_size.ipynb"


def test_notebook_parameters_are_literals_and_unknown_names_rejected():
    params = notebooks.notebook_parameters(NB)
    assert params["batch_sizes"] == [1, 2, 4, 8] and params["run_dir"] == ""
    with pytest.raises(ParameterError, match="^batch_size: not a parameter"):
        notebooks.validate_parameters(NB, {"batch_size": [1]})
    with pytest.raises(ParameterError, match="^batch_sizes:"):
        notebooks.validate_parameters(NB, {"batch_sizes": [0]})
    merged = notebooks.validate_parameters(NB, {"batch_sizes": [2]})
    assert merged["batch_sizes"] == [2] and merged["max_new_tokens"] == params["max_new_tokens"]


def test_notebooks_are_committed_clean():
    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        data = json.loads(nb.read_text())
        assert {"kernelspec", "language_info"} <= set(data["metadata"]), nb.name
        code = [c for c in data["cells"] if c["cell_type"] == "code"]
        assert "parameters" in code[0]["metadata"].get("tags", []), nb.name
        assert all(not c.get("outputs") for c in code), nb.name


def test_suites_validate():
    for name in ("default", "quick"):
        suite = notebooks.load_suite(name)
        for e in suite["notebooks"]:
            notebooks.validate_parameters(e["notebook"], e["parameters"])
    with pytest.raises(ParameterError, match="^suite:"):
        notebooks.load_suite("nope")


def test_papermill_parses_every_parameter_line():
    """papermill drops a parameter whose comment it cannot parse (e.g. one holding '='): keep them all documented."""
    import papermill as pm

    for nb in sorted(NB.parent.glob("[0-9]*.ipynb")):
        ours = notebooks.notebook_parameters(nb)
        theirs = pm.inspect_notebook(str(nb))
        assert set(theirs) == set(ours), nb.name
        assert all(p["help"] for p in theirs.values()), nb.name


@pytest.mark.parametrize("text,value", [("5e-2", 0.05), ("1E3", 1000.0), ("[1e-3, 2]", [0.001, 2]), ("0.25", 0.25),
                                        ("7", 7), ("true", True), ("fast", "fast")])
def test_yaml_reads_scientific_notation_as_floats(text, value):
    assert notebooks.load_yaml(text) == value


@pytest.mark.parametrize("text,message", [
    ("notebooks:\n- parameters: {}\n", "has no 'notebook:'"),
    ("notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n  parameters:\n", "must be a mapping"),
    ("notebooks:\n- notebook: notebooks/01_batch_size.ipynb\n- notebook: notebooks/01_batch_size.ipynb\n",
     "appears twice"),
])
def test_malformed_suites_are_one_line_errors(tmp_path, text, message):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ParameterError, match="^suite: .*" + message):
        notebooks.load_suite(str(f))
