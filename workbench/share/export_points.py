"""A run's points as the field's documents: llm-d's Benchmark Report v0.2 and ``vllm bench serve`` JSON, one per
point (``workbench export RUN --to br0.2|vllm-json``, :mod:`workbench.share.export`).

- ``br0.2`` (:func:`br02_reports`): one Benchmark Report v0.2 per point (the format inference-perf emits; schema
  vendored in ``workbench/schemas/``, from llm-d/llm-d-benchmark), each validated with ``jsonschema``.
- ``vllm-json`` (:func:`vllm_results`): one document per point with the fields ``vllm bench serve --save-result
  --save-detailed`` writes, plus ``workbench_*`` keys for what vLLM has no field for.

Every percentile follows :data:`PERCENTILE_RULE` (docs/design.md section 4: p99 needs 100 independent samples); one
the samples cannot support is left out (BR0.2) or null with a note (vLLM JSON). :func:`check_run` and
:func:`run_tables` read the run every export starts from (the MLflow export's too).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import checks
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share.comparability import arrival_of
from workbench.stats import metrics

SCHEMA_BR02 = Path(__file__).with_name("schemas") / "br_v0_2_json_schema.json"
_MS = 1000.0


# ---------------------------------------------------------------------------------------------- the run


def check_run(run_dir) -> Path:
    """``run_dir`` as a path, after checking it is a run folder with a readable manifest.

    Raises:
        ParameterError: no ``manifest.json`` there, or one that cannot be read.
    """
    run = Path(run_dir)
    if not (run / "manifest.json").is_file():
        raise ParameterError(f"RUN_DIR: {str(run)!r} is not a run folder (no manifest.json)")
    results.read_manifest(run)
    return run


def run_tables(run: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Manifest, points (with cost columns at the recorded price, and ``ignore_eos`` from the requests where a point
    row lacks it: :func:`workbench.stats.metrics.with_request_settings`) and requests of a run."""
    from workbench.share import cost

    manifest = results.read_manifest(run)
    points = results.read_points(run)
    requests = results.read_requests(run)
    if not points.empty:
        points = metrics.with_request_settings(points, requests)
        points = cost.add_columns(points, requests, manifest.get("price_per_hour_usd"))
    return manifest, points, requests


# ---------------------------------------------------------------------------------------- per point data


_num = checks.finite_or_none  # a finite float, or None (the one home: workbench.checks)


def _completed(req: pd.DataFrame) -> pd.DataFrame:
    if "error" in req:
        req = req[req["error"].isna() | (req["error"].astype(str) == "")]
    if "output_tokens" in req:
        req = req[pd.to_numeric(req["output_tokens"], errors="coerce").fillna(0) > 0]
    return req


def _values(req: pd.DataFrame, col: str) -> np.ndarray:
    if col not in req:
        return np.array([])
    if col == "itl_s":
        flat = [float(x) for v in req[col] if v is not None and not (isinstance(v, float) and math.isnan(v))
                for x in (list(v) if not isinstance(v, str) else json.loads(v))]
        return np.array(flat, dtype=float)
    vals = pd.to_numeric(req[col], errors="coerce").to_numpy(dtype=float)
    return vals[np.isfinite(vals)]


def _min_n(q: float) -> int:
    """Independent samples a percentile needs (docs/design.md section 4: p90 needs 10, p99 needs 100): 1 / tail."""
    tail = min(q, 100 - q) / 100
    return 1 if tail >= 0.5 else int(math.ceil(1 / tail - 1e-9))


def _point_requests(requests: pd.DataFrame, pid: str) -> pd.DataFrame:
    if requests.empty or "point_id" not in requests:
        return requests.iloc[0:0]
    return requests[requests["point_id"] == pid]


# ---------------------------------------------------------------------------------------------- BR v0.2


_BR_QUANTILES = {"p0p1": 0.1, "p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95,
                 "p99": 99, "p99p9": 99.9}


#: The rule behind every exported percentile (docs/design.md section 4), stated in each export.
PERCENTILE_RULE = ("a percentile is exported only where the point's independent timing samples (n_samples: rows of "
                   "one batch share one stamp per step, so a batch is one sample) reach 1 / tail: p90 from 10, "
                   "p99 from 100, p99.9 from 1000")


def _independent(point: pd.Series, values: np.ndarray) -> int:
    """Independent samples behind a point's percentiles: its ``n_samples`` where recorded (never more than the
    values), else the number of values."""
    n = _num(point.get("n_samples")) if point is not None else None
    return int(min(n, values.size)) if n is not None else int(values.size)


def _br_stats(values: np.ndarray, units: str, scale: float = 1.0, n_independent: int | None = None) -> dict | None:
    """A BR0.2 ``Statistics`` object: mean, stddev, min, max and the percentiles the independent samples support
    (:data:`PERCENTILE_RULE`; ``n_independent`` defaults to the number of values)."""
    if values.size == 0:
        return None
    v = values * scale
    n = values.size if n_independent is None else n_independent
    out = {"units": units, "mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}
    if v.size >= 2:
        out["stddev"] = float(v.std(ddof=1))
    for key, q in _BR_QUANTILES.items():
        if n >= _min_n(q):
            out[key] = metrics.percentiles(v, (q,))[f"p{q}"]
    return out


def _br_rate(value, units: str) -> dict | None:
    f = _num(value)
    return None if f is None else {"units": units, "mean": f}


def _duration(seconds) -> str | None:
    f = _num(seconds)
    return None if f is None else f"PT{f:.6f}S"


def br02_report(run: Path, manifest: dict, point: pd.Series, requests: pd.DataFrame) -> dict:
    """One Benchmark Report v0.2 for one point (see ``workbench/schemas/README.md``).

    Latencies in seconds (``s``, TPOT / ITL ``s/token``), rates as point figures (``mean`` only: the workbench
    measures one rate per point). The workbench's own columns go to ``scenario.load.native.config``.
    """
    pid = str(point["point_id"])
    env = manifest.get("environment", {}) or {}
    req = _point_requests(requests, pid)
    done = _completed(req)
    finished = (manifest.get("points", {}).get(pid, {}) or {}).get("finished_utc")
    wall = _num(point.get("wall_s"))
    start = point_start(manifest, pid, point)
    prompt = _values(done, "prompt_tokens")
    ignore_eos = point.get("ignore_eos")
    config = {k: _jsonable(point.get(k)) for k in point.index}
    if config.get("arrival") is None:   # read back, the run's own arrival pattern (a NaN column's value included)
        config["arrival"] = arrival_of(pd.DataFrame([point]))
    total, failures, incomplete = request_counts(point, req, done)
    n_devices = devices(point)
    accel = str(point.get("device_name") or env.get("device_name") or point.get("device") or env.get("device") or "unknown")
    n_ind = lambda values: _independent(point, values)  # noqa: E731 - the point's independent samples
    report = {
        "version": "0.2",
        "run": {"uid": hashlib.sha1(f"{run.name}/{pid}".encode()).hexdigest(), "eid": run.name,
                "time": {"start": start, "end": finished, "duration": _duration(wall)},
                "description": f"workbench {point.get('experiment')} point {pid}; {PERCENTILE_RULE} "
                               f"(this point: n_samples={_independent(point, _values(done, 'ttft_s'))})",
                "keywords": ["workbench", str(point.get("experiment"))]},
        "scenario": {
            "stack": [{"metadata": {"label": "workbench-engine-0", "cfg_id": hashlib.sha1(
                json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:32],
                "description": "the workbench's in-process transformers engine"},
                "standardized": {"kind": "inference_engine", "tool": "workbench",
                                 "tool_version": str(env.get("workbench") or env.get("git_commit") or "unknown"),
                                 "role": "replica", "replicas": n_devices,
                                 "model": {"name": str(point.get("model") or env.get("model") or "unknown")},
                                 "accelerator": {"model": accel, "count": n_devices, "parallelism": {"tp": 1}}},
                "native": {"args": None, "envars": None, "config": _jsonable(env)}}],
            "load": {"metadata": {"schema_version": "0.0.1", "cfg_id": hashlib.sha1(pid.encode()).hexdigest()[:32],
                                  "description": f"ignore_eos={ignore_eos}"},
                     "standardized": {"tool": "workbench", "tool_version": str(env.get("workbench") or "unknown"),
                                      "source": load_source(point),
                                      "input_seq_len": _seq_len(prompt, point.get("prompt_tokens")),
                                      "output_seq_len": _seq_len(_values(done, "output_tokens"),
                                                                 point.get("max_new_tokens")),
                                      **({"rate_qps": _num(point.get("rate_rps"))}
                                         if _num(point.get("rate_rps")) is not None else {}),
                                      **({"concurrency": int(point["batch_size"])}
                                         if _num(point.get("batch_size")) is not None else {})},
                     "native": {"args": None, "envars": None, "config": config}}},
        "results": {"request_performance": {"aggregate": {
            "requests": {"total": total, "failures": failures, "incomplete": incomplete,
                         "input_length": _br_stats(prompt, "count"),
                         "output_length": _br_stats(_values(done, "output_tokens"), "count")},
            "latency": {"time_to_first_token": _br_stats(_values(done, "ttft_s"), "s",
                                                         n_independent=n_ind(_values(done, "ttft_s"))),
                        "time_per_output_token": _br_stats(_values(done, "tpot_s"), "s/token",
                                                           n_independent=n_ind(_values(done, "tpot_s"))),
                        "inter_token_latency": _br_stats(_values(done, "itl_s"), "s/token",
                                                         n_independent=_itl_independent(point, done)),
                        "request_latency": _br_stats(_values(done, "e2e_s"), "s",
                                                     n_independent=n_ind(_values(done, "e2e_s")))},
            "throughput": {"output_token_rate": _br_rate(point.get("output_throughput_tps"), "tokens/s"),
                           "input_token_rate": _br_rate(point.get("input_throughput_tps"), "tokens/s"),
                           "request_rate": _br_rate(point.get("request_throughput_rps"), "queries/s")}}}},
    }
    return report


def _itl_independent(point: pd.Series, done: pd.DataFrame) -> int:
    """Independent inter-token gaps: every gap of every request over the rows that shared it
    (:func:`workbench.stats.metrics.itl_samples`)."""
    return int(metrics.itl_samples(done)) if len(done) and "itl_s" in done else 0


def load_source(point: pd.Series) -> str:
    """Benchmark Report ``load.standardized.source``: ``random`` for prompts of random token ids (context length's
    ``source: random``), ``unknown`` for the serving twin's simulated points (no text at all), else ``sampled``:
    the workbench's prompts are cut from real text (``data/``: Python docs, Chinese essays, tasks)."""
    src = str(point.get("source") or "")
    if src == "random":
        return "random"
    if src == "simulated":
        return "unknown"
    return "sampled"


def _parse_utc(v):
    try:
        t = _dt.datetime.fromisoformat(str(v))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def point_start(manifest: dict, pid: str, point: pd.Series) -> str | None:
    """When the point's first round started (ISO 8601), for ``run.time.start``.

    A point measured on its own started at its ``started_utc``. A point of an interleaved or block design shares
    one block with its experiment's other arms: the first point of the sweep (in that session) measures every arm
    round by round and the others only read their share, so each arm's rounds began when that first point
    started. Runs recorded before ``started_utc`` existed fall back to ``finished_utc - wall_s``.
    """
    pts = manifest.get("points", {}) or {}
    meta = pts.get(pid, {}) or {}
    started = _parse_utc(meta.get("started_utc")) if meta.get("started_utc") else None
    if started is None:
        finished, wall = meta.get("finished_utc"), _num(point.get("wall_s"))
        t = _parse_utc(finished) if finished else None
        return (t - _dt.timedelta(seconds=wall)).isoformat() if t is not None and wall is not None else None
    if str(point.get("design") or "") in ("interleaved", "blocks"):
        sessions = [_parse_utc(x.get("started_utc")) for x in manifest.get("sessions") or [] if x.get("started_utc")]
        opened = max([t for t in sessions if t is not None and t <= started], default=None)
        same = [_parse_utc(m.get("started_utc")) for m in pts.values()
                if (m or {}).get("experiment") == meta.get("experiment") and (m or {}).get("started_utc")]
        same = [t for t in same if t is not None and t <= started and (opened is None or t >= opened)]
        started = min(same, default=started)
    return started.isoformat()


def request_counts(point: pd.Series, req: pd.DataFrame, done: pd.DataFrame) -> tuple[int, int, int]:
    """``(total, failures, incomplete)`` of a point's requests in Benchmark Report's sense: ``failures`` ended
    in an error (or without a token), ``incomplete`` were sent and never finished (the serving load's
    ``requests_incomplete``: no row), ``total`` every request sent."""
    incomplete = int(_num(point.get("requests_incomplete")) or 0)
    if len(req):
        failures = max(len(req) - len(done), 0)
        total = len(req) + incomplete
    else:
        n_req = int(_num(point.get("requests")) or 0)
        n_done = int(_num(point.get("completed")) or 0)
        failures = max(n_req - n_done - incomplete, 0)
        total = max(n_req, n_done + failures + incomplete)
    return total, failures, incomplete


def devices(point: pd.Series) -> int:
    """Devices (or replicas) the point's throughput spans: ``n_devices``, else ``replicas``, else 1."""
    for col in ("n_devices", "replicas"):
        v = _num(point.get(col))
        if v is not None and v >= 1:
            return int(v)
    return 1


def _seq_len(values: np.ndarray, fallback) -> dict:
    if values.size:
        if np.all(values == values[0]):
            return {"distribution": "fixed", "value": int(values[0])}
        return {"distribution": "other", "value": float(values.mean()), "std_dev": float(values.std()),
                "min": int(values.min()), "max": int(values.max())}
    f = _num(fallback)
    return {"distribution": "fixed" if f is not None else "other", "value": int(f) if f is not None else 0}


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return _jsonable(v.tolist())
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return str(v)


def br02_validator():
    """A ``jsonschema`` validator of the vendored Benchmark Report v0.2 schema."""
    import jsonschema

    schema = json.loads(SCHEMA_BR02.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def br02_reports(run_dir) -> dict[str, dict]:
    """``{point_id: BR0.2 report}`` for every point of the run, each validated against the schema.

    Raises:
        ParameterError: a report the schema rejects (names the point and the first error).
    """
    run = check_run(run_dir)
    manifest, points, requests = run_tables(run)
    validator = br02_validator()
    out = {}
    for _, p in points.iterrows():
        doc = _strip_none(br02_report(run, manifest, p, requests))
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            raise ParameterError(f"br0.2: point {p['point_id']} does not match the schema at "
                                 f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message[:200]}")
        out[str(p["point_id"])] = doc
    return out


def _strip_none(d):
    """Drop None values from nested dicts (the schema's optional fields may be absent or null; absent reads better)."""
    if isinstance(d, dict):
        return {k: _strip_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_strip_none(v) for v in d]
    return d


# ------------------------------------------------------------------------------------------ vLLM bench JSON


_VLLM_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}


def _itl_list(v) -> list[float]:
    """A request's inter-token latencies (s) as a list: ``[]`` where none were recorded (a row without a stream:
    None / NaN, e.g. the streaming reader's or long output's rows), a JSON list written as text parsed."""
    if isinstance(v, str):
        v = json.loads(v) if v.strip() else []
    if v is None or (isinstance(v, float) and v != v):
        return []
    return [float(x) for x in v]


def vllm_result(run: Path, manifest: dict, point: pd.Series, requests: pd.DataFrame) -> dict:
    """One point as ``vllm bench serve --save-result --save-detailed`` writes it (times in ms in the summary,
    seconds in the per-request lists, as vLLM does).

    The per-request lists run over every sent request in vLLM's convention (``vllm/benchmarks/serve.py``: one
    entry per request output, aligned by index): a request that failed has its error in ``errors``, TTFT 0.0,
    output length 0, no inter-token latencies and no text; a completed one has ``""`` in ``errors``.
    ``duration`` is the window behind ``request_throughput`` (``completed / request_throughput``, as vLLM's
    ``request_throughput = completed / duration``); the point's own wall time is ``workbench_wall_s``.
    """
    pid = str(point["point_id"])
    req = _point_requests(requests, pid)
    done = _completed(req)
    ok = req.index.isin(done.index)
    finished = (manifest.get("points", {}).get(pid, {}) or {}).get("finished_utc")
    date = ""
    if finished:
        try:
            date = _dt.datetime.fromisoformat(finished).strftime("%Y%m%d-%H%M%S")
        except ValueError:
            date = ""
    rate = _num(point.get("rate_rps"))
    inputs = _values(done, "prompt_tokens")
    outputs = _values(done, "output_tokens")
    wall = _num(point.get("wall_s"))
    rps = _num(point.get("request_throughput_rps"))
    duration = len(done) / rps if rps and len(done) else wall

    def cell(row, col, default=None):
        v = row.get(col) if col in row else default
        return None if v is None or (isinstance(v, float) and v != v) else v

    errors, ttfts, in_lens, out_lens, itls, texts = [], [], [], [], [], []
    for (_, r), good in zip(req.iterrows(), ok):
        err = cell(r, "error")
        errors.append("" if good else str(err or "no token produced"))
        # a completed request may have no first token time (a long-output plan's rows, a keep-alive probe that
        # timed out): 0.0 as vLLM writes for a request without one, never a crash (as itl_s None, below)
        ttfts.append(float(cell(r, "ttft_s") or 0.0) if good else 0.0)
        in_lens.append(int(_num(cell(r, "prompt_tokens")) or 0))
        out_lens.append(int(_num(cell(r, "output_tokens")) or 0) if good else 0)
        itls.append(_itl_list(cell(r, "itl_s")) if good else [])
        texts.append(str(cell(r, "text") or "") if good else "")
    n_ind = _independent(point, _values(done, "ttft_s"))
    doc = {"date": date, "endpoint_type": "workbench", "backend": "workbench", "label": str(point.get("experiment")),
           "model_id": str(point.get("model")), "tokenizer_id": str(point.get("model")),
           "num_prompts": int(len(req)) if len(req) else int(_num(point.get("requests")) or 0),
           "request_rate": rate if rate is not None else "inf", "burstiness": _num(point.get("burstiness")) or 1.0,
           "max_concurrency": int(point["batch_size"]) if _num(point.get("batch_size")) is not None else None,
           "ignore_eos": bool(point.get("ignore_eos")) if point.get("ignore_eos") is not None else None,
           "duration": duration, "completed": int(len(done)), "failed": int(len(req) - len(done)),
           "total_input_tokens": int(inputs.sum()), "total_output_tokens": int(outputs.sum()),
           "request_throughput": rps,
           "request_goodput": _num(point.get("goodput_rps")),
           "output_throughput": _num(point.get("output_throughput_tps")),
           "total_token_throughput": (_num(point.get("output_throughput_tps")) or 0)
           + (_num(point.get("input_throughput_tps")) or 0) if _num(point.get("output_throughput_tps")) else None,
           "input_lens": in_lens, "output_lens": out_lens, "ttfts": ttfts, "itls": itls,
           "generated_texts": texts if "text" in req else [], "errors": errors}
    note = []
    for short, col in _VLLM_METRICS.items():
        v = _values(done, col)
        doc[f"mean_{short}_ms"] = float(v.mean() * _MS) if v.size else None
        doc[f"median_{short}_ms"] = float(np.median(v) * _MS) if v.size else None
        doc[f"std_{short}_ms"] = float(v.std() * _MS) if v.size else None
        n = _itl_independent(point, done) if col == "itl_s" else _independent(point, v)
        ok99 = n >= _min_n(99)
        doc[f"p99_{short}_ms"] = metrics.percentiles(v, (99,))["p99"] * _MS if ok99 and v.size else None
        if v.size and not ok99:
            note.append(f"p99_{short}_ms")
    doc["workbench_point_id"] = pid
    doc["workbench_valid"] = None if point.get("valid") is None or pd.isna(point.get("valid")) else bool(point["valid"])
    doc["workbench_invalid_reason"] = str(point.get("invalid_reason") or "")
    doc["workbench_itl_definition"] = "gaps between generated token ids (vLLM: between streamed chunks)"
    doc["workbench_wall_s"] = wall
    doc["workbench_arrival"] = arrival_of(pd.DataFrame([point]))   # read back, the run's own arrival pattern
    doc["workbench_n_samples"] = n_ind
    doc["workbench_n_devices"] = devices(point)
    doc["workbench_incomplete"] = int(_num(point.get("requests_incomplete")) or 0)
    if note:
        doc["workbench_percentile_note"] = (f"left null, too few independent samples for p99 (needs "
                                            f"{_min_n(99)}; {PERCENTILE_RULE}): " + ", ".join(note))
    return _jsonable(doc)


def vllm_results(run_dir) -> dict[str, dict]:
    """``{point_id: vLLM bench result}`` for every point of the run."""
    run = check_run(run_dir)
    manifest, points, requests = run_tables(run)
    return {str(p["point_id"]): vllm_result(run, manifest, p, requests) for _, p in points.iterrows()}
