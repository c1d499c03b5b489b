"""The interactive explorer: ipywidgets controls, a live streaming view, and a figure of explored points.

``Explorer(cfg).show()`` in JupyterLab displays controls for model, device,
dtype, batch size, prompt length, ``max_new_tokens``, temperature, top-p,
reasoning budget, compression strategy and ratio, a **Run** button, a live view
(the first request's text as it arrives, with TTFT, tokens/s and token count),
and a plotly ``FigureWidget`` that accumulates every explored point as TTFT
p50 versus output throughput, coloured by the parameter that varies
(:func:`varied_parameter`). **Save** writes the explored points as a run folder
in the sweep schema (``requests.parquet`` with :data:`workbench.run.point_result.REQUEST_COLUMNS`,
``points.parquet`` from :func:`workbench.run.point_result.point_rows`, as every sweep), so
``workbench report`` and :func:`workbench.run.results.load` read it like any sweep.

Responsiveness (plotly ``doc/python/figurewidget-app.md``; ipywidgets
"Asynchronous widgets"): a measurement runs in a background thread, never in a
widget callback; the live view is refreshed at most every ``min_interval_s``
(0.1 s: ~10 updates/s) by :class:`workbench.share.live.Throttle`, whatever the token rate, so the
kernel's output channel is never flooded; figure changes happen inside one
``batch_update()``. Each callback calls one tested function of this module.

Measurement (:func:`measure_point`): batch 1 streams through
:func:`workbench.measure.streaming.stream_generate` (word-level text pieces, per-token
timing); larger batches run :func:`workbench.measure.generation.generate_measured` with
an ``on_step`` hook and show row 0. Either way the live counters come from the
stamp of every generated step through :func:`workbench.stats.metrics.request_timing`
(the formulas of the final records). The first measurement of each (model,
batch size, prompt length) is preceded by ``warmup`` untimed runs
(:func:`workbench.measure.generation.warm_up`). A reasoning budget runs
:func:`workbench.inputs.reasoning.run_reasoning_batch` on generated tasks
(budget forcing, :mod:`workbench.techniques.budget_forcing`; no live text, the answer
appears at the end); a compression strategy compresses each prompt with
:func:`workbench.techniques.compression.compress` before generation.

Headless (papermill, no frontend): :meth:`Explorer.show` measures the notebook's
parameters once, writes the point to the run folder, and renders a static
figure and table instead of widgets. :func:`workbench.share.live.has_frontend` decides: the
``mode`` parameter (``widgets`` / ``static``) wins; ``auto`` is headless when
``WORKBENCH_HEADLESS=1`` (set by the runner for every kernel it starts,
:func:`workbench.run.notebooks.execute_notebook`), else looks for
``JPY_SESSION_NAME``, which jupyter-server (JupyterLab, Notebook 7) sets for
kernels it starts. ``JPY_SESSION_NAME`` alone is not enough: a kernel started
by papermill inherits it from a JupyterLab terminal or cell, and would then
show widgets nobody can press and record nothing. A headless kernel asked for
``widgets`` fails instead of ending "ok" with no point.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import threading
import time
from pathlib import Path

import pandas as pd

from workbench.checks import check_bool, check_choice, check_float, check_int
from workbench.errors import ParameterError
from workbench.inputs import reasoning as reasoning_tasks
from workbench.measure import models
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.measure.streaming import stream_generate
from workbench.run import point_result, results, sweeps
from workbench.share import plots
from workbench.share.live import LiveState, counters_html, has_frontend, headless
from workbench.stats import metrics
from workbench.techniques import budget_forcing, compression

EXPERIMENT = "explorer"
MODES = ("auto", "widgets", "static")
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
PROMPT_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096)
REASONING_BUDGETS = (None, 0, 16, 32, 64, 128, 256)
INSTRUCTION = "Summarise the text above in one paragraph."
#: The parameters a point of the explorer is made of, in control order (also the colour-by candidates).
CONTROL_PARAMS = (
    "model", "device", "dtype", "batch_size", "prompt_tokens", "max_new_tokens", "ignore_eos", "temperature",
    "top_p", "reasoning_budget", "compression", "compression_ratio",
)


def compression_strategies() -> tuple[str, ...]:
    """Strategies :func:`workbench.techniques.compression.compress` offers for one request (``kv_reuse`` excluded: it
    needs its own generation path)."""
    return tuple(s for s in compression.STRATEGIES if s != "kv_reuse")


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass
class Config(sweeps.SweepConfig):
    """One explorer measurement (notebook ``00_explorer``); also the headless default point.

    Attributes:
        batch_size: requests per ``generate`` call (>= 1).
        prompt_tokens: prompt length in tokens, chat template included, in [32, model max - max_new_tokens].
        max_new_tokens: new tokens per request (>= 1).
        ignore_eos: fixed-length outputs (``min_new_tokens = max_new_tokens``).
        temperature: 0 is greedy. top_p: nucleus mass in (0, 1].
        reasoning_budget: thinking-token cap (budget forcing), or None (or -1) for plain generation.
        compression: a strategy of :func:`compression_strategies` (``none``: the prompt as is).
        compression_ratio: target ``original / compressed`` tokens (>= 1).
        slo_ttft_s, slo_tpot_s: SLO for goodput (seconds, > 0).
        mode: ``auto`` (widgets with a frontend, one static measurement without), ``widgets`` or ``static``.

    Raises:
        ParameterError: an invalid field (one line, before any model loads).
    """

    repeats: int = 1
    batch_size: int = 1
    prompt_tokens: int = 128
    max_new_tokens: int = 32
    ignore_eos: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    reasoning_budget: int | None = -1  # -1 (the notebook's literal): off, None after validation
    compression: str = "none"
    compression_ratio: float = 4.0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    mode: str = "auto"

    def __post_init__(self):
        super().__post_init__()
        check_int("batch_size", self.batch_size, 1)
        self.settings()  # max_new_tokens, temperature, top_p
        check_bool("ignore_eos", self.ignore_eos)
        check_int("prompt_tokens", self.prompt_tokens, 32, self.max_context() - self.max_new_tokens)
        if self.reasoning_budget == -1:
            self.reasoning_budget = None  # the notebook's literal -1 means off
        if self.reasoning_budget is not None:
            check_int("reasoning_budget", self.reasoning_budget, 0)
        check_choice("compression", self.compression, compression_strategies())
        check_float("compression_ratio", self.compression_ratio, 1)
        check_float("slo_ttft_s", self.slo_ttft_s, 0, lo_open=True)
        check_float("slo_tpot_s", self.slo_tpot_s, 0, lo_open=True)
        check_choice("mode", self.mode, MODES)

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """The :class:`GenerationSettings` of this point."""
        return GenerationSettings(max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos,
                                  temperature=self.temperature, top_p=self.top_p,
                                  seed=self.seed if seed is None else seed)

    def params(self) -> dict:
        """The point's parameters (:data:`CONTROL_PARAMS`), as recorded in the run folder."""
        return {k: getattr(self, k) for k in CONTROL_PARAMS}


# ----------------------------------------------------------------------------- measurement


@dataclasses.dataclass
class ExploredPoint:
    """One explored measurement: its parameters, raw request records and the point summary.

    ``contamination`` and ``device`` are the device-side readings of :class:`workbench.run.point_result.PointResult`
    (:func:`workbench.run.point_result.measure_on_device`).
    """

    params: dict
    requests: list
    wall_s: float
    summary: dict
    resolved: dict = dataclasses.field(default_factory=dict)  # model / device / dtype actually used
    warmup_s: float = 0.0
    extra: dict = dataclasses.field(default_factory=dict)
    contamination: dict = dataclasses.field(default_factory=dict)
    device: dict = dataclasses.field(default_factory=dict)

    def row(self) -> dict:
        """Parameters + summary, for the figure and the table (``model``/``device``/``dtype`` resolved)."""
        return {**self.params, **self.resolved, **self.summary, **self.extra}

    def result(self) -> point_result.PointResult:
        """The measurement as the :class:`workbench.run.point_result.PointResult` a run folder records."""
        return point_result.PointResult(requests=self.requests, wall_s=self.wall_s, warmup_s=self.warmup_s,
                                   extra=self.extra, contamination=self.contamination, device=self.device)


def _prompts(loaded, cfg: Config):
    """The batch's prompts: real text of ``prompt_tokens`` tokens, compressed when asked."""
    from workbench.inputs.prompts import build_batch

    tok = loaded.tokenizer
    if cfg.compression == "none":
        return build_batch(tok, cfg.batch_size, cfg.prompt_tokens, instruction=INSTRUCTION), [{}] * cfg.batch_size
    docs = build_batch(tok, cfg.batch_size, cfg.prompt_tokens)
    out = [compression.compress(d, INSTRUCTION, tok, cfg.compression, ratio=cfg.compression_ratio, loaded=loaded)
           for d in docs]
    return [r.messages() for r in out], [r.to_record() for r in out]


def _generate(loaded, prompts, settings: GenerationSettings, live: LiveState | None):
    """Records and wall time of one batch; batch 1 streams, larger batches report steps."""
    if len(prompts) == 1:
        rec = None
        for ev in stream_generate(loaded, prompts[0], settings, on_step=None if live is None else live.on_stamp):
            if live is not None:
                live.on_event(ev)
            rec = ev.record or rec
        return [rec], float(rec["e2e_s"])
    res = generate_measured(loaded, prompts, settings, on_step=None if live is None else live.on_step)
    return res.records, res.wall_s


def _reasoning_batch(loaded, cfg: Config, seed: int):
    """(records, wall_s) of one batch of reasoning tasks under ``cfg.reasoning_budget`` (budget forcing)."""
    tasks = reasoning_tasks.make_tasks(cfg.batch_size, seed=cfg.seed)
    spec = budget_forcing.BudgetSpec(budget=cfg.reasoning_budget)
    return reasoning_tasks.run_reasoning_batch(loaded, tasks, spec, temperature=cfg.temperature, top_p=cfg.top_p,
                                               seed=seed, score=False)


def measure_point(loaded, cfg: Config, point: dict, state: dict) -> point_result.PointResult:
    """Measure one explorer point: ``warmup`` untimed runs, then ``cfg.repeats`` timed ones.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        cfg: the explorer's config: its controls are the point.
        point: control values (:data:`CONTROL_PARAMS`) overriding ``cfg``'s; ``{}`` measures ``cfg`` as it is.
        state: ``live``, a :class:`workbench.share.live.LiveState` receiving streamed text and counters (absent or None: no
            display), and ``warmup``, untimed runs first (:func:`workbench.measure.generation.warm_up`; absent or
            None: ``cfg.warmup``).

    Returns:
        :class:`workbench.run.point_result.PointResult`: ``requests`` (records with ``repeat``,
        ``batch_size``, ``context_tokens``, ``reasoning_budget``, ``compression`` and the compressor's
        columns), ``wall_s``, ``warmup_s`` (compression included), ``extra`` (empty).
    """
    if point:
        cfg = dataclasses.replace(cfg, **point)
    live, warmup = state.get("live"), state.get("warmup")
    t0 = time.perf_counter()
    prompts, comp_cols = _prompts(loaded, cfg)
    warm_up(loaded, prompts, cfg.settings(), n=cfg.warmup if warmup is None else warmup)
    warmup_s = time.perf_counter() - t0
    requests, wall = [], 0.0
    for r in range(cfg.repeats):
        if live is not None:
            live.reset(f"running (repeat {r + 1}/{cfg.repeats})")
        out = _reasoning_batch(loaded, cfg, cfg.seed + r) if cfg.reasoning_budget is not None else None
        if out is None:
            records, batch_wall = _generate(loaded, prompts, cfg.settings(cfg.seed + r), live)
        else:
            records, batch_wall = out
        for rec, comp in zip(records, comp_cols):
            rec.update(comp)
            rec.update(repeat=r, batch_size=cfg.batch_size, batch_wall_s=batch_wall, context_tokens=cfg.prompt_tokens,
                       reasoning_budget=cfg.reasoning_budget, compression=cfg.compression)
            rec.pop("output_ids", None)
        requests += records
        wall += batch_wall
        if live is not None:
            live.finish(records[0], f"done (repeat {r + 1}/{cfg.repeats})")
    return point_result.PointResult(requests=requests, wall_s=wall, warmup_s=warmup_s)


def explore(loaded, cfg: Config, live: LiveState | None = None, warmup: int | None = None) -> ExploredPoint:
    """:func:`measure_point` of ``cfg`` (with the device-side readings of
    :func:`workbench.run.point_result.measure_on_device`) summarised into an :class:`ExploredPoint` (SLO of ``cfg``)."""
    info = loaded.info
    m = point_result.measure_on_device(lambda: measure_point(loaded, cfg, {}, {"live": live, "warmup": warmup}),
                                  info.device)
    summary = metrics.summarize_point(pd.DataFrame(m.requests), m.wall_s, cfg.slo_ttft_s, cfg.slo_tpot_s)
    return ExploredPoint(params=cfg.params(), requests=m.requests, wall_s=m.wall_s, summary=summary,
                         resolved={"model": info.name, "device": info.device, "dtype": info.dtype},
                         warmup_s=m.warmup_s, extra=m.extra, contamination=m.contamination, device=m.device)


# ----------------------------------------------------------------------------- points, figure, saving


def points_frame(points: list[ExploredPoint]) -> pd.DataFrame:
    """One row per explored point (``n``, parameters, summary)."""
    return pd.DataFrame([{"n": i, **p.row()} for i, p in enumerate(points)])


def varied_parameter(df: pd.DataFrame, candidates=CONTROL_PARAMS) -> str | None:
    """The parameter to colour by: among ``candidates`` with more than one distinct value, the one with
    the most distinct values (earlier in control order on ties); None when nothing varies."""
    best, best_n = None, 1
    for name in candidates:
        if name in df:
            n = df[name].astype(str).nunique()
            if n > best_n:
                best, best_n = name, n
    return best


def _is_numeric(series: pd.Series) -> bool:
    return (pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)
            and series.notna().all())


def _hover(df: pd.DataFrame) -> list[str]:
    keys = ["batch_size", "prompt_tokens", "max_new_tokens", "temperature", "top_p", "reasoning_budget",
            "compression", "compression_ratio"]
    return [f"#{int(r['n'])}: " + ", ".join(f"{k}={r[k]}" for k in keys if k in r) for _, r in df.iterrows()]


def _axes() -> dict:
    return dict(xaxis_title=plots.label("output_throughput_tps"), yaxis_title=plots.label("ttft_s_p50"))


def explorer_figure(df: pd.DataFrame, color_by: str | None = None):
    """Static figure of explored points: TTFT p50 versus output throughput, coloured by ``color_by``
    (default :func:`varied_parameter`)."""
    import plotly.express as px

    color_by = color_by or varied_parameter(df)
    data = df.copy()
    if color_by is not None and not _is_numeric(data[color_by]):
        data[color_by] = data[color_by].astype(str)
    fig = px.scatter(data, x="output_throughput_tps", y="ttft_s_p50", color=color_by, hover_name=_hover(data),
                     labels=plots.labels("output_throughput_tps", "ttft_s_p50"),
                     title="Explored points: TTFT vs throughput" + (f" (colour: {color_by})" if color_by else ""))
    fig.update_traces(marker=dict(size=11, line=dict(width=1, color="black")))
    return fig


def new_figure_widget():
    """An empty ``FigureWidget`` (one marker trace) for :func:`update_figure`; needs ``anywidget``."""
    import plotly.graph_objects as go

    fig = go.FigureWidget()
    fig.add_scatter(x=[], y=[], mode="markers+text", textposition="top center", name="explored",
                    marker=dict(size=11, line=dict(width=1, color="black")))
    fig.update_layout(title="Explored points: TTFT vs throughput", height=420, **_axes())
    return fig


def update_figure(fig, df: pd.DataFrame, color_by: str | None = None) -> str | None:
    """Redraw the explored points in ``fig`` (a ``FigureWidget`` or ``Figure`` from
    :func:`new_figure_widget`) inside one ``batch_update()``.

    Numeric parameters colour on a Viridis scale with a colour bar; others get one colour per value and
    the value as a label. Returns the parameter coloured by.
    """
    import plotly.express as px

    color_by = color_by or varied_parameter(df)
    trace = fig.data[0]
    with fig.batch_update():
        trace.x = df["output_throughput_tps"].tolist() if not df.empty else []
        trace.y = df["ttft_s_p50"].tolist() if not df.empty else []
        trace.hovertext = _hover(df) if not df.empty else []
        if color_by is None or df.empty:
            trace.marker.color, trace.marker.showscale, trace.text = px.colors.qualitative.Safe[0], False, None
        elif _is_numeric(df[color_by]):
            trace.marker.color = df[color_by].astype(float).tolist()
            trace.marker.colorscale, trace.marker.showscale = "Viridis", True
            trace.marker.colorbar = dict(title=dict(text=color_by))
            trace.text = None
        else:
            values = df[color_by].astype(str)
            palette = px.colors.qualitative.Safe
            order = {v: i for i, v in enumerate(dict.fromkeys(values))}
            trace.marker.color = [palette[order[v] % len(palette)] for v in values]
            trace.marker.showscale = False
            trace.text = values.tolist()
        fig.layout.title.text = "Explored points: TTFT vs throughput" + (f" (colour: {color_by})" if color_by else "")
    return color_by


def save_points(run_dir, points: list[ExploredPoint], info=None, label: str = "", probe: bool = True,
                finish: bool = True, config: dict | None = None) -> Path:
    """Write explored points as a run folder in the sweep schema (experiment ``explorer``).

    Args:
        run_dir: a run folder (reused; rows of the same point are replaced), or "" for a new run.
        points: the explored points; point ``i`` gets id ``explorer/n=i,<parameters>``.
        info: :class:`workbench.measure.models.ModelInfo`; records the environment in the manifest.
        label: run id suffix for a new run.
        probe: probe device bandwidth / FLOP/s for the environment record.
        finish: mark the run ``ok`` (False when a suite runner owns the status).
        config: recorded as the experiment's configuration.

    Returns:
        The run folder (with ``figures/explorer_points``).
    """
    run = results.open_run(run_dir, label)
    if info is not None:
        results.update_manifest(run, environment=results.environment(info, seed=(config or {}).get("seed"),
                                                                     probe=probe))
    ids = []
    for i, p in enumerate(points):
        pid = point_result.point_id(EXPERIMENT, {"n": i, **p.params})
        ids.append(pid)
        base = {"run_id": run.name, "experiment": EXPERIMENT, "point_id": pid, **p.params, **p.resolved}
        slo = (p.summary.get("slo_ttft_s"), p.summary.get("slo_tpot_s"))
        # no MBU / MFU: the explored points may come from other models than ``info``'s
        req, row = point_result.point_rows(p.result(), base, *slo)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        results.record_point(run, pid, req, row, {"experiment": EXPERIMENT, "params": p.params, "status": "ok",
                                                  "finished_utc": now, "valid": row["valid"]})
    results.update_manifest(run, experiments={EXPERIMENT: {"config": config, "points": ids}})
    if points:
        results.save_figure(run, "explorer_points", explorer_figure(points_frame(points)))
    if finish:
        results.update_manifest(run, status="ok")
    return run


# ----------------------------------------------------------------------------- the explorer


class Explorer:
    """Controls, live view and explored-points figure (see the module docstring).

    Args:
        cfg: initial control values (and the headless point).
        run_dir: where Save writes ("" creates a new run on the first save, then reuses it).
        load: ``load(model, device, dtype) -> LoadedModel`` (default :func:`workbench.measure.models.load_model`).
        measure: ``measure(loaded, cfg, live, warmup) -> ExploredPoint`` (default :func:`explore`).
    """

    def __init__(self, cfg: Config, run_dir: str = "", load=None, measure=None, min_interval_s: float = 0.1):
        self.cfg = cfg
        self.run_dir = run_dir
        self.load = load or models.load_model
        self.measure = measure or explore
        self.min_interval_s = min_interval_s
        self.points: list[ExploredPoint] = []
        self.loaded = None
        self.warmed: set = set()
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.ui = None

    # -- the work (tested without widgets)
    def run_once(self, cfg: Config, live: LiveState | None = None) -> ExploredPoint:
        """Load the model (memoised), measure ``cfg``, append the point. Warm-up only for a new shape."""
        self.loaded = self.load(cfg.model, cfg.device, cfg.dtype)
        shape = (cfg.model, cfg.device, cfg.dtype, cfg.batch_size, cfg.prompt_tokens, cfg.compression)
        point = self.measure(self.loaded, cfg, live, 0 if shape in self.warmed else None)
        self.warmed.add(shape)
        self.points.append(point)
        return point

    def save(self) -> Path:
        """Write all explored points to the run folder (see :func:`save_points`)."""
        info = self.loaded.info if self.loaded is not None else None
        run = save_points(self.run_dir, self.points, info=info, config=dataclasses.asdict(self.cfg),
                          finish=not self.run_dir)
        self.run_dir = str(run)
        return run

    def frame(self) -> pd.DataFrame:
        return points_frame(self.points)

    # -- headless
    def show_static(self) -> Path:
        """One measurement of ``cfg``, saved to the run folder, shown as a table and a static figure."""
        from IPython.display import display

        point = self.run_once(self.cfg, LiveState(render=None))
        run = save_points(self.run_dir, self.points, info=self.loaded.info, config=dataclasses.asdict(self.cfg),
                          finish=not self.run_dir)
        self.run_dir = str(run)
        rec = point.requests[0]
        print(f"headless explorer: 1 point -> {run}\n"
              f"TTFT p50 {point.summary['ttft_s_p50']:.3f} s, TPOT p50 {point.summary['tpot_s_p50'] * 1e3:.1f} ms, "
              f"{point.summary['output_throughput_tps']:.1f} tok/s, {rec['output_tokens']} tokens\n"
              f"text (row 0): {rec.get('text', '')!r}")
        cols = ["n", "batch_size", "prompt_tokens", "max_new_tokens", "temperature", "ttft_s_p50", "tpot_s_p50",
                "output_throughput_tps", "goodput_rps"]
        display(self.frame()[cols])
        explorer_figure(self.frame()).show()
        return run

    def show(self):
        """Widgets when a frontend is present, otherwise :meth:`show_static`.

        Raises:
            ParameterError: widgets asked for in a kernel the runner started headless: nobody could
                press Run, the notebook would record nothing and still end "ok".
        """
        if not has_frontend(self.cfg.mode):
            return self.show_static()
        if headless():
            raise ParameterError("mode: widgets need a frontend, and this kernel was started headless "
                                 "(WORKBENCH_HEADLESS=1) so nothing would be measured; use mode 'auto' or 'static'")
        from IPython.display import display

        display(self.build_ui())
        return None

    # -- widgets (thin wiring)
    def build_ui(self):
        import ipywidgets as W

        c = self.cfg
        style = {"description_width": "130px"}
        lay = W.Layout(width="420px")
        self.w = {
            "model": W.Text(value=c.model, description="model", style=style, layout=lay),
            "device": W.Dropdown(options=list(models.DEVICES), value=c.device, description="device", style=style, layout=lay),
            "dtype": W.Dropdown(options=list(models.DTYPES), value=c.dtype, description="dtype", style=style, layout=lay),
            "batch_size": W.SelectionSlider(options=sorted({*BATCH_SIZES, c.batch_size}), value=c.batch_size,
                                            description="batch size", style=style, layout=lay),
            "prompt_tokens": W.SelectionSlider(options=sorted({*PROMPT_TOKENS, c.prompt_tokens}), value=c.prompt_tokens,
                                               description="prompt tokens", style=style, layout=lay),
            "max_new_tokens": W.IntSlider(value=c.max_new_tokens, min=1, max=max(512, c.max_new_tokens),
                                          description="max_new_tokens", style=style, layout=lay),
            "ignore_eos": W.Checkbox(value=c.ignore_eos, description="fixed length (ignore EOS)", indent=False,
                                     layout=W.Layout(width="420px", margin="2px 0 2px 138px")),
            "temperature": W.FloatSlider(value=c.temperature, min=0, max=2, step=0.05, description="temperature",
                                         style=style, layout=lay),
            "top_p": W.FloatSlider(value=c.top_p, min=0.05, max=1, step=0.05, description="top-p", style=style, layout=lay),
            # ipywidgets reads a None value as "nothing selected": "off" stands for None here
            "reasoning_budget": W.Dropdown(options=[("off", "off")] + [(str(b), b) for b in
                                                                      sorted({*REASONING_BUDGETS[1:], c.reasoning_budget or 0})],
                                           value="off" if c.reasoning_budget is None else c.reasoning_budget,
                                           description="reasoning budget", style=style, layout=lay),
            "compression": W.Dropdown(options=list(compression_strategies()), value=c.compression,
                                      description="compression", style=style, layout=lay),
            "compression_ratio": W.FloatSlider(value=c.compression_ratio, min=1, max=16, step=0.5,
                                               description="compression ratio", style=style, layout=lay),
        }
        self.run_button = W.Button(description="Run", button_style="primary", icon="play", layout=W.Layout(width="90px"))
        self.save_button = W.Button(description="Save points", icon="save", layout=W.Layout(width="120px"))
        self.color_by = W.Dropdown(options=["auto", *CONTROL_PARAMS], value="auto", description="colour by",
                                   style={"description_width": "70px"}, layout=W.Layout(width="200px"))
        self.status = W.HTML("<i>ready</i>")
        self.counters = W.HTML(counters_html(LiveState().snapshot()))
        self.text = W.HTML("<pre class='wb-text' style='white-space:pre-wrap;margin:0'></pre>",
                           layout=W.Layout(border="1px solid #ddd", padding="4px", min_height="80px", width="100%"))
        try:
            self.fig = new_figure_widget()
        except ImportError:  # plotly's FigureWidget needs anywidget: fall back to a redrawn static figure
            self.fig = W.Output()
        self.fig_box = W.Box([self.fig])
        self.run_button.on_click(lambda _: self.start())
        self.save_button.on_click(lambda _: self._save_clicked())
        self.color_by.observe(lambda _: self.redraw(), names="value")
        controls = W.VBox(list(self.w.values()) + [W.HBox([self.run_button, self.save_button, self.color_by]),
                                                   self.status], layout=W.Layout(flex="0 0 440px", width="440px"))
        live = W.VBox([W.HTML("<b>Live view</b> (request 0)"), self.counters, self.text])
        controls.add_class("wb-controls")
        live.add_class("wb-live")
        self.fig_box.add_class("wb-figure")
        self.ui = W.VBox([W.HBox([controls, live], layout=W.Layout(width="100%")), self.fig_box])
        self.ui.add_class("wb-explorer")
        live.layout = W.Layout(flex="1 1 auto", min_width="300px", margin="0 0 0 12px")
        return self.ui

    def config_from_controls(self) -> Config:
        """The controls' values as a validated config (raises ParameterError)."""
        values = {k: w.value for k, w in self.w.items()}
        values["reasoning_budget"] = None if values["reasoning_budget"] == "off" else values["reasoning_budget"]
        return dataclasses.replace(self.cfg, **values)

    def _render_live(self, snap: dict) -> None:
        self.counters.value = counters_html(snap)
        self.text.value = ("<pre class='wb-text' style='white-space:pre-wrap;margin:0'>"
                           f"{html.escape(snap['text'])}</pre>")

    def start(self) -> threading.Thread | None:
        """Run button: validate the controls, then measure in a background thread."""
        if self.thread is not None and self.thread.is_alive():
            return None
        try:
            cfg = self.config_from_controls()
        except ParameterError as exc:
            self.status.value = f"<span style='color:#b00'>error: {html.escape(str(exc))}</span>"
            return None
        self.run_button.disabled = True
        self.status.value = "<i>loading model / running...</i>"

        def work():
            live = LiveState(self._render_live, self.min_interval_s)
            try:
                loaded = self.load(cfg.model, cfg.device, cfg.dtype)
                live.decode = lambda ids: loaded.tokenizer.decode(ids, skip_special_tokens=True)
                p = self.run_once(cfg, live)
                s = p.summary
                self.status.value = (f"point #{len(self.points) - 1}: TTFT p50 {s['ttft_s_p50']:.3f} s, "
                                     f"{s['output_throughput_tps']:.1f} tok/s")
                self.redraw()
            except Exception as exc:  # noqa: BLE001 - shown in the UI, the kernel stays usable
                self.error = f"{type(exc).__name__}: {exc}"
                self.status.value = f"<span style='color:#b00'>failed: {html.escape(self.error)}</span>"
            finally:
                self.run_button.disabled = False

        self.thread = threading.Thread(target=work, daemon=True)
        self.thread.start()
        return self.thread

    def redraw(self) -> None:
        """Update the figure from the explored points (FigureWidget in place; Output redrawn)."""
        df = self.frame()
        if df.empty:
            return
        color_by = None if self.color_by.value == "auto" else self.color_by.value
        if hasattr(self.fig, "batch_update"):
            update_figure(self.fig, df, color_by)
        else:
            with self.fig:
                self.fig.clear_output(wait=True)
                explorer_figure(df, color_by).show()

    def _save_clicked(self) -> None:
        try:
            run = self.save()
            self.status.value = f"saved {len(self.points)} point(s) to <code>{html.escape(str(run))}</code>"
        except Exception as exc:  # noqa: BLE001
            self.status.value = f"<span style='color:#b00'>save failed: {html.escape(str(exc))}</span>"
