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
adapter's own and the user's sinks on the other adapters' outputs), and counts the calls in
flight, so that :func:`interruptible` can let them end before Spark stops.

Ctrl-C is the other unclean stop: PySpark's SIGINT handler calls into the JVM from inside the
call it interrupts, which fails and logs several tracebacks, and a Spark stopped while a batch
still runs logs more.  :func:`interruptible` turns Ctrl-C into a plain ``KeyboardInterrupt``
and stops the queries quietly before it reaches the caller.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Iterator
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
_in_flight = threading.Condition()
_calls = 0


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
            global _calls
            with _in_flight:
                _calls += 1
            try:
                original(self, jdf, batch_id)
            except Exception as exc:
                if interrupted(exc):
                    raise _short(batch_id) from None
                raise
            finally:
                with _in_flight:
                    _calls -= 1
                    _in_flight.notify_all()

        ForeachBatchFunction.call = call  # type: ignore[method-assign]
        _done = True


def wait_for_batches(timeout: float) -> bool:
    """Wait until no ``foreachBatch`` call runs in this process (at most ``timeout`` seconds)."""
    with _in_flight:
        return _in_flight.wait_for(lambda: _calls == 0, timeout)


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """A log record that is not a report of a call Ctrl-C interrupted (the driver's, or a batch
    the stopping query interrupted)."""
    kind = record.exc_info[0] if record.exc_info else None
    if kind is not None and issubclass(kind, KeyboardInterrupt | BrokenPipeError | QueryInterrupted):
        return False
    return "KeyboardInterrupt" not in record.getMessage()


_LOGGERS = ("", "py4j", "py4j.java_gateway", "py4j.clientserver")


@contextlib.contextmanager
def interruptible(spark: Any, wait: float = 30.0) -> Iterator[None]:
    """Ctrl-C inside the block stops this session's streaming queries cleanly and quietly, then
    raises ``KeyboardInterrupt``: one line instead of PySpark's tracebacks.

    Inside the block SIGINT raises a plain ``KeyboardInterrupt`` (PySpark's own handler calls
    into the JVM from the interrupted call), and py4j's reports of the interrupted call are left
    out.  On the way out the queries are stopped, and the ``foreachBatch`` calls still running
    are given ``wait`` seconds to end, so that stopping Spark afterwards interrupts nothing.  A
    batch the stop interrupted is not committed: the next run on the same checkpoint location
    processes it again, exactly once.  Spark's log level is left at OFF after an interrupt (the
    session is stopping).  Off the main thread, where no SIGINT arrives, the handler is kept.
    """
    install()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_not_an_interrupt)
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):  # already stopping: what is left is Spark's to report
            spark.sparkContext.setLogLevel("OFF")
            for query in spark.streams.active:
                query.stop()
        wait_for_batches(wait)
        raise
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        for name in _LOGGERS:
            logging.getLogger(name).removeFilter(_not_an_interrupt)
