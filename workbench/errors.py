"""The one error type users see for bad input.

:class:`ParameterError` carries a single line naming the parameter and the
allowed range; it is raised before any model loads. The command line prints
``error: <message>`` and exits with status 2.
"""


class ParameterError(ValueError):
    """Invalid user input: one line, naming the parameter and what is allowed."""
