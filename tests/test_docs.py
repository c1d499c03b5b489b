"""The design and the tests the code refers to are in the repository: every ``docs/design.md section N`` points at a
section a clone has, nothing points at a design document outside it, and every ``tests/...py`` cited exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def _texts():
    for d in ("workbench", "tests", "benchmarks", "notebooks", "docs"):
        for p in (ROOT / d).rglob("*"):
            if p.suffix in (".py", ".md", ".yaml", ".csv") and p.is_file():
                yield p, p.read_text(encoding="utf-8")
    for name in ("README.md", "Makefile"):
        yield ROOT / name, (ROOT / name).read_text(encoding="utf-8")


def test_every_design_reference_names_a_section_the_repository_has():
    sections = {int(m) for m in re.findall(r"^## (\d+)\.", DESIGN.read_text(encoding="utf-8"), re.M)}
    assert {2, 4, 5, 6, 7} <= sections
    bad = []
    for path, text in _texts():
        if path == Path(__file__):
            continue
        for m in re.finditer(r"design\.md(?:`{0,2})? section (\d+)", text):
            if int(m.group(1)) not in sections:
                bad.append(f"{path.relative_to(ROOT)}: section {m.group(1)}")
        for m in re.finditer(r"(?<![\w/])DESIGN\.md", text):
            bad.append(f"{path.relative_to(ROOT)}: docs/design.md (not in a clone; cite docs/design.md)")
    assert not bad, "\n".join(bad)


def test_the_design_names_every_layer_folder():
    text = DESIGN.read_text(encoding="utf-8")
    pkg = ROOT / "workbench"
    for folder in sorted(p.name for p in pkg.iterdir() if (p / "__init__.py").exists()):
        assert f"  {folder}/" in text, f"docs/design.md section 2 does not show workbench/{folder}/"


def test_every_test_file_the_repository_cites_exists():
    """A docstring or comment that sends the reader to ``tests/...py`` names a file a clone has (the tests move
    with the package: tests/conftest.py)."""
    texts = list(_texts()) + [(p, p.read_text(encoding="utf-8")) for p in sorted((ROOT / "suites").glob("*.yaml"))]
    cited = {(path.relative_to(ROOT).as_posix(), m) for path, text in texts
             for m in re.findall(r"(?<![\w/.])tests/[\w/]+\.py\b", text)}
    assert len(cited) >= 5, "the pattern finds no citation: is it still the repository's way to cite a test file?"
    missing = sorted(f"{where}: {name}" for where, name in cited if not (ROOT / name).is_file())
    assert not missing, "cited test files the repository lacks:\n" + "\n".join(missing)
