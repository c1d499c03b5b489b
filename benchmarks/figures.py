"""What building a figure costs with the house template merged once (``workbench``) against the same template named
``"plotly_white+workbench"`` (plotly merges a ``+`` name again at every lookup).

Builds the same plotly express line chart and a graph-objects scatter, serialised to JSON as the run folder saves
them, alternately under each default, and prints the median seconds a pair takes and their ratio. Run:
``python benchmarks/figures.py --repeats 30``.
"""

import argparse
import statistics
import time

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from workbench.share import plots


def build(df: pd.DataFrame) -> float:
    t0 = time.perf_counter()
    px.line(df, x="x", y="y", color="arm", markers=True).update_layout(title="t").to_json()
    go.Figure(go.Scatter(x=df["x"], y=df["y"])).to_json()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    df = pd.DataFrame({"x": np.arange(20), "y": np.random.default_rng(0).random(20), "arm": ["a", "b"] * 10})
    pio.templates["house"] = plots.HOUSE          # the house settings alone, for the name plotly merges each time
    named = {"merged once (workbench)": "workbench", "merged at each lookup (plotly_white+house)": "plotly_white+house"}
    times: dict = {k: [] for k in named}
    build(df)
    for _ in range(args.repeats):
        for label, default in named.items():
            pio.templates.default = default
            times[label].append(build(df))
    for label, ts in times.items():
        print(f"{label}: {statistics.median(ts) * 1e3:.1f} ms a figure pair")
    a, b = (statistics.median(ts) for ts in times.values())
    print(f"ratio (merged once / merged at each lookup): {a / b:.2f}")


if __name__ == "__main__":
    main()
