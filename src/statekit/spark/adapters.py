"""What every Spark adapter resolves in the driver before a query starts.

The backend and checkpoint storage come from Spark conf under ``spark.statekit.`` (e.g.
``spark.statekit.state.backend.type=rocksdb``), so switching backend is one flag.  Every adapter
(:mod:`~statekit.spark.transform`, :mod:`~statekit.spark.foreach`,
:mod:`~statekit.spark.apply_in_pandas`) runs the same :class:`~statekit.KeyedProcessFunction`
the local runner runs (or a :class:`~statekit.runtime.functions.VectorizedKeyedFunction` for
speed) and keeps versioned partition state: open at the previous batch, commit durably when the
partition's work ends.  :func:`build_spec` checks all of it at the adapter call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from statekit import config as cfg
from statekit.backends.base import StateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import check_local_directory
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import ConfigError, StateError, StatekitError
from statekit.runtime.checkpointed import refuse_operator_state
from statekit.runtime.environment import backend_from_config, storage_from_config
from statekit.runtime.functions import Function
from statekit.spark import reporting, stopping
from statekit.spark.clock import (
    column_index,
)
from statekit.spark.jobmanager import (
    DriverCheckpointStorage,
    QueryCheckpointStorage,
)
from statekit.spark.partitioning import grouping_types
from statekit.spark.session import remember_working_roots, statekit_worker_python
from statekit.spark.task import AdapterSpec

SPARK_PREFIX = "spark.statekit."
VERSIONS_RETAINED_KEY = "state.partition.versions-retained"
ALLOW_MISSING_KEY = "execution.state-recovery.allow-missing-state"
SAVEPOINT_KEY = "execution.savepoint.path"

_TRIGGER = "the query's trigger (writeStream.trigger(processingTime=...)): statekit commits " \
           "each partition's state with every micro-batch"
_TASK_RETRIES = "spark.task.maxFailures (Spark retries a failed task; a failed query restarts " \
                "from its checkpointLocation)"
#: Keys of the local runner's checkpointing and restarts that cannot take effect in a Spark
#: query, with the setting that does their job there (a key ending in "." is a namespace).
LOCAL_ONLY = {
    "execution.checkpointing.interval": _TRIGGER,
    "execution.checkpointing.timeout": _TRIGGER,
    "execution.checkpointing.min-pause": _TRIGGER,
    "execution.checkpointing.max-concurrent-checkpoints": _TRIGGER,
    "execution.checkpointing.unaligned": _TRIGGER,
    "execution.checkpointing.tolerable-failed-checkpoints": _TASK_RETRIES,
    "restart-strategy.": _TASK_RETRIES,
    "state.checkpoints.num-retained": VERSIONS_RETAINED_KEY + " (the partition versions kept "
                                      "beside the query's committed batches)",
    "execution.checkpointing.externalized-checkpoint-retention":
        "the query's checkpointLocation: statekit's state is kept with it until you delete it",
    "execution.checkpointing.prefer-checkpoint-for-recovery":
        SAVEPOINT_KEY + " (a query resumes from its last committed batch unless it names one)",
    "execution.checkpointing.recover-from-older-on-corruption":
        "nothing: a damaged partition version fails the task with a typed error, and Spark's "
        "own retries or a restore from a savepoint (" + SAVEPOINT_KEY + ") recover",
    "taskmanager.state.local.root-dirs": "spark.local.dir (each executor keeps its local copies "
                                         "under its own local directories)",
    "state.backend.heap.transfer.thread.num": "spark.executor.cores (each Spark task writes its "
                                              "heap snapshot on one thread; more cores run more "
                                              "tasks' snapshots at once)",
    "parallelism.default": "spark.sql.shuffle.partitions (or foreach_batch's num_partitions)",
    "execution.runtime-mode": "a batch query (spark.read) or writeStream.trigger(availableNow=True)",
}


class FlatConf(dict[str, Any]):
    """Flat statekit keys, each with how the user wrote it (``written``), for messages."""

    written: dict[str, str]


def statekit_conf(spark: Any, overrides: Mapping[str, Any] | None = None) -> FlatConf:
    """Flat statekit keys from the driver's ``STATEKIT_*`` environment variables, then Spark conf
    (``spark.statekit.<key>``), then ``overrides``, each winning over the ones before.

    Every key is checked here, in the driver: a key statekit does not know (a typo) or a
    malformed value raises :class:`ConfigError` naming it as it was written, with the nearest
    known key.
    """
    from_env = cfg.from_env()  # an unknown STATEKIT_STATE_... variable, or a bad value, fails here
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
    flat = FlatConf({**from_env, **from_spark, **given})
    flat.written = {**{key: cfg.env_name(key) for key in from_env},
                    **{key: SPARK_PREFIX + key for key in from_spark}, **{key: key for key in given}}
    return flat


def refuse_local_only(flat: Mapping[str, Any]) -> None:
    """Refuse, at the adapter call, a key that only the local runner acts on (a checkpoint
    interval, a restart strategy, ...), naming the Spark setting that does its job instead:
    accepted and ignored, it would promise what the query does not do."""
    mode = str(flat.get("execution.checkpointing.mode") or "EXACTLY_ONCE").upper()
    if mode.replace("-", "_") == "AT_LEAST_ONCE":
        raise ConfigError(_as_written("execution.checkpointing.mode", flat),
                          "AT_LEAST_ONCE cannot take effect on Spark: statekit's state commits "
                          "with Spark's micro-batches, exactly once")
    for key in sorted(flat):
        instead = LOCAL_ONLY.get(key) or next(
            (v for k, v in LOCAL_ONLY.items() if k.endswith(".") and key.startswith(k)), None)
        if instead is not None:
            raise ConfigError(_as_written(key, flat),
                              f"takes effect only on the local runner; in a Spark query use {instead}")


def _as_written(key: str, flat: Mapping[str, Any]) -> str:
    """The key as the user wrote it (``flat``: :func:`statekit_conf`'s result): in the adapter's
    ``conf``, as an environment variable, else as a Spark conf key."""
    return str(getattr(flat, "written", {}).get(key, SPARK_PREFIX + key))


_KEY_IN_TEXT = re.compile(r"(?<![\w.])(?:state|execution|pipeline|restart-strategy|s3)\.[\w.\-]*\w")


def _spelled(text: str, flat: Mapping[str, Any]) -> str:
    """``text`` with every statekit key it names spelled as the user writes it (a message about
    two keys names both as they were set)."""
    return _KEY_IN_TEXT.sub(lambda m: _as_written(m.group(0), flat)
                            if m.group(0) in cfg.BY_KEY else m.group(0), text)


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
        storage = DriverCheckpointStorage.start(storage, spark, area=operator_id, conf=conf)
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
    refuse_operator_state(function, "a Spark adapter")
    if getattr(function, "late_data_tag", None) is not None:  # a window's side_output_late_data
        raise StateError("side_output_late_data cannot take effect on Spark: a side output is "
                         "not a row of the query (leave it out: late elements are dropped)")
    stopping.install()
    reporting.install()
    schema = _struct(spark, output_schema)
    flat = statekit_conf(spark, conf)
    refuse_local_only(flat)
    operator_id = operator_id or type(function).__name__
    try:
        backend, storage = resolve(flat, spark, operator_id)
    except ConfigError as exc:  # name the key as the user wrote it
        raise type(exc)(_as_written(exc.key, flat),
                        _spelled(str(exc).split(": ", 1)[-1], flat)) from None
    _check_local_directory(flat)
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
        worker_python=statekit_worker_python(spark),
    )
    spec.event_time_column = event_time_column
    spec.time_zone = str(spark.conf.get("spark.sql.session.timeZone", "UTC"))
    if grouped_df is not None:  # Spark's groupBy shuffle: its partition count is the query's
        spec.key_types = grouping_types(grouped_df)
        spec.partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
        # the function gets every column of the grouped DataFrame, in its order
        spec.timestamp_index = column_index(grouped_df._df.columns, event_time_column)
    return spec, schema


def _check_local_directory(flat: Mapping[str, Any]) -> None:
    """A local ``state.checkpoints.dir`` statekit could not write is refused at the call (not at
    the first batch, as an error inside every task)."""
    url = str(flat.get("state.checkpoints.dir") or "")
    if url:  # unset: beside the query's checkpoint, which Spark checks at start
        check_local_directory(url, _as_written("state.checkpoints.dir", flat))


def _struct(spark: Any, schema: Any) -> Any:
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        return schema
    try:
        return spark.createDataFrame([], str(schema)).schema
    except Exception as exc:
        raise ConfigError("output_schema", f"not a Spark schema: {schema!r} ({exc})") from None


def active_session() -> Any:
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
