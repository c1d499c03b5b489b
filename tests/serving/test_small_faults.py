"""The smaller serving faults of issue 36, each reproduced: a deadline passing in the queue, the 429 count."""

import threading
import time

import httpx
import pytest

from workbench.measure.generation import GenerationSettings
from workbench.serving import engine_kinds, engines
from workbench.serving.monitoring import scrape
from workbench.serving.options import EngineOptions
from workbench.serving.server import ServerThread

pytestmark = pytest.mark.model

MESSAGES = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]


def _req(loaded, n, **kw):
    ids = engines.prompt_ids(loaded.tokenizer, MESSAGES)
    return engines.EngineRequest(ids, GenerationSettings(max_new_tokens=n, ignore_eos=True), **kw)


def test_a_request_whose_deadline_passes_while_queued_leaves_the_queue(loaded):
    eng = engine_kinds.make_engine(EngineOptions(engine="fifo"), loaded)
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


@pytest.mark.parametrize("call,word", [
    (lambda: __import__("workbench.load.load", fromlist=["x"]).time_slices(
        [{"t_start_s": 0.0, "t_end_s": 10.0}], 1e-6), "slice_s"),
    (lambda: __import__("workbench.load.load", fromlist=["x"]).arrival_offsets("constant", 3, rate=1e-300), "rate"),
    (lambda: __import__("workbench.load.load", fromlist=["x"]).arrival_offsets("poisson", 5, rate=1e-9), "rate"),
    (lambda: __import__("workbench.load.load", fromlist=["x"]).arrival_offsets(
        "replay", 2, trace_offsets=[0.0, 1e9]), "trace"),
])
def test_schedules_that_would_hang_a_run_are_one_line_errors(call, word):
    from workbench.errors import ParameterError

    with pytest.raises(ParameterError) as exc:
        call()
    assert str(exc.value).startswith(word) and "\n" not in str(exc.value)


def test_a_trace_offset_of_1e9_s_is_refused(tmp_path):
    from workbench.errors import ParameterError
    from workbench.load import load

    p = tmp_path / "t.jsonl"
    p.write_text('{"offset_s": 0, "prompt_tokens": 8, "output_tokens": 2}\n'
                 '{"offset_s": 1e9, "prompt_tokens": 8, "output_tokens": 2}\n')
    with pytest.raises(ParameterError, match="offset_s"):
        load.read_trace(p)


def test_slice_s_of_a_microsecond_is_refused_by_the_config():
    from workbench.errors import ParameterError
    from workbench.experiments import serving_load

    with pytest.raises(ParameterError, match="slice_s"):
        serving_load.Config(slice_s=1e-6)


def test_a_client_disconnecting_mid_body_is_not_a_logged_500(loaded, caplog):
    import logging
    import socket

    with caplog.at_level(logging.INFO):
        with ServerThread(loaded, engine="fifo") as srv:
            for path in ("/v1/chat/completions", "/v1/jobs"):
                s = socket.create_connection((srv.host, srv.port))
                s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: 1000\r\n\r\n{\"model\": ".encode())
                time.sleep(0.3)
                s.close()
            time.sleep(0.5)
            assert httpx.get(srv.base_url + "/health", timeout=30).status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_the_servers_continuous_kv_pool_is_sized_to_context_and_memory(loaded, monkeypatch):
    """Before: max_batch_size x context tokens zero-filled at start (~3 GB for the 135M model at batch 8)."""
    ctx = loaded.info.max_context_tokens
    tokens = engine_kinds.kv_cache_tokens_for(loaded, 8, ctx)
    assert ctx <= tokens <= max(ctx, 8 * engine_kinds.KV_TOKENS_PER_ROW) < 8 * ctx
    monkeypatch.setattr(engine_kinds, "KV_MEMORY_FRACTION", 1e-9)
    with pytest.raises(RuntimeError) as exc:
        engine_kinds.kv_cache_tokens_for(loaded, 8, ctx)
    assert "does not fit" in str(exc.value) and "\n" not in str(exc.value)


def test_rows_sharing_a_small_kv_pool_all_finish(loaded):
    """Three rows of 39 prompt + 60 new tokens (4 pages of 32 each) on a 100-token KV pool (9 pages with the engine's
    spares): the three at full length cannot be held at once (12 pages), yet every row finishes at its length."""
    eng = engine_kinds.make_engine(EngineOptions(engine="continuous", max_batch_size=3, max_seq_tokens=100, kv_cache_tokens=100),
                              loaded, settings=GenerationSettings(max_new_tokens=8))
    try:
        reqs = [_req(loaded, 60) for _ in range(3)]
        assert len(reqs[0].input_ids) == 39
        res = engines.run_requests(eng, reqs, timeout=600)
    finally:
        eng.stop()
    assert [(r["finish_reason"], r["output_tokens"]) for r in res] == [("length", 60)] * 3


def test_a_client_leaving_before_its_response_starts_stops_the_generation():
    """The chat stream's pump starts with the first token; a client gone before the response read its first event
    never started the reader whose cleanup stops the request: it generated to max_tokens with no reader."""
    import asyncio

    from workbench.serving.events import StreamRegistry

    stopped = []

    async def scenario():
        async def source():
            while True:
                await asyncio.sleep(0.01)
                yield "data: x\n\n"

        reg = StreamRegistry()
        log = reg.start("s1", source(), cancel=lambda: stopped.append(True))
        response = reg.respond(log)

        async def receive():
            return {"type": "http.disconnect"}

        async def send(message):
            await asyncio.sleep(0)

        await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send)
        await asyncio.sleep(0.05)
        return log

    log = asyncio.run(scenario())
    assert stopped and log.cancelled


def test_a_client_that_never_reads_is_dropped_and_its_stream_stops(monkeypatch):
    """No write-side timeout: a client whose socket takes no bytes pinned its connection and its event log (and
    kept a plain stream generating) forever."""
    import asyncio

    from workbench.serving import events

    monkeypatch.setattr(events, "WRITE_TIMEOUT_S", 0.2, raising=False)
    stopped = []

    async def scenario():
        async def source():
            while True:
                await asyncio.sleep(0.01)
                yield "data: x\n\n"

        reg = events.StreamRegistry()
        log = reg.start("s1", source(), cancel=lambda: stopped.append(True))
        response = reg.respond(log)
        forever = asyncio.Event()

        async def receive():
            await forever.wait()  # the client never disconnects...

        async def send(message):
            if message["type"] == "http.response.body":
                await forever.wait()  # ...and never takes a byte

        await asyncio.wait_for(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send), 10)
        await asyncio.sleep(0.05)
        return log

    log = asyncio.run(scenario())
    assert stopped and log.cancelled and log.readers == 0
