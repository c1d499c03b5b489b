"""A benchmark client of the field against ``workbench serve``, cross-checked with the server's own figures (issue 23).

AIPerf (``aiperf profile``, installed in its own environment ``.venv-client/`` by ``make client-crosscheck``, with
torch 2.13.0 first so it pulls no CUDA build) runs at its default settings (it sends no ``temperature``: the
OpenAI default 1.0 applies; streaming chat, ``--concurrency`` workers, ``--requests`` requests of
``--prompt-tokens`` synthetic prompt tokens and ``--output-tokens`` requested output tokens) against the server
(:class:`workbench.serving.server.ServerThread`, one per engine, in this process). Per engine it prints the
client's errors, TTFT p50 and output-token total next to the server's own: the engine's TTFT p50 over the
requests the client sent (its ``history``, arrival at the handler to the first token id) and the output tokens
it generated (``workbench_generation_tokens_total`` of ``/metrics``, and its ``history``). AIPerf's token counts
come from the server's ``usage`` (``--use-server-token-count``; sampling settings stay its defaults): by default
AIPerf re-tokenizes the streamed text, which holds no end-of-sequence id and, for sampled text, need not split
into the ids that made it (measured: 255 vs 256 and 246 vs 248 tokens), so only the usage total can equal the
server's exactly (``--client-tokenizer-count`` shows the other). Goal: 0 errors, TTFT p50 within 5%, output tokens
equal.

``continuous`` is in the default list; until per-request sampling lands in that engine it answers 400 to the
client's temperature 1.0, and the script says so for that engine (it goes on with the others).

``python benchmarks/client_crosscheck.py --aiperf .venv-client/bin/aiperf [--engines fifo static continuous]``
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from workbench import metrics, models
from workbench.serving.protocol import SERVED_MODEL

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", default=str(REPO / ".venv-client" / "bin" / "aiperf"))
    ap.add_argument("--engines", nargs="+", default=["fifo", "static", "continuous"],
                    choices=["fifo", "static", "continuous"])
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


def run_engine(args, loaded, engine: str) -> None:
    from workbench.serving.server import ServerThread

    srv = ServerThread(loaded, engine=engine, max_batch_size=args.max_batch_size).start()
    try:
        eng = getattr(srv.engine, "engine", srv.engine)
        seen = len(eng.history)
        tokens0 = scrape_tokens(srv.base_url)
        out = Path(tempfile.mkdtemp(prefix=f"aiperf-{engine}-"))
        cmd = [args.aiperf, "profile", "--model", SERVED_MODEL, "--url", srv.base_url, "--endpoint-type", "chat",
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
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
        if proc.returncode != 0:
            hist = [h for h in list(eng.history)[seen:] if h.get("endpoint") == "chat"]
            print(f"[{engine}] aiperf exited {proc.returncode} (the server finished {len(hist)} of its requests; "
                  f"the continuous engine answers a temperature it cannot serve with an error until it samples per "
                  f"request): {(proc.stderr or proc.stdout).strip().splitlines()[-1][:300]}")
            return
        export = find_export(out)
        hist = list(eng.history)[seen:]
        chat = [h for h in hist if h.get("endpoint") == "chat"]
        server_tokens = scrape_tokens(srv.base_url) - tokens0
        errors = stat(export, "error_request_count", "avg") or 0
        client_ttft = stat(export, "time_to_first_token", "p50")
        client_tokens = stat(export, "total_output_tokens", "avg")
        if client_tokens is None:
            osl = stat(export, "output_sequence_length", "avg")
            n = stat(export, "request_count", "avg")
            client_tokens = osl * n if osl is not None and n is not None else None
        server_ttft = metrics.percentiles([h.get("ttft_s") for h in chat if not h.get("error")], (50,))["p50"]
        failed = [h for h in chat if h.get("error")]
        print(f"[{engine}] client errors {errors:g}; server requests {len(chat)} ({len(failed)} failed)")
        print(f"[{engine}] TTFT p50: client {client_ttft * 1e3:.1f} ms, server {server_ttft * 1e3:.1f} ms, "
              f"ratio {client_ttft / server_ttft:.3f} (goal within 5%)")
        history_tokens = sum(len(h.get("output_ids") or []) for h in chat)
        if args.client_tokenizer_count:
            # the client's tokenizer over the text: no end-of-sequence id, and sampled text need not re-tokenize
            # into the ids that made it
            eos = sum(h.get("finish_reason") == "stop" for h in chat)
            print(f"[{engine}] output tokens: client (its tokenizer over the text) {client_tokens:g}; server "
                  f"{server_tokens:g} (/metrics; history {history_tokens}), {server_tokens - eos:g} without the "
                  f"{eos} end-of-sequence ids")
        else:
            print(f"[{engine}] output tokens: client (usage) {client_tokens:g}; server {server_tokens:g} (/metrics; "
                  f"history {history_tokens}) -> {'equal' if client_tokens == server_tokens else 'DIFFERENT'}")
        shutil.rmtree(out, ignore_errors=True)
    finally:
        srv.stop()


def main() -> None:
    args = parse_args()
    if not Path(args.aiperf).exists():
        sys.exit(f"--aiperf: {args.aiperf} does not exist; run `make client-crosscheck` (it installs .venv-client/)")
    loaded = models.load_model("default", "cpu", "float32")
    for e in args.engines:
        run_engine(args, loaded, e)


if __name__ == "__main__":
    main()
