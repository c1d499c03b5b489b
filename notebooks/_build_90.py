"""Write notebooks/90_compare_runs.ipynb (outputs empty, parameters cell tagged). Run: python notebooks/_build_90.py"""
import _nb
import nbformat as nbf

cells = [
    nbf.v4.new_markdown_cell(
        "# 90 Compare runs\n"
        "Two (or more) run folders side by side in pandas: what changed in the environment, and how median and "
        "p99 TTFT, throughput and goodput moved per point. `workbench report RUN_A RUN_B` makes the same "
        "comparison as a shareable HTML page."
    ),
    nbf.v4.new_code_cell(
        "runs: list = []  # run folders or globs to compare; empty: the two newest runs under results/\n"
        'experiment: str = ""  # restrict to one experiment; "" for all\n'
        'run_dir: str = ""  # unused (a comparison writes no run); kept for the CLI\n'
        "resume: bool = False  # unused; kept for the CLI",
        metadata={"tags": ["parameters"]},
    ),
    nbf.v4.new_code_cell(
        "import plotly.express as px\n\n"
        "from workbench import plots, report, results\n\n"
        "cfg = report.CompareConfig.from_namespace(globals())\n"
        "run_dirs = cfg.run_dirs()  # reads only: a comparison opens no run folder\n"
        "labels = report.run_labels(run_dirs)\n"
        "labels"
    ),
    nbf.v4.new_code_cell(
        "points = results.load(run_dirs, table=\"points\")\n"
        "requests = results.load(run_dirs, table=\"requests\")\n"
        "if cfg.experiment:\n"
        "    points = points[points[\"experiment\"] == cfg.experiment]\n"
        "    requests = requests[requests[\"experiment\"] == cfg.experiment]\n"
        "points[\"run\"] = points[\"run_id\"].map(labels)\n"
        "requests[\"run\"] = requests[\"run_id\"].map(labels)\n"
        "report.environments(run_dirs)  # rows where `differs` is True explain most surprises"
    ),
    nbf.v4.new_markdown_cell("Per point, each metric per run (columns) and the change of each run vs the first:"),
    nbf.v4.new_code_cell(
        "ok = plots.ok_points(points)\n"
        "wide = ok.pivot_table(index=\"point_id\", columns=\"run\", values=report.DELTA_METRICS)\n"
        "first = sorted(labels.values())[0]\n"
        "for m in report.DELTA_METRICS:\n"
        "    for run in wide[m].columns.drop(first):\n"
        "        wide[(m + \" change\", run)] = wide[(m, run)] / wide[(m, first)] - 1\n"
        "wide"
    ),
    nbf.v4.new_markdown_cell("Per request, pooled over each run's points (medians):"),
    nbf.v4.new_code_cell(
        "done = requests[requests[\"output_tokens\"] >= 1]\n"
        "done.groupby([\"run\", \"experiment\"])[[\"ttft_s\", \"tpot_s\", \"e2e_s\", \"decode_tps\"]].median()"
    ),
    nbf.v4.new_code_cell(
        "fig = px.scatter(ok, x=\"output_throughput_tps\", y=\"ttft_s_p50\", color=\"run\", symbol=\"experiment\",\n"
        "                 hover_name=\"point_id\", labels=plots.LABELS, title=\"TTFT vs throughput, per run\")\n"
        "fig.show()"
    ),
]
_nb.write(cells, "90_compare_runs.ipynb", "workbench.report:CompareConfig")
