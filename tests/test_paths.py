"""The ground floor's paths: the workbench cache's atomic writes and the entries a machine's processes share."""
import json
import threading
import time

from workbench import paths


def test_a_cache_file_is_never_seen_torn_or_empty_by_a_concurrent_reader(tmp_path):
    """The roofline calibration and the weights-hash memo are read by processes that start while another
    writes them: every read sees no file or a whole one."""
    path = tmp_path / "c" / "calibration.json"
    texts = [f'{{"n": {i}, "pad": "{"x" * 20000}"}}' for i in range(2)]
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            try:
                seen.add(len(path.read_text()))
            except FileNotFoundError:
                seen.add(None)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            paths.write_cache_text(path, texts[i % 2])
    finally:
        stop.set()
        reader.join()
    assert seen - {None} <= {len(t) for t in texts}, sorted(s for s in seen if s is not None)[:5]
    assert path.read_text() == texts[1] and [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_machine_entry_is_read_within_its_window_on_this_machine_only(monkeypatch, tmp_path):
    """An entry written by one process is read by another within ``max_age_s`` with its age; past the window, under
    another key or written on another machine (host or boot) it is not; old entries are dropped on the next write."""
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    assert paths.read_machine_entry("m.json", "k", 60.0) is None                 # no file yet
    paths.write_machine_entry("m.json", "k", {"x": 1.5})
    age_s, entry = paths.read_machine_entry("m.json", "k", 60.0)
    assert 0 <= age_s < 5 and entry["x"] == 1.5
    assert paths.read_machine_entry("m.json", "other", 60.0) is None
    data = json.loads((tmp_path / "m.json").read_text())
    (key, value), = data.items()
    assert key.startswith(paths.machine_id() + "|")
    data[key] = {**value, "measured_at": time.time() - 120}
    (tmp_path / "m.json").write_text(json.dumps(data))
    assert paths.read_machine_entry("m.json", "k", 60.0) is None                 # older than the window
    assert paths.read_machine_entry("m.json", "k", 600.0)[1]["x"] == 1.5
    monkeypatch.setattr(paths, "machine_id", lambda: "another-host|another-boot")
    assert paths.read_machine_entry("m.json", "k", 600.0) is None                # another machine's
    data[key]["measured_at"] = time.time() - paths.MACHINE_ENTRY_KEEP_S - 1
    (tmp_path / "m.json").write_text(json.dumps(data))
    paths.write_machine_entry("m.json", "k", {"x": 2.0})
    assert list(json.loads((tmp_path / "m.json").read_text())) == ["another-host|another-boot|k"]   # stale dropped
