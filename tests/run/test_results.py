"""Run folders: ids, safety, atomic point records, load()."""
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench import ParameterError
from workbench.run import results


def test_run_ids_unique_sortable_and_labels_checked(monkeypatch):
    import datetime as dt

    ids = [results.new_run_id("x") for _ in range(50)]
    assert len(set(ids)) == 50
    # sortable: ids made later sort later, across every field of the stamp (zero-padded, most significant first)
    times = [dt.datetime(2026, 9, 9, 9, 9, 9), dt.datetime(2026, 9, 9, 9, 9, 10), dt.datetime(2026, 9, 9, 9, 10, 0),
             dt.datetime(2026, 9, 9, 10, 0, 0), dt.datetime(2026, 9, 10, 0, 0, 0), dt.datetime(2026, 10, 1, 0, 0, 0),
             dt.datetime(2027, 1, 1, 0, 0, 0)]
    clock = iter(times)

    class FakeDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return next(clock).replace(tzinfo=tz)

    with monkeypatch.context() as mp:
        mp.setattr(results._dt, "datetime", FakeDatetime)
        made = [results.new_run_id() for _ in times]
    assert sorted(made) == made and len(set(made)) == len(made)
    assert made[0].startswith("20260909T090909Z-")
    for bad in ["../escape", "a/b", "..", "/abs", ""[:0] + " space"]:
        with pytest.raises(ParameterError):
            results.new_run_id(bad)


def test_runs_never_overwrite_and_stay_inside_root(tmp_path):
    a, b = results.create_run(), results.create_run()
    assert a != b and a.parent == b.parent == results.results_root()
    with pytest.raises(ParameterError):
        results.open_run(tmp_path / "elsewhere")
    with pytest.raises(ParameterError):
        results.open_run(str(results.results_root() / ".." / "x"))


def test_record_point_replaces_rows_of_the_same_point():
    run = results.create_run()
    req = pd.DataFrame({"point_id": ["p1", "p1"], "ttft_s": [1.0, 2.0], "itl_s": [[0.1], [0.2, 0.3]]})
    results.record_point(run, "p1", req, {"point_id": "p1", "status": "failed: x"}, {"status": "failed: x"})
    assert results.finished_points(run) == set()
    results.record_point(run, "p1", req, {"point_id": "p1", "status": "ok"}, {"status": "ok"})
    results.record_point(run, "p2", req.assign(point_id="p2"), {"point_id": "p2", "status": "ok"}, {"status": "ok"})
    got = results.read_requests(run)
    assert sorted(got["point_id"]) == ["p1", "p1", "p2", "p2"]
    assert list(got["itl_s"].iloc[1]) == [0.2, 0.3]
    assert results.read_points(run)["status"].tolist() == ["ok", "ok"]
    assert results.finished_points(run) == {"p1", "p2"}


def test_load_many_runs_and_globs():
    runs = [results.create_run(label=f"r{i}") for i in range(2)]
    for i, run in enumerate(runs):
        df = pd.DataFrame({"run_id": [run.name], "point_id": ["p"], "ttft_s": [float(i)]})
        results.record_point(run, "p", df, {"run_id": run.name, "point_id": "p", "status": "ok"}, {"status": "ok"})
    both = results.load(str(results.results_root() / "*"))
    assert sorted(both["run_id"]) == sorted(r.name for r in runs)
    assert len(results.load(runs, table="points")) == 2
    with pytest.raises(ParameterError):
        results.load(results.results_root() / "missing")


def test_save_figure_and_text_stay_in_run():
    run = results.create_run()
    results.save_figure(run, "fig_a", go.Figure(go.Scatter(x=[1], y=[2])))
    assert (run / "figures" / "fig_a.json").exists() and (run / "figures" / "fig_a.html").exists()
    assert (run / "figures" / "plotly.min.js").exists()        # one copy of plotly.js per run, offline
    assert 'src="plotly.min.js"' in (run / "figures" / "fig_a.html").read_text()
    assert results.read_manifest(run)["figures"] == ["fig_a"]
    with pytest.raises(ParameterError):
        results.save_figure(run, "../x", go.Figure())
    with pytest.raises(ParameterError):
        results.save_text(run, "../../x.txt", "no")
    assert results.save_text(run, "texts/a.txt", "你好").read_text(encoding="utf-8") == "你好"


def test_a_figure_saved_again_drops_its_static_copies_of_before():
    """A fresh user's ``--rerun-invalid`` rewrote a figure's JSON and HTML, and its PNG / SVG kept showing the old
    invalid points: a figure saved again removes its static copies (the next ``--figures`` export writes them)."""
    run = results.create_run()
    results.save_figure(run, "fig_a", go.Figure(go.Scatter(x=[1], y=[2])))
    results.save_figure(run, "fig_b", go.Figure(go.Scatter(x=[1], y=[2])))
    for name in ("fig_a", "fig_b"):
        for fmt in results.STATIC_FIGURE_FORMATS:
            (run / "figures" / f"{name}.{fmt}").write_bytes(b"the figure before")
    results.save_figure(run, "fig_a", go.Figure(go.Scatter(x=[1], y=[3])))
    assert not [fmt for fmt in results.STATIC_FIGURE_FORMATS if (run / "figures" / f"fig_a.{fmt}").exists()]
    assert all((run / "figures" / f"fig_b.{fmt}").exists() for fmt in results.STATIC_FIGURE_FORMATS)   # untouched


def test_each_session_keeps_its_environment():
    run = results.create_run()
    results.begin_session(run)
    results.update_manifest(run, environment={"host": "a", "git_commit": "c1"})
    results.update_manifest(run, environment={"bandwidth_bytes_per_s": 1.0})   # same session: merged
    results.begin_session(run, resume=True)
    results.update_manifest(run, environment={"host": "b", "git_commit": "c2"})
    m = results.read_manifest(run)
    assert m["environment"] == {"host": "a", "git_commit": "c1", "bandwidth_bytes_per_s": 1.0}   # the first
    assert [s["environment"]["host"] for s in m["sessions"]] == ["a", "b"]
    assert [s["resume"] for s in m["sessions"]] == [False, True]


def test_corrupt_manifest_is_a_one_line_parameter_error():
    run = results.create_run()
    (run / "manifest.json").write_text("{torn")
    with pytest.raises(ParameterError, match="not a valid manifest"):
        results.read_manifest(run)


def test_writes_are_atomic_with_unique_temporary_names(monkeypatch):
    run = results.create_run()
    seen = []
    real_replace = results.os.replace

    def spy(src, dst):
        seen.append(str(src))
        assert not str(dst).endswith(".tmp") and results.Path(src).exists()
        return real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", spy)
    for _ in range(2):
        results.update_manifest(run, status="running")
    assert len(set(seen)) == 2 and all(s.endswith(".tmp") and "/." in s for s in seen)
