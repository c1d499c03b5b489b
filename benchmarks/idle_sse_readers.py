"""Idle SSE readers beside a timed chat stream (issue 51; not part of ``make test``; needs a quiet machine).

Does a crowd of clients waiting on a queued job's event stream slow the chat requests the server generates? The
script starts ``python -m workbench.serving.server`` (the ``workbench serve`` entry point) with the ``fifo`` engine
under the ``priority`` policy and a job store, then per arm:

1. a short blocker chat runs;
2. a job is queued behind it (``POST /v1/jobs``);
3. ``readers`` arm only: ``--readers`` clients (default 100) open ``GET /v1/jobs/{id}/events`` and wait, all
   connected before the next step (the job stays queued: they receive nothing but keep-alive comments);
4. the timed chat stream (``--tokens`` output tokens, ``ignore_eos``, greedy, ``priority`` -10: served before the job
   once the blocker ends, so it runs wholly while the readers wait);
5. the job is deleted (the readers' streams end).

Arms ``none`` and ``readers`` alternate within each of ``--rounds`` rounds (the order flips every round). Per arm it
keeps every inter-token latency of the timed stream: the engine's (``engine.itl_s`` of the final chunk: gaps between
generated token ids, stamped in the engine) and the client's chunk gaps (``chunk_itl_s``). The summary: p50 and max
of each arm over all rounds and their ratio readers / none; ``PASS`` when the engine ITL's p50 and max ratios are
within ``--tolerance`` (1.2: the issue's 20%).

A figure is a ratio measured side by side on one machine; on a machine shared with other load the ratios say
nothing (the script prints the load average at the start and the end): run it alone.

``python benchmarks/idle_sse_readers.py [--readers 100] [--tokens 128] [--rounds 3]``
(smoke: ``--readers 10 --tokens 24 --rounds 1``). Figures go to stdout; nothing is written elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readers", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=128, help="output tokens of the timed chat stream")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1.2, help="readers / none ratio still a PASS")
    ap.add_argument("--model", default="default")
    return ap.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, db: Path, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "workbench.serving.server", "--port", str(port), "--engine", "fifo", "--policy",
           "priority", "--jobs-db", str(db), "--request-timeout", "600", "--model", args.model,
           "--limit-concurrency", str(args.readers + 64), "--shutdown-timeout", "5"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit("the server exited at start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not answer /health within 300 s")


def chat(base: str, max_tokens: int, priority: int = 0, started: threading.Event | None = None) -> dict:
    """One greedy, fixed-length chat stream; its client chunk arrival times and the engine's final figures."""
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
            "priority": priority}
    stamps, engine = [], {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            choice = (msg.get("choices") or [{}])[0]
            if choice.get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
                if started is not None:
                    started.set()
            if choice.get("finish_reason"):
                engine = msg.get("engine") or {}
    return {"chunk_itl_s": list(np.diff(stamps)), "itl_s": list(engine.get("itl_s") or []),
            "output_tokens": engine.get("output_tokens")}


class Readers:
    """``n`` clients reading a job's event stream, on an event loop of their own (one thread)."""

    def __init__(self, base: str, jid: str, n: int):
        self.base, self.jid, self.n = base, jid, n
        self.connected = 0
        self.all_connected = threading.Event()
        self.comments = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _one(self, client):
        try:
            async with client.stream("GET", f"{self.base}/v1/jobs/{self.jid}/events", timeout=None) as r:
                self.connected += 1
                if self.connected == self.n:
                    self.all_connected.set()
                async for line in r.aiter_lines():
                    if line.startswith(":"):
                        self.comments += 1
        except httpx.HTTPError:
            pass

    async def _main(self):
        limits = httpx.Limits(max_connections=self.n + 8, max_keepalive_connections=self.n + 8)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
            await asyncio.gather(*(self._one(client) for _ in range(self.n)))

    def start(self) -> "Readers":
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def one_arm(base: str, arm: str, args) -> dict:
    with httpx.Client(timeout=120, trust_env=False) as http:
        blocker_started = threading.Event()
        blocker = threading.Thread(target=chat, args=(base, 16, 0, blocker_started), daemon=True)
        blocker.start()
        blocker_started.wait(300)
        jid = http.post(base + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": 8}).json()["id"]
        readers = None
        if arm == "readers":
            readers = Readers(base, jid, args.readers).start()
            if not readers.all_connected.wait(120):
                raise SystemExit(f"only {readers.connected} of {args.readers} readers connected")
        status = http.get(f"{base}/v1/jobs/{jid}").json()["status"]
        out = chat(base, args.tokens, priority=-10)   # served before the job: it runs while the readers wait
        queued_throughout = http.get(f"{base}/v1/jobs/{jid}").json()["status"] == "queued" and status == "queued"
        http.delete(f"{base}/v1/jobs/{jid}")
        blocker.join(300)
        if readers is not None:
            readers.join(60)
        return {**out, "queued_throughout": queued_throughout, "arm": arm}


def summary(values: list[float]) -> dict:
    v = np.asarray(values, dtype=float)
    return {"n": int(v.size), "p50_ms": float(np.percentile(v, 50) * 1e3) if v.size else float("nan"),
            "max_ms": float(v.max() * 1e3) if v.size else float("nan")}


def main() -> int:
    args = parse_args()
    load0 = os.getloadavg()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(port, Path(tmp) / "jobs.sqlite3", args)
        try:
            chat(base, 8)   # warm-up
            arms = {"none": [], "readers": []}
            for k in range(args.rounds):
                for arm in (("none", "readers") if k % 2 == 0 else ("readers", "none")):
                    res = one_arm(base, arm, args)
                    arms[arm].append(res)
                    print(f"round {k} {arm:7s}: engine ITL p50 {summary(res['itl_s'])['p50_ms']:.1f} ms, max "
                          f"{summary(res['itl_s'])['max_ms']:.1f} ms; job queued throughout: "
                          f"{res['queued_throughout']}", flush=True)
        finally:
            proc.send_signal(2)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    load1 = os.getloadavg()
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f} (figures hold on a quiet machine only)")
    table, ok = {}, True
    for key in ("itl_s", "chunk_itl_s"):
        s = {arm: summary([x for r in runs for x in r[key]]) for arm, runs in arms.items()}
        ratio = {m: s["readers"][m] / s["none"][m] for m in ("p50_ms", "max_ms")}
        table[key] = {**s, "ratio": ratio}
        print(f"{key:12s}: none p50 {s['none']['p50_ms']:.1f} ms max {s['none']['max_ms']:.1f} ms "
              f"(n={s['none']['n']}); {args.readers} readers p50 {s['readers']['p50_ms']:.1f} ms max "
              f"{s['readers']['max_ms']:.1f} ms (n={s['readers']['n']}); ratio p50 {ratio['p50_ms']:.2f}, "
              f"max {ratio['max_ms']:.2f}")
        if key == "itl_s":
            ok = all(v <= args.tolerance for v in ratio.values())
    queued = all(r["queued_throughout"] for runs in arms.values() for r in runs)
    print(f"{'PASS' if ok else 'FAIL'}  engine ITL p50 and max with {args.readers} idle readers within "
          f"{args.tolerance:.2f}x of none")
    print(f"{'PASS' if queued else 'FAIL'}  the job stayed queued while the timed stream ran")
    return 0 if ok and queued else 1


if __name__ == "__main__":
    sys.exit(main())
