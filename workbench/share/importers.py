"""Readers of other tools' result files, one per tool and format version, into the workbench's names and units.

Each reader takes a parsed file (and the folder it sits in, for the per-request file a tool writes beside its
summary) and returns an :class:`Imported`: one point per benchmark in seconds and tokens/s (``ttft_s_p50``,
``tpot_s_p50``, ``e2e_s_p50``, ``output_throughput_tps``), per-request rows where the tool wrote them, the
provenance that decides comparability, the tool's version and the schema read. :mod:`workbench.share.formats`
detects the format, caps what it reads, and writes the run folder.

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
- inference-perf's lifecycle reports (``summary_lifecycle_metrics.json``, ``stage_N_lifecycle_metrics.json``:
  ``load_summary``, ``successes``, ``failures``; ``inference_perf/reportgen/base.py``) and
  ``per_request_lifecycle_metrics.json`` beside them.
- llm-d's Benchmark Report v0.2 and v0.2.1 (JSON or YAML; ``results.request_performance.aggregate``), the
  workbench's own ``br0.2`` export included.
- genai-bench's per-scenario results (``aggregated_metrics`` and ``individual_request_metrics``;
  ``genai_bench/metrics/``).
- LLMPerf's ``*_summary.json`` (``version`` "2023-08-31", ``results_*`` keys) and ``*_individual_responses.json``
  beside it (``ray-project/llmperf`` ``token_benchmark_ray.py``, ``src/llmperf/common_metrics.py``).

A benchmark with no completed request is a failed point (``status`` "failed: <reason>", the error count, no
latency or throughput: a tool's 0.0 for "no data" is never read as a measurement); a partial one carries
``completed``, ``failed`` and ``incomplete``. Per-request values must be numbers: a string where a latency or a
token count belongs is refused (:class:`Malformed`), never coerced.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pandas as pd

from workbench import checks

#: Point columns that are figures of a measurement: blank on a failed point (never a 0.0 from "no data").
FIGURES = ["ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "itl_s_p50", "output_throughput_tps",
           "request_throughput_rps", "goodput_rps", "prompt_tokens", "output_tokens", "max_new_tokens", "wall_s"]
#: Per-request columns every reader fills where it can (seconds, tokens; ``error`` empty when the request completed).
REQUEST_COLUMNS = ["point_id", "request_id", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "error"]
LINEAR = "linear interpolation between order statistics (numpy.percentile)"
NON_STREAMING = "non-streaming run: the first token arrives with the whole answer, so there is no time to first token"


class Malformed(Exception):
    """A file of a known format with a field of the wrong type or shape (the message names the field)."""


@dataclasses.dataclass
class Imported:
    """One foreign result read into the workbench's names.

    Attributes:
        tool: ``guidellm`` / ``aiperf`` / ``vllm-json`` / ``vllm-sweep`` / ``inference-perf`` /
            ``benchmark-report`` / ``genai-bench`` / ``llmperf``.
        path: the file (or folder) read.
        points: one row per benchmark, workbench column names and units (seconds, tokens/s).
        requests: per-request rows (:data:`REQUEST_COLUMNS`) where the tool wrote them, else empty.
        provenance: what decides comparability (``comparability.comparability``), with ``tool``, ``version``, ``schema``.
        left_out: ``{column: reason}`` for figures the file has (or lacks) that mean something else here.
    """

    tool: str
    path: Path
    points: pd.DataFrame
    requests: pd.DataFrame
    provenance: dict
    left_out: dict

    @property
    def version(self) -> str:
        return str(self.provenance.get("version", "unknown"))

    @property
    def schema(self) -> str:
        return str(self.provenance.get("schema", ""))


# ------------------------------------------------------------------------------------------------ values


num = checks.finite_or_none  # a summary field as a finite float, or None (the one home: workbench.checks)


def strict(v, where: str):
    """A per-request value as a float, None where the tool wrote null.

    Raises:
        Malformed: a string, bool, list or object where a number belongs (named by ``where``).
    """
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Malformed(f"{where} is {str(json.dumps(v, default=str))[:40]}, not a number")
    f = float(v)
    return f if math.isfinite(f) else None


def _ms(v):
    f = num(v)
    return None if f is None else f / 1000.0


def _unit_scale(unit: str) -> float:
    """Seconds per ``unit`` for time units (``ms``, ``ns``, ``us``, ``s``), 1 for every other unit."""
    return {"ms": 1e-3, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "s": 1.0, "sec": 1.0}.get(str(unit).strip().lower(), 1.0)


def _obj(v, where: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise Malformed(f"{where} is a {type(v).__name__}, not an object")
    return v


def _list(v, where: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise Malformed(f"{where} is a {type(v).__name__}, not a list")
    return v


def _gate(row: dict) -> dict:
    """Blank the percentiles the sample count cannot carry (docs/design.md section 4: p90 from 10, p99 from 100)."""
    n = row.get("n_samples") or 0
    if n < 10:
        row["ttft_s_p90"] = None
    if n < 100:
        row["ttft_s_p99"] = None
    return row


def point(pid: str, experiment: str, *, completed: int, failed: int = 0, incomplete: int = 0, reason: str = "",
          **figures) -> dict:
    """One point row: the counts, the status, and the figures (blank when nothing completed).

    Args:
        pid: the point's id.
        experiment: ``imported_<tool>``.
        completed, failed, incomplete: requests that completed, ended in an error, never finished.
        reason: the errors' description, for a failed point's status.
        **figures: :data:`FIGURES` columns and parameters (``arrival``, ``rate_rps``, ``concurrency``).

    Returns:
        The row; ``status`` is ``ok`` or ``failed: <reason>`` (no completed request: no figure at all).
    """
    completed, failed, incomplete = int(completed or 0), int(failed or 0), int(incomplete or 0)
    row = {"point_id": pid, "experiment": experiment, "status": "ok", "requests": completed + failed + incomplete,
           "completed": completed, "failed": failed, "incomplete": incomplete, "n_samples": completed,
           "error_reason": reason or "", **figures}
    if completed == 0:
        what = f"{failed} of {failed + incomplete} requests failed" if failed + incomplete else "no request recorded"
        if incomplete:
            what += f", {incomplete} never finished"
        row["status"] = f"failed: no request completed ({what}{': ' + reason if reason else ''})"[:400]
        for col in FIGURES:
            row[col] = None
    return _gate(row)


def _first_error(errors: list) -> str:
    """The most common error text and its count (``"404 Not Found (x4)"``)."""
    texts = [str(e).strip().splitlines()[0][:160] for e in errors if e not in (None, "")]
    if not texts:
        return ""
    top = max(set(texts), key=texts.count)
    return f"{top} (x{texts.count(top)})" + (f" and {len(set(texts)) - 1} other error kinds" if len(set(texts)) > 1 else "")


def _requests_frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS) if rows else pd.DataFrame(columns=REQUEST_COLUMNS)


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
    meta = _obj(data.get("metadata"), "metadata")
    schema = f"report v{meta['version']}" if meta.get("version") is not None else "report v1 (no metadata.version)"
    backend = _obj(_obj(data.get("config"), "config").get("backend"), "config.backend")
    rows, reqs = [], []
    warmups, arrivals, ignore, streams_seen = set(), set(), set(), set()
    for i, b in enumerate(_list(data["benchmarks"], "benchmarks")):
        b = _obj(b, f"benchmarks[{i}]")
        m, cfg = _obj(b.get("metrics"), f"benchmarks[{i}].metrics"), _obj(b.get("config"), f"benchmarks[{i}].config")
        strategy = _obj(cfg.get("strategy"), "strategy")
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
        totals = _obj(m.get("request_totals"), "request_totals")
        lists = _obj(b.get("requests"), f"benchmarks[{i}].requests")
        pid = f"guidellm/{i}:{kind}" + (f",rate={rate:g}" if rate else "") + (f",streams={streams:g}" if streams else "")
        by_status = {}
        for status in ("successful", "errored", "incomplete"):
            items = _list(lists.get(status), f"benchmarks[{i}].requests.{status}")
            by_status[status] = items
            for j, r in enumerate(items):
                r = _obj(r, f"requests.{status}[{j}]")
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
        reason = _first_error([r["error"] for r in reqs if r["point_id"] == pid and r["error"]])
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
    req = _requests_frame(reqs)
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
    return None if v is None else v * _unit_scale(m.get("unit", ""))


def aiperf_jsonl(lines: list[dict], path: Path, pid: str) -> pd.DataFrame:
    """AIPerf's per-request ``profile_export.jsonl`` (one ``{"metadata", "metrics", "error"?}`` per request) as
    request rows of point ``pid``.

    Raises:
        Malformed: a line that is not an object, or a metric value that is not a number.
    """
    rows = []
    for i, rec in enumerate(lines):
        rec = _obj(rec, f"line {i + 1}")
        mets = _obj(rec.get("metrics"), f"line {i + 1}.metrics")

        def metric(name, tags=None):
            for tag in tags or (name,):
                m = mets.get(tag)
                if isinstance(m, dict):
                    v = strict(m.get("value"), f"line {i + 1}.metrics.{tag}.value")
                    return None if v is None else v * _unit_scale(m.get("unit", ""))
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
    return _requests_frame(rows)


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
    req = aiperf_jsonl(beside, path, pid) if beside is not None else _requests_frame([])
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
    row = point(pid, "imported_aiperf", completed=done, failed=failed, reason=_first_error(list(req["error"])),
                **_summary_from_requests(req))
    prov = _aiperf_provenance({}, None, "unknown (per-request file only)", None, None, None,
                              "unknown (per-request JSONL: no version recorded)", "profile_export.jsonl")
    return Imported("aiperf", path, pd.DataFrame([row]), req, prov, {})


# -------------------------------------------------------------------------------------------------- vLLM


def _vllm_requests(data: dict, pid: str) -> pd.DataFrame:
    """``--save-detailed`` lists, one entry per sent request in vLLM's convention (a failed request: its error,
    TTFT 0.0 and output length 0, read here as no TTFT)."""
    lists = {k: _list(data.get(k), k) for k in ("ttfts", "input_lens", "output_lens", "errors", "itls")}
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
    return _requests_frame(rows)


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
    row = point(pid, experiment, completed=n, failed=failed, reason=_first_error(errors), arrival=arrival,
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
    own = data.get("backend") == "workbench"
    prov = {"tool": "vllm-json" if not own else "workbench (via vllm-json)",
            "version": str(data.get("vllm_version") or ("workbench export" if own else
                                                        "unknown (vLLM writes no version into its result)")),
            "schema": schema,
            "token_counts": "engine-side token ids (a workbench export)" if own
            else "the server's usage.completion_tokens where streamed with usage, else the client's tokenizer",
            "ignore_eos": data.get("ignore_eos"), "arrival": arrival,
            "warmup": "excluded (untimed warm-up runs before each measured shape)" if own
            else "not excluded: one untimed test prompt checks the endpoint, then every request counts",
            "percentiles": LINEAR, "itl": "gaps between generated token ids" if own
            else "gaps between streamed chunks (a chunk may hold several tokens)",
            "tpot": "(latency - ttft) / (output - 1) per request", "ttft_from": "request sent by the client"}
    left = {} if own else {"itl": "vLLM's ITL is the gap between streamed chunks, not between token ids"}
    return prov, left


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
    req = pd.concat([r for r in reqs if len(r)], ignore_index=True) if any(len(r) for r in reqs) else _requests_frame([])
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


# ---------------------------------------------------------------------------------------- inference-perf


def _ip(summary, key: str):
    if not isinstance(summary, dict):
        return None
    return num(summary.get(key))


def inference_perf(data: dict, path: Path, beside: list | None = None) -> Imported:
    """An inference-perf lifecycle report (summary or one stage), with ``per_request_lifecycle_metrics.json``
    beside it when given."""
    load = _obj(data.get("load_summary"), "load_summary")
    succ = _obj(data.get("successes"), "successes")
    fail = _obj(data.get("failures"), "failures")
    lat = _obj(succ.get("latency"), "successes.latency")
    thr = _obj(succ.get("throughput"), "successes.throughput")
    n, nf = int(num(succ.get("count")) or 0), int(num(fail.get("count")) or 0)
    rate, conc = num(load.get("requested_rate")), num(load.get("concurrency"))
    arrival = ("concurrent" if conc else "rate") + (f" rate {rate:g}/s" if rate and not conc else "") + \
        (f" concurrency {conc:g}" if conc else "")
    stem = path.stem.replace("_lifecycle_metrics", "")
    pid = f"inference-perf/{stem}:{arrival}"
    labels = fail.get("by_label") if isinstance(fail.get("by_label"), dict) else {}
    reason = "; ".join(f"{k} (x{v.get('count') if isinstance(v, dict) else v})" for k, v in list(labels.items())[:2])
    reqs = []
    for i, r in enumerate(beside or []):
        r = _obj(r, f"per_request[{i}]")
        info = r.get("info") if isinstance(r.get("info"), dict) else {}
        resp = info.get("response_metrics") if isinstance(info.get("response_metrics"), dict) else {}
        text = (info.get("request_metrics") or {}).get("text") if isinstance(info.get("request_metrics"), dict) else {}
        err = r.get("error")
        if isinstance(err, dict):
            err = f"{err.get('error_type') or ''}: {err.get('error_msg') or ''}".strip(": ")
        start, end = strict(r.get("start_time"), f"per_request[{i}].start_time"), \
            strict(r.get("end_time"), f"per_request[{i}].end_time")
        reqs.append({"point_id": pid, "request_id": str(i),
                     "prompt_tokens": strict((text or {}).get("input_tokens"), f"per_request[{i}].input_tokens"),
                     "output_tokens": strict(resp.get("output_tokens"), f"per_request[{i}].output_tokens"),
                     "ttft_s": None, "tpot_s": None,
                     "e2e_s": None if err or start is None or end is None else end - start,
                     "error": str(err)[:500] if err else None})
    if not reason and reqs:
        reason = _first_error([r["error"] for r in reqs])
    row = point(pid, "imported_inference_perf", completed=n, failed=nf, reason=reason, arrival=arrival,
                rate_rps=None if conc else rate, concurrency=conc,
                ttft_s_p50=_ip(lat.get("time_to_first_token"), "median"),
                ttft_s_p90=_ip(lat.get("time_to_first_token"), "p90"),
                ttft_s_p99=_ip(lat.get("time_to_first_token"), "p99"),
                tpot_s_p50=_ip(lat.get("time_per_output_token"), "median"),
                e2e_s_p50=_ip(lat.get("request_latency"), "median"),
                output_throughput_tps=num(thr.get("output_tokens_per_sec")),
                request_throughput_rps=num(thr.get("requests_per_sec")),
                prompt_tokens=_ip(succ.get("prompt_len"), "mean"),
                output_tokens=(num((succ.get("output_tokens") or {}).get("total"))
                               if isinstance(succ.get("output_tokens"), dict) else None),
                max_new_tokens=_ip(succ.get("output_len"), "median"), wall_s=num(data.get("benchmark_time_seconds")))
    schema = "lifecycle report" + (" (benchmark_time_seconds, prompt_tokens)" if "benchmark_time_seconds" in data
                                   else " (prompt_len, before benchmark_time_seconds)")
    streaming = None if not n else lat.get("time_to_first_token") is not None
    prov = {"tool": "inference-perf", "version": "unknown (inference-perf writes no version into its reports)",
            "schema": schema, "streaming": streaming,
            "token_counts": "the server's usage where reported, else the client's tokenizer over the text",
            "ignore_eos": None, "arrival": arrival, "warmup": "none configured (every request counted)",
            "percentiles": LINEAR, "itl": "gaps between streamed chunks",
            "tpot": "time_per_output_token: (latency - ttft) / (output - 1)", "ttft_from": "request sent by the client"}
    left = {"itl": "inference-perf's inter_token_latency is the gap between streamed chunks, not between token ids"}
    if streaming is False:
        left["ttft_s"] = NON_STREAMING
    return Imported("inference-perf", path, pd.DataFrame([row]), _requests_frame(reqs), prov, left)


# ----------------------------------------------------------------------------------- Benchmark Report v0.2


def _br_stat(stats, key: str = "p50"):
    """A Benchmark Report ``Statistics`` value in seconds (``units`` s / ms / ms/token / s/token)."""
    if not isinstance(stats, dict):
        return None
    v = num(stats.get(key))
    if v is None and key == "p50":
        v = num(stats.get("median"))
    if v is None:
        return None
    unit = str(stats.get("units", "s")).split("/")[0]
    return v * _unit_scale(unit)


def benchmark_report(data: dict, path: Path) -> Imported:
    """A Benchmark Report v0.2 / v0.2.1 (llm-d-benchmark ``benchmark_report/schema_v0_2*.py``): one point from
    ``results.request_performance.aggregate``; the workbench's own export round-trips through its
    ``scenario.load.native.config`` (the point's id and parameters)."""
    results_ = _obj(data.get("results"), "results")
    agg = _obj(_obj(results_.get("request_performance"), "results.request_performance").get("aggregate"),
               "results.request_performance.aggregate")
    reqs = _obj(agg.get("requests"), "aggregate.requests")
    lat = _obj(agg.get("latency"), "aggregate.latency")
    thr = _obj(agg.get("throughput"), "aggregate.throughput")
    load = _obj(_obj(data.get("scenario"), "scenario").get("load"), "scenario.load")
    std = _obj(load.get("standardized"), "scenario.load.standardized")
    native = _obj(_obj(load.get("native"), "scenario.load.native").get("config"), "scenario.load.native.config")
    tool = str(std.get("tool") or "unknown")
    own = tool == "workbench" and "point_id" in native
    total = int(num(reqs.get("total")) or 0)
    failures = int(num(reqs.get("failures")) or 0)
    incomplete = int(num(reqs.get("incomplete")) or 0)
    run = _obj(data.get("run"), "run")
    pid = str(native["point_id"]) if own else f"br/{run.get('uid') or path.stem}"
    params = {k: native.get(k) for k in ("batch_size", "rate_rps", "concurrency", "arrival", "engine", "policy",
                                         "max_new_tokens", "ignore_eos", "model", "device")
              if own and native.get(k) is not None}
    prompt = num(native.get("prompt_tokens")) if own else None
    conc, rate = num(std.get("concurrency")), num(std.get("rate_qps"))
    params.setdefault("concurrency", conc)
    params.setdefault("rate_rps", rate)
    params.setdefault("arrival", "concurrency" if conc else (f"rate {rate:g}/s" if rate else "unknown"))
    row = point(pid, str(native.get("experiment")) if own else "imported_benchmark_report",
                completed=total - failures - incomplete, failed=failures, incomplete=incomplete,
                reason="" if not failures else f"{failures} failures recorded (the report names no error)",
                ttft_s_p50=_br_stat(lat.get("time_to_first_token")),
                ttft_s_p90=_br_stat(lat.get("time_to_first_token"), "p90"),
                ttft_s_p99=_br_stat(lat.get("time_to_first_token"), "p99"),
                tpot_s_p50=_br_stat(lat.get("time_per_output_token")),
                e2e_s_p50=_br_stat(lat.get("request_latency")),
                output_throughput_tps=num((thr.get("output_token_rate") or {}).get("mean"))
                if isinstance(thr.get("output_token_rate"), dict) else None,
                request_throughput_rps=num((thr.get("request_rate") or {}).get("mean"))
                if isinstance(thr.get("request_rate"), dict) else None,
                prompt_tokens=prompt if prompt is not None else num((reqs.get("input_length") or {}).get("mean"))
                if isinstance(reqs.get("input_length"), dict) else prompt, **params)
    if own and native.get("n_samples") is not None:     # the workbench's own rule: independent samples, not rows
        row["n_samples"] = int(num(native.get("n_samples")) or row["n_samples"])
        _gate(row)
    version = str(data.get("version"))
    prov = {"tool": "workbench (via br0.2)" if own else f"benchmark-report ({tool})",
            "version": str(std.get("tool_version") or "unknown"), "schema": f"Benchmark Report v{version}",
            "token_counts": "engine-side generated token ids (a workbench export)" if own else "not recorded",
            "ignore_eos": native.get("ignore_eos") if own else None,
            "arrival": row.get("arrival"), "warmup": "excluded (untimed warm-up runs before each measured shape)"
            if own else "not recorded",
            "percentiles": LINEAR if own else "not recorded", "itl": "gaps between generated token ids" if own
            else "not recorded", "tpot": "(e2e - ttft) / (output tokens - 1) per request" if own else "not recorded",
            "ttft_from": "handed to the workbench (before templating and tokenisation)" if own else "not recorded"}
    return Imported("benchmark-report", path, pd.DataFrame([row]), _requests_frame([]), prov, {})


# ------------------------------------------------------------------------------------------- genai-bench


def genai_bench(data: dict, path: Path, metadata: dict | None = None) -> Imported:
    """One genai-bench scenario result (``aggregated_metrics`` and ``individual_request_metrics``;
    ``genai_bench/metrics/metrics.py``: ``ttft``, ``tpot``, ``e2e_latency`` in seconds per request,
    ``num_input_tokens``, ``num_output_tokens``, ``error_code``, ``error_message``)."""
    agg = _obj(data.get("aggregated_metrics"), "aggregated_metrics")
    scen = str(agg.get("scenario") or path.stem)
    conc = num(agg.get("num_concurrency"))
    pid = f"genai-bench/{scen}" + (f",concurrency={conc:g}" if conc else "")
    reqs = []
    for i, r in enumerate(_list(data.get("individual_request_metrics"), "individual_request_metrics")):
        r = _obj(r, f"individual_request_metrics[{i}]")
        where = f"individual_request_metrics[{i}]"
        err = r.get("error_message") or (f"error code {r.get('error_code')}" if r.get("error_code") not in (None, 200)
                                         else None)
        reqs.append({"point_id": pid, "request_id": str(i),
                     "prompt_tokens": strict(r.get("num_input_tokens"), where + ".num_input_tokens"),
                     "output_tokens": strict(r.get("num_output_tokens"), where + ".num_output_tokens"),
                     "ttft_s": None if err else strict(r.get("ttft"), where + ".ttft"),
                     "tpot_s": None if err else strict(r.get("tpot"), where + ".tpot"),
                     "e2e_s": None if err else strict(r.get("e2e_latency"), where + ".e2e_latency"),
                     "error": str(err)[:500] if err else None})
    req = _requests_frame(reqs)
    stats = _obj(agg.get("stats"), "aggregated_metrics.stats")

    def stat(name, key="p50"):
        s = stats.get(name)
        return num(s.get(key)) if isinstance(s, dict) else None

    completed = num(agg.get("num_completed_requests"))
    errors = num(agg.get("num_error_requests"))
    if completed is None:
        completed = float((req["error"].isna()).sum())
    if errors is None:
        errors = float(req["error"].notna().sum())
    codes = agg.get("error_codes_frequency") if isinstance(agg.get("error_codes_frequency"), dict) else {}
    if not errors and codes:   # genai-bench counts a refused connection in error_codes_frequency only
        errors = float(sum(num(v) or 0 for v in codes.values()))
    reason = _first_error(list(req["error"])) or "; ".join(f"code {k} (x{v})" for k, v in codes.items())
    row = point(pid, "imported_genai_bench", completed=int(completed), failed=int(errors), reason=reason,
                arrival="concurrency" if conc else "unknown", concurrency=conc,
                ttft_s_p50=stat("ttft"), ttft_s_p90=stat("ttft", "p90"), ttft_s_p99=stat("ttft", "p99"),
                tpot_s_p50=stat("tpot"), e2e_s_p50=stat("e2e_latency"),
                output_throughput_tps=num(agg.get("mean_output_throughput_tokens_per_s")),
                request_throughput_rps=num(agg.get("requests_per_second")),
                prompt_tokens=stat("num_input_tokens", "mean"), wall_s=num(agg.get("run_duration")))
    meta = metadata or {}
    prov = {"tool": "genai-bench", "version": str(meta.get("benchmark_version") or "unknown (no experiment_metadata.json "
                                                                                  "beside the result)"),
            "schema": "scenario result (aggregated_metrics, individual_request_metrics)",
            "token_counts": "the server's usage where reported, else genai-bench's tokenizer",
            "ignore_eos": None, "arrival": f"concurrency {conc:g}" if conc else "unknown",
            "warmup": "none configured (every request counted)", "percentiles": LINEAR,
            "itl": "not exported per gap", "tpot": "tpot: (e2e - ttft) / (output - 1)",
            "ttft_from": "request sent by the client"}
    return Imported("genai-bench", path, pd.DataFrame([row]), req, prov, {})


# ----------------------------------------------------------------------------------------------- LLMPerf


def llmperf(data: dict, path: Path, beside: list | None = None) -> Imported:
    """LLMPerf's ``*_summary.json`` with its ``*_individual_responses.json`` beside it when given."""
    conc = num(data.get("num_concurrent_requests"))
    pid = f"llmperf/{data.get('name') or path.stem}" + (f",concurrency={conc:g}" if conc else "")
    reqs = []
    for i, r in enumerate(beside or []):
        r = _obj(r, f"individual_responses[{i}]")
        where = f"individual_responses[{i}]"
        err = r.get("error_msg") or (f"error code {r.get('error_code')}" if r.get("error_code") else None)
        reqs.append({"point_id": pid, "request_id": str(i),
                     "prompt_tokens": strict(r.get("number_input_tokens"), where + ".number_input_tokens"),
                     "output_tokens": strict(r.get("number_output_tokens"), where + ".number_output_tokens"),
                     "ttft_s": None if err else strict(r.get("ttft_s"), where + ".ttft_s"), "tpot_s": None,
                     "e2e_s": None if err else strict(r.get("end_to_end_latency_s"), where + ".end_to_end_latency_s"),
                     "error": str(err)[:500] if err else None})
    codes = data.get("results_error_code_frequency")
    row = point(pid, "imported_llmperf", completed=int(num(data.get("results_num_completed_requests")) or 0),
                failed=int(num(data.get("results_number_errors")) or 0),
                reason=_first_error([r["error"] for r in reqs]) or (f"error codes {codes}" if codes not in
                                                                    (None, "{}") else ""),
                arrival="concurrency" if conc else "unknown", concurrency=conc,
                ttft_s_p50=num(data.get("results_ttft_s_quantiles_p50")),
                ttft_s_p90=num(data.get("results_ttft_s_quantiles_p90")),
                ttft_s_p99=num(data.get("results_ttft_s_quantiles_p99")),
                e2e_s_p50=num(data.get("results_end_to_end_latency_s_quantiles_p50")),
                output_throughput_tps=num(data.get("results_mean_output_throughput_token_per_s")),
                request_throughput_rps=(num(data.get("results_num_completed_requests_per_min")) or 0) / 60 or None,
                prompt_tokens=num(data.get("mean_input_tokens")), max_new_tokens=num(data.get("mean_output_tokens")))
    prov = {"tool": "llmperf", "version": f"results version {data.get('version')}", "schema": "summary.json"
            + (" with individual_responses.json" if beside is not None else ""),
            "token_counts": "LLMPerf's tokenizer (LlamaTokenizerFast) over the text",
            "ignore_eos": None, "arrival": f"concurrency {conc:g}" if conc else "unknown",
            "warmup": "none configured (every request counted)", "percentiles": LINEAR,
            "itl": "inter_token_latency_s: mean gap between streamed chunks with the first token counted",
            "tpot": "not exported", "ttft_from": "request sent by the client"}
    left = {"inter_token_latency_s": "LLMPerf's inter-token latency counts the first token among the gaps "
                                     "(chunks, not token ids): not the workbench's tpot_s or itl_s"}
    return Imported("llmperf", path, pd.DataFrame([row]), _requests_frame(reqs), prov, left)
