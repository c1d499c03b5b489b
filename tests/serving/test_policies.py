"""Scheduling policies and the waiting user (issue 24): priority order, the aging bound, the long-lane cap, queue
position events, Retry-After from the backlog, abandonment freeing a place. Fake engines and a fake clock; the real
model only in the server test at the end."""
import json
import threading
import time
from types import SimpleNamespace

import pytest

from tests.conftest import LoopbackHTTPServer
from workbench import ParameterError
from workbench.load import load, senders
from workbench.measure.generation import GenerationSettings
from workbench.serving import engine_kinds, engines, options, scheduling

FAKE = SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=0)),
                       tokenizer=SimpleNamespace(eos_token_id=0, get_vocab=lambda: {}, chat_template=""))


class GatedEngine(engine_kinds.StaticEngine):
    """A static engine whose batches "generate" only when the test releases them (one ``gate`` per batch)."""

    def __init__(self, policy="fcfs", max_batch_size=1, batch_window_s=0.0, **opts):
        self.gate = threading.Semaphore(0)
        self.batches: list = []
        queue = options.PolicyOptions(policy=policy, **opts).make_queue("static")
        super().__init__(FAKE, max_batch_size, batch_window_s, queue)

    def _serve(self, batch):
        t = time.perf_counter()
        for r in batch:
            r.t_admit, r.batch_size = t, len(batch)
        self.batches.append(list(batch))
        assert self.gate.acquire(timeout=20), "the test never released this batch"
        for r in batch:
            for _ in range(r.settings.max_new_tokens):
                if r.stopped():
                    break
                r.token(1, time.perf_counter())
            r.finish("length")


def _req(max_new=4, priority=0, prompt=8, t_arrival=None, name=None):
    kw = {} if t_arrival is None else {"t_arrival": t_arrival}
    if name is not None:
        kw["id"] = name
    return engines.EngineRequest([5] * prompt, GenerationSettings(max_new_tokens=max_new), priority=priority, **kw)


def _wait(cond, timeout=10.0):
    end = time.perf_counter() + timeout
    while not cond():
        assert time.perf_counter() < end, "condition not reached"
        time.sleep(0.005)


def _run_held(eng, reqs):
    """Submit a blocker, wait until it runs, queue ``reqs`` behind it, release everything; batches in order."""
    blocker = eng.submit(_req(name="blocker"))
    _wait(lambda: len(eng.batches) == 1)
    for r in reqs:
        eng.submit(r)
    for _ in range(len(reqs) + 1):
        eng.gate.release()
    assert eng.wait_idle(20)
    eng.stop()
    assert eng.batches[0] == [blocker]
    return [[r.id for r in b] for b in eng.batches[1:]]


# ----------------------------------------------------------------------------- policies


def test_priority_order_is_respected_within_admission():
    """Lower priority value first, ties by arrival; fcfs on the same requests keeps arrival order."""
    prios = [5, 1, 3, 1, -2]
    reqs = [_req(priority=p, name=f"p{p}_{i}") for i, p in enumerate(prios)]
    order = [b[0] for b in _run_held(GatedEngine("priority"), reqs)]
    assert order == ["p-2_4", "p1_1", "p1_3", "p3_2", "p5_0"]
    reqs = [_req(priority=p, name=f"p{p}_{i}") for i, p in enumerate(prios)]
    assert [b[0] for b in _run_held(GatedEngine("fcfs"), reqs)] == [r.id for r in reqs]


def test_sjf_serves_the_shortest_prediction_first():
    reqs = [_req(max_new=m, name=f"m{m}") for m in (40, 4, 20, 8)]
    assert [b[0] for b in _run_held(GatedEngine("sjf"), reqs)] == ["m4", "m8", "m20", "m40"]


def _history(fit, sizes, s_per_token=0.01, fixed_s=0.05):
    """Finished requests of ``(prompt, max_new)`` sizes whose service is ``fixed_s + s_per_token * (prompt + max_new)``
    (a prompt token as dear as a decode step), fed to a :class:`ServiceFit`."""
    for prompt, max_new in sizes:
        r = _req(max_new=max_new, prompt=prompt)
        r.t_admit, r.stamps = 0.0, [fixed_s + s_per_token * (prompt + max_new)]
        fit(r, {"output_tokens": max_new})


def test_sjf_with_the_fitted_predictor_orders_by_the_fit_of_the_engines_history():
    """A long prompt with a short cap (200 + 8 tokens) and a short prompt with a longer cap (8 + 20): the proxy (a
    prompt token at 1/32 of a step) serves the first first; once the history shows a prompt token costing as much
    as a decode step, the fitted predictor serves the second first. Until the fit is determined it is the proxy."""
    big_prompt, long_cap = _req(max_new=8, prompt=200, name="a"), _req(max_new=20, prompt=8, name="b")
    fitted, proxy = scheduling.PolicyQueue("sjf", predictor="fitted"), scheduling.PolicyQueue("sjf")
    for q in (fitted, proxy):
        q.put(big_prompt)
        q.put(long_cap)
    assert fitted.status(big_prompt)["queue_position"] == 0 and fitted.fit.coefficients() is None
    _history(fitted.fit, [(8, 4), (8, 16), (64, 4), (64, 16), (128, 8), (32, 32), (200, 2)])
    assert fitted.fit.coefficients() is None  # 7 finished requests: fewer than min_history (8)
    _history(fitted.fit, [(16, 24)])
    assert list(fitted.fit.coefficients()) == pytest.approx([0.05, 0.01, 0.01])
    assert fitted.status(long_cap)["queue_position"] == 0 and fitted.status(big_prompt)["queue_position"] == 1
    assert proxy.status(big_prompt)["queue_position"] == 0  # the proxy's order is unchanged
    one_length = scheduling.ServiceFit()
    _history(one_length, [(8, m) for m in range(1, 20)])
    assert one_length.coefficients() is None  # a single prompt length: the prompt's cost is not determined
    eng = GatedEngine("sjf", predictor="fitted")
    assert eng.queue.predictor == "fitted" and eng.queue.fit in eng.observers  # the engine feeds the fit
    eng.stop()


def test_aging_bounds_the_wait_of_a_long_job_under_a_stream_of_short_ones():
    """Fake clock: one long job, then a short job arriving every second; each service takes 1 s. Without aging it
    would wait for ever; with ``aging_s`` it is served within aging_s + one service (the stated bound)."""
    now = [0.0]
    q = scheduling.PolicyQueue("sjf", aging_s=10.0, clock=lambda: now[0])
    long = _req(max_new=500, t_arrival=0.0, name="long")
    q.put(long)
    q.put(_req(max_new=2, t_arrival=0.0))
    served_at = None
    for k in range(1, 200):
        item = q.get(timeout=0)
        if item is long:
            served_at = now[0]
            break
        now[0] += 1.0  # its service
        q.put(_req(max_new=2, t_arrival=now[0]))  # short ones keep coming, always shorter than the long one
    assert served_at is not None and served_at <= 10.0 + 1.0
    assert served_at >= 10.0  # and not before it was overdue: sjf did pass it over


def test_lanes_cap_long_requests_and_never_mix_lanes_in_a_batch():
    eng = GatedEngine("lanes", max_batch_size=4, batch_window_s=0.2, lane_threshold_tokens=16, long_cap=2)
    reqs = [_req(max_new=m, name=f"{'L' if m >= 16 else 's'}{i}") for i, m in enumerate((32, 32, 4, 32, 4, 32, 4))]
    batches = _run_held(eng, reqs)
    assert sorted(x for b in batches for x in b) == sorted(r.id for r in reqs)
    for b in batches:
        longs = sum(x.startswith("L") for x in b)
        assert longs <= 2, b
        assert longs in (0, len(b)), f"a batch mixes lanes: {b}"
    assert batches[0] == ["s2", "s4", "s6"]  # the short lane first


@pytest.mark.parametrize("call", [
    lambda: options.PolicyOptions(policy="lottery"),
    lambda: options.PolicyOptions(policy="lanes", lane_threshold_tokens=0),
    lambda: options.PolicyOptions(policy="sjf", aging_s=0),
    lambda: options.PolicyOptions(policy="lanes", long_cap=0),
    lambda: options.PolicyOptions(policy="sjf", predictor="oracle"),
    lambda: options.from_mapping(options.PolicyOptions, {"aging": 1}, "policy_options"),
    lambda: options.EngineOptions(engine="static", prefix_sharing=True),
    lambda: scheduling.check_priority(1.5),
    lambda: scheduling.check_priority(10**6),
    lambda: engine_kinds.make_engine(options.EngineOptions(engine="continuous"), None, options.PolicyOptions(policy="sjf")),
    lambda: options.PolicyOptions(policy="sjf").make_queue("continuous"),
])
def test_bad_scheduling_input_is_one_line_before_any_model(call):
    with pytest.raises(ParameterError) as err:
        call()
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the waiting user


def _seed_rate(q, s_per_token=0.01, n=4):
    """Give the queue's service-rate estimate a history: ``n`` finished requests at ``s_per_token``."""
    for _ in range(n):
        r = _req(max_new=10)
        r.t_admit, r.stamps = 0.0, [s_per_token * 10]
        q.rate(r, {"output_tokens": 10, "batch_size": 1})


def test_queue_position_and_eta_fall_as_the_queue_drains():
    q = scheduling.PolicyQueue("fcfs")
    assert q.status(_req()) is None
    reqs = [_req(max_new=10) for _ in range(4)]
    for r in reqs:
        q.put(r)
    assert q.status(reqs[3])["eta_s"] != q.status(reqs[3])["eta_s"]  # unknown (NaN) before any history
    _seed_rate(q, 0.01)
    seen = []
    while True:
        st = q.status(reqs[3])
        if st is None:
            break
        seen.append(st)
        q.get(timeout=0)
    assert [s["queue_position"] for s in seen] == [3, 2, 1, 0]
    assert [s["eta_s"] for s in seen] == pytest.approx([0.3, 0.2, 0.1, 0.0])


def test_retry_after_follows_the_backlog():
    q = scheduling.PolicyQueue("fcfs")
    assert scheduling.retry_after_s(q.backlog_s()) == 1  # no history: the floor
    _seed_rate(q, 0.1)
    waits = []
    for n in (5, 20, 40):
        while q.qsize() < n:
            q.put(_req(max_new=10))
        waits.append(scheduling.retry_after_s(q.backlog_s()))
    assert waits == [5, 20, 40]  # 10 tokens x 0.1 s per request waiting


def test_the_load_generator_waits_for_retry_after_and_records_it():
    calls, slept = [], []

    def send(spec, t):
        calls.append(t)
        if len(calls) <= 2:
            return {"t_sent": time.perf_counter(), "error": "HTTP 429", "retry_after_s": 3.0 * len(calls)}
        return {"t_sent": time.perf_counter(), "error": None}

    row = senders.retrying_sender(send, max_retries=5, sleep=slept.append)(load.RequestSpec("hi", 2), 0.0)
    assert slept == [3.0, 6.0] and row["retries"] == 2 and row["retry_wait_s"] == 9.0 and row["error"] is None
    calls.clear()
    row = senders.retrying_sender(send, max_retries=1, sleep=slept.append)(load.RequestSpec("hi", 2), 0.0)
    assert row["retries"] == 1 and row["error"] == "HTTP 429"  # bounded: gives up with the refusal


def test_a_full_engine_answers_with_a_retry_after_that_the_sender_honours():
    eng = GatedEngine("fcfs")
    _seed_rate(eng.queue, 0.1)
    eng.submit(_req(name="blocker"))
    _wait(lambda: len(eng.batches) == 1)
    eng.submit(_req(max_new=10))
    send = senders.engine_sender(eng, None, GenerationSettings(max_new_tokens=10), max_pending=2)
    row = send(load.RequestSpec([5] * 8, 10), time.perf_counter())
    # backlog: the blocker's 4 tokens left + 10 waiting, at 0.1 s per token: 1.4 s, rounded up
    assert row["http_status"] == 429 and row["retry_after_s"] == 2.0 and row["error"]
    slept = []

    def sleep(s):
        slept.append(s)
        for _ in range(3):  # the blocker, the waiting one, and (in advance) the retried one
            eng.gate.release()
        _wait(lambda: eng.pending == 0)

    row = senders.retrying_sender(send, sleep=sleep)(load.RequestSpec([5] * 8, 3), time.perf_counter())
    assert slept == [2.0] and row["retries"] == 1 and row["error"] is None and row["output_tokens"] == 3
    eng.stop()


def test_an_abandoned_request_frees_its_place_at_once():
    eng = GatedEngine("fcfs")
    eng.submit(_req(name="blocker"))
    _wait(lambda: len(eng.batches) == 1)
    send = senders.engine_sender(eng, None, GenerationSettings(max_new_tokens=4), max_pending=2)
    spec = senders.with_patience([load.RequestSpec([5] * 8, 4)], share=1.0, patience_s=0.05)[0]
    row = send(spec, time.perf_counter())  # the blocker never finishes while this waits: it gives up
    assert row["abandoned"] and row["finish_reason"] == "abandoned" and row["output_tokens"] == 0
    assert eng.pending == 1 and eng.queue.qsize() == 0  # its place is free although the worker never reached it
    eng.gate.release()
    assert eng.wait_idle(10)
    eng.stop()
    assert len(eng.batches) == 1  # it never ran


class _SilentSSE(LoopbackHTTPServer):
    """A stdlib HTTP server that accepts a chat request and sends no content token for ``hold_s`` seconds (then a
    normal one-token answer, so a client that never gives up is not stuck). ``early_headers``: the headers, a role
    chunk and keep-alive comments come at once (a server streaming while the request waits), else nothing until the
    answer. ``closed`` is set when the client closes the connection while the server holds it."""

    def __init__(self, hold_s=10.0, early_headers=False):
        import select
        import socket
        from http.server import BaseHTTPRequestHandler

        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _client_closed(self, wait_s):
                ready, _, _ = select.select([self.connection], [], [], wait_s)
                return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.early_headers:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(b'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}\n\n')
                    self.wfile.flush()
                end = time.perf_counter() + outer.hold_s
                try:
                    while time.perf_counter() < end:
                        if self._client_closed(0.05):
                            raise ConnectionAbortedError
                        if outer.early_headers:
                            self.wfile.write(b": keep-alive\n\n")
                            self.wfile.flush()
                except OSError:  # the client closed the connection (EOF, reset or a broken pipe)
                    outer.closed.set()
                    return
                if not outer.early_headers:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                self.wfile.write(b'data: {"choices": [{"delta": {"content": "late"}, "finish_reason": "length"}]}\n\n'
                                 b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
                                 b"data: [DONE]\n\n")
                self.wfile.flush()

            def log_message(self, *a):
                pass

        self.hold_s, self.early_headers = hold_s, early_headers
        self.closed = threading.Event()
        super().__init__(Handler)


@pytest.mark.parametrize("early_headers", [False, True])
def test_the_http_sender_abandons_after_its_patience_and_closes_the_connection(early_headers):
    """No content token within the patience (waiting for the headers, or with headers and keep-alives but no
    content): the client gives up and closes the connection; its row is abandoned like the in-process sender's
    (before: the HTTP sender ignored patience_s and waited for the late answer)."""
    with _SilentSSE(hold_s=10.0, early_headers=early_headers) as srv:
        spec = senders.with_patience([load.RequestSpec("hi", 4)], share=1.0, patience_s=0.2)[0]
        row = senders.http_sender(srv.base_url, timeout=30)(spec, time.perf_counter())
        assert srv.closed.wait(10), "the server never saw the client close the connection"
    assert row["abandoned"] is True and row["finish_reason"] == "abandoned" and row["error"] is None
    assert row["output_tokens"] == 0 and row["text"] == "" and row["e2e_s"] >= 0.2
    assert row["ttft_s"] != row["ttft_s"]  # no first token: NaN


def test_a_patient_http_request_answered_in_time_is_not_abandoned():
    """Content before the deadline: a normal row (abandoned False); a request without patience too."""
    with _SilentSSE(hold_s=0.0) as srv:
        send = senders.http_sender(srv.base_url, timeout=30)
        patient = send(load.RequestSpec("hi", 4, patience_s=30.0), time.perf_counter())
        plain = send(load.RequestSpec("hi", 4), time.perf_counter())
    for row in (patient, plain):
        assert row["abandoned"] is False and row["error"] is None and row["text"] == "late"
        assert row["output_tokens"] == 1 and row["finish_reason"] == "length"


def test_with_patience_picks_the_share():
    specs = [load.RequestSpec("x", 2) for _ in range(200)]
    out = senders.with_patience(specs, 0.25, 3.0, seed=1)
    n = sum(s.patience_s == 3.0 for s in out)
    assert 25 < n < 75 and all(s.patience_s is None for s in specs)
    with pytest.raises(ParameterError, match="^share:"):
        senders.with_patience(specs, 1.5, 3.0)


# ----------------------------------------------------------------------------- over HTTP, the real model


@pytest.mark.model
def test_queue_events_are_monotone_and_end_at_admission_and_priority_is_checked(loaded):
    import httpx

    from workbench.serving.events import iter_sse
    from workbench.serving.server import ServerThread

    with ServerThread(loaded, engine="fifo", policy="fcfs") as srv:
        http = httpx.Client(timeout=120, trust_env=False)
        url = srv.base_url + "/v1/chat/completions"
        for bad in (1.5, "1", 10**6, True):
            r = http.post(url, json={"messages": [{"role": "user", "content": "hi"}], "priority": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority", bad
        body = {"messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 24, "ignore_eos": True,
                "temperature": 0, "stream": True}
        ahead = [threading.Thread(target=lambda: http.post(url, json=dict(body, stream=False))) for _ in range(2)]
        for t in ahead:
            t.start()
        _wait(lambda: srv.engine.pending == 2)
        with http.stream("POST", url, json=dict(body, stream_options={"queue_events": True})) as resp:
            events = [json.loads(e.data) for e in iter_sse(resp.iter_lines()) if e.data and e.data != "[DONE]"]
        for t in ahead:
            t.join()
    status = [e for e in events if e.get("object") == "queue.status"]
    assert status and status[-1]["admitted"] and status[-1]["queue_position"] == 0
    pos = [e["queue_position"] for e in status]
    assert pos == sorted(pos, reverse=True) and pos[0] >= 1
    first_text = next(i for i, e in enumerate(events) if e.get("choices") and e["choices"][0]["delta"].get("content"))
    assert events.index(status[-1]) < first_text  # admitted before any text


@pytest.mark.model
@pytest.mark.parametrize("engine", ["fifo", "continuous"])
def test_an_abandoned_http_request_frees_its_slot_on_the_server(loaded, engine):
    """One request runs (a held stream); A (patience 1.5 s) and B wait behind it. A's client gives up: the HTTP
    sender closes its connection, the server's disconnect watch cancels A (history: cancelled, no token) and frees
    its place while the held request still runs; B is served once the held one ends. Before: the HTTP sender
    ignored the patience, so A waited its turn and ran."""
    import httpx

    from workbench.serving.server import ServerThread

    rows = {}
    with ServerThread(loaded, engine=engine, max_batch_size=1) as srv:
        send = senders.http_sender(srv.base_url, timeout=300)
        assert send(load.RequestSpec("Hi.", 2), time.perf_counter())["error"] is None  # warm (continuous: its cache)
        assert srv.engine.wait_idle(60)
        n0 = len(srv.engine.history)

        def go(name, spec):
            rows[name] = send(spec, time.perf_counter())

        body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 2000,
                "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=body, timeout=300) as held:
            lines = held.iter_lines()  # kept: a dropped iterator closes the response
            next(x for x in lines if '"content": "' in x and '"content": ""' not in x)  # it runs
            a = threading.Thread(target=go, args=("a", load.RequestSpec("Name a colour.", 16, patience_s=1.5)),
                                 daemon=True)
            b = threading.Thread(target=go, args=("b", load.RequestSpec("Name a fruit.", 4)), daemon=True)
            a.start()
            b.start()
            a.join(60)
            assert "a" in rows, "the abandoning client is still waiting"

            def a_cancelled():
                done = list(srv.engine.history)[n0:]
                return [h for h in done if h["finish_reason"] == "cancelled"]

            _wait(lambda: a_cancelled() and srv.engine.pending == 2, 60)  # the held request and B are left
            assert srv.engine.pending == 2 and len(a_cancelled()) == 1 and a_cancelled()[0]["output_tokens"] == 0
        b.join(120)  # the held stream is closed: B is served next
        assert srv.engine.wait_idle(60)
        done = list(srv.engine.history)[n0:]
    assert rows["a"]["abandoned"] and rows["a"]["finish_reason"] == "abandoned" and rows["a"]["output_tokens"] == 0
    assert rows["b"]["error"] is None and not rows["b"]["abandoned"] and rows["b"]["output_tokens"] == 4
    assert sorted(h["finish_reason"] for h in done) == ["cancelled", "cancelled", "length"]  # A, the held one, B
    assert sum(h["output_tokens"] == 0 for h in done) == 1  # A never generated a token


@pytest.mark.model
def test_a_client_leaving_its_queue_events_stream_frees_its_place_at_once(loaded):
    """A waiting client whose response already started (queue events) closes it: the stream's reader cancels the
    request and takes it out of the queue while the running request goes on (history: cancelled, no token).
    Before: it was only flagged, and kept its place until the worker reached it."""
    import httpx

    from workbench.serving.events import iter_sse
    from workbench.serving.server import ServerThread

    with ServerThread(loaded, engine="fifo") as srv:
        url = srv.base_url + "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 2000,
                "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=300) as held:
            lines = held.iter_lines()  # kept: a dropped iterator closes the response
            next(x for x in lines if '"content": "' in x and '"content": ""' not in x)  # it runs
            waiting = dict(body, max_tokens=8, stream_options={"queue_events": True})
            with httpx.stream("POST", url, json=waiting, timeout=300) as resp:
                status = next(e for e in iter_sse(resp.iter_lines()) if e.data and '"queue.status"' in e.data)
            assert json.loads(status.data)["queue_position"] == 0 and not json.loads(status.data)["admitted"]
            _wait(lambda: srv.engine.pending == 1, 60)  # only the held request is left, still running
            gone = list(srv.engine.history)[-1]
            assert gone["finish_reason"] == "cancelled" and gone["output_tokens"] == 0
        assert srv.engine.wait_idle(60)


def test_the_servers_429_carries_a_retry_after_from_the_backlog():
    from workbench.serving import chat

    class Busy:
        queue = SimpleNamespace(backlog_s=lambda: 7.2)

    err = chat._too_busy(chat.ChatConfig(ChatRequest=None), Busy())
    assert err.status == 429 and err.headers["Retry-After"] == "8" and "8 s" in err.message
    unknown = chat._too_busy(chat.ChatConfig(ChatRequest=None), SimpleNamespace(queue=SimpleNamespace(backlog_s=lambda: float("nan"))))
    assert unknown.headers["Retry-After"] == "1"


@pytest.mark.parametrize("args,name", [
    (["--policy", "lottery"], "policy"),
    (["--engine", "continuous", "--policy", "sjf"], "policy"),
    (["--policy", "lanes", "--lane-threshold", "0"], "lane_threshold_tokens"),
    (["--policy", "sjf", "--aging-s", "-1"], "aging_s"),
    (["--policy", "sjf", "--sjf-predictor", "oracle"], "predictor"),
])
def test_serve_refuses_bad_policy_options_in_one_line_before_the_model_loads(args, name, monkeypatch, capsys):
    from tests.conftest import no_work
    from workbench.serving import server

    no_work(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        server.main(args, prog="workbench serve")
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(f"workbench serve: error: {name}:") and "\n" not in err
