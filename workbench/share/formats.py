"""Other tools' results read in as runs of their own.

``workbench report A B ...`` takes, besides run folders, the files (and folders) other tools write, read by
:mod:`workbench.share.importers` and :mod:`workbench.share.importers_other` at every version whose format
changed: GuideLLM report v1 / v2, AIPerf from the 0.1.x ``records`` format through schema 1.4 (its per-request
``profile_export.jsonl`` beside it, or alone), ``vllm bench serve`` results (``--save-detailed`` lists) and
``vllm bench sweep`` trees, inference-perf's lifecycle reports, Benchmark Report v0.2 / v0.2.1 (the workbench's
own export round-trips), genai-bench and LLMPerf results.

:func:`detect` names the format from the content (never the file name; a file that is none of these is refused
in one line naming what each format needs). :func:`read_file` reads under a size cap (:data:`MAX_FILE_BYTES`)
and a nesting cap (:data:`MAX_DEPTH`), checks and coerces every value and builds every table before anything
is written; :func:`import_file` then writes a run folder (``results/<id>-import-<tool>``) whose manifest
records ``imported: {tool, version, schema, file}`` and the provenance that decides comparability: how tokens
were counted, ``ignore_eos``, the arrival pattern, warm-up exclusion, the percentile definition and what
"ITL" / "TPOT" mean there. A result with no completed request imports as a failed point (its error count and
reason, no latency). :func:`resolve_inputs` turns ``workbench report``'s arguments into run folders.

What is done with the runs once read: :mod:`workbench.share.comparability` compares their provenance (the lines
printed before any comparison, the metrics left out) and :mod:`workbench.share.cross_tool` decides, where both
runs hold per-request values, the ratios of their medians and geometric means with intervals.

Definitions mapped (checked against each tool's source):

- GuideLLM ``inter_token_latency_ms`` = (last token - first token) / (output tokens - 1) per request: the
  workbench's ``tpot_s``. Its ``time_per_output_token_ms`` includes the first token (latency / output tokens):
  not the workbench's TPOT, left out. Its percentiles come from a weighted histogram (the value where the
  cumulative share first reaches q), not linear interpolation.
- AIPerf ``inter_token_latency`` = (request latency - TTFT) / (output tokens - 1) per request: ``tpot_s``.
- vLLM ``tpot`` = the same per-request figure; vLLM ``itl`` = gaps between streamed chunks (a chunk may hold
  several tokens): not the workbench's ``itl_s`` (gaps between token ids), left out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import importers, importers_other
from workbench.share.imported import Imported, Malformed

KINDS = ("guidellm", "aiperf", "aiperf-jsonl", "vllm-json", "vllm-sweep", "inference-perf", "benchmark-report",
         "genai-bench", "llmperf")

#: Largest foreign file read (bytes; the bound on every input file, :data:`workbench.checks.MAX_INPUT_BYTES`): a
#: result file of these tools is kilobytes to a few megabytes; a larger one is refused before it is read.
MAX_FILE_BYTES = checks.MAX_INPUT_BYTES
#: Deepest nesting of objects and lists accepted in a foreign file (the tools' files nest fewer than 12 levels);
#: deeper is refused in one line, never a RecursionError.
MAX_DEPTH = 64
#: Most result files read from one folder (a vLLM sweep tree).
MAX_FILES = 2000


def _check_depth(data, path) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` (iterative: a deep file cannot overflow the stack)."""
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ParameterError(f"RUN_DIR: {path} nests objects and lists deeper than {MAX_DEPTH} levels "
                                 "(no result file of these tools does); refusing to read it")
        if isinstance(obj, dict):
            stack.extend((v, depth + 1) for v in obj.values() if isinstance(v, (dict, list)))
        elif isinstance(obj, list):
            stack.extend((v, depth + 1) for v in obj if isinstance(v, (dict, list)))


def _read_text(path) -> str:
    p = Path(path)
    if not p.is_file():
        raise ParameterError(f"RUN_DIR: {str(p)!r} is neither a run folder nor a result file")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ParameterError(f"RUN_DIR: {p} is {size / 2**20:.1f} MiB, over the {MAX_FILE_BYTES / 2**20:g} MiB cap on "
                             "a foreign result file; refusing to read it")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ParameterError(f"RUN_DIR: {p} is not a run folder, and not text ({exc.reason})") from None


def _parse(text: str, path, allow_lines: bool = True, allow_yaml: bool = True):
    """JSON, else JSON Lines (one object per line), else YAML (a Benchmark Report) from ``text``, depth-checked.

    Returns:
        ``(data, form)`` with form ``json`` / ``jsonl`` / ``yaml``.

    Raises:
        ParameterError: none of these, or nested deeper than :data:`MAX_DEPTH`.
    """
    try:
        data = json.loads(text)
        form = "json"
    except RecursionError:
        raise ParameterError(f"RUN_DIR: {path} nests objects and lists deeper than {MAX_DEPTH} levels "
                             "(no result file of these tools does); refusing to read it") from None
    except json.JSONDecodeError as exc:
        first = str(exc).splitlines()[0]
        lines = [ln for ln in text.splitlines() if ln.strip()]
        data, form = None, ""
        if allow_lines and lines and lines[0].lstrip().startswith("{"):
            try:
                data, form = [json.loads(ln) for ln in lines], "jsonl"
            except RecursionError:
                raise ParameterError(f"RUN_DIR: {path} nests objects and lists deeper than {MAX_DEPTH} levels "
                                     "(no result file of these tools does); refusing to read it") from None
            except json.JSONDecodeError:
                data = None
        if data is None and allow_yaml and re.match(r"^\s*(#.*\n\s*)*[A-Za-z_]+:", text):
            import yaml

            try:
                data, form = yaml.safe_load(text), "yaml"
                checks.check_expanded_size(f"RUN_DIR: {path}", data)   # a YAML alias bomb, refused in one line
            except RecursionError:
                raise ParameterError(f"RUN_DIR: {path} nests deeper than {MAX_DEPTH} levels; refusing to read it") \
                    from None
            except yaml.YAMLError:
                data = None
            if not isinstance(data, dict):
                data = None
        if data is None:
            raise ParameterError(f"RUN_DIR: {path} is not a run folder, and not JSON ({first})") from None
    _check_depth(data, path)
    return data, form


def _read_json(path):
    """A foreign file parsed (:func:`_parse`), after the size cap (:data:`MAX_FILE_BYTES`)."""
    return _parse(_read_text(path), path)


def detect(data, path="file") -> str:
    """The format of a parsed result file, from its content (never its name).

    Returns:
        One of :data:`KINDS`.

    Raises:
        ParameterError: none of them, in one line naming what each format needs that the file lacks.
    """
    if isinstance(data, list):
        if data and all(isinstance(x, dict) and "metadata" in x and ("metrics" in x or "error" in x) for x in data):
            return "aiperf-jsonl"
        raise ParameterError(f"RUN_DIR: {path} is a list, not a result summary: none of {', '.join(KINDS)} "
                             "(an AIPerf profile_export.jsonl needs metadata and metrics on every line; read a "
                             "per-request list beside its summary instead)")
    if not isinstance(data, dict):
        raise ParameterError(f"RUN_DIR: {path} is JSON but not a result of {', '.join(KINDS)} (not an object)")
    benches = data.get("benchmarks")
    if isinstance(benches, list) and benches and all(isinstance(b, dict) and "metrics" in b for b in benches):
        return "guidellm"
    if isinstance(data.get("records"), dict) and any(
            isinstance(v, dict) and "tag" in v and "unit" in v for v in data["records"].values()):
        return "aiperf"
    if "schema_version" in data or "aiperf_version" in data or "input_config" in data:
        if any(isinstance(data.get(k), dict) and "unit" in data[k] for k in _AIPERF_ANY):
            return "aiperf"
    if {"completed", "duration"} <= set(data) and any(k in data for k in ("median_ttft_ms", "mean_ttft_ms",
                                                                          "request_throughput")):
        return "vllm-json"
    if {"load_summary", "successes", "failures"} <= set(data):
        return "inference-perf"
    if str(data.get("version")) in ("0.2", "0.2.1") and isinstance(data.get("results"), dict):
        return "benchmark-report"
    if isinstance(data.get("aggregated_metrics"), dict):
        return "genai-bench"
    if "results_num_completed_requests" in data or (data.get("version") == "2023-08-31" and any(
            str(k).startswith("results_") for k in data)):
        return "llmperf"
    missing = ("GuideLLM needs benchmarks[].metrics; AIPerf a schema_version, aiperf_version or records with "
               "request_latency / request_throughput / time_to_first_token; vllm bench serve completed, duration "
               "and median_ttft_ms; inference-perf load_summary, successes and failures; a Benchmark Report "
               "version 0.2 or 0.2.1 with results; genai-bench aggregated_metrics; LLMPerf results_* fields")
    raise ParameterError(f"RUN_DIR: {path} is not a GuideLLM benchmarks.json, an AIPerf profile_export_aiperf.json "
                         f"or a vllm bench serve result, nor any other format known (none of their fields found: "
                         f"{missing})")


#: AIPerf metrics any export of a run that sent requests carries (TTFT only when it streamed).
_AIPERF_ANY = ("request_latency", "request_throughput", "request_count", "time_to_first_token",
               "error_request_count", "output_token_throughput")


def _beside(path: Path, pattern: str, kind: str):
    """The per-request file a tool writes beside its summary (``pattern`` a glob in the same folder), parsed and
    checked like the summary, or None."""
    found = sorted(Path(path).parent.glob(pattern))
    found = [f for f in found if f.resolve() != Path(path).resolve()]
    if not found:
        return None
    data, _ = _read_json(found[0])
    if not isinstance(data, list):
        raise ParameterError(f"RUN_DIR: {found[0]} (the {kind} per-request file beside {Path(path).name}) is not a "
                             "list of requests")
    return data


def _read_one(p: Path) -> Imported:
    data, form = _read_json(p)
    kind = detect(data, p)
    if kind == "aiperf-jsonl":
        return importers.aiperf_requests_only(data, p)
    if kind == "aiperf":
        lines = None
        jsonl = p.parent / "profile_export.jsonl"
        if jsonl.is_file():
            lines, _ = _parse(_read_text(jsonl), jsonl, allow_yaml=False)
            lines = lines if isinstance(lines, list) else [lines]
        return importers.aiperf(data, p, lines)
    if kind == "inference-perf":
        return importers_other.inference_perf(data, p, _beside(p, "per_request_lifecycle_metrics.json", "inference-perf"))
    if kind == "llmperf":
        stem = p.name[:-len("_summary.json")] if p.name.endswith("_summary.json") else None
        return importers_other.llmperf(data, p, _beside(p, f"{stem}_individual_responses.json", "LLMPerf") if stem else None)
    if kind == "genai-bench":
        meta = p.parent / "experiment_metadata.json"
        return importers_other.genai_bench(data, p, _read_json(meta)[0] if meta.is_file() else None)
    return _READERS[kind](data, p)


_READERS = {"guidellm": importers.guidellm, "vllm-json": importers.vllm,
            "benchmark-report": importers_other.benchmark_report}


def _read_sweep(folder: Path) -> Imported:
    """A ``vllm bench sweep serve`` output folder: every ``run=N.json`` under it (capped at :data:`MAX_FILES`)."""
    runs = sorted(folder.rglob("run=*.json"))
    runs = [r for r in runs if importers.SWEEP_RUN.match(r.name)]
    if len(runs) > MAX_FILES:
        raise ParameterError(f"RUN_DIR: {folder} holds {len(runs)} run files, over the cap of {MAX_FILES}")
    parsed = []
    for r in runs:
        data, _ = _read_json(r)
        if detect(data, r) != "vllm-json":
            raise ParameterError(f"RUN_DIR: {r} sits in a vllm bench sweep tree but is not a vllm bench serve result")
        parsed.append((r, data))
    return importers.vllm_sweep(parsed, folder)


def is_foreign_folder(p: Path) -> bool:
    """A folder that is not a run folder but a tool's output tree (a ``vllm bench sweep`` tree)."""
    return p.is_dir() and not (p / "manifest.json").exists() and any(
        importers.SWEEP_RUN.match(f.name) for f in p.rglob("run=*.json"))


def read_file(path) -> Imported:
    """Read one foreign result file or tool output folder (format from the content, :func:`detect`), check and
    coerce every value, and build its tables, writing nothing.

    Raises:
        ParameterError: over the size or depth cap, not JSON / YAML, none of :data:`KINDS`, a field of the wrong
            type (named), or a benchmark without any figure that did not fail.
    """
    p = Path(path)
    kind = "vllm-sweep" if is_foreign_folder(p) else None
    try:
        imp = _read_sweep(p) if kind else _read_one(p)
    except ParameterError:
        raise
    except Malformed as exc:
        raise ParameterError(f"RUN_DIR: {p} looks like {kind or _kind_of(p)} output but {exc}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ParameterError(f"RUN_DIR: {p} looks like {kind or _kind_of(p)} output but a field is malformed "
                             f"({type(exc).__name__}: {str(exc)[:200]})") from None
    ok = imp.points[imp.points["status"] == "ok"] if len(imp.points) else imp.points
    if imp.points.empty or (len(ok) and ok.reindex(columns=["ttft_s_p50", "e2e_s_p50", "output_throughput_tps"])
                            .isna().all().all()):
        raise ParameterError(f"RUN_DIR: {p} looks like {imp.tool} output but holds no TTFT, latency or throughput "
                             "figure")
    imp.points, imp.requests = _tables(imp)
    return imp


def _kind_of(p: Path) -> str:
    try:
        return detect(_read_json(p)[0], p)
    except ParameterError:
        return "a known tool's"


def _tables(imp: Imported) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The points and requests as they will be written, converted to Arrow here so that a value Parquet cannot hold
    is refused before any folder exists.

    Raises:
        ParameterError: a column Arrow cannot type (mixed kinds of value), naming it.
    """
    import pyarrow as pa

    out = []
    for name, df in (("points", imp.points), ("requests", imp.requests)):
        for col in df.columns:
            try:
                pa.Table.from_pandas(df[[col]], preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise ParameterError(f"RUN_DIR: {imp.path}: the {name} column {col!r} mixes kinds of value "
                                     f"({str(exc).splitlines()[0][:160]})") from None
        out.append(df)
    return out[0], out[1]


def import_file(path, imported: Imported | None = None) -> Path:
    """Write a foreign result as a run folder of its own (``<results>/<id>-import-<tool>``).

    Everything is read, checked and built first (:func:`read_file`); the folder is created only then, and a
    failure while writing removes it.

    Returns:
        The run folder (``manifest.json`` with ``imported: {tool, version, schema, file}`` and the provenance,
        ``points.parquet``, ``requests.parquet``).
    """
    import shutil

    imp = imported or read_file(path)
    pts = imp.points.copy()
    if "valid" in pts and pts["valid"].isna().all():
        pts = pts.drop(columns="valid")           # the tool does not judge validity: no verdict, not "valid"
    elif "valid" in pts:
        pts["invalid_reason"] = pts.get("invalid_reason", pd.Series("", index=pts.index)).fillna("")
    req = imp.requests.copy()
    if req.empty:
        req = pd.DataFrame(columns=["point_id", "request_id"])
    exp = str(pts["experiment"].iloc[0])
    label = "import-" + imp.tool.replace("-json", "").replace(" ", "")
    run = results.create_run(label[:40])
    try:
        pts["run_id"] = run.name
        req["run_id"] = run.name
        req["experiment"] = exp
        results.write_table(run / "points.parquet", pts)
        results.write_table(run / "requests.parquet", req)
        source = str(Path(imp.path).resolve())
        results.update_manifest(run, status="ok",
                                imported={**imp.provenance, "format": imp.tool, "version": imp.version,
                                          "schema": imp.schema, "file": source, "source_file": source,
                                          "left_out": imp.left_out},
                                environment={"tool": imp.provenance["tool"], "tool_version": imp.version,
                                             "source_file": source},
                                experiments={exp: {"config": {"source_file": str(imp.path)},
                                                   "points": list(pts["point_id"].astype(str))}})
    except BaseException:
        shutil.rmtree(run, ignore_errors=True)
        raise
    return run


def resolve_inputs(paths: list[str]) -> tuple[list[Path], list[str]]:
    """``workbench report`` arguments -> run folders: run folders as they are, result files imported as runs of
    their own. Every file is read and checked before any run folder is written (nothing half-written).

    Returns:
        ``(run folders, lines saying what was imported)``.

    Raises:
        ParameterError: a path that is neither a run folder nor a readable result file.
    """
    parsed: list[tuple[Path, Imported | None]] = []
    for a in paths:
        p = Path(a)
        if p.is_dir() and not is_foreign_folder(p):
            if not (p / "manifest.json").is_file():
                raise ParameterError(f"RUN_DIR: {str(p)!r} is not a run folder (no manifest.json) nor a vllm bench "
                                     "sweep tree (no run=N.json under it)")
            try:
                results.read_manifest(p)
            except ParameterError as exc:
                raise ParameterError(f"RUN_DIR: {exc}".replace("RUN_DIR: run_dir: ", "RUN_DIR: ")) from None
            parsed.append((p, None))
        else:
            parsed.append((p, read_file(p)))
    out, lines = [], []
    for p, imp in parsed:
        if imp is None:
            out.append(p)
        else:
            run = import_file(p, imp)
            lines.append(f"imported {p} ({imp.tool}, {len(imp.points)} benchmark(s)) as {run}")
            out.append(run)
    return out, lines
