"""The configurations of the engine-tuning experiment (:mod:`workbench.experiments.engine_tuning`, notebook
``09_engine_tuning``) as the arms of one design (:mod:`workbench.run.design`), measured round by round.

:data:`EXPERIMENT` and the design's primary outcome :data:`E2E` (a round's request latency), which the summaries and
the charts read too; :func:`design_configurations` measures the rounds and returns a point per configuration x
workload. The experiment completes each point (:func:`workbench.experiments.engine_tuning.finish_point`: the
quality guard, the prediction) and re-exports these names.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

from workbench.errors import ParameterError
from workbench.inputs.prompts import build_batch
from workbench.measure import contention, models
from workbench.measure.device import threads
from workbench.measure.generation import generate_measured, warm_up
from workbench.run import design, point_result
from workbench.run.point_result import PointResult
from workbench.techniques.configurations import config_name, generate_kwargs, load_configuration

if TYPE_CHECKING:
    from workbench.experiments.engine_tuning import Config

EXPERIMENT = "engine_tuning"
#: the design's primary outcome: a configuration's request latency in a round (the geometric mean over workloads of
#: its batch's mean ``e2e_s``), its ratio to the baseline's ``time_ratio``
E2E = design.Outcome("e2e_s", False, "request latency (e2e)", "time_ratio")


def _records_wall(records: list[dict]) -> float:
    """The timed wall time of a point's rounds: one batch wall time per round."""
    seen = {}
    for r in records:
        seen.setdefault(r.get("repeat"), float(r.get("batch_wall_s") or 0.0))
    return float(sum(seen.values()))


def design_configurations(loaded, cfg: Config, configurations: list[dict], state: dict,
                          run_dir=None) -> dict[str, PointResult]:
    """Measure configurations as the arms of one design (:mod:`workbench.run.design`).

    Every round measures every configuration once at every workload (round ``r`` at seed ``cfg.seed + r``), plus
    the baseline a second time (the A/A control), in an order shuffled per round (``cfg.order == "interleaved"``:
    every configuration stays loaded, :func:`load_configuration`'s models kept here) or forward then reverse
    (``"blocks"``, A B B A: one configuration loaded at a time, loaded and warmed up again at each switch, where a
    device's memory cannot hold them all). The control is the baseline, :meth:`Config.baseline` (marked, never the
    first row of a table); the primary outcome a configuration's request latency in a round: the geometric mean over
    workloads of its batch's mean ``e2e_s``. Before its first round each configuration warms up at each workload
    (``cfg.warmup`` batches; a compiled one runs one full untimed request instead: ``compile_s``). The design adds
    rounds up to ``cfg.max_rounds`` while a configuration's comparison is undecided and the budget allows.

    Args:
        loaded: the notebook's model (unused for timing; each configuration runs its own).
        configurations: configuration dicts (:meth:`Config.configurations`); the baseline among them.
        state: the sweep's shared state (``logits_processor`` applies here too).
        run_dir: the run folder (rounds stored and resumed there).

    Returns:
        ``{point_id: PointResult}`` per configuration x workload: ``requests`` with ``repeat`` = round, ``extra``
        with ``config``, ``baseline`` (True on the baseline's points), ``compile_s``, the design's point columns
        (:meth:`workbench.run.design.DesignResult.point_columns`: ``time_ratio`` with its simultaneous interval and
        verdict, the A/A columns, ``rounds``, ``rounds_needed``) and ``speedup_vs_baseline`` / ``speedup_low`` /
        ``speedup_high`` (``1 / time_ratio``); ``contamination``: other processes' load over all rounds.

    Raises:
        ParameterError: fewer than 2 configurations, or duplicate ones.
    """
    names = [config_name(c) for c in configurations]
    if len(set(names)) != len(names):
        raise ParameterError(f"configurations: duplicates in {names}")
    dev = models.pick_device(cfg.device)
    lp = state.get("logits_processor")
    settings = cfg.settings()
    by_name = dict(zip(names, configurations))
    base = config_name(cfg.baseline())
    kept: dict = {}
    meta: dict = {}

    def model_of(name):
        if name not in kept:
            if cfg.order == "blocks":
                kept.clear()                      # one configuration in memory at a time
            kept[name] = (load_configuration(cfg, by_name[name]), generate_kwargs(by_name[name], dev))
            return kept[name], True
        return kept[name], False

    def warm(name, model, kw):
        c = by_name[name]
        t0 = time.perf_counter()
        for w in cfg.workloads():
            prompts = build_batch(model.tokenizer, int(w["batch_size"]), int(w["prompt_tokens"]))
            with threads(c.get("torch_threads")):
                t1 = time.perf_counter()
                if c.get("compile"):
                    generate_measured(model, prompts, settings, generate_kwargs=kw, logits_processor=lp)
                    meta.setdefault((name, w["batch_size"], w["prompt_tokens"]), time.perf_counter() - t1)
                else:
                    warm_up(model, prompts, settings, cfg.warmup, generate_kwargs=kw, logits_processor=lp)
        return time.perf_counter() - t0

    def prepare(name):
        (model, kw), _ = model_of(name)
        return warm(name, model, kw)

    def measure(name, rnd):
        (model, kw), fresh = model_of(name)
        if fresh and cfg.order == "blocks":      # loaded again after a switch: warmed up again, untimed
            warm(name, model, kw)
        recs, logs, wall = [], [], 0.0
        for w in cfg.workloads():
            prompts = build_batch(model.tokenizer, int(w["batch_size"]), int(w["prompt_tokens"]))
            with threads(by_name[name].get("torch_threads")):
                res = generate_measured(model, prompts, dataclasses.replace(settings, seed=cfg.seed + rnd),
                                        generate_kwargs=kw, logits_processor=lp)
            done = [r["e2e_s"] for r in res.records if r.get("output_tokens", 0) >= 1 and r.get("e2e_s")]
            logs.append(math.log(sum(done) / len(done)) if done else float("nan"))
            for rec in res.records:
                rec.update(batch_size=len(prompts), batch_wall_s=res.wall_s, prompt_tokens_point=w["prompt_tokens"])
            recs += res.records
            wall += res.wall_s
        return design.Measured({E2E.name: math.exp(sum(logs) / len(logs))}, recs, wall)

    d = design.Design(EXPERIMENT, names, base, E2E, order=cfg.order, **cfg.design_kwargs())
    monitor = contention.LoadMonitor()
    result = design.run_design(d, measure, prepare, run_dir=run_dir)
    contamination = monitor.stop()
    design.remember_spread(result, run_dir)
    state["design"] = result
    out = {}
    for name, c in by_name.items():
        cols = result.point_columns(name)
        t, lo, hi = cols["time_ratio"], cols["time_ratio_low"], cols["time_ratio_high"]
        inv = (lambda x: 1.0 / x if x and math.isfinite(x) else float("nan"))
        cols.update(config=name, baseline=name == base, speedup_vs_baseline=inv(t), speedup_low=inv(hi),
                    speedup_high=inv(lo))
        for w in cfg.workloads():
            B, L = int(w["batch_size"]), int(w["prompt_tokens"])
            mine = [r for r in result.requests.get(name, []) if r.get("prompt_tokens_point") == L
                    and r.get("batch_size") == B]
            for r in mine:
                r.pop("prompt_tokens_point", None)
            pid = point_result.point_id(EXPERIMENT, {**c, "batch_size": B, "prompt_tokens": L})
            out[pid] = PointResult(requests=mine, wall_s=_records_wall(mine),
                                   warmup_s=result.warmup_s.get(name),
                                   extra={**cols, "compile_s": meta.get((name, B, L), float("nan"))},
                                   contamination=dict(contamination))
    return out
