"""The design the code refers to is in the repository: every ``docs/design.md section N`` points at a section a clone
has, and nothing points at a design document outside it."""

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
