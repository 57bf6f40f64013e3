"""The ``foreach_batch`` adapter: a statekit function over ``foreachBatch`` + ``mapInArrow``.

The batch is repartitioned by key and processed with ``mapInArrow``; each partition commits
its state at the end of its iterator, before the batch's output goes to the user's sink.  The
partition count may change between runs (state follows the keys).  Rows are routed by key group
where the key's types allow (:mod:`statekit.spark.routing`), so that each partition holds a
range of key groups and a rescale reads only the old partitions holding its range.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statekit.durations import to_millis
from statekit.errors import ConfigError
from statekit.runtime.functions import Function
from statekit.spark.adapters import active_session, build_spec
from statekit.spark.batch_time import BatchTimes
from statekit.spark.clock import column_index, epoch_ms, refusal
from statekit.spark.jobmanager import fsspec_url, query_checkpoint_root
from statekit.spark.partitioning import key_types
from statekit.spark.routing import ROUTE_COLUMN, owned_groups, routable, route
from statekit.spark.session import statekit_workers
from statekit.spark.task import QUERY_ID, AdapterSpec, PartitionTask, TaskInfo


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
    session = active_session()  # the one that started the query (knows its checkpoint)
    spec, schema = build_spec(session, function, key_columns, output_schema, operator_id, conf,
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
        root = query_checkpoint_root(session, query_id) or query_checkpoint_root(spark, query_id)
        when = times.begin(batch_id, fsspec_url(root) if root else None)
        observed = None
        if event_time_column is not None:
            observed = Observation(f"statekit-{spec.operator_id}-{batch_id}")
            batch_df = batch_df.observe(observed, F.max(event_time_column).alias("max"))
        partitions = num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        types = key_types(batch_df.schema, key_columns)
        batch_spec = dataclasses.replace(
            spec, timestamp_index=column_index(batch_df.columns, event_time_column))
        routed = routable(types, partitions, spec.max_parallelism)
        if routed:  # each partition gets a range of key groups, as a Flink subtask does
            if ROUTE_COLUMN in batch_df.columns:
                raise ConfigError("key", f"the batch has a column named {ROUTE_COLUMN}, which "
                                         "foreach_batch uses itself")
            # the routing column stays (last) and the partitions leave it out: dropping it here
            # would let Spark skip the partitions of an empty batch, which then commit nothing
            shuffled = batch_df.withColumn(
                ROUTE_COLUMN, route(key_columns, types, partitions, spec.max_parallelism)
            ).repartition(partitions, ROUTE_COLUMN)
        else:  # Spark's hash of the key
            shuffled = batch_df.repartition(partitions, *key_columns)
        with statekit_workers(spark, spec.worker_python):
            out = shuffled.mapInArrow(
                functools.partial(_arrow_partition, batch_spec, batch_id, list(batch_df.columns),
                                  schema, partitions, types, routed, refuse,
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
                     partitions: int, types: list[str], routed: bool, refuse: Any,
                     when: tuple[int, int], batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)
    info = TaskInfo.current(batch_id)
    groups = owned_groups(info.partition, partitions, spec.max_parallelism) if routed else None
    task = PartitionTask(spec, info, spec.scaling(info.partition, partitions, types, groups),
                         refuse)
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
            if routed:  # without the routing column
                batch = pa.RecordBatch.from_arrays(batch.columns[:len(columns)], names=columns)
            if spec.vectorized:
                out = task.process_frame(batch.to_pandas(),
                                         keys_of=functools.partial(_row_keys, batch, key_index))
                yield from emit([out] if out is not None and len(out) else [])
                continue
            rows = zip(*(col.to_pylist() for col in batch.columns), strict=True)
            yield from emit(task.process_keyed_rows(rows, key_index))
        yield from emit(task.fire_due())  # timers the batch registered that are due already
        task.commit()
    except BaseException:
        task.abort()
        raise


def _row_keys(batch: Any, key_index: list[int]) -> list[Any]:
    """Each row's key in an Arrow record batch, as the per-element path takes it (a tuple for
    several key columns)."""
    columns = [batch.column(i).to_pylist() for i in key_index]
    return columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
