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

Then (issue 51), per engine, a second server with ``--max-queue 1`` (2 requests pending at most) for the races and
outages of jobs, with ``/health`` polled every 0.5 s throughout:

- **queued-job deletes** (``--delete-rounds``, 10): a long chat stream running, a job queued behind it (202), the job
  deleted (200): the engine's queue length is 0 at once, and the next chat request is admitted (200, never 429);
- **concurrent continues** (``--continue-rounds`` 10 x ``--continues`` 16): a job cut by a store outage (every write
  refused at once, as on a full disk, for longer than the writer's retries; it ends ``failed`` once the store is
  back) is continued by 16 clients at once: exactly one 200 (the rest 409) each round, and the job ends ``done``
  with ``output_tokens`` never above ``max_tokens``;
- **store outages longer than the writer's retries** while a job runs and chat requests are served: the disk "full"
  for ``--outage-s`` (the server process's file-size limit set to 0 from outside, ``prlimit``: every write fails at
  once, EFBIG, as ENOSPC does) and the store's lock held by another process (``BEGIN EXCLUSIVE``) for
  ``--lock-s`` (past the writer's 4 tries of SQLite's 10 s busy wait): chat answered 200 during both, and afterwards
  every job final (0 stranded), listed once (0 lost, 0 duplicated), continued to ``done`` with ``output_tokens`` =
  ``max_tokens``, and its event stream ending with ``[DONE]``.

``python benchmarks/fault_soak.py [--engines fifo static continuous] [--requests 300] [--concurrency 8]``
(small: ``--requests 24 --concurrency 4 --engines fifo --continue-rounds 2 --delete-rounds 2 --lock-s 45``;
``--skip-load`` runs only the issue-51 part). Figures go to stdout; nothing is written elsewhere.
"""

from __future__ import annotations

import argparse
import collections
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
    ap.add_argument("--delete-rounds", type=int, default=10, help="queued-job deletes under --max-queue 1")
    ap.add_argument("--continue-rounds", type=int, default=10, help="rounds of concurrent continues of one job")
    ap.add_argument("--continues", type=int, default=16, help="continues sent at once each round")
    ap.add_argument("--job-tokens", type=int, default=48, help="max_tokens of the jobs continued (ignore_eos)")
    ap.add_argument("--long-tokens", type=int, default=64, help="max_tokens of the chat a deleted job queues behind")
    ap.add_argument("--outage-s", type=float, default=5.0, help="seconds of 'disk full' (every write fails at once)")
    ap.add_argument("--lock-s", type=float, default=45.0, help="seconds the store's lock is held by another process")
    ap.add_argument("--skip-load", action="store_true", help="only the races and outages (issue 51)")
    return ap.parse_args()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(engine: str, port: int, db: Path, args, max_queue: int = 256) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "workbench.serving.server", "--port", str(port), "--engine", engine,
           "--jobs-db", str(db), "--request-timeout", str(args.request_timeout), "--max-queue", str(max_queue),
           "--shutdown-timeout", "5"]
    # stderr is a pipe (never a file: a file-size limit set on the server would refuse its log lines too), drained
    # by a thread so the server never blocks on a full pipe while it logs the outages' warnings
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.log = collections.deque(maxlen=200)
    threading.Thread(target=lambda: [proc.log.append(line) for line in proc.stderr], daemon=True).start()
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            time.sleep(0.5)
            raise SystemExit(f"{engine}: the server exited at start: {''.join(proc.log)[-2000:]}")
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


# ----------------------------------------------------------------------------- issue 51: races and outages


class DiskFull:
    """While inside: every file write of the server process fails at once (its RLIMIT_FSIZE soft limit 0, set from
    outside with prlimit: EFBIG, as a full disk's ENOSPC fails at once). Its stderr is a pipe, not a file."""

    def __init__(self, proc):
        self.p = psutil.Process(proc.pid)

    def __enter__(self):
        self.saved = self.p.rlimit(psutil.RLIMIT_FSIZE)
        self.p.rlimit(psutil.RLIMIT_FSIZE, (0, self.saved[1]))
        return self

    def __exit__(self, *exc):
        self.p.rlimit(psutil.RLIMIT_FSIZE, self.saved)


def held_lock(db: Path, seconds: float, started: threading.Event) -> None:
    """Hold the store's write lock from another connection (another process's view) for ``seconds``."""
    con = sqlite3.connect(str(db), isolation_level=None, timeout=60)
    con.execute("BEGIN EXCLUSIVE")
    started.set()
    time.sleep(seconds)
    con.execute("COMMIT")
    con.close()


def job_status(http, base, jid) -> dict:
    return http.get(f"{base}/v1/jobs/{jid}").json()


def wait_job(http, base, jid, until, timeout: float = 120.0) -> dict:
    end = time.monotonic() + timeout
    st = {}
    while time.monotonic() < end:
        st = job_status(http, base, jid)
        if until(st):
            return st
        time.sleep(0.1)
    return st


def final(st) -> bool:
    return st.get("status") not in ("queued", "running")


def queue_length(http, base) -> float:
    from workbench.serving.monitoring import scrape

    return scrape(http.get(base + "/metrics").text).get("workbench_queue_length", float("nan"))


def stream_ends(base, jid, timeout: float = 60.0) -> bool:
    """The job's event stream ends with ``[DONE]`` within ``timeout``."""
    try:
        with httpx.stream("GET", f"{base}/v1/jobs/{jid}/events", timeout=timeout) as r:
            last = None
            for line in r.iter_lines():
                if line.startswith("data: "):
                    last = line
            return last == "data: [DONE]"
    except httpx.HTTPError:
        return False


def post_job(http, base, body: dict, timeout: float = 300.0) -> str:
    """Submit a job, waiting out a full engine (429: jobs share the chat limit) or a store that cannot write now
    (503); its id."""
    end = time.monotonic() + timeout
    while True:
        r = http.post(base + "/v1/jobs", json=body)
        if r.status_code == 202:
            return r.json()["id"]
        if r.status_code not in (429, 503) or time.monotonic() > end:
            raise RuntimeError(f"POST /v1/jobs: {r.status_code} {r.text[:200]}")
        time.sleep(float(r.headers.get("Retry-After", "1")))


def cut_job(http, base, proc, args, hold_s: float = 1.5, tries: int = 5) -> tuple[str, dict]:
    """A job cut by a 'disk full' outage longer than the writer's retries: submitted, run to 4 stored tokens, the disk
    full for ``hold_s`` (its writes fail, its run stops, its end waits in the writer), the disk back: its end lands
    (``failed``, continuable). A job whose generation had ended before the outage took hold ends ``done`` (nothing of
    it is missing: the server is right) and is no cut job: it is deleted and another tried (``uncut`` counts them)."""
    uncut = 0
    for _ in range(tries):
        jid = post_job(http, base, {"messages": MESSAGES, "max_tokens": args.job_tokens, "ignore_eos": True})
        wait_job(http, base, jid, lambda s: s.get("output_tokens", 0) >= 4 or final(s))
        with DiskFull(proc):
            time.sleep(hold_s)
            during = job_status(http, base, jid)
        after = wait_job(http, base, jid, final, 60)
        if after.get("status") != "done":
            break
        uncut += 1
        http.delete(f"{base}/v1/jobs/{jid}")
    return jid, {"during": during["status"], "after": after, "uncut": uncut}


def races_and_outages(engine: str, args) -> bool:
    """The issue-51 part on a ``--max-queue 1`` server (module docstring); prints its figures and checks."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "jobs.sqlite3"
        proc = start_server(engine, port, db, args, max_queue=1)
        health = Health(base, proc)
        health.start()
        figures, jobs_made, deleted = {}, [], []
        dels, qlen, chat_codes, rounds_ok, over, outages = [], [], [], 0, 0, {}
        stranded, lost, ids, dup, ends = [], [], [], 0, 0
        try:
            with httpx.Client(timeout=120) as http:
                one_client(base, "full", random.Random(0), args)  # warm-up
                # -- deletes of queued jobs: the place is free at once
                dels, qlen, chat_codes, settle = [], [], [], []
                for _ in range(args.delete_rounds):
                    started = threading.Event()

                    def long_chat():
                        b = {**body(args), "max_tokens": args.long_tokens, "ignore_eos": True}
                        with httpx.stream("POST", base + "/v1/chat/completions", json=b, timeout=120) as s:
                            for _ in s.iter_lines():
                                started.set()
                        started.set()

                    t = threading.Thread(target=long_chat, daemon=True)
                    t.start()
                    started.wait(60)
                    r = http.post(base + "/v1/jobs", json={"messages": MESSAGES, "max_tokens": 4})
                    if r.status_code != 202:
                        dels.append(f"POST {r.status_code}")
                        t.join(600)
                        continue
                    jid = r.json()["id"]
                    t0 = time.monotonic()
                    dels.append(http.delete(f"{base}/v1/jobs/{jid}").status_code)
                    qlen.append(queue_length(http, base))
                    deleted.append(jid)
                    from workbench.serving.monitoring import scrape

                    while time.monotonic() - t0 < 5:  # the deleted job's request gone from the engine
                        m = scrape(http.get(base + "/metrics").text)
                        if m["workbench_num_requests_running"] + m["workbench_num_requests_waiting"] <= 1:
                            break
                        time.sleep(0.01)
                    settle.append(time.monotonic() - t0)
                    chat_codes.append(http.post(base + "/v1/chat/completions", json=body(args, False)).status_code)
                    t.join(600)
                figures["deletes"] = {"codes": collections.Counter(map(str, dels)), "queue_after": collections.Counter(qlen),
                                      "next_chat": collections.Counter(chat_codes),
                                      "settle_ms_max": round(1e3 * max(settle or [0]), 1)}
                # -- concurrent continues of one job cut by an outage
                accepted, conflicts, over, rounds_ok, continue_other, uncut, bad_rounds = [], [], 0, 0, [], 0, []
                for _ in range(args.continue_rounds):
                    jid, cut = cut_job(http, base, proc, args)
                    jobs_made.append(jid)
                    barrier, codes = threading.Barrier(args.continues), []

                    def one():
                        barrier.wait()
                        try:
                            codes.append(httpx.post(f"{base}/v1/jobs/{jid}/continue", timeout=60).status_code)
                        except httpx.HTTPError as exc:
                            codes.append(type(exc).__name__)

                    ts = [threading.Thread(target=one) for _ in range(args.continues)]
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join(90)
                    st = wait_job(http, base, jid, final, 180)
                    accepted.append(codes.count(200))
                    conflicts.append(codes.count(409))
                    continue_other += [c for c in codes if c not in (200, 409)]
                    over += st.get("output_tokens", 0) > st.get("max_tokens", 0)
                    uncut += cut["uncut"]
                    ok_round = (codes.count(200) == 1 and st.get("status") == "done"
                                and st.get("output_tokens") == args.job_tokens and cut["after"].get("status") == "failed")
                    rounds_ok += ok_round
                    if not ok_round:
                        bad_rounds.append({"cut": {k: cut["after"].get(k) for k in ("status", "output_tokens", "error")},
                                           "codes": sorted(map(str, codes)), "end": {k: st.get(k) for k in (
                                               "status", "output_tokens", "runs")}})
                figures["continues"] = {"rounds": args.continue_rounds, "accepted_per_round": accepted,
                                        "conflicts_per_round": conflicts, "other": continue_other,
                                        "over_max_tokens": over, "rounds_ok": rounds_ok,
                                        "jobs_done_before_the_cut": uncut, "bad_rounds": bad_rounds}
                # -- outages longer than the writer's retries, with a job running and chat served
                outages = {}
                for kind in ("disk_full", "held_lock"):
                    jid = post_job(http, base, {"messages": MESSAGES, "max_tokens": args.job_tokens,
                                                "ignore_eos": True})
                    jobs_made.append(jid)
                    wait_job(http, base, jid, lambda s: s.get("output_tokens", 0) >= 4 or final(s))
                    t0 = time.monotonic()
                    if kind == "disk_full":
                        with DiskFull(proc):
                            time.sleep(1.0)
                            c0 = time.monotonic()
                            code = http.post(base + "/v1/chat/completions", json=body(args, False)).status_code
                            chat_s = time.monotonic() - c0
                            time.sleep(max(0.0, args.outage_s - (time.monotonic() - t0)))
                            during = job_status(http, base, jid)["status"]
                    else:
                        started = threading.Event()
                        locker = threading.Thread(target=held_lock, args=(db, args.lock_s, started), daemon=True)
                        locker.start()
                        started.wait(30)
                        time.sleep(1.0)
                        c0 = time.monotonic()
                        code = http.post(base + "/v1/chat/completions", json=body(args, False)).status_code
                        chat_s = time.monotonic() - c0
                        during = job_status(http, base, jid)["status"]
                        locker.join(args.lock_s + 60)
                    st = wait_job(http, base, jid, final, 120)
                    landed_s = time.monotonic() - t0
                    if st.get("status") != "done":  # cut by the outage: continued to its end
                        http.post(f"{base}/v1/jobs/{jid}/continue")
                        st = wait_job(http, base, jid, final, 180)
                    outages[kind] = {"chat": code, "chat_s": round(chat_s, 2), "job_during": during,
                                     "final_landed_s": round(landed_s, 1), "job_end": st.get("status"),
                                     "output_tokens": st.get("output_tokens"), "runs": st.get("runs")}
                figures["outages"] = outages
                # -- nothing stranded, lost or duplicated; every stream ends
                listed = http.get(base + "/v1/jobs").json()["data"]
                ids = [j["id"] for j in listed]
                stranded = [j["id"] for j in listed if not final(j)]
                lost = sorted(set(jobs_made) - set(ids))
                dup = len(ids) - len(set(ids)) + sum(j["output_tokens"] > j["max_tokens"] for j in listed)
                ends = sum(stream_ends(base, jid) for jid in jobs_made)
                figures["jobs"] = {"made": len(jobs_made), "stranded": len(stranded), "lost": len(lost),
                                   "duplicated": dup, "deleted_still_listed": len(set(deleted) & set(ids)),
                                   "streams_ended": ends}
        finally:
            health.halt.set()
            health.join(10)
            proc.send_signal(2)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    polls = health.polls
    checks = {
        "deleted queued job frees its place (queue 0 at once, next chat 200)":
            all(c == 200 for c in dels) and all(q == 0 for q in qlen) and all(c == 200 for c in chat_codes),
        "one continue accepted per round, output never above max_tokens":
            rounds_ok == args.continue_rounds and over == 0,
        "chat answered during the outages": all(o["chat"] == 200 for o in outages.values()),
        "0 jobs stranded, 0 lost, 0 duplicated; every job done; every stream ends":
            not stranded and not lost and dup == 0 and not set(deleted) & set(ids) and ends == len(jobs_made)
            and all(o["job_end"] == "done" and o["output_tokens"] == args.job_tokens for o in outages.values()),
        "health honest throughout": all(alive and code == 200 for _, code, alive in polls) and bool(polls),
    }
    print(f"== {engine} (--max-queue 1, issue 51): {json.dumps(figures, default=str)}; health polls {len(polls)} "
          f"(non-200: {sum(code != 200 for _, code, _ in polls)})")
    for name, ok in checks.items():
        print(f"   {'PASS' if ok else 'FAIL'}  {name}")
    if not all(checks.values()):
        print("   server log tail:\n" + "".join(list(proc.log)[-30:]))
    return all(checks.values())


def main() -> int:
    args = parse_args()
    ok = []
    for e in args.engines:
        if not args.skip_load:
            ok.append(soak(e, args))
        ok.append(races_and_outages(e, args))
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
