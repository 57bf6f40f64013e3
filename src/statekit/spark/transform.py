"""The ``transform_with_state`` adapter: a statekit function over ``transformWithStateInPandas``.

State opens at the previous batch in the processor's ``init`` and commits in ``close()``, which
Spark calls once per partition per micro-batch; timers fire from the batch's time (Spark's
``timeMode``), before each key's input, and in PySpark's timer phase for keys without input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statekit.runtime.functions import Function
from statekit.spark.adapters import build_spec
from statekit.spark.clock import has_watermark, refusal, watermark_of
from statekit.spark.clock import time_mode as time_mode_of
from statekit.spark.held import HoldingProcessor, flushing_operator
from statekit.spark.session import statekit_workers
from statekit.spark.task import AdapterSpec, PartitionTask, TaskInfo


def _patch_client(handle: Any, task: PartitionTask | None, time_mode: str,
                  watermark_from: Callable[[Any], int] = watermark_of) -> None:
    """Make PySpark's per-task client of Spark's state server serve statekit's timers.

    statekit keeps no state in Spark, so the implicit key PySpark sends before each key's call (a
    socket round trip) is not needed; and in the timer phase PySpark asks the client for Spark's
    expired timers, which statekit answers with its own due timers (the timers of keys without
    input in the batch fire there).  Only this task's client changes; a PySpark without that
    client keeps its behaviour, and the adapter then refuses timers.  ``watermark_from`` turns
    Spark's watermark into the one timers fire by (Spark's own APIs keep Spark's value).
    """
    client = getattr(handle, "_statefulProcessorApiClient", None)
    if client is None or not callable(getattr(client, "set_implicit_key", None)):
        return
    client.set_implicit_key = _no_implicit_key
    if task is None or time_mode == "None":
        return
    if not callable(getattr(client, "get_expiry_timers_iterator", None)):
        return

    def next_due(iterator_id: str, expiry_timestamp: int) -> tuple[Any, int, bool]:
        # every due timer fires in this first call, and the one handleExpiredTimer call PySpark
        # then makes yields all their output as one frame: a call, a round trip for the time and
        # an output frame per timer cost more than the timers' own work
        processing, watermark = client.get_timestamps(time_mode)
        task.set_time(int(processing), watermark_from(watermark))
        task.firing = task.fire_due()
        if not task.firing:
            raise StopIteration
        return None, task.clock.now, True  # the last one: PySpark asks no further

    client.get_expiry_timers_iterator = next_due
    client.delete_timer = _no_implicit_key  # statekit removed the timer when it fired


def _no_implicit_key(*args: Any) -> None:
    """Stands in for client calls whose work statekit does itself (nothing to tell the JVM)."""


def transform_with_state(grouped_df: Any, function: Function, output_schema: Any, *,
                         output_mode: str = "Update", time_mode: str = "None",
                         event_time_column: str | None = None,
                         output_event_time_column: str | None = None,
                         operator_id: str | None = None,
                         conf: Mapping[str, Any] | None = None) -> Any:
    """Run ``function`` per key over ``transformWithStateInPandas``; a streaming DataFrame.

    State opens at the previous batch in the processor's ``init`` and commits in ``close()``,
    which Spark calls once per partition per micro-batch.  ``time_mode`` is Spark's
    (``"ProcessingTime"`` or ``"EventTime"`` to use timers: processing time is the batch's
    timestamp, event time the query's watermark); ``event_time_column`` names the input column
    ``ctx.timestamp()`` reads; ``output_event_time_column`` is Spark's ``eventTimeColumnName``.
    Spark requires its RocksDB state store provider for this API, although statekit keeps the
    state.
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    spark = grouped_df._df.sparkSession
    mode = time_mode_of(time_mode)
    spec, schema = build_spec(spark, function, [], output_schema, operator_id, conf, grouped_df,
                              event_time_column=event_time_column)
    refuse = refusal(
        "transform_with_state",
        processing=None if mode != "None" else _NO_TIME_MODE,
        event=(_NO_TIME_MODE if mode == "None" else
               None if mode == "EventTime" or has_watermark(grouped_df._df) else _NO_WATERMARK))

    class StatekitProcessor(StatefulProcessor, HoldingProcessor):
        """Bridges Spark's per-key calls to the statekit function and partition store; the
        output is held across keys (:mod:`statekit.spark.held`)."""

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            self.task: PartitionTask | None = None
            self.fired = False
            if TaskContext.get() is None:  # Spark's schema-collecting run on the driver
                return
            self.start_holding(rows_api=False)
            self.task = PartitionTask(spec, TaskInfo.current(), refusal=refuse)
            self.task.firing = None
            _patch_client(handle, self.task, mode)

        def _due_first(self, timer_values: Any) -> Iterator[Any]:
            """Before the batch's first input: the timers its time passes."""
            task = self.task
            assert task is not None
            self.fired = True
            if mode == "None":
                return
            task.set_time(int(timer_values.getCurrentProcessingTimeInMs()),
                          watermark_of(timer_values.getCurrentWatermarkInMs()))
            yield from self.held(_frames(task.fire_due(), spec))

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            if not self.fired:
                yield from self._due_first(timerValues)
            k = key[0] if len(key) == 1 else tuple(key)
            yield from self.held(self._outputs(k, rows))

        def _outputs(self, k: Any, rows: Iterator[Any]) -> Iterator[Any]:
            from statekit.spark.frames import key_chunks, rows_frame

            task = self.task
            assert task is not None
            if spec.vectorized:
                for frame in rows:
                    out = task.process_frame(frame, k)
                    if out is not None and len(out):
                        yield out[spec.output_columns]
                return
            for chunk in key_chunks(rows):
                produced = task.process(k, chunk)
                if produced:
                    yield rows_frame(produced, spec.output_columns)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                               ) -> Iterator[Any]:
            task = self.task
            assert task is not None
            out, task.firing = task.firing, None  # what the timer phase's iterator fired
            yield from self.held(_frames(out, spec))

        def close(self) -> None:
            if self.task is not None:
                self.check_drained()
                self.task.commit()

    with statekit_workers(spark, spec.worker_python), flushing_operator():
        # Spark's own method: the compat switch (spark.statekit.compat.enabled) routes
        # GroupedData's to statekit's Spark-API layer, which is not this adapter
        from pyspark.sql.pandas.group_ops import PandasGroupedOpsMixin as Spark

        return Spark.transformWithStateInPandas(
            grouped_df, statefulProcessor=StatekitProcessor(), outputStructType=schema,
            outputMode=output_mode, timeMode=mode,
            eventTimeColumnName=output_event_time_column or "",
        )


_NO_TIME_MODE = ("transform_with_state(time_mode='None') gives no time and fires no timers (as "
                 "Spark's TimeMode.None): pass time_mode='ProcessingTime' or 'EventTime'")
_NO_WATERMARK = ("the query defines no watermark, so event-time timers would never fire: add "
                 "withWatermark(...) before groupBy, or use processing-time timers")


def _frames(produced: list[Any], spec: AdapterSpec) -> Iterator[Any]:
    """Output rows (or a vectorized function's frames) as pandas frames of the output columns."""
    from statekit.spark.frames import rows_frame

    if not produced:
        return
    if spec.vectorized:
        for frame in produced:
            yield frame[spec.output_columns]
        return
    yield rows_frame(produced, spec.output_columns)


