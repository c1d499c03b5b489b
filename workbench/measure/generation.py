"""One measured batch through ``transformers`` ``generate``, timed per generated token id.

Method (the conventions of vLLM's serving benchmark and NVIDIA GenAI-Perf, see
docs/design.md section 4):

- ``t_submit`` is read before chat templating and tokenisation.
- A :class:`workbench.measure.timers.TokenTimer` (a ``transformers`` ``BaseStreamer``) stamps
  ``time.perf_counter()`` each time ``generate`` hands it a step's token ids.
  ``generate`` calls ``put()`` once with the prompt before prefill: that call is
  not a token and is skipped. ``generate`` moves each step's ids to the host
  (``tokens.cpu()``), which waits for the device; on CUDA the timer also
  synchronises explicitly before reading the clock.
- ``prefill_s`` is the duration of the model's first forward call inside
  ``generate`` (the prompt pass), from a forward pre-hook and hook on the model.
- Speculative decoding (``assistant_model`` / ``prompt_lookup_num_tokens`` in ``generate_kwargs``, batch 1
  in ``transformers``): one verification step emits ``k >= 1`` ids in one ``put()`` of shape ``(1, k)``; each
  id gets its own stamp, all ``k`` at the same time. ``itl_s`` of such a request holds the gaps between
  verification steps (:func:`workbench.stats.metrics.step_gaps`, vLLM's and AIPerf's definition: no ``k - 1``
  zeros per step), so ``len(itl_s) == len(draft_emitted) - 1``; ``ttft_s + sum(itl_s) == e2e_s`` still
  holds and TPOT (:func:`workbench.stats.metrics.request_timing`) is unchanged (the mean time per id after the
  first).
  ``prefill_s`` is then the first target forward: the prompt plus the first step's draft tokens. Per step,
  the tokens the candidate generator proposed (the target forward's new positions minus one) and the ids
  the step emitted are recorded as ``draft_proposed`` / ``draft_emitted``
  (:class:`workbench.measure.timers.VerifyCounter`).
- A row stops counting at its first EOS id: ``generate`` pads finished rows, and
  padding is not output. EOS counts as an output token when emitted.
- Per-request timings come from the token stamps through :func:`workbench.stats.metrics.request_timing`
  (TTFT from ``t_submit``, ITL between consecutive ids, ``ttft_s + sum(itl_s) == e2e_s``).

Known limit: on Apple MPS, ``transformers`` streams each step one step late
(``DeferredStopCheck``), so per-token stamps there lag by one decode step.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from workbench import checks
from workbench.errors import ParameterError
from workbench.measure.device import synchronize
from workbench.measure.timers import PrefillTimer, StreamerGroup, TokenTimer, VerifyCounter
from workbench.stats import metrics


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling and length settings for one measured batch.

    Attributes:
        max_new_tokens: cap on generated ids per request (>= 1).
        ignore_eos: fixed-length run: sets ``min_new_tokens = max_new_tokens`` so
            EOS is suppressed; throughput comparisons should use this.
        min_new_tokens: EOS is suppressed before this many ids (0..max_new_tokens).
        temperature: 0 means greedy (``do_sample=False``); otherwise sampling.
        top_p: nucleus mass in (0, 1]; ignored when greedy.
        seed: torch seed set before ``generate``.

    Raises:
        ParameterError: a value out of range.
    """

    max_new_tokens: int = 64
    ignore_eos: bool = False
    min_new_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        checks.check_int("max_new_tokens", self.max_new_tokens, 1)
        checks.check_bool("ignore_eos", self.ignore_eos)
        checks.check_int("min_new_tokens", self.min_new_tokens, 0, self.max_new_tokens)
        checks.check_float("temperature", self.temperature, 0)
        checks.check_float("top_p", self.top_p, 0, 1, lo_open=True)
        checks.check_seed("seed", self.seed)

    @property
    def do_sample(self) -> bool:
        """False for temperature 0 (greedy decoding)."""
        return self.temperature > 0

    @property
    def effective_min_new_tokens(self) -> int:
        return self.max_new_tokens if self.ignore_eos else self.min_new_tokens

    def generation_config(self, base):
        """A copy of the model's ``GenerationConfig`` with these settings applied."""
        import copy

        cfg = copy.deepcopy(base)
        cfg.max_new_tokens = self.max_new_tokens
        cfg.max_length = None
        cfg.min_new_tokens = self.effective_min_new_tokens or None
        cfg.do_sample = self.do_sample
        cfg.num_beams = 1
        if self.do_sample:
            cfg.temperature = float(self.temperature)
            cfg.top_p = float(self.top_p)
            cfg.top_k = None
        else:
            cfg.temperature = None
            cfg.top_p = None
            cfg.top_k = None
        return cfg

    def to_record(self) -> dict:
        """Columns recorded with each request (``min_new_tokens`` is the effective value)."""
        d = asdict(self)
        d["min_new_tokens"] = self.effective_min_new_tokens
        d["do_sample"] = self.do_sample
        return d


_MODEL_LOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model) -> threading.RLock:
    """The lock that makes measured ``generate`` calls on one model run one at a time.

    The prefill timer hooks the shared model and the token timer assumes the device is its own; two
    concurrent measured calls on one model would time each other's forward passes. Keyed by the model
    object (weakly), so a second model has its own lock.
    """
    with _LOCKS_GUARD:
        lock = _MODEL_LOCKS.get(model)
        if lock is None:
            lock = _MODEL_LOCKS[model] = threading.RLock()
        return lock


@functools.cache
def criteria_classes():
    """The two ``transformers`` stopping criteria of this module, ``(Cancel, RowStops)``, built on first use:
    ``transformers`` (and torch under it) is imported by the first generation, not by every importer of this
    module (the command line validates parameters and runs notebooks without either)."""
    from transformers import StoppingCriteria

    class Cancel(StoppingCriteria):
        """Stops every row once ``event`` is set (a closed stream stops its generation)."""

        def __init__(self, event: threading.Event):
            self.event = event

        def __call__(self, input_ids, scores, **kwargs):
            import torch

            return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)

    class RowStops(StoppingCriteria):
        """Wraps ``generate``'s stopping criteria and records the output position at which each row was stopped.

        ``generate`` pads a row after a criterion stops it; the recorded position (index of the row's last
        output id, from the sequence length, so a speculative step that adds several ids counts them all) lets
        :func:`generate_measured` end the row there instead of counting padding.
        """

        def __init__(self, criteria, prompt_width: int):
            self.criteria = criteria
            self.prompt_width = prompt_width
            self.stop_step: dict[int, int] = {}

        def __call__(self, input_ids, scores, **kwargs):
            done = self.criteria(input_ids, scores, **kwargs)
            for row in done.nonzero().flatten().tolist():
                self.stop_step.setdefault(row, input_ids.shape[1] - self.prompt_width - 1)
            return done

    return Cancel, RowStops


SPECULATIVE_KWARGS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit")


def is_speculative(generate_kwargs: dict | None) -> bool:
    """True when ``generate_kwargs`` turn on ``transformers``' assisted generation (a draft model, prompt lookup
    or early exit)."""
    return any((generate_kwargs or {}).get(k) is not None for k in SPECULATIVE_KWARGS)


def check_speculative(batch_size: int, generate_kwargs: dict | None) -> None:
    """Refuse what assisted generation cannot do, with one line, before ``generate`` runs.

    Raises:
        ParameterError: ``batch_size`` > 1 with a speculative mode (``transformers`` supports batch 1 only), or
            ``prompt_lookup_num_tokens`` not an integer >= 1.
    """
    kw = generate_kwargs or {}
    if kw.get("prompt_lookup_num_tokens") is not None:
        checks.check_int("prompt_lookup_num_tokens", kw["prompt_lookup_num_tokens"], 1)
    if is_speculative(kw) and batch_size > 1:
        raise ParameterError(f"batch_size: assisted generation (draft model / prompt lookup) runs at batch 1 in "
                             f"transformers (got {batch_size})")


@dataclass
class BatchResult:
    """What one measured batch produced.

    Attributes:
        records: one dict per request, in prompt order, with ``request_id``,
            ``prompt_tokens``, ``output_tokens``, ``ttft_s``, ``prefill_s``,
            ``e2e_s``, ``tpot_s`` (NaN when < 2 tokens), ``decode_tps``,
            ``itl_s`` (list of ``output_tokens - 1`` floats, seconds),
            ``finish_reason`` (``stop`` / ``length``), ``text``,
            ``output_ids`` (list of ints) and the settings' columns.
        t_submit: perf_counter at submission (before templating).
        wall_s: submission to ``generate`` returning (seconds).
        preprocess_s: templating and tokenisation (seconds, part of TTFT).
        prefill_s: the prompt forward pass (seconds, part of TTFT).
        sequences: ``generate``'s output ids, shape ``(batch, prompt_len + steps)``.
    """

    records: list[dict]
    t_submit: float
    wall_s: float
    preprocess_s: float
    prefill_s: float
    sequences: object = field(repr=False, default=None)


def encode_prompts(tokenizer, prompts: Sequence, chat: bool = True, system_prompt: str | None = None):
    """Template and tokenise prompts as one left-padded batch.

    Args:
        tokenizer: the model's tokenizer (``padding_side='left'``).
        prompts: strings (a user message when ``chat``, raw text otherwise) or
            lists of ``{"role", "content"}`` messages.
        chat: apply the tokenizer's chat template with a generation prompt.
        system_prompt: optional system message prepended to string prompts.

    Returns:
        ``BatchEncoding`` with ``input_ids`` and ``attention_mask``, shape ``(batch, max_len)``.
    """
    if chat:
        texts = []
        for p in prompts:
            msgs = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
            if system_prompt and isinstance(p, str):
                msgs.insert(0, {"role": "system", "content": system_prompt})
            texts.append(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
        return tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return tokenizer(list(prompts), padding=True, return_tensors="pt")


def count_prompt_tokens(tokenizer, prompt, chat: bool = True) -> int:
    """Tokens the model sees for one prompt (chat template included), by the same path as generation."""
    return int(encode_prompts(tokenizer, [prompt], chat=chat)["attention_mask"].sum())


def eos_token_ids(loaded) -> set[int]:
    """The ids that end a request: the union of the generation config's and the tokenizer's end ids.

    Checkpoints whose configs disagree (a generation config naming ``<|im_end|>`` while the tokenizer
    names ``<|endoftext|>``) still stop and count correctly: each source's ids are included, plus the
    chat template's end-of-turn token when the tokenizer knows one (``<|im_end|>``, ``<|eot_id|>``,
    ``<end_of_turn>``).

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel` (or any object with ``model`` and ``tokenizer``).

    Returns:
        A set of token ids (never containing None).
    """
    ids: set = set()
    for eos in (getattr(loaded.model.generation_config, "eos_token_id", None), loaded.tokenizer.eos_token_id):
        ids |= set(eos if isinstance(eos, (list, tuple)) else [eos])
    template = getattr(loaded.tokenizer, "chat_template", None) or ""
    for name in END_OF_TURN_TOKENS:
        if name in template:
            ids.add(token_id(loaded.tokenizer, name))
    return {int(i) for i in ids if i is not None}


def token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` when it is one token of the vocabulary (added tokens included), else None.

    A lookup of that one token (``convert_tokens_to_ids``, checked back with ``convert_ids_to_tokens``: an unknown
    token maps to the unknown-token id), not ``get_vocab()``: that builds the whole vocabulary dict (tens of
    thousands of entries), and the end ids are looked up after every ``generate``.
    """
    i = tokenizer.convert_tokens_to_ids(text)
    return int(i) if i is not None and tokenizer.convert_ids_to_tokens(int(i)) == text else None


def cache_kwarg(model) -> str:
    """The forward keyword for a KV cache: ``cache`` on ``transformers`` versions that renamed
    ``past_key_values`` (5.x deprecates the old name), else ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
WARMUP_NEW_TOKENS = 4  # every warm-up run generates at most this many tokens (same prompts, same shapes)


def warm_up(loaded, prompts: Sequence, settings: GenerationSettings, n: int = 1, **kwargs) -> float:
    """Run ``n`` untimed batches of ``prompts`` with at most :data:`WARMUP_NEW_TOKENS` new tokens.

    The one warm-up of the workbench (optimum-benchmark's ``warmup_text_generation``): same prompts and
    so the same prefill shapes as the timed runs; its time is returned, recorded separately, never mixed
    into a figure.

    Args:
        loaded: the model; prompts, kwargs: as for :func:`generate_measured`.
        settings: the timed runs' settings (``max_new_tokens`` is capped, ``min_new_tokens`` dropped).
        n: warm-up batches (0 does nothing).

    Returns:
        Seconds spent.
    """
    t0 = time.perf_counter()
    warm = replace(settings, max_new_tokens=min(WARMUP_NEW_TOKENS, settings.max_new_tokens), min_new_tokens=0)
    for _ in range(n):
        generate_measured(loaded, prompts, warm, **kwargs)
    return time.perf_counter() - t0


def generate_measured(
    loaded,
    prompts: Sequence,
    settings: GenerationSettings,
    chat: bool = True,
    system_prompt: str | None = None,
    extra_streamer=None,
    on_step=None,
    logits_processor=None,
    stopping_criteria=None,
    input_ids=None,
    generate_kwargs: dict | None = None,
    t_submit: float | None = None,
) -> BatchResult:
    """Run one batch through ``model.generate`` and time every generated token id.

    Args:
        loaded: :class:`workbench.measure.models.LoadedModel`.
        prompts: ``batch`` prompts (see :func:`encode_prompts`).
        settings: :class:`GenerationSettings`.
        chat: apply the chat template.
        system_prompt: optional system message.
        extra_streamer: another ``transformers`` streamer to feed (e.g. a
            ``TextIteratorStreamer`` for display); it sees the same calls.
        on_step: ``callable(ids, t)`` called on every generated step.
        logits_processor: a ``transformers.LogitsProcessorList`` passed to
            ``generate`` (e.g. budget forcing in :mod:`workbench.techniques.budget_forcing`).
        stopping_criteria: a ``transformers.StoppingCriteriaList`` for ``generate``.
        input_ids: pre-tokenised prompts (list of lists of ints, already
            templated); left-padded here. ``prompts`` is then ignored for
            encoding but its length must match. May also be a zero-argument
            callable returning them: it is called after ``t_submit``, so its
            templating and tokenisation count in TTFT (e.g.
            :func:`workbench.inputs.prompts.random_batch`).
        generate_kwargs: further ``generate`` keyword arguments (e.g. a
            prefix KV cache, see :func:`workbench.techniques.answering.generate_with_prefix_cache`).
        t_submit: ``time.perf_counter()`` read by a caller that templates and
            tokenises the prompts itself before calling (e.g.
            :func:`workbench.techniques.budget_batch.generate_with_budget`), before it did so;
            TTFT, e2e and wall time then start there. Default: read here, before templating.

    Returns:
        :class:`BatchResult` with one record per prompt.

    Raises:
        ParameterError: empty prompt list.
    """
    if len(prompts) == 0:
        raise ParameterError("prompts: need at least one prompt")
    check_speculative(len(prompts) if input_ids is None or callable(input_ids) else len(input_ids), generate_kwargs)
    timer = TokenTimer(loaded.model.device.type, on_step=on_step)
    lock = model_lock(loaded.model)
    lock.acquire()
    try:
        return _generate_locked(loaded, prompts, settings, chat, system_prompt, extra_streamer, timer,
                                logits_processor, stopping_criteria, input_ids, generate_kwargs, t_submit)
    finally:
        lock.release()


def _generate_locked(loaded, prompts, settings, chat, system_prompt, extra_streamer, timer, logits_processor,
                     stopping_criteria, input_ids, generate_kwargs, t_submit=None) -> BatchResult:
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    device_type = model.device.type
    synchronize(device_type)
    t_submit = time.perf_counter() if t_submit is None else t_submit
    if callable(input_ids):  # templated here, inside the clock
        input_ids = input_ids()
    if input_ids is not None:
        enc = tokenizer.pad({"input_ids": [list(x) for x in input_ids]}, padding=True, return_tensors="pt")
    else:
        enc = encode_prompts(tokenizer, prompts, chat=chat, system_prompt=system_prompt)
    enc = enc.to(model.device)
    t_ready = time.perf_counter()
    gen_config = settings.generation_config(model.generation_config)
    # generation settings go in the config, not beside it: transformers deprecates passing both (its warning:
    # "Passing `generation_config` together with generation-related arguments ... will be removed")
    gen_config.pad_token_id = tokenizer.pad_token_id
    extra = dict(generate_kwargs or {})
    for key in [k for k in extra if k in gen_config.to_dict()]:   # e.g. prompt_lookup_num_tokens
        setattr(gen_config, key, extra.pop(key))
    prefill = PrefillTimer(model, device_type)
    counted = is_speculative(generate_kwargs) and not (generate_kwargs or {}).get("assistant_early_exit")
    verify = VerifyCounter(model, enc["input_ids"].shape[1]) if counted else None  # early exit: draft == target
    row_stops = None
    if stopping_criteria is not None:
        from transformers import StoppingCriteriaList

        row_stops = criteria_classes()[1](stopping_criteria, enc["input_ids"].shape[1])
        stopping_criteria = StoppingCriteriaList([row_stops])
    torch.manual_seed(settings.seed)
    try:
        with torch.inference_mode():
            sequences = model.generate(
                **enc,
                generation_config=gen_config,
                streamer=StreamerGroup(timer, extra_streamer),
                logits_processor=logits_processor,
                stopping_criteria=stopping_criteria,
                **extra,
            )
    finally:
        prefill.remove()
        if verify is not None:
            verify.remove()
    synchronize(device_type)
    t_done = time.perf_counter()
    records = _records(timer, enc, tokenizer, eos_token_ids(loaded), t_submit, prefill.seconds, settings,
                       row_stops.stop_step if row_stops is not None else {})
    if verify is not None:  # batch 1: one record
        records[0]["draft_proposed"] = verify.proposed[:len(timer.step_sizes)]
        records[0]["draft_emitted"] = _emitted(timer.step_sizes, records[0]["output_tokens"])
        if records[0]["output_tokens"] >= 1:  # ITL as gaps between verification steps (vLLM, AIPerf)
            records[0]["itl_s"] = metrics.step_gaps(records[0]["itl_s"], records[0]["draft_emitted"])
    return BatchResult(
        records=records,
        t_submit=t_submit,
        wall_s=t_done - t_submit,
        preprocess_s=t_ready - t_submit,
        prefill_s=prefill.seconds,
        sequences=sequences,
    )


def _emitted(step_sizes: list[int], output_tokens: int) -> list[int]:
    """Ids each step contributed to the output, the steps cut where the output ends (EOS or a stop)."""
    out, left = [], output_tokens
    for k in step_sizes:
        if left <= 0:
            break
        out.append(min(k, left))
        left -= k
    return out


def decode_output(tokenizer, ids, finish_reason: str) -> str:
    """Decode output ids; a multi-byte character cut by ``max_new_tokens`` (a trailing U+FFFD) is dropped."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return text.rstrip("\ufffd") if finish_reason == "length" else text


def _records(timer: TokenTimer, enc, tokenizer, eos_ids, t_submit, prefill_s, settings, stop_steps=None) -> list[dict]:
    import torch

    steps = torch.stack(timer.steps) if timer.steps else torch.empty((0, enc["input_ids"].shape[0]), dtype=torch.long)
    prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
    settings_cols = settings.to_record()
    out = []
    for row in range(steps.shape[1]):
        ids = steps[:, row].tolist()
        n = len(ids)
        finish = "length"
        if stop_steps and row in stop_steps:  # a stopping criterion ended the row: later ids are padding
            n, finish = min(n, stop_steps[row] + 1), "stop"
            ids = ids[:n]
        for i, tok in enumerate(ids):
            if tok in eos_ids:
                n, finish = i + 1, "stop"
                break
        ids = ids[:n]
        timing = metrics.request_timing(timer.times[:n], t_submit)
        out.append(
            {
                "request_id": row,
                "prompt_tokens": int(prompt_tokens[row]),
                "prefill_s": prefill_s,
                **timing,
                "finish_reason": finish,
                "text": decode_output(tokenizer, ids, finish),
                "output_ids": ids,
                **settings_cols,
            }
        )
    return out
