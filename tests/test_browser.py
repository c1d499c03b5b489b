"""Headless Chromium (Debian's ``chromium``, driven by Playwright): the report renders every figure
offline, and the explorer notebook shows its controls and live view in JupyterLab on loopback.

Skips with the reason when chromium or playwright is missing. Screenshots and page logs go to
``test-artifacts/`` (git-ignored). Playwright never downloads a browser here: it launches
``/usr/bin/chromium``.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pandas as pd
import plotly.express as px
import pytest

from workbench.experiments import explorer
from workbench.run import results
from workbench.share import report
from workbench.stats import metrics

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright not installed (pip install playwright; no `playwright install` needed)")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


def _point(batch_size, ttft):
    reqs = [{"request_id": i, "repeat": 0, "prompt_tokens": 64, "output_tokens": 5, "ttft_s": ttft, "prefill_s": ttft / 2,
             "e2e_s": ttft + 0.4, "tpot_s": 0.1, "decode_tps": 10.0, "itl_s": [0.1] * 4, "finish_reason": "length"}
            for i in range(batch_size)]
    cfg = explorer.Config(batch_size=batch_size)
    s = metrics.summarize_point(pd.DataFrame(reqs), ttft + 0.4, cfg.slo_ttft_s, cfg.slo_tpot_s)
    return explorer.ExploredPoint(cfg.params(), reqs, ttft + 0.4, s, {"model": "fake", "device": "cpu", "dtype": "float32"})


def _run(label, sizes, ttft):
    run = explorer.save_points("", [_point(b, ttft * b) for b in sizes], label=label)
    req = results.read_requests(run)
    results.save_figure(run, "ttft_box", px.box(req, x="batch_size", y="ttft_s", title="TTFT per request"))
    return run


def _check_figures(page, out: Path, name: str) -> int:
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(out.resolve().as_uri())
    page.wait_for_selector("div.figure .main-svg", timeout=20_000)
    figures = page.locator("div.figure")
    n = figures.count()
    rendered = [figures.nth(i).locator(".plot-container .main-svg").count() > 0 for i in range(n)]
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    assert n > 0 and all(rendered), f"figures not rendered: {rendered}"
    assert errors == [], errors
    return n


def _boxes(page, selector: str) -> list[dict]:
    return page.eval_on_selector_all(selector, "els => els.map(e => e.getBoundingClientRect().toJSON())")


@pytest.mark.parametrize("categories", [["1", "2"], [f"bfloat16/eager/dynamic/{i}t" for i in range(8)]],
                         ids=["short ticks", "long rotated ticks"])
def test_a_legend_below_never_touches_tick_labels_or_axis_title(browser, tmp_path, categories):
    """The engine-tuning bar chart once had its legend drawn over its rotated configuration names."""
    import plotly.graph_objects as go

    from workbench.share import plots

    fig = go.Figure(layout=dict(title="t", xaxis_title="configuration (dtype / attention)"))  # house template
    for name in ("measured (e2e p50)", "predicted (roofline)", "recommended"):
        fig.add_bar(x=categories, y=[1.0] * len(categories), name=name)
    out = tmp_path / "f.html"
    plots.legend_below(fig).write_html(out, include_plotlyjs=True)
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    page.goto(out.as_uri())
    page.wait_for_selector(".legend .traces")
    legend_top = min(b["top"] for b in _boxes(page, ".legend .traces"))
    above = _boxes(page, ".xtick text") + _boxes(page, ".g-xtitle text")
    page.screenshot(path=str(ARTIFACTS / f"legend_below_{len(categories)}.png"))
    assert above and legend_top >= max(b["bottom"] for b in above) - 0.5, (legend_top, above)


def test_reports_render_every_figure_offline(browser, tmp_path):
    a = _run("a", (1, 2), 0.1)
    b = _run("b", (1, 4), 0.2)                       # a different parameter set
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.route("http*://**", lambda route: route.abort())   # offline: nothing may be fetched
    assert _check_figures(page, report.build_report(a), "report_single") == 2
    assert _check_figures(page, report.build_report([a, b], tmp_path / "compare.html"), "report_compare") == 2
    page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _explorer_copy(folder: Path) -> Path:
    """The explorer notebook with tiny parameters (64 prompt tokens, 8 new tokens)."""
    nb = nbformat.read(REPO / "notebooks" / "00_explorer.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = (cell.source.replace("prompt_tokens: int = 128", "prompt_tokens: int = 64")
                   .replace("max_new_tokens: int = 32", "max_new_tokens: int = 8"))
    path = folder / "00_explorer.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def jupyterlab(tmp_path):
    port = _free_port()
    root = tmp_path / "lab"
    root.mkdir()
    _explorer_copy(root)
    env = {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME", "WORKBENCH_HEADLESS")}  # a real frontend
    env.update(JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               HF_HUB_OFFLINE="1", PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--ServerApp.password=", "--allow-root",
         f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         f"--LabApp.workspaces_dir={tmp_path / 'ws'}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(url + "/api/status", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start in 60 s")
        assert proc.poll() is None, (tmp_path / "jupyterlab.log").read_text()[-2000:]
        body = json.dumps({"path": "00_explorer.ipynb", "type": "notebook", "name": "00_explorer.ipynb",
                           "kernel": {"name": "python3"}}).encode()
        urllib.request.urlopen(urllib.request.Request(url + "/api/sessions", data=body, method="POST",
                                                      headers={"Content-Type": "application/json"}), timeout=30)
        yield url
    finally:
        try:
            urllib.request.urlopen(urllib.request.Request(url + "/api/shutdown", method="POST"), timeout=5)
            proc.wait(10)
        except Exception:
            proc.terminate()
            proc.wait(10)
        log.close()
        shutil.copy(tmp_path / "jupyterlab.log", ARTIFACTS / "jupyterlab.log") if ARTIFACTS.exists() else None


def _dismiss(page):
    """Accept a kernel-selection dialog and decline the news toast, if JupyterLab shows them."""
    page.wait_for_timeout(500)
    dialog = page.locator(".jp-Dialog button", has_text="Select")
    if dialog.count():
        dialog.first.click()
    news = page.locator(".jp-toast-button", has_text="No")
    if news.count():
        try:                                  # the toast animates in; it only hides part of a screenshot
            news.first.click(timeout=3000)
        except Exception:
            pass


def _session_kernel(base: str) -> tuple:
    """``(kernel id, execution state)`` of the notebook's session on the server, ``(None, None)`` if none."""
    with urllib.request.urlopen(base + "/api/sessions", timeout=10) as r:
        sessions = json.load(r)
    s = next((s for s in sessions if s["path"].endswith("00_explorer.ipynb") and s.get("kernel")), None)
    return (s["kernel"]["id"], s["kernel"].get("execution_state")) if s else (None, None)


def _stable_kernel(page, base: str, deadline: float, settle_s: float = 3.0) -> str:
    """Wait until the session's kernel is idle and has kept its id for ``settle_s``.

    JupyterLab may replace the kernel the test created through the REST API right after the page connects
    (seen in the server log: ``Connecting to kernel A``, 50 ms later ``Kernel started: B`` and A shut down
    with a KeyboardInterrupt; not on every run). On a loaded machine
    (the full test run) a Run All clicked before that swap runs on the old kernel, dies with it, and the
    new kernel never runs the cells: the controls never appear. So cells only run on a settled kernel.
    """
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog button", has_text="Select")
        if dialog.count():
            dialog.first.click()
        kid, state = _session_kernel(base)
        if kid != last:
            last, since = kid, time.monotonic()
        elif kid and state == "idle" and time.monotonic() - since >= settle_s:
            return kid
        page.wait_for_timeout(500)
    raise AssertionError(f"the notebook's kernel did not settle (last {last})")


def _run_all_until_controls(page, base: str, timeout_s: float) -> None:
    """Run All Cells on a settled kernel; run them again whenever the kernel is replaced (or JupyterLab
    asks for a kernel) before the explorer's controls appear."""
    deadline = time.monotonic() + timeout_s
    kernel = None
    while time.monotonic() < deadline:
        if kernel is None:
            kernel = _stable_kernel(page, base, deadline)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        if page.locator(".wb-explorer .wb-controls").count():
            return
        dialog = page.locator(".jp-Dialog button", has_text="Select")
        if dialog.count() or _session_kernel(base)[0] != kernel:   # replaced under the running cells: again
            kernel = None
            continue
        page.wait_for_timeout(1000)
    raise AssertionError(f"the explorer's controls did not appear within {timeout_s} s")


def test_explorer_in_jupyterlab_shows_controls_and_live_view(browser, jupyterlab):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(jupyterlab + "/lab/tree/00_explorer.ipynb")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=45_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=45_000)
        _run_all_until_controls(page, jupyterlab, timeout_s=180)  # kernel start + imports
        controls = page.locator(".wb-controls")
        assert controls.locator(".widget-dropdown").count() >= 5      # device, dtype, budget, compression, colour
        assert controls.locator(".widget-slider, .widget-hslider").count() >= 6
        assert page.locator(".wb-live").is_visible()
        page.locator(".wb-controls button", has_text="Run").first.click()
        page.wait_for_function("() => document.querySelector('.wb-live') && "
                               "document.querySelector('.wb-live').innerText.includes('done')", timeout=60_000)
        live = page.locator(".wb-live").inner_text()
        assert "TTFT" in live and "tokens" in live and page.locator(".wb-live .wb-text").inner_text().strip()
        page.wait_for_selector(".wb-figure .main-svg", timeout=20_000)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_explorer.png"), full_page=True)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "jupyterlab_explorer_failed.png"), full_page=True)
        raise
    finally:
        (ARTIFACTS / "jupyterlab_page_errors.json").write_text(json.dumps(errors, indent=1))
        page.close()
