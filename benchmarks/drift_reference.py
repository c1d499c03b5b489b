"""How noisy is the drift reference itself? Spread of back-to-back references on a quiet machine.

The sweep loop (:func:`workbench.run.drift.reference_tpot_s`) measures a fixed request (64-token prompt,
8 new tokens, batch 1, greedy) 3 times before and after every sweep and marks the sweep invalid when the
two differ by more than :data:`workbench.run.drift.DRIFT_LIMIT`. An estimator whose own spread on a quiet
machine approaches that limit marks quiet sweeps invalid. This takes ``--references`` references back to
back (5 runs each) and prints, per estimator, min/max spread, coefficient of variation and the worst
consecutive pair (the drift a sweep of zero length would show). Run with nothing else on the machine:
``python benchmarks/drift_reference.py --references 15`` (~70 s on the 2-core build VM).
"""

import argparse
import statistics
import time

from workbench.inputs.prompts import build_batch
from workbench.measure import models
from workbench.measure.generation import GenerationSettings, generate_measured, warm_up
from workbench.run import drift


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--references", type=int, default=15)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    loaded = models.load_model("default", args.device, "auto")
    prompts = build_batch(loaded.tokenizer, 1, 64)
    settings = GenerationSettings(max_new_tokens=8, ignore_eos=True)
    warm_up(loaded, prompts, settings, 1)
    est: dict[str, list[float]] = {"median of 3 TPOT": [], "fastest of 3 TPOT (used)": [],
                                   "median of pooled ITL (3 runs)": [], "fastest of 5 TPOT": []}
    t0 = time.perf_counter()
    for _ in range(args.references):
        recs = [generate_measured(loaded, prompts, settings).records[0] for _ in range(5)]
        tpot = [r["tpot_s"] for r in recs]
        est["median of 3 TPOT"].append(statistics.median(tpot[:3]))
        est["fastest of 3 TPOT (used)"].append(min(tpot[:3]))
        est["median of pooled ITL (3 runs)"].append(statistics.median([x for r in recs[:3] for x in r["itl_s"]]))
        est["fastest of 5 TPOT"].append(min(tpot))
    print(f"{args.references} references in {time.perf_counter() - t0:.0f} s; drift limit {drift.DRIFT_LIMIT:.0%}")
    for name, v in est.items():
        pair = max(abs(b / a - 1) for a, b in zip(v, v[1:]))
        print(f"{name:32s} {min(v) * 1e3:6.1f}-{max(v) * 1e3:6.1f} ms  max/min-1 {max(v) / min(v) - 1:5.1%}  "
              f"cv {statistics.pstdev(v) / statistics.mean(v):5.1%}  worst consecutive pair {pair:5.1%}")


if __name__ == "__main__":
    main()
