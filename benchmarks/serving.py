"""Serving under load, measured side by side in one run (issue 13).

(a) SLO capacity: per engine (``fifo``, ``static``, ``continuous``), the highest Poisson arrival rate whose
    SLO attainment stays >= the target, by bisection (:func:`workbench.experiments.serving_load.search_engines`,
    :func:`workbench.stats.slo.search_rate`), printed with the synchronous and maximum request rates, the knee (arrival
    vs completion rate of the search's own measurements) and the ratios ``static / fifo`` and
    ``continuous / fifo``. The default SLO is MLPerf's Llama-2-70B Server limit (TTFT 2 s, TPOT 200 ms), one
    the 135M model on a CPU can meet at low rates; ``--slo custom --ttft-s X --tpot-s Y`` takes any pair.
(b) Server overhead at concurrency 1: output tokens/s through the OpenAI-compatible server (``fifo`` engine,
    streaming, loopback HTTP, the load generator's ``synchronous`` profile; the server runs in its own process,
    ``python -m workbench.serving.server``, so the client's parsing does not share its interpreter lock) over in-process
    :func:`workbench.measure.generation.generate_measured` on the same prompts and ``max_new_tokens``, alternated per
    repeat (goal: >= 0.95). ``benchmarks/overhead.py`` measures ``generate_measured`` against plain
    ``model.generate``.
(c) Client cross-check: the official ``openai`` client (:func:`workbench.load.client.stream_chat`, a thread
    pool of ``--concurrency`` workers: a closed loop) against the built-in load generator (``concurrency``
    profile, :func:`workbench.load.senders.http_sender`) on the same server and prompts: TTFT p50 ratio (goal:
    within 5%) and output token totals and texts (must be equal: greedy, ``ignore_eos``).

Every figure comes from the library (:func:`workbench.stats.metrics.percentiles`, request rows built by
:func:`workbench.stats.metrics.request_timing`). Run on a quiet machine (nothing else on the cores):
``OMP_WAIT_POLICY=PASSIVE python benchmarks/serving.py`` (estimated 4 minutes on a 2-core CPU, at most 6) or
``--quick`` (about 1 minute; two search measurements per engine, one repeat: a smoke run, not a result).
"""

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from workbench.experiments import serving_load
from workbench.inputs import prompts
from workbench.load import load, senders
from workbench.load.client import openai_client, stream_chat
from workbench.measure import models
from workbench.measure.generation import GenerationSettings, generate_measured
from workbench.serving.options import ENGINES
from workbench.stats import metrics, slo

QUICK = dict(requests=4, search_steps=2, overhead_prompts=2, overhead_tokens=16, overhead_repeats=1,
             crosscheck_requests=4, crosscheck_repeats=1)


def _yaml_mapping(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 1 minute: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--slo", default="mlperf_server", choices=list(slo.PRESETS) + ["custom"])
    ap.add_argument("--ttft-s", type=float, default=None, help="custom SLO: TTFT limit (s)")
    ap.add_argument("--tpot-s", type=float, default=None, help="custom SLO: TPOT limit (s)")
    ap.add_argument("--target", type=float, default=0.9, help="SLO attainment to reach (share of requests)")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES),
                    help="(a) built-in engines, and 'endpoint' for --endpoint")
    ap.add_argument("--endpoint", default=None, type=_yaml_mapping,
                    help="(a) an external OpenAI-compatible server, a YAML mapping: "
                         "'{url: http://host:8000, model: NAME, api_key_env: VAR, name: LABEL}'")
    ap.add_argument("--transport", default="inprocess", choices=list(serving_load.TRANSPORTS), help="for (a)")
    ap.add_argument("--arrival", default="poisson", choices=list(serving_load.ARRIVALS))
    ap.add_argument("--requests", type=int, default=8, help="(a) requests per search measurement")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=6, help="(a) and (c) output tokens per request")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--search-steps", type=int, default=4, help="(a) bisection measurements per engine")
    ap.add_argument("--tolerance", type=float, default=0.15, help="(a) relative width of the final bracket")
    ap.add_argument("--overhead-prompts", type=int, default=3)
    ap.add_argument("--overhead-tokens", type=int, default=32)
    ap.add_argument("--overhead-repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=2, help="(c) requests in flight")
    ap.add_argument("--crosscheck-requests", type=int, default=8)
    ap.add_argument("--crosscheck-repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.ttft_s is not None or args.tpot_s is not None:
        args.slo = "custom"
    if args.slo == "custom" and (args.ttft_s is None or args.tpot_s is None):
        ap.error("--slo custom needs both --ttft-s and --tpot-s")
    return args


def slo_capacity(loaded, args) -> None:
    """(a): the search per engine, then the ratios over fifo."""
    limits = slo.get(args.slo, args.ttft_s, args.tpot_s)
    cfg = serving_load.Config(
        engines=args.engines, endpoint=args.endpoint, transport=args.transport, requests_per_point=args.requests,
        prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens, max_batch_size=args.max_batch_size,
        arrival=args.arrival, slo_presets=[], slo_ttft_s=args.ttft_s or 2.0, slo_tpot_s=args.tpot_s or 0.2,
        attainment_target=args.target, search=True, search_slo=args.slo, search_steps=args.search_steps,
        search_tolerance=args.tolerance, warmup=1, seed=args.seed, device="cpu", dtype="float32")
    print(f"(a) SLO {limits.name}: TTFT <= {limits.ttft_s} s, TPOT <= {limits.tpot_s} s, attainment >= "
          f"{args.target:.0%}; {args.arrival} arrivals, {args.requests} requests x {args.prompt_tokens} prompt + "
          f"{args.max_new_tokens} output tokens per measurement, max_batch_size {args.max_batch_size}, "
          f"{args.transport}", flush=True)
    t0 = time.perf_counter()
    table = serving_load.search_engines(cfg, loaded).set_index("engine")
    for e, r in table.iterrows():
        hi = "inf (highest tried still met it)" if r["bracket_high_rps"] == float("inf") else f"{r['bracket_high_rps']:.3f}"
        print(f"    {e:10s} sync {r['sync_rps']:.3f} req/s, max throughput {r['max_throughput_rps']:.3f} req/s, "
              f"knee {r['knee_rps']:.3f} req/s, max SLO rate {r['max_rate_rps']:.3f} req/s "
              f"[bracket {r['bracket_low_rps']:.3f} - {hi}, {r['measurements']} measurements]", flush=True)
    if "fifo" in table.index:
        base = table.loc["fifo", "max_rate_rps"]
        for e in [e for e in table.index if e != "fifo"]:
            ratio = table.loc[e, "max_rate_rps"] / base if base > 0 else float("nan")
            note = "" if base > 0 else " (fifo met the SLO at no tried rate)"
            print(f"    max SLO rate {e} / fifo: {ratio:.2f}{note}; max throughput {e} / fifo: "
                  f"{table.loc[e, 'max_throughput_rps'] / table.loc['fifo', 'max_throughput_rps']:.2f}", flush=True)
    print(f"    ({time.perf_counter() - t0:.0f} s)", flush=True)


class ServerProcess:
    """``python -m workbench.serving.server --engine fifo --early-headers`` on a free loopback port, CPU float32;
    ``base_url`` once ``/health`` answers. Its log goes to a temporary file (printed if it fails to start)."""

    def __init__(self, engine: str = "fifo", timeout_s: float = 180.0):
        import socket
        import subprocess
        import sys
        import tempfile

        import httpx

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "workbench.serving.server", "--engine", engine,
                                      "--early-headers", "--port", str(port), "--device", "cpu", "--dtype", "float32"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        end = time.perf_counter() + timeout_s
        with httpx.Client(trust_env=False, timeout=2) as http:
            while True:
                try:
                    if http.get(self.base_url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None or time.perf_counter() > end:
                    self.stop()
                    raise RuntimeError(f"server did not start: {open(self.log.name).read()[-2000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - it would not stop: end it
            self.proc.kill()
        os.unlink(self.log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def server_overhead(loaded, srv, args) -> None:
    """(b): output tokens/s over HTTP at concurrency 1 over in-process generate_measured."""
    texts = prompts.build_batch(loaded.tokenizer, args.overhead_prompts, args.prompt_tokens)
    n_new = args.overhead_tokens
    settings = GenerationSettings(max_new_tokens=n_new, ignore_eos=True)
    send = senders.http_sender(srv.base_url)
    specs = [load.RequestSpec(t, n_new) for t in texts]
    generate_measured(loaded, [texts[0]], settings)  # warm-up, both paths
    load.run_load(send, specs[:1], "synchronous")
    inproc, http = [], []
    t_start = time.perf_counter()
    for _ in range(args.overhead_repeats):  # alternate so drift hits both equally
        t0, n = time.perf_counter(), 0
        for t in texts:
            n += sum(r["output_tokens"] for r in generate_measured(loaded, [t], settings).records)
        inproc.append(n / (time.perf_counter() - t0))
        res = load.run_load(send, specs, "synchronous")
        if any(r["error"] for r in res.rows):
            raise RuntimeError(next(r["error"] for r in res.rows if r["error"]))
        http.append(sum(r["output_tokens"] for r in res.rows) / res.summary["wall_s"])
    ratio = statistics.median(http) / statistics.median(inproc)
    print(f"(b) server overhead at concurrency 1 ({len(texts)} prompts x {n_new} tokens, {args.overhead_repeats} "
          f"repeats): HTTP {statistics.median(http):.1f} tok/s, in-process generate {statistics.median(inproc):.1f} "
          f"tok/s, ratio {ratio:.3f} (goal >= 0.95) ({time.perf_counter() - t_start:.0f} s)", flush=True)


def client_crosscheck(loaded, srv, args) -> None:
    """(c): the openai client and the load generator at the same concurrency on the same prompts."""
    texts = prompts.build_batch(loaded.tokenizer, args.crosscheck_requests, args.prompt_tokens)
    n_new, conc = args.max_new_tokens, args.concurrency
    client = openai_client(srv.base_url)
    send = senders.http_sender(srv.base_url)
    specs = [load.RequestSpec(t, n_new) for t in texts]

    def with_openai():
        with ThreadPoolExecutor(max_workers=conc) as pool:  # each worker sends its next request when free
            return list(pool.map(lambda t: stream_chat(client, t, n_new, ignore_eos=True, tokenizer=loaded.tokenizer),
                                 texts))

    def with_builtin():
        res = load.run_load(send, specs, "concurrency", concurrency=conc)
        return sorted(res.rows, key=lambda r: r["request_id"])

    stream_chat(client, texts[0], n_new, ignore_eos=True)  # warm-up
    t_start = time.perf_counter()
    oa_ttft, bi_ttft, equal_tokens, equal_texts, totals = [], [], True, True, []
    for rep in range(args.crosscheck_repeats):  # alternate which client goes first
        runs = [with_openai, with_builtin] if rep % 2 == 0 else [with_builtin, with_openai]
        out = {f.__name__: f() for f in runs}
        oa, bi = out["with_openai"], out["with_builtin"]
        oa_ttft += [r["ttft_s"] for r in oa]
        bi_ttft += [r["ttft_s"] for r in bi]
        t_oa, t_bi = sum(r["output_tokens"] for r in oa), sum(r["output_tokens"] for r in bi)
        totals.append((t_oa, t_bi))
        equal_tokens &= t_oa == t_bi
        equal_texts &= [r["text"] for r in oa] == [r["text"] for r in bi]
    p_oa = metrics.percentiles(oa_ttft, (50,))["p50"]
    p_bi = metrics.percentiles(bi_ttft, (50,))["p50"]
    print(f"(c) client cross-check at concurrency {conc} ({len(texts)} requests x {n_new} tokens, "
          f"{args.crosscheck_repeats} repeats): TTFT p50 openai {p_oa * 1e3:.1f} ms, load generator "
          f"{p_bi * 1e3:.1f} ms, ratio {p_bi / p_oa:.3f} (goal within 5%); output tokens (openai, load generator) "
          f"{totals}: {'equal' if equal_tokens else 'DIFFERENT'}; texts {'equal' if equal_texts else 'DIFFERENT'} "
          f"({time.perf_counter() - t_start:.0f} s)", flush=True)


def main() -> None:
    args = parse_args()
    t0 = time.perf_counter()
    loaded = models.load_model("default", "cpu", "float32")
    print(f"device {loaded.info.device_name}, torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY "
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, cpus {os.cpu_count()}, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    slo_capacity(loaded, args)
    with ServerProcess("fifo") as srv:
        server_overhead(loaded, srv, args)
        client_crosscheck(loaded, srv, args)
    print(f"total {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
