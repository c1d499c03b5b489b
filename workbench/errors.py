"""The one error type users see for bad input, and the one line an exception becomes in a row or a log.

:class:`ParameterError` carries a single line naming the parameter and the
allowed range; it is raised before any model loads. The command line prints
``error: <message>`` and exits with status 2. :func:`exception_line` is how a failed request, engine step or stream
is written down (``Type: first line of the message``).
"""


class ParameterError(ValueError):
    """Invalid user input: one line, naming the parameter and what is allowed."""


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` of ``exc`` (one line, at most ``limit`` characters)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:limit]
