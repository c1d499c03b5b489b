"""The smaller serving faults of issue 36, each reproduced: a deadline passing in the queue, the 429 count."""

import threading
import time

import httpx
import pytest

from workbench.generation import GenerationSettings
from workbench.serving import engines
from workbench.serving.monitoring import scrape
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _req(loaded, n, **kw):
    ids = engines.prompt_ids(loaded.tokenizer, MESSAGES)
    return engines.EngineRequest(ids, GenerationSettings(max_new_tokens=n, ignore_eos=True), **kw)


def test_a_request_whose_deadline_passes_while_queued_leaves_the_queue(loaded):
    eng = engines.make_engine("fifo", loaded)
    try:
        long = eng.submit(_req(loaded, 400))
        while not long.output_ids:
            time.sleep(0.01)
        late = eng.submit(_req(loaded, 4, deadline=time.perf_counter() + 0.2), max_pending=2)
        assert late.done.wait(5), "the expired request kept its queue place behind the running one"
        assert late.finish_reason == "timeout" and not long.done.is_set()
        assert eng.pending == 1
        eng.submit(_req(loaded, 4), max_pending=2)  # its place is free: no spurious EngineFull
    finally:
        long.stop()
        eng.stop()


def test_every_429_is_counted(loaded):
    with ServerThread(loaded, engine="fifo", max_queue=0) as srv:
        body = {"model": "workbench-default", "messages": MESSAGES, "max_tokens": 300, "ignore_eos": True}
        first = threading.Thread(target=lambda: httpx.post(srv.base_url + "/v1/chat/completions", json=body,
                                                           timeout=120), daemon=True)
        first.start()
        while srv.engine.pending < 1:
            time.sleep(0.01)
        codes = [httpx.post(srv.base_url + "/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30).status_code
                 for _ in range(3)]
        assert codes == [429, 429, 429]
        m = scrape(httpx.get(srv.base_url + "/metrics", timeout=30).text)
        assert m["workbench_requests_rejected_total"] == 3
        srv.engine.interrupt()
