"""Failures as users meet them: the statekit error first, not inside Java frames.

A statekit error raised in a task reaches the driver wrapped several times: a Python traceback
inside a Java stage failure, inside the query's failure (inside a ``foreachBatch`` failure when
the output goes to a Python sink).  :func:`statekit_error` finds the typed error in any of those,
and :func:`install` puts its one line at the top of the message of every exception PySpark
raises or returns for it (``query.awaitTermination()``, ``query.exception()``).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from statekit import errors

_FOUND = re.compile(r"statekit\.errors\.([A-Za-z]+Error): (.+)")


def _text(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    try:
        return str(getattr(exc, "_desc", None) or exc)
    except Exception:  # a Py4J error whose gateway is gone
        return ""


def statekit_error(exc: BaseException | str) -> errors.StatekitError | None:
    """The statekit error a Spark failure carries (typed, with its message), or None."""
    if isinstance(exc, errors.StatekitError):
        return exc
    match = _FOUND.search(_text(exc))
    if match is None:
        return None
    cls = getattr(errors, match.group(1), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.StatekitError)):
        cls = errors.StatekitError
    found = cls.__new__(cls)
    Exception.__init__(found, match.group(2).strip())
    return found


def headline(error: errors.StatekitError) -> str:
    """``MissingStateError: ...``: the line a user should read first."""
    return f"{type(error).__name__}: {error}"


_lock = threading.Lock()
_done = False


def install() -> None:
    """Put the statekit error first in PySpark's exceptions (idempotent)."""
    global _done
    with _lock:
        if _done:
            return
        from pyspark.errors.exceptions.captured import CapturedException

        original = CapturedException.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            found = statekit_error(self._desc or "")
            if found is not None and not str(self._desc).startswith("statekit "):
                self.statekit_error = found
                self._desc = f"statekit {headline(found)}\n\n{self._desc}"

        CapturedException.__init__ = init  # type: ignore[method-assign]
        _done = True
