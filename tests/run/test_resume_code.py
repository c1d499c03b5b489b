"""Resume on the same code only (issue 51): a run's identity holds the workbench's git commit and a hash of the
package's sources (uncommitted edits included); a resume across a code change is refused in one line naming it
(exit 2), unless ``--allow-changed``. Before, the commit was recorded per session and never compared, and an
editable install's package version never moves, so a pull that changed a library default between a failed point and
``--resume`` mixed settings silently."""

import shutil
from pathlib import Path

import pytest

from workbench import cli
from workbench.errors import ParameterError
from workbench.run import notebooks, results, resume_check

NB = str(notebooks.NOTEBOOKS_DIR / "01_batch_size.ipynb")
ENTRIES = [{"notebook": NB, "parameters": {}}]


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """The session's package sources are a copy the test may edit (an uncommitted change, or a pull)."""
    copy = tmp_path / "workbench"
    shutil.copytree(Path(resume_check.__file__).resolve().parents[1], copy,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    monkeypatch.setattr(resume_check.paths, "PACKAGE", copy)
    return copy


def test_the_sources_hash_moves_with_any_edit_and_only_then(package_copy):
    real = resume_check.sources_sha256(Path(resume_check.__file__).resolve().parents[1])
    assert resume_check.sources_sha256(package_copy) == real       # the same tree: the same hash
    target = package_copy / "serving" / "options.py"
    target.write_text(target.read_text().replace("MAX_QUEUE = 64", "MAX_QUEUE = 65"))
    assert resume_check.sources_sha256(package_copy) != real


def test_a_resume_across_a_code_change_is_refused_naming_it(package_copy, capsys):
    run = results.create_run()
    resume_check.record(run, ENTRIES, resume=False)
    assert resume_check.check_resume(run, ENTRIES) == []           # the same code resumes
    target = package_copy / "serving" / "options.py"               # what a git pull (or an edit) may change
    target.write_text(target.read_text().replace("MAX_QUEUE = 64", "MAX_QUEUE = 65"))
    with pytest.raises(ParameterError) as exc:
        resume_check.check_resume(run, ENTRIES)
    msg = str(exc.value)
    assert "\n" not in msg and "code: workbench sources" in msg and "--allow-changed" in msg
    code = cli.main(["sweep", NB, "--resume", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "code: workbench sources" in err[0], err
    # the existing explicit override still lets it through, naming what changed
    assert any(d.startswith("code: workbench sources") for d in resume_check.check_resume(run, ENTRIES, True))


def test_a_changed_commit_is_named(monkeypatch):
    from workbench.measure import device

    run = results.create_run()
    monkeypatch.setattr(device, "git_commit", lambda: "aaaaaaaaaaaa0000")
    resume_check.record(run, ENTRIES, resume=False)
    monkeypatch.setattr(device, "git_commit", lambda: "bbbbbbbbbbbb1111")
    with pytest.raises(ParameterError, match="code: commit aaaaaaaaaaaa -> bbbbbbbbbbbb"):
        resume_check.check_resume(run, ENTRIES)


def test_a_run_that_recorded_no_code_is_not_taken_for_the_same_code():
    run = results.create_run()
    identity = resume_check.run_identity(ENTRIES)
    identity.pop("code")                                           # a run recorded before code identities
    results.update_manifest(run, resume_identity=identity)
    with pytest.raises(ParameterError, match="code: not recorded by the run"):
        resume_check.check_resume(run, ENTRIES)
