"""Tests for workbench.serving.client: the openai client's timing against the real server over loopback HTTP."""

import pytest

from workbench import metrics
from workbench.generation import count_prompt_tokens
from workbench.serving.client import measure_http, openai_client, stream_chat
from workbench.serving.server import ServerThread

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
    info = server.engine.history[-1]
    assert row["text"] == info["text"] == loaded.tokenizer.decode(info["output_ids"], skip_special_tokens=True)
    assert row["ttft_s"] >= row["engine_ttft_s"] > 0
    assert row["prompt_tokens"] == count_prompt_tokens(loaded.tokenizer, [{"role": "user", "content": PROMPT}])
    assert row["output_tokens"] == len(info["output_ids"]) <= 6
    eos = 1 if row["finish_reason"] == "stop" else 0
    assert row["output_tokens"] == len(loaded.tokenizer.encode(row["text"], add_special_tokens=False)) + eos


def test_client_timing_is_request_timing_over_chunk_stamps(server, client):
    row = stream_chat(client, PROMPT, max_tokens=6, ignore_eos=True)
    stamps = [row["t_send"] + row["ttft_s"]]
    for gap in row["itl_s"]:
        stamps.append(stamps[-1] + gap)
    ref = metrics.request_timing(stamps, row["t_send"])
    assert row["chunks"] == len(stamps) == len(row["itl_s"]) + 1
    assert row["e2e_s"] == pytest.approx(ref["e2e_s"]) and row["tpot_s"] == pytest.approx(ref["tpot_s"])
    assert row["decode_tps"] == pytest.approx(ref["decode_tps"])
    assert row["transport_ttft_s"] == pytest.approx(row["ttft_s"] - row["engine_ttft_s"])


def test_concurrent_requests_all_complete(server):
    m = measure_http(server.base_url, [PROMPT, "用中文说一种颜色。"], concurrency=2, max_tokens=2, warmup=0,
                     ignore_eos=True)
    rows = m["requests"]
    assert len(rows) == 2 and sorted(q["request_id"] for q in rows) == [0, 1]
    assert all(q["output_tokens"] == 2 and q["finish_reason"] == "length" and q["text"] for q in rows)
    assert all(q["ttft_s"] >= q["engine_ttft_s"] for q in rows)
    assert m["wall_s"] > 0
