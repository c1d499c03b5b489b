"""The engine kinds behind :mod:`workbench.serving.engines`' one interface: ``fifo``, ``static`` and ``continuous``
(subclasses of :class:`~workbench.serving.engines.BaseEngine`), the continuous engine's KV pool for a server
(:func:`kv_cache_tokens_for`), and :func:`make_engine`, which builds the one named in
:class:`~workbench.serving.options.EngineOptions` under a queue policy.

Three schedulers behind the interface:

- ``fifo`` (:class:`FifoEngine`): one request at a time, in arrival order; one
  :func:`workbench.measure.generation.generate_measured` call per request (the baseline).
- ``static`` (:class:`StaticEngine`): a batching window. The worker takes the oldest waiting request,
  then collects more until ``max_batch_size`` are waiting or ``batch_window_s`` has passed since it
  took the first, and runs them as one left-padded ``generate`` batch; requests arriving meanwhile wait
  for the next batch. Rows stop at their own ``max_new_tokens`` (a per-row stopping criterion) but keep
  their place until the whole batch ends, which is the cost of static batching.
- ``continuous`` (:class:`ContinuousEngine`): ``transformers``' own continuous batching
  (``model.init_continuous_batching`` -> ``ContinuousBatchingManager`` with its paged-attention cache and
  its FIFO scheduler). New requests join at the next step, finished ones leave; nothing here schedules.
  Per-token times are the library's own ``record_timestamps`` stamps (``perf_counter``, taken as each
  token id is appended). **Per-request sampling**: the manager is built with ``per_request_processors`` and a
  sampling ``GenerationConfig`` that makes the library create its temperature, top-k and top-p processors;
  every request then sends its own ``temperature`` / ``top_p`` / ``top_k`` through
  ``add_request(**logit_processor_kwargs)`` (the library's ``ContinuousBatchingLogitsProcessorList``), so
  requests with different sampling share one batch. A greedy request is sent as ``top_k = 1`` (temperature 1,
  top_p 1): only the largest logit survives and the library's ``multinomial`` draws it, so greedy rows equal
  their batch-1 greedy output. The cost: every step runs softmax, two sorts and a draw over the vocabulary for
  every row, greedy or not. What the library cannot do per request is refused (:class:`ParameterError`, one
  line naming the parameter; the server's 400): a sampled request's ``seed`` other than the engine's (one
  random generator serves the whole batch) and ``min_tokens`` between 0 and ``max_tokens``.
  **Prefix sharing** (``prefix_sharing=True``): the library's block sharing (``allow_block_sharing``): full
  cache pages whose tokens equal an earlier request's prefix are reused, not recomputed; each result's
  ``cached_tokens`` says how many prompt tokens were served from the cache (0 when off).

``prefill_s`` (the prompt forward pass, seconds): ``fifo`` and ``static`` take it from
:func:`~workbench.measure.generation.generate_measured` (the first forward call of the batch's ``generate``; for a
``static`` batch it is the whole batch's padded prompt pass, shared by its rows). ``continuous`` leaves it
empty (NaN) and says why in ``prefill_note``: the library's scheduler runs a request's prompt inside shared
forward steps, split into chunks and mixed with other requests' decode tokens, so no forward pass belongs
to one request's prefill; any figure (for example admission to first token) would include other requests'
work and is not reported under this name.

Greedy outputs equal batch-1 ``generate`` outputs for all three engines on the embedded model in
float32 (tests/serving/test_engines.py); batched attention may in general change the last bits of
logits and so a near-tie argmax, which the test would report as the first divergent token.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time

from workbench import checks
from workbench.errors import ParameterError, exception_line
from workbench.measure.generation import GenerationSettings, eos_token_ids, generate_measured
from workbench.serving import scheduling
from workbench.serving.engines import BaseEngine, EngineRequest, may_join
from workbench.serving.options import EngineOptions, PolicyOptions, check_compatible

log = logging.getLogger(__name__)


class _RowCriteria:
    """Per-row stop: the row's own ``max_new_tokens`` reached, or its request cancelled."""

    def __init__(self, reqs, prompt_len: int):
        self.reqs, self.prompt_len = reqs, prompt_len

    def __call__(self, input_ids, scores=None, **kwargs):
        import torch

        n = input_ids.shape[1] - self.prompt_len
        flags = [r.stopped() or n >= r.settings.max_new_tokens for r in self.reqs]
        return torch.tensor(flags, dtype=torch.bool, device=input_ids.device)


def _row_stopping_criteria(reqs, prompt_len):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Rows(_RowCriteria, StoppingCriteria):
        pass

    return StoppingCriteriaList([_Rows(reqs, prompt_len)])


class FifoEngine(BaseEngine):
    """One request at a time in arrival order (the server's historical behaviour)."""

    name = "fifo"

    def _serve(self, batch):
        self._generate(batch)

    def _generate(self, batch: list) -> None:
        settings = batch[0].settings
        if len(batch) > 1:
            settings = dataclasses.replace(settings, max_new_tokens=max(r.settings.max_new_tokens for r in batch),
                                           min_new_tokens=min(r.settings.min_new_tokens for r in batch))
        t_admit = time.perf_counter()
        finished = [False] * len(batch)
        for r in batch:
            r.t_admit, r.batch_size = t_admit, len(batch)
        prompt_len = max(len(r.input_ids) for r in batch)

        def on_step(ids, t):
            self._t_progress = t
            for row, tok in enumerate(ids.tolist()):
                r = batch[row]
                if finished[row] or r.cancel.is_set():
                    continue
                r.token(tok, t)
                if (tok in self.eos and not r.settings.ignore_eos and len(r.output_ids) > r.settings.min_new_tokens) \
                        or len(r.output_ids) >= r.settings.max_new_tokens:
                    finished[row] = True

        res = generate_measured(self.loaded, [None] * len(batch), settings, input_ids=[r.input_ids for r in batch],
                                on_step=on_step, stopping_criteria=_row_stopping_criteria(batch, prompt_len), t_submit=t_admit)
        for r in batch:
            r.prefill_s = res.prefill_s  # the batch's prompt pass (all rows, padded): shared by its rows
            hit_eos = bool(r.output_ids) and r.output_ids[-1] in self.eos and not r.settings.ignore_eos
            r.finish("stop" if hit_eos else "length")


class StaticEngine(FifoEngine):
    """A batching window: up to ``max_batch_size`` requests or ``batch_window_s`` seconds, then one batch."""

    name = "static"

    def __init__(self, loaded, max_batch_size: int = 8, batch_window_s: float = 0.05,
                 policy: "str | scheduling.PolicyQueue" = "fcfs"):
        self.max_batch_size = checks.check_int("max_batch_size", max_batch_size, lo=1)
        self.batch_window_s = checks.check_float("batch_window_s", batch_window_s, lo=0)
        super().__init__(loaded, policy)

    def _collect(self, first):
        """``first`` and, until the batch is full or the window closes, the policy's best waiting requests that
        may share its batch (same :func:`batch_key`; ``lanes``: same lane, long ones up to the cap)."""
        batch = [first]
        deadline = time.perf_counter() + self.batch_window_s
        while len(batch) < self.max_batch_size:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            r = self.queue.get(timeout=left, accept=lambda r: may_join(self.queue, batch, r))
            if r is None:
                break
            batch.append(r)
        return batch


class ContinuousEngine(BaseEngine):
    """``transformers`` continuous batching (``init_continuous_batching``), fed from the queue.

    Args:
        loaded: the model (its attention implementation must be one the manager accepts: ``sdpa``,
            ``eager`` (switched to ``paged|eager``) or a flash implementation).
        settings: the engine's defaults: ``max_new_tokens`` and ``seed`` (the one random generator of the
            batch); requests bring their own sampling (see the module docstring).
        max_batch_size: ``max_requests_per_batch`` of the manager.
        max_seq_tokens: the longest prompt + output one request may need (sizes the paged cache).
        max_batch_tokens: tokens per forward step (prefill chunks beyond this are split by the library).
        page_size: tokens per cache page (also the unit of prefix sharing).
        prefix_sharing: reuse cached pages of a shared prompt prefix (the library's ``allow_block_sharing``).
        kv_cache_tokens: tokens of paged KV cache the rows share (at least ``max_seq_tokens``: one request at its
            longest); None: ``max_batch_size`` rows at ``max_seq_tokens`` each (the library allocates, zero-filled,
            all of it at start: :func:`kv_cache_tokens_for` sizes a server's).

    Raises:
        ParameterError: bad sizes; RuntimeError: the library refuses to run here (the reason, one line).
    """

    name = "continuous"
    PREFILL_NOTE = ("continuous: the prompt runs inside shared forward steps (chunked, mixed with other requests' "
                    "decode tokens); no per-request prefill time exists")
    NO_TOP_K = 2**31 - 1   # top_k that keeps every token (the library clamps it to the vocabulary)
    ROUTER_FAULTS = 20     # faults outside any request in a row after which the router gives up (fatal)

    def __init__(self, loaded, settings: GenerationSettings | None = None, max_batch_size: int = 8,
                 max_seq_tokens: int = 1024, max_batch_tokens: int = 512, page_size: int = 32,
                 prefix_sharing: bool = False, kv_cache_tokens: int | None = None):
        from transformers import ContinuousBatchingConfig

        self.settings = settings or GenerationSettings(max_new_tokens=256)
        self.max_batch_size = checks.check_int("max_batch_size", max_batch_size, lo=1)
        checks.check_int("max_seq_tokens", max_seq_tokens, lo=2)
        self.max_batch_tokens = checks.check_int("max_batch_tokens", max_batch_tokens, lo=1)
        checks.check_int("page_size", page_size, lo=1)
        self.prefix_sharing = checks.check_bool("prefix_sharing", prefix_sharing)
        model = loaded.model
        if not hasattr(model, "init_continuous_batching"):
            raise RuntimeError("continuous engine: this transformers has no init_continuous_batching "
                               "(continuous batching needs transformers >= 4.56)")
        # A sampling config whose values (any but the neutral ones) make the library build its temperature,
        # top-k and top-p processors; every request overrides all three (_sampling_kwargs).
        gc = GenerationSettings(max_new_tokens=self.settings.max_new_tokens, temperature=0.5,
                                top_p=0.5).generation_config(model.generation_config)
        gc.top_k = self.NO_TOP_K
        for extra in ("min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff"):
            if getattr(gc, extra, None) is not None:
                setattr(gc, extra, None)
        gc.eos_token_id = sorted(eos_token_ids(loaded))
        if kv_cache_tokens is None:  # every row at its longest at once
            num_blocks = max_batch_size * (math.ceil(max_seq_tokens / page_size) + 1) + 2
        else:  # a pool the rows share (the library's scheduler admits a request when its pages are free)
            checks.check_int("kv_cache_tokens", kv_cache_tokens, lo=max_seq_tokens)
            num_blocks = math.ceil(kv_cache_tokens / page_size) + max_batch_size + 2
        if prefix_sharing:
            num_blocks *= 2  # pages kept for reuse (the library evicts them under pressure)
        cbc = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                       max_requests_per_batch=max_batch_size, allow_block_sharing=self.prefix_sharing,
                                       auto_switch_to_flash=False, seed=self.settings.seed,
                                       per_request_processors=True)
        self._cached: dict[str, int] = {}
        try:
            self.manager = model.init_continuous_batching(generation_config=gc, continuous_batching_config=cbc)
            self._watch_prefix_matches()
            self.manager.start()
        except Exception as exc:
            raise RuntimeError(f"continuous engine: transformers refused to start continuous batching here "
                               f"({exception_line(exc)})") from None
        self._live: dict[str, EngineRequest] = {}
        self._lock = threading.Lock()
        self.peak_live = 0
        super().__init__(loaded)
        self._router = threading.Thread(target=self._guarded_loop, args=(self._route,), name="workbench-cb-router",
                                        daemon=True)
        self._router.start()

    def _threads(self) -> list:
        return [self._thread, self._router]

    def _busy(self) -> bool:
        return bool(self._live)

    def health(self) -> tuple[bool, str]:
        ok, why = super().health()
        if ok and not self.manager.is_running():
            return False, "continuous engine: the library's generation loop has stopped"
        return ok, why

    per_request_seed = False

    @property
    def seed_default(self) -> int | None:
        return int(self.settings.seed)

    def _watch_prefix_matches(self) -> None:
        """Record each request's prefix-cache hit (``cached_tokens``): wrap the cache's ``search_prefix_match``
        (the library's one place that shares pages with a new request). The batch processor is built here, before
        the loop starts (the loop reuses it), so the cache exists to be wrapped."""
        if not self.prefix_sharing:
            return
        m = self.manager
        if getattr(m, "batch_processor", None) is None and hasattr(m, "_create_batch_processor"):
            m.batch_processor = m._create_batch_processor()
        cache = getattr(getattr(m, "batch_processor", None), "cache", None)
        if cache is None or not hasattr(cache, "search_prefix_match"):
            return
        search = cache.search_prefix_match

        def recorded(request_id, prompt_ids):
            n = search(request_id, prompt_ids)
            self._cached[request_id] = self._cached.get(request_id, 0) + int(n)
            return n

        cache.search_prefix_match = recorded

    def _prepare(self, req):
        s = req.settings
        if s.do_sample and s.seed != self.settings.seed:
            raise ParameterError(f"seed: the continuous engine samples every request from one random generator "
                                 f"(seed {self.settings.seed}); a per-request seed is not supported (got {s.seed})")
        if 0 < s.min_new_tokens < s.max_new_tokens and not s.ignore_eos:
            raise ParameterError("min_tokens: the continuous engine supports only 0 or max_tokens (with ignore_eos) "
                                 f"(got {s.min_new_tokens})")
        req.prefill_s, req.prefill_note = None, self.PREFILL_NOTE

    @classmethod
    def _sampling_kwargs(cls, s: GenerationSettings) -> dict:
        """The per-request ``temperature`` / ``top_p`` / ``top_k`` sent to the library (greedy: top_k 1)."""
        if not s.do_sample:
            return {"temperature": 1.0, "top_p": 1.0, "top_k": 1}
        return {"temperature": float(s.temperature), "top_p": float(s.top_p), "top_k": cls.NO_TOP_K}

    def _serve(self, batch):  # called from the feeder thread: hand the requests to the manager and return
        for r in batch:
            with self._lock:
                if not self._live:
                    self._t_progress = time.perf_counter()  # busy from now: the stall clock starts
                self._live[r.id] = r
                self.peak_live = max(self.peak_live, len(self._live))
            eos = [-1] if r.settings.ignore_eos else sorted(self.eos)
            rid = self.manager.add_request(list(r.input_ids), request_id=r.id, max_new_tokens=r.settings.max_new_tokens,
                                           streaming=True, record_timestamps=True, eos_token_id=eos,
                                           **self._sampling_kwargs(r.settings))
            if rid is None:
                with self._lock:
                    self._live.pop(r.id, None)
                r.finish("error", "continuous engine: the manager dropped the request (stopping)")

    def _route(self) -> None:
        """Deliver the manager's streamed outputs to their requests (new tokens with the library's stamps).

        Guarded at the engine boundary: a fault while delivering one request's output (its callbacks, a malformed
        output) fails that request with the reason and the router goes on; a fault outside any request (the
        manager's own calls) is logged and retried, and after :attr:`ROUTER_FAULTS` in a row the router stops with
        ``fatal`` set (``health`` reports it; the server exits)."""
        faults = 0
        while True:
            if self._shutting_down and not self._live:
                return
            r = None
            try:
                for r in [r for r in list(self._live.values()) if r.stopped() and not r.done.is_set()]:
                    self.manager.cancel_request(r.id)
                    self._close(r, "cancelled")
                r = None
                out = self.manager.get_result(timeout=0.05)
                if out is None:
                    if not self.manager.is_running() and self._live:
                        for r in list(self._live.values()):
                            self._close(r, "error", "continuous engine: the generation loop stopped")
                    faults = 0
                    continue
                self._t_progress = time.perf_counter()
                r = self._live.get(out.request_id)
                if r is None:
                    continue
                self._deliver(r, out)
                faults = 0
            except Exception as exc:  # noqa: BLE001 - one failure fails one request
                if r is not None:
                    log.error("continuous engine: request %s failed in delivery (%s)", r.id, exception_line(exc))
                    self._close(r, "error", f"continuous engine: {exception_line(exc)}")
                    continue
                faults += 1
                log.error("continuous engine: router fault %d/%d (%s)", faults, self.ROUTER_FAULTS, exception_line(exc))
                if faults >= self.ROUTER_FAULTS:
                    raise
                time.sleep(0.05)

    def _deliver(self, r, out) -> None:
        """One streamed output of the manager for ``r``: its new tokens, then its end when it ended."""
        if r.t_admit is None and out.lifespan and out.lifespan[0] > 0:
            r.t_admit = out.lifespan[0]
        stamps = out.timestamps or []
        for i in range(len(r.output_ids), len(out.generated_tokens)):
            r.token(out.generated_tokens[i], stamps[i] if i < len(stamps) else time.perf_counter())
        if r.callback_error is not None:  # its own callback failed: it ends now, the manager drops it
            self.manager.cancel_request(r.id)
            self._close(r, "error")
        elif out.error is not None:
            self._close(r, "error", f"continuous engine: {out.error}")
        elif out.is_finished():
            hit = bool(r.output_ids) and r.output_ids[-1] in self.eos and not r.settings.ignore_eos
            self._close(r, "stop" if hit else "length")

    def _close(self, r, reason, error=None):
        with self._lock:
            self._live.pop(r.id, None)
            r.batch_size = max(r.batch_size, self.peak_live)
        r.cached_tokens = self._cached.pop(r.id, 0)
        if r.t_admit is None:
            r.t_admit = time.perf_counter()
        r.finish(reason, error)

    def _loop(self) -> None:  # the feeder: admission is the manager's (its scheduler picks from its own queue)
        while True:
            item = self.queue.get()
            if item is None:
                return
            for r in item if isinstance(item, list) else [item]:
                if r.stopped():
                    r.t_admit = time.perf_counter()
                    r.finish()
                    continue
                try:
                    self._serve([r])
                except Exception as exc:
                    r.finish("error", f"{type(exc).__name__}: {exc}")

    def running_requests(self) -> int:
        """Requests in the manager's running batch (its scheduler's ``active_requests``: admitted, prefilling or
        decoding); where this ``transformers`` does not expose them, the requests handed to the manager and not
        finished (its batch and its own waiting queue)."""
        if hasattr(self.manager, "batch_processor"):
            bp = self.manager.batch_processor  # None until the manager's loop has built it: nothing runs yet
            active = getattr(getattr(bp, "scheduler", None), "active_requests", None)
            if bp is None or isinstance(active, dict):
                return len(active) if bp is not None else 0
        return len(self._live)

    def stop(self, timeout: float = 60.0) -> None:
        self._shutting_down = True
        end = time.perf_counter() + timeout
        self.queue.put(None)
        self._thread.join(timeout=timeout)
        while self._live and time.perf_counter() < end:
            time.sleep(0.02)
        self._router.join(timeout=max(0.1, min(5.0, end - time.perf_counter())))
        self.manager.stop(block=True, timeout=max(0.1, min(30.0, end - time.perf_counter())))


KV_TOKENS_PER_ROW = 2048   # a server's KV pool: this many tokens per batch row (one request may still use the context)
KV_MEMORY_FRACTION = 0.25  # at most this share of the memory available at start


def kv_cache_tokens_for(loaded, max_batch_size: int, context: int) -> int:
    """The continuous engine's KV pool for a server (issue 36: ``max_batch_size`` x the context zero-filled ~3 GB
    for the 135M model at start): ``max(context, max_batch_size * KV_TOKENS_PER_ROW)`` tokens, never more than
    ``max_batch_size * context``, nor than :data:`KV_MEMORY_FRACTION` of the memory available now (the device's free
    memory on CUDA, the host's otherwise) at the model's bytes per token
    (:meth:`workbench.measure.models.ModelInfo.kv_cache_bytes_per_token`); at least one request at the full context.

    Raises:
        RuntimeError: one full-context request does not fit in that memory (one line)."""
    want = min(max_batch_size * context, max(context, max_batch_size * KV_TOKENS_PER_ROW))
    info = getattr(loaded, "info", None)
    try:
        per_token = int(info.kv_cache_bytes_per_token())
    except Exception:  # noqa: BLE001 - a stand-in model without shape facts: the plain pool
        return want
    free = None
    try:
        if str(getattr(info, "device", "cpu")).startswith("cuda"):
            import torch

            free = torch.cuda.mem_get_info(torch.device(info.device))[0]
        else:
            import psutil

            free = psutil.virtual_memory().available
    except Exception:  # noqa: BLE001 - unknown: the plain pool
        return want
    cap = int(free * KV_MEMORY_FRACTION) // max(per_token, 1)
    if cap < context:
        raise RuntimeError(f"continuous engine: one request at the context ({context} tokens, "
                           f"{context * per_token / 2**20:.0f} MiB of KV cache) does not fit in "
                           f"{KV_MEMORY_FRACTION:.0%} of the {free / 2**30:.1f} GiB available")
    return min(want, cap)


def make_engine(options: EngineOptions, loaded, policy: "PolicyOptions | scheduling.PolicyQueue | None" = None,
                settings: GenerationSettings | None = None) -> BaseEngine:
    """The engine ``options.engine`` (:data:`workbench.serving.options.ENGINES`) over ``loaded``, started, with ``options`` as its
    ``engine.options``; its waiting queue under ``policy`` (:class:`~workbench.serving.options.PolicyOptions`, or a
    queue already made; default fcfs); ``settings``: the continuous manager's generation defaults.

    Raises:
        ParameterError: a policy the engine cannot apply (:func:`~workbench.serving.options.check_compatible`),
            before anything starts.
    """
    policy = policy if policy is not None else PolicyOptions()
    check_compatible(options, policy if isinstance(policy, PolicyOptions) else policy.policy)
    queue = policy.make_queue(options) if isinstance(policy, PolicyOptions) else policy
    if options.engine == "fifo":
        eng = FifoEngine(loaded, queue)
    elif options.engine == "static":
        eng = StaticEngine(loaded, options.max_batch_size, options.batch_window_s, queue)
    else:
        eng = ContinuousEngine(loaded, settings, options.max_batch_size, options.max_seq_tokens or 1024,
                               max_batch_tokens=options.max_batch_tokens, prefix_sharing=options.prefix_sharing,
                               kv_cache_tokens=options.kv_cache_tokens)
    eng.options = options
    return eng
