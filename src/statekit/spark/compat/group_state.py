"""Spark's ``applyInPandasWithState`` on statekit state: the user's unchanged
``func(key, pdf_iter, state: GroupState)`` with statekit holding each key's state and timeout.

The function gets a real :class:`pyspark.sql.streaming.state.GroupState` (a subclass), so Spark's
rules and errors apply as Spark defines them; its misuse errors are also statekit's typed errors.
A key's value and timeout live in one statekit value state; the timeout is a statekit timer
(processing time under ``ProcessingTimeTimeout``, event time under ``EventTimeTimeout``) one
millisecond after it, as Spark times a key out in the first batch whose time is *past* its
timeout.  Spark's rules: the timeout is reset on every call (set it again each call), a key with
input in a batch is never timed out in it, and a key whose state was removed without a new
timeout is forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from statekit.errors import ConfigError, StateTypeError
from statekit.runtime.functions import KeyedProcessFunction, RuntimeContext
from statekit.runtime.timers import TimeDomain
from statekit.spark.compat.bridge import CompatFunction, flatten, run, spark_key
from statekit.spark.compat.errors import spark_error, spark_errors_typed
from statekit.state.descriptors import ValueStateDescriptor

#: GroupStateTimeout -> the time mode of Spark's operator statekit runs it on
TIME_MODES = {"NoTimeout": "None", "ProcessingTimeTimeout": "ProcessingTime",
              "EventTimeTimeout": "EventTime"}
NO_TIMESTAMP = -1
#: the one state a key holds: (value as Spark's internal row or None, timeout or -1)
STATE = "groupState"


def _group_state_class() -> type:
    from pyspark.sql.streaming.state import GroupState

    class StatekitGroupState(GroupState):
        """Spark's GroupState for one call of the user's function, held by statekit."""

        update = spark_errors_typed(GroupState.update)
        setTimeoutDuration = spark_errors_typed(GroupState.setTimeoutDuration)
        setTimeoutTimestamp = spark_errors_typed(GroupState.setTimeoutTimestamp)
        getCurrentWatermarkMs = spark_errors_typed(GroupState.getCurrentWatermarkMs)

        @property
        def get(self) -> tuple[Any, ...]:
            if not self.exists:
                raise spark_error("ValueError", "STATE_NOT_EXISTS", {})
            return tuple(self._value)

    return StatekitGroupState


class GroupStateFunction(CompatFunction):
    """Runs a Spark ``applyInPandasWithState`` function per key on statekit state."""

    def __init__(self, func: Callable[..., Any], state_schema: Any, timeout_conf: str,
                 watermark_present: bool) -> None:
        self.func = func
        self.state_schema = state_schema
        self.timeout_conf = timeout_conf
        self.watermark_present = watermark_present
        self.domain = (TimeDomain.EVENT_TIME if timeout_conf == "EventTimeTimeout"
                       else TimeDomain.PROCESSING_TIME)

    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)
        self.state = runtime_context.get_state(ValueStateDescriptor(STATE))
        self.group_state = _group_state_class()
        self.started = 0

    def begin(self, task: Any) -> None:
        super().begin(task)
        self.started = time.time_ns() // 1_000_000  # where Spark's server tells no batch time

    def _times(self) -> tuple[int, int]:
        task = self.task
        assert task is not None
        watermark = task.op.timers.watermark
        return (task.clock.now or self.started), watermark if watermark >= 0 else NO_TIMESTAMP

    def _call(self, key: tuple[Any, ...], frames: Iterator[Any], timed_out: bool) -> list[Any]:
        from pyspark.sql import Row

        stored = self.state.value()
        value, old_timeout = (None, NO_TIMESTAMP) if stored is None else stored
        if value is not None:
            value = Row(*self.state_schema.fromInternal(tuple(value)))
        processing, watermark = self._times()
        state = self.group_state(
            optionalValue=value, batchProcessingTimeMs=processing,
            eventTimeWatermarkMs=watermark, timeoutConf=self.timeout_conf,
            hasTimedOut=timed_out, watermarkPresent=self.watermark_present,
            defined=value is not None, updated=False, removed=False,
            timeoutTimestamp=NO_TIMESTAMP, keyAsUnsafe=b"", valueSchema=self.state_schema)
        # as on Spark: each call starts without a timeout (set it again every call), and
        # oldTimeoutTimestamp is that of the call's fresh state, not the key's stored one
        out = flatten(self.func(key, frames, state))
        self._save(state, old_timeout, timed_out)
        return out

    def _save(self, state: Any, old_timeout: int, timed_out: bool) -> None:
        """Spark's rules for writing a key's state after a call, with its timeout's timer."""
        timeout = int(state._timeout_timestamp)
        timers = self.context_timers()
        if old_timeout != NO_TIMESTAMP and not timed_out and old_timeout != timeout:
            timers.delete(self.domain, old_timeout + 1)
        if timeout != NO_TIMESTAMP and (timeout != old_timeout or timed_out):
            timers.register(self.domain, timeout + 1)
        if state._removed and timeout == NO_TIMESTAMP:
            self.state.clear()
            return
        if state._updated or state._removed or timeout != old_timeout:
            value = None
            if state.exists:
                value = self.state_schema.toInternal(tuple(state._value))
                if len(value) != len(self.state_schema.fields):
                    raise StateTypeError(
                        f"GroupState.update got {len(value)} values for stateStructType "
                        f"{self.state_schema.simpleString()}", STATE)
            self.state.update((value, timeout))

    def restore(self, value: Any, timeout: int) -> None:
        """Set the current key's state as Spark's store held it (a state import): its value (a
        tuple of ``stateStructType`` or None) and its timeout (-1: none), with the timer."""
        if timeout != NO_TIMESTAMP:
            self.context_timers().register(self.domain, timeout + 1)
        if value is not None or timeout != NO_TIMESTAMP:
            stored = None if value is None else self.state_schema.toInternal(tuple(value))
            self.state.update((stored, timeout))

    def context_timers(self) -> Any:
        task = self.task
        assert task is not None
        return task.op.timers

    def on_input(self, key: tuple[Any, ...], rows: Iterator[Any], timer_values: Any
                 ) -> Iterator[Any]:
        return iter(self._call(key, rows, timed_out=False))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> list[Any]:
        return self._call(spark_key(ctx.get_current_key()), iter(()), timed_out=True)


def apply_in_pandas_with_state(grouped_df: Any, func: Callable[..., Any], outputStructType: Any,
                               stateStructType: Any, outputMode: str, timeoutConf: str) -> Any:
    """Spark's ``GroupedData.applyInPandasWithState`` (same arguments and meaning) with statekit
    holding the state; the backend comes from ``spark.statekit.*`` conf."""
    from statekit.spark.adapters import _struct
    from statekit.spark.clock import has_watermark

    timeout = str(getattr(timeoutConf, "value", timeoutConf))
    if timeout not in TIME_MODES:
        raise ConfigError("timeoutConf", f"expected one of {', '.join(TIME_MODES)} "
                                         f"(GroupStateTimeout), got {timeoutConf!r}")
    if not callable(func):
        raise TypeError(f"applyInPandasWithState needs a function, got {type(func).__name__}")
    spark = grouped_df._df.sparkSession
    state_schema = _struct(spark, stateStructType)
    function = GroupStateFunction(func, state_schema, timeout, has_watermark(grouped_df._df))
    return run(grouped_df, function, outputStructType, outputMode, TIME_MODES[timeout],
               operator_id=getattr(func, "__name__", None) or "applyInPandasWithState")
