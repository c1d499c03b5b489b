"""$/Mtok and interactivity: checked by hand on one point; the Pareto figure for batch size and serving; bad prices."""
import pandas as pd
import pytest

from tests.share.test_report import fake_point, make_run
from workbench import cli
from workbench.errors import ParameterError
from workbench.run import results
from workbench.share import cost, plots, report, run_summary


def test_usd_per_mtok_by_hand_on_one_point():
    # fake_point: 2 requests x 5 output tokens in 1 s -> 10 tokens/s; 2 x 64 prompt tokens -> 128 tokens/s.
    # At 2.88 USD per device-hour = 0.0008 USD/s: output 0.0008 / 10 x 1e6 = 80 USD/Mtok; input 0.0008 / 128 x 1e6 = 6.25.
    run = make_run([fake_point(batch_size=1)])
    out = report.build_report(run, figures="none", price_per_hour=2.88)
    pts = report._points_with_cost(run)
    p = pts.iloc[0]
    assert p["output_throughput_tps"] == 10.0 and p["input_throughput_tps"] == 128.0
    assert p["usd_per_mtok_output"] == pytest.approx(80.0)
    assert p["usd_per_mtok_input"] == pytest.approx(6.25)
    assert p["output_tps_per_user"] == pytest.approx(10.0)        # decode_tps_p50: TPOT 0.1 s -> 10 tokens/s
    assert p["output_tps_per_device"] == pytest.approx(10.0)
    page = out.read_text()
    assert "usd_per_mtok_output" in page and "output_tps_per_user" in page   # in the report's point table
    assert results.read_manifest(run)["price_per_hour_usd"] == 2.88
    head = run_summary.read_metrics(run)["experiments"]["explorer"]["headline"]
    assert head["usd_per_mtok_output"]["best"] == pytest.approx(80.0) and head["usd_per_mtok_output"]["unit"] == "USD/Mtok"


def test_without_a_price_the_cost_columns_are_empty_not_zero():
    run = make_run([fake_point(batch_size=1)])
    pts = report._points_with_cost(run)
    assert pts["usd_per_mtok_output"].isna().all() and pts["output_tps_per_user"].notna().all()


def _points(exp, **cols):
    n = len(next(iter(cols.values())))
    base = {"experiment": [exp] * n, "status": ["ok"] * n, "valid": [True] * n, "point_id": [f"p{i}" for i in range(n)]}
    return pd.DataFrame({**base, **cols})


@pytest.mark.parametrize("exp,extra", [("batch_size", {"batch_size": [1, 2, 4, 8]}),
                                       ("serving_load", {"engine": ["fifo", "fifo", "continuous", "continuous"],
                                                         "rate_rps": [1.0, 2.0, 1.0, 2.0]})])
def test_pareto_figure_for_batch_size_and_serving(exp, extra):
    pts = _points(exp, output_throughput_tps=[10.0, 18.0, 30.0, 28.0], decode_tps_p50=[10.0, 9.0, 7.5, 3.5], **extra)
    pts = cost.add_columns(pts, None, 1.0)
    front = cost.pareto_front(pts)
    if exp == "batch_size":
        assert list(front) == [True, True, True, False]               # batch 8: slower per user and per device
    fig = cost.pareto_figure(pts)
    assert fig is not None and "tokens/s per user" in fig.layout.xaxis.title.text
    assert "tokens/s per device" in fig.layout.yaxis.title.text
    marker_traces = [t for t in fig.data if t.mode and "markers" in t.mode]
    assert sum(len(t.x) for t in marker_traces) == 4
    if exp == "serving_load":
        assert {t.legendgroup for t in marker_traces} == {"serving_load · fifo", "serving_load · continuous"}
        colours = {t.legendgroup: t.marker.color for t in marker_traces}
        assert colours["serving_load · fifo"] == plots.COLOUR_MAP["fifo"]        # the engine's house colour
        # labelled by offered rate at 3 significant figures; a closed-loop point (no rate_rps) by its achieved rate
        sync = _points(exp, output_throughput_tps=[10.0, 18.0], decode_tps_p50=[10.0, 9.0], engine=["static"] * 2,
                       rate_rps=[None, 3.4630751], offered_rps=[1.4142857, 3.4630751])
        labels = [t.text for t in cost.pareto_figure(cost.add_columns(sync, None, 1.0)).data if t.text is not None]
        assert list(labels[0]) == ["1.41", "3.46"]


def test_pareto_ignores_other_experiments_and_invalid_points():
    pts = cost.add_columns(_points("context_length", output_throughput_tps=[1.0], decode_tps_p50=[1.0]))
    assert cost.pareto_figure(pts) is None
    bad = cost.add_columns(_points("batch_size", output_throughput_tps=[1.0], decode_tps_p50=[1.0]).assign(valid=False))
    assert cost.pareto_figure(bad) is None


@pytest.mark.parametrize("price", [-1.0, float("nan"), "cheap"])
def test_a_bad_price_is_one_line_and_nothing_is_written(price, capsys):
    run = make_run([fake_point(batch_size=1)])
    with pytest.raises(ParameterError, match="price_per_hour: must be a number of USD per device-hour >= 0"):
        report.build_report(run, figures="none", price_per_hour=price)
    assert not (run / "report.html").exists() and not (run / "metrics.json").exists()
    assert "price_per_hour_usd" not in results.read_manifest(run)
    assert cli.main(["report", str(run), "--price-per-hour", "-2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: price_per_hour:") and "\n" not in err


def test_run_refuses_a_negative_price_from_the_flag_or_the_suite_before_anything_runs(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text("price_per_hour: -3\nnotebooks:\n- notebook: notebooks/01_batch_size.ipynb\n")
    root = results.results_root()
    for args in (["run", "quick", "--price-per-hour", "-1"], ["run", str(suite)]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: price_per_hour:") and "\n" not in err
        assert not root.exists() or not any(root.iterdir())


def test_an_8_replica_simulated_run_costs_what_one_replica_costs_at_the_same_per_replica_throughput():
    """The twin's 8 replicas at 8x the rate: the cost per million tokens charges all 8 devices, so it equals a
    single replica's at the same per-replica throughput (it was 8x too low: one device-hour over 8x the tokens)."""
    from workbench.predict import twin, twin_cost

    cost_model = twin_cost.StepCost(a0=0.02, a1=2e-4, b0=0.05, b1=0.004, b2=1e-6, b3=0.02, first_token_overhead_s=0.01)
    rows = []
    for replicas in (1, 8):
        specs = twin.open_loop("constant", 40 * replicas, 2.0 * replicas, 32, 16)
        res = twin.simulate(cost_model, specs, twin.TwinConfig(engine="fifo", replicas=replicas,
                                                               router="round_robin"), "constant", rate=2.0 * replicas)
        rows.append({"point_id": f"r{replicas}", "experiment": "simulate", **res.summary})
    pts = cost.add_columns(pd.DataFrame(rows), None, 3.6)
    one, eight = pts.iloc[0], pts.iloc[1]
    assert eight["n_devices"] == 8 and one["n_devices"] == 1
    assert eight["output_tps_per_device"] == pytest.approx(eight["output_throughput_tps"] / 8)
    assert eight["usd_per_mtok_output"] == pytest.approx(cost.usd_per_mtok(3.6, eight["output_tps_per_device"]))
    # the same per-replica throughput (within the twin's window edges): the same cost per token
    assert eight["output_tps_per_device"] == pytest.approx(one["output_throughput_tps"], rel=0.1)
    assert eight["usd_per_mtok_output"] == pytest.approx(one["usd_per_mtok_output"], rel=0.1)
