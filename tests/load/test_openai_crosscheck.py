"""Independent client cross-check (issue 13): the official ``openai`` client and the built-in load generator,
at the same concurrency on the same requests, agree exactly on output tokens and texts (greedy, ``ignore_eos``).
No timings are asserted here; TTFT p50 agreement is measured by ``benchmarks/serving.py``."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from workbench.load import load, senders
from workbench.load.client import openai_client, stream_chat
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model

PROMPTS = ["Name one colour.", "What is 2+2?", "Say hello.", "Name a fruit."]
MAX_TOKENS = 4
CONCURRENCY = 2


def test_openai_client_and_load_generator_agree_on_tokens_and_texts(loaded):
    with ServerThread(loaded, engine="fifo", early_headers=True) as srv:
        client = openai_client(srv.base_url)
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:  # a closed loop of 2 workers
            oa = list(pool.map(lambda p: stream_chat(client, p, MAX_TOKENS, ignore_eos=True, tokenizer=loaded.tokenizer),
                               PROMPTS))
        res = load.run_load(senders.http_sender(srv.base_url), [load.RequestSpec(p, MAX_TOKENS) for p in PROMPTS],
                            "concurrency", concurrency=CONCURRENCY)
    bi = sorted(res.rows, key=lambda r: r["request_id"])
    assert [r["error"] for r in bi] == [None] * len(PROMPTS)
    assert [r["output_tokens"] for r in oa] == [r["output_tokens"] for r in bi] == [MAX_TOKENS] * len(PROMPTS)
    assert sum(r["output_tokens"] for r in oa) == sum(r["output_tokens"] for r in bi)
    assert [r["text"] for r in oa] == [r["text"] for r in bi]
    assert all(r["text"] for r in bi)
    assert res.summary["concurrency"] == CONCURRENCY and res.summary["requests_sent"] == len(PROMPTS)
