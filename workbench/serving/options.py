"""Engine, policy and server options as typed objects: built once (from flags, a suite, a notebook or keywords),
validated once, passed whole from the command line to the engine.

- :class:`EngineOptions`: which engine (:data:`ENGINES`) and its limits; read by :func:`workbench.serving.engine_kinds.make_engine`
  and the engines (``engine.options``).
- :class:`PolicyOptions`: the waiting queue's scheduling policy (:data:`POLICIES`) and its parameters; it makes the
  :class:`~workbench.serving.scheduling.PolicyQueue`.
- :class:`ServerOptions`: what the HTTP app enforces around the engine (body and token caps, queue bound, request
  timeout, stream resumption, served names).

Each field carries its command-line flag and help (:func:`add_arguments` writes the flags of ``workbench serve``
from them; :func:`from_args` reads them back), its range (checked in ``__post_init__``: one-line
:class:`~workbench.errors.ParameterError` naming the field), and :func:`from_mapping` builds an object from a suite's
or notebook's mapping (``engine_options: {max_batch_size: 4}``), refusing unknown names. The rules about which
options go with which engine live here only (:func:`check_compatible`). A new option is one field here and its use
where it acts (the engine or the policy queue).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from workbench import checks
from workbench.errors import ParameterError
from workbench.serving import http, scheduling
from workbench.serving.protocol import SERVED_MODEL

#: The built-in engines, in the order figures and flags list them (the one list every caller reads).
ENGINES = ("fifo", "static", "continuous")
#: The scheduling policies (:mod:`workbench.serving.scheduling`).
POLICIES = scheduling.POLICIES
MAX_QUEUE = 64               # requests waiting behind the one being served; more get 429
REQUEST_TIMEOUT_S = 600.0    # a request still running after this is stopped
SHUTDOWN_TIMEOUT_S = 10.0    # a shutdown's bound: open streams, running jobs and the engine get this long


def option(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None, lo: float | None = None,
           hi: float | None = None, lo_open: bool = False, cli: bool = True):
    """A dataclass field with its flag (default ``--field-name``), help, choices and range."""
    meta = {"help": help, "flag": flag, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "cli": cli}
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _validate(obj) -> None:
    """Check every field of ``obj`` against its metadata (type, choices, range): one line naming the field."""
    for f in dataclasses.fields(obj):
        v, m = getattr(obj, f.name), f.metadata
        if v is None:
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if m.get("choices"):
            checks.check_choice(f.name, v, m["choices"])
        elif kind.startswith("bool"):
            if not isinstance(v, bool):
                raise ParameterError(f"{f.name}: must be true or false (got {v!r})")
        elif kind.startswith("int"):
            checks.check_int(f.name, v, lo=m.get("lo"), hi=m.get("hi"))
        elif kind.startswith("float"):
            checks.check_float(f.name, v, lo=m.get("lo"), hi=m.get("hi"), lo_open=m.get("lo_open", False))


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine behind a server or a load point, and its limits.

    Raises:
        ParameterError: an unknown engine, a value out of range, or an option the engine does not have
            (``prefix_sharing`` off the continuous engine).
    """

    engine: str = option("fifo", "scheduler behind the app (fifo: one request at a time; static: a batching "
                                 "window; continuous: transformers' continuous batching)", choices=ENGINES)
    max_batch_size: int = option(8, "batch limit of the static and continuous engines", lo=1)
    batch_window_s: float = option(0.05, "the static engine's batching window (s)", flag="--batch-window", lo=0)
    prefix_sharing: bool = option(False, "continuous engine: reuse cached pages of shared prompt prefixes "
                                         "(usage reports cached_tokens)")
    max_seq_tokens: int | None = option(None, "continuous engine: the longest request (prompt + output) in tokens "
                                              "(default: the model's context)", lo=2)
    max_batch_tokens: int = option(512, "continuous engine: tokens per forward step (a long prompt is prefilled in "
                                        "chunks of this size, mixed with other requests' decode tokens)", lo=1)
    kv_cache_tokens: int | None = option(None, "continuous engine: tokens of paged KV cache the rows share (default: "
                                               "sized to the context and the memory, not every row at its longest)",
                                         lo=2)

    def __post_init__(self):
        _validate(self)
        if self.prefix_sharing and self.engine != "continuous":
            raise ParameterError(f"prefix_sharing: only the continuous engine shares prefix cache pages "
                                 f"(engine {self.engine!r})")


@dataclasses.dataclass(frozen=True)
class PolicyOptions:
    """The scheduling policy of an engine's waiting queue (:mod:`workbench.serving.scheduling`).

    Raises:
        ParameterError: an unknown policy or predictor, a value out of range.
    """

    policy: str = option("fcfs", "scheduling policy of the engine's queue (continuous: fcfs)", choices=POLICIES)
    aging_s: float = option(scheduling.AGING_S, "sjf / lanes: a request waiting this long is served in arrival "
                                                "order (the wait bound)", lo=0, lo_open=True)
    lane_threshold_tokens: int = option(scheduling.LANE_THRESHOLD_TOKENS, "lanes: max_tokens at or above this is "
                                                                          "a long request", flag="--lane-threshold", lo=1)
    long_cap: int = option(scheduling.LONG_CAP, "lanes: long requests running at once", lo=1)
    predictor: str = option("proxy", "sjf: the predicted job size (proxy: max_tokens and prompt length; fitted: a "
                                     "least-squares fit of the service time on them)", flag="--sjf-predictor",
                            choices=scheduling.PREDICTORS)
    fit_window: int = option(64, "sjf fitted: the finished requests the service-time fit uses (newest)", lo=1)

    def __post_init__(self):
        _validate(self)

    def make_queue(self, engine: str | EngineOptions | None = None, **kwargs) -> scheduling.PolicyQueue:
        """The :class:`~workbench.serving.scheduling.PolicyQueue` of these options for ``engine`` (checked:
        :func:`check_compatible`); ``kwargs`` (``clock``) go to the queue."""
        if engine is not None:
            check_compatible(engine if isinstance(engine, EngineOptions) else EngineOptions(engine=engine), self)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return scheduling.PolicyQueue(**fields, **kwargs)


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """What the HTTP app enforces around its engine (:func:`workbench.serving.server.create_app`).

    Raises:
        ParameterError: a value out of range, or a bad served name.
    """

    model_name: str = option(SERVED_MODEL, "the model id in responses and /v1/models", flag="--served-model-name")
    model_aliases: tuple = option((), "another name a request's model field may give (repeatable; any other "
                                      "name gets 404)", flag="--model-alias")
    max_body_bytes: int = option(http.MAX_BODY_BYTES, "larger request bodies (chat and jobs) get 413", cli=False, lo=1)
    max_tokens_limit: int | None = option(None, "ceiling on max_tokens (default: the context)", lo=1)
    max_queue: int = option(MAX_QUEUE, "requests that may wait behind the one being served (more get 429)", lo=0)
    request_timeout_s: float = option(REQUEST_TIMEOUT_S, "seconds after which an unfinished request is stopped",
                                      flag="--request-timeout", lo=0, lo_open=True)
    early_headers: bool = option(False, "start streaming responses (headers) as soon as a request is accepted")
    keepalive_s: float | None = option(None, "send ': keep-alive' comments on idle streams every this many "
                                             "seconds", cli=False, lo=0, lo_open=True)
    resume_timeout_s: float = option(60.0, "a resumable stream keeps generating this long after its reader left",
                                     cli=False, lo=0)
    stream_retention_s: float = option(300.0, "finished streams stay replayable this long", cli=False, lo=0)
    shutdown_timeout_s: float = option(SHUTDOWN_TIMEOUT_S, "seconds a shutdown waits for open streams, then for jobs and the engine "
                                             "to stop (running jobs are left interrupted); a second Ctrl+C skips the "
                                             "wait but still closes the job store", flag="--shutdown-timeout",
                                       lo=0, lo_open=True)
    body_read_timeout_s: float = option(http.BODY_READ_TIMEOUT_S, "seconds a request body may take to arrive (408 past it)",
                                        flag="--body-read-timeout", lo=0, lo_open=True)

    def __post_init__(self):
        _validate(self)
        object.__setattr__(self, "model_aliases", tuple(self.model_aliases or ()))


def check_compatible(engine: EngineOptions, policy: PolicyOptions | str) -> None:
    """The one home of the rules across engine and policy: the continuous engine's admission is transformers'
    ContinuousBatchingManager (FIFO), so it takes ``fcfs`` only.

    Raises:
        ParameterError: naming ``policy`` and the engine.
    """
    name = policy if isinstance(policy, str) else policy.policy
    checks.check_choice("policy", name, POLICIES)
    if engine.engine == "continuous" and name != "fcfs":
        raise ParameterError(f"policy: the continuous engine's admission is transformers' ContinuousBatchingManager "
                             f"(FIFO); only fcfs is supported there (got {name!r})")


def check_compile(engine: EngineOptions, compile: bool) -> None:
    """The rule between an engine and a compiled model: static cache + ``torch.compile`` needs the fifo or static
    engine (the continuous engine runs transformers' paged cache).

    Raises:
        ParameterError: naming ``compile`` and the engine.
    """
    if compile and engine.engine == "continuous":
        raise ParameterError("compile: the continuous engine runs transformers' paged cache, not a static "
                             "cache; use --engine fifo or static with --compile")


def engines_taking(policy: str) -> tuple[str, ...]:
    """The engines of :data:`ENGINES` that can apply ``policy`` (:func:`check_compatible`)."""
    out = []
    for name in ENGINES:
        try:
            check_compatible(EngineOptions(engine=name), policy)
        except ParameterError:
            continue
        out.append(name)
    return tuple(out)


# --------------------------------------------------------------------------- building them


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser, cls) -> None:
    """Add one flag per command-line field of ``cls`` to an ``argparse`` parser (its dest is the field name)."""
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        kw = {"dest": f.name, "help": f.metadata.get("help", "")}
        default = getattr(defaults, f.name)
        if kind.startswith("bool"):
            parser.add_argument(_flag(f), action="store_true", default=default, **kw)
        elif kind.startswith("tuple"):
            parser.add_argument(_flag(f), action="append", default=list(default), **kw)
        else:
            typ = int if kind.startswith("int") else float if kind.startswith("float") else str
            if f.metadata.get("choices"):  # checked by the object (one line naming the field), listed in the help
                kw["help"] += f" ({' | '.join(f.metadata['choices'])}; default {default})"
            parser.add_argument(_flag(f), type=typ, default=default, **kw)


def from_args(cls, namespace):
    """An object of ``cls`` from the flags :func:`add_arguments` added (validated)."""
    return cls(**{f.name: (tuple(v) if isinstance(v := getattr(namespace, f.name), list) else v)
                  for f in dataclasses.fields(cls) if hasattr(namespace, f.name)})


def from_mapping(cls, values: Mapping | None, where: str = "options", **fixed):
    """An object of ``cls`` from a suite's or notebook's mapping and the caller's own ``fixed`` fields.

    Raises:
        ParameterError: ``where`` is not a mapping, names a field ``cls`` does not have (the allowed ones listed),
            or one of the ``fixed`` fields (a notebook parameter of its own).
    """
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ParameterError(f"{where}: must be a mapping of option names to values (got {type(values).__name__})")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ParameterError(f"{where}: unknown {', '.join(unknown)} (allowed: {', '.join(names)})")
    twice = sorted(set(values) & set(fixed))
    if twice:
        raise ParameterError(f"{where}: {', '.join(twice)} is a parameter of its own here; set it there")
    return cls(**{**values, **fixed})


def split(**keywords) -> tuple[EngineOptions, PolicyOptions, ServerOptions, dict]:
    """Route flat keywords (``engine="static", max_batch_size=4, policy="sjf", max_queue=0, ...``) to the three
    option objects by field name; the rest comes back as a dict (for the caller's own parameters).

    Raises:
        ParameterError: a bad value, or an option the engine does not take.
    """
    groups = {cls: {} for cls in (EngineOptions, PolicyOptions, ServerOptions)}
    rest = {}
    for k, v in keywords.items():
        for cls, g in groups.items():
            if k in {f.name for f in dataclasses.fields(cls)}:
                g[k] = v
                break
        else:
            rest[k] = v
    eng, pol, srv = (cls(**g) for cls, g in groups.items())
    check_compatible(eng, pol)
    return eng, pol, srv, rest
