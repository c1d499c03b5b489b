"""HTTP plumbing shared by every route of the server (chat, jobs, streams, metrics).

- **Errors** in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``: a route raises
  :class:`ApiError` (status, one-line message naming the field, ``param``, ``type``); the handlers that
  :func:`install_error_handlers` registers turn it, starlette's 404/405 and any unexpected exception into
  such a JSON body (a JSON 500, never a plain-text one). Every error carries ``Cache-Control: no-cache``.
- **The guard** (:class:`Guard`, pure ASGI middleware, so streaming and disconnect detection are untouched):
  a loopback-bound server answers only requests whose ``Host`` is a loopback name (421 otherwise: DNS
  rebinding); with an API key every path except ``/health`` needs ``Authorization: Bearer KEY`` (401).
  :func:`check_bind` refuses a non-loopback bind without a key (one line, before anything loads).
- **Request bodies** (:func:`read_json_object`): ``Content-Type: application/json`` (415 otherwise), at most
  ``max_body_bytes`` (413, checked on the declared length and while reading), JSON (400), an object (400),
  nested at most :data:`MAX_JSON_DEPTH` levels (400; iterative check, so a deep value cannot overflow the
  stack here).
  The body is read within ``body_read_timeout_s`` (``app.state.body_read_timeout_s``; 408 past it), so a
  client that sends its body slowly cannot hold a connection and a handler forever.
- **The chat request schema** (:func:`chat_schema`, pydantic, built lazily), :data:`UNSUPPORTED` OpenAI /
  vLLM options with their neutral values, and :func:`validation_error` (a pydantic error as a 400 naming
  the field).
- **The model field** (:func:`check_model`): a request naming a model must name the served one or one of
  its aliases: 404 ``NotFoundError`` with ``param: "model"`` as vLLM answers, 400 when longer than
  :data:`MAX_MODEL_NAME` characters. :func:`parameter_error`: a :class:`~workbench.errors.ParameterError`
  raised on a client's values as a 400 naming the request field.
- **Server faults** (5xx) are logged with their cause (``logging``, logger ``workbench.serving.http``); a
  client-caused condition is never a 5xx.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
from typing import Literal

from workbench.errors import ParameterError
from workbench.serving.protocol import API_KEY_ENV
from workbench.serving.scheduling import PRIORITY_MAX, PRIORITY_MIN

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
BODY_READ_TIMEOUT_S = 30.0   # a request body not fully received within this gets 408
MAX_MODEL_NAME = 256         # a longer ``model`` field gets 400 (it is echoed into every chunk)
#: request fields under the names :class:`~workbench.measure.generation.GenerationSettings` checks them
SETTING_FIELDS = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
MAX_JSON_DEPTH = 32          # deeper request bodies get 400
MAX_STOP = 4                 # stop strings per request (OpenAI's limit)
SEED_MAX = 2**63 - 1         # torch.manual_seed accepts [0, 2**63 - 1] here (workbench.checks.check_seed)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

#: OpenAI / vLLM request options this server does not implement, with the values that mean "not used";
#: any other value gets 400 naming the field (never silently ignored).
UNSUPPORTED = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []), "tool_choice": (None, "none"),
    "functions": (None, []), "function_call": (None, "none"), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "best_of": (None, 1),
    "echo": (None, False), "suffix": (None,), "prediction": (None,), "audio": (None,),
    "modalities": (None, ["text"]), "response_format": (None, {"type": "text"}), "use_beam_search": (None, False),
    "repetition_penalty": (None, 1, 1.0), "top_k": (None, 0, -1), "min_p": (None, 0, 0.0),
    "stop_token_ids": (None, []), "parallel_tool_calls": (None, True, False), "include_stop_str_in_output": (None, False),
}


#: the message of every 500 body: the cause (an exception's text) goes to the server's log only
INTERNAL_ERROR = "internal server error (the server's log has the cause)"


class ApiError(Exception):
    """A request that cannot be served: ``status`` (4xx/5xx), a one-line ``message`` naming the field,
    ``param`` (the field, or None), ``etype`` (the OpenAI error ``type``) and extra response ``headers``."""

    def __init__(self, status: int, message: str, param: str | None = None, etype: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.etype, self.headers = status, message, param, etype, headers


def error_response(status: int, message: str, param: str | None = None, etype: str = "invalid_request_error",
                   headers: dict | None = None):
    """A ``JSONResponse`` with the OpenAI error body and ``Cache-Control: no-cache``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": etype, "param": param, "code": None}},
        status_code=status, headers={"Cache-Control": "no-cache", **(headers or {})},
    )


def api_error_response(exc: ApiError):
    """:func:`error_response` of an :class:`ApiError`."""
    return error_response(exc.status, exc.message, param=exc.param, etype=exc.etype, headers=exc.headers)


CLIENT_GONE = 499  # nginx's "client closed request": the status a request whose client left is recorded with


def install_error_handlers(app) -> None:
    """Answer :class:`ApiError`, starlette's HTTP errors (404, 405) and any other exception as JSON errors."""
    from starlette.exceptions import HTTPException as StarletteHTTPException

    async def api_error(request, exc: ApiError):
        if exc.status >= 500:
            log.error("%s %s: %d %s", request.method, request.url.path, exc.status, exc.message)
        return api_error_response(exc)

    async def http_error(request, exc):
        return error_response(exc.status_code, str(exc.detail),
                              etype="not_found" if exc.status_code == 404 else "invalid_request_error")

    async def server_error(request, exc):  # a JSON 500, never starlette's plain-text one; logged with its cause
        from starlette.requests import ClientDisconnect

        if isinstance(exc, ClientDisconnect):  # the client left while its request was read: not a server fault
            log.info("%s %s: the client disconnected", request.method, request.url.path)
            return error_response(CLIENT_GONE, "the client disconnected", etype="client_disconnected")
        log.error("%s %s: 500 %s: %s", request.method, request.url.path, type(exc).__name__, exc,
                  exc_info=(type(exc), exc, exc.__traceback__))
        # the body never echoes the exception: its text may hold paths, settings or a secret; the log has it
        return error_response(500, INTERNAL_ERROR, etype="server_error")

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_error)


# --------------------------------------------------------------------------- the guard


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address or ``localhost``."""
    h = host.strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8000`` -> ``::1``, ``127.0.0.1:80`` -> ``127.0.0.1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def check_bind(host: str, api_key: str | None) -> bool:
    """Whether ``host`` is loopback; a non-loopback one without ``api_key`` is refused.

    Raises:
        ParameterError: (one line) binding a non-loopback address without an API key.
    """
    if is_loopback(host):
        return True
    if not api_key:
        raise ParameterError(f"host: binding the non-loopback address {host!r} needs an API key "
                             f"(--api-key KEY or {API_KEY_ENV}=KEY); clients then send 'Authorization: Bearer KEY'")
    return False


def check_port_free(host: str, port: int) -> None:
    """Refuse, before a model loads, a ``port`` this process cannot bind on ``host`` (another server holds it; a
    privileged port), with uvicorn's own socket options (``SO_REUSEADDR``): uvicorn would otherwise print its
    multi-line startup error after the model load. Port 0 (the OS picks a free one) is not checked. A port taken
    between this check and uvicorn's bind still fails there.

    Raises:
        ParameterError: (one line) the port in use, or not allowed.
    """
    import errno
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ParameterError(f"port: {port} on {host} is in use by another process (another --port, or "
                                     f"--port 0 for a free one)") from None
            if exc.errno == errno.EACCES:
                raise ParameterError(f"port: {port} needs privileges on this machine (a port from 1024 up, or "
                                     f"--port 0 for a free one)") from None
            raise ParameterError(f"host: cannot bind {host}:{port} ({exc.strerror or exc})") from None


class Guard:
    """ASGI middleware refusing other sites' requests before any route runs.

    Loopback binds (``allowed_hosts`` set): a ``Host`` header naming anything but a loopback name
    gets 421 (a DNS-rebinding page reaching 127.0.0.1 sends its own host name). With ``api_key``:
    every path except ``/health`` needs ``Authorization: Bearer <key>`` (401 otherwise).
    Pure ASGI (not ``BaseHTTPMiddleware``), so streaming and disconnect detection are untouched.
    """

    def __init__(self, app, allowed_hosts: set | None = None, api_key: str | None = None):
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.api_key = api_key

    @staticmethod
    def allowed_hosts_for(host: str) -> set | None:
        """The ``Host`` names a server bound to ``host`` answers: loopback names and its own (None: any)."""
        return set(LOOPBACK_NAMES | {host.strip("[]").lower()}) if is_loopback(host) else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if self.allowed_hosts is not None and host_name(headers.get("host", "")) not in self.allowed_hosts:
                resp = error_response(421, f"Host: {headers.get('host', '')!r} is not this loopback server's "
                                           "address (requests from other sites are refused)",
                                      param="Host", etype="misdirected_request")
                return await resp(scope, receive, send)
            if self.api_key is not None and scope.get("path") != "/health":
                if not bearer_matches(headers.get("authorization", ""), self.api_key):
                    resp = error_response(401, "Authorization: this server needs 'Authorization: Bearer <API key>'",
                                          param="Authorization", etype="authentication_error")
                    return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def bearer_matches(header: str, api_key: str) -> bool:
    """Whether an ``Authorization`` header carries ``api_key`` as a bearer token. The scheme is case-insensitive
    and may be followed by several spaces (RFC 9110 section 11.1: ``bearer KEY`` is ``Bearer KEY``); the key is
    compared in constant time."""
    parts = (header or "").strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return hmac.compare_digest(parts[1].strip().encode(), str(api_key).encode())


# --------------------------------------------------------------------------- request bodies


def json_depth(obj) -> int:
    """Nesting depth of a parsed JSON value (iterative: a deep value cannot overflow the stack here)."""
    depth, stack = 0, [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            depth = max(depth, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return depth


def _too_deep() -> ApiError:
    return ApiError(400, f"request body: JSON nested deeper than {MAX_JSON_DEPTH} levels")


async def read_json_object(request, max_body_bytes: int | None = None) -> dict:
    """The request's JSON object body, after the Content-Type, size, syntax and depth checks.

    ``max_body_bytes``: default the app's ``app.state.max_body_bytes`` (one cap for every route), else
    :data:`MAX_BODY_BYTES`. The body must arrive within ``app.state.body_read_timeout_s`` (default
    :data:`BODY_READ_TIMEOUT_S`).

    Raises:
        ApiError: 415 (not ``application/json``), 413 (over ``max_body_bytes``), 408 (body too slow), 400
            (not JSON, not an object, nested deeper than :data:`MAX_JSON_DEPTH`).
    """
    if max_body_bytes is None:
        max_body_bytes = getattr(request.app.state, "max_body_bytes", MAX_BODY_BYTES)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError(415, f"Content-Type: must be application/json (got {ctype or 'none'!r})",
                       param="Content-Type", etype="unsupported_media_type")
    too_large = ApiError(413, f"request body: must be at most {max_body_bytes} bytes", etype="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > max_body_bytes:
        raise too_large
    chunks = []
    timeout_s = getattr(request.app.state, "body_read_timeout_s", BODY_READ_TIMEOUT_S)

    async def read():
        size = 0
        async for part in request.stream():
            size += len(part)
            if size > max_body_bytes:
                raise too_large
            chunks.append(part)

    from starlette.requests import ClientDisconnect

    try:
        await asyncio.wait_for(read(), timeout_s)
    except ClientDisconnect:  # the client left mid-body: nobody to answer, and no server fault to log
        raise ApiError(CLIENT_GONE, "request body: the client disconnected before sending all of it",
                       etype="client_disconnected") from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"request body: not received within {timeout_s:g} s", etype="request_timeout",
                       headers={"Connection": "close"}) from None
    try:
        payload = json.loads(b"".join(chunks))
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body: must be JSON ({str(exc)[:200]})") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "request body: must be a JSON object")
    if json_depth(payload) > MAX_JSON_DEPTH:
        raise _too_deep()
    return payload


def check_model(name, served: tuple) -> str | None:
    """The ``model`` a request names (None: not given) when it is one of ``served`` (the served id first,
    then its aliases).

    Raises:
        ApiError: 400 (not a string, or longer than :data:`MAX_MODEL_NAME`), 404 ``NotFoundError`` (another
            model; the message lists the served ones), both with ``param: "model"``.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise ApiError(400, f"model: must be a string (got {type(name).__name__})", param="model")
    if len(name) > MAX_MODEL_NAME:
        raise ApiError(400, f"model: at most {MAX_MODEL_NAME} characters (got {len(name)})", param="model")
    if name not in served:
        raise ApiError(404, f"model: the model {name!r} does not exist; this server serves "
                            f"{', '.join(repr(m) for m in served)}", param="model", etype="NotFoundError")
    return name


def parameter_error(exc: ParameterError) -> ApiError:
    """A :class:`~workbench.errors.ParameterError` raised on a client's values as a 400 naming the request
    field (its message starts ``name:``; settings names become request names, :data:`SETTING_FIELDS`)."""
    msg = str(exc)
    name = msg.split(":", 1)[0].strip() if ":" in msg else ""
    param = SETTING_FIELDS.get(name, name) if name.isidentifier() else None
    if param and name != param:
        msg = param + msg[len(name):]
    return ApiError(400, msg, param=param)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "tagged-union"}


def validate(model, payload: dict):
    """``model.model_validate(payload)``; a schema violation is a 400 naming the field (its dotted path).

    Raises:
        ApiError: 400.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        e = exc.errors()[0]
        # a union's member names ("str", "list[int]") are pydantic's, not the client's field path
        param = ".".join(str(x) for x in e.get("loc", ()) if not (isinstance(x, str) and (x in _TYPE_TAGS or "[" in x)))
        raise ApiError(400, f"{param}: {e.get('msg')}", param=param or None) from None
    except RecursionError:
        raise _too_deep() from None


def chat_schema():
    """The ``/v1/chat/completions`` request model (pydantic, built lazily so importing this module stays cheap)."""
    from pydantic import BaseModel, ConfigDict, Field

    class TextPart(BaseModel):
        type: Literal["text"]
        text: str

    class Message(BaseModel):
        model_config = ConfigDict(extra="ignore")
        role: Literal["system", "user", "assistant"]
        content: str | list[TextPart]

        def text(self) -> str:
            return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    class StreamOptions(BaseModel):
        include_usage: bool = False
        resumable: bool = False  # keep generating after a disconnect (workbench.serving.events)
        queue_events: bool = False  # queue position / ETA events while waiting (workbench.serving.chat)

    class ChatRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")
        messages: list[Message] = Field(min_length=1)
        model: str | None = None
        max_tokens: int | None = Field(default=None, ge=1, strict=True)
        max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
        temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False, strict=True)
        top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, strict=True)
        seed: int | None = Field(default=None, ge=0, le=SEED_MAX, strict=True)
        n: int | None = Field(default=None, ge=1, strict=True)
        stop: str | list[str] | None = None
        stream: bool = False
        stream_options: StreamOptions | None = None
        ignore_eos: bool = False
        min_tokens: int = Field(default=0, ge=0, strict=True)
        priority: int = Field(default=0, ge=PRIORITY_MIN, le=PRIORITY_MAX, strict=True)  # lower first (vLLM)

    return ChatRequest


def completion_schema(chat_request=None):
    """The ``/v1/completions`` request model: the chat request's fields (``model``, ``max_tokens``, sampling,
    ``stop``, ``stream``, ``stream_options``, ``ignore_eos``, ``min_tokens``, ``priority``) with a ``prompt`` (a
    string or token ids, or a list holding one of them: one prompt a request) for ``messages``. ``chat_request``:
    the chat model to derive from (default: :func:`chat_schema`'s)."""
    from pydantic import Field, create_model

    chat = chat_request or chat_schema()
    fields = {name: (f.annotation, f) for name, f in chat.model_fields.items() if name != "messages"}
    prompt = str | list[int] | list[str] | list[list[int]]
    return create_model("CompletionRequest", __config__=chat.model_config, prompt=(prompt, Field()), **fields)
