"""Tests for workbench.load.client: the openai client's timing against the real server over loopback HTTP."""

import pytest

from workbench.load.client import client_decode_steps, measure_http, openai_client, stream_chat
from workbench.measure.generation import count_prompt_tokens
from workbench.serving.server import ServerThread
from workbench.stats import metrics

pytestmark = pytest.mark.model

PROMPT = "Name one colour."


@pytest.fixture(scope="module")
def server(loaded):
    with ServerThread(loaded) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.base_url)


def test_openai_client_streams_the_engine_decode(server, client, loaded):
    row = stream_chat(client, PROMPT, max_tokens=6)
    server.engine.wait_idle()
    info = server.engine.history[-1]  # the engine's result of the request
    assert row["text"] == loaded.tokenizer.decode(info["output_ids"], skip_special_tokens=True)
    assert row["ttft_s"] >= row["engine_ttft_s"] > 0
    assert row["prompt_tokens"] == count_prompt_tokens(loaded.tokenizer, [{"role": "user", "content": PROMPT}])
    assert row["output_tokens"] == len(info["output_ids"]) <= 6
    eos = 1 if row["finish_reason"] == "stop" else 0
    assert row["output_tokens"] == len(loaded.tokenizer.encode(row["text"], add_special_tokens=False)) + eos


def test_client_timing_is_request_timing_over_chunk_stamps(server, client, loaded):
    row = stream_chat(client, PROMPT, max_tokens=6, ignore_eos=True, tokenizer=loaded.tokenizer)
    stamps = [row["t_send"] + row["ttft_s"]]
    for gap in row["chunk_itl_s"]:
        stamps.append(stamps[-1] + gap)
    assert "itl_s" not in row  # a chunk is not a token: chunk gaps have their own name
    steps = row["decode_steps"]  # tokens between the first and last chunk (usage and the tokenizer)
    assert 0 <= steps <= row["output_tokens"] - 1 and row["finish_reason"] == "length"
    ref = metrics.request_timing(stamps, row["t_send"], decode_steps=steps)
    assert row["chunks"] == len(stamps) == len(row["chunk_itl_s"]) + 1
    assert row["e2e_s"] == pytest.approx(ref["e2e_s"]) and row["tpot_s"] == pytest.approx(ref["tpot_s"])
    assert row["decode_tps"] == pytest.approx(ref["decode_tps"])
    assert row["transport_ttft_s"] == pytest.approx(row["ttft_s"] - row["engine_first_text_s"])
    assert row["batch_size"] == 1  # the server serves one request per forward pass


def test_client_tpot_counts_tokens_not_chunks_with_the_real_tokenizer(loaded):
    tok = loaded.tokenizer
    # EOS ends the reply: it makes no chunk, so it is not a decode step between the first and last chunk
    assert client_decode_steps(6, "stop", "Hi", tok) == 6 - 1 - 1
    assert client_decode_steps(6, "length", "Hi", tok) == 6 - 1
    # a first character spread over 3 ids (the first two make no visible text): 3 tokens in the first chunk
    assert len(tok.encode("长", add_special_tokens=False)) == 3
    assert client_decode_steps(10, "length", "长", tok) == 10 - 3
    assert client_decode_steps(10, "stop", "长", tok) == 10 - 1 - 3
    assert client_decode_steps(1, "stop", "", tok) == 0 and client_decode_steps(2, "length", "long text", tok) == 0


def test_http_proxy_in_the_environment_is_ignored(server, monkeypatch):
    import httpx

    for k in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    for k in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(k, "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(httpx.HTTPError):  # what a client that trusts the environment gets
        httpx.get(server.base_url + "/health", timeout=5)
    row = stream_chat(openai_client(server.base_url), PROMPT, max_tokens=2)
    assert row["output_tokens"] >= 1


def test_engine_first_text_is_not_charged_to_transport(server, client, loaded):
    row = stream_chat(client, "用中文说一种颜色。", max_tokens=8, ignore_eos=True, tokenizer=loaded.tokenizer)
    assert row["engine_first_text_s"] >= row["engine_ttft_s"] > 0
    assert row["transport_ttft_s"] == pytest.approx(row["ttft_s"] - row["engine_first_text_s"])
    assert 0 <= row["transport_ttft_s"] < row["ttft_s"]


def test_concurrent_requests_all_complete(server):
    m = measure_http(server.base_url, [PROMPT, "用中文说一种颜色。"], concurrency=2, max_tokens=2, warmup=0,
                     ignore_eos=True)
    rows = m["requests"]
    assert len(rows) == 2 and sorted(q["request_id"] for q in rows) == [0, 1]
    assert all(q["output_tokens"] == 2 and q["finish_reason"] == "length" and q["text"] for q in rows)
    assert all(q["ttft_s"] >= q["engine_ttft_s"] for q in rows)
    assert all(q["batch_size"] == 1 and "itl_s" not in q for q in rows)  # queued, not batched; chunks not tokens
    assert m["wall_s"] > 0
