"""Serving: an OpenAI-compatible server over the workbench model and its engines.

One concern per module, lowest first (a module imports only modules above it in this list):

- :mod:`.protocol`: what clients and server agree on (the served model id, the default host and port).
- :mod:`.scheduling`: the waiting queue's policies (``fcfs``, ``priority``, ``sjf`` with aging, ``lanes`` with a
  long-lane cap) and the service-rate estimate behind queue positions, ETAs and ``Retry-After``.
- :mod:`.http`: HTTP plumbing for every route: JSON errors, the guard (Host / loopback / API key), JSON
  bodies with their caps and depth check, the chat request schema and the unsupported options.
- :mod:`.options`: engine, policy and server options as typed objects (:class:`~.options.EngineOptions`,
  :class:`~.options.PolicyOptions`, :class:`~.options.ServerOptions`): the one list of engines and policies, the
  flags of ``workbench serve`` written from their fields, the rule between engine and policy.
- :mod:`.events`: SSE framing (``data:`` lines, numbered ``id:`` events, ``[DONE]``), ``Last-Event-ID``
  checks, resumable streams (``GET /v1/streams/{id}``), and the client-side SSE parser.
- :mod:`.engines`: the one engine interface (:class:`~.engines.EngineRequest` in, token and completion
  callbacks out, observers) with the ``fifo``, ``static`` and ``continuous`` schedulers behind it
  (:mod:`.engine_kinds`: those schedulers, the continuous engine's KV pool and ``make_engine``); the only
  place that generates.
- :mod:`.chat`: the ``/v1/chat/completions`` route (and ``/v1/models``, ``/health``), handlers at module
  level reading ``app.state``.
- :mod:`.job_store`: the job store's SQLite side (file, owner lock, tables, retried one-transaction writes, the
  writer thread).
- :mod:`.job_runs`: how a job runs on the engine (its requests, callbacks, stages, how a run ends).
- :mod:`.jobs`: background jobs in SQLite, run on the same engine (the job store); every write one transaction
  (rolled back on error, retried), one server per store (an owner lock).
- :mod:`.job_routes`: the ``/v1/jobs`` routes over the job store (post, status, result, resumable events,
  continue, delete), its work off the event loop.
- :mod:`.monitoring`: Prometheus ``/metrics``, subscribed to the engine's completions.
- :mod:`.server`: app assembly, the server thread (:class:`~.server.ServerThread`) and ``main``.

The load generator that measures a server (arrival profiles, senders, clients, traces, the knee) is its own wing one
layer up, :mod:`workbench.load`: nothing here imports it.
"""

#: the folder's face: the modules code outside it (other folders, notebooks, benchmarks) may import
__all__ = ["engine_kinds", "engines", "events", "monitoring", "options", "protocol", "scheduling", "server"]
