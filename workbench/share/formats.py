"""Other tools' results as runs of their own, and the comparability check printed before any comparison.

``workbench report A B ...`` takes, besides run folders, the files these tools write:

- GuideLLM's ``benchmarks.json`` (``GenerativeBenchmarksReport``: ``{"metadata", "config"?, "benchmarks":
  [{"type_": "generative_benchmark", "config", "scheduler_metrics", "metrics", "requests"}]}``;
  ``guidellm/benchmark/schemas/``, ``guidellm/schemas/statistics.py``, ``request_stats.py``);
- AIPerf's aggregate export ``profile_export_aiperf.json`` (metric objects ``{"unit", "avg", "p50", ...}``,
  ``input_config``; AIPerf ``docs/tutorials/working-with-profile-exports.md``);
- ``vllm bench serve --save-result`` JSON (``vllm/benchmarks/serve.py``: ``completed``, ``duration``,
  ``median_ttft_ms``, ``p99_ttft_ms``, ...; the per-request lists with ``--save-detailed``).

:func:`detect` names the format from the content (never the file name; a file that is none of these is refused
in one line). :func:`import_file` turns each benchmark into a point in the workbench's names and units
(seconds, ``ttft_s_p50``, ``tpot_s_p50``, ``output_throughput_tps``) and writes a run folder of its own
(``results/<id>-import-<tool>``), with the provenance that decides comparability in the manifest
(``imported``): how tokens were counted, ``ignore_eos``, the arrival pattern, warm-up exclusion, the percentile
definition and what "ITL" / "TPOT" mean there. :func:`comparability` compares that provenance across the
runs (as inference-perf's ``docs/comparability.md`` lists: token provenance, ignore_eos, warm-up, arrival
pattern) and returns the lines to print and the metrics left out of the comparison, each with its reason.

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

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

from workbench.run import results
from workbench import checks
from workbench.errors import ParameterError

#: The metrics of a comparison's delta table (the report's and an imported run's).
DELTA_METRICS = ["ttft_s_p50", "ttft_s_p99", "output_throughput_tps", "goodput_rps"]

KINDS = ("guidellm", "aiperf", "vllm-json")
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


@dataclasses.dataclass
class Imported:
    """One foreign file read into the workbench's names.

    Attributes:
        tool: ``guidellm`` / ``aiperf`` / ``vllm-json``.
        path: the file.
        points: one row per benchmark, workbench column names and units (seconds, tokens/s).
        requests: per-request rows where the file holds them (else empty).
        provenance: what decides comparability (see the module docstring).
        left_out: ``{column: reason}`` for figures the file has but that mean something else here.
    """

    tool: str
    path: Path
    points: pd.DataFrame
    requests: pd.DataFrame
    provenance: dict
    left_out: dict


def _read_json(path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ParameterError(f"RUN_DIR: {str(p)!r} is neither a run folder nor a result file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ParameterError(f"RUN_DIR: {p} is not a run folder, and not JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ParameterError(f"RUN_DIR: {p} is JSON but not a GuideLLM, AIPerf or vLLM bench result (not an object)")
    return data


def detect(data: dict, path="file") -> str:
    """The format of a parsed result file, from its content.

    Raises:
        ParameterError: none of :data:`KINDS`.
    """
    benches = data.get("benchmarks")
    if isinstance(benches, list) and benches and all(isinstance(b, dict) and "metrics" in b for b in benches):
        return "guidellm"
    ttft = data.get("time_to_first_token")
    if isinstance(ttft, dict) and "avg" in ttft and ("input_config" in data or "request_throughput" in data):
        return "aiperf"
    if {"completed", "duration"} <= set(data) and any(k in data for k in ("median_ttft_ms", "mean_ttft_ms")):
        return "vllm-json"
    raise ParameterError(f"RUN_DIR: {path} is not a GuideLLM benchmarks.json, an AIPerf profile_export_aiperf.json "
                         "or a vllm bench serve result (none of their fields found)")


_num = checks.finite_or_none  # a finite float, or None (the one home: workbench.checks)


def _ms(v):
    f = _num(v)
    return None if f is None else f / 1000.0


# ---------------------------------------------------------------------------------------------- GuideLLM


def _gd(metrics: dict, name: str, stat: str = "median", status: str = "successful"):
    """A statistic of a GuideLLM ``StatusDistributionSummary`` (``median``, ``mean``, ``total_sum``, or a
    percentile key such as ``p99``)."""
    summ = (metrics.get(name) or {}).get(status) or {}
    if stat.startswith("p") and stat[1:].isdigit():
        return _num((summ.get("percentiles") or {}).get(stat))
    return _num(summ.get(stat))


def _guidellm(data: dict, path: Path) -> Imported:
    rows, reqs = [], []
    warmups, arrivals, ignore = set(), set(), set()
    for i, b in enumerate(data["benchmarks"]):
        m, cfg = b.get("metrics") or {}, b.get("config") or {}
        strategy = cfg.get("strategy") or {}
        kind = str(strategy.get("type_", "unknown"))
        rate = _num(strategy.get("rate"))
        streams = _num(strategy.get("streams"))
        arrivals.add(kind + (f" rate {rate:g}/s" if rate else "") + (f" {streams:g} streams" if streams else ""))
        w = cfg.get("warmup") or {}
        warmups.add("excluded (" + ", ".join(f"{k}={v}" for k, v in w.items() if v is not None) + ")"
                    if any(w.get(k) for k in ("percent", "value")) else "none configured (every request counted)")
        data_cfg = json.dumps(cfg.get("requests") or data.get("config") or {}, default=str)
        ignore.add(True if "output_tokens" in data_cfg else None)
        totals = m.get("request_totals") or {}
        succ = b.get("requests", {}).get("successful") or [] if isinstance(b.get("requests"), dict) else []
        n = int(totals.get("successful") or _gd(m, "request_latency", "count") or len(succ) or 0)
        pid = f"guidellm/{i}:{kind}" + (f",rate={rate:g}" if rate else "") + (f",streams={streams:g}" if streams else "")
        row = {"point_id": pid, "experiment": "imported_guidellm", "status": "ok", "valid": None,
               "arrival": kind, "rate_rps": rate, "concurrency": streams, "n_samples": n,
               "requests": int(totals.get("total") or n), "completed": int(totals.get("successful") or n),
               "ttft_s_p50": _ms(_gd(m, "time_to_first_token_ms")),
               "ttft_s_p90": _ms(_gd(m, "time_to_first_token_ms", "p90")) if n >= 10 else None,
               "ttft_s_p99": _ms(_gd(m, "time_to_first_token_ms", "p99")) if n >= 100 else None,
               "tpot_s_p50": _ms(_gd(m, "inter_token_latency_ms")),
               "e2e_s_p50": _gd(m, "request_latency"),
               "output_throughput_tps": _gd(m, "output_tokens_per_second", "mean"),
               "request_throughput_rps": _gd(m, "requests_per_second", "mean"),
               "prompt_tokens": _gd(m, "prompt_token_count"), "output_tokens": _gd(m, "output_token_count", "total_sum"),
               "max_new_tokens": _gd(m, "output_token_count")}
        rows.append(row)
        for r in succ:
            reqs.append({"point_id": pid, "request_id": str(r.get("request_id")), "prompt_tokens": r.get("prompt_tokens"),
                         "output_tokens": r.get("output_tokens"), "ttft_s": _ms(r.get("time_to_first_token_ms")),
                         "tpot_s": _ms(r.get("inter_token_latency_ms")), "e2e_s": _num(r.get("request_latency"))})
    prov = {"tool": "guidellm", "version": str((data.get("metadata") or {}).get("guidellm_version", "unknown")),
            "token_counts": "the server's usage where it reports one (prefer_response_metrics), else GuideLLM's "
                            "tokenizer over the text",
            "ignore_eos": True if ignore == {True} else None,
            "arrival": "; ".join(sorted(arrivals)), "warmup": "; ".join(sorted(warmups)),
            "percentiles": "from a weighted histogram: the value where the cumulative share first reaches q "
                           "(lower quantile, no interpolation)",
            "itl": "not exported per gap", "tpot": "inter_token_latency_ms: (last - first token) / (output - 1)",
            "ttft_from": "request sent by the client"}
    left = {"time_per_output_token_ms": "GuideLLM's TPOT includes the first token (latency / output tokens); "
                                        "its inter_token_latency_ms is imported as tpot_s instead"}
    return Imported("guidellm", path, pd.DataFrame(rows), pd.DataFrame(reqs), prov, left)


# ------------------------------------------------------------------------------------------------ AIPerf


def _ap(data: dict, name: str, stat: str = "p50"):
    m = data.get(name) or (data.get("records") or {}).get(name) or {}
    if not isinstance(m, dict):
        return None
    v = _num(m.get(stat))
    if v is None:
        return None
    unit = str(m.get("unit", ""))
    return v / 1000.0 if unit == "ms" else v / 1e9 if unit == "ns" else v


def _aiperf(data: dict, path: Path) -> Imported:
    cfg = data.get("input_config") or {}
    loadgen = cfg.get("loadgen") or {}
    endpoint = cfg.get("endpoint") or {}
    n = _ap(data, "request_count", "avg")
    conc, rate = _num(loadgen.get("concurrency")), _num(loadgen.get("request_rate"))
    arrival = str(loadgen.get("request_rate_mode") or ("concurrency" if conc else "unknown"))
    pid = f"aiperf/0:{arrival}" + (f",rate={rate:g}" if rate else "") + (f",concurrency={conc:g}" if conc else "")
    errors = _ap(data, "error_request_count", "avg") or 0
    row = {"point_id": pid, "experiment": "imported_aiperf", "status": "ok", "valid": None, "arrival": arrival,
           "rate_rps": rate, "concurrency": conc, "n_samples": int(n) if n else None,
           "requests": int((n or 0) + errors), "completed": int(n) if n else None,
           "ttft_s_p50": _ap(data, "time_to_first_token"),
           "ttft_s_p90": _ap(data, "time_to_first_token", "p90") if (n or 0) >= 10 else None,
           "ttft_s_p99": _ap(data, "time_to_first_token", "p99") if (n or 0) >= 100 else None,
           "tpot_s_p50": _ap(data, "inter_token_latency"), "e2e_s_p50": _ap(data, "request_latency"),
           "output_throughput_tps": _ap(data, "output_token_throughput", "avg"),
           "request_throughput_rps": _ap(data, "request_throughput", "avg"),
           "goodput_rps": _ap(data, "goodput", "avg") if isinstance(data.get("goodput"), dict) else None,
           "prompt_tokens": _ap(data, "input_sequence_length"), "output_tokens": _ap(data, "total_osl", "avg"),
           "max_new_tokens": _ap(data, "output_sequence_length")}
    extra = json.dumps(cfg.get("input") or {}, default=str)
    server_count = endpoint.get("use_server_token_count")
    warm = _num(loadgen.get("warmup_request_count"))
    prov = {"tool": "aiperf", "version": str(data.get("aiperf_version", "unknown")),
            "token_counts": "the server's usage (--use-server-token-count)" if server_count
            else "AIPerf's tokenizer over the returned text (no end-of-sequence id)",
            "ignore_eos": True if '"ignore_eos": true' in extra.lower() else None,
            "arrival": arrival + (f" rate {rate:g}/s" if rate else "") + (f" concurrency {conc:g}" if conc else ""),
            "warmup": f"excluded ({warm:g} warm-up requests)" if warm else "none configured (every request counted)",
            "percentiles": LINEAR, "itl": "not exported per gap",
            "tpot": "inter_token_latency: (latency - ttft) / (output - 1)", "ttft_from": "request sent by the client"}
    return Imported("aiperf", path, pd.DataFrame([row]), pd.DataFrame(), prov, {})


# -------------------------------------------------------------------------------------------------- vLLM


def _vllm(data: dict, path: Path) -> Imported:
    n = int(_num(data.get("completed")) or 0)
    rate = data.get("request_rate")
    rate_f = _num(rate)
    conc = _num(data.get("max_concurrency"))
    burst = _num(data.get("burstiness"))
    arrival = ("all at once (rate inf)" if rate in ("inf", None) or rate_f is None or math.isinf(rate_f)
               else f"{'poisson' if burst in (None, 1.0) else f'gamma (burstiness {burst:g})'} rate {rate_f:g}/s")
    pid = str(data.get("workbench_point_id") or f"vllm/0:rate={rate},concurrency={conc}")
    row = {"point_id": pid, "experiment": "imported_vllm", "status": "ok",
           "valid": data.get("workbench_valid"), "invalid_reason": data.get("workbench_invalid_reason") or "",
           "arrival": arrival, "rate_rps": rate_f,
           "concurrency": conc, "n_samples": n, "requests": n + int(_num(data.get("failed")) or 0), "completed": n,
           "ttft_s_p50": _ms(data.get("median_ttft_ms")),
           "ttft_s_p99": _ms(data.get("p99_ttft_ms")) if n >= 100 else None,
           "tpot_s_p50": _ms(data.get("median_tpot_ms")), "e2e_s_p50": _ms(data.get("median_e2el_ms")),
           "output_throughput_tps": _num(data.get("output_throughput")),
           "request_throughput_rps": _num(data.get("request_throughput")),
           "goodput_rps": _num(data.get("request_goodput")),
           "prompt_tokens": (_num(data.get("total_input_tokens")) or 0) / n if n else None,
           "output_tokens": _num(data.get("total_output_tokens")), "wall_s": _num(data.get("duration")),
           "model": data.get("model_id")}
    reqs = []
    ttfts = data.get("ttfts") or []
    for i, t in enumerate(ttfts):
        reqs.append({"point_id": pid, "request_id": str(i), "ttft_s": _num(t),
                     "prompt_tokens": (data.get("input_lens") or [None] * len(ttfts))[i] if i < len(data.get("input_lens") or []) else None,
                     "output_tokens": (data.get("output_lens") or [])[i] if i < len(data.get("output_lens") or []) else None})
    own = data.get("backend") == "workbench"
    prov = {"tool": "vllm-json" if not own else "workbench (via vllm-json)",
            "version": str(data.get("vllm_version", "unknown")),
            "token_counts": "engine-side token ids (a workbench export)" if own
            else "the server's usage.completion_tokens where streamed with usage, else the client's tokenizer",
            "ignore_eos": data.get("ignore_eos"), "arrival": arrival,
            "warmup": WORKBENCH_PROVENANCE["warmup"] if own
            else "not excluded: one untimed test prompt checks the endpoint, then every request counts",
            "percentiles": LINEAR, "itl": WORKBENCH_PROVENANCE["itl"] if own
            else "gaps between streamed chunks (a chunk may hold several tokens)",
            "tpot": "(latency - ttft) / (output - 1) per request", "ttft_from": "request sent by the client"}
    left = {} if own else {"itl": "vLLM's ITL is the gap between streamed chunks, not between token ids"}
    return Imported("vllm-json", path, pd.DataFrame([row]), pd.DataFrame(reqs), prov, left)


_READERS = {"guidellm": _guidellm, "aiperf": _aiperf, "vllm-json": _vllm}


def read_file(path) -> Imported:
    """Read one foreign result file (format from its content, :func:`detect`).

    Raises:
        ParameterError: not JSON, or none of :data:`KINDS`, or a benchmark without any figure.
    """
    p = Path(path)
    data = _read_json(p)
    kind = detect(data, p)
    try:
        imp = _READERS[kind](data, p)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ParameterError(f"RUN_DIR: {p} looks like {kind} output but a field is malformed ({type(exc).__name__}: "
                             f"{exc})") from None
    if imp.points.empty or imp.points[["ttft_s_p50", "output_throughput_tps"]].isna().all().all():
        raise ParameterError(f"RUN_DIR: {p} looks like {kind} output but holds no TTFT or throughput figure")
    return imp


def import_file(path, imported: Imported | None = None) -> Path:
    """Write a foreign result file as a run folder of its own (``<results>/<id>-import-<tool>``).

    Returns:
        The run folder (``manifest.json`` with ``imported`` provenance, ``points.parquet``, ``requests.parquet``
        when the file has per-request data).
    """
    imp = imported or read_file(path)
    label = "import-" + imp.tool.replace("-json", "").replace(" ", "")
    run = results.create_run(label[:40])
    pts = imp.points.copy()
    pts["run_id"] = run.name
    if "valid" in pts and pts["valid"].isna().all():
        pts = pts.drop(columns="valid")           # the tool does not judge validity: no verdict, not "valid"
    elif "valid" in pts:
        pts["invalid_reason"] = pts.get("invalid_reason", pd.Series("", index=pts.index)).fillna("")
    results.write_table(run / "points.parquet", pts)
    req = imp.requests.copy()
    if req.empty:
        req = pd.DataFrame(columns=["point_id", "request_id"])
    req["run_id"] = run.name
    req["experiment"] = pts["experiment"].iloc[0]
    results.write_table(run / "requests.parquet", req)
    exp = str(pts["experiment"].iloc[0])
    results.update_manifest(run, status="ok", imported={**imp.provenance, "source_file": str(Path(imp.path).resolve()),
                                                        "left_out": imp.left_out},
                            environment={"tool": imp.provenance["tool"], "tool_version": imp.provenance.get("version"),
                                         "source_file": str(Path(imp.path).resolve())},
                            experiments={exp: {"config": {"source_file": str(imp.path)},
                                               "points": list(pts["point_id"].astype(str))}})
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
        if p.is_dir():
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
