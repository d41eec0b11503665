"""The one exception type the data library raises for bad input.

Every message names the file (and line, row or key) and says what was expected, so that a user can fix the input
without reading our code. The CLI prints these messages without a traceback.
"""

from __future__ import annotations

import errno
import reprlib
from typing import Any

__all__ = ["DataError", "is_disk_full", "shown", "yaml_problem"]

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 6, 6, 120, 60


class DataError(Exception):
    """Bad input or a mismatch between what a directory holds and what was asked."""


def shown(value: Any, limit: int = 200) -> str:
    """A value as an error message shows it: at most `limit` characters, however large or deeply nested it is
    (a YAML of nested aliases expands to billions of elements if printed whole)."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` is a write refused for want of space (or quota): the user's to fix, so commands turn it into a
    DataError naming the folder, after removing what they had half written."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def yaml_problem(e: Exception) -> str:
    """PyYAML's error (several lines: its context, the problem, where, and a quote of the file) as one clause:
    what is wrong and at which line and column, for a one-line message."""
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{context + ': ' if context else ''}{problem}{where}"
