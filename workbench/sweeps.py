"""Sweeps: typed configs, parameter grids, the point loop, and papermill execution.

A sweep is a list of points (dicts of parameter values). :func:`run_sweep`
measures each point with a caller's ``measure`` function, aggregates it with
:func:`workbench.metrics.summarize_point`, and writes the rows to the run folder
as soon as the point finishes. A point that raises is recorded
``failed: <reason>`` and the loop goes on; ``resume=True`` skips points already
recorded ``ok``.

Notebooks are executed with papermill. Their parameter names are checked against
the notebook's ``parameters`` cell (papermill itself only warns), and the values
are validated by the notebook's typed config (named in the notebook metadata
``workbench.config``), so bad input fails with one line before a kernel starts
or a model loads.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import importlib
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from . import metrics, models, results
from .errors import ParameterError
from .generation import GenerationSettings, generate_measured

REPO = Path(__file__).resolve().parents[1]
SUITES_DIR = REPO / "suites"

#: Columns every request row carries (None when an experiment has no value for it).
REQUEST_COLUMNS = (
    "run_id", "experiment", "point_id", "repeat", "request_id", "model", "device", "dtype", "batch_size",
    "context_tokens", "prompt_tokens", "max_new_tokens", "temperature", "top_p", "do_sample", "seed",
    "reasoning_budget", "compression", "compressed_tokens", "ttft_s", "prefill_s", "e2e_s", "tpot_s",
    "decode_tps", "output_tokens", "thinking_tokens", "answer_tokens", "ttfat_s", "finish_reason", "itl_s",
    "error",
)


# ----------------------------------------------------------------------------- configs


def _check_list(name: str, values, kind=int, lo=None, hi=None) -> None:
    if not isinstance(values, (list, tuple)) or len(values) == 0:
        raise ParameterError(f"{name}: must be a non-empty list (got {values!r})")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, kind if kind is not float else (int, float)):
            raise ParameterError(f"{name}: every value must be {kind.__name__} (got {v!r})")
        if lo is not None and v < lo:
            raise ParameterError(f"{name}: every value must be >= {lo} (got {v!r})")
        if hi is not None and v > hi:
            raise ParameterError(f"{name}: every value must be <= {hi} (got {v!r})")


def _check_int(name: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ParameterError(f"{name}: must be an integer >= {lo} (got {value!r})")


@dataclasses.dataclass
class SweepConfig:
    """Fields every experiment shares; subclasses add theirs and validate in ``__post_init__``.

    Attributes:
        model: ``default`` (embedded SmolLM2-135M-Instruct), a local directory or a cached hub id.
        device: ``auto``, ``cpu``, ``cuda`` or ``mps``.
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        repeats: timed repetitions of each point (>= 1).
        warmup: untimed warm-up runs before each point (>= 0).
        seed: base seed; repeat ``r`` uses ``seed + r``.

    Raises:
        ParameterError: any invalid field (checked without loading the model).
    """

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    repeats: int = 1
    warmup: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.device not in models.DEVICES:
            raise ParameterError(f"device: must be one of {', '.join(models.DEVICES)} (got {self.device!r})")
        if self.dtype not in models.DTYPES:
            raise ParameterError(f"dtype: must be one of {', '.join(models.DTYPES)} (got {self.dtype!r})")
        _check_int("repeats", self.repeats, 1)
        _check_int("warmup", self.warmup, 0)
        _check_int("seed", self.seed, 0)
        if self.model != models.DEFAULT_MODEL:
            models.resolve_model_path(self.model)
        models.pick_device(self.device)  # a device this machine lacks fails here, before any kernel starts

    def max_context(self) -> int:
        """The model's maximum context in tokens (from its config; no weights load)."""
        return models.max_context_tokens(self.model)

    @classmethod
    def from_namespace(cls, ns: dict):
        """Build the config from a mapping (a notebook's ``globals()``), taking this class's field names."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in ns.items() if k in names})


@dataclasses.dataclass
class BatchSizeConfig(SweepConfig):
    """The batch-size trade-off sweep (notebook ``01_batch_size``).

    Attributes:
        batch_sizes: requests per ``generate`` call, each >= 1.
        prompt_tokens: prompt lengths in tokens (chat template included), each
            in [32, model maximum - max_new_tokens].
        max_new_tokens: new tokens per request (>= 1).
        ignore_eos: fixed-length outputs (``min_new_tokens = max_new_tokens``).
        temperature: 0 is greedy.
        top_p: nucleus mass in (0, 1].
        slo_ttft_s, slo_tpot_s: SLO for goodput (seconds, > 0).
    """

    batch_sizes: list = dataclasses.field(default_factory=lambda: [1, 2, 4, 8])
    prompt_tokens: list = dataclasses.field(default_factory=lambda: [128, 512])
    max_new_tokens: int = 32
    ignore_eos: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25

    def __post_init__(self):
        super().__post_init__()
        _check_list("batch_sizes", self.batch_sizes, int, lo=1)
        self.settings()  # validates max_new_tokens, ignore_eos, temperature, top_p
        if self.max_new_tokens > self.max_context() - 32:
            raise ParameterError(f"max_new_tokens: must be <= {self.max_context() - 32} (the model's context "
                                 f"minus a 32-token prompt) (got {self.max_new_tokens})")
        limit = self.max_context() - self.max_new_tokens
        _check_list("prompt_tokens", self.prompt_tokens, int, lo=32, hi=limit)
        for name in ("slo_ttft_s", "slo_tpot_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ParameterError(f"{name}: must be a number > 0 (got {v!r})")

    def settings(self, seed: int | None = None) -> GenerationSettings:
        """The :class:`GenerationSettings` of every point."""
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens,
            ignore_eos=self.ignore_eos,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed if seed is None else seed,
        )

    def grid(self) -> list[dict]:
        """Points: every (prompt_tokens, batch_size), prompt length outermost."""
        return expand_grid(prompt_tokens=self.prompt_tokens, batch_size=self.batch_sizes)


# ----------------------------------------------------------------------------- the point loop


def expand_grid(**axes) -> list[dict]:
    """Cartesian product of the axes, first axis outermost: ``expand_grid(a=[1,2], b=[3])``
    -> ``[{"a": 1, "b": 3}, {"a": 2, "b": 3}]``.

    Raises:
        ParameterError: an axis that is not a non-empty list.
    """
    for name, values in axes.items():
        if not isinstance(values, (list, tuple)) or len(values) == 0:
            raise ParameterError(f"{name}: must be a non-empty list (got {values!r})")
    names = list(axes)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def point_id(experiment: str, point: dict) -> str:
    """A stable id such as ``batch_size/prompt_tokens=128,batch_size=4``."""
    return experiment + "/" + ",".join(f"{k}={point[k]}" for k in point)


def measure_generation(loaded, prompts, settings: GenerationSettings, repeats: int = 1, warmup: int = 1, **kwargs) -> dict:
    """Measure one plain batch: ``warmup`` untimed runs, then ``repeats`` timed ones.

    Warm-up runs use the same prompts (same shapes) with at most 4 new tokens.
    Repeat ``r`` uses seed ``settings.seed + r``. ``kwargs`` go to
    :func:`workbench.generation.generate_measured`.

    Returns:
        The measure-dict of :func:`run_sweep`: ``requests`` (records with
        ``repeat``, ``batch_size``, ``batch_wall_s``), ``wall_s`` (sum of timed
        batch wall times), ``warmup_s``.
    """
    t0 = time.perf_counter()
    warm = dataclasses.replace(settings, max_new_tokens=min(4, settings.max_new_tokens), min_new_tokens=0)
    for _ in range(warmup):
        generate_measured(loaded, prompts, warm, **kwargs)
    warmup_s = time.perf_counter() - t0
    requests, wall = [], 0.0
    for r in range(repeats):
        res = generate_measured(loaded, prompts, dataclasses.replace(settings, seed=settings.seed + r), **kwargs)
        for rec in res.records:
            rec.update(repeat=r, batch_size=len(prompts), batch_wall_s=res.wall_s)
            requests.append(rec)
        wall += res.wall_s
    return {"requests": requests, "wall_s": wall, "warmup_s": warmup_s}


def _utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _utilisation(req: pd.DataFrame, summary: dict, info, env: dict) -> dict:
    """MBU (decode) and MFU (prefill) of a point, from its medians and the probed device peaks."""
    if info is None or "bandwidth_bytes_per_s" not in env or req.empty:
        return {}
    per_batch = req.groupby("repeat").size()
    batch = int(per_batch.median())
    prompt = pd.to_numeric(req["prompt_tokens"], errors="coerce").mean()
    if not math.isfinite(prompt):
        return {}
    ctx = prompt + float(req["output_tokens"].mean()) / 2
    # with a reused prefix cache only the new tokens are prefilled (compression's kv_reuse)
    prefilled = pd.to_numeric(req["prefilled_tokens"], errors="coerce").mean() if "prefilled_tokens" in req else math.nan
    prefill_tokens = prefilled if math.isfinite(prefilled) else prompt
    return {
        "mbu": metrics.mbu(info.weight_bytes, info.kv_cache_bytes_per_token(), batch, ctx,
                           summary.get("tpot_s_p50", float("nan")), env["bandwidth_bytes_per_s"]),
        "mfu": metrics.mfu(metrics.prefill_flops(info.num_non_embedding_params, info.num_layers, info.hidden_size,
                                                 int(prefill_tokens), batch),
                           summary.get("prefill_s_p50", float("nan")), env["flops_per_s"]),
        "peak_bandwidth_bytes_per_s": env["bandwidth_bytes_per_s"],
        "peak_flops_per_s": env["flops_per_s"],
    }


def run_sweep(
    run_dir,
    experiment: str,
    points: list[dict],
    measure: Callable[[dict], dict],
    resume: bool = False,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    info=None,
    config=None,
) -> pd.DataFrame:
    """Measure every point, writing each as it finishes; failures are recorded, not raised.

    Args:
        run_dir: the run folder (:func:`workbench.results.open_run`).
        experiment: experiment name (the ``experiment`` column).
        points: parameter dicts (e.g. from :func:`expand_grid`); their keys become columns.
        measure: ``measure(point) -> {"requests": [dict], "wall_s": float,
            "extra": dict (optional), "warmup_s": float (optional)}``.
        resume: skip points already recorded ``ok`` in this run.
        slo_ttft_s, slo_tpot_s: SLO for ``goodput_rps``.
        info: :class:`workbench.models.ModelInfo`; enables the environment record, MBU and MFU.
        config: the experiment's config dataclass, recorded in the manifest.

    Returns:
        ``points.parquet`` rows of this experiment: the point's parameters, the
        :func:`~workbench.metrics.summarize_point` columns, ``mbu``, ``mfu``,
        ``peak_memory_bytes``, ``warmup_s``, the measure's ``extra`` and ``status``.

    The environment variable ``WORKBENCH_INJECT_FAILURE`` (a substring of point
    ids) makes matching points fail: a test hook for the failure path.
    """
    from tqdm.auto import tqdm

    run = Path(run_dir)
    run_id = run.name
    ids = [point_id(experiment, p) for p in points]
    if len(set(ids)) != len(ids):
        raise ParameterError(f"points: duplicate points in the {experiment} grid")
    env = {}
    if info is not None:
        env = results.environment(info, seed=getattr(config, "seed", None))
        results.update_manifest(run, environment=env)
    results.update_manifest(
        run,
        experiments={experiment: {
            "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
            "model": info.to_dict() if info is not None else None,
            "points": ids,
        }},
    )
    done = results.finished_points(run) if resume else set()
    inject = os.environ.get("WORKBENCH_INJECT_FAILURE")
    model_cols = {"model": info.name, "device": info.device, "dtype": info.dtype} if info is not None else {}
    todo = [(p, pid) for p, pid in zip(points, ids) if pid not in done]
    if len(todo) < len(points):
        print(f"{experiment}: resuming, {len(points) - len(todo)} of {len(points)} points already done")
    bar = tqdm(todo, desc=experiment, unit="point", file=sys.stderr, mininterval=1.0)
    for i, (p, pid) in enumerate(bar, 1):
        meta = {"experiment": experiment, "params": p, "started_utc": _utc()}
        base = {"run_id": run_id, "experiment": experiment, "point_id": pid, **model_cols, **p}
        try:
            if inject and inject in pid:
                raise RuntimeError(f"injected failure (WORKBENCH_INJECT_FAILURE={inject!r})")
            m = measure(p)
            req = pd.DataFrame(m["requests"])
            for col, val in base.items():  # measured request values win over the point's parameters
                if col not in req or col in ("run_id", "experiment", "point_id"):
                    req[col] = [val] * len(req)
            for col in REQUEST_COLUMNS:
                if col not in req:
                    req[col] = None
            summary = metrics.summarize_point(req, m["wall_s"], slo_ttft_s, slo_tpot_s)
            row = {**base, **summary, **_utilisation(req, summary, info, env),
                   "peak_memory_bytes": metrics.peak_memory_bytes(info.device) if info is not None else None,
                   "warmup_s": m.get("warmup_s"), **m.get("extra", {}), "status": "ok"}
            meta.update(status="ok")
        except Exception as exc:  # noqa: BLE001 - a failed point is data, not a crash
            reason = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            req = pd.DataFrame()
            row = {**base, "status": reason}
            meta.update(status=reason)
            _free_accelerator_memory()
        meta["finished_utc"] = _utc()
        results.record_point(run, pid, req, row, meta)
        bar.write(_headline(i, len(todo), pid, row))
    bar.close()
    return results.read_points(run, experiment)


def _headline(i: int, n: int, pid: str, row: dict) -> str:
    if row["status"] != "ok":
        return f"[{i}/{n}] {pid}: {row['status']}"
    line = (f"[{i}/{n}] {pid}: TTFT p50 {row.get('ttft_s_p50', float('nan')):.3f} s, "
            f"TPOT p50 {row.get('tpot_s_p50', float('nan')) * 1e3:.1f} ms, "
            f"{row.get('output_throughput_tps', float('nan')):.1f} tok/s")
    goodput = row.get("goodput_rps")
    if goodput is not None and math.isfinite(goodput):
        line += f", goodput {goodput:.2f} req/s"
    return line


def _free_accelerator_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def run_batch_size_sweep(cfg: BatchSizeConfig, run_dir, loaded, resume: bool = False) -> pd.DataFrame:
    """The batch-size trade-off: every (prompt_tokens, batch_size) point of ``cfg``.

    Each row of a batch gets a different window of real text of exactly
    ``prompt_tokens`` tokens (:func:`workbench.prompts.build_batch`).

    Returns:
        The experiment's points DataFrame (see :func:`run_sweep`).
    """
    from .prompts import build_batch

    def measure(p):
        prompts = build_batch(loaded.tokenizer, p["batch_size"], p["prompt_tokens"])
        out = measure_generation(loaded, prompts, cfg.settings(), cfg.repeats, cfg.warmup)
        for rec in out["requests"]:
            rec["context_tokens"] = p["prompt_tokens"]
        return out

    return run_sweep(run_dir, "batch_size", cfg.grid(), measure, resume=resume, slo_ttft_s=cfg.slo_ttft_s,
                     slo_tpot_s=cfg.slo_tpot_s, info=loaded.info, config=cfg)


# ----------------------------------------------------------------------------- notebooks and papermill


def notebook_parameters(path) -> dict:
    """``{name: default value}`` of a notebook's ``parameters`` cell (literals, parsed, never evaluated).

    Raises:
        ParameterError: the notebook does not exist or has no tagged ``parameters`` cell.
    """
    path = Path(path)
    if not path.exists():
        raise ParameterError(f"notebook: {str(path)!r} does not exist")
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            out = {}
            for node in tree.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    out[node.target.id] = ast.literal_eval(node.value) if node.value is not None else None
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    out[node.targets[0].id] = ast.literal_eval(node.value)
            return out
    raise ParameterError(f"notebook: {path.name} has no cell tagged 'parameters'")


def notebook_config_class(path):
    """The config class named in the notebook metadata ``workbench.config`` (``module:Class``), or None."""
    meta = json.loads(Path(path).read_text()).get("metadata", {}).get("workbench", {})
    target = meta.get("config")
    if not target:
        return None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def validate_parameters(path, params: dict) -> dict:
    """Check names against the notebook's parameters cell, then values with its typed config.

    Args:
        path: the notebook.
        params: overrides (already typed: lists are lists).

    Returns:
        The full parameter dict (defaults updated by ``params``).

    Raises:
        ParameterError: an unknown name, or a value the config rejects.
    """
    defaults = notebook_parameters(path)
    if "run_dir" in params:
        raise ParameterError("run_dir: set by the command line; use --resume RUN_DIR to continue a run")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ParameterError(
            f"{unknown[0]}: not a parameter of {Path(path).name} (known: {', '.join(sorted(defaults))})"
        )
    merged = {**defaults, **params}
    cls = notebook_config_class(path)
    if cls is not None:
        cls.from_namespace(merged)
    return merged


def execute_notebook(path, params: dict, run_dir, log_output: bool = True) -> Path:
    """Execute a notebook with papermill into ``<run_dir>/notebooks/``, with ``run_dir`` injected.

    The kernel is the ``python3`` kernel of this interpreter (its folder goes
    first on ``PATH``). Output is streamed to the console when ``log_output``.

    Returns:
        The executed notebook's path.

    Raises:
        papermill.PapermillExecutionError: a cell failed (the executed notebook is still written).
    """
    import logging

    import papermill as pm

    path = Path(path).resolve()
    out = Path(run_dir) / "notebooks" / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    if log_output:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        logging.getLogger("papermill").setLevel(logging.INFO)
    pm.execute_notebook(
        str(path),
        str(out),
        parameters={**params, "run_dir": str(Path(run_dir).resolve())},
        cwd=str(path.parent),
        log_output=log_output,
        progress_bar=False,
        kernel_name="python3",
    )
    return out


def load_suite(suite: str) -> dict:
    """Read a suite: a name in ``suites/`` (``default``, ``quick``) or a YAML path.

    Format: ``{"description": str, "notebooks": [{"notebook": path, "parameters": dict}]}``;
    notebook paths are relative to the repository.

    Raises:
        ParameterError: unknown suite or malformed file.
    """
    import yaml

    path = Path(suite)
    if not path.suffix:
        path = SUITES_DIR / f"{suite}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SUITES_DIR.glob("*.yaml")))
        raise ParameterError(f"suite: {suite!r} is neither a suite name ({known}) nor a YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ParameterError(f"suite: {path} is not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("notebooks"), list):
        raise ParameterError(f"suite: {path} must hold a 'notebooks' list")
    for entry in data["notebooks"]:
        entry["notebook"] = str((REPO / entry["notebook"]).resolve())
        entry.setdefault("parameters", {})
    data["path"] = str(path)
    return data
