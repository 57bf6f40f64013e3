"""Spark's own stateful APIs on statekit state: the processor Spark runs, and the statekit function
standing for the user's code.

Both of Spark's APIs (``applyInPandasWithState`` functions and ``StatefulProcessor`` subclasses)
run through ``transformWithStateInPandas`` / ``transformWithState`` with a bridge processor: it
opens the partition's statekit state at the previous batch (:class:`~statekit.spark.task.
PartitionTask`), calls the user's code per key with the key set, fires statekit's timers in
Spark's timer phase (after every key's input, as Spark does) and commits in ``close()``.  The
user's code is wrapped in a :class:`CompatFunction`, which the partition's
:class:`~statekit.runtime.operator.KeyedOperator` keeps across batches like any statekit function.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from statekit.errors import ConfigError
from statekit.runtime.functions import KeyedProcessFunction, RuntimeContext
from statekit.spark.adapters import build_spec
from statekit.spark.clock import has_watermark
from statekit.spark.clock import time_mode as time_mode_of
from statekit.spark.held import HoldingProcessor, flushing_operator
from statekit.spark.session import ROCKSDB_PROVIDER, statekit_workers
from statekit.spark.task import PartitionTask, TaskInfo
from statekit.spark.transform import _patch_client

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
#: Spark's output modes, as its stateful APIs take them (case-insensitive)
OUTPUT_MODES = ("Append", "Update", "Complete")


def plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds (statekit keys serialize without pickle)."""
    item = getattr(value, "item", None)
    return item() if item is not None and type(value).__module__ == "numpy" else value


def state_key(key: Any) -> Any:
    """Spark's grouping key (a tuple of the key columns' values) as statekit's key."""
    values = tuple(plain(v) for v in key) if isinstance(key, tuple | list) else (plain(key),)
    return values[0] if len(values) == 1 else values


def spark_key(key: Any) -> tuple[Any, ...]:
    """statekit's key back as the tuple Spark hands the user's code."""
    return key if isinstance(key, tuple) else (key,)


class CompatFunction(KeyedProcessFunction):
    """A statekit function standing for a Spark user's stateful code.

    The partition's operator opens it once and keeps it across batches; the bridge calls
    :meth:`begin` and :meth:`end` around each task, :meth:`on_input` per key with input, and the
    operator calls ``on_timer`` for each due timer in Spark's timer phase.
    """

    context: RuntimeContext
    task: PartitionTask | None = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self.context = runtime_context

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> None:
        raise NotImplementedError("Spark's APIs call on_input with a key's rows")

    def begin(self, task: PartitionTask) -> None:
        """A task of a micro-batch starts on this partition."""
        self.task = task

    def end(self) -> None:
        """The task's work is done (before its state commits)."""

    def on_input(self, key: tuple[Any, ...], rows: Iterator[Any], timer_values: Any
                 ) -> Iterator[Any]:
        """The user's code for one key's input rows (the key is set); its output."""
        raise NotImplementedError

    def on_initial_state(self, key: tuple[Any, ...], initial_state: Any, timer_values: Any
                         ) -> None:
        """The user's code for one key's initial state (first batch only)."""
        raise NotImplementedError


def check_output_mode(mode: Any) -> str:
    """Spark's output mode names (case-insensitive), refused at the call when unknown."""
    text = str(mode)
    for known in OUTPUT_MODES:
        if text.lower() == known.lower():
            return known
    raise ConfigError("outputMode", f"expected one of {', '.join(OUTPUT_MODES)}, got {mode!r}")


def run(grouped_df: Any, function: CompatFunction, output_schema: Any, output_mode: str,
        time_mode: str, *, rows_api: bool = False, initial_state: Any = None,
        event_time_column_name: str = "", operator_id: str | None = None) -> Any:
    """Run ``function`` per key on statekit state through Spark's transformWithState operator;
    the streaming DataFrame.  Everything checkable is checked here, in the driver."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    spark = grouped_df._df.sparkSession
    mode = time_mode_of(time_mode)
    output_mode = check_output_mode(output_mode)
    if mode == "EventTime" and not has_watermark(grouped_df._df):
        raise ConfigError("timeMode", "EventTime needs a watermark: add withWatermark(...) "
                                      "before groupBy (Spark refuses it too)")
    provider = spark.conf.get(PROVIDER_KEY, None)
    if provider != ROCKSDB_PROVIDER:
        raise ConfigError(PROVIDER_KEY, f"is {provider!r}: Spark runs its transformWithState "
                                        f"operator, which statekit uses, only with "
                                        f"{ROCKSDB_PROVIDER} (it keeps none of the state): set "
                                        f"it, or switch with statekit.spark.compat.enable(spark)")
    spec, schema = build_spec(spark, function, [], output_schema, operator_id, None, grouped_df)

    class StatekitBridge(StatefulProcessor, HoldingProcessor):
        """Spark's processor: statekit state for the user's code, committed per partition.
        The user's output is held across keys (:mod:`statekit.spark.held`)."""

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            self.task: PartitionTask | None = None
            if TaskContext.get() is None:  # Spark's schema-collecting run on the driver
                return
            self.start_holding(rows_api)
            task = self.task = PartitionTask(spec, TaskInfo.current())
            task.firing = None
            _patch_client(handle, task, mode, watermark_from=int)
            if mode == "None":  # Spark hands no time to the calls: ask its state server once
                _batch_time(handle, task)
            self.function: CompatFunction = task.function
            self.function.begin(task)

        def _key(self, key: Any, timer_values: Any) -> tuple[Any, ...]:
            task = self.task
            assert task is not None
            if mode != "None":
                task.set_time(int(timer_values.getCurrentProcessingTimeInMs()),
                              int(timer_values.getCurrentWatermarkInMs()))
            task.backend.set_current_key(state_key(key))
            return spark_key(state_key(key))

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            yield from self.held(self.function.on_input(self._key(key, timerValues), rows,
                                                        timerValues))

        def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
            self.function.on_initial_state(self._key(key, timerValues), initialState,
                                           timerValues)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                               ) -> Iterator[Any]:
            task = self.task
            assert task is not None
            out, task.firing = task.firing, None  # what the timer phase's iterator fired
            yield from self.held(out or ())

        def close(self) -> None:
            if self.task is not None:
                self.function.end()
                self.check_drained()
                self.task.commit()

    # Spark's own method, not the one the switch routes here
    from pyspark.sql.pandas.group_ops import PandasGroupedOpsMixin as Spark

    api = Spark.transformWithState if rows_api else Spark.transformWithStateInPandas
    with statekit_workers(spark, spec.worker_python), flushing_operator():
        return api(grouped_df, statefulProcessor=StatekitBridge(), outputStructType=schema,
                   outputMode=output_mode, timeMode=mode, initialState=initial_state,
                   eventTimeColumnName=event_time_column_name or "")


def _batch_time(handle: Any, task: PartitionTask) -> None:
    """The batch's timestamp and watermark from Spark's state server, where it answers."""
    client = getattr(handle, "_statefulProcessorApiClient", None)
    try:
        task.set_time(int(client._get_batch_timestamp()), int(client._get_watermark_timestamp()))
    except Exception:  # a PySpark without these calls: GroupState falls back to the wall clock
        task.clock.now = 0


def flatten(outputs: Iterable[Any] | None) -> list[Any]:
    """A user's output iterator as a list (consumed with the key still set), without empty
    pandas frames: they hold no rows, and PySpark's transformWithState path cannot convert the
    column types pandas gives an empty frame (``pd.DataFrame({"c": []})``)."""
    if outputs is None:
        return []
    import pandas as pd

    return [out for out in outputs if not (isinstance(out, pd.DataFrame) and len(out) == 0)]
