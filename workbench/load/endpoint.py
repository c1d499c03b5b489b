"""Any OpenAI-compatible server as a load target (vLLM, SGLang, TGI, llama.cpp, another workbench server).

An endpoint is a plain mapping a YAML suite can carry (:class:`Endpoint` reads it)::

    endpoint: {url: "http://127.0.0.1:8080", model: "smollm2", api_key_env: WORKBENCH_KEY_LLAMACPP, name: llama.cpp}

``url`` is the server's base address (``/v1`` is appended; a trailing ``/v1`` is accepted), ``model`` the
``model`` field every request sends (it must be one of the ids of ``GET /v1/models``), ``api_key_env`` the
NAME of an environment variable holding the key (sent as ``Authorization: Bearer <key>``; the key itself never
goes into a config, a run folder or a report), ``name`` the label of its points (default ``endpoint``) and
``extra_body`` fields merged into every request (a server's own extensions: llama.cpp has no ``ignore_eos`` but
has ``min_tokens``, so ``extra_body: {min_tokens: 8}`` with ``max_new_tokens`` 8 keeps every reply full length).

**Secrets stay home** (issues 36, 51): the key is sent only over ``https://`` or to a loopback address, unless the
user types ``--allow-plain-http-key`` on the command line (``workbench run`` / ``sweep``; it sets
:data:`ALLOW_PLAIN_HTTP_ENV` for the run's kernels): a suite cannot lift the refusal itself, a mapping naming
``allow_plain_http_key`` is refused. ``api_key_env`` names only a variable the user marked for the purpose: its
name starts with :data:`KEY_PREFIX` (``WORKBENCH_KEY_VLLM``) or is listed in ``$WORKBENCH_KEY_VARS``
(comma-separated), never just any variable of the environment (``HOME`` would be sent as a bearer key). A URL with
credentials (``user:pass@``) or a secret-named query parameter (``?api_key=``) is refused; ``extra_body`` may not
override a field the load generator sets and records (:data:`MEASURED_FIELDS`: ``max_tokens``, ``temperature``,
``stream``, ...) nor carry a secret-named field at any depth (``chat_template_kwargs.auth_token``; the mapping is
recorded with the run): each is one line naming where, never the value, before any run folder exists. The run
records the mapping masked (:func:`masked`, ``endpoint_extra_body``; :func:`workbench.checks.mask_secrets`).

:func:`check_endpoint` answers, in one line and before any point runs, the four ways a target can be wrong:
unreachable, a refused key (401/403), a model the endpoint does not serve, and a server that is not
OpenAI-compatible (``/v1/models`` not the OpenAI list, or a streamed chat completion not of the OpenAI chunk
shape). :func:`sender` is the load generator's HTTP sender pointed at it.

An external server reports no engine-side figures (its queue time, batch, prefill time): those columns stay
empty (NaN) and :data:`SERVER_SIDE_NOTE` says why in the ``server_side_note`` column (a workbench server sends
them in its final chunk: then :data:`REPORTED_NOTE`; the batch is never sampled across processes).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

from workbench.checks import MASK, mask_secrets, secret_paths  # noqa: F401 - MASK: what a record shows
from workbench.errors import ParameterError

ENDPOINT = "endpoint"  # the engines-list entry that stands for the configured external endpoint
KEYS = ("url", "model", "api_key_env", "name", "extra_body")
#: set (to ``1``) by the command line's ``--allow-plain-http-key`` only: a key may then go over plain http:// to a
#: remote host. A suite or notebook parameter cannot set it.
ALLOW_PLAIN_HTTP_ENV = "WORKBENCH_ALLOW_PLAIN_HTTP_KEY"
KEY_PREFIX = "WORKBENCH_KEY_"        # a variable named so is marked as holding an endpoint's API key
KEY_VARS_ENV = "WORKBENCH_KEY_VARS"  # or one listed here (comma-separated names), e.g. OPENAI_API_KEY
#: request fields the load generator sets and measures by: ``extra_body`` may not override them (what was measured
#: would not be what was recorded)
MEASURED_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
                   "stream", "stream_options", "ignore_eos", "n", "seed", "priority", "stop")


def is_loopback(host: str | None) -> bool:
    """``host`` names this machine's loopback (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    import ipaddress

    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def masked(body: dict) -> dict:
    """``body`` with the value of every key whose name suggests a secret (``key``, ``token``, ``password``, ...,
    at any depth) replaced by :data:`MASK`: what a run folder may record of ``extra_body``
    (:func:`workbench.checks.mask_secrets`)."""
    return mask_secrets(body)


def plain_http_allowed() -> bool:
    """Whether the user lifted the plain-HTTP refusal on the command line (``--allow-plain-http-key``)."""
    return os.environ.get(ALLOW_PLAIN_HTTP_ENV) == "1"


def check_key_env(env: str) -> str:
    """``env`` when it names a variable marked for API keys: it starts with :data:`KEY_PREFIX` or is listed in
    ``$WORKBENCH_KEY_VARS``; ``""`` (no key) passes.

    Raises:
        ParameterError: any other variable (one line naming it and how to mark one).
    """
    if not env:
        return ""
    marked = {x.strip() for x in os.environ.get(KEY_VARS_ENV, "").split(",") if x.strip()}
    if not env.startswith(KEY_PREFIX) and env not in marked:
        raise ParameterError(f"endpoint.api_key_env: {env} is not marked as holding an API key; name a variable "
                             f"starting {KEY_PREFIX} (export {KEY_PREFIX}VLLM=...) or list it in ${KEY_VARS_ENV} "
                             f"(export {KEY_VARS_ENV}={env})")
    return env
SERVER_SIDE_NOTE = ("external endpoint: it reports no engine-side figures (queue_s, prefill_s, engine_ttft_s, "
                    "engine_batch), so they are empty; latencies and token counts are the client's and usage's")
REPORTED_NOTE = ("external endpoint: queue_s, prefill_s and engine_ttft_s as its server reported them; engine_batch "
                 "is empty (its engine runs in another process and is not sampled)")


def server_side_note(row: dict) -> str:
    """The ``server_side_note`` of an endpoint's request row: :data:`REPORTED_NOTE` when its server sent the
    engine figures (a workbench server's final-chunk ``engine`` field), else :data:`SERVER_SIDE_NOTE`."""
    q = row.get("queue_s")
    return REPORTED_NOTE if q is not None and q == q else SERVER_SIDE_NOTE


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """An external OpenAI-compatible target.

    Attributes:
        url: base URL, ``http(s)://host[:port]`` (a trailing ``/`` or ``/v1`` is dropped).
        model: the ``model`` field of every request.
        api_key_env: name of the environment variable that holds the API key ("" for none).
        name: the label of its points and curves (must not be a built-in engine's name).
        extra_body: fields added to every chat request (JSON values).
    """

    url: str
    model: str
    api_key_env: str = ""
    name: str = ENDPOINT
    extra_body: dict = dataclasses.field(default_factory=dict)
    allow_plain_http_key: bool = False

    @classmethod
    def from_param(cls, value, reserved=()) -> "Endpoint":
        """Read the ``endpoint`` parameter (a mapping, or an :class:`Endpoint`); no network.

        Args:
            value: ``{url, model, api_key_env?, name?}``.
            reserved: names the label may not take (the built-in engines).

        Raises:
            ParameterError: not a mapping, an unknown or missing key, a URL that is not http(s), an empty model,
                a label that is a built-in engine's name (one line naming the key).
        """
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ParameterError(f"endpoint: must be a mapping {{url, model, api_key_env, name}} "
                                 f"(got {type(value).__name__})")
        if "allow_plain_http_key" in value:
            raise ParameterError("endpoint.allow_plain_http_key: a suite cannot lift the refusal to send a key over "
                                 "plain http://; type --allow-plain-http-key on the command line (workbench run / "
                                 "sweep) if you mean it")
        extra = sorted(set(value) - set(KEYS))
        if extra:
            raise ParameterError(f"endpoint: unknown key {', '.join(map(str, extra))}; allowed: {', '.join(KEYS)}")
        from urllib.parse import urlsplit

        url = value.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ParameterError(f"endpoint.url: must be an http:// or https:// address (got {str(url)[:8]!r}...)")
        try:
            parts = urlsplit(url)
            userinfo, host = "@" in parts.netloc, parts.hostname
        except ValueError:
            raise ParameterError("endpoint.url: not a valid URL") from None
        if userinfo:  # never echo it: it is a credential
            raise ParameterError("endpoint.url: credentials in the URL (user:password@host) are refused (a run "
                                 "records its URL); give the key's variable name in endpoint.api_key_env")
        in_query = [q.split("?", 1)[1] for q in secret_paths({"url": url}) if "?" in q]
        if in_query:  # never echo it: it is a credential
            raise ParameterError(f"endpoint.url: its query carries {', '.join(in_query)}, a secret (a run records its "
                                 "URL); give the key's variable name in endpoint.api_key_env")
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[:-3]
        model = value.get("model")
        if not isinstance(model, str) or not model.strip():
            raise ParameterError(f"endpoint.model: must name the served model, as listed by GET /v1/models "
                                 f"(got {model!r})")
        env = value.get("api_key_env") or ""
        if not isinstance(env, str) or (env and not env.replace("_", "").isalnum()):
            raise ParameterError(f"endpoint.api_key_env: must be the NAME of an environment variable, "
                                 f"e.g. {KEY_PREFIX}VLLM (got {env!r})")
        check_key_env(env)
        name = value.get("name") or ENDPOINT
        if not isinstance(name, str) or name in reserved:
            raise ParameterError(f"endpoint.name: a label that is not a built-in engine "
                                 f"({', '.join(reserved)}) (got {name!r})")
        extra = value.get("extra_body") or {}
        if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
            raise ParameterError(f"endpoint.extra_body: must be a mapping of request fields "
                                 f"(got {type(extra).__name__})")
        overrides = sorted(set(extra) & set(MEASURED_FIELDS))
        if overrides:
            raise ParameterError(f"endpoint.extra_body: {', '.join(overrides)} is set by the load generator and "
                                 f"recorded with each point; extra_body may not override it "
                                 f"(measured fields: {', '.join(MEASURED_FIELDS)})")
        secret = secret_paths(extra)   # at any depth: chat_template_kwargs.auth_token too
        if secret:
            raise ParameterError(f"endpoint.extra_body: {', '.join(secret[:5])} "
                                 f"{'looks' if len(secret) == 1 else 'look'} like a secret, and the endpoint mapping "
                                 "is recorded with the run (manifest, notebooks, report); send a key through "
                                 "endpoint.api_key_env")
        allow = plain_http_allowed()
        if env and parts.scheme == "http" and not is_loopback(host) and not allow:
            raise ParameterError(f"endpoint.url: the key in ${env} would be sent in clear over http:// to {host}; "
                                 "use https://, a loopback address, or type --allow-plain-http-key on the command "
                                 "line")
        try:
            json.dumps(extra)
        except (TypeError, ValueError):
            raise ParameterError("endpoint.extra_body: its values must be JSON values") from None
        return cls(url=url, model=model, api_key_env=env, name=name, extra_body=dict(extra),
                   allow_plain_http_key=allow)

    def api_key(self) -> str | None:
        """The key from ``$api_key_env`` (None when no variable is named).

        Raises:
            ParameterError: the variable is named but not set or empty.
        """
        if not self.api_key_env:
            return None
        check_key_env(self.api_key_env)
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ParameterError(f"endpoint.api_key_env: environment variable {self.api_key_env} is not set")
        return key

    def headers(self) -> dict:
        """``Authorization: Bearer <key>`` when a key is configured, else nothing.

        Raises:
            ParameterError: a key for a non-loopback ``http://`` URL without ``allow_plain_http_key`` (an
                :class:`Endpoint` built directly, not through :meth:`from_param`)."""
        from urllib.parse import urlsplit

        u = urlsplit(self.url)
        allowed = self.allow_plain_http_key or plain_http_allowed()
        if self.api_key_env and u.scheme != "https" and not is_loopback(u.hostname) and not allowed:
            raise ParameterError(f"endpoint.url: the key in ${self.api_key_env} would be sent in clear over http:// "
                                 f"to {u.hostname}; use https://, a loopback address, or type --allow-plain-http-key "
                                 "on the command line")
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def describe(self) -> dict:
        """What a run folder records about the target: url, model, label and the key's variable NAME (never
        the key)."""
        return {"endpoint_url": mask_secrets(self.url), "endpoint_model": self.model, "endpoint_name": self.name,
                "endpoint_api_key_env": self.api_key_env, "endpoint_extra_body": json.dumps(masked(self.extra_body))}


def _client(timeout: float):
    from workbench.load.client import http_client

    return http_client(timeout)  # a proxy in the environment must not reroute it


def _first_line(text: str, n: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line[:n]


def check_endpoint(ep: Endpoint, timeout: float = 30.0) -> dict:
    """Check that ``ep`` is an OpenAI-compatible server that serves ``ep.model`` and accepts the key.

    Two requests: ``GET /v1/models`` (reachable, key accepted, the OpenAI list shape ``{"data": [{"id"}]}``,
    ``ep.model`` among the ids), then a streamed ``POST /v1/chat/completions`` of at most 2 tokens (``data:``
    chunks with ``choices[].delta``, as the load generator reads them).

    Returns:
        ``{"models": [served ids], "usage_in_stream": bool}``: whether the stream carried ``usage``
        (``stream_options.include_usage``); without it the load generator counts content chunks as tokens.

    Raises:
        ParameterError: one line: ``endpoint.url`` (unreachable, or not OpenAI-compatible),
            ``endpoint.api_key_env`` (HTTP 401/403, or the variable unset), ``endpoint.model`` (not served).
    """
    import httpx

    from workbench.load.client import stream_reply

    headers = ep.headers()
    where = f"{ep.url}/v1"
    with _client(timeout) as http:
        try:
            resp = http.get(f"{where}/models", headers=headers)
        except httpx.HTTPError as exc:
            raise ParameterError(f"endpoint.url: cannot reach {ep.url} ({type(exc).__name__}: "
                                 f"{_first_line(str(exc)) or 'no answer'})") from None
        _refused(resp.status_code, ep)
        try:
            body = resp.json() if resp.status_code == 200 else None
        except ValueError:
            body = None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
            raise ParameterError(f"endpoint.url: {ep.url} is not OpenAI-compatible: GET /v1/models answered HTTP "
                                 f"{resp.status_code} without the OpenAI model list {{\"data\": [{{\"id\": ...}}]}}")
        ids = [str(m["id"]) for m in data]
        if ep.model not in ids:
            raise ParameterError(f"endpoint.model: {ep.model!r} is not served by {ep.url}; it serves: "
                                 f"{', '.join(ids) or 'nothing'}")
        body = {"model": ep.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
        reply = stream_reply(http, f"{where}/chat/completions", body, headers, strict=True)
        if reply.status not in (None, 200):
            _refused(reply.status, ep)
            raise ParameterError(f"endpoint.url: {ep.url} is not OpenAI-compatible: a streamed chat "
                                 f"completion answered HTTP {reply.status}: {_first_line(reply.refusal_text)}")
        if isinstance(reply.exception, (ValueError, RuntimeError, httpx.HTTPError)):  # a broken or error stream
            raise ParameterError(f"endpoint.url: {ep.url} is not OpenAI-compatible: its streamed chat completion "
                                 f"is not of the OpenAI chunk shape ({_first_line(str(reply.exception))})") from None
        if reply.exception is not None:
            raise reply.exception
        if not reply.events:
            raise ParameterError(f"endpoint.url: {ep.url} is not OpenAI-compatible: a streamed chat completion "
                                 "sent no data: chunk")
        usage = isinstance(reply.usage, dict)
    return {"models": ids, "usage_in_stream": usage}


def _refused(status: int, ep: Endpoint) -> None:
    if status in (401, 403):
        how = f"the key in ${ep.api_key_env}" if ep.api_key_env else "no API key (set endpoint.api_key_env)"
        raise ParameterError(f"endpoint.api_key_env: {ep.url} refused {how} (HTTP {status})")


def local_server_pid(ep: Endpoint) -> int | None:
    """The process listening on ``ep``'s port when its host is this machine's loopback, else None (a remote
    server, or the listener cannot be read). Its CPU time is the point's own work, not other load
    (:data:`workbench.measure.contention.SERVED_BY_PIDS`)."""
    from urllib.parse import urlsplit

    import psutil

    u = urlsplit(ep.url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1"):
        return None
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        return None
    return None


def row_fields(row: dict, ep: Endpoint) -> dict:
    """The columns every streamed row from ``ep`` carries: ``target`` (its name) and ``server_side_note``
    (:data:`REPORTED_NOTE` when its server sent engine figures, ``engine_e2e_s``; else :data:`SERVER_SIDE_NOTE`)."""
    e2e = row.get("engine_e2e_s")
    reported = e2e is not None and e2e == e2e
    return {"target": ep.name, "server_side_note": REPORTED_NOTE if reported else SERVER_SIDE_NOTE}


def chunk_reader_rows(ep: Endpoint, url: str, prompt: str, max_new_tokens: int, granularities, stall_s: float,
                      repeat: int = 0) -> list[dict]:
    """One greedy request streamed from ``ep`` (at ``url``), its content chunks' arrival times shown to a reader at
    each display granularity (:func:`workbench.measure.reading.chunk_reader_rows`; a chunk may carry several
    tokens). Timings (s) are the client's (:func:`workbench.stats.metrics.request_timing` over the chunk stamps);
    ``output_tokens`` from ``usage``, or the content chunks when it sends none (``token_count_source``).

    Returns:
        One request row per granularity (``request_id`` its index, ``repeat``).

    Raises:
        RuntimeError: nothing streamed.
    """
    from workbench.load.client import client_decode_steps, stream_request
    from workbench.measure import reading
    from workbench.stats import metrics

    row = stream_request(url, prompt, max_new_tokens, stall_s=stall_s, ep=ep)
    if row["error"] or not row["chunks"]:
        raise RuntimeError(f"endpoint {ep.name}: no content streamed ({row['error'] or 'an empty answer'})")
    stamps, texts = row["chunk_stamps"], row["chunk_texts"]
    n_out, source = row["output_tokens"], "usage"
    if n_out is None:  # no usage in the stream: count content chunks, and say so
        n_out, source = len(stamps), "chunks"
    steps = client_decode_steps(n_out, row["finish_reason"], texts[0])
    tm = metrics.request_timing(stamps, row["t_send"], decode_steps=steps)
    base = {"ttft_s": tm["ttft_s"], "e2e_s": tm["e2e_s"], "tpot_s": tm["tpot_s"], "decode_tps": tm["decode_tps"],
            "output_tokens": int(n_out), "token_count_source": source, "prompt_tokens": row["prompt_tokens"],
            "finish_reason": row["finish_reason"], "itl_s": [], "chunk_itl_s": tm["itl_s"], "chunks": len(stamps),
            "decode_steps": steps, "text": row["text"], "engine_ttft_s": row["engine_ttft_s"],
            "engine_e2e_s": row["engine_e2e_s"], **row_fields(row, ep)}
    rows = reading.chunk_reader_rows(list(zip(stamps, texts)), row["t_send"], granularities, stall_s)
    return [{**base, **r, "repeat": repeat, "request_id": i} for i, r in enumerate(rows)]


def sender(ep: Endpoint, timeout: float = 600.0, temperature: float = 0.0, ignore_eos: bool = True) -> Callable:
    """The load generator's ``send(spec, t_scheduled) -> row`` (:func:`workbench.load.senders.http_sender`)
    against ``ep``: its URL, model, key. Engine-side columns come back NaN (an external server sends none) and
    each row's ``server_side_note`` says so. ``ignore_eos`` is sent as the vLLM extension; a server without it
    may stop early (``output_tokens`` is its ``usage`` count either way); ``ep.extra_body`` goes into every
    request."""
    from workbench.load.senders import http_sender

    send = http_sender(ep.url, model=ep.model, timeout=timeout, temperature=temperature, ignore_eos=ignore_eos,
                       headers=ep.headers(), extra_body=ep.extra_body)

    def send_noted(spec, t_scheduled):
        row = send(spec, t_scheduled)
        row["server_side_note"] = server_side_note(row)
        return row

    return send_noted
