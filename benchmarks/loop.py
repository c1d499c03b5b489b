"""The loop's fixed costs, old way vs now: what each notebook, request or test paid before it measured anything.

Side by side in one process, each the median of ``--repeats`` (run with nothing else on the machine):

- an HTTP client for one measured request: ``httpx.Client()`` (loads certifi's CA bundle into a new TLS context each
  time; the streaming reader built one per request inside the request's clock) vs
  :func:`workbench.load.client.http_client` (one TLS context per process);
- the end-of-sequence ids looked up after every ``generate``: ``tokenizer.get_vocab()`` (the whole 49k-entry dict)
  vs :func:`workbench.measure.generation.token_id` (one token);
- the command line's own imports before its first notebook: every experiment module (torch and transformers came
  with them; now they come with the first generation, in the kernel);
- the shared kernel's reset between notebooks: ``%reset -f`` and a full collection, without and with ``gc.freeze``
  (:func:`workbench.run.notebooks._reset_namespace`), in a kernel holding the model and the experiment modules;
- stopping a kernel holding the model: a polite shutdown vs at once (:func:`workbench.run.notebooks._shutdown`).

``python benchmarks/loop.py`` (~40 s on the 2-core build VM).
"""

import argparse
import statistics
import subprocess
import sys
import time


def _median_s(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _row(what: str, old: float, new: float) -> None:
    print(f"{what:<52} {old * 1e3:10.2f} ms {new * 1e3:10.3f} ms {old / new if new > 0 else float('inf'):8.0f}x")


def _imports_s(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def _kernel_costs(repeats: int) -> tuple[float, float, float, float]:
    """(reset without freeze, reset with freeze, polite shutdown, shutdown at once), seconds."""
    from jupyter_client.manager import KernelManager

    setup = ("from workbench.measure import models\nfrom workbench.run import results\nfrom workbench.share import plots, report\n"
             "from workbench.experiments import batch_size, scheduling, serving_load\n"
             "loaded = models.load_model('default', 'cpu', 'float32')")
    plain = "get_ipython().run_line_magic('reset', '-f')\nimport gc as _gc; _gc.collect(); del _gc"
    frozen = "get_ipython().run_line_magic('reset', '-f')\nimport gc as _gc; _gc.collect(); _gc.freeze(); del _gc"
    stops, resets = {}, {}
    for now in (False, True):
        km = KernelManager(kernel_name="python3")
        km.start_kernel()
        kc = km.blocking_client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)

        def run(code):
            kc.execute_interactive(code, store_history=False, timeout=300, output_hook=lambda msg: None)

        run(setup)
        code = frozen if now else plain
        run(code)  # the first reset of either kind pays one full collection
        times = []
        for _ in range(repeats):
            run("import pandas as pd; df = pd.DataFrame({'a': range(100000)})")  # a notebook's leftovers
            t0 = time.perf_counter()
            run(code)
            times.append(time.perf_counter() - t0)
        resets[now] = statistics.median(times)
        kc.stop_channels()
        t0 = time.perf_counter()
        km.shutdown_kernel(now=now)
        stops[now] = time.perf_counter() - t0
    return resets[False], resets[True], stops[False], stops[True]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    import httpx

    from workbench.load.client import http_client, ssl_context
    from workbench.measure import models
    from workbench.measure.generation import END_OF_TURN_TOKENS, token_id

    print(f"{'fixed cost':<52} {'old':>13} {'now':>13} {'ratio':>9}")
    ssl_context()

    def old_client():
        httpx.Client(trust_env=False, timeout=10).close()

    def new_client():
        http_client(10).close()

    _row("HTTP client for one request", _median_s(old_client, args.repeats), _median_s(new_client, args.repeats))
    tok = models.load_tokenizer_only("default").tokenizer
    _row("end-of-turn ids after a generate",
         _median_s(lambda: [vocab.get(n) for vocab in [tok.get_vocab()] for n in END_OF_TURN_TOKENS], args.repeats),
         _median_s(lambda: [token_id(tok, n) for n in END_OF_TURN_TOKENS], args.repeats))
    experiments = ("import importlib, pkgutil, workbench.cli, workbench.run.notebooks, workbench.experiments as E\n"
                   "for m in pkgutil.iter_modules(E.__path__): importlib.import_module('workbench.experiments.' + m.name)")
    _row("command line imports (every experiment module)",
         statistics.median(_imports_s(experiments + "\nimport torch, transformers") for _ in range(3)),
         statistics.median(_imports_s(experiments) for _ in range(3)))
    reset_plain, reset_frozen, stop_polite, stop_now = _kernel_costs(args.repeats)
    _row("shared kernel reset between notebooks", reset_plain, reset_frozen)
    _row("stopping a kernel that holds the model", stop_polite, stop_now)


if __name__ == "__main__":
    main()
