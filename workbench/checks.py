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
                 "authorization", "cookie", "bearer"}


def secret_name(name) -> bool:
    """A field or variable name that says it holds a secret: one of its ``_`` / ``-`` / ``.`` separated words is
    ``key``, ``token``, ``secret``, ``password``, ``auth``, ... (``api_key``, ``HF_TOKEN``; not ``max_tokens``)."""
    import re

    return any(w in _SECRET_WORDS for w in re.split(r"[_\-.\s]+", str(name).lower()))
