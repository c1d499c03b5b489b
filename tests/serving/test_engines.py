"""Serving engines (issue 13): greedy outputs equal batch-1 generate; queue time; batching window; refusals."""
import threading
import time

import pytest

from workbench import ParameterError
from workbench.measure.generation import GenerationSettings, encode_prompts, generate_measured
from workbench.serving import engine_kinds, engines
from workbench.serving.options import EngineOptions

PROMPTS = ["Tell me about the sea.", "What is 2+2?", "Write a haiku about autumn leaves."]


def _ids(tok, prompt):
    enc = encode_prompts(tok, [prompt])
    return enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()


def test_unknown_engine_is_one_line_before_any_model():
    with pytest.raises(ParameterError) as err:
        engine_kinds.make_engine(EngineOptions(engine="vllm"), None)
    assert str(err.value).startswith("engine:") and "\n" not in str(err.value)


def test_static_window_bounds_are_checked():
    with pytest.raises(ParameterError, match="^max_batch_size:"):
        engine_kinds.StaticEngine(None, max_batch_size=0)
    with pytest.raises(ParameterError, match="^batch_window_s:"):
        engine_kinds.StaticEngine(None, batch_window_s=-1)


@pytest.fixture(scope="module")
def reference(loaded):
    s = GenerationSettings(max_new_tokens=6)
    return {p: generate_measured(loaded, [p], s).records[0]["output_ids"] for p in PROMPTS}


def _first_divergence(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.model
@pytest.mark.parametrize("name", engines.ENGINES)
def test_engine_greedy_outputs_equal_batch_1(loaded, reference, name):
    """Every request's tokens under each engine equal its greedy batch-1 generate output."""
    s = GenerationSettings(max_new_tokens=6)
    eng = engine_kinds.make_engine(EngineOptions(engine=name, max_batch_size=4, batch_window_s=0.5, max_seq_tokens=128), loaded,
                              settings=s)
    try:
        reqs = [engines.EngineRequest(_ids(loaded.tokenizer, p), s) for p in PROMPTS]
        out = engines.run_requests(eng, reqs, timeout=300)
    finally:
        eng.stop()
    for p, res in zip(PROMPTS, out):
        assert res["error"] is None
        ref = reference[p]
        assert res["output_ids"] == ref, f"{name}: first divergence at token {_first_divergence(res['output_ids'], ref)}"
        assert res["output_tokens"] == len(ref) == len(res["itl_s"]) + 1
        assert res["queue_s"] >= 0 and res["ttft_s"] >= res["queue_s"] and res["e2e_s"] >= res["ttft_s"]
    if name == "continuous":  # no per-request prefill exists: empty, with the reason
        assert all(r["prefill_s"] != r["prefill_s"] and "shared forward steps" in r["prefill_note"] for r in out)
    else:  # the prompt pass of the request's generate batch, part of its TTFT
        assert all(0 < r["prefill_s"] < r["ttft_s"] and r["prefill_note"] == "" for r in out)
    if name == "static":  # one window: the three shared one batch (and its one prompt pass)
        assert [r["batch_size"] for r in out] == [3, 3, 3]
        assert len({r["prefill_s"] for r in out}) == 1
    if name == "fifo":  # one at a time: later requests queued behind earlier ones
        assert out[2]["queue_s"] >= out[0]["e2e_s"] * 0.5


@pytest.mark.model
def test_continuous_engine_serves_different_sampling_in_one_batch(loaded, reference):
    """Issue 23: greedy rows, a near-greedy row (top_p 1e-6 keeps only the top token) and rows sampled at two
    temperatures share one continuous batch; the greedy and top_p rows equal their batch-1 greedy output, so the
    per-request settings reach the library's processors row by row."""
    tok = loaded.tokenizer
    greedy = GenerationSettings(max_new_tokens=6)
    eng = engine_kinds.ContinuousEngine(loaded, greedy, max_batch_size=8, max_seq_tokens=128)
    try:
        reqs = [engines.EngineRequest(_ids(tok, p), greedy) for p in PROMPTS]
        reqs.append(engines.EngineRequest(_ids(tok, PROMPTS[0]), GenerationSettings(max_new_tokens=6, temperature=1.0,
                                                                                    top_p=1e-6)))
        reqs += [engines.EngineRequest(_ids(tok, PROMPTS[1]), GenerationSettings(max_new_tokens=6, temperature=t))
                 for t in (0.7, 1.3)]
        out = engines.run_requests(eng, reqs, timeout=300)
        with pytest.raises(ParameterError, match="^seed:"):  # one generator serves the batch: said, not ignored
            eng.submit(engines.EngineRequest([1, 2, 3], GenerationSettings(max_new_tokens=2, temperature=1.0, seed=9)))
    finally:
        eng.stop()
    assert all(r["error"] is None and r["output_tokens"] >= 1 for r in out)
    assert max(r["batch_size"] for r in out) >= 2  # they ran together
    for p, res in zip(PROMPTS, out):
        assert res["output_ids"] == reference[p], f"first divergence at {_first_divergence(res['output_ids'], reference[p])}"
    assert out[3]["output_ids"] == reference[PROMPTS[0]]


@pytest.mark.model
def test_cancelled_while_queued_never_starts(loaded):
    eng = engine_kinds.FifoEngine(loaded)
    try:
        s = GenerationSettings(max_new_tokens=4)
        a = engines.EngineRequest(_ids(loaded.tokenizer, PROMPTS[0]), s)
        b = engines.EngineRequest(_ids(loaded.tokenizer, PROMPTS[1]), s)
        b.cancel.set()
        out = engines.run_requests(eng, [a, b], timeout=300)
    finally:
        eng.stop()
    assert out[1]["finish_reason"] == "cancelled" and out[1]["output_tokens"] == 0
    assert out[0]["output_tokens"] == 4


@pytest.mark.model
def test_queued_request_gets_headers_promptly_and_engine_timings_over_http(loaded):
    """Behind a long request (fifo engine), a second request's SSE headers arrive at once; its final chunk
    carries the engine's queue_s, ttft_s, itl_s and tpot_s; token counts come from usage."""
    import httpx

    from workbench.load import load, senders
    from workbench.serving.server import ServerThread

    with ServerThread(loaded, engine="fifo", early_headers=True) as srv:
        send = senders.http_sender(srv.base_url, timeout=300)
        out = {}

        def long():
            out["long"] = send(load.RequestSpec("Write a long story about the sea.", 24), time.perf_counter())

        th = threading.Thread(target=long)
        th.start()
        time.sleep(0.3)
        t0 = time.perf_counter()
        with httpx.Client(timeout=300) as c:
            with c.stream("POST", srv.base_url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0,
                                "stream": True}) as resp:
                headers_s = time.perf_counter() - t0
                assert resp.status_code == 200
                lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        th.join()
    long_row = out["long"]
    assert long_row["error"] is None and long_row["output_tokens"] == 24
    assert headers_s < 1.5, f"headers took {headers_s:.2f} s behind a long request"
    assert long_row["t_done"] > t0 + headers_s  # the long request was still running when the headers came
    final = [json_line for json_line in lines if '"finish_reason": "' in json_line or '"finish_reason":"' in json_line]
    import json

    eng = json.loads(final[-1][6:])["engine"]
    assert eng["queue_s"] > 0 and eng["ttft_s"] >= eng["queue_s"] and len(eng["itl_s"]) == eng["output_tokens"] - 1
    assert 0 < eng["prefill_s"] < eng["ttft_s"] and 0 < long_row["prefill_s"] < long_row["engine_ttft_s"]
    assert long_row["queue_s"] >= 0 and len(long_row["itl_s"]) == 23 and long_row["tpot_s"] > 0


@pytest.mark.model
def test_observers_limits_and_stop_reasons(loaded):
    """The engine interface: observers see each completion once; max_pending refuses (EngineFull, counted);
    a stop reason becomes the finish reason; a deadline passed while queued is a timeout; nothing stays in flight."""
    seen = []
    release = threading.Event()
    eng = engine_kinds.FifoEngine(loaded)
    eng.observers.append(lambda req, res: seen.append((req.id, res["finish_reason"])))
    try:
        s = GenerationSettings(max_new_tokens=3, ignore_eos=True)
        ids = _ids(loaded.tokenizer, PROMPTS[0])
        hold = engines.EngineRequest(ids, s, on_token=lambda tok, t: release.wait(60))  # busy until released
        eng.submit(hold)
        with pytest.raises(engines.EngineFull):
            eng.submit(engines.EngineRequest(ids, s), max_pending=1)
        assert eng.rejected == 1
        stopped = eng.submit(engines.EngineRequest(ids, s))
        stopped.stop("client_left")
        late = eng.submit(engines.EngineRequest(ids, s, deadline=0.0))
        release.set()
        assert eng.wait_idle(120)
    finally:
        release.set()
        eng.stop()
    assert sorted(seen) == sorted([(hold.id, "length"), (stopped.id, "client_left"), (late.id, "timeout")])
    assert stopped.output_ids == [] and late.output_ids == [] and len(hold.output_ids) == 3
    history = [h["id"] for h in eng.history]
    assert eng.in_flight == {} and sorted(history) == sorted([hold.id, stopped.id, late.id])
    assert history.index(late.id) < history.index(hold.id)  # a passed deadline leaves the queue without waiting


class _Counter:
    """An engine stand-in whose running requests the test sets."""

    def __init__(self):
        self.n = 0

    def running_requests(self):
        return self.n


def test_running_sampler_reports_mean_and_max_over_a_window():
    eng = _Counter()
    s = engines.RunningSampler(eng, interval_s=0.001)
    with s:
        eng.n = 2
        time.sleep(0.05)
        t_mid = time.perf_counter()
        eng.n = 4
        time.sleep(0.05)
        eng.n = 0
    whole = s.stats()
    assert whole["engine_batch_max"] == 4 and 0 < whole["engine_batch_mean"] < 4
    early = s.stats(t_to=t_mid - 0.01)
    assert early["engine_batch_max"] <= 2  # the window before the 4 excludes it
    assert s.stats(t_from=1e18)["engine_batch_max"] != s.stats(t_from=1e18)["engine_batch_max"]  # NaN: no samples
    with pytest.raises(ParameterError):
        engines.RunningSampler(eng, interval_s=0)


@pytest.mark.model
def test_engines_report_their_running_requests(loaded):
    """fifo runs one request at a time; the sampler sees at most one while three wait."""
    tok = loaded.tokenizer
    s = GenerationSettings(max_new_tokens=3, ignore_eos=True)
    with engine_kinds.FifoEngine(loaded) as eng, engines.RunningSampler(eng) as sampler:
        engines.run_requests(eng, [engines.EngineRequest(_ids(tok, p), s) for p in PROMPTS])
    assert sampler.stats()["engine_batch_max"] == 1 and eng.running_requests() == 0


@pytest.mark.model
def test_continuous_engine_running_requests_stay_within_its_batch(loaded):
    """Six requests at once into a continuous engine of batch 2: the sampler never sees more than 2 running
    (the requests waiting in the manager's own queue are not running), and sees them run together."""
    tok = loaded.tokenizer
    s = GenerationSettings(max_new_tokens=4, ignore_eos=True)
    with engine_kinds.ContinuousEngine(loaded, s, max_batch_size=2, max_seq_tokens=64) as eng, \
            engines.RunningSampler(eng, interval_s=0.002) as sampler:
        engines.run_requests(eng, [engines.EngineRequest(_ids(tok, PROMPTS[i % 3]), s) for i in range(6)])
    assert 1 <= sampler.stats()["engine_batch_max"] <= 2


@pytest.mark.model
def test_continuous_prefix_sharing_reports_cached_tokens(loaded):
    """With prefix sharing a request repeating a served prompt reuses its full cache pages (cached_tokens > 0,
    whole pages, less than the prompt) and its greedy output is unchanged; without it cached_tokens is 0."""
    tok = loaded.tokenizer
    s = GenerationSettings(max_new_tokens=4, ignore_eos=True)
    ids = _ids(tok, "Describe the sea in detail: " + "waves and tides and salt and wind, " * 6)
    out = {}
    for sharing in (False, True):
        with engine_kinds.ContinuousEngine(loaded, s, max_batch_size=2, max_seq_tokens=256, page_size=16,
                                      prefix_sharing=sharing) as eng:
            first = engines.run_requests(eng, [engines.EngineRequest(ids, s)])[0]
            again = engines.run_requests(eng, [engines.EngineRequest(ids, s)])[0]
        out[sharing] = (first, again)
    assert [r["cached_tokens"] for r in out[False]] == [0, 0]
    first, again = out[True]
    assert first["cached_tokens"] == 0 and 0 < again["cached_tokens"] < len(ids) and again["cached_tokens"] % 16 == 0
    assert again["output_ids"] == first["output_ids"] == out[False][0]["output_ids"]
    with pytest.raises(ParameterError, match="^prefix_sharing:"):
        engine_kinds.make_engine(EngineOptions(engine="fifo", prefix_sharing=True), loaded)
