"""Readers of inference-perf's, llm-d's Benchmark Report's, genai-bench's and LLMPerf's result files into the
workbench's names and units.

As the readers of :mod:`workbench.share.importers` (GuideLLM, AIPerf, vLLM), each takes a parsed file (and what
the tool writes beside it) and returns an :class:`~workbench.share.imported.Imported`;
:mod:`workbench.share.formats` detects the format and writes the run folder.

Formats read (each checked against the tool's own source and against files the tool wrote, ``tests/data``):

- inference-perf's lifecycle reports (``summary_lifecycle_metrics.json``, ``stage_N_lifecycle_metrics.json``:
  ``load_summary``, ``successes``, ``failures``; ``inference_perf/reportgen/base.py``) and
  ``per_request_lifecycle_metrics.json`` beside them.
- llm-d's Benchmark Report v0.2 and v0.2.1 (JSON or YAML; ``results.request_performance.aggregate``), the
  workbench's own ``br0.2`` export included.
- genai-bench's per-scenario results (``aggregated_metrics`` and ``individual_request_metrics``;
  ``genai_bench/metrics/``).
- LLMPerf's ``*_summary.json`` (``version`` "2023-08-31", ``results_*`` keys) and ``*_individual_responses.json``
  beside it (``ray-project/llmperf`` ``token_benchmark_ray.py``, ``src/llmperf/common_metrics.py``).
"""

from __future__ import annotations

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
    gate,
    num,
    point,
    requests_frame,
    strict,
    unit_scale,
)

# ---------------------------------------------------------------------------------------- inference-perf


def _ip(summary, key: str):
    if not isinstance(summary, dict):
        return None
    return num(summary.get(key))


def inference_perf(data: dict, path: Path, beside: list | None = None) -> Imported:
    """An inference-perf lifecycle report (summary or one stage), with ``per_request_lifecycle_metrics.json``
    beside it when given."""
    load = as_object(data.get("load_summary"), "load_summary")
    succ = as_object(data.get("successes"), "successes")
    fail = as_object(data.get("failures"), "failures")
    lat = as_object(succ.get("latency"), "successes.latency")
    thr = as_object(succ.get("throughput"), "successes.throughput")
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
        r = as_object(r, f"per_request[{i}]")
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
        reason = first_error([r["error"] for r in reqs])
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
    return Imported("inference-perf", path, pd.DataFrame([row]), requests_frame(reqs), prov, left)


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
    return v * unit_scale(unit)


def benchmark_report(data: dict, path: Path) -> Imported:
    """A Benchmark Report v0.2 / v0.2.1 (llm-d-benchmark ``benchmark_report/schema_v0_2*.py``): one point from
    ``results.request_performance.aggregate``; the workbench's own export round-trips through its
    ``scenario.load.native.config`` (the point's id and parameters)."""
    results_ = as_object(data.get("results"), "results")
    agg = as_object(as_object(results_.get("request_performance"), "results.request_performance").get("aggregate"),
               "results.request_performance.aggregate")
    reqs = as_object(agg.get("requests"), "aggregate.requests")
    lat = as_object(agg.get("latency"), "aggregate.latency")
    thr = as_object(agg.get("throughput"), "aggregate.throughput")
    load = as_object(as_object(data.get("scenario"), "scenario").get("load"), "scenario.load")
    std = as_object(load.get("standardized"), "scenario.load.standardized")
    native = as_object(as_object(load.get("native"), "scenario.load.native").get("config"), "scenario.load.native.config")
    tool = str(std.get("tool") or "unknown")
    own = tool == "workbench" and "point_id" in native
    total = int(num(reqs.get("total")) or 0)
    failures = int(num(reqs.get("failures")) or 0)
    incomplete = int(num(reqs.get("incomplete")) or 0)
    run = as_object(data.get("run"), "run")
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
        gate(row)
    version = str(data.get("version"))
    if own:   # the workbench's own export (share/export_points): its definitions, as the run that wrote it
        prov = dict(WORKBENCH_PROVENANCE, tool="workbench (via br0.2)", ignore_eos=native.get("ignore_eos"),
                    arrival=row.get("arrival"))
    else:
        prov = {"tool": f"benchmark-report ({tool})", "ignore_eos": None, "arrival": row.get("arrival"),
                **dict.fromkeys(("token_counts", "warmup", "percentiles", "itl", "tpot", "ttft_from"), "not recorded")}
    prov.update(version=str(std.get("tool_version") or "unknown"), schema=f"Benchmark Report v{version}")
    return Imported("benchmark-report", path, pd.DataFrame([row]), requests_frame([]), prov, {})


# ------------------------------------------------------------------------------------------- genai-bench


def genai_bench(data: dict, path: Path, metadata: dict | None = None) -> Imported:
    """One genai-bench scenario result (``aggregated_metrics`` and ``individual_request_metrics``;
    ``genai_bench/metrics/metrics.py``: ``ttft``, ``tpot``, ``e2e_latency`` in seconds per request,
    ``num_input_tokens``, ``num_output_tokens``, ``error_code``, ``error_message``)."""
    agg = as_object(data.get("aggregated_metrics"), "aggregated_metrics")
    scen = str(agg.get("scenario") or path.stem)
    conc = num(agg.get("num_concurrency"))
    pid = f"genai-bench/{scen}" + (f",concurrency={conc:g}" if conc else "")
    reqs = []
    for i, r in enumerate(as_list(data.get("individual_request_metrics"), "individual_request_metrics")):
        r = as_object(r, f"individual_request_metrics[{i}]")
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
    req = requests_frame(reqs)
    stats = as_object(agg.get("stats"), "aggregated_metrics.stats")

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
    reason = first_error(list(req["error"])) or "; ".join(f"code {k} (x{v})" for k, v in codes.items())
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
        r = as_object(r, f"individual_responses[{i}]")
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
                reason=first_error([r["error"] for r in reqs]) or (f"error codes {codes}" if codes not in
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
    return Imported("llmperf", path, pd.DataFrame([row]), requests_frame(reqs), prov, left)
