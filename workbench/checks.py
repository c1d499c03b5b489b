"""The one-line parameter validators every config uses.

Each check returns the value (converted where harmless, e.g. an int given for a float) and raises
:class:`workbench.errors.ParameterError` with one line that names the parameter and the allowed
range, before any model loads. Booleans are never accepted as numbers; NaN and infinities are never
accepted as floats; list parameters must be non-empty and free of duplicate values (a duplicate grid
value would measure the same point twice).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from workbench.errors import ParameterError


def _range_text(lo, hi, lo_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"<= {hi}"
    return ""


def _in_range(v, lo, hi, lo_open: bool) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    return hi is None or v <= hi


def check_int(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool) in ``[lo, hi]``; either bound may be None.

    Raises:
        ParameterError: ``"<name>: must be an integer >= lo (got ...)"``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not _in_range(value, lo, hi, False):
        rng = _range_text(lo, hi)
        raise ParameterError(f"{name}: must be an integer{' ' + rng if rng else ''} (got {value!r})")
    return int(value)


def check_float(name: str, value, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """A finite real number (int accepted, bool refused) in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``).

    Raises:
        ParameterError: not a number, NaN/infinite, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(f"{name}: must be a number (got {value!r})")
    if not math.isfinite(value):
        raise ParameterError(f"{name}: must be a finite number (got {value!r})")
    if not _in_range(value, lo, hi, lo_open):
        raise ParameterError(f"{name}: must be {_range_text(lo, hi, lo_open)} (got {value!r})")
    return float(value)


def check_bool(name: str, value) -> bool:
    """``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ParameterError(f"{name}: must be true or false (got {value!r})")
    return value


def check_choice(name: str, value, allowed: Iterable) -> str:
    """One of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ParameterError(f"{name}: must be one of {', '.join(map(str, allowed))} (got {value!r})")
    return value


def _check_list(name: str, values, allow_empty: bool) -> list:
    if not isinstance(values, (list, tuple)) or (len(values) == 0 and not allow_empty):
        raise ParameterError(f"{name}: must be a {'' if allow_empty else 'non-empty '}list (got {values!r})")
    seen = []
    for v in values:
        if v in seen and not isinstance(v, bool):
            raise ParameterError(f"{name}: duplicate value {v!r} (each grid value is measured once)")
        seen.append(v)
    return list(values)


def _each(name: str, values: Sequence, check, **kw) -> list:
    out = []
    for v in values:
        try:
            out.append(check(name, v, **kw))
        except ParameterError as e:
            raise ParameterError(str(e).replace(f"{name}: must be", f"{name}: every value must be", 1)) from None
    return out


def check_int_list(name: str, values, lo: int | None = None, hi: int | None = None, allow_empty: bool = False) -> list:
    """A non-empty list of distinct integers in ``[lo, hi]``."""
    return _each(name, _check_list(name, values, allow_empty), check_int, lo=lo, hi=hi)


def check_float_list(name: str, values, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
                     allow_empty: bool = False) -> list:
    """A non-empty list of distinct finite numbers in ``[lo, hi]``."""
    return _each(name, _check_list(name, values, allow_empty), check_float, lo=lo, hi=hi, lo_open=lo_open)


def check_choice_list(name: str, values, allowed: Iterable, allow_empty: bool = False) -> list:
    """A non-empty list of distinct members of ``allowed``."""
    allowed = tuple(allowed)
    return _each(name, _check_list(name, values, allow_empty), check_choice, allowed=allowed)


def check_str_list(name: str, values, allow_empty: bool = False) -> list:
    """A non-empty list of distinct non-empty strings."""
    for v in _check_list(name, values, allow_empty):
        if not isinstance(v, str) or not v:
            raise ParameterError(f"{name}: every value must be a non-empty string (got {v!r})")
    return list(values)


def check_seed(name: str, value) -> int:
    """A seed ``torch.manual_seed`` accepts: an integer in ``[0, 2**63 - 1]``."""
    return check_int(name, value, 0, 2**63 - 1)


def int_or(value, default: int) -> int:
    """``int(value)`` of a table cell, ``default`` where it is missing (None, NaN, or 0/empty when falsy).

    A cell read from a DataFrame row is NaN where its column is absent for that point, and NaN is truthy, so
    ``int(row.get(c) or default)`` raises on it; this does not.
    """
    try:
        if value is None or value != value or not value:
            return int(default)
    except (TypeError, ValueError):  # an array-like or odd object: treat as missing
        return int(default)
    return int(value)



def float_or_nan(value) -> float:
    """``float(value)`` of a table cell or a JSON value, NaN where it cannot be one (None, a string that is not a
    number, an odd object): the one "float or NaN" every reader of rows and configs uses."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def finite_or_none(value) -> float | None:
    """:func:`float_or_nan`, with None for NaN and the infinities (what a JSON export writes for a missing figure)."""
    f = float_or_nan(value)
    return f if math.isfinite(f) else None


def config_defaults(cls) -> dict:
    """``{field: default}`` of a dataclass (a notebook's typed Config): each field's default, or its default
    factory called; fields without one are left out. Nothing is validated (no instance is built)."""
    import dataclasses

    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


_SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials", "auth",
                 "authorization", "cookie", "bearer", "sig", "signature"}
#: a name ending in one of these words holds the NAME of a variable (``api_key_env``), not the secret itself
_NAME_WORDS = {"env", "var", "vars"}
MASK = "***"   # what a record shows in place of a secret


def _words(name) -> list[str]:
    import re

    return [w for w in re.split(r"[_\-.\s]+", str(name).lower()) if w]


def secret_name(name) -> bool:
    """A field or variable name that says it holds a secret: one of its ``_`` / ``-`` / ``.`` separated words is
    ``key``, ``token``, ``secret``, ``password``, ``auth``, ... (``api_key``, ``HF_TOKEN``; not ``max_tokens``)."""
    return any(w in _SECRET_WORDS for w in _words(name))


def _holds_secret(key) -> bool:
    """A mapping key whose value is a secret: secret-named, and not the name of a variable (``api_key_env``)."""
    words = _words(key)
    return secret_name(key) and not (words and words[-1] in _NAME_WORDS)


def _url_secrets(text: str) -> list[str]:
    """What of an ``http(s)://`` URL is a secret: ``user:password@`` credentials, and query parameters with a
    secret name (``?api_key=...``, ``&sig=...``); their names (never the values)."""
    from urllib.parse import parse_qsl, urlsplit

    if not isinstance(text, str) or not text.lower().startswith(("http://", "https://")):
        return []
    try:
        parts = urlsplit(text)
        out = ["credentials (user:password@)"] if "@" in parts.netloc else []
        return out + [k for k, _ in parse_qsl(parts.query, keep_blank_values=True) if _holds_secret(k)]
    except ValueError:
        return []


def secret_paths(value, prefix: str = "") -> list[str]:
    """Where ``value`` (JSON-like: mappings, lists, strings) holds a secret, at any depth: the dotted path of every
    secret-named key (:func:`secret_name`; a name ending ``_env`` / ``_var`` names a variable and is not one) and of
    every URL whose query or user part carries one (``endpoint.url?api_key``). Paths only, never values."""
    out: list[str] = []
    stack = [(value, prefix)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                p = f"{path}.{k}" if path else str(k)
                if _holds_secret(k):
                    out.append(p)
                else:
                    stack.append((x, p))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, str):
            out += [f"{path}?{k}" if not k.startswith("credentials") else f"{path} {k}" for k in _url_secrets(v)]
    return sorted(out)


def check_no_secrets(name: str, value) -> None:
    """Refuse a secret anywhere in ``value`` (:func:`secret_paths`), before anything records it.

    Raises:
        ParameterError: one line naming where (never the value), and how to pass a key instead.
    """
    found = secret_paths(value, name)
    if found:
        raise ParameterError(f"{found[0].split('.')[0].split('[')[0].split('?')[0]}: {', '.join(found[:5])} "
                             f"{'looks' if len(found) == 1 else 'look'} like a secret, and parameters are recorded "
                             "with the run (manifest, notebooks, report); give a key through the NAME of an "
                             "environment variable (endpoint.api_key_env) instead")


def _mask_url(text: str) -> str:
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(text)
        netloc = parts.netloc.rsplit("@", 1)[-1] if "@" in parts.netloc else parts.netloc
        query = urlencode([(k, MASK if _holds_secret(k) else v)
                           for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
        return urlunsplit((parts.scheme, (MASK + "@" if "@" in parts.netloc else "") + netloc, parts.path, query,
                           parts.fragment))
    except ValueError:
        return MASK


def mask_secrets(value):
    """A copy of ``value`` with every secret :func:`secret_paths` finds replaced by :data:`MASK` (a secret-named
    key's value; a URL's credentials and secret query values): what a run may record (manifest, resume identity,
    an executed notebook's parameters, the report's configuration table)."""
    if isinstance(value, dict):
        return {k: (MASK if _holds_secret(k) else mask_secrets(x)) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(x) for x in value)
    if isinstance(value, str) and _url_secrets(value):
        return _mask_url(value)
    return value


def mask_argv(argv: list) -> list[str]:
    """A command line as a run may record it (``sessions[].argv``): the value of a secret-named option
    (``--api-key X``, ``--api-key=X``, ``-p auth_token X``) masked, and a mapping given as YAML / JSON text
    (``-p endpoint '{...}'``) with its secrets masked (:func:`mask_secrets`). Flags that only allow something
    (``--allow-...``) take no value and are kept."""
    out, hide = [], False
    for item in map(str, argv):
        if hide:
            out.append(MASK)
            hide = False
            continue
        name, eq, _ = item.partition("=")
        if name.startswith("-") and _holds_secret(name.lstrip("-")) and _words(name)[0] not in ("allow", "no"):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(item)
                hide = True
            continue
        if not item.startswith("-") and _holds_secret(item) and out and out[-1] in ("-p", "--param"):
            out.append(item)   # -p NAME VALUE: the NAME stays, its value goes
            hide = True
            continue
        out.append(_mask_text(item))
    return out


def _mask_text(item: str) -> str:
    """One command-line word: a URL with its secrets masked, a YAML / JSON mapping or list with its secrets
    masked (re-written as JSON), anything else as it is."""
    if _url_secrets(item):
        return _mask_url(item)
    if item.lstrip()[:1] in ("{", "["):
        import json

        try:
            import yaml

            parsed = yaml.safe_load(item)
            if expanded_size(parsed) > MAX_DATA_NODES:
                return MASK   # an alias bomb: nothing of it is worth recording
        except Exception:  # noqa: BLE001 - not data: kept as typed
            return item
        if secret_paths(parsed):
            return json.dumps(mask_secrets(parsed))
    return item


# ----------------------------------------------------------------------------- sizes of what comes from a file

#: Bounds on inputs people share as files (traces, calibrations, suites, parameter files) and on the sizes a
#: simulation takes from them (issue 51): far above any real input, low enough that one bad file cannot exhaust the
#: machine (a residual table naming batch size 10**9 asked for 7.45 GiB; a trace request of 2e9 output tokens 15 GiB).
MAX_INPUT_BYTES = 64 << 20       # a trace, calibration, device profile, model config, suite or parameter file
MAX_REQUEST_TOKENS = 1 << 20     # prompt or output tokens of one simulated request (a million-token context)
MAX_BATCH_SIZE = 4096            # rows of one batch (the twin's engines, a calibration's residual table)
MAX_REQUESTS = 100_000           # requests in a trace or a simulated point (the twin: ~20 s, ~0.5 GiB at 100k)
MAX_DATA_NODES = 1_000_000       # values in one YAML document once its aliases are expanded (billion laughs)


def check_file_size(name: str, path, limit: int | None = None) -> None:
    """Refuse a file larger than ``limit`` bytes (default :data:`MAX_INPUT_BYTES`) before reading it.

    Raises:
        ParameterError: ``"<name>: <path> is N bytes; at most L bytes are read"`` (one line).
    """
    import os

    limit = MAX_INPUT_BYTES if limit is None else limit
    size = os.path.getsize(path)
    if size > limit:
        raise ParameterError(f"{name}: {str(path)!r} is {size} bytes; at most {limit} bytes are read")


def expanded_size(value, limit: int = MAX_DATA_NODES) -> int:
    """How many values ``value`` holds with every shared reference counted where it appears (what a YAML alias
    becomes once anything walks or serialises it), counted without expanding it (each container once, memoised);
    stops counting past ``limit`` (returns ``limit + 1``).

    Raises:
        ParameterError: a container that holds itself (a recursive YAML alias).
    """
    memo: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(value, False)]

    def kids(v):
        return list(v.values()) if isinstance(v, dict) else list(v)

    while stack:
        v, done = stack.pop()
        if not isinstance(v, (dict, list, tuple)):
            continue
        i = id(v)
        if done:
            on_path.discard(i)
            total = 1 + sum(memo[id(k)] if isinstance(k, (dict, list, tuple)) else 1 for k in kids(v))
            memo[i] = min(total, limit + 1)
            continue
        if i in memo:
            continue
        if i in on_path:
            raise ParameterError("YAML: a value refers to itself (a recursive alias); it has no finite form")
        on_path.add(i)
        stack.append((v, True))
        for k in kids(v):
            if isinstance(k, (dict, list, tuple)):
                if id(k) in on_path:
                    raise ParameterError("YAML: a value refers to itself (a recursive alias); it has no finite form")
                if id(k) not in memo:
                    stack.append((k, False))
    return memo.get(id(value), 1)


def check_expanded_size(name: str, value, limit: int = MAX_DATA_NODES):
    """``value`` when it holds at most ``limit`` values with its aliases expanded (:func:`expanded_size`).

    Raises:
        ParameterError: one line naming ``name`` and the limit.
    """
    if expanded_size(value, limit) > limit:
        raise ParameterError(f"{name}: holds more than {limit} values once its YAML aliases (*name) are expanded; "
                             "write the data out or use fewer aliases")
    return value
