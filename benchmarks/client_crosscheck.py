"""Benchmark clients of the field against ``workbench serve``, cross-checked with the server's own figures (issue 23).

Two clients, each in its own environment with torch 2.13.0 (the CPU build) installed first so it pulls no CUDA
build (``make client-crosscheck`` installs both): AIPerf (``aiperf profile``, ``.venv-client/``) and GuideLLM
(``guidellm run``, ``.venv-guidellm/``). Each runs at its default settings (neither sends a
``temperature``: the OpenAI default 1.0 applies; streaming chat) with ``--concurrency`` workers, ``--requests``
requests of ``--prompt-tokens`` synthetic prompt tokens and ``--output-tokens`` requested output tokens, against
the server (:class:`workbench.serving.server.ServerThread`, one per engine, in this process). Per engine and
client it prints the client's errors, TTFT p50 and output-token total next to the server's own: the engine's TTFT
p50 over the requests that client sent (its ``history``, arrival at the handler to the first token id) and the
output tokens it generated (``workbench_generation_tokens_total`` of ``/metrics``, and its ``history``). Goal: 0
errors, TTFT p50 within 5%, output tokens equal.

AIPerf's token counts come from the server's ``usage`` (``--use-server-token-count``; sampling settings stay its
defaults): by default AIPerf re-tokenizes the streamed text, which holds no end-of-sequence id and, for sampled
text, need not split into the ids that made it (measured: 255 vs 256 and 246 vs 248 tokens), so only the usage
total can equal the server's exactly (``--client-tokenizer-count`` shows the other). GuideLLM (0.8's
``kind=...`` options) is run with ``--profile kind=concurrent,streams=N`` and ``--constraint
kind=max_requests,count=M`` (its default profile is a sweep of many benchmarks), synthetic data
``kind=synthetic_text,prompt_tokens=..,output_tokens=..`` built with the served model's tokenizer (``--tokenizer``)
and everything else at its defaults (:func:`guidellm_figures` says how its report is read).

``python benchmarks/client_crosscheck.py [--aiperf .venv-client/bin/aiperf] [--guidellm .venv-guidellm/bin/guidellm]
[--engines fifo static continuous]`` (a client whose executable is missing is skipped, said so)
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from workbench.measure import models
from workbench.serving.options import ENGINES
from workbench.serving.protocol import SERVED_MODEL
from workbench.stats import metrics

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", default=str(REPO / ".venv-client" / "bin" / "aiperf"))
    ap.add_argument("--guidellm", default=str(REPO / ".venv-guidellm" / "bin" / "guidellm"))
    ap.add_argument("--engines", nargs="+", default=list(ENGINES),
                    choices=list(ENGINES))
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--client-tokenizer-count", action="store_true",
                    help="AIPerf's own output-token count (its tokenizer over the streamed text) instead of the "
                         "server's usage (--use-server-token-count, the default here)")
    return ap.parse_args()


def scrape_tokens(base_url: str) -> float:
    """``workbench_generation_tokens_total`` summed over its labels, from ``/metrics``."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    pattern = r"^workbench_generation_tokens_total\{[^}]*\} (\S+)$"
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))


def find_export(folder: Path) -> dict:
    """AIPerf's aggregate JSON export (``profile_export_aiperf.json``) under ``folder``."""
    found = sorted(folder.rglob("profile_export_aiperf.json"))
    if not found:
        files = sorted(map(str, folder.rglob("*")))[:20]
        sys.exit(f"aiperf wrote no profile_export_aiperf.json under {folder}: {files}")
    return json.loads(found[0].read_text())


def stat(export: dict, name: str, key: str):
    """A metric's statistic from the export (``{"unit", "avg", "p50", ...}``), in seconds for time metrics."""
    m = export.get(name) or export.get("records", {}).get(name) or {}
    v = m.get(key)
    if v is None:
        return None
    unit = m.get("unit", "")
    return v / 1000.0 if unit == "ms" else v / 1e9 if unit == "ns" else v


def aiperf_figures(args, base_url: str, engine: str) -> dict | str:
    """Run AIPerf once against ``base_url``: ``{"errors", "ttft_p50_s", "output_tokens"}`` or why it failed."""
    out = Path(tempfile.mkdtemp(prefix=f"aiperf-{engine}-"))
    cmd = [args.aiperf, "profile", "--model", SERVED_MODEL, "--url", base_url, "--endpoint-type", "chat",
           "--streaming", "--tokenizer", str(models.resolve_model_path("default")),
           "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
           "--synthetic-input-tokens-mean", str(args.prompt_tokens), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0",
           "--artifact-dir", str(out), "--ui-type", "none"]
    if not args.client_tokenizer_count:
        cmd.append("--use-server-token-count")
    print(f"\n[{engine}] {' '.join(cmd)}", flush=True)
    # no HF_HUB_OFFLINE: aiperf 0.13 then resolves every tokenizer name as a hub snapshot, a local folder too
    # (HFValidationError); online mode reads the local folder directly and fetches nothing
    proc = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    try:
        if proc.returncode != 0:
            return f"aiperf exited {proc.returncode}: {(proc.stderr or proc.stdout).strip().splitlines()[-1][:300]}"
        export = find_export(out)
        tokens = stat(export, "total_output_tokens", "avg")
        if tokens is None:
            osl, n = stat(export, "output_sequence_length", "avg"), stat(export, "request_count", "avg")
            tokens = osl * n if osl is not None and n is not None else None
        return {"errors": stat(export, "error_request_count", "avg") or 0,
                "ttft_p50_s": stat(export, "time_to_first_token", "p50"), "output_tokens": tokens}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def guidellm_report(path: Path) -> dict:
    """The one benchmark of GuideLLM's JSON report at ``path`` (``{"benchmarks": [...]}``)."""
    if not path.exists():
        sys.exit(f"guidellm wrote no {path.name} under {path.parent}: {sorted(map(str, path.parent.rglob('*')))[:20]}")
    report = json.loads(path.read_text())
    benches = report.get("benchmarks") or []
    if len(benches) != 1:
        sys.exit(f"guidellm: expected one benchmark in {path}, found {len(benches)}")
    return benches[0]


def guidellm_figures(args, base_url: str, engine: str) -> dict | str:
    """Run GuideLLM once against ``base_url``: ``{"errors", "ttft_p50_s", "output_tokens", "own_median_s"}`` or
    why it failed.

    From its JSON report: errors are the ``errored`` and ``incomplete`` requests, output tokens the ``successful``
    ``total_sum`` of ``metrics.output_token_count``, and the TTFT p50 is :func:`workbench.stats.metrics.percentiles` over
    its per-request ``time_to_first_token_ms`` (``requests.successful``), the server's estimator. GuideLLM's own
    ``median`` (``own_median_s``) is the lower median (the value where the cumulative share first reaches 0.5), not
    the mean of the two middle values: with batched engines the middle requests can sit in two batches apart, so
    its median alone can differ from the server's by a batch time while every request agrees."""
    out = Path(tempfile.mkdtemp(prefix=f"guidellm-{engine}-"))
    cmd = [args.guidellm, "run", "--backend", f"kind=openai_http,target={base_url},model={SERVED_MODEL}",
           "--tokenizer", f"kind=huggingface_auto,model={models.resolve_model_path('default')}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
           "--profile", f"kind=concurrent,streams={args.concurrency}",
           "--constraint", f"kind=max_requests,count={args.requests}",
           "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console-interactive"]
    print(f"\n[{engine}] {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1"})
    try:
        if proc.returncode != 0:
            return f"guidellm exited {proc.returncode}: {(proc.stderr or proc.stdout).strip().splitlines()[-1][:300]}"
        bench = guidellm_report(out / "benchmarks.json")
        m, reqs = bench["metrics"], bench.get("requests") or {}
        ttft, tokens = m["time_to_first_token_ms"], m["output_token_count"]
        errors = sum(len(reqs.get(k) or []) for k in ("errored", "incomplete"))
        per_request = [r["time_to_first_token_ms"] / 1000.0 for r in reqs.get("successful") or []
                       if r.get("time_to_first_token_ms") is not None]
        return {"errors": errors, "ttft_p50_s": metrics.percentiles(per_request, (50,))["p50"],
                "output_tokens": tokens["successful"]["total_sum"],
                "own_median_s": ttft["successful"]["median"] / 1000.0, "requests": len(per_request)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


CLIENTS = {"aiperf": aiperf_figures, "guidellm": guidellm_figures}


def run_engine(args, loaded, engine: str, clients: list[str]) -> None:
    from workbench.serving.server import ServerThread

    srv = ServerThread(loaded, engine=engine, max_batch_size=args.max_batch_size).start()
    try:
        eng = getattr(srv.engine, "engine", srv.engine)
        for client in clients:
            seen = len(eng.history)
            tokens0 = scrape_tokens(srv.base_url)
            got = CLIENTS[client](args, srv.base_url, engine)
            chat = [h for h in list(eng.history)[seen:] if h.get("endpoint") == "chat"]
            failed = [h for h in chat if h.get("error")]
            if isinstance(got, str):
                print(f"[{engine}] {client}: {got} (the server finished {len(chat)} of its requests, "
                      f"{len(failed)} failed)")
                continue
            server_tokens = scrape_tokens(srv.base_url) - tokens0
            server_ttft = metrics.percentiles([h.get("ttft_s") for h in chat if not h.get("error")], (50,))["p50"]
            client_ttft, client_tokens = got["ttft_p50_s"], got["output_tokens"]
            print(f"[{engine}] {client}: client errors {got['errors']:g}; server requests {len(chat)} "
                  f"({len(failed)} failed)")
            own = f"; its own median {got['own_median_s'] * 1e3:.1f} ms" if "own_median_s" in got else ""
            print(f"[{engine}] {client}: TTFT p50: client {client_ttft * 1e3:.1f} ms, server {server_ttft * 1e3:.1f} "
                  f"ms, ratio {client_ttft / server_ttft:.3f} (goal within 5%{own})")
            history_tokens = sum(len(h.get("output_ids") or []) for h in chat)
            if client == "aiperf" and args.client_tokenizer_count:
                # the client's tokenizer over the text: no end-of-sequence id, and sampled text need not re-tokenize
                # into the ids that made it
                eos = sum(h.get("finish_reason") == "stop" for h in chat)
                print(f"[{engine}] {client}: output tokens: client (its tokenizer over the text) {client_tokens:g}; "
                      f"server {server_tokens:g} (/metrics; history {history_tokens}), {server_tokens - eos:g} "
                      f"without the {eos} end-of-sequence ids")
            else:
                print(f"[{engine}] {client}: output tokens: client {client_tokens:g}; server {server_tokens:g} "
                      f"(/metrics; history {history_tokens}) -> "
                      f"{'equal' if client_tokens == server_tokens else 'DIFFERENT'}")
    finally:
        srv.stop()


def main() -> None:
    args = parse_args()
    for c in CLIENTS:  # the clients run in a folder of their own: absolute paths
        setattr(args, c, os.path.abspath(getattr(args, c)))
    clients = [c for c in CLIENTS if Path(getattr(args, c)).exists()]
    for c in CLIENTS:
        if c not in clients:
            print(f"--{c}: {getattr(args, c)} does not exist, {c} skipped; `make client-crosscheck` installs it")
    if not clients:
        sys.exit("no client to run")
    loaded = models.load_model("default", "cpu", "float32")
    for e in args.engines:
        run_engine(args, loaded, e, clients)


if __name__ == "__main__":
    main()
