"""A bounded fault soak against a real ``workbench serve`` on each engine (issue 36; not part of ``make test``).

Per engine it starts ``python -m workbench.serving.server`` (the ``workbench serve`` entry point) with its own job
store and ``--request-timeout``, measures the server's resident memory after a warm-up, then for ``--requests``
chat requests runs, with ``--concurrency`` client threads, a random mix of clients:

- ``full``: streams and reads everything; ``json``: ``stream: false``;
- ``drop``: disconnects after a random number of chunks (0: right after the headers);
- ``slow``: reads one chunk every ``--slow-s`` seconds;
- ``never``: opens a stream, never reads it, closes it after ``--never-s`` seconds;

while one thread locks the job store from another connection (``BEGIN EXCLUSIVE`` for 0.2-1.5 s, then unlocked as
long), one submits, continues and deletes jobs, and one polls ``/health`` every 0.5 s.

Checks, printed per engine (``PASS`` / ``FAIL`` each):

- ``/health`` honest: every poll answered; 200 while the engine serves (a 503 is a failure unless the process is
  exiting), and the process still runs at the end;
- no request past its deadline: every client that reads finishes within ``--request-timeout`` + 15 s, answered
  200 or 504 (stopped at its deadline), never a connection error or another 5xx;
- no job lost or duplicated: after the load, every job submitted and not deleted is listed exactly once and
  reaches a final state; deleted ones are gone;
- memory: the server's RSS after the load (idle, after a settle) within 10% of its RSS after the warm-up.

``python benchmarks/fault_soak.py [--engines fifo static continuous] [--requests 300] [--concurrency 8]``
(small: ``--requests 24 --concurrency 4 --engines fifo``). Figures go to stdout; nothing is written elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
MODEL = "workbench-default"
MESSAGES = [{"role": "user", "content": "Tell a short story about a lighthouse keeper."}]
KINDS = ("full", "json", "drop", "slow", "never")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", nargs="+", default=["fifo", "static", "continuous"],
                    choices=["fifo", "static", "continuous"])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--request-timeout", type=float, default=60.0)
    ap.add_argument("--slow-s", type=float, default=0.2)
    ap.add_argument("--never-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(engine: str, port: int, db: Path, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "workbench.serving.server", "--port", str(port), "--engine", engine,
           "--jobs-db", str(db), "--request-timeout", str(args.request_timeout), "--max-queue", "256",
           "--shutdown-timeout", "5"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{engine}: the server exited at start: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{engine}: the server did not answer /health within 300 s")


def body(args, stream=True) -> dict:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": args.max_tokens, "stream": stream,
            "temperature": 0}


def one_client(base: str, kind: str, rng: random.Random, args) -> dict:
    """One request of ``kind``; its outcome: ``status``, ``wall_s`` (None for clients that leave on purpose)."""
    t0 = time.monotonic()
    limit = args.request_timeout + 15
    try:
        if kind == "json":
            r = httpx.post(base + "/v1/chat/completions", json=body(args, False), timeout=limit)
            return {"kind": kind, "status": r.status_code, "wall_s": time.monotonic() - t0}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body(args), timeout=limit) as r:
            status = r.status_code
            if kind == "never":
                time.sleep(args.never_s)
                return {"kind": kind, "status": status, "wall_s": None}
            stop_after = rng.randint(0, 6) if kind == "drop" else None
            for n, _ in enumerate(r.iter_lines()):
                if stop_after is not None and n >= stop_after:
                    return {"kind": kind, "status": status, "wall_s": None}
                if kind == "slow":
                    time.sleep(args.slow_s)
        return {"kind": kind, "status": status, "wall_s": time.monotonic() - t0}
    except httpx.HTTPError as exc:
        return {"kind": kind, "status": type(exc).__name__, "wall_s": time.monotonic() - t0}


class Locker(threading.Thread):
    """Locks the job store from another connection, on and off."""

    def __init__(self, db: Path, rng: random.Random):
        super().__init__(daemon=True)
        self.db, self.rng, self.halt, self.locks = db, rng, threading.Event(), 0

    def run(self):
        con = sqlite3.connect(str(self.db), isolation_level=None, timeout=30)
        while not self.halt.is_set():
            try:
                con.execute("BEGIN EXCLUSIVE")
                self.locks += 1
                self.halt.wait(self.rng.uniform(0.2, 1.5))
                con.execute("COMMIT")
            except sqlite3.Error:
                pass
            self.halt.wait(self.rng.uniform(0.2, 1.5))
        con.close()


class Jobs(threading.Thread):
    """Submits, continues and deletes jobs; remembers which ids must exist at the end."""

    def __init__(self, base: str, rng: random.Random, args):
        super().__init__(daemon=True)
        self.base, self.rng, self.args = base, rng, args
        self.halt = threading.Event()
        self.kept: list[str] = []
        self.deleted: list[str] = []
        self.errors: list[str] = []

    def run(self):
        with httpx.Client(timeout=60) as http:
            while not self.halt.is_set():
                try:
                    r = http.post(self.base + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": 4})
                    if r.status_code == 202:
                        self.kept.append(r.json()["id"])
                    else:
                        self.errors.append(f"POST {r.status_code}")
                    if self.kept and self.rng.random() < 0.3:
                        jid = self.kept.pop(self.rng.randrange(len(self.kept)))
                        d = http.delete(f"{self.base}/v1/jobs/{jid}")
                        (self.deleted if d.status_code == 200 else self.kept).append(jid)
                    if self.kept and self.rng.random() < 0.3:  # 409 unless failed/interrupted: both honest
                        c = http.post(f"{self.base}/v1/jobs/{self.rng.choice(self.kept)}/continue")
                        if c.status_code not in (200, 409):
                            self.errors.append(f"continue {c.status_code}")
                except httpx.HTTPError as exc:
                    self.errors.append(type(exc).__name__)
                self.halt.wait(self.rng.uniform(1.0, 3.0))  # jobs share the engine: a trickle, not a flood


class Health(threading.Thread):
    def __init__(self, base: str, proc):
        super().__init__(daemon=True)
        self.base, self.proc, self.halt, self.polls = base, proc, threading.Event(), []

    def run(self):
        while not self.halt.is_set():
            try:
                code = httpx.get(self.base + "/health", timeout=10).status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            self.polls.append((time.monotonic(), code, self.proc.poll() is None))
            self.halt.wait(0.5)


def rss(proc) -> int:
    return psutil.Process(proc.pid).memory_info().rss


def soak(engine: str, args) -> bool:
    rng = random.Random(args.seed)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "jobs.sqlite3"
        proc = start_server(engine, port, db, args)
        try:
            for _ in range(3):  # warm-up
                one_client(base, "full", rng, args)
            rss0 = rss(proc)
            health, jobs, locker = Health(base, proc), Jobs(base, rng, args), Locker(db, rng)
            for t in (health, jobs, locker):
                t.start()
            kinds = [rng.choice(KINDS) for _ in range(args.requests)]
            results, lock = [], threading.Lock()

            def worker(mine):
                for kind in mine:
                    out = one_client(base, kind, random.Random(rng.random()), args)
                    with lock:
                        results.append(out)

            threads = [threading.Thread(target=worker, args=(kinds[i::args.concurrency],))
                       for i in range(args.concurrency)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            jobs.halt.set()
            locker.halt.set()
            jobs.join(90)
            locker.join(10)
            # every job reaches a final state once the store is unlocked
            end = time.monotonic() + 120
            listed = []
            while time.monotonic() < end:
                listed = httpx.get(base + "/v1/jobs", timeout=60).json()["data"]
                if all(j["status"] not in ("queued", "running") for j in listed):
                    break
                time.sleep(1)
            time.sleep(3)
            health.halt.set()
            health.join(10)
            rss1 = rss(proc)
            ids = [j["id"] for j in listed]
            ok_codes = {200, 504}  # 504: stopped at its deadline and answered so (honest under overload)
            checks = {
                "health honest": all(alive and code == 200 for _, code, alive in health.polls) and proc.poll() is None,
                "no request past its deadline": all(r["wall_s"] is None or r["wall_s"] <= args.request_timeout + 15
                                                    for r in results),
                "readers answered 200 or 504": all(r["status"] in ok_codes for r in results if r["wall_s"] is not None),
                "no job lost or duplicated": (len(ids) == len(set(ids)) and set(jobs.kept) <= set(ids)
                                              and not set(jobs.deleted) & set(ids)
                                              and all(j["status"] not in ("queued", "running") for j in listed)),
                "memory within 10%": abs(rss1 - rss0) <= 0.10 * rss0,
            }
            by_kind = {k: sum(r["kind"] == k for r in results) for k in KINDS}
            bad = [r for r in results if r["wall_s"] is not None and r["status"] != 200]
            print(f"== {engine}: {len(results)} requests in {wall:.0f} s {by_kind}; store locked {locker.locks} times; "
                  f"jobs kept {len(jobs.kept)}, deleted {len(jobs.deleted)}, job client errors {jobs.errors[:5]}; "
                  f"health polls {len(health.polls)} (non-200: "
                  f"{sum(code != 200 for _, code, _ in health.polls)}); "
                  f"max reader wall {max([r['wall_s'] for r in results if r['wall_s']] or [0]):.1f} s; "
                  f"RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB; readers not 200: {len(bad)} {bad[:3]}")
            for name, ok in checks.items():
                print(f"   {'PASS' if ok else 'FAIL'}  {name}")
            return all(checks.values())
        finally:
            proc.send_signal(2)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    args = parse_args()
    ok = [soak(e, args) for e in args.engines]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
