"""Shared fixtures: offline mode, a results root per test session, the real default model.

The tests mirror the package: ``tests/<folder>/test_<module>.py`` tests ``workbench/<folder>/<module>.py``
(``tests/test_layout.py`` fails when a folder of ``workbench/`` has no test folder). Every folder here is a package
(an ``__init__.py``), so two folders may hold files of the same name (pytest imports them as
``tests.<folder>.test_<module>``) and a test imports this file's helpers as ``from tests.conftest import ...``.

At the top level stay the tests of the top-level modules (``test_checks.py``) and the tests that cut across the
folders, because no one module owns what they check:

- ``test_layout.py``: the package's shape (layers, no import up, one formula home, notebooks equal their sources,
  a test folder per package folder);
- ``test_docs.py``: the design document and the test files the repository cites exist;
- ``test_default_suite.py``: the default suite's parameters against the evidence each experiment needs;
- ``test_faults.py``: runs killed at a random point and resumed, killed mid-write, two writers, a full disk: from
  the command line down to the run folder;
- ``test_browser.py``: the report and the explorer notebook in JupyterLab, in headless Chromium.
"""
import contextlib
import gc
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads sleep instead of spinning between parallel regions: on a shared 2-core CI machine the test
# process and a papermill kernel would otherwise spin against each other (measured ~10x slower generation).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One thread a process: `make test` runs two workers on two cores, and each starts kernels, commands and Ray
# workers; torch's default (a thread per core in every process) oversubscribes the cores. The whole suite ran in
# ~0.8x the time with one (results/LOG.md, 2026-12-06 evening). Tests check behaviour, not speed.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The device probe (peak bandwidth and FLOP/s: ~3-5 s a process at one thread) stands for the machine for the whole
# session: measured once before the workers start (pytest_configure) and read by every process the tests start
# (workbench.measure.device.PROBE_REUSE_S; a test checks behaviour, not the probe's figures).
os.environ.setdefault("WORKBENCH_PROBE_REUSE_S", "7200")
# Reports skip the static PNG/SVG figures (a Chromium start per report) unless a test asks for them.
os.environ.setdefault("WORKBENCH_FIGURES", "none")

import pytest  # noqa: E402

# Before any test module imports nbformat, papermill or jupytext: workbench.run.notebooks keeps jsonschema from
# building rfc3987_syntax's Lark grammar in this process (see there). That import took 5-8 s when a test module's
# collection reached it first (~1.6 s in a plain interpreter; measured 2026-12-06).
import workbench.run.notebooks  # noqa: E402,F401


def _tests_own_cache() -> None:
    """The tests keep their cache files apart from the user's: ``$WORKBENCH_CACHE/tests`` (``~/.cache/workbench/
    tests`` by default) becomes the cache root of this process and of every process it starts (kernels,
    commands, Ray workers). A roofline calibration fitted here is measured while the other test worker loads
    the CPU (``make test`` runs two), and the user's next ``make run`` would have to refit it; the converted
    models are shared (``models`` links to the user's folder: the conversion is the same, and written
    atomically by whichever process gets there first)."""
    real = Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench")
    if os.environ.get("WORKBENCH_TESTS_CACHE") == str(real):   # already set up (an xdist worker's parent)
        return
    ours = real / "tests"
    (real / "models").mkdir(parents=True, exist_ok=True)
    ours.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # the other worker may link it at the same moment
        if not (ours / "models").is_symlink():
            (ours / "models").symlink_to(real / "models", target_is_directory=True)
    os.environ["WORKBENCH_CACHE"] = os.environ["WORKBENCH_TESTS_CACHE"] = str(ours)


_tests_own_cache()
# every point a test records must carry only registered columns (workbench/stats/columns.csv); kernels inherit it
os.environ["WORKBENCH_STRICT_COLUMNS"] = "1"


def _share_one_tls_context() -> None:
    """httpx builds a TLS context for every client (loading certifi's CA bundle: ~35 ms of CPU here), and
    ``httpx.get/post/stream`` open a client per call: the tests' ~400 loopback calls spent ~13 s on it. The session
    shares one default context, as the workbench's own clients do (:func:`workbench.load.client.ssl_context`).
    Only the default (``verify=True``, no client certificate) is shared; if httpx moves the name, nothing is
    patched."""
    import functools

    try:
        import httpx._transports.default as transports
    except ImportError:
        return
    real = getattr(transports, "create_ssl_context", None)
    if real is None:
        return
    shared = functools.lru_cache(maxsize=2)(lambda trust_env: real(verify=True, cert=None, trust_env=trust_env))

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is True and cert is None:
            return shared(bool(trust_env))
        return real(verify=verify, cert=cert, trust_env=trust_env)

    transports.create_ssl_context = create_ssl_context


_share_one_tls_context()


@pytest.fixture(autouse=True)
def _results_root(tmp_path, monkeypatch):
    """Every test writes run folders under its own tmp folder, never into the repo's results/."""
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "results"))


@pytest.fixture(scope="session")
def loaded():
    """The embedded SmolLM2-135M-Instruct on CPU in float32 (converted once, then cached): loaded once per test
    run. Every later ``models.load_model("default", "cpu"/"auto", "float32"/"auto")`` in this process returns this
    same object, even after the loader's small memo (2 entries) has moved on to other models (engine tuning loads
    several variants); other models load as before."""
    from workbench.measure import models

    model = models.load_model("default", device="cpu", dtype="float32")
    # what lives for the whole session (imports, the model) is frozen out of the cycle collector, as a run's
    # shared kernel does after its first notebook: each later gc.collect (a peak-memory window's, the continuous
    # engine's stop) scans only what the tests made since (~0.4-0.5 s a collection otherwise)
    gc.collect()
    gc.freeze()
    real = models._load_cached
    pinned_path = str(models.resolve_model_path("default"))

    def load_cached(path, spec, dev, dtype_name, trust_remote_code, allow_pickle, attn_implementation=None):
        if (path, spec, dev, dtype_name, trust_remote_code, allow_pickle, attn_implementation) == \
                (pinned_path, "default", "cpu", "torch.float32", False, False, None):
            return model
        return real(path, spec, dev, dtype_name, trust_remote_code, allow_pickle, attn_implementation)

    patch = pytest.MonkeyPatch()
    patch.setattr(models, "_load_cached", load_cached)
    yield model
    patch.undo()


class Reached(BaseException):
    """Raised by the stand-ins below: a model load or a kernel start was reached (no ``except Exception``
    on the way may swallow it)."""


@contextlib.contextmanager
def resident_bytes(nbytes: int):
    """``nbytes`` of fresh anonymous pages (``mmap``), all touched, resident while the block runs and unmapped
    after it. A plain ``np.ones`` is no such thing late in a test session: malloc serves it from free chunks the
    heap already holds, so the process's resident size (and VmHWM) does not move at all."""
    import mmap

    import numpy as np

    m = mmap.mmap(-1, nbytes)
    view = np.frombuffer(m, dtype=np.uint8)
    view[:] = 1
    try:
        yield
    finally:
        del view
        m.close()


class LoopbackHTTPServer:
    """A ``BaseHTTPRequestHandler`` class served on a free loopback port from a daemon thread, for the fake peers
    of the tests (``with LoopbackHTTPServer(Handler) as srv: srv.base_url``); stopped and closed on exit."""

    def __init__(self, handler):
        from http.server import ThreadingHTTPServer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        import threading

        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeSSE(LoopbackHTTPServer):
    """A stdlib HTTP server answering ``POST /v1/chat/completions`` with a fixed SSE stream (no model): two
    content chunks, a final chunk with the engine's figures, a usage chunk counting 3 tokens, ``[DONE]``
    (``with FakeSSE() as srv: srv.base_url``)."""

    def __init__(self):
        import json
        from http.server import BaseHTTPRequestHandler

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks = [{"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
                          {"choices": [{"delta": {"content": "lo"}, "finish_reason": None}]},
                          {"choices": [{"delta": {}, "finish_reason": "length"}],
                           "engine": {"queue_s": 0.01, "prefill_s": 0.02, "tpot_s": 0.03, "itl_s": [0.03, 0.03],
                                      "engine_ttft_s": 0.05}},
                          {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}]
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *a):
                pass

        super().__init__(Handler)


def no_work(monkeypatch):
    """Make reaching any model load, papermill kernel or run folder raise :class:`Reached`."""
    import papermill

    from workbench.measure import models
    from workbench.run import notebooks, results

    def reached(what):
        def boom(*a, **k):
            raise Reached(f"{what} was reached before the error")
        return boom

    monkeypatch.setattr(models, "load_model", reached("a model load"))
    monkeypatch.setattr(notebooks, "execute_notebook", reached("a notebook kernel"))
    monkeypatch.setattr(papermill, "execute_notebook", reached("a papermill kernel"))
    monkeypatch.setattr(results, "create_run", reached("run folder creation"))


@pytest.fixture
def cli(capsys):
    """``workbench ARGS`` in this process (``workbench.cli.main``, from the repo root), with every model load,
    kernel start and run-folder creation made to raise during the call: returns ``(exit status, stdout,
    stderr)``. The command's own exit path (``python -m workbench.cli``) is covered by the subprocess tests
    that remain."""
    from workbench import cli as cli_module

    def call(*args):
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            no_work(mp)
            mp.chdir(Path(__file__).resolve().parents[1])  # the repo root, like the subprocess tests
            try:
                code = cli_module.main([str(a) for a in args])
            except SystemExit as exc:  # argparse's own errors
                code = exc.code
        out = capsys.readouterr()
        return code, out.out, out.err
    return call


def execute_in_process(nb, params: dict, run_dir) -> dict:
    """Run a notebook's code cells in this test process, the way papermill runs them in a kernel: the ``parameters``
    cell, then ``params`` and ``run_dir`` (papermill's injected cell), then every other code cell in order, in the
    notebook's folder, with ``WORKBENCH_HEADLESS=1`` (what :func:`workbench.run.notebooks.execute_notebook` gives its
    kernels) and ``figure.show()`` drawing nothing.

    For tests of what a notebook's cells do: they share this process's imports, its loaded default model (the
    ``loaded`` fixture), its device probe and its drift reference instead of paying a kernel start, a fresh import
    of everything and a model load each. The drift reference is measured once and stands for the whole notebook
    (``REFERENCE_REUSE_S`` raised: each sweep's start reference reused, no end reference; 2-4 references of ~1.5 s
    each a notebook otherwise): what a drift does to a sweep's points is tested in ``run/test_drift.py`` and
    ``run/test_sweeps.py`` (stand-in references), and the references themselves by the real command's sessions
    (``test_faults.py``). The kernel path itself (papermill, parameter injection, the command line)
    is tested through real kernels in ``cli/test_cli.py``, ``test_faults.py`` and ``experiments/test_explorer.py``.

    Returns:
        The notebook's namespace after its last cell.

    Raises:
        AssertionError: a cell raised (the cell's number and first line, chained to the error).
    """
    import json

    import plotly.basedatatypes
    from IPython.display import display

    nb = Path(nb)
    cells = [c for c in json.loads(nb.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    namespace = {"__name__": "__main__", "display": display}
    from workbench.run import drift

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(nb.parent)
        mp.setenv("WORKBENCH_HEADLESS", "1")
        mp.setattr(drift, "REFERENCE_REUSE_S", 3600.0)
        mp.setattr(plotly.basedatatypes.BaseFigure, "show", lambda self, *a, **k: None)
        for i, cell in enumerate(cells, 1):
            source = "".join(cell["source"])
            exec(compile(source, f"{nb.name}[cell {i}]", "exec"), namespace)
            if "parameters" in cell.get("metadata", {}).get("tags", []):
                namespace.update(params, run_dir=str(Path(run_dir).resolve()))
    return namespace


@pytest.fixture
def run_notebook(loaded):
    """:func:`execute_in_process`, after the session's default model is loaded (the notebook's own
    ``models.load_model`` then returns it)."""
    return execute_in_process


def pytest_configure(config):
    """In ``make test``'s controller (pytest-xdist's ``-n``, before its workers start, on a machine with nothing
    else running yet): the session's one device probe, written to the tests' cache for every process to read
    (~3-5 s each at one thread, paid by ~40 processes before: kernels, commands, servers, Ray workers). A probe
    that comes out noisy is not shared (each process then measures its own, as before)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from workbench.measure import device

    device.probe_device("cpu", "float32")


#: Rough seconds a test of each mark takes here, for ordering only (see pytest_collection_modifyitems).
_MARK_COST_S = {"notebook": 15.0, "ray": 10.0, "browser": 5.0, "simulation": 5.0, "model": 1.0}


def pytest_collection_modifyitems(session, config, items):
    """Test files in order of their expected cost, the dearest first (a stable sort: tests keep their order
    within a file). With ``make test``'s workers (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``) the
    long files - the faulted sweep, the Ray cluster, the notebooks - start at once instead of last, so no
    worker is left running one of them alone at the end. The cost of a file is the sum over its tests of the
    dearest mark's :data:`_MARK_COST_S` (0.05 s unmarked)."""
    cost: dict = {}
    for item in items:
        marks = [_MARK_COST_S[m.name] for m in item.iter_markers() if m.name in _MARK_COST_S]
        cost[item.path] = cost.get(item.path, 0.0) + max(marks, default=0.05)
    items.sort(key=lambda item: -cost[item.path])


@pytest.fixture(autouse=True)
def one_drift_reference(monkeypatch):
    """A drift reference (~1.8 s: the fastest of 3 short requests) stands for the machine's speed through a test
    process (``REFERENCE_REUSE_S`` raised): each sweep's start reference reuses the last one and gets no end reference,
    and a speed probe reads it too. What a drift does to a sweep's points is tested in ``run/test_drift.py`` and
    ``run/test_sweeps.py`` (stand-in references, :func:`fake_references`, which follows this window), and the
    references themselves by the command's sessions in ``test_faults.py`` (their own processes, their own window)."""
    from workbench.run import drift

    monkeypatch.setattr(drift, "REFERENCE_REUSE_S", 3600.0)


def fake_references(monkeypatch, values, age_s: float | None = None) -> None:
    """Stand-ins for the drift reference: each sweep's start reference is the next of ``values``, measured
    ``age_s`` ago (default: 45 s beyond ``REFERENCE_REUSE_S``, whatever the tests set it to: the sweep gets an
    end reference), and its end reference the next one after it."""
    import time

    from workbench.run import drift

    age_s = drift.REFERENCE_REUSE_S + 45.0 if age_s is None else age_s
    refs = iter(values)
    monkeypatch.setattr(drift, "start", lambda loaded: drift.Start(next(refs), time.monotonic() - age_s))
    monkeypatch.setattr(drift, "reference_tpot_s", lambda loaded, max_age_s=0.0: next(refs))
