"""The load generator: what measures a server from the outside, one layer above :mod:`workbench.serving` (it imports
the server's protocol, engines and scheduling; the server imports nothing from here).

One concern per module, lowest first (a module imports only modules above it in this list):

- :mod:`.load`: arrival profiles (synchronous, concurrency, constant, Poisson, gamma, sweep, trace replay), load runs
  timed from each request's scheduled time, the measured window and its summary.
- :mod:`.client`: the one streamed reply (:class:`~.client.StreamedReply`, filled by :func:`~.client.stream_reply`,
  the only loop that reads a streamed chat completion), the ``openai`` client's per-request timing
  (:func:`~.client.stream_chat`, :func:`~.client.measure_http`) and a raw SSE reader's
  (:func:`~.client.stream_request`).
- :mod:`.senders`: a load run's senders over HTTP or straight into an engine, retries on ``Retry-After``, patience.
- :mod:`.endpoint`: any external OpenAI-compatible server as a load target (its parameter, the one-line checks
  before a run, its sender).
- :mod:`.traces`: mixed interactive / background traces, made or read, replayed on an engine under a policy.
- :mod:`.conversations`: multi-turn conversations and shared-prefix groups.
- :mod:`.saturation`: whether an open-loop load point kept up (kept up / fell behind / undetermined, from the noise
  band of :mod:`.load`'s arrival and completion counts), the knee those verdicts place, and the recommendation per
  SLO preset.
- :mod:`.bench`: the live target of a load test (an engine in process, behind the server, or an endpoint), the load
  runs made on it (sampling the engine's running requests) and the bisection for the highest rate meeting an SLO.
- :mod:`.proxy`: a real nginx on a loopback port in front of a server or an endpoint, in one buffering mode.
- :mod:`.aa_sim`: A/A designs for queue experiments on a virtual clock: a one-at-a-time fake engine whose queue is
  :mod:`workbench.serving.scheduling`'s real ``PolicyQueue``, with measured-like service times (tests and
  ``benchmarks/aa_queue.py``).
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["aa_sim", "bench", "client", "conversations", "endpoint", "load", "proxy", "saturation", "senders",
           "traces"]
