"""Secrets stay home (issue 36): an endpoint key goes only over https:// or to a loopback address (an explicit
flag otherwise, named in the error), URL credentials are refused, extra_body may not override a measured field nor
carry a secret and is recorded masked; Ray workers get only the variables the workbench needs."""

import json

import pytest

from workbench.errors import ParameterError
from workbench.load import endpoint
from workbench.run import distributed


def _one_line(exc, start):
    msg = str(exc.value)
    assert msg.startswith(start) and "\n" not in msg, msg
    return msg


def test_a_key_for_a_plain_http_remote_endpoint_is_refused_before_any_request(monkeypatch):
    monkeypatch.setenv("WORKBENCH_KEY_K", "sk-very-secret")
    monkeypatch.delenv(endpoint.ALLOW_PLAIN_HTTP_ENV, raising=False)
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "http://example.com:8000", "model": "m", "api_key_env": "WORKBENCH_KEY_K"})
    msg = _one_line(exc, "endpoint.url:")
    assert "--allow-plain-http-key" in msg and "example.com" in msg and "sk-very-secret" not in msg
    # allowed: https, loopback, or the command line's flag; no key: plain http is fine
    for url in ("https://example.com", "http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:2"):
        ep = endpoint.Endpoint.from_param({"url": url, "model": "m", "api_key_env": "WORKBENCH_KEY_K"})
        assert ep.headers() == {"Authorization": "Bearer sk-very-secret"}
    endpoint.Endpoint.from_param({"url": "http://example.com", "model": "m"})
    # an Endpoint built directly still never sends the key in clear
    with pytest.raises(ParameterError, match="--allow-plain-http-key"):
        endpoint.Endpoint(url="http://example.com", model="m", api_key_env="WORKBENCH_KEY_K").headers()
    monkeypatch.setenv(endpoint.ALLOW_PLAIN_HTTP_ENV, "1")   # what --allow-plain-http-key sets
    ep = endpoint.Endpoint.from_param({"url": "http://example.com", "model": "m", "api_key_env": "WORKBENCH_KEY_K"})
    assert ep.headers()["Authorization"].endswith("sk-very-secret")


def test_credentials_in_the_url_are_refused_without_echoing_them():
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "https://user:hunter2@example.com", "model": "m"})
    msg = _one_line(exc, "endpoint.url:")
    assert "hunter2" not in msg and "credentials" in msg


@pytest.mark.parametrize("field", ["max_tokens", "temperature", "stream", "stream_options", "ignore_eos", "seed"])
def test_extra_body_may_not_override_a_measured_field(field):
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "https://h", "model": "m", "extra_body": {field: 1}})
    assert field in _one_line(exc, "endpoint.extra_body:")


def test_extra_body_secrets_are_refused_and_the_record_is_masked():
    with pytest.raises(ParameterError) as exc:
        endpoint.Endpoint.from_param({"url": "https://h", "model": "m", "extra_body": {"api_key": "sk-1"}})
    assert "sk-1" not in _one_line(exc, "endpoint.extra_body:")
    ep = endpoint.Endpoint.from_param({"url": "https://h", "model": "m",
                                       "extra_body": {"min_tokens": 8, "chat_template_kwargs": {"enable": True}}})
    rec = json.loads(ep.describe()["endpoint_extra_body"])
    assert rec == {"min_tokens": 8, "chat_template_kwargs": {"enable": True}}
    assert endpoint.masked({"a": {"auth_token": "x"}}) == {"a": {"auth_token": endpoint.MASK}}


def test_ray_workers_get_no_keys():
    env = {"WORKBENCH_API_KEY": "k", "HF_TOKEN": "t", "HF_HUB_OFFLINE": "1", "WORKBENCH_CACHE": "/c",
           "WORKBENCH_RAY": "auto", "WORKBENCH_SOMETHING_NEW": "x", "TOKENIZERS_PARALLELISM": "false", "AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin"}
    assert distributed.worker_env(env) == {"HF_HUB_OFFLINE": "1", "WORKBENCH_CACHE": "/c", "TOKENIZERS_PARALLELISM": "false"}
