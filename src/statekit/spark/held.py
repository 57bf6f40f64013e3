"""Output held back across keys and handed to PySpark in large pieces.

PySpark's ``transformWithStateInPandas`` worker turns every frame a key's call yields into an
Arrow batch of its own: about half a millisecond for a one-row frame, against some 20 µs a row
in a frame of a thousand rows.  Spark promises no order among a micro-batch's output rows, so the
adapters on that operator hold each key's output and hand it over in pieces of up to
:data:`LIMIT` rows; what is left goes out in the partition's timer phase, before its state
commits.  PySpark calls nothing after the last key in which a processor can yield output when
its time mode is ``None``, so the operator is built with :class:`HeldOutputUdfUtils`, PySpark's
own per-task driver of the processor plus that last flush; a processor built without it (a
PySpark that builds it differently) is not marked and yields each key's output as it comes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd

from statekit.errors import StatekitError

#: rows held before they go out (the default of spark.sql.execution.arrow.maxRecordsPerBatch)
LIMIT = 10_000
#: set on a processor whose operator flushes held output in its timer phase
MARK = "_statekit_flushes_held_output"


class HeldOutput:
    """Output frames (or Spark ``Row`` objects, for the Row API) of many keys' calls, given out
    in few pieces.  Frames are joined only with frames of the same columns and dtypes, so no
    value changes its type on the way."""

    def __init__(self, rows_api: bool, limit: int = LIMIT) -> None:
        self.rows_api = rows_api
        self.limit = limit
        self.rows: list[Any] = []
        self.frames: list[pd.DataFrame] = []
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, outputs: Iterable[Any]) -> Iterator[Any]:
        """Hold a call's outputs; a piece when the limit is reached.  A large frame, or one
        pandas cannot join, goes out at once; so does what is neither a frame nor a row (PySpark
        then refuses it as it would)."""
        for out in outputs:
            if isinstance(out, pd.DataFrame):
                if len(out) >= self.limit or not out.columns.is_unique:
                    yield out
                elif len(out):
                    self.frames.append(out)
                    self.count += len(out)
            elif self.rows_api and isinstance(out, tuple):  # pyspark.sql.Row is a tuple
                self.rows.append(out)
                self.count += 1
            else:
                yield out
        if self.count >= self.limit:
            yield from self.drain()

    def drain(self) -> Iterator[Any]:
        """Everything held, in as few pieces as the kinds of output allow."""
        rows, frames = self.rows, self.frames
        self.rows, self.frames, self.count = [], [], 0
        yield from rows
        groups: dict[tuple[Any, ...], list[pd.DataFrame]] = {}
        for frame in frames:
            groups.setdefault((tuple(frame.columns), tuple(frame.dtypes)), []).append(frame)
        for group in groups.values():
            yield group[0] if len(group) == 1 else pd.concat(group, ignore_index=True)

    def check_drained(self) -> None:
        """At the end of a task: output still held would be lost, so the task fails instead."""
        if self.count:
            raise StatekitError(f"{self.count} output rows were held past the partition's timer "
                                "phase (PySpark did not call it): the task fails rather than "
                                "lose them")


def holds(processor: Any) -> bool:
    """Whether the operator running ``processor`` flushes held output in its timer phase."""
    return bool(getattr(processor, MARK, False))


class HoldingProcessor:
    """What a statekit processor on the transformWithState operator adds to hold its output:
    :meth:`start_holding` in ``init`` on an executor, :meth:`held` around each call's output,
    :meth:`check_drained` in ``close``."""

    held_output: HeldOutput | None = None

    def start_holding(self, rows_api: bool) -> None:
        """Hold output from now on, if this task's operator flushes it."""
        self.held_output = HeldOutput(rows_api) if holds(self) else None

    def held(self, outputs: Iterable[Any]) -> Iterator[Any]:
        """A call's outputs as they go to PySpark now (all of them where nothing is held)."""
        held = self.held_output
        return iter(outputs) if held is None else held.add(outputs)

    def check_drained(self) -> None:
        """At ``close``: fail the task rather than lose output PySpark did not take."""
        if self.held_output is not None:
            self.held_output.check_drained()


def _utils_class() -> type:
    from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasUdfUtils

    class HeldOutputUdfUtils(TransformWithStateInPandasUdfUtils):
        """PySpark's per-task driver of a processor, which also gives out the processor's held
        output after its timers (in every time mode)."""

        def __init__(self, stateful_processor: Any, time_mode: str) -> None:
            super().__init__(stateful_processor, time_mode)
            if isinstance(stateful_processor, HoldingProcessor):
                setattr(stateful_processor, MARK, True)

        def _handle_expired_timers(self, client: Any) -> Iterator[Any]:
            yield from super()._handle_expired_timers(client)
            held = getattr(self._stateful_processor, "held_output", None)
            if held:
                yield from held.drain()

    HeldOutputUdfUtils.__module__ = __name__
    HeldOutputUdfUtils.__qualname__ = "HeldOutputUdfUtils"
    return HeldOutputUdfUtils


_MAKE = threading.Lock()
_SWAP = threading.Lock()


def __getattr__(name: str) -> Any:
    # the class derives from PySpark's, so it is made on first use (PySpark is an optional
    # extra); pickles name it as this module's attribute, which resolves here on the executors
    if name != "HeldOutputUdfUtils":
        raise AttributeError(name)
    with _MAKE:  # one class per process, whichever thread asks first; then a module global
        cls = globals().get(name)
        if cls is None:
            cls = globals()[name] = _utils_class()
        return cls


@contextmanager
def flushing_operator() -> Iterator[None]:
    """While a transformWithState operator is built: PySpark builds it with
    :class:`HeldOutputUdfUtils` (the only difference: held output is flushed)."""
    from pyspark.sql.streaming import stateful_processor_util as util

    cls = __getattr__("HeldOutputUdfUtils")
    with _SWAP:
        original = util.TransformWithStateInPandasUdfUtils
        util.TransformWithStateInPandasUdfUtils = cls
        try:
            yield
        finally:
            util.TransformWithStateInPandasUdfUtils = original
