"""Experiment 10 (streaming to a reader): config, the generated nginx config, and a tiny real run (nginx or skip)."""
import pytest

from workbench import ParameterError, results
from workbench.experiments import streaming_reader as sr


@pytest.mark.parametrize("kwargs,name", [
    ({"languages": ["fr"]}, "languages"),
    ({"proxy_modes": ["squid"]}, "proxy_modes"),
    ({"granularities": ["sometimes"]}, "granularity"),
    ({"keepalive_s": 2.0, "client_timeout_s": 1.0}, "keepalive_s"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_invalid_config_one_line(kwargs, name):
    with pytest.raises(ParameterError) as err:
        sr.Config(**kwargs)
    assert str(err.value).startswith(name + ":") and "\n" not in str(err.value)


def test_nginx_config_per_mode_is_loopback_only():
    confs = {m: sr.nginx_config(m, 18080, 18000, "/tmp/x") for m in sr.NGINX_MODES}
    assert all("listen 127.0.0.1:18080;" in c and "proxy_pass http://127.0.0.1:18000;" in c for c in confs.values())
    assert "proxy_buffering off;" in confs["buffering_off"]
    assert "proxy_buffering on;" in confs["header"] and "proxy_ignore_headers" not in confs["header"]
    assert "proxy_ignore_headers X-Accel-Buffering;" in confs["buffering_on"]


@pytest.mark.model
def test_tiny_run_measures_through_nginx_or_skips_with_the_reason(loaded):
    cfg = sr.Config(max_new_tokens=6, languages=["en"], granularities=["token", "100 ms"], warmup=0,
                    client_timeout_s=0.3, keepalive_s=0.1, blocker_tokens=16)
    binary, reason = sr.nginx_status()
    run = results.create_run()
    points = sr.run(cfg, run, loaded)
    assert (points["status"] == "ok").all(), points["status"].tolist()
    req = results.read_requests(run, experiment=sr.EXPERIMENT)
    proxied = set(req.loc[req["part"] == "proxy", "proxy"])
    note = (run / f"{sr.EXPERIMENT}_nginx.txt").read_text()
    if binary is None:
        assert proxied == {"direct"} and reason in note
        pytest.skip(f"nginx part skipped: {reason}")
    assert proxied == set(sr.PROXY_MODES)
    px = req[req["part"] == "proxy"]
    assert (px["chunks"] > 0).all() and (px["ttft_s"] > 0).all()
    assert px["text"].nunique() == 1  # the same greedy text through every path
    rd = req[req["part"] == "reader"]
    assert set(rd["granularity"]) == {"token", "100 ms"} and rd["first_word_s"].notna().all()
    ka = req[req["part"] == "keepalive"]
    assert set(ka["outcome"]) <= {"ok", "timeout"} and len(ka) == 2
    assert (ka.loc[ka["keepalive"], "outcome"] == "ok").all()  # comments keep the waiting client alive
    figs = sr.figures(points, req)
    assert set(figs) == {"reader_proxy_ttft", "reader_chunk_arrival", "reader_metrics", "reader_keepalive"}
    assert "buffering_on" in sr.headline(req)
