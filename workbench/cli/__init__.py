"""The ``workbench`` command: run suites, sweep one notebook, build reports, export and simulate, show the environment.

Argument parsing and dispatch only: the suite runner is :mod:`workbench.run.suite` (the report it builds at the end
is passed in from here), the serving twin's study :mod:`workbench.predict.twin_study` and its check against a run's
measured serving points :mod:`workbench.predict.twin_validation` (``simulate``'s arguments:
:mod:`workbench.cli.simulate_args`).

    workbench run [SUITE] [--resume RUN_DIR [--allow-changed]] [--label NAME] [--rerun-invalid RUN_DIR] [--ray [auto|ADDRESS]]
    workbench sweep NOTEBOOK [-f grid.yaml] [-p NAME VALUE ...] [--resume RUN_DIR [--allow-changed]] [--label NAME]
    workbench report RUN_DIR|FILE [RUN_DIR|FILE ...] [-o OUT.html] [--figures png,svg,pdf] [--price-per-hour USD]
    workbench export RUN_DIR --to mlflow|br0.2|vllm-json [--tracking-uri URI] [-o OUT]
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
import sys
from pathlib import Path

from workbench.errors import ParameterError
from workbench.run import suite as suite_runner

__all__ = ["main"]  # the command line: nothing else here is imported from outside


def _parse_params(files: list[str] | None, pairs: list[list[str]] | None) -> dict:
    """Parameters from ``-f`` YAML files, then ``-p NAME VALUE`` pairs (later wins), parsed as YAML 1.2 data."""
    import yaml

    from workbench.run.notebooks import load_yaml, yaml_problem

    params: dict = {}
    for f in files or []:
        path = Path(f)
        if not path.is_file():
            raise ParameterError(f"-f: {f!r} is not a parameter file ({'a directory' if path.is_dir() else 'missing'})")
        from workbench.checks import check_file_size

        check_file_size("-f", path)
        try:
            data = load_yaml(path.read_text(encoding="utf-8"), "-f")
        except UnicodeDecodeError:
            raise ParameterError(f"-f: {f!r} is not UTF-8 text") from None
        except yaml.YAMLError as exc:
            raise ParameterError(f"-f: {f!r} is not valid YAML: {yaml_problem(exc)}") from exc
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise ParameterError(f"-f: {f!r} must hold a mapping of parameter names to values")
        params.update(data)
    for name, value in pairs or []:
        try:
            params[name] = load_yaml(value, name)
        except yaml.YAMLError as exc:  # the value is never echoed: it may hold a secret
            mark = getattr(exc, "problem_mark", None)
            where = f" at column {mark.column + 1}" if mark is not None else ""
            raise ParameterError(f"{name}: its value is not valid YAML ({getattr(exc, 'problem', None) or 'unparsable'}"
                                 f"{where})") from None
    return params


def _build_report(run_dir, figures=None) -> Path:
    """The finished run's report (:func:`workbench.share.report.build_report`; ``figures``: its static formats, None
    the default), handed to the suite runner."""
    from workbench.share import report

    return report.build_report(run_dir, figures=figures)


def cmd_run(args) -> int:
    from workbench.run import notebooks

    if args.rerun_invalid:
        figures = _figures(args.figures)
        return suite_runner.run_entries(suite_runner.rerun_invalid_entries(args.rerun_invalid), args.rerun_invalid,
                                        args.label, report=lambda run_dir: _build_report(run_dir, figures))
    suite = notebooks.load_suite(args.suite)
    from workbench.share.cost import check_price

    price = check_price(args.price_per_hour if getattr(args, "price_per_hour", None) is not None
                        else suite.get("price_per_hour"))
    figures = _figures(args.figures if args.figures is not None else suite.get("figures"))
    if getattr(args, "dry_run", False):
        return _print_plan(suite["notebooks"], suite=Path(suite["path"]).stem)
    if getattr(args, "ray", None):  # connect, check the suite fits the cluster; kernels inherit $WORKBENCH_RAY
        from workbench.run.distributed import prepare

        prepare(args.ray, suite["notebooks"])
    return suite_runner.run_entries(suite["notebooks"], args.resume, args.label, suite=suite["path"],
                                    price_per_hour=price, allow_changed=args.allow_changed,
                                    report=lambda run_dir: _build_report(run_dir, figures),
                                    budget_s=suite.get("budget_s"), reference_reuse_s=suite.get("reference_reuse_s"))


def _figures(value) -> str | None:
    """The report's static figure formats from ``--figures`` or a suite's ``figures:`` (a string or a list; None:
    the default), refused before anything runs when a format is unknown."""
    if value is None:
        return None
    from workbench.share.static_figures import parse_formats

    parse_formats(value)
    return value if isinstance(value, str) else ",".join(map(str, value)) or "none"


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
    figures = _figures(args.figures)
    return suite_runner.run_entries([{"notebook": str(nb.resolve()), "parameters": params}], args.resume, args.label,
                                    allow_changed=args.allow_changed,
                                    report=lambda run_dir: _build_report(run_dir, figures))


def cmd_report(args) -> int:
    from workbench.share import comparability, cross_tool, formats, report

    seen: dict[Path, str] = {}
    for a in args.runs:   # checked before any import writes a folder
        key = Path(a).resolve()
        if key in seen and Path(a).is_dir():
            raise ParameterError(f"RUN_DIR: {a!r} is given twice (as {seen[key]!r}); compare different runs")
        seen[key] = str(a)
    runs, imported = formats.resolve_inputs(args.runs)   # result files of other tools become runs of their own
    for line in imported:
        print(line, flush=True)
    if len(runs) > 1:
        for line in comparability.comparability(runs)[0]:   # printed before any comparison
            print(line, flush=True)
        for line in cross_tool.cross_tool_lines(cross_tool.cross_tool(runs)):
            print(line, flush=True)
    print(report.build_report(runs, args.output, figures=args.figures, price_per_hour=args.price_per_hour))
    return 0


def cmd_export(args) -> int:
    from workbench.share import export

    for line in export.export_run(args.run, args.to, tracking_uri=args.tracking_uri, out=args.output):
        print(line, flush=True)
    return 0


def cmd_env(args) -> int:
    import torch

    from workbench import paths
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
        "model_cache": str(paths.cache_root()),
    }
    for key, fn in (("default_gguf", models.default_gguf_path), ("default_embedder", models.default_embedder_path)):
        try:
            info[key] = str(fn())
        except ParameterError as exc:
            info[key] = f"missing: {exc}"
    cached = sorted((paths.cache_root() / "models").glob("*"))
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


def _print_plan(entries: list[dict], probe: bool = True, calibrate: bool = False, suite: str = "") -> int:
    """``workbench plan`` / ``--dry-run``: the points, their predicted cost and the estimated wall time
    (:mod:`workbench.predict.roofline`); nothing is measured and no weights load unless ``calibrate``."""
    from workbench.measure import models
    from workbench.predict import predictions, roofline_calibration
    from workbench.run import notebooks

    first = notebooks.validate_parameters(entries[0]["notebook"], entries[0]["parameters"]) if entries else {}
    spec, dev = first.get("model", "default"), models.pick_device(first.get("device", "auto"))
    dtype = first.get("dtype", "auto")
    if calibrate:
        loaded = models.load_model(spec, dev, dtype)
        device, calib = roofline_calibration.calibrate(loaded)
        print(f"calibrated in {calib.calibration_s:.1f} s: {calib}", flush=True)
    predictor = roofline_calibration.Predictor.for_model(spec, dev, dtype, probe=probe)
    plan = predictions.plan_entries(entries, predictor)
    print(predictions.format_plan(plan, predictor.calib.calibrated))
    lines = predictions.design_lines(entries, plan, suite)
    if lines:
        print("\ncomparisons (interleaved rounds; the smallest effect each can decide at its last look):")
        print("\n".join(f"  {line}" for line in lines))
    return 0


def cmd_plan(args) -> int:
    from workbench.run import notebooks

    suite = notebooks.load_suite(args.suite)
    return _print_plan(suite["notebooks"], probe=not args.no_probe, calibrate=args.calibrate,
                       suite=Path(suite["path"]).stem)


def cmd_simulate(args) -> int:
    """``workbench simulate``: :func:`workbench.predict.twin_study.command`, given notebooks 08 and 11's Config
    defaults (used where ``--run`` recorded no config of its own) and notebook 08's Config for ``--confirm``."""
    from workbench.checks import config_defaults
    from workbench.experiments import scheduling, serving_load
    from workbench.predict import twin_study

    return twin_study.command(args, config_defaults(serving_load.Config), config_defaults(scheduling.Config),
                              serving_load.Config)


def cmd_serve(args) -> int:
    from workbench.serving.server import main as serve_main

    serve_main(args.rest, prog="workbench serve")
    return 0


def _figures_flag(parser) -> None:
    parser.add_argument("--figures", default=None, metavar="png,svg,pdf",
                        help="static figure formats of the run's report (default png,svg when a renderer is present, "
                             "or the suite's figures:; none to skip)")


def _allow_plain_http_key(p) -> None:
    p.add_argument("--allow-plain-http-key", action="store_true",
                   help="let an endpoint's API key go over plain http:// to a remote host (a suite cannot allow it)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\n")[0].replace("``", ""),
                                epilog="Each command's own options: workbench COMMAND --help. The two commands of a "
                                       "fresh machine: make run (the default suite) and make test.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run a suite of notebooks (default: the default suite) into one run folder")
    r.add_argument("suite", nargs="?", default="default", help="suite name in suites/ (default, quick) or a YAML path")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run, skipping finished points")
    r.add_argument("--label", default="", help="suffix of the new run id (letters, digits, _.-)")
    _figures_flag(r)
    r.add_argument("--allow-changed", action="store_true",
                   help="with --resume: accept settings that differ from the run's (model, device, dtype, packages, "
                        "notebook configs); the changed points are measured again under new ids")
    r.add_argument("--rerun-invalid", metavar="RUN_DIR",
                   help="re-measure only the points of RUN_DIR marked invalid (other load, drift) and the comparisons "
                        "whose A/A control moved, in place")
    r.add_argument("--dry-run", action="store_true", help="print the points and predicted cost; measure nothing")
    r.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                   help="price of one device-hour in USD (else the suite's price_per_hour): $/Mtok in the report")
    r.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                   help="measure the points on Ray workers: a running cluster (auto: found, else started here) "
                        "or a head node's HOST:PORT; needs the [ray] extra")
    _allow_plain_http_key(r)
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("sweep", help="run one notebook over a parameter grid")
    s.add_argument("notebook", help="notebook path or name in notebooks/")
    s.add_argument("-f", "--file", action="append", metavar="GRID.yaml", help="YAML file of parameters")
    s.add_argument("-p", "--param", action="append", nargs=2, metavar=("NAME", "VALUE"),
                   help="one parameter (-p NAME VALUE or -p NAME=VALUE); VALUE is parsed as YAML (lists, numbers, "
                        "booleans)")
    s.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run, skipping finished points")
    s.add_argument("--label", default="", help="suffix of the new run id")
    s.add_argument("--allow-changed", action="store_true",
                   help="with --resume: accept settings that differ from the run's (model, device, dtype, packages, "
                        "notebook configs); the changed points are measured again under new ids")
    s.add_argument("--dry-run", action="store_true", help="print the points and predicted cost; measure nothing")
    _figures_flag(s)
    s.add_argument("--ray", nargs="?", const="auto", metavar="auto|ADDRESS",
                   help="measure the points on Ray workers (see workbench run --help)")
    _allow_plain_http_key(s)
    s.set_defaults(func=cmd_sweep)

    pl = sub.add_parser("plan", help="the suite's points, predicted cost per point and estimated wall time")
    pl.add_argument("suite", nargs="?", default="default", help="suite name in suites/ or a YAML path")
    pl.add_argument("--calibrate", action="store_true",
                    help="first fit this machine's overheads on the model (once; cached for later plans)")
    pl.add_argument("--no-probe", action="store_true", help="nominal device peaks instead of a probe")
    pl.set_defaults(func=cmd_plan)

    rep = sub.add_parser("report", help="(re)build the HTML report of one run, or a comparison of several")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument("-o", "--output", help="output HTML file")
    rep.add_argument("--figures", default=None, metavar="png,svg,pdf",
                     help="static figure formats written beside the HTML ones for a one-run report "
                          "(default png,svg when a renderer is present; none to skip)")
    rep.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                     help="price of one device-hour in USD: adds $/Mtok (input and output) to the points")
    rep.set_defaults(func=cmd_report)

    ex = sub.add_parser("export", help="export a run to MLflow, llm-d's Benchmark Report v0.2 or vLLM bench JSON")
    ex.add_argument("run", metavar="RUN_DIR")
    ex.add_argument("--to", required=True, metavar="mlflow|br0.2|vllm-json", help="target format")
    ex.add_argument("--tracking-uri", default=None, metavar="URI",
                    help="MLflow tracking URI or folder (default: a local store in <results>/mlflow)")
    ex.add_argument("-o", "--output", default=None, metavar="DIR",
                    help="folder for br0.2 / vllm-json files (default: <run>/exports/<format>)")
    ex.set_defaults(func=cmd_export)

    e = sub.add_parser("env", help="print device, dtype support, measured bandwidth and models found")
    e.add_argument("--model", help="also resolve this model spec")
    e.add_argument("--no-probe", action="store_true", help="skip the bandwidth / FLOP/s probe")
    e.set_defaults(func=cmd_env)

    sim = sub.add_parser("simulate", help="the serving twin: notebooks 08/11's points, capacity per SLO and what-ifs "
                         "simulated (source=simulated), or --validate RUN_DIR against its measured points")
    from workbench.cli.simulate_args import add_arguments

    add_arguments(sim)
    sim.set_defaults(func=cmd_simulate)

    sv = sub.add_parser("serve", add_help=False, help="the OpenAI-compatible server (workbench serve --help)")
    sv.set_defaults(func=cmd_serve)
    return p


def _split_param_pairs(argv: list[str]) -> list[str]:
    """``-p NAME=VALUE`` (and ``--param NAME=VALUE``) as ``-p NAME VALUE``: the spelling other tools' command lines
    use; argparse's two-argument option took the pair for one argument and printed its usage. Split only where the
    text before the first ``=`` is a parameter name (an identifier), so ``-p NAME VALUE`` with an ``=`` inside its
    VALUE is left as it is."""
    out, after_p = [], False
    for token in argv:
        name, eq, value = token.partition("=")
        if after_p and eq and name.isidentifier():
            out += [name, value]
        else:
            out.append(token)
        after_p = token in ("-p", "--param")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _split_param_pairs(sys.argv[1:] if argv is None else list(argv))
    args, rest = build_parser().parse_known_args(argv)
    if args.command != "serve" and rest:
        build_parser().parse_args(argv)  # the usual error for unknown arguments
    args.rest = rest
    from workbench.run import results

    results.results_root()  # resolved once here; kernels inherit the absolute $WORKBENCH_RESULTS
    if getattr(args, "allow_plain_http_key", False):  # the user's own lift, typed here; kernels inherit it
        import os

        from workbench.load.endpoint import ALLOW_PLAIN_HTTP_ENV

        os.environ[ALLOW_PLAIN_HTTP_ENV] = "1"
    try:
        return args.func(args)
    except ParameterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except results.RunWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # before a run folder opened, or after it closed: nothing to mark
        term = isinstance(exc, suite_runner.Terminated)
        print("\nterminated" if term else "\ninterrupted", file=sys.stderr)
        return 143 if term else 130

