"""What a reader of another tool's results returns, and the checks its values pass through.

Every reader (:mod:`workbench.share.importers`: GuideLLM, AIPerf, vLLM; :mod:`workbench.share.importers_other`:
inference-perf, Benchmark Report v0.2, genai-bench, LLMPerf) returns an :class:`Imported`: one point per benchmark
in the workbench's names and units (seconds, tokens/s; :data:`FIGURES`), per-request rows (:data:`REQUEST_COLUMNS`)
where the tool wrote them, the provenance that decides comparability, the tool's version and the schema read.

A benchmark with no completed request is a failed point (:func:`point`: ``status`` "failed: <reason>", the error
count, no latency or throughput: a tool's 0.0 for "no data" is never read as a measurement); a partial one carries
``completed``, ``failed`` and ``incomplete``. Per-request values must be numbers (:func:`strict`): a string where a
latency or a token count belongs is refused (:class:`Malformed`), never coerced.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

from workbench import checks

#: Point columns that are figures of a measurement: blank on a failed point (never a 0.0 from "no data").
FIGURES = ["ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_s_p50", "e2e_s_p50", "itl_s_p50", "output_throughput_tps",
           "request_throughput_rps", "goodput_rps", "prompt_tokens", "output_tokens", "max_new_tokens", "wall_s"]
#: Per-request columns every reader fills where it can (seconds, tokens; ``error`` empty when the request completed).
REQUEST_COLUMNS = ["point_id", "request_id", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s", "error"]
LINEAR = "linear interpolation between order statistics (numpy.percentile)"
#: The workbench's own definitions (:mod:`workbench.share.comparability`), also those of a file it exported and a
#: reader takes back (``vllm-json``, ``br0.2``): the same measurement read again compares as the same.
WORKBENCH_PROVENANCE = {
    "tool": "workbench",
    "token_counts": "engine-side generated token ids (the model's own ids, EOS counted)",
    "warmup": "excluded (untimed warm-up runs before each measured shape)",
    "percentiles": LINEAR + "; p90 / p99 only from 10 / 100 samples",
    "itl": "gaps between generated token ids",
    "tpot": "(e2e - ttft) / (output tokens - 1) per request",
    "ttft_from": "handed to the workbench (before templating and tokenisation)",
}
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
        provenance: what decides comparability (:func:`workbench.share.comparability.comparability`), with
            ``tool``, ``version``, ``schema``.
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


def unit_scale(unit: str) -> float:
    """Seconds per ``unit`` for time units (``ms``, ``ns``, ``us``, ``s``), 1 for every other unit."""
    return {"ms": 1e-3, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "s": 1.0, "sec": 1.0}.get(str(unit).strip().lower(), 1.0)


def as_object(v, where: str) -> dict:
    """``v`` as an object (``{}`` where the tool wrote null).

    Raises:
        Malformed: anything else (named by ``where``).
    """
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise Malformed(f"{where} is a {type(v).__name__}, not an object")
    return v


def as_list(v, where: str) -> list:
    """``v`` as a list (``[]`` where the tool wrote null).

    Raises:
        Malformed: anything else (named by ``where``).
    """
    if v is None:
        return []
    if not isinstance(v, list):
        raise Malformed(f"{where} is a {type(v).__name__}, not a list")
    return v


def gate(row: dict) -> dict:
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
    return gate(row)


def first_error(errors: list) -> str:
    """The most common error text and its count (``"404 Not Found (x4)"``)."""
    texts = [str(e).strip().splitlines()[0][:160] for e in errors if e not in (None, "")]
    if not texts:
        return ""
    top = max(set(texts), key=texts.count)
    return f"{top} (x{texts.count(top)})" + (f" and {len(set(texts)) - 1} other error kinds" if len(set(texts)) > 1 else "")


def requests_frame(rows: list[dict]) -> pd.DataFrame:
    """Per-request rows as a table with the :data:`REQUEST_COLUMNS` (empty, with those columns, when there are
    none)."""
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS) if rows else pd.DataFrame(columns=REQUEST_COLUMNS)
