"""Thin adapters that run a statekit function inside PySpark's stateful APIs.

The backend and checkpoint storage come from Spark conf under ``spark.statekit.`` (e.g.
``spark.statekit.state.backend.type=rocksdb``), so switching backend is one flag.  Every adapter
runs the same :class:`~statekit.KeyedProcessFunction` the local runner runs (or a
:class:`~statekit.runtime.functions.VectorizedKeyedFunction` for speed) and keeps versioned
partition state: open at the previous batch, commit durably when the partition's work ends.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statekit import config as cfg
from statekit.backends.base import StateBackend
from statekit.checkpoint.storage import CheckpointStorage, JobManagerCheckpointStorage
from statekit.durations import to_millis
from statekit.errors import ConfigError, StatekitError
from statekit.runtime.environment import backend_from_config, storage_from_config
from statekit.runtime.functions import Function
from statekit.spark import reporting, stopping
from statekit.spark.batch_time import BatchTimes
from statekit.spark.clock import (
    column_index,
    epoch_ms,
    has_watermark,
    refusal,
    watermark_of,
)
from statekit.spark.clock import time_mode as time_mode_of
from statekit.spark.jobmanager import (
    DriverCheckpointStorage,
    QueryCheckpointStorage,
    fsspec_url,
    query_checkpoint_root,
)
from statekit.spark.partitioning import grouping_types, key_types
from statekit.spark.session import remember_working_roots
from statekit.spark.task import QUERY_ID, AdapterSpec, PartitionTask, TaskInfo

SPARK_PREFIX = "spark.statekit."
VERSIONS_RETAINED_KEY = "state.partition.versions-retained"
ALLOW_MISSING_KEY = "execution.state-recovery.allow-missing-state"
SAVEPOINT_KEY = "execution.savepoint.path"


def statekit_conf(spark: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flat statekit keys from Spark conf (``spark.statekit.<key>``), then ``overrides``.

    Every key is checked here, in the driver: a key statekit does not know (a typo) or a
    malformed value raises :class:`ConfigError` naming it, with the nearest known key.
    """
    found: dict[str, Any] = {}
    for key, value in spark.sparkContext.getConf().getAll():
        if key.startswith(SPARK_PREFIX):
            found[key[len(SPARK_PREFIX):]] = value
    try:
        runtime = spark.conf.getAll
        runtime = runtime() if callable(runtime) else runtime
    except Exception:  # older Spark: runtime conf listing unavailable; static conf suffices
        runtime = {}
    for key, value in dict(runtime).items():
        if key.startswith(SPARK_PREFIX):
            found[key[len(SPARK_PREFIX):]] = value
    from_spark = cfg.validate(cfg.normalize(found), all_keys_are_statekit=True, prefix=SPARK_PREFIX)
    given = cfg.validate(cfg.normalize(overrides), all_keys_are_statekit=True)
    return {**from_spark, **given}


def resolve(conf: Mapping[str, Any], spark: Any = None, operator_id: str | None = None
            ) -> tuple[StateBackend, CheckpointStorage]:
    """The backend (default hashmap) and storage a query uses.

    Storage, unless configured: the legacy backend's own (``MemoryStateBackend``,
    ``FsStateBackend``), else files under each query's Spark checkpoint location, so that state
    is as durable as the query.  JobManager storage lives in the driver's memory.
    """
    backend = backend_from_config(conf)
    if "state.checkpoint-storage" in conf or "state.checkpoints.dir" in conf:
        storage = storage_from_config(conf)
    else:
        storage = backend.default_checkpoint_storage() or QueryCheckpointStorage.start(spark, conf)
    if isinstance(storage, JobManagerCheckpointStorage) and storage.get_checkpoint_path() is None:
        storage = DriverCheckpointStorage.start(storage, spark, area=operator_id)
    return backend, storage


def build_spec(spark: Any, function: Function, key_columns: list[str], output_schema: Any,
               operator_id: str | None, conf: Mapping[str, Any] | None,
               grouped_df: Any = None, *, event_time_column: str | None = None
               ) -> tuple[AdapterSpec, Any]:
    """Resolve and check everything a query's tasks need, in the driver, before it starts.

    Every adapter calls it: the function's type, the whole ``spark.statekit.*`` configuration,
    backend and storage (a typo fails here, not in a task), and the output schema; with the
    ``grouped_df`` of Spark's grouped APIs, also how Spark partitions its keys.  Returns the spec
    the tasks receive and the output ``StructType``.
    """
    if not isinstance(function, Function):
        raise TypeError("expected a statekit KeyedProcessFunction or VectorizedKeyedFunction, "
                        f"got {type(function).__name__}")
    stopping.install()
    reporting.install()
    schema = _struct(spark, output_schema)
    flat = statekit_conf(spark, conf)
    operator_id = operator_id or type(function).__name__
    try:
        backend, storage = resolve(flat, spark, operator_id)
    except ConfigError as exc:  # name the key as the user wrote it
        if conf is None or exc.key not in cfg.normalize(conf):
            raise type(exc)(SPARK_PREFIX + exc.key, str(exc).split(": ", 1)[-1]) from None
        raise
    roots = getattr(backend, "working_roots", None)
    if roots is not None:  # swept of dead workers' leftovers when this driver exits
        remember_working_roots(roots())
    spec = AdapterSpec(
        function=function, backend=backend, storage=storage,
        operator_id=operator_id,
        key_columns=list(key_columns), output_columns=[f.name for f in schema.fields],
        max_parallelism=cfg.read(flat, "pipeline.max-parallelism"),
        versions_retained=cfg.read(flat, VERSIONS_RETAINED_KEY), conf=flat,
        allow_missing_state=bool(cfg.read(flat, ALLOW_MISSING_KEY)),
        savepoint_path=flat.get(SAVEPOINT_KEY) or None, rescalable=grouped_df is None,
    )
    spec.event_time_column = event_time_column
    spec.time_zone = str(spark.conf.get("spark.sql.session.timeZone", "UTC"))
    if grouped_df is not None:  # Spark's groupBy shuffle: its partition count is the query's
        spec.key_types = grouping_types(grouped_df)
        spec.partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        # the function gets every column of the grouped DataFrame, in its order
        spec.timestamp_index = column_index(grouped_df._df.columns, event_time_column)
    return spec, schema


def _struct(spark: Any, schema: Any) -> Any:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    try:
        return spark.createDataFrame([], str(schema)).schema
    except Exception as exc:
        raise ConfigError("output_schema", f"not a Spark schema: {schema!r} ({exc})") from None


def _active_session() -> Any:
    """The calling thread's active session, else the process's running one (a thread other than
    the one that created the session has no active session of its own)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None and SparkContext._active_spark_context is not None:
        spark = SparkSession.builder.getOrCreate()
    if spark is None:
        raise StatekitError("foreach_batch needs an active SparkSession: create it first")
    return spark


# --- transformWithStateInPandas -----------------------------------------------------------------


def _patch_client(handle: Any, task: PartitionTask | None, time_mode: str) -> None:
    """Make PySpark's per-task client of Spark's state server serve statekit's timers.

    statekit keeps no state in Spark, so the implicit key PySpark sends before each key's call (a
    socket round trip) is not needed; and in the timer phase PySpark asks the client for Spark's
    expired timers, which statekit answers with its own due timers (the timers of keys without
    input in the batch fire there).  Only this task's client changes; a PySpark without that
    client keeps its behaviour, and the adapter then refuses timers.
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
        task.set_time(int(processing), watermark_of(watermark))
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

    class StatekitProcessor(StatefulProcessor):
        """Bridges Spark's per-key calls to the statekit function and partition store."""

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            self.task: PartitionTask | None = None
            self.fired = False
            if TaskContext.get() is None:  # Spark's schema-collecting run on the driver
                return
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
            yield from _frames(task.fire_due(), spec)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            from statekit.spark.frames import key_chunks, rows_frame

            task = self.task
            assert task is not None
            if not self.fired:
                yield from self._due_first(timerValues)
            k = key[0] if len(key) == 1 else tuple(key)
            if spec.vectorized:
                for frame in rows:
                    out = task.process_frame(frame)
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
            yield from _frames(out, spec)

        def close(self) -> None:
            if self.task is not None:
                self.task.commit()

    return grouped_df.transformWithStateInPandas(
        statefulProcessor=StatekitProcessor(), outputStructType=schema,
        outputMode=output_mode, timeMode=mode, eventTimeColumnName=output_event_time_column or "",
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


# --- foreachBatch + mapInArrow -------------------------------------------------------------------


def foreach_batch(function: Function, key: str | list[str], output_schema: Any,
                  sink: Callable[[Any, int], None], *, num_partitions: int | None = None,
                  event_time_column: str | None = None, allowed_lateness: Any = 0,
                  operator_id: str | None = None, conf: Mapping[str, Any] | None = None
                  ) -> Callable[[Any, int], None]:
    """A callable for ``writeStream.foreachBatch``: keyed stateful processing of each batch.

    The batch is repartitioned by ``key`` and processed with ``mapInArrow``; each partition
    commits its state at the end of its iterator, before the batch's output is handed to
    ``sink(output_df, batch_id)`` (materialized once, so the sink may read it many times).
    ``num_partitions`` may change between runs of the query: state follows the keys.
    Timers: processing time is the micro-batch's timestamp; with ``event_time_column`` each
    row's event time is ``ctx.timestamp()`` and statekit keeps the watermark itself (the largest
    event time of the earlier batches minus ``allowed_lateness``, in milliseconds or a
    ``Duration``).
    """
    from pyspark import StorageLevel
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    key_columns = [key] if isinstance(key, str) else list(key)
    if not key_columns or not all(isinstance(c, str) and c for c in key_columns):
        raise ConfigError("key", f"expected a column name or a list of them, got {key!r}")
    if num_partitions is not None and int(num_partitions) < 1:
        raise ConfigError("num_partitions", f"must be at least 1, got {num_partitions!r}")
    if not callable(sink):
        raise ConfigError("sink", f"expected a function (output_df, batch_id), got {sink!r}")
    if event_time_column is not None and not (isinstance(event_time_column, str)
                                              and event_time_column):
        raise ConfigError("event_time_column", f"expected a column name, got {event_time_column!r}")
    lateness = to_millis(allowed_lateness, "allowed_lateness", minimum=0)
    spark = _active_session()
    spec, schema = build_spec(spark, function, key_columns, output_schema, operator_id, conf,
                              event_time_column=event_time_column)
    refuse = refusal("foreach_batch", processing=None,
                     event=None if event_time_column else _NO_EVENT_COLUMN)

    def run(batch_df: Any, batch_id: int) -> None:
        spark = batch_df.sparkSession
        missing = [c for c in [*key_columns, *([event_time_column] if event_time_column else [])]
                   if c not in batch_df.columns]
        if missing:
            raise ConfigError("key" if missing[0] in key_columns else "event_time_column",
                              f"columns {missing} are not in the batch "
                              f"(columns: {batch_df.columns})")
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID) or "query"
        times = BatchTimes(spec.storage, query_id, spec.operator_id, lateness,
                           spec.versions_retained)
        root = query_checkpoint_root(spark, query_id)
        when = times.begin(batch_id, fsspec_url(root) if root else None)
        observed = None
        if event_time_column is not None:
            observed = Observation(f"statekit-{spec.operator_id}-{batch_id}")
            batch_df = batch_df.observe(observed, F.max(event_time_column).alias("max"))
        partitions = num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        types = key_types(batch_df.schema, key_columns)
        batch_spec = dataclasses.replace(
            spec, timestamp_index=column_index(batch_df.columns, event_time_column))
        out = batch_df.repartition(partitions, *key_columns).mapInArrow(
            functools.partial(_arrow_partition, batch_spec, batch_id, list(batch_df.columns),
                              schema, partitions, types, refuse,
                              (int(when["processing_time"]), int(when["watermark"]))), schema)
        # materialized once, so a sink reading it twice does not run the partitions twice; a
        # block lost with its executor is recomputed, which commits the same version again
        # (not localCheckpoint: its blocks cannot be recomputed, a lost worker failed the query)
        out = out.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            out.count()
            batch_max = None
            if observed is not None:
                batch_max = epoch_ms(observed.get.get("max"), spec.time_zone)
            times.commit(when, batch_max)
            sink(out, batch_id)
        finally:
            out.unpersist()

    return run


_NO_EVENT_COLUMN = ("event-time timers need a watermark: pass event_time_column (and "
                    "allowed_lateness) to foreach_batch")


def _arrow_partition(spec: AdapterSpec, batch_id: int, columns: list[str], schema: Any,
                     partitions: int, types: list[str], refuse: Any, when: tuple[int, int],
                     batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)
    info = TaskInfo.current(batch_id)
    task = PartitionTask(spec, info, spec.scaling(info.partition, partitions, types), refuse)
    task.set_time(*when)
    key_index = [columns.index(c) for c in spec.key_columns]
    out_names = spec.output_columns

    def emit(produced: list[Any]) -> Iterator[Any]:
        """Rows (or a vectorized function's frames) as Arrow record batches."""
        if not produced:
            return
        if spec.vectorized:
            for frame in produced:
                yield pa.RecordBatch.from_pandas(frame[out_names], schema=arrow_schema,
                                                 preserve_index=False)
            return
        columns_out = list(zip(*produced, strict=True))
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns_out, arrow_schema, strict=True)],
            schema=arrow_schema)

    try:
        yield from emit(task.fire_due())  # timers the batch's time passes, before its input
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if spec.vectorized:
                out = task.process_frame(batch.to_pandas())
                yield from emit([out] if out is not None and len(out) else [])
                continue
            rows = zip(*(col.to_pylist() for col in batch.columns), strict=True)
            yield from emit(task.process_keyed_rows(rows, key_index))
        yield from emit(task.fire_due())  # timers the batch registered that are due already
        task.commit()
    except BaseException:
        task.abort()
        raise
