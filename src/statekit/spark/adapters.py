"""Thin adapters that run a statekit function inside PySpark's stateful APIs.

The backend and checkpoint storage come from Spark conf under ``spark.statekit.`` (e.g.
``spark.statekit.state.backend.type=rocksdb``), so switching backend is one flag.  Every adapter
runs the same :class:`~statekit.KeyedProcessFunction` the local runner runs (or a
:class:`~statekit.runtime.functions.VectorizedKeyedFunction` for speed) and keeps versioned
partition state: open at the previous batch, commit durably when the partition's work ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statekit.backends.base import StateBackend
from statekit.checkpoint.storage import CheckpointStorage, JobManagerCheckpointStorage
from statekit.errors import ConfigError
from statekit.runtime import config as cfg
from statekit.runtime.environment import backend_from_config, storage_from_config
from statekit.runtime.functions import Function
from statekit.runtime.partition import DEFAULT_VERSIONS_RETAINED
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM
from statekit.spark.jobmanager import DriverCheckpointStorage
from statekit.spark.runner import AdapterSpec, PartitionTask, TaskInfo

SPARK_PREFIX = "spark.statekit."
VERSIONS_RETAINED_KEY = "state.partition.versions-retained"


def statekit_conf(spark: Any, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flat statekit keys from Spark conf (``spark.statekit.<key>``), then ``overrides``."""
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
    return {**cfg.normalize(found), **cfg.normalize(overrides)}


def resolve(conf: Mapping[str, Any]) -> tuple[StateBackend, CheckpointStorage]:
    """The backend (default hashmap) and storage (default: the driver's memory) a query uses."""
    if "state.backend.type" in conf:
        backend = backend_from_config(conf)
    else:
        from statekit.backends.heap import HashMapStateBackend

        backend = HashMapStateBackend().configure(dict(conf))
    if "state.checkpoint-storage" in conf or "state.checkpoints.dir" in conf:
        storage = storage_from_config(conf)
    else:
        storage = backend.default_checkpoint_storage() or JobManagerCheckpointStorage()
    if isinstance(storage, JobManagerCheckpointStorage) and storage.get_checkpoint_path() is None:
        storage = DriverCheckpointStorage.start(storage)
    return backend, storage


def _spec(spark: Any, function: Function, key_columns: list[str], output_schema: Any,
          operator_id: str | None, conf: Mapping[str, Any] | None) -> tuple[AdapterSpec, Any]:
    if not isinstance(function, Function):
        raise TypeError("expected a statekit KeyedProcessFunction or VectorizedKeyedFunction")
    schema = _struct(spark, output_schema)
    flat = statekit_conf(spark, conf)
    backend, storage = resolve(flat)
    max_parallelism = cfg.get(flat, "pipeline.max-parallelism", cfg.parse_int,
                              DEFAULT_MAX_PARALLELISM)
    retained = cfg.get(flat, VERSIONS_RETAINED_KEY, cfg.parse_int, DEFAULT_VERSIONS_RETAINED)
    if retained < 2:
        raise ConfigError(VERSIONS_RETAINED_KEY, "at least 2 versions must be kept")
    spec = AdapterSpec(
        function=function, backend=backend, storage=storage,
        operator_id=operator_id or type(function).__name__,
        key_columns=list(key_columns), output_columns=[f.name for f in schema.fields],
        max_parallelism=max_parallelism, versions_retained=retained, conf=flat,
    )
    return spec, schema


def _struct(spark: Any, schema: Any) -> Any:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    return spark.createDataFrame([], str(schema)).schema


# --- transformWithStateInPandas -----------------------------------------------------------------


def transform_with_state(grouped_df: Any, function: Function, output_schema: Any, *,
                         output_mode: str = "Update", operator_id: str | None = None,
                         conf: Mapping[str, Any] | None = None) -> Any:
    """Run ``function`` per key over ``transformWithStateInPandas``; a streaming DataFrame.

    State opens at the previous batch in the processor's ``init`` and commits in ``close()``,
    which Spark calls once per partition per micro-batch.  Spark requires its RocksDB state
    store provider for this API, although statekit keeps the state.
    """
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    spark = grouped_df._df.sparkSession
    spec, schema = _spec(spark, function, [], output_schema, operator_id, conf)  # Spark passes keys

    class StatekitProcessor(StatefulProcessor):
        """Bridges Spark's per-key calls to the statekit function and partition store."""

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            self.task = None
            if TaskContext.get() is None:  # Spark's schema-collecting run on the driver
                return
            self.task = PartitionTask(spec, TaskInfo.current())

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any
                            ) -> Iterator[Any]:
            import pandas as pd

            task = self.task
            assert task is not None
            k = key[0] if len(key) == 1 else tuple(key)
            for frame in rows:
                if spec.vectorized:
                    out = task.process_frame(frame)
                    if out is not None and len(out):
                        yield out[spec.output_columns]
                    continue
                task.backend.set_current_key(k)
                produced = task.process(k, frame.itertuples(index=False, name=None))
                if produced:
                    yield pd.DataFrame(produced, columns=spec.output_columns)

        def close(self) -> None:
            if self.task is not None:
                self.task.commit()

    return grouped_df.transformWithStateInPandas(
        statefulProcessor=StatekitProcessor(), outputStructType=schema,
        outputMode=output_mode, timeMode="None",
    )


# --- foreachBatch + mapInArrow -------------------------------------------------------------------


def foreach_batch(function: Function, key: str | list[str], output_schema: Any,
                  sink: Callable[[Any, int], None], *, num_partitions: int | None = None,
                  operator_id: str | None = None, conf: Mapping[str, Any] | None = None
                  ) -> Callable[[Any, int], None]:
    """A callable for ``writeStream.foreachBatch``: keyed stateful processing of each batch.

    The batch is repartitioned by ``key`` and processed with ``mapInArrow``; each partition
    commits its state at the end of its iterator, before the batch's output is handed to
    ``sink(output_df, batch_id)`` (materialized once, so the sink may read it many times).
    """
    key_columns = [key] if isinstance(key, str) else list(key)
    resolved: dict[str, Any] = {}

    def run(batch_df: Any, batch_id: int) -> None:
        spark = batch_df.sparkSession
        if "spec" not in resolved:
            resolved["spec"], resolved["schema"] = _spec(spark, function, key_columns,
                                                         output_schema, operator_id, conf)
        spec, schema = resolved["spec"], resolved["schema"]
        partitions = num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        out = batch_df.repartition(partitions, *key_columns).mapInArrow(
            functools.partial(_arrow_partition, spec, batch_id, list(batch_df.columns), schema),
            schema)
        sink(out.localCheckpoint(eager=True), batch_id)

    return run


def _arrow_partition(spec: AdapterSpec, batch_id: int, columns: list[str], schema: Any,
                     batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema)

    task = PartitionTask(spec, TaskInfo.current(batch_id))
    key_index = [columns.index(c) for c in spec.key_columns]
    out_names = spec.output_columns
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if spec.vectorized:
                out = task.process_frame(batch.to_pandas())
                if out is not None and len(out):
                    yield pa.RecordBatch.from_pandas(out[out_names], schema=arrow_schema,
                                                     preserve_index=False)
                continue
            rows = zip(*(col.to_pylist() for col in batch.columns), strict=True)
            produced = task.process_keyed_rows(rows, key_index)
            if produced:
                columns_out = list(zip(*produced, strict=True))
                yield pa.RecordBatch.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(columns_out, arrow_schema, strict=True)],
                    schema=arrow_schema)
        task.commit()
    except BaseException:
        task.abort()
        raise
