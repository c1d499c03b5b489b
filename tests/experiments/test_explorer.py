"""The explorer: throttled live view, colouring, saved points in the sweep schema, the headless notebook."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.errors import ParameterError
from workbench.experiments import explorer
from workbench.measure.streaming import StreamEvent
from workbench.run import point_result, results
from workbench.share.live import LiveState, Throttle, counters_html, has_frontend, headless
from workbench.stats import metrics

REPO = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_throttle_lets_at_most_one_update_per_interval():
    th = Throttle(0.1, clock=None)
    stamps = [0.0, 0.05, 0.099, 0.1, 0.15, 0.21, 0.25, 0.31]
    assert [th.due(now=t) for t in stamps] == [True, False, False, True, False, True, False, True]
    assert th.due(force=True, now=0.32) is True


def test_live_state_throttles_renders_and_counts_tokens():
    renders = []
    # times in 1/128 s keep the arithmetic exact; __init__ and reset each read the clock twice (t0, render)
    clock = FakeClock([0.0] * 4 + [i / 128 for i in range(1, 101)] + [1.0])
    live = LiveState(render=renders.append, min_interval_s=10 / 128, clock=clock)
    live.reset("running")
    before = len(renders)
    for i in range(1, 101):                                   # 100 tokens: a display update every 10th
        live.on_stamp([0], i / 128)                           # the step's stamp (generation thread)
        live.on_event(StreamEvent(text=f"t{i} ", elapsed_s=i / 128, output_tokens=i, ttft_s=1 / 128))
    assert len(renders) - before == 10
    assert [r["output_tokens"] for r in renders[before:]] == list(range(10, 101, 10))
    live.finish(None, "done")
    snap = renders[-1]
    assert snap["status"] == "done" and snap["output_tokens"] == 100
    assert snap["text"] == "".join(f"t{i} " for i in range(1, 101))
    assert snap["tokens_per_s"] == pytest.approx(99 / (99 / 128))   # (n - 1) / (e2e - ttft), request_timing
    assert snap["ttft_s"] == pytest.approx(1 / 128) and snap["elapsed_s"] == pytest.approx(100 / 128)
    assert "TTFT</b> 0.008 s" in counters_html(snap)


def test_live_state_on_step_decodes_row_zero():
    live = LiveState(render=None, decode=lambda ids: "-".join(map(str, ids)), clock=lambda: 10.0)
    live.reset("running")
    for step, t in ([7, 8], 10.5), ([9, 1], 10.75), ([4, 2], 11.0):
        live.on_step(step, t)
    snap = live.snapshot()
    assert snap["text"] == "7-9-4" and snap["output_tokens"] == 3
    assert snap["ttft_s"] == 0.5 and snap["tokens_per_s"] == pytest.approx(2 / 0.5)


def test_varied_parameter_prefers_the_most_varied():
    df = pd.DataFrame({"model": ["m"] * 4, "batch_size": [1, 2, 4, 4], "temperature": [0.0, 0.0, 0.7, 0.7]})
    assert explorer.varied_parameter(df) == "batch_size"
    assert explorer.varied_parameter(df.iloc[2:]) is None
    assert explorer.varied_parameter(df.iloc[1:3]) == "batch_size"   # tie: control order


def _fig():
    fig = go.Figure()
    fig.add_scatter(x=[], y=[], mode="markers+text")
    return fig


def test_update_figure_colours_numeric_and_categorical():
    df = pd.DataFrame({"n": [0, 1, 2], "batch_size": [1, 2, 4], "compression": ["none"] * 3,
                       "output_throughput_tps": [10.0, 18.0, 30.0], "ttft_s_p50": [0.2, 0.3, 0.6]})
    fig = _fig()
    assert explorer.update_figure(fig, df) == "batch_size"
    tr = fig.data[0]
    assert list(tr.x) == [10.0, 18.0, 30.0] and list(tr.y) == [0.2, 0.3, 0.6]
    assert list(tr.marker.color) == [1.0, 2.0, 4.0] and tr.marker.showscale
    df["compression"] = ["none", "head", "none"]
    assert explorer.update_figure(fig, df, "compression") == "compression"
    tr = fig.data[0]
    assert tr.marker.color[0] == tr.marker.color[2] != tr.marker.color[1] and list(tr.text) == ["none", "head", "none"]
    assert "colour: compression" in fig.layout.title.text


@pytest.mark.parametrize("field,value,prefix", [
    ("batch_size", 0, "batch_size:"), ("prompt_tokens", 8, "prompt_tokens:"), ("temperature", -1.0, "temperature:"),
    ("reasoning_budget", -4, "reasoning_budget:"), ("compression", "zip", "compression:"),
    ("compression_ratio", 0.5, "compression_ratio:"), ("mode", "gui", "mode:"), ("device", "tpu", "device:"),
])
def test_config_rejects_bad_values_with_one_line(field, value, prefix):
    with pytest.raises(ParameterError) as err:
        explorer.Config(**{field: value})
    assert str(err.value).startswith(prefix) and "\n" not in str(err.value)


def test_has_frontend(monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.delenv("WORKBENCH_EXPLORER_MODE", raising=False)
    monkeypatch.delenv("WORKBENCH_HEADLESS", raising=False)
    assert not has_frontend("auto") and has_frontend("widgets")
    monkeypatch.setenv("JPY_SESSION_NAME", "/x/00_explorer.ipynb")
    assert has_frontend("auto") and not has_frontend("static")
    monkeypatch.setenv("WORKBENCH_HEADLESS", "1")  # the runner's kernels: JPY_SESSION_NAME inherited, no frontend
    assert not has_frontend("auto") and headless()
    monkeypatch.setenv("WORKBENCH_HEADLESS", "0")
    assert has_frontend("auto")
    monkeypatch.setenv("WORKBENCH_EXPLORER_MODE", "static")
    assert not has_frontend("auto")


def test_headless_kernel_asked_for_widgets_fails_instead_of_recording_nothing(monkeypatch):
    monkeypatch.setenv("WORKBENCH_HEADLESS", "1")
    monkeypatch.delenv("WORKBENCH_EXPLORER_MODE", raising=False)
    ex = explorer.Explorer(explorer.Config(max_new_tokens=5, mode="widgets"), load=lambda *a: FakeLoaded(),
                           measure=fake_measure)
    with pytest.raises(ParameterError, match="^mode: widgets need a frontend"):
        ex.show()
    assert ex.points == []


@pytest.fixture(autouse=True)
def _fake_probe_columns(monkeypatch):
    """The fakes below mark their rows with ``warmed`` (a test probe of when warm-up ran), not a registered column:
    recording them is allowed here only (the registry check stays on for every real experiment)."""
    monkeypatch.delenv("WORKBENCH_STRICT_COLUMNS", raising=False)


class FakeLoaded:
    info = None                                                      # no environment record (no device probe)


def fake_measure(loaded, cfg, live, warmup):
    """``batch_size`` requests of ``max_new_tokens`` tokens, TTFT 0.1 s x batch size, TPOT 0.05 s."""
    n, b = cfg.max_new_tokens, cfg.batch_size
    reqs = [{"request_id": i, "repeat": 0, "prompt_tokens": cfg.prompt_tokens, "output_tokens": n,
             "ttft_s": 0.1 * b, "prefill_s": 0.05 * b, "e2e_s": 0.1 * b + 0.05 * (n - 1), "tpot_s": 0.05,
             "decode_tps": 20.0, "itl_s": [0.05] * (n - 1), "finish_reason": "length", "text": "x" * n,
             "batch_size": b, "warmed": warmup} for i in range(b)]
    wall = 0.1 * b + 0.05 * (n - 1)
    if live is not None:
        live.finish(reqs[0], "done")
    summary = metrics.summarize_point(pd.DataFrame(reqs), wall, cfg.slo_ttft_s, cfg.slo_tpot_s)
    return explorer.ExploredPoint(cfg.params(), reqs, wall, summary,
                                 {"model": "fake-model", "device": "cpu", "dtype": "float32"})


def test_saved_points_load_back_with_the_results_schema():
    ex = explorer.Explorer(explorer.Config(max_new_tokens=5), load=lambda *a: FakeLoaded(),
                          measure=fake_measure)
    for b in (1, 2, 2):
        ex.run_once(explorer.Config(max_new_tokens=5, batch_size=b))
    assert [p.requests[0]["warmed"] for p in ex.points] == [None, None, 0]   # warm-up once per shape
    run = ex.save()
    req = results.load(run)
    pts = results.load(run, table="points")
    assert set(point_result.REQUEST_COLUMNS) <= set(req.columns)
    assert len(req) == 1 + 2 + 2 and len(pts) == 3 and (pts["status"] == "ok").all()
    assert set(req["experiment"]) == {"explorer"} and set(req["model"]) == {"fake-model"}
    p2 = pts.set_index("batch_size").loc[2].iloc[0]
    assert p2["output_throughput_tps"] == pytest.approx(10 / 0.4)   # 2 x 5 tokens / (0.2 + 4 x 0.05) s
    assert p2["ttft_s_p50"] == pytest.approx(0.2)
    assert (run / "figures" / "explorer_points.json").exists()
    assert results.read_manifest(run)["status"] == "ok"
    ex.run_once(explorer.Config(max_new_tokens=5, batch_size=4))
    assert ex.save() == run                                          # saving again updates the same run
    assert len(results.load(run, table="points")) == 4 and len(results.load(run)) == 9


def test_ui_runs_off_the_calling_thread_and_reports_bad_input():
    ex = explorer.Explorer(explorer.Config(max_new_tokens=5), load=lambda *a: FakeLoaded(),
                          measure=fake_measure)
    ex.build_ui()
    ex.w["batch_size"].value = 4
    thread = ex.start()
    thread.join(10)
    assert len(ex.points) == 1 and ex.points[0].params["batch_size"] == 4
    assert "point #0" in ex.status.value and not ex.run_button.disabled
    assert "tokens</b> 5" in ex.counters.value
    ex.w["model"].value = "/no/such/model"
    assert ex.start() is None and "error: model:" in ex.status.value


@pytest.mark.model
def test_measure_point_real_model_batch_one_streams_and_batch_two(loaded):
    snaps = []
    live = LiveState(render=snaps.append, min_interval_s=0.0,
                             decode=lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True))
    cfg = explorer.Config(device="cpu", dtype="float32", prompt_tokens=48, max_new_tokens=4, ignore_eos=True)
    m = explorer.measure_point(loaded, cfg, {}, {"live": live, "warmup": 0})
    rec = m.requests[0]
    assert len(m.requests) == 1 and rec["output_tokens"] == 4 and rec["prompt_tokens"] == 48
    assert rec["context_tokens"] == 48 and rec["compression"] == "none" and rec["reasoning_budget"] is None
    assert m.wall_s == rec["e2e_s"] and snaps[-1]["text"] == rec["text"] and snaps[-1]["output_tokens"] == 4
    assert max(s["output_tokens"] for s in snaps[:-1]) >= 1          # live counters from the step stamps
    m = explorer.measure_point(loaded, explorer.Config(prompt_tokens=48, max_new_tokens=3, ignore_eos=True,
                                                             batch_size=2), {}, {"live": live, "warmup": 0})
    assert [r["output_tokens"] for r in m.requests] == [3, 3] and m.wall_s > 0
    assert snaps[-1]["text"] == m.requests[0]["text"]


def _papermill(nb: Path, out: Path, params: dict, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("JPY_SESSION_NAME", "WORKBENCH_EXPLORER_MODE")}
    env["WORKBENCH_RESULTS"] = str(tmp_path / "results")
    args = [sys.executable, "-m", "papermill", str(nb), str(out), "--cwd", str(nb.parent), "-k", "python3"]
    for k, v in params.items():
        args += ["-y", f"{k}: {v!r}"] if isinstance(v, str) else ["-y", f"{k}: {v}"]
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.notebook
def test_explorer_notebook_headless_measures_once_and_saves_even_under_a_jupyter_session(tmp_path, monkeypatch):
    """The explorer notebook in a kernel, without a frontend: it measures its one point and saves it (rows, the
    request columns, its figure, the environment). Started from a JupyterLab terminal or cell, the run inherits
    ``JPY_SESSION_NAME``; the kernel the runner starts must still be headless (it used to show widgets, record
    nothing and end "ok"). One kernel for both: what decides "headless" from the environment is
    ``test_has_frontend``; a plain ``papermill`` command on a notebook is ``test_compare_notebook_runs_on_two_saved_
    runs``."""
    from workbench.run import notebooks

    monkeypatch.setenv("JPY_SESSION_NAME", "x")
    monkeypatch.delenv("WORKBENCH_EXPLORER_MODE", raising=False)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # execute_notebook prepends to it; restored after
    monkeypatch.setenv("WORKBENCH_HEADLESS", "0")  # restored after; execute_notebook sets it for its kernels
    run = results.open_run()
    nb = REPO / "notebooks" / "00_explorer.ipynb"
    out = notebooks.execute_notebook(nb, {"prompt_tokens": 48, "max_new_tokens": 4, "batch_size": 2}, run,
                                     log_output=False)
    req, pts = results.read_requests(run), results.read_points(run)
    assert len(pts) == 1 and pts["status"].iloc[0] == "ok" and pts["batch_size"].iloc[0] == 2
    assert len(req) == 2 and (req["prompt_tokens"] == 48).all() and set(point_result.REQUEST_COLUMNS) <= set(req.columns)
    assert (run / "figures" / "explorer_points.json").exists()
    assert results.read_manifest(run)["environment"]["model"] == "SmolLM2-135M-Instruct"
    assert "headless explorer: 1 point" in Path(out).read_text()


@pytest.mark.notebook
def test_compare_notebook_runs_on_two_saved_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(tmp_path / "results"))
    runs = []
    for b in ((1, 2), (2, 4)):
        ex = explorer.Explorer(explorer.Config(max_new_tokens=5), load=lambda *a: FakeLoaded(),
                              measure=fake_measure)
        for size in b:
            ex.run_once(explorer.Config(max_new_tokens=5, batch_size=size))
        runs.append(str(ex.save()))
    out = tmp_path / "cmp.ipynb"
    proc = _papermill(REPO / "notebooks" / "90_compare_runs.ipynb", out, {}, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "output_throughput_tps change" in text and "TTFT vs throughput, per run" in text


def test_controls_map_back_to_the_config():
    ex = explorer.Explorer(explorer.Config(reasoning_budget=None, compression="none"))
    ex.build_ui()
    assert ex.config_from_controls() == ex.cfg                        # "off" stands for no budget
    ex.w["reasoning_budget"].value = 64
    ex.w["temperature"].value = 0.7
    cfg = ex.config_from_controls()
    assert cfg.reasoning_budget == 64 and cfg.temperature == 0.7 and cfg.params()["reasoning_budget"] == 64
