"""Readers of GuideLLM's, AIPerf's and vLLM's result files, one per tool and format version, into the workbench's
names and units.

Each reader takes a parsed file (and the folder it sits in, for the per-request file a tool writes beside its
summary) and returns an :class:`~workbench.share.imported.Imported` (:mod:`workbench.share.imported`: the record,
the failed-point rule and the value checks every reader shares). :mod:`workbench.share.formats` detects the
format, caps what it reads, and writes the run folder; the other tools' readers (inference-perf, Benchmark Report
v0.2, genai-bench, LLMPerf) are in :mod:`workbench.share.importers_other`.

Formats read (each checked against the tool's own source and against files the tool wrote, ``tests/data``):

- GuideLLM report v1 (0.5.x: no ``metadata.version``) and v2 (0.8.x: ``metadata.version`` 2):
  ``benchmarks[].metrics`` (``StatusDistributionSummary``: a summary with ``count`` 0 holds zeros, read as
  absent), ``requests.successful / errored / incomplete`` (``guidellm/benchmark/schemas/``).
- AIPerf's aggregate export: 0.1.x ``{"records": {tag: {"tag", "header", "unit", "avg", "p50", ...}}}``
  (the metric ``ttft``), 0.2+ top-level metrics with ``schema_version`` 1.0 (0.5) to 1.4 (0.12, 0.13)
  (``aiperf/common/models/export_models.py``), with or without time to first token (a non-streaming run has
  none); its per-request ``profile_export.jsonl`` beside it, or alone (AIPerf 0.13 writes only that file
  when every request failed).
- ``vllm bench serve --save-result`` (``--save-detailed``: ``input_lens``, ``output_lens``, ``ttfts``,
  ``itls``, ``errors`` over every sent request, aligned by index; ``vllm/benchmarks/serve.py``) and
  ``vllm bench sweep serve`` trees (``<dir>/<SERVE-..-BENCH-..>/run=N.json``: the run's result with the sweep's
  parameters merged in; ``vllm/benchmarks/sweep/serve.py``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from workbench.share.imported import (
    LINEAR,
    NON_STREAMING,
    WORKBENCH_PROVENANCE,
    Imported,
    as_list,
    as_object,
    first_error,
    num,
    point,
    requests_frame,
    strict,
    unit_scale,
)

# ------------------------------------------------------------------------------- values these readers share


def _ms(v):
    f = num(v)
    return None if f is None else f / 1000.0


def _summary_from_requests(req: pd.DataFrame) -> dict:
    """Point figures from per-request rows alone (the workbench's estimator, :func:`metrics.percentiles`)."""
    from workbench.stats import metrics

    done = req[req["error"].isna() | (req["error"].astype(str) == "")] if "error" in req else req
    out = {}
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        vals = pd.to_numeric(done.get(col), errors="coerce").dropna() if col in done else pd.Series(dtype=float)
        p = metrics.percentiles(vals.tolist(), (50, 90, 99)) if len(vals) else {}
        out[f"{col}_p50"] = p.get("p50")
        if col == "ttft_s":
            out["ttft_s_p90"], out["ttft_s_p99"] = p.get("p90"), p.get("p99")
    return out


# ---------------------------------------------------------------------------------------------- GuideLLM


def _gd(metrics: dict, name: str, stat: str = "median", status: str = "successful"):
    """A statistic of a GuideLLM ``StatusDistributionSummary``; None when the summary counts no value (GuideLLM
    then writes 0.0 for every statistic)."""
    summ = (metrics.get(name) or {}).get(status) if isinstance(metrics.get(name), dict) else None
    if not isinstance(summ, dict) or not (num(summ.get("count")) or 0) > 0:
        return None
    if stat.startswith("p") and stat[1:].isdigit():
        return num((summ.get("percentiles") or {}).get(stat))
    return num(summ.get(stat))


def guidellm(data: dict, path: Path) -> Imported:
    """GuideLLM's ``benchmarks.json`` (report v1 and v2): one point per benchmark, every request as a row."""
    meta = as_object(data.get("metadata"), "metadata")
    schema = f"report v{meta['version']}" if meta.get("version") is not None else "report v1 (no metadata.version)"
    backend = as_object(as_object(data.get("config"), "config").get("backend"), "config.backend")
    rows, reqs = [], []
    warmups, arrivals, ignore, streams_seen = set(), set(), set(), set()
    for i, b in enumerate(as_list(data["benchmarks"], "benchmarks")):
        b = as_object(b, f"benchmarks[{i}]")
        m, cfg = as_object(b.get("metrics"), f"benchmarks[{i}].metrics"), as_object(b.get("config"), f"benchmarks[{i}].config")
        strategy = as_object(cfg.get("strategy"), "strategy")
        if isinstance(cfg.get("backend"), dict) and isinstance(cfg["backend"].get("stream"), bool):
            streams_seen.add("stream" if cfg["backend"]["stream"] else "no-stream")
        kind = str(strategy.get("type_", "unknown"))
        rate, streams = num(strategy.get("rate")), num(strategy.get("streams"))
        arrivals.add(kind + (f" rate {rate:g}/s" if rate else "") + (f" {streams:g} streams" if streams else ""))
        w = cfg.get("warmup") or {}
        warmups.add("excluded (" + ", ".join(f"{k}={v}" for k, v in w.items() if v is not None) + ")"
                    if isinstance(w, dict) and any(w.get(k) for k in ("percent", "value"))
                    else "none configured (every request counted)")
        data_cfg = json.dumps(cfg.get("requests") or data.get("config") or {}, default=str)
        ignore.add(True if '"ignore_eos": true' in data_cfg.lower() or "output_tokens" in data_cfg else None)
        totals = as_object(m.get("request_totals"), "request_totals")
        lists = as_object(b.get("requests"), f"benchmarks[{i}].requests")
        pid = f"guidellm/{i}:{kind}" + (f",rate={rate:g}" if rate else "") + (f",streams={streams:g}" if streams else "")
        by_status = {}
        for status in ("successful", "errored", "incomplete"):
            items = as_list(lists.get(status), f"benchmarks[{i}].requests.{status}")
            by_status[status] = items
            for j, r in enumerate(items):
                r = as_object(r, f"requests.{status}[{j}]")
                where = f"benchmarks[{i}].requests.{status}[{j}]"
                info = r.get("info") if isinstance(r.get("info"), dict) else {}
                err = r.get("error") or info.get("error")
                if status != "successful" and not err:
                    err = "incomplete: the benchmark ended before the request finished" if status == "incomplete" \
                        else "errored"
                ttft = strict(r.get("time_to_first_token_ms"), where + ".time_to_first_token_ms")
                if status == "successful" and ttft is not None:
                    streams_seen.add("ttft")
                reqs.append({"point_id": pid, "request_id": str(r.get("request_id", f"{status}-{j}")),
                             "prompt_tokens": strict(r.get("prompt_tokens"), where + ".prompt_tokens"),
                             "output_tokens": strict(r.get("output_tokens"), where + ".output_tokens"),
                             "ttft_s": ttft / 1000.0 if ttft is not None and status == "successful" else None,
                             "tpot_s": _ms(strict(r.get("inter_token_latency_ms"), where + ".inter_token_latency_ms")),
                             "e2e_s": strict(r.get("request_latency"), where + ".request_latency")
                             if status == "successful" else None,
                             "error": None if status == "successful" else str(err)[:500],
                             "status": status})
        n_ok = int(num(totals.get("successful")) if num(totals.get("successful")) is not None
                   else len(by_status["successful"]))
        n_err = int(num(totals.get("errored")) if num(totals.get("errored")) is not None else len(by_status["errored"]))
        n_inc = int(num(totals.get("incomplete")) if num(totals.get("incomplete")) is not None
                    else len(by_status["incomplete"]))
        reason = first_error([r["error"] for r in reqs if r["point_id"] == pid and r["error"]])
        rows.append(point(pid, "imported_guidellm", completed=n_ok, failed=n_err, incomplete=n_inc, reason=reason,
                          arrival=kind, rate_rps=rate, concurrency=streams,
                          ttft_s_p50=_ms(_gd(m, "time_to_first_token_ms")),
                          ttft_s_p90=_ms(_gd(m, "time_to_first_token_ms", "p90")),
                          ttft_s_p99=_ms(_gd(m, "time_to_first_token_ms", "p99")),
                          tpot_s_p50=_ms(_gd(m, "inter_token_latency_ms")),
                          e2e_s_p50=_gd(m, "request_latency"),
                          output_throughput_tps=_gd(m, "output_tokens_per_second", "mean"),
                          request_throughput_rps=_gd(m, "requests_per_second", "mean"),
                          prompt_tokens=_gd(m, "prompt_token_count"),
                          output_tokens=_gd(m, "output_token_count", "total_sum"),
                          max_new_tokens=_gd(m, "output_token_count"), wall_s=num(b.get("duration"))))
    if isinstance(backend.get("stream"), bool):
        streaming = backend["stream"]
    elif "no-stream" in streams_seen and "stream" not in streams_seen:
        streaming = False
    else:
        streaming = True if streams_seen else None
    prov = {"tool": "guidellm", "version": str(meta.get("guidellm_version") or "unknown"), "schema": schema,
            "streaming": streaming,
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
    if streaming is False:
        left["ttft_s"] = NON_STREAMING
    req = requests_frame(reqs)
    return Imported("guidellm", path, pd.DataFrame(rows), req, prov, left)


# ------------------------------------------------------------------------------------------------ AIPerf

#: AIPerf metric tags across versions (0.1.x wrote ``ttft``; 0.2+ ``time_to_first_token``).
_AP_ALIASES = {"time_to_first_token": ("time_to_first_token", "ttft"), "time_to_second_token": ("time_to_second_token", "ttst")}


def _ap_metric(data: dict, name: str) -> dict:
    records = data.get("records") if isinstance(data.get("records"), dict) else {}
    for tag in _AP_ALIASES.get(name, (name,)):
        m = data.get(tag) if isinstance(data.get(tag), dict) else records.get(tag)
        if isinstance(m, dict):
            return m
    return {}


def _ap(data: dict, name: str, stat: str = "p50"):
    """A statistic of an AIPerf metric in seconds for time units (``{"unit", "avg", "p50", ...}``)."""
    m = _ap_metric(data, name)
    v = num(m.get(stat))
    return None if v is None else v * unit_scale(m.get("unit", ""))


def aiperf_jsonl(lines: list[dict], path: Path, pid: str) -> pd.DataFrame:
    """AIPerf's per-request ``profile_export.jsonl`` (one ``{"metadata", "metrics", "error"?}`` per request) as
    request rows of point ``pid``.

    Raises:
        Malformed: a line that is not an object, or a metric value that is not a number.
    """
    rows = []
    for i, rec in enumerate(lines):
        rec = as_object(rec, f"line {i + 1}")
        mets = as_object(rec.get("metrics"), f"line {i + 1}.metrics")

        def metric(name, tags=None):
            for tag in tags or (name,):
                m = mets.get(tag)
                if isinstance(m, dict):
                    v = strict(m.get("value"), f"line {i + 1}.metrics.{tag}.value")
                    return None if v is None else v * unit_scale(m.get("unit", ""))
            return None

        err = rec.get("error")
        if isinstance(err, dict):
            err = f"{err.get('type') or ''}: {err.get('message') or ''}".strip(": ")
        meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
        rows.append({"point_id": pid, "request_id": str(meta.get("x_request_id") or i),
                     "prompt_tokens": metric("input_sequence_length", ("input_sequence_length", "error_isl")),
                     "output_tokens": metric("output_sequence_length"),
                     "ttft_s": None if err else metric("time_to_first_token"),
                     "tpot_s": None if err else metric("inter_token_latency"),
                     "e2e_s": None if err else metric("request_latency"),
                     "error": str(err)[:500] if err else None})
    return requests_frame(rows)


def _aiperf_config(cfg: dict) -> tuple[str, float | None, float | None, bool | None, float | None]:
    """``(arrival, rate, concurrency, streaming, warm-up requests)`` from an ``input_config`` of either shape
    (0.1-0.8: ``loadgen`` and ``endpoint.streaming``; 0.13: ``phases`` and ``endpoint.streaming``)."""
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    streaming = endpoint.get("streaming") if isinstance(endpoint.get("streaming"), bool) else None
    loadgen = cfg.get("loadgen") if isinstance(cfg.get("loadgen"), dict) else {}
    phases = [p for p in cfg.get("phases") or [] if isinstance(p, dict) and p.get("kind", "profiling") == "profiling"]
    if phases:
        ph = phases[0]
        conc, rate = num(ph.get("concurrency")), num(ph.get("rate") or ph.get("request_rate"))
        arrival = str(ph.get("type") or ("concurrency" if conc else "unknown"))
        warm = sum(num(p.get("requests")) or 0 for p in cfg.get("phases") or []
                   if isinstance(p, dict) and p.get("kind") == "warmup") or None
    else:
        conc, rate = num(loadgen.get("concurrency")), num(loadgen.get("request_rate"))
        arrival = str(loadgen.get("request_rate_mode") or ("concurrency" if conc else "unknown"))
        warm = num(loadgen.get("warmup_request_count"))
    return arrival, rate, conc, streaming, warm


def aiperf(data: dict, path: Path, beside: list[dict] | None = None) -> Imported:
    """AIPerf's ``profile_export_aiperf.json`` (the ``records`` format of 0.1.x, schema 1.0-1.4 after), with the
    per-request ``profile_export.jsonl`` beside it when given (``beside``: its parsed lines)."""
    cfg = data.get("input_config") if isinstance(data.get("input_config"), dict) else {}
    arrival, rate, conc, streaming, warm = _aiperf_config(cfg)
    pid = f"aiperf/0:{arrival}" + (f",rate={rate:g}" if rate else "") + (f",concurrency={conc:g}" if conc else "")
    n = _ap(data, "request_count", "avg")
    errors = _ap(data, "error_request_count", "avg") or 0
    summary = [e for e in data.get("error_summary") or [] if isinstance(e, dict)]
    reason = "; ".join(f"{(e.get('error_details') or {}).get('type') or ''} "
                       f"{(e.get('error_details') or {}).get('message') or ''}".strip()[:200] + f" (x{e.get('count')})"
                       for e in summary[:2])
    req = aiperf_jsonl(beside, path, pid) if beside is not None else requests_frame([])
    ttft = _ap(data, "time_to_first_token")
    row = point(pid, "imported_aiperf", completed=int(n or 0), failed=int(errors), reason=reason,
                incomplete=0, arrival=arrival, rate_rps=rate, concurrency=conc,
                ttft_s_p50=ttft, ttft_s_p90=_ap(data, "time_to_first_token", "p90"),
                ttft_s_p99=_ap(data, "time_to_first_token", "p99"),
                tpot_s_p50=_ap(data, "inter_token_latency"), e2e_s_p50=_ap(data, "request_latency"),
                output_throughput_tps=_ap(data, "output_token_throughput", "avg"),
                request_throughput_rps=_ap(data, "request_throughput", "avg"),
                goodput_rps=_ap(data, "goodput", "avg"),
                prompt_tokens=_ap(data, "input_sequence_length"),
                output_tokens=_ap(data, "total_output_tokens", "avg") or _ap(data, "total_osl", "avg"),
                max_new_tokens=_ap(data, "output_sequence_length"), wall_s=_ap(data, "benchmark_duration", "avg"))
    if data.get("was_cancelled") is True and row["status"] == "ok":
        row["error_reason"] = (row["error_reason"] + "; " if row["error_reason"] else "") + "the run was cancelled"
    schema = f"schema {data['schema_version']}" if data.get("schema_version") else (
        "records (0.1.x: top-level records with tag and header per metric)" if isinstance(data.get("records"), dict)
        else "top-level metrics without schema_version (0.2-0.4)")
    version = str(data.get("aiperf_version") or ("0.1.x (read by shape: the records format)"
                                                 if isinstance(data.get("records"), dict) else "unknown"))
    return Imported("aiperf", path, pd.DataFrame([row]), req, _aiperf_provenance(cfg, streaming, arrival, rate, conc,
                                                                                 warm, version, schema),
                    {"ttft_s": NON_STREAMING} if streaming is False or (streaming is None and ttft is None and n)
                    else {})


def _aiperf_provenance(cfg, streaming, arrival, rate, conc, warm, version, schema) -> dict:
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    extra = json.dumps([cfg.get("input"), cfg.get("datasets"), endpoint.get("extra")], default=str)
    return {"tool": "aiperf", "version": version, "schema": schema, "streaming": streaming,
            "token_counts": "the server's usage (--use-server-token-count)" if endpoint.get("use_server_token_count")
            else "AIPerf's tokenizer over the returned text (no end-of-sequence id)",
            "ignore_eos": True if '"ignore_eos": true' in extra.lower() else None,
            "arrival": arrival + (f" rate {rate:g}/s" if rate else "") + (f" concurrency {conc:g}" if conc else ""),
            "warmup": f"excluded ({warm:g} warm-up requests)" if warm else "none configured (every request counted)",
            "percentiles": LINEAR, "itl": "not exported per gap",
            "tpot": "inter_token_latency: (latency - ttft) / (output - 1)", "ttft_from": "request sent by the client"}


def aiperf_requests_only(lines: list[dict], path: Path) -> Imported:
    """AIPerf's ``profile_export.jsonl`` read alone (AIPerf 0.13 writes no aggregate when every request failed)."""
    pid = "aiperf/0:per-request"
    req = aiperf_jsonl(lines, path, pid)
    failed = int(req["error"].notna().sum())
    done = len(req) - failed
    row = point(pid, "imported_aiperf", completed=done, failed=failed, reason=first_error(list(req["error"])),
                **_summary_from_requests(req))
    prov = _aiperf_provenance({}, None, "unknown (per-request file only)", None, None, None,
                              "unknown (per-request JSONL: no version recorded)", "profile_export.jsonl")
    return Imported("aiperf", path, pd.DataFrame([row]), req, prov, {})


# -------------------------------------------------------------------------------------------------- vLLM


def _vllm_requests(data: dict, pid: str) -> pd.DataFrame:
    """``--save-detailed`` lists, one entry per sent request in vLLM's convention (a failed request: its error,
    TTFT 0.0 and output length 0, read here as no TTFT)."""
    lists = {k: as_list(data.get(k), k) for k in ("ttfts", "input_lens", "output_lens", "errors", "itls")}
    n = max((len(v) for v in lists.values()), default=0)
    rows = []
    for i in range(n):
        def at(key):
            vals = lists[key]
            return vals[i] if i < len(vals) else None

        err = at("errors")
        err = str(err) if err not in (None, "") else None
        ttft = strict(at("ttfts"), f"ttfts[{i}]")
        rows.append({"point_id": pid, "request_id": str(i), "prompt_tokens": strict(at("input_lens"), f"input_lens[{i}]"),
                     "output_tokens": strict(at("output_lens"), f"output_lens[{i}]"),
                     "ttft_s": None if err else ttft, "tpot_s": None, "e2e_s": None, "error": err})
    return requests_frame(rows)


def _vllm_point(data: dict, pid: str, experiment: str = "imported_vllm", **params) -> tuple[dict, pd.DataFrame]:
    n = int(num(data.get("completed")) or 0)
    failed = int(num(data.get("failed")) or 0)
    rate = data.get("request_rate")
    rate_f = num(rate)
    conc = num(data.get("max_concurrency"))
    burst = num(data.get("burstiness"))
    arrival = ("all at once (rate inf)" if rate in ("inf", None) or rate_f is None or math.isinf(rate_f)
               else f"{'poisson' if burst in (None, 1.0) else f'gamma (burstiness {burst:g})'} rate {rate_f:g}/s")
    req = _vllm_requests(data, pid)
    errors = [e for e in req["error"] if e] if len(req) else [e for e in data.get("errors") or [] if e]
    if not failed and len(req):
        failed = int(req["error"].notna().sum())
    row = point(pid, experiment, completed=n, failed=failed, reason=first_error(errors), arrival=arrival,
                rate_rps=rate_f, concurrency=conc,
                valid=data.get("workbench_valid"), invalid_reason=data.get("workbench_invalid_reason") or "",
                ttft_s_p50=_ms(data.get("median_ttft_ms")), ttft_s_p90=_ms(data.get("p90_ttft_ms")),
                ttft_s_p99=_ms(data.get("p99_ttft_ms")),
                tpot_s_p50=_ms(data.get("median_tpot_ms")), e2e_s_p50=_ms(data.get("median_e2el_ms")),
                output_throughput_tps=num(data.get("output_throughput")),
                request_throughput_rps=num(data.get("request_throughput")),
                goodput_rps=num(data.get("request_goodput")),
                prompt_tokens=(num(data.get("total_input_tokens")) or 0) / n if n else None,
                output_tokens=num(data.get("total_output_tokens")), wall_s=num(data.get("duration")),
                model=data.get("model_id"), **params)
    return row, req


def _vllm_provenance(data: dict, arrival: str, schema: str) -> tuple[dict, dict]:
    if data.get("backend") == "workbench":   # the workbench's own export (share/export_points.vllm_result)
        return dict(WORKBENCH_PROVENANCE, tool="workbench (via vllm-json)", version="workbench export",
                    schema=schema, ignore_eos=data.get("ignore_eos"),
                    arrival=str(data.get("workbench_arrival") or arrival)), {}
    prov = {"tool": "vllm-json", "version": str(data.get("vllm_version") or "unknown (vLLM writes no version into "
                                                                           "its result)"),
            "schema": schema,
            "token_counts": "the server's usage.completion_tokens where streamed with usage, else the client's tokenizer",
            "ignore_eos": data.get("ignore_eos"), "arrival": arrival,
            "warmup": "not excluded: one untimed test prompt checks the endpoint, then every request counts",
            "percentiles": LINEAR, "itl": "gaps between streamed chunks (a chunk may hold several tokens)",
            "tpot": "(latency - ttft) / (output - 1) per request", "ttft_from": "request sent by the client"}
    return prov, {"itl": "vLLM's ITL is the gap between streamed chunks, not between token ids"}


def vllm(data: dict, path: Path) -> Imported:
    """One ``vllm bench serve --save-result`` file (with the ``--save-detailed`` lists when present)."""
    pid = str(data.get("workbench_point_id") or f"vllm/0:rate={data.get('request_rate')},"
                                                  f"concurrency={data.get('max_concurrency')}")
    row, req = _vllm_point(data, pid)
    schema = "bench serve result" + (" with --save-detailed lists" if "ttfts" in data else "")
    prov, left = _vllm_provenance(data, row["arrival"], schema)
    return Imported("vllm-json", path, pd.DataFrame([row]), req, prov, left)


SWEEP_RUN = re.compile(r"^run=(\d+)\.json$")


def vllm_sweep(runs: list[tuple[Path, dict]], folder: Path) -> Imported:
    """A ``vllm bench sweep serve`` tree: one point per ``run=N.json`` (its folder's name and the sweep's
    parameters merged into the file as the point's parameters, the run number as ``repeat``)."""
    rows, reqs, first = [], [], None
    for p, data in runs:
        comb = p.parent.name
        run_no = int(SWEEP_RUN.match(p.name).group(1))
        params = {k: v for k, v in data.items() if k not in _VLLM_RESULT_KEYS and k != "run_number"
                  and isinstance(v, (int, float, str, bool))}
        row, req = _vllm_point(data, f"vllm-sweep/{comb}/run={run_no}", "imported_vllm_sweep", repeat=run_no,
                               sweep_combination=comb, sweep_parameters=json.dumps(params, sort_keys=True, default=str))
        rows.append(row)
        reqs.append(req)
        first = first or data
    schema = "bench sweep serve tree (SERVE-/BENCH- folders of run=N.json)"
    prov, left = _vllm_provenance(first or {}, "; ".join(sorted({r["arrival"] for r in rows})), schema)
    prov["tool"] = "vllm-sweep"
    req = pd.concat([r for r in reqs if len(r)], ignore_index=True) if any(len(r) for r in reqs) else requests_frame([])
    return Imported("vllm-sweep", folder, pd.DataFrame(rows), req, prov, left)


#: Keys ``vllm bench serve`` writes itself (anything else in a sweep's run file is a sweep parameter).
_VLLM_RESULT_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                     "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
                     "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
                     "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                     "max_concurrent_requests", "input_lens", "output_lens", "ttfts", "itls", "generated_texts",
                     "errors", "ignore_eos"} | {f"{s}_{m}_ms" for s in ("mean", "median", "std", "p25", "p50", "p75",
                                                                        "p90", "p95", "p99", "p99.9")
                                                 for m in ("ttft", "tpot", "itl", "e2el")}
