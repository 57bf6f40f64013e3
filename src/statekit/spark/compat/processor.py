"""Spark's ``transformWithStateInPandas`` / ``transformWithState`` on statekit state: a user's
unchanged ``StatefulProcessor`` subclass, with statekit holding every state variable and timer.

Per task (a partition of a micro-batch) the processor is copied fresh, ``init`` runs with a
:class:`~statekit.spark.compat.handle.Handle` on the partition's statekit state, then
``handleInitialState`` (first batch), ``handleInputRows`` per key with input, ``handleExpiredTimer``
per due timer after all input (Spark's order), and ``close``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from statekit.errors import ConfigTypeError
from statekit.runtime.functions import KeyedProcessFunction
from statekit.spark.clock import time_mode as time_mode_of
from statekit.spark.compat.bridge import CompatFunction, flatten, run, spark_key
from statekit.spark.compat.handle import Handle
from statekit.spark.task import PartitionTask


class _BatchTime:
    """The TTL clock of a partition's backend: the running batch's processing time."""

    def __init__(self, function: ProcessorFunction) -> None:
        self.function = function

    def __call__(self) -> int:
        task = self.function.task
        return 0 if task is None else int(task.clock.now)


class TimerHandle(Handle):
    """The handle during a timer's call: the firing timer is listed until the call deletes it
    (Spark removes it only after ``handleExpiredTimer`` returns)."""

    firing: int | None = None

    def listTimers(self) -> Iterator[int]:
        listed = list(super().listTimers())
        if self.firing is not None and self.firing not in listed:
            listed = sorted([*listed, self.firing])
        return iter(listed)

    def deleteTimer(self, expiryTimestampMs: int) -> None:
        if self.firing is not None and int(expiryTimestampMs) == self.firing:
            self.firing = None
        super().deleteTimer(expiryTimestampMs)


class ProcessorFunction(CompatFunction):
    """Runs a Spark ``StatefulProcessor`` per key on statekit state."""

    def __init__(self, processor: Any, time_mode: str, parsed: dict[str, Any]) -> None:
        self.processor = processor
        self.time_mode = time_mode
        self.parsed = parsed
        self.user: Any = None
        self.handle: TimerHandle | None = None

    def begin(self, task: PartitionTask) -> None:
        super().begin(task)
        backend = task.backend
        if not isinstance(backend.clock, _BatchTime):  # before init declares TTL states
            backend.clock = _BatchTime(self)
        self.user = copy.deepcopy(self.processor)  # Spark gives each task a fresh processor
        self.handle = TimerHandle(self.time_mode, self.context, task.op.timers, self.parsed,
                                  task.info.batch_id)
        self.user.init(self.handle)
        self.handle.in_init = False

    def end(self) -> None:
        self.user.close()

    def _timer_values(self) -> Any:
        from pyspark.sql.streaming.stateful_processor import TimerValues

        task = self.task
        assert task is not None
        if self.time_mode == "None":
            return TimerValues()
        watermark = task.op.timers.watermark
        return TimerValues(task.clock.now, watermark if watermark >= 0 else 0)

    def on_input(self, key: tuple[Any, ...], rows: Iterator[Any], timer_values: Any
                 ) -> Iterator[Any]:
        return iter(flatten(self.user.handleInputRows(key, rows, timer_values)))

    def on_initial_state(self, key: tuple[Any, ...], initial_state: Any, timer_values: Any
                         ) -> None:
        self.user.handleInitialState(key, initial_state, timer_values)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> list[Any]:
        from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo

        handle = self.handle
        assert handle is not None
        handle.firing = timestamp
        try:
            return flatten(self.user.handleExpiredTimer(
                spark_key(ctx.get_current_key()), self._timer_values(),
                ExpiredTimerInfo(timestamp)))
        finally:
            handle.firing = None


def _check(processor: Any, time_mode: str) -> dict[str, Any]:
    """Refuse at the call what would fail in every task: not a processor, or an ``init`` that
    misuses the handle (run once here on a copy, as Spark runs it on its driver).  The DDL
    schema strings ``init`` declares, parsed."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    if not isinstance(processor, StatefulProcessor):
        raise ConfigTypeError("statefulProcessor", "expected a pyspark StatefulProcessor, got "
                                                   f"{type(processor).__name__}")
    trial = copy.deepcopy(processor)
    handle = Handle(time_mode)
    trial.init(handle)
    return handle.parsed


def _transform(grouped_df: Any, statefulProcessor: Any, outputStructType: Any, outputMode: str,
               timeMode: str, initialState: Any, eventTimeColumnName: str, rows_api: bool
               ) -> Any:
    mode = time_mode_of(timeMode)
    function = ProcessorFunction(statefulProcessor, mode, _check(statefulProcessor, mode))
    return run(grouped_df, function, outputStructType, outputMode, mode, rows_api=rows_api,
               initial_state=initialState, event_time_column_name=eventTimeColumnName,
               operator_id=type(statefulProcessor).__name__)


def transform_with_state_in_pandas(grouped_df: Any, statefulProcessor: Any,
                                   outputStructType: Any, outputMode: str, timeMode: str,
                                   initialState: Any = None, eventTimeColumnName: str = "") -> Any:
    """Spark's ``GroupedData.transformWithStateInPandas`` (same arguments and meaning) with
    statekit holding the state; the backend comes from ``spark.statekit.*`` conf."""
    return _transform(grouped_df, statefulProcessor, outputStructType, outputMode, timeMode,
                      initialState, eventTimeColumnName, rows_api=False)


def transform_with_state(grouped_df: Any, statefulProcessor: Any, outputStructType: Any,
                         outputMode: str, timeMode: str, initialState: Any = None,
                         eventTimeColumnName: str = "") -> Any:
    """Spark's ``GroupedData.transformWithState`` (the Row API) with statekit holding the
    state."""
    return _transform(grouped_df, statefulProcessor, outputStructType, outputMode, timeMode,
                      initialState, eventTimeColumnName, rows_api=True)
