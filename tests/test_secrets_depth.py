"""Secrets refused at any depth (issue 51): a secret-named key anywhere in ``extra_body`` (or in any notebook
parameter) and a secret in the endpoint URL's query are refused at validation, before any run folder exists, the
value never echoed; what a run records is a masked copy everywhere (manifest, resume identity, the executed
notebook's parameters, the report's configuration table, ``sessions[].argv``); ``api_key_env`` names only a variable
marked for keys; a suite cannot lift the plain-HTTP refusal (only the command line's flag can).

Each refused case searches every file under the results root for the secret's value and finds none."""

import json
import sys
from pathlib import Path

import pytest

from workbench import checks
from workbench.errors import ParameterError
from workbench.load import endpoint
from workbench.run import notebooks, results

SECRET = "sk-51-never-written-anywhere"
NB08 = str(notebooks.NOTEBOOKS_DIR / "08_serving_load.ipynb")

NESTED = [
    {"chat_template_kwargs": {"auth_token": SECRET}},
    {"a": [{"b": {"api_key": SECRET}}]},
    {"headers_like": {"X-Api-Key": SECRET}},
    {"deep": {"deeper": {"deepest": {"password": SECRET}}}},
]


def _files_holding(root: Path, text: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``text``."""
    if not root.exists():
        return []
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _one_line(exc):
    msg = str(exc.value)
    assert "\n" not in msg and SECRET not in msg, msg
    return msg


@pytest.mark.parametrize("extra", NESTED)
def test_a_secret_at_any_depth_of_extra_body_is_refused_without_echoing_it(extra):
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "https://h", "model": "m", "extra_body": extra})
    msg = _one_line(exc)
    assert msg.startswith("endpoint.extra_body:") and checks.secret_paths(extra)[0] in msg


@pytest.mark.parametrize("url", [f"https://h/v1?api_key={SECRET}", f"https://h?x=1&token={SECRET}",
                                 f"https://h/?sig={SECRET}"])
def test_a_secret_in_the_endpoint_url_query_is_refused(url):
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": url, "model": "m"})
    assert _one_line(exc).startswith("endpoint.url:")
    endpoint.Endpoint.from_param({"url": "https://h/?model_revision=3", "model": "m"})  # a plain query is fine


def test_api_key_env_names_only_marked_variables(monkeypatch):
    """``HOME`` (any variable of the environment) was accepted and sent as a bearer key."""
    monkeypatch.delenv(endpoint.KEY_VARS_ENV, raising=False)
    for env in ("HOME", "PATH", "OPENAI_API_KEY"):
        with pytest.raises(ParameterError) as exc:
            endpoint.Endpoint.from_param({"url": "https://h", "model": "m", "api_key_env": env})
        msg = _one_line(exc)
        assert msg.startswith("endpoint.api_key_env:") and env in msg and endpoint.KEY_PREFIX in msg
    assert endpoint.Endpoint.from_param({"url": "https://h", "model": "m",
                                         "api_key_env": "WORKBENCH_KEY_VLLM"}).api_key_env == "WORKBENCH_KEY_VLLM"
    monkeypatch.setenv(endpoint.KEY_VARS_ENV, "OPENAI_API_KEY, OTHER")
    endpoint.Endpoint.from_param({"url": "https://h", "model": "m", "api_key_env": "OPENAI_API_KEY"})
    monkeypatch.setenv("HOME", "/root")
    with pytest.raises(ParameterError, match="not marked"):   # an Endpoint built directly: checked when sent
        endpoint.Endpoint(url="https://h", model="m", api_key_env="HOME").headers()


def test_a_suite_cannot_lift_the_plain_http_refusal(monkeypatch):
    monkeypatch.setenv(endpoint.ALLOW_PLAIN_HTTP_ENV, "0")   # restored after the test (the flag below sets it)
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "http://remote:8000", "model": "m", "api_key_env": "WORKBENCH_KEY_K",
                                      "allow_plain_http_key": True})
    assert _one_line(exc).startswith("endpoint.allow_plain_http_key:") and "--allow-plain-http-key" in str(exc.value)
    # the command line's flag is the user's own lift: it reaches the validation (and the kernels) as the variable
    from workbench import cli

    seen = {}
    monkeypatch.setattr(cli, "cmd_sweep", lambda args: seen.setdefault("env", __import__("os").environ.get(
        endpoint.ALLOW_PLAIN_HTTP_ENV)) and 0)
    cli.main(["sweep", NB08, "--allow-plain-http-key"])
    assert seen["env"] == "1"
    ep = endpoint.Endpoint.from_param({"url": "http://remote:8000", "model": "m", "api_key_env": "WORKBENCH_KEY_K"})
    assert ep.url == "http://remote:8000"


@pytest.mark.parametrize("how", ["sweep", "suite"])
def test_a_refused_secret_leaves_no_file_holding_it(how, tmp_path, capsys):
    """The issue's suite: ``extra_body: {chat_template_kwargs: {auth_token: "sk-..."}}`` was accepted and its value
    written in clear to the run's manifest.json and executed notebook. Now: exit 2, one line, no run folder, and
    no file under the results root holds the value."""
    from workbench import cli

    ep = {"url": "https://h.example", "model": "m", "name": "ext",
          "extra_body": {"chat_template_kwargs": {"auth_token": SECRET}}}
    if how == "sweep":
        code = cli.main(["sweep", NB08, "-p", "engines", "[endpoint]", "-p", "endpoint", json.dumps(ep)])
    else:
        suite = tmp_path / "s.yaml"
        suite.write_text(json.dumps({"notebooks": [{"notebook": "notebooks/08_serving_load.ipynb",
                                                    "parameters": {"engines": ["endpoint"], "endpoint": ep}}]}))
        code = cli.main(["run", str(suite)])
    err = capsys.readouterr()
    assert code == 2 and SECRET not in err.err + err.out and len(err.err.strip().splitlines()) == 1, err.err
    assert "auth_token" in err.err
    root = results.results_root()
    assert not root.exists() or not any(root.iterdir())
    assert _files_holding(root, SECRET) == []


@pytest.mark.parametrize("name,value", [
    ("endpoint", {"url": "https://h", "model": "m", "extra_body": {"x": {"api_key": SECRET}}}),
    ("class_slo_ttft_s", {"interactive": 1.0, "token": SECRET}),
    ("endpoint", {"url": f"https://h?access_token={SECRET}", "model": "m"}),
])
def test_every_notebook_parameter_is_checked_for_secrets(name, value):
    """A secret in any parameter (not only the endpoint's extra_body) is refused: parameters are recorded."""
    with pytest.raises(ParameterError) as exc:
        checks.check_no_secrets(name, value)
    assert _one_line(exc).startswith(f"{name}:")
    nb = str(notebooks.NOTEBOOKS_DIR / ("11_scheduling.ipynb" if name == "class_slo_ttft_s"
                                        else "08_serving_load.ipynb"))
    with pytest.raises(ParameterError) as exc:
        notebooks.validate_parameters(nb, {name: value})
    _one_line(exc)


def test_the_run_records_a_masked_copy_everywhere(tmp_path, monkeypatch):
    """Whatever reaches a record (a value that passed validation, an old run, a command line) is written masked:
    the session's argv, the manifest's notebook parameters, the resume identity, the executed notebook's
    parameters, the experiments' configs and the report's configuration table."""
    from workbench.run import resume_check, suite
    from workbench.share import report

    params = {"endpoint": {"url": f"https://h?api_key={SECRET}", "model": "m", "api_key_env": "WORKBENCH_KEY_X",
                           "extra_body": {"kw": {"auth_token": SECRET}}}}
    run = results.create_run("masked")
    monkeypatch.setattr(sys, "argv", ["workbench", "sweep", NB08, "-p", "endpoint", json.dumps(params["endpoint"]),
                                      "--api-key", SECRET, f"--token={SECRET}", "-p", "auth_token", SECRET,
                                      "--allow-plain-http-key", "suites/x.yaml"])
    session = results.begin_session(run)
    assert session["argv"][-2:] == ["--allow-plain-http-key", "suites/x.yaml"]   # a flag that allows keeps its word
    papermill_params = {}

    def fake_papermill(src, out, parameters, **kw):
        papermill_params.update(parameters)
        Path(out).write_text(json.dumps({"cells": [{"source": json.dumps(parameters)}]}))

    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", fake_papermill)
    failed = []
    suite._execute_one(1, {"notebook": NB08, "parameters": params}, [], run, False, failed)
    assert papermill_params["endpoint"]["api_key_env"] == "WORKBENCH_KEY_X"   # a variable's NAME is no secret
    results.update_manifest(run, resume_identity={"notebooks": {"08": resume_check.config_identity(params)}},
                            experiments={"serving_load": {"config": checks.mask_secrets(params)}})
    report.build_report(run)
    assert (run / "report.html").exists()
    assert _files_holding(results.results_root(), SECRET) == [], "a record holds the secret"
    manifest = results.read_manifest(run)
    assert manifest["notebooks"]["08_serving_load"]["parameters"]["endpoint"]["extra_body"]["kw"]["auth_token"] \
        == checks.MASK


def test_a_yaml_mapping_on_the_command_line_is_recorded_masked():
    argv = ["-p", "endpoint", "{url: https://h, extra_body: {k: {password: " + SECRET + "}}}", "--api-key=" + SECRET]
    masked = checks.mask_argv(argv)
    assert SECRET not in json.dumps(masked) and masked[-1] == "--api-key=" + checks.MASK
    assert json.loads(masked[2])["extra_body"]["k"]["password"] == checks.MASK


def test_a_malformed_parameter_value_is_not_echoed(capsys):
    """A ``-p`` value that is not valid YAML was echoed whole in the error (a half-typed secret with it)."""
    code = cli_main(["sweep", NB08, "-p", "endpoint", "{url: https://h, extra_body: {api_key: " + SECRET])
    err = capsys.readouterr().err
    assert code == 2 and SECRET not in err and err.startswith("error: endpoint:"), err


def cli_main(argv):
    from workbench import cli

    return cli.main(argv)
