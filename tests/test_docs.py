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


PKG = ROOT / "workbench"
#: the package's folders: its layers, and the experiments' own folders (``experiments/engine_tuning/``)
FOLDERS = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*") if (p / "__init__.py").is_file())


def _layout_block(readme: str) -> str:
    """The README's layout section's tree (the first fenced block after ``## Layout``)."""
    section = readme.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_the_readme_layout_names_every_folder_and_no_other():
    """The README's tree shows each folder of the package (an experiment's folder inside ``experiments/``'s entry), and
    names no layer folder the package does not have (a moved or renamed one)."""
    block = _layout_block((ROOT / "README.md").read_text(encoding="utf-8"))
    top = {f for f in FOLDERS if "/" not in f}
    missing = [f for f in FOLDERS if f"{f.split('/')[-1]}/" not in block or (f in top and f"  {f}/" not in block)]
    assert not missing, f"README.md's layout section does not show workbench/{missing}"
    package_tree = re.split(r"\n(?=\S)", block.split("\nworkbench/", 1)[1], maxsplit=1)[0]
    shown = set(re.findall(r"^  (\w+)/", package_tree, re.M))
    assert shown == top, f"README.md's layout shows layers the package lacks: {sorted(shown - top)}"


def test_the_package_docstring_maps_every_layer_folder():
    """``workbench/__init__.py``'s map (one line a layer, lowest first) names each layer folder once, and nothing
    else."""
    import workbench

    shown = re.findall(r"^    (\w+)/ ", workbench.__doc__, re.M)
    layers = sorted(f for f in FOLDERS if "/" not in f)
    assert sorted(shown) == layers, f"the package docstring maps {sorted(shown)}, the package has {layers}"


def test_the_version_is_written_once():
    """pyproject.toml's version is the package's ``__version__``."""
    import workbench

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    version = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M).group(1)
    assert version == workbench.__version__, f"pyproject.toml {version} vs workbench.__version__ {workbench.__version__}"


def test_make_test_runs_every_quiet_test():
    """``make test`` runs the tests marked ``quiet`` alone after the parallel part, from the files its
    ``QUIET_TESTS`` names (collecting the whole tree again costs seconds): a quiet test in any other file would
    never run. The files naming the mark (a decorator or a module's ``pytestmark``) are read from the source text."""
    listed = set(re.search(r"^QUIET_TESTS\s*=\s*(.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
                 .group(1).split())
    holding = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
               if p != Path(__file__) and re.search(r"pytest\.mark\.quiet\b", p.read_text(encoding="utf-8"))}
    assert holding and holding <= listed, sorted(holding - listed)
    assert all((ROOT / f).is_file() for f in listed), listed
