"""Clean ``query.stop()`` for queries with Python ``foreachBatch`` functions.

When ``stop()`` interrupts a batch, the Python ``foreachBatch`` function sees the interruption as
a ``Py4JJavaError`` whose text carries a whole Java stack trace.  Spark decides whether a failure
is "just the stop" by matching the error text against a regular expression with a repeated
alternation (``StreamExecution.PROXY_ERROR``); Java's regex engine recurses once per character
there, so on a long text the check itself dies with a ``StackOverflowError`` printed by the stream
thread (about a thousand lines), and the query is never marked as cleanly stopped.

The fix keeps the text short: an interrupted ``foreachBatch`` call is re-raised as
:class:`QueryInterrupted`, whose one-line message is exactly what Spark's check recognizes.
:func:`install` applies it to every ``foreachBatch`` function of the process (the statekit
adapter's own and the user's sinks on the other adapters' outputs); nothing else changes.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

#: Java exceptions Spark treats as "interrupted by stop"
INTERRUPTIONS = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                 "java.nio.channels.ClosedByInterruptException")
#: how a job cancelled by the stop reports itself (Spark 4, and the older wording)
CANCELLED = ("[SPARK_JOB_CANCELLED]", "cancelled part of cancelled job group")


class QueryInterrupted(Exception):
    """A ``foreachBatch`` call ended because its query was stopped (or its job cancelled)."""


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` (from a Spark action) reports an interruption or a cancelled job group."""
    try:
        text = str(exc)
    except Exception:  # the gateway may already be gone while the query stops
        return True
    return any(name in text for name in (*INTERRUPTIONS, *CANCELLED))


def _short(batch_id: Any) -> QueryInterrupted:
    return QueryInterrupted(
        f"batch {batch_id} was interrupted by query.stop() (py4j.protocol.Py4JJavaError: "
        f"An error occurred while calling foreachBatch: {INTERRUPTIONS[0]})")


_installed = threading.Lock()
_done = False


def install() -> None:
    """Make every Python ``foreachBatch`` function of this process stop cleanly (idempotent)."""
    global _done
    with _installed:
        if _done:
            return
        from pyspark.sql.utils import ForeachBatchFunction

        original = ForeachBatchFunction.call

        @functools.wraps(original)
        def call(self: Any, jdf: Any, batch_id: int) -> None:
            try:
                original(self, jdf, batch_id)
            except Exception as exc:
                if interrupted(exc):
                    raise _short(batch_id) from None
                raise

        ForeachBatchFunction.call = call  # type: ignore[method-assign]
        _done = True
