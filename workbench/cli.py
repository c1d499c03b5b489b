"""The ``workbench`` command: run suites, sweep one notebook, build reports, show the environment.

    workbench run [SUITE] [--resume RUN_DIR [--allow-changed]] [--label NAME] [--rerun-invalid RUN_DIR] [--ray [auto|ADDRESS]]
    workbench sweep NOTEBOOK [-f grid.yaml] [-p NAME VALUE ...] [--resume RUN_DIR [--allow-changed]] [--label NAME]
    workbench report RUN_DIR [RUN_DIR ...] [-o OUT.html]
    workbench env [--model SPEC] [--no-probe]
    workbench plan [SUITE] [--calibrate] [--no-probe]   (also --dry-run on run / sweep)
    workbench serve [--model SPEC] [--host 127.0.0.1] [--port 8000] ...

Parameter values are data: ``-f`` files and ``-p`` values are parsed as YAML
(``-p batch_sizes "[1, 2, 4]"`` arrives as a list), never evaluated. Every
notebook's parameters are validated before any kernel starts or model loads;
a bad one prints ``error: <one line>`` and exits with status 2. A resumed run whose model, device, dtype,
package versions or any notebook's effective config (defaults included) differ from the run's is refused the same
way, naming each difference, unless ``--allow-changed`` (:mod:`workbench.run.resume_check`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from workbench.errors import ParameterError


def _parse_params(files: list[str] | None, pairs: list[list[str]] | None) -> dict:
    """Parameters from ``-f`` YAML files, then ``-p NAME VALUE`` pairs (later wins), parsed as YAML 1.2 data."""
    import yaml

    from workbench.run.notebooks import load_yaml

    params: dict = {}
    for f in files or []:
        path = Path(f)
        if not path.is_file():
            raise ParameterError(f"-f: {f!r} is not a parameter file ({'a directory' if path.is_dir() else 'missing'})")
        try:
            data = load_yaml(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ParameterError(f"-f: {f!r} is not UTF-8 text") from None
        except yaml.YAMLError as exc:
            raise ParameterError(f"-f: {f!r} is not valid YAML ({str(exc).splitlines()[0]})") from exc
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ParameterError(f"-f: {f!r} must hold a mapping of parameter names to values")
        params.update(data)
    for name, value in pairs or []:
        try:
            params[name] = load_yaml(value)
        except yaml.YAMLError as exc:
            raise ParameterError(f"{name}: value {value!r} is not valid YAML") from exc
    return params


def _execute(entries: list[dict], run_dir: Path, resume: bool) -> list[str]:
    """Execute validated notebook entries into the run, all in one kernel (:func:`workbench.run.notebooks.one_kernel`);
    return the names that failed."""
    from workbench.run import notebooks

    failed = []
    with notebooks.one_kernel():  # one kernel for the run: imports, model, probe and drift reference paid once
        for i, e in enumerate(entries, 1):
            _execute_one(i, e, entries, run_dir, resume, failed)
    return failed


def _execute_one(i: int, e: dict, entries: list[dict], run_dir: Path, resume: bool, failed: list[str]) -> None:
    """Execute the ``i``-th notebook entry into the run, recording its status; a failure is appended to ``failed``."""
    from workbench.run import notebooks, results

    name = Path(e["notebook"]).stem
    print(f"== [{i}/{len(entries)}] {name}", flush=True)
    t0 = time.perf_counter()
    params = dict(e["parameters"])
    if resume:
        params["resume"] = True
    # parameters are on disk before any point runs: an interrupted notebook resumes with the same ones
    results.update_manifest(run_dir, notebooks={name: {"status": "running", "parameters": e["parameters"]}})
    before = len(results.read_manifest(run_dir).get("points", {}))
    try:
        notebooks.execute_notebook(e["notebook"], params, run_dir)
        status = "ok"
        recorded = len(results.read_manifest(run_dir).get("points", {})) - before
        if recorded == 0 and not resume and not name.startswith("9"):  # 9x notebooks analyse, never measure
            status = "failed: the notebook was asked to measure and recorded no point"
            failed.append(name)
    except Exception as exc:  # noqa: BLE001 - one failed notebook must not stop the suite
        if isinstance(exc, results.RunWriteError) or getattr(exc, "ename", None) in ("RunWriteError",
                                                                                     "RunLockedError"):
            # the run folder cannot be written (disk full) or was taken over: stop, keep what is on disk
            raise results.RunWriteError(str(getattr(exc, "evalue", None) or exc)) from exc
        status = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:400]
        failed.append(name)
    wall = time.perf_counter() - t0
    results.update_manifest(run_dir, notebooks={name: {"status": status, "wall_s": round(wall, 1),
                                                        "parameters": e["parameters"]}})
    print(f"== {name}: {status} ({wall:.0f} s)", flush=True)


def _resume_parameters(entries: list[dict], resume_dir: str) -> None:
    """On ``--resume``, reuse the parameters the run recorded; refuse different ones.

    A resumed point must be measured with the settings of the points already
    on disk, so a notebook given no parameters takes the recorded ones and a
    notebook given others is an error.
    """
    from workbench.run import results

    if not (Path(resume_dir) / "manifest.json").exists():
        raise ParameterError(f"--resume: {resume_dir!r} is not a run folder (no manifest.json)")
    recorded = results.read_manifest(resume_dir).get("notebooks", {})
    for e in entries:
        name = Path(e["notebook"]).stem
        if name not in recorded:
            continue
        before = recorded[name].get("parameters", {})
        if not e["parameters"]:
            e["parameters"] = dict(before)
        elif e["parameters"] != before:
            raise ParameterError(f"--resume: {name} parameters differ from the run's {before}; "
                                 "give the same ones (or none) to resume")


def _run_entries(entries: list[dict], resume_dir: str | None, label: str, suite: str | None = None,
                 allow_changed: bool = False) -> int:
    from workbench.run import notebooks, results, resume_check

    if resume_dir:
        _resume_parameters(entries, resume_dir)
    for e in entries:  # every notebook validated before any runs
        e["parameters"] = {k: v for k, v in notebooks.validate_parameters(e["notebook"], e["parameters"]).items()
                           if k in e["parameters"]}
    if resume_dir:  # model, device, dtype, packages, every notebook's effective config: the same, or exit 2
        changed = resume_check.check_resume(resume_dir, entries, allow_changed)
        if changed:
            print(f"--allow-changed: measuring again under new ids what changed: {'; '.join(changed)}", flush=True)
    if allow_changed:
        os.environ[resume_check.ALLOW_ENV] = "1"  # inherited by the kernels (workbench.run.sweeps.run_sweep)
    try:
        run_dir = results.open_run(resume_dir) if resume_dir else results.create_run(label)
        owner = results.lock_run(run_dir)   # one writer per run folder; a second resume is refused here
    except results.RunLockedError as exc:
        raise ParameterError(f"--resume: {exc}") from None
    try:
        return _run_locked(entries, run_dir, bool(resume_dir), suite, owner)
    finally:
        results.unlock_run(run_dir)


def _run_locked(entries: list[dict], run_dir: Path, resume: bool, suite: str | None, owner: dict) -> int:
    from workbench.share import report
    from workbench.run import results, resume_check

    recorded_suite = results.read_manifest(run_dir).get("suite") if resume else None
    if resume and suite and recorded_suite and Path(recorded_suite).resolve() != Path(suite).resolve():
        raise ParameterError(f"--resume: the run was started with suite {recorded_suite}, not {suite}; "
                             "give the same suite to resume")
    if owner.get("stale"):
        print(f"run folder: took over the lock left by pid {owner['stale'].get('pid')} (no longer running)",
              file=sys.stderr)
    results.begin_session(run_dir, resume=resume)
    resume_check.record(run_dir, entries, resume)
    results.update_manifest(run_dir, status="running", suite=suite or recorded_suite)
    print(f"run folder: {run_dir}", flush=True)
    t0 = time.perf_counter()
    try:
        failed = _execute(entries, run_dir, resume=resume)
    except KeyboardInterrupt:
        _mark_interrupted(run_dir)
        print(f"\ninterrupted: finished points are on disk; continue with --resume {run_dir}", file=sys.stderr)
        return 130
    except results.RunWriteError as exc:
        _mark_interrupted(run_dir)
        print(f"error: {str(exc).strip().splitlines()[-1]}; finished points are kept: free the space, then "
              f"--resume {run_dir}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    status = "ok" if not failed else f"failed: {', '.join(failed)}"
    results.update_manifest(run_dir, status=status, wall_s=round(wall, 1))
    out = report.build_report(run_dir)
    print(f"done in {wall:.0f} s: {status}\nreport: {out}", flush=True)
    return 0 if not failed else 1


def _mark_interrupted(run_dir: Path) -> None:
    """Best effort: the manifest says ``interrupted`` (it may itself be unwritable when the disk is full)."""
    from workbench.run import results

    try:
        results.update_manifest(run_dir, status="interrupted")
    except (OSError, ParameterError):
        pass


def _rerun_invalid_entries(run_dir: str) -> list[dict]:
    """The notebooks a run recorded, with their recorded parameters (``--rerun-invalid``)."""
    import os

    from workbench.run import notebooks, results

    if not (Path(run_dir) / "manifest.json").exists():
        raise ParameterError(f"--rerun-invalid: {run_dir!r} is not a run folder (no manifest.json)")
    bad = results.invalid_points(run_dir)
    if not bad:
        raise ParameterError(f"--rerun-invalid: {run_dir!r} has no point marked invalid")
    print(f"re-measuring {len(bad)} invalid point(s): " + ", ".join(sorted(bad)), flush=True)
    os.environ["WORKBENCH_RERUN_INVALID"] = "1"  # inherited by the kernels: invalid points count as unfinished
    recorded = results.read_manifest(run_dir).get("notebooks", {})
    return [{"notebook": str(notebooks.NOTEBOOKS_DIR / f"{name}.ipynb"), "parameters": dict(rec.get("parameters", {}))}
            for name, rec in recorded.items()]


def cmd_run(args) -> int:
    from workbench.run import notebooks

    if args.rerun_invalid:
        return _run_entries(_rerun_invalid_entries(args.rerun_invalid), args.rerun_invalid, args.label)
    suite = notebooks.load_suite(args.suite)
    if getattr(args, "dry_run", False):
        return _print_plan(suite["notebooks"])
    if getattr(args, "ray", None):  # connect, check the suite fits the cluster; kernels inherit $WORKBENCH_RAY
        from workbench.run.distributed import prepare

        prepare(args.ray, suite["notebooks"])
    return _run_entries(suite["notebooks"], args.resume, args.label, suite=suite["path"],
                        allow_changed=args.allow_changed)


def cmd_sweep(args) -> int:
    from workbench.run import notebooks

    nb = Path(args.notebook)
    for candidate in (notebooks.NOTEBOOKS_DIR / nb, notebooks.NOTEBOOKS_DIR / f"{nb}.ipynb"):
        if not nb.exists() and candidate.exists():
            nb = candidate
    if not nb.exists() or nb.suffix != ".ipynb":
        known = ", ".join(sorted(p.name for p in notebooks.NOTEBOOKS_DIR.glob("[0-9]*.ipynb")))
        raise ParameterError(f"notebook: {args.notebook!r} is not a notebook (known: {known})")
    params = _parse_params(args.file, args.param)
    if getattr(args, "dry_run", False):
        return _print_plan([{"notebook": str(nb.resolve()), "parameters": params}])
    if getattr(args, "ray", None):
        from workbench.run.distributed import prepare

        prepare(args.ray, [{"notebook": str(nb), "parameters": params}])
    return _run_entries([{"notebook": str(nb.resolve()), "parameters": params}], args.resume, args.label,
                        allow_changed=args.allow_changed)


def cmd_report(args) -> int:
    from workbench.share import report

    from workbench.run import results

    runs = [Path(r) for r in args.runs]
    seen: dict[Path, str] = {}
    for r in runs:
        if not (r / "manifest.json").is_file():
            raise ParameterError(f"RUN_DIR: {str(r)!r} is not a run folder (no manifest.json)")
        try:
            results.read_manifest(r)
        except ParameterError as exc:
            raise ParameterError(f"RUN_DIR: {exc}".replace("RUN_DIR: run_dir: ", "RUN_DIR: ")) from None
        key = r.resolve()
        if key in seen:
            raise ParameterError(f"RUN_DIR: {str(r)!r} is given twice (as {seen[key]!r}); compare different runs")
        seen[key] = str(r)
    print(report.build_report(runs, args.output))
    return 0


def cmd_env(args) -> int:
    import torch

    from workbench.measure import device, models
    from workbench.run import results

    dev = models.pick_device("auto")
    info = {
        "device": dev,
        "device_name": models.device_name(dev),
        "cuda_available": torch.cuda.is_available(),
        "mps_available": torch.backends.mps.is_available(),
        "bf16_supported": bool(dev == "cuda" and torch.cuda.is_bf16_supported()) or dev == "cpu",
        "torch_threads": torch.get_num_threads(),
        "results_root": str(results.results_root()),
        "model_cache": str(models.cache_root()),
    }
    for key, fn in (("default_gguf", models.default_gguf_path), ("default_embedder", models.default_embedder_path)):
        try:
            info[key] = str(fn())
        except ParameterError as exc:
            info[key] = f"missing: {exc}"
    cached = sorted((models.cache_root() / "models").glob("*"))
    info["converted_models"] = [str(p) for p in cached if p.is_dir()]
    if args.model:
        info["model_path"] = str(models.resolve_model_path(args.model))
        info["model_max_context_tokens"] = models.max_context_tokens(args.model)
    if not args.no_probe:
        p = device.probe_device(dev, "float32")
        info["bandwidth_GBps"] = round(p["bandwidth_bytes_per_s"] / 1e9, 2)
        info["matmul_GFLOPs_fp32"] = round(p["flops_per_s"] / 1e9, 1)
    info.update({k: v for k, v in device.facts(None, probe=False).items() if k not in info})
    print(json.dumps(info, indent=2))
    return 0


def _print_plan(entries: list[dict], probe: bool = True, calibrate: bool = False) -> int:
    """``workbench plan`` / ``--dry-run``: the points, their predicted cost and the estimated wall time
    (:mod:`workbench.predict.roofline`); nothing is measured and no weights load unless ``calibrate``."""
    from workbench.measure import models
    from workbench.run import notebooks
    from workbench.predict import predictions, roofline

    first = notebooks.validate_parameters(entries[0]["notebook"], entries[0]["parameters"]) if entries else {}
    spec, dev = first.get("model", "default"), models.pick_device(first.get("device", "auto"))
    dtype = first.get("dtype", "auto")
    if calibrate:
        loaded = models.load_model(spec, dev, dtype)
        device, calib = roofline.calibrate(loaded)
        print(f"calibrated in {calib.calibration_s:.1f} s: {calib}", flush=True)
    predictor = roofline.Predictor.for_model(spec, dev, dtype, probe=probe)
    plan = predictions.plan_entries(entries, predictor)
    print(predictions.format_plan(plan, predictor.calib.calibrated))
    return 0


def cmd_plan(args) -> int:
    from workbench.run import notebooks

    suite = notebooks.load_suite(args.suite)
    return _print_plan(suite["notebooks"], probe=not args.no_probe, calibrate=args.calibrate)


def cmd_serve(args) -> int:
    from workbench.serving.server import main as serve_main

    serve_main(args.rest, prog="workbench serve")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a suite of notebooks (default: the default suite) into one run folder")
    r.add_argument("suite", nargs="?", default="default", help="suite name in suites/ (default, quick) or a YAML path")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run, skipping finished points")
    r.add_argument("--label", default="", help="suffix of the new run id (letters, digits, _.-)")
    r.add_argument("--allow-changed", action="store_true",
                   help="with --resume: accept settings that differ from the run's (model, device, dtype, packages, "
                        "notebook configs); the changed points are measured again under new ids")
    r.add_argument("--rerun-invalid", metavar="RUN_DIR",
                   help="re-measure only the points of RUN_DIR marked invalid (other load, drift), in place")
    r.add_argument("--dry-run", action="store_true", help="print the points and predicted cost; measure nothing")
    r.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                   help="measure the points on Ray workers: a running cluster (auto: found, else started here) "
                        "or a head node's HOST:PORT; needs the [ray] extra")
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="run one notebook over a parameter grid")
    s.add_argument("notebook", help="notebook path or name in notebooks/")
    s.add_argument("-f", "--file", action="append", metavar="GRID.yaml", help="YAML file of parameters")
    s.add_argument("-p", "--param", action="append", nargs=2, metavar=("NAME", "VALUE"),
                   help="one parameter; VALUE is parsed as YAML (lists, numbers, booleans)")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run, skipping finished points")
    s.add_argument("--label", default="", help="suffix of the new run id")
    s.add_argument("--allow-changed", action="store_true",
                   help="with --resume: accept settings that differ from the run's (model, device, dtype, packages, "
                        "notebook configs); the changed points are measured again under new ids")
    s.add_argument("--dry-run", action="store_true", help="print the points and predicted cost; measure nothing")
    s.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                   help="measure the points on Ray workers (see workbench run --help)")
    s.set_defaults(func=cmd_sweep)

    pl = sub.add_parser("plan", help="the suite's points, predicted cost per point and estimated wall time")
    pl.add_argument("suite", nargs="?", default="default", help="suite name in suites/ or a YAML path")
    pl.add_argument("--calibrate", action="store_true",
                    help="first fit this machine's overheads on the model (~20 s; cached for later plans)")
    pl.add_argument("--no-probe", action="store_true", help="nominal device peaks instead of a probe")
    pl.set_defaults(func=cmd_plan)

    rep = sub.add_parser("report", help="(re)build the HTML report of one run, or a comparison of several")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument("-o", "--output", help="output HTML file")
    rep.set_defaults(func=cmd_report)

    e = sub.add_parser("env", help="print device, dtype support, measured bandwidth and models found")
    e.add_argument("--model", help="also resolve this model spec")
    e.add_argument("--no-probe", action="store_true", help="skip the bandwidth / FLOP/s probe")
    e.set_defaults(func=cmd_env)

    sv = sub.add_parser("serve", add_help=False, help="the OpenAI-compatible server (workbench serve --help)")
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(argv)
    if args.command != "serve" and rest:
        build_parser().parse_args(argv)  # the usual error for unknown arguments
    args.rest = rest
    from workbench.run import results

    results.results_root()  # resolved once here; kernels inherit the absolute $WORKBENCH_RESULTS
    try:
        return args.func(args)
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except results.RunWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
