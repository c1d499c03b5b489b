"""Other tools' results as runs of their own, the comparability check printed before any comparison, and
cross-tool decisions on per-request data.

``workbench report A B ...`` takes, besides run folders, the files (and folders) other tools write, read by
:mod:`workbench.share.importers` at every version whose format changed: GuideLLM report v1 / v2, AIPerf from the
0.1.x ``records`` format through schema 1.4 (its per-request ``profile_export.jsonl`` beside it, or alone),
``vllm bench serve`` results (``--save-detailed`` lists) and ``vllm bench sweep`` trees, inference-perf's
lifecycle reports, Benchmark Report v0.2 / v0.2.1 (the workbench's own export round-trips), genai-bench and
LLMPerf results.

:func:`detect` names the format from the content (never the file name; a file that is none of these is refused
in one line naming what each format needs). :func:`read_file` reads under a size cap (:data:`MAX_FILE_BYTES`)
and a nesting cap (:data:`MAX_DEPTH`), checks and coerces every value and builds every table before anything
is written; :func:`import_file` then writes a run folder (``results/<id>-import-<tool>``) whose manifest
records ``imported: {tool, version, schema, file}`` and the provenance that decides comparability: how tokens
were counted, ``ignore_eos``, the arrival pattern, warm-up exclusion, the percentile definition and what
"ITL" / "TPOT" mean there. A result with no completed request imports as a failed point (its error count and
reason, no latency). :func:`comparability` compares that provenance across runs (as inference-perf's
``docs/comparability.md`` lists: token provenance, ignore_eos, warm-up, arrival pattern) and returns the lines
to print and the metrics left out, each with its reason. :func:`cross_tool` decides, where both runs hold
per-request values, the ratio of TTFT (and e2e) medians with a bootstrap interval and the ratio of geometric
means with Welch's interval on the log scale, beside the comparability verdict.

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
from typing import TYPE_CHECKING

import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import importers

if TYPE_CHECKING:
    import numpy as np

#: The metrics of a comparison's delta table (the report's and an imported run's).
DELTA_METRICS = ["ttft_s_p50", "ttft_s_p99", "output_throughput_tps", "goodput_rps"]

KINDS = ("guidellm", "aiperf", "aiperf-jsonl", "vllm-json", "vllm-sweep", "inference-perf", "benchmark-report",
         "genai-bench", "llmperf")
#: Metrics the comparison shows (those not left out by :func:`comparability`).
COMPARED = ["ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "itl_s_p50", "output_throughput_tps",
            "request_throughput_rps", "goodput_rps"]
LINEAR = "linear interpolation between order statistics (numpy.percentile)"
WORKBENCH_PROVENANCE = {
    "tool": "workbench",
    "token_counts": "engine-side generated token ids (the model's own ids, EOS counted)",
    "warmup": "excluded (untimed warm-up runs before each measured shape)",
    "percentiles": LINEAR + "; p90 / p99 only from 10 / 100 samples",
    "itl": "gaps between generated token ids",
    "tpot": "(e2e - ttft) / (output tokens - 1) per request",
    "ttft_from": "handed to the workbench (before templating and tokenisation)",
}


#: ``source`` of the serving twin's points (:data:`workbench.predict.twin.SOURCE`; not imported: formats reads runs)
SIMULATED = "simulated"
#: A simulated run's provenance (``workbench simulate --out``): the twin's virtual clock, no model, no tokenizer
SIMULATED_PROVENANCE = {
    "tool": "workbench twin (simulated: a prediction, not a measurement)",
    "token_counts": "simulated: each request's stated prompt and output tokens (no tokenizer, no EOS)",
    "ignore_eos": True,   # every simulated request runs to its stated output length, as with ignore_eos
    "warmup": "none: a cost model on a virtual clock has nothing to warm up",
    "itl": "simulated: one gap per decode step of the twin's cost model (no token ids)",
    "ttft_from": "the scheduled arrival, on the twin's virtual clock",
}


Imported = importers.Imported

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
        return importers.inference_perf(data, p, _beside(p, "per_request_lifecycle_metrics.json", "inference-perf"))
    if kind == "llmperf":
        stem = p.name[:-len("_summary.json")] if p.name.endswith("_summary.json") else None
        return importers.llmperf(data, p, _beside(p, f"{stem}_individual_responses.json", "LLMPerf") if stem else None)
    if kind == "genai-bench":
        meta = p.parent / "experiment_metadata.json"
        return importers.genai_bench(data, p, _read_json(meta)[0] if meta.is_file() else None)
    return _READERS[kind](data, p)


_READERS = {"guidellm": importers.guidellm, "vllm-json": importers.vllm, "benchmark-report": importers.benchmark_report}


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
    except importers.Malformed as exc:
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


# ------------------------------------------------------------------------------------------ comparability


def provenance(run_dir) -> dict:
    """What decides comparability for a run: the ``imported`` record of an imported run, else the workbench's
    own definitions with the run's ``ignore_eos`` and arrival pattern from its points."""
    manifest = results.read_manifest(run_dir)
    if manifest.get("imported"):
        return dict(manifest["imported"])
    pts = results.read_points(run_dir)
    prov = dict(WORKBENCH_PROVENANCE)
    if "source" in pts and pts["source"].astype(str).eq(SIMULATED).any():
        # the serving twin's points (workbench simulate --out): nothing was generated or measured
        if pts["source"].astype(str).eq(SIMULATED).all():
            return dict(prov, **SIMULATED_PROVENANCE, arrival=", ".join(sorted(set(pts.get(
                "profile", pd.Series(["simulated"])).dropna().astype(str)))))
        prov.update({k: f"mixed: measured and simulated points (the simulated: {v})"
                     for k, v in SIMULATED_PROVENANCE.items()})
    if "ignore_eos" in pts and pts["ignore_eos"].notna().any():
        vals = set(pts["ignore_eos"].dropna().astype(bool))
        prov["ignore_eos"] = vals.pop() if len(vals) == 1 else "mixed"
    else:
        prov["ignore_eos"] = None
    if "arrival" in pts and pts["arrival"].notna().any():
        prov["arrival"] = ", ".join(sorted(set(pts["arrival"].dropna().astype(str))))
    elif "profile" in pts and pts["profile"].notna().any():
        prov["arrival"] = ", ".join(sorted(set(pts["profile"].dropna().astype(str))))
    else:
        prov["arrival"] = "closed batches (all requests of a point submitted together)"
    return prov


def comparability(runs: list[Path]) -> tuple[list[str], dict[str, str]]:
    """The comparability check of several runs (workbench or imported).

    Returns:
        ``(lines, left_out)``: the lines to print before any comparison (one per aspect, each run's value, and
        whether they match), and ``{metric: reason}`` for the metrics of :data:`COMPARED` that cannot be compared
        across these runs.
    """
    provs = [provenance(r) for r in runs]
    names = [f"{chr(65 + i) if i < 26 else i} ({p.get('tool')})" for i, p in enumerate(provs)]
    lines = ["comparability check (inference-perf docs/comparability.md: token provenance, ignore_eos, warm-up, "
             "arrival pattern; and the percentile and ITL/TPOT definitions):"]
    same = {}
    for key, title in (("token_counts", "token counts"), ("ignore_eos", "ignore_eos"), ("arrival", "arrival pattern"),
                       ("warmup", "warm-up"), ("percentiles", "percentiles"), ("itl", "ITL"), ("tpot", "TPOT"),
                       ("ttft_from", "TTFT counted from")):
        vals = [p.get(key) for p in provs]
        same[key] = len({json.dumps(v, default=str) for v in vals}) == 1 and vals[0] is not None
        mark = "same" if same[key] else ("UNKNOWN in some" if any(v is None for v in vals) else "DIFFERENT")
        lines.append(f"  {title}: {mark}: " + "; ".join(f"{n}: {v if v is not None else 'not recorded'}"
                                                         for n, v in zip(names, vals)))
    left: dict[str, str] = {}
    if not same["ignore_eos"]:
        why = "ignore_eos differs or is not recorded: output lengths may differ, so throughput is not comparable"
        left["output_throughput_tps"] = why
        left["request_throughput_rps"] = why
    if not same["arrival"]:
        why = "different arrival patterns load the server differently"
        left.setdefault("output_throughput_tps", why)
        left.setdefault("request_throughput_rps", why)
    if not same["percentiles"]:
        left["ttft_s_p99"] = "percentile definitions differ (tails move most between estimators)"
    if not same["itl"]:
        left["itl_s_p50"] = "ITL means different gaps in these runs (token ids, chunks, or not exported)"
    if any(not str(p.get("tool")).startswith("workbench") for p in provs):   # the twin scores the workbench's SLOs
        left["goodput_rps"] = "the SLO behind goodput is not recorded the same way in these tools"
    for p in provs:
        for metric, why in (p.get("left_out") or {}).items():
            lines.append(f"  left out of {p.get('tool')}: {metric}: {why}")
    lines.append("compared: " + ", ".join(m for m in COMPARED if m not in left))
    for metric, why in left.items():
        lines.append(f"  not compared: {metric}: {why}")
    if not same["token_counts"] or not same["warmup"] or not same["ttft_from"]:
        lines.append("  caution: token counts, warm-up or the TTFT start differ; compare ratios within a run, "
                     "and read absolute differences with that in mind")
    sim = [n.split(" ")[0] for n, p in zip(names, provs) if SIMULATED in str(p.get("tool"))]
    if sim:
        lines.append(f"  caution: run {', '.join(sim)} is the serving twin's prediction, not a measurement: a "
                     "difference from a measured run is the twin's error (or the machine's speed that moment), "
                     "not an effect")
    return lines, left


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


def table_html(lines: list[str]) -> str:
    """The comparability lines as an HTML block for the comparison page."""
    import html

    return "<h2>Comparability</h2><pre class='meta'>" + html.escape("\n".join(lines)) + "</pre>"


def comparable_metrics(left_out: dict) -> list[str]:
    """The metrics of the delta table that survive the check."""

    return [m for m in list(dict.fromkeys(DELTA_METRICS + ["tpot_s_p50", "e2e_s_p50"])) if m not in left_out]


# --------------------------------------------------------------------------------------- cross-tool decisions

#: Per-request metrics the cross-tool view decides on (seconds).
CROSS_METRICS = ("ttft_s", "e2e_s")
#: Fewest completed requests per side for an interval (a bootstrap below this is no interval at all).
CROSS_MIN_N = 5
#: The comparability aspects (:func:`comparability`'s titles) that move each cross-tool metric.
CROSS_ASPECTS = {"ttft_s": ("arrival pattern", "warm-up", "TTFT counted from"),
                 "e2e_s": ("arrival pattern", "warm-up", "TTFT counted from", "ignore_eos", "token counts")}


def _request_values(run: Path, pid: str, metric: str) -> np.ndarray:
    import numpy as np

    req = results.read_requests(run)
    if req.empty or metric not in req or "point_id" not in req:
        return np.array([])
    req = req[req["point_id"].astype(str) == pid]
    if "error" in req:
        req = req[req["error"].isna() | (req["error"].astype(str) == "")]
    vals = pd.to_numeric(req[metric], errors="coerce").to_numpy(dtype=float)
    return vals[np.isfinite(vals) & (vals > 0)]


def _pairs(a: Path, b: Path) -> list[tuple[str, str]]:
    """Points of run ``a`` and ``b`` measured under the same load: the same point id; else the single point of
    each; else the one point of each side with the same concurrency (a closed-loop synchronous point counts
    as concurrency 1)."""
    pa_, pb_ = results.read_points(a), results.read_points(b)
    if "point_id" not in pa_ or "point_id" not in pb_:
        return []
    ida, idb = list(pa_["point_id"].astype(str)), list(pb_["point_id"].astype(str))
    common = [p for p in ida if p in idb]
    if common:
        return [(p, p) for p in common]
    if len(ida) == 1 and len(idb) == 1:
        return [(ida[0], idb[0])]

    ca, cb = _concurrency(pa_), _concurrency(pb_)
    out = []
    for value in {v for v in ca.values() if v is not None} & {v for v in cb.values() if v is not None}:
        xa = [p for p, v in ca.items() if v == value]
        xb = [p for p, v in cb.items() if v == value]
        if len(xa) == 1 and len(xb) == 1:
            out.append((xa[0], xb[0]))
    return out


def _concurrency(pts: pd.DataFrame) -> dict:
    """``{point_id: requests in flight}`` of a run's finished closed-loop points (a synchronous point: 1), None
    where unknown."""
    c = pd.to_numeric(pts.get("concurrency", pd.Series(index=pts.index, dtype=float)), errors="coerce")
    if "profile" in pts:
        c = c.where(~pts["profile"].astype(str).eq("synchronous"), 1.0)
    if "status" in pts:
        c = c.where(pts["status"].astype(str).eq("ok"))
    return {k: (float(v) if v == v else None) for k, v in zip(pts["point_id"].astype(str), c)}


def _median_ratio_interval(a, b, confidence: float, seed: int):
    """``median(b) / median(a)`` with scipy's bootstrap interval over the two independent samples (BCa; the
    percentile interval where BCa is undefined)."""
    import numpy as np
    from scipy import stats

    def stat(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis)

    est = float(np.median(b) / np.median(a))
    for method in ("BCa", "percentile"):
        try:
            with np.errstate(all="ignore"):
                res = stats.bootstrap((a, b), stat, paired=False, vectorized=True, n_resamples=4999,
                                      confidence_level=confidence, method=method, random_state=seed)
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if np.isfinite(lo) and np.isfinite(hi):
                return est, lo, hi, f"bootstrap ({method}, 4999 resamples, {len(a)}+{len(b)} requests)"
        except (ValueError, FloatingPointError):
            continue
    return est, float("nan"), float("nan"), "bootstrap failed"


def cross_tool(runs: list[Path], confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Cross-tool decisions: for each run after the first (B) against the first (A), per matched point
    (:func:`_pairs`) and per metric of :data:`CROSS_METRICS`, the ratio B / A of the per-request medians with a
    bootstrap interval, and the ratio of geometric means with Welch's t on the log scale
    (:func:`workbench.stats.evidence.ratio_interval`), beside the comparability check's verdict.

    Where a side has no per-request values (a summary-only import) the row says "summary only: no interval"
    and carries the ratio of the summary medians only.

    Returns:
        Rows ``{run_a, run_b, point_a, point_b, metric, n_a, n_b, median_a, median_b, ratio, low, high, method,
        gm_ratio, gm_low, gm_high, gm_method, verdict, comparability}``.
    """
    import numpy as np

    from workbench.stats import evidence

    with_points = [r for r in runs if "point_id" in results.read_points(r)]   # runs without points take no part
    if len(with_points) < 2:
        return []
    out = []
    base = with_points[0]
    for other in with_points[1:]:
        lines, _ = comparability([base, other])
        differ = [ln.split(":")[0].strip() for ln in lines[1:9] if ": DIFFERENT" in ln or ": UNKNOWN" in ln]
        pts_a, pts_b = results.read_points(base), results.read_points(other)
        conc_a, conc_b = _concurrency(pts_a), _concurrency(pts_b)
        for pa_id, pb_id in _pairs(base, other):
            same_load = conc_a.get(pa_id) is not None and conc_a.get(pa_id) == conc_b.get(pb_id)
            for metric in CROSS_METRICS:
                # the aspects that move this metric; the arrival pattern matches when both points held the same
                # number of requests in flight (a synchronous point is concurrency 1)
                relevant = [d for d in differ if d in CROSS_ASPECTS[metric]
                            and not (d == "arrival pattern" and same_load)]
                verdict_cmp = ("comparable (" + ", ".join(CROSS_ASPECTS[metric]) + " the same)" if not relevant else
                               "caution: " + ", ".join(relevant) + " differ or are not recorded")
                a, b = _request_values(base, pa_id, metric), _request_values(other, pb_id, metric)
                row = {"run_a": base.name, "run_b": other.name, "point_a": pa_id, "point_b": pb_id, "metric": metric,
                       "n_a": int(a.size), "n_b": int(b.size), "comparability": verdict_cmp}
                if a.size and b.size:
                    row.update(median_a=float(np.median(a)), median_b=float(np.median(b)))
                if a.size < CROSS_MIN_N or b.size < CROSS_MIN_N:
                    sa = _summary(pts_a, pa_id, metric)
                    sb = _summary(pts_b, pb_id, metric)
                    row.update(ratio=(sb / sa) if sa and sb else float("nan"), low=float("nan"), high=float("nan"),
                               method="", verdict="summary only: no interval" if not (a.size and b.size) else
                               f"too few requests for an interval ({a.size}+{b.size}; {CROSS_MIN_N} per side needed)")
                    out.append(row)
                    continue
                est, lo, hi, method = _median_ratio_interval(a, b, confidence, seed)
                gm = evidence.ratio_interval(b, a, confidence, unit="requests")
                iv = evidence.Interval(est, lo, hi, int(a.size + b.size), method, confidence)
                row.update(ratio=est, low=lo, high=hi, method=method, gm_ratio=gm.estimate, gm_low=gm.low,
                           gm_high=gm.high, gm_method=gm.method, verdict=evidence.ratio_verdict(iv))
                out.append(row)
    return out


def _summary(points: pd.DataFrame, pid: str, metric: str):
    col = f"{metric}_p50"
    row = points[points["point_id"].astype(str) == pid]
    if row.empty or col not in row:
        return None
    v = pd.to_numeric(row[col], errors="coerce").iloc[0]
    return float(v) if v == v else None


def cross_tool_lines(rows: list[dict]) -> list[str]:
    """The cross-tool decisions as lines to print (one per matched point and metric)."""
    if not rows:
        return []
    out = ["cross-tool decisions on per-request data (B / A; interval 95%; the comparability verdict beside):"]
    for r in rows:
        head = f"  {r['metric']} {r['point_b']} (B) / {r['point_a']} (A): "
        if r.get("method"):
            out.append(head + f"median ratio {r['ratio']:.3f}x, {r['low']:.3f}-{r['high']:.3f}x ({r['method']}); "
                       f"geometric-mean ratio {r['gm_ratio']:.3f}x, {r['gm_low']:.3f}-{r['gm_high']:.3f}x "
                       f"({r['gm_method']}); {r['verdict']}; {r['comparability']}")
        else:
            ratio = f"summary median ratio {r['ratio']:.3f}x; " if r.get("ratio") == r.get("ratio") and \
                r.get("ratio") is not None else ""
            out.append(head + f"{ratio}{r['verdict']}; {r['comparability']}")
    return out


def cross_tool_html(rows: list[dict]) -> str:
    """The cross-tool decisions as an HTML block for the comparison page (empty when no point is matched)."""
    import html

    if not rows:
        return ""
    return ("<h2>Cross-tool decisions on per-request data</h2><p class='meta'>Ratio B / A of per-request medians "
            "with a bootstrap interval, and of geometric means with Welch's t on the log scale; summary-only imports "
            "have no interval. The comparability check's verdict beside each.</p><pre class='meta'>"
            + html.escape("\n".join(cross_tool_lines(rows)[1:])) + "</pre>")
