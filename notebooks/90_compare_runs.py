# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   language_info:
#     name: python
#     pygments_lexer: ipython3
#   workbench:
#     config: workbench.share.report:CompareConfig
# ---

# %% [markdown]
# # 90 Compare runs
# Two (or more) run folders side by side in pandas: what changed in the environment, and how median and p99 TTFT, throughput and goodput moved per point. `workbench report RUN_A RUN_B` makes the same comparison as a shareable HTML page.

# %% tags=["parameters"]
runs: list = []  # run folders or globs to compare; empty: the two newest runs under results/
experiment: str = ""  # restrict to one experiment; "" for all
run_dir: str = ""  # unused (a comparison writes no run); kept for the CLI
resume: bool = False  # unused; kept for the CLI

# %%
import plotly.express as px

from workbench.share import plots, report
from workbench.run import results

cfg = report.CompareConfig.from_namespace(globals())
run_dirs = cfg.run_dirs()  # reads only: a comparison opens no run folder
labels = report.run_labels(run_dirs)
labels

# %%
points = results.load(run_dirs, table="points")
requests = results.load(run_dirs, table="requests")
if cfg.experiment:
    points = points[points["experiment"] == cfg.experiment]
    requests = requests[requests["experiment"] == cfg.experiment]
points["run"] = points["run_id"].map(labels)
requests["run"] = requests["run_id"].map(labels)
report.environments(run_dirs)  # rows where `differs` is True explain most surprises

# %% [markdown]
# Per point, each metric per run (columns) and the change of each run vs the first:

# %%
ok = plots.ok_points(points)
wide = ok.pivot_table(index="point_id", columns="run", values=report.DELTA_METRICS)  # drops all-empty metrics
first = sorted(labels.values())[0]
for m in [m for m in report.DELTA_METRICS if m in wide]:
    for run in wide[m].columns.drop(first):
        wide[(m + " change", run)] = wide[(m, run)] / wide[(m, first)] - 1
wide

# %% [markdown]
# Per request, pooled over each run's points (medians):

# %%
done = requests[requests["output_tokens"] >= 1]
done.groupby(["run", "experiment"])[["ttft_s", "tpot_s", "e2e_s", "decode_tps"]].median()

# %%
fig = px.scatter(ok, x="output_throughput_tps", y="ttft_s_p50", color="run", symbol="experiment",
                 hover_name="point_id", labels=plots.labels("output_throughput_tps", "ttft_s_p50"),
                 title="TTFT vs throughput, per run")
fig.show()
