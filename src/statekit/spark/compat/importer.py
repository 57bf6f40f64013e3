"""Bring an existing query's state along: what a native ``applyInPandasWithState`` or
``transformWithStateInPandas`` / ``transformWithState`` query holds in Spark's state store, at
its last committed batch, written as statekit state into a new checkpoint location from which
the same query, switched to statekit, continues with the same committed input.

The state is read through Spark's own ``statestore`` reader (each state variable, the registered
timers, ``GroupState`` values with their timeouts, TTL expiries) and written partition by
partition (Spark's ``partition_id``: the switched query's shuffle sends each key to the same
partition) through the user's own processor or function on statekit's handle, so values are
stored exactly as the switched query stores them.  The Spark side of the new location is
:mod:`~statekit.spark.compat.spark_checkpoint`.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from statekit import config as cfg
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import CheckpointNotFoundError, ConfigError, ConfigTypeError, StateTypeError
from statekit.inspection.committed import last_committed
from statekit.runtime.environment import backend_from_config, storage_from_config
from statekit.runtime.partition import drop_local_state, new_attempt_token
from statekit.spark.adapters import (
    VERSIONS_RETAINED_KEY,
    _struct,
    statekit_conf,
)
from statekit.spark.compat import spark_checkpoint
from statekit.spark.compat.bridge import check_output_mode, state_key
from statekit.spark.compat.group_state import (
    NO_TIMESTAMP,
    TIME_MODES,
    GroupStateFunction,
    apply_in_pandas_with_state,
)
from statekit.spark.compat.handle import Handle
from statekit.spark.compat.processor import (
    ProcessorFunction,
    _check,
    transform_with_state,
    transform_with_state_in_pandas,
)
from statekit.spark.task import AdapterSpec, PartitionTask, TaskInfo

TWS_PANDAS = "transformWithStateInPandasExec"
APPLY = "applyInPandasWithState"
#: Spark's time modes as its operator metadata spells them -> as its Python API takes them
TIME_MODE_NAMES = {"NoTime": "None", "ProcessingTime": "ProcessingTime",
                   "EventTime": "EventTime"}
KINDS = {"ValueState": "Value", "ListState": "List", "MapState": "Map"}


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote: the batch the switched query continues after, and counts."""

    source: str
    target: str
    batch_id: int
    query_id: str
    operator_id: str
    partitions: int
    backend: str
    keys: int
    entries: int
    timers: int


def import_state(spark: Any, source_checkpoint: str, target_checkpoint: str, function: Any, *,
                 stateStructType: Any = None, outputMode: str | None = None,
                 timeoutConf: Any = None, conf: dict[str, Any] | None = None) -> ImportResult:
    """Write the state of the stopped native query at ``source_checkpoint`` (its last committed
    batch) as statekit state into the new ``target_checkpoint``, from which the same query,
    switched to statekit (:func:`statekit.spark.compat.enable`), continues exactly where it
    stopped.

    ``function`` is what the query runs: its ``StatefulProcessor`` (transformWithState) or its
    ``applyInPandasWithState`` function, with that call's ``outputMode`` and ``timeoutConf``
    (and ``stateStructType``, by default the source's).  The backend and storage come from
    ``spark.statekit.*`` conf and ``conf``, as for the switched query.  Refused before anything
    is written: a source without a committed batch, a target that holds anything, a source
    operator of another kind, a state the function cannot read.
    """
    source, target = _path(source_checkpoint), _path(target_checkpoint)
    source_store, target_store = blob_store_for(source), blob_store_for(target)
    if target_store.list():
        raise ConfigError("target_checkpoint", f"{target} already holds files: the switched "
                                               "query needs a new, empty checkpoint location")
    committed = last_committed(source) if source_store.exists("metadata") else None
    if committed is None:
        raise CheckpointNotFoundError(f"{source} holds no committed batch of a Spark query "
                                      "(its commits/ log is empty or missing): nothing to import")
    query_id = str(json.loads(source_store.get("metadata"))["id"])
    plan = _plan(spark, source, committed, function, stateStructType, outputMode, timeoutConf)
    plan.batch_time = _batch_time(source_store, committed)
    flat = statekit_conf(spark, conf)
    spec = _spec(plan, flat, target)
    try:
        spark_checkpoint.prime_operator_state(
            spark, target_store, _spark_location(target), operator=plan.operator,
            committed=committed, partitions=plan.partitions, key_schema=plan.key_schema,
            start=plan.start)
        keys, entries, timers = _write_state(spark, plan, spec, query_id, committed)
        spark_checkpoint.copy_progress(source_store, target_store, committed)
    except BaseException:
        target_store.delete_prefix("")
        raise
    finally:
        drop_local_state()
    return ImportResult(source, target, committed, query_id, spec.operator_id, plan.partitions,
                        str(flat.get("state.backend.type") or "hashmap"), keys, entries, timers)


# --- what the source holds, checked against what the function reads --------------------------

@dataclass
class _Plan:
    source: str
    committed: int
    operator: int
    partitions: int
    key_schema: Any
    function: Any  # the CompatFunction that will write the state
    operator_id: str
    #: (name, kind, schema, ttl) of each state variable to read; for applyInPandasWithState one
    variables: list[tuple[str, str, Any, int | None]]
    timers: bool
    start: Callable[[Any, str], Any]
    #: the committed batch's timestamp: the time a TTL the source did not keep starts from
    batch_time: int = 0


def _plan(spark: Any, source: str, committed: int, function: Any, state_struct: Any,
          output_mode: str | None, timeout_conf: Any) -> _Plan:
    rows = (spark.read.format("state-metadata").option("batchId", committed).load(source)
            .collect())
    if len(rows) != 1:
        raise ConfigError("source_checkpoint", f"{source} has {len(rows)} stateful operators; "
                                               "an import takes a query with exactly one")
    meta = rows[0]
    name, operator, partitions = meta.operatorName, int(meta.operatorId), int(meta.numPartitions)
    reader = _reader(spark, source, committed, operator)
    if name.startswith("transformWithState"):
        if not isinstance(function, StatefulProcessor):
            raise ConfigTypeError("function", f"{source} holds a transformWithState operator: "
                                              "give its StatefulProcessor, got "
                                              f"{type(function).__name__}")
        return _plan_processor(spark, source, committed, operator, partitions, meta, function,
                               reader, rows_api=name != TWS_PANDAS)
    if name != APPLY:
        raise ConfigError("source_checkpoint", f"{source} holds a {name!r} operator: an import "
                                               "takes applyInPandasWithState or "
                                               "transformWithState(InPandas) state")
    if isinstance(function, StatefulProcessor) or not callable(function):
        raise ConfigTypeError("function", f"{source} holds an applyInPandasWithState operator: "
                                          "give its function, got "
                                          f"{type(function).__name__}")
    return _plan_function(spark, source, committed, operator, partitions, function, reader,
                          state_struct, output_mode, timeout_conf)


def _reader(spark: Any, source: str, committed: int, operator: int) -> Callable[..., Any]:
    def read(**options: str) -> Any:
        r = (spark.read.format("statestore").option("batchId", committed)
             .option("operatorId", operator))
        for key, value in options.items():
            r = r.option(key, value)
        return r.load(source)
    return read


def _read_variable(read: Callable[..., Any], name: str, kind: str) -> Any:
    """A state variable's rows: one per key (value), per key with its whole list (a list's
    order survives), per map entry."""
    if kind == "List":
        return read(stateVarName=name, flattenCollectionTypes="false")
    return read(stateVarName=name)


def _plan_processor(spark: Any, source: str, committed: int, operator: int, partitions: int,
                    meta: Any, processor: Any, read: Callable[..., Any], rows_api: bool
                    ) -> _Plan:
    props = json.loads(meta.operatorProperties or "{}")
    mode = TIME_MODE_NAMES.get(props.get("timeMode", "NoTime"), "None")
    output_mode = check_output_mode(props.get("outputMode", "Update"))
    parsed = _check(processor, mode)
    handle = Handle(mode, parsed=parsed)
    copy.deepcopy(processor).init(handle)
    variables = []
    key_schema = None
    for var in props.get("stateVariables", []):
        name, kind = var["stateName"], KINDS.get(var["stateVariableType"])
        if name.startswith("$") or kind is None:
            continue  # Spark's own timers and TTL bookkeeping
        declared = handle.variables.get(name)
        if declared is None or handle.declared.get(name) != kind:
            raise StateTypeError(f"the source holds {kind} state {name!r}, which the processor "
                                 f"does not declare as {kind} state in init()", name)
        df = _read_variable(read, name, kind)
        key_schema = df.schema["key"].dataType
        _check_schemas(df.schema, kind, declared, bool(var.get("ttlEnabled")), name)
        variables.append((name, kind, bool(var.get("ttlEnabled")), declared.ttl))
    if key_schema is None:
        key_schema = read(readRegisteredTimers="true").schema["key"].dataType \
            if mode != "None" else None
    if key_schema is None:
        raise ConfigError("source_checkpoint", f"{source} holds no state variable to import")
    api = transform_with_state if rows_api else transform_with_state_in_pandas
    nothing = NoState()

    def start(grouped: Any, location: str) -> Any:
        df = api(grouped, nothing, _key_output(key_schema), output_mode, mode)
        return _sink(df, output_mode, location)

    return _Plan(source, committed, operator, partitions, key_schema,
                 ProcessorFunction(processor, mode, parsed), type(processor).__name__,
                 variables, mode != "None", start)


def _plan_function(spark: Any, source: str, committed: int, operator: int, partitions: int,
                   func: Any, read: Callable[..., Any], state_struct: Any,
                   output_mode: str | None, timeout_conf: Any) -> _Plan:
    timeout = str(getattr(timeout_conf, "value", timeout_conf))
    if timeout_conf is None or timeout not in TIME_MODES:
        raise ConfigError("timeoutConf", f"give the GroupStateTimeout the query uses (one of "
                                         f"{', '.join(TIME_MODES)}), got {timeout_conf!r}")
    if output_mode is None:
        raise ConfigError("outputMode", "give the output mode the query uses (append, update)")
    mode = check_output_mode(output_mode)
    df = read()
    key_schema = df.schema["key"].dataType
    stored = df.schema["value"].dataType["groupState"].dataType
    struct = stored if state_struct is None else _struct(spark, state_struct)
    if _types(struct) != _types(stored):
        raise StateTypeError(f"the source's state is {stored.simpleString()}, the function's "
                             f"stateStructType {struct.simpleString()}", "groupState")
    timed_keys = "timeoutTimestamp" in df.schema["value"].dataType.fieldNames()
    if timeout == "NoTimeout" and timed_keys:
        timed = df.where(f"value.timeoutTimestamp != {NO_TIMESTAMP}").limit(1).count()
        if timed:
            raise ConfigError("timeoutConf", "NoTimeout, but the source's keys have timeouts "
                                             "that would be lost: give the query's timeoutConf")

    def start(grouped: Any, location: str) -> Any:
        df = apply_in_pandas_with_state(grouped, _no_output, _key_output(key_schema), struct,
                                        mode, timeout)
        return _sink(df, mode, location)

    function = GroupStateFunction(func, struct, timeout, True)
    operator_id = getattr(func, "__name__", None) or APPLY
    return _Plan(source, committed, operator, partitions, key_schema, function, operator_id,
                 [("groupState", "GroupState", False, None)], False, start)


def _types(struct: Any) -> list[str]:
    return [f.dataType.simpleString() for f in struct.fields]


def _check_schemas(schema: Any, kind: str, declared: Any, ttl: bool, name: str) -> None:
    """Refuse a variable whose stored schema the processor's declaration cannot read."""
    def inner(field: str) -> Any:
        data = schema[field].dataType
        if field == "list_value":
            data = data.elementType
        return data["value"].dataType if ttl else data

    pairs = ([("user_map_key", declared._keys.struct), ("user_map_value", declared._values.struct)]
             if kind == "Map" else
             [("list_value" if kind == "List" else "value", declared._schema.struct)])
    for field, wanted in pairs:
        data = inner(field) if field != "user_map_key" else schema[field].dataType
        if _types(data) != _types(wanted):
            raise StateTypeError(f"the source stores {data.simpleString()}, the processor "
                                 f"declares {wanted.simpleString()}", name)


def _key_output(key_schema: Any) -> Any:
    from pyspark.sql.types import StructType

    return StructType(list(key_schema.fields))


def _sink(df: Any, output_mode: str, location: str) -> Any:
    return (df.writeStream.format("noop").outputMode(output_mode.lower())
            .option("checkpointLocation", location).start())


def _no_output(key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:
    """The priming run's applyInPandasWithState function: no state, no output."""
    return iter(())


class NoState(StatefulProcessor):
    """The priming run's processor: no state, no output."""

    def init(self, handle: Any) -> None:
        pass

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
        return iter(())


# --- statekit's side ----------------------------------------------------------------------------

def _spec(plan: _Plan, flat: dict[str, Any], target: str) -> AdapterSpec:
    """The spec a task of the switched query would get, with storage under ``target``."""
    backend = backend_from_config(flat)
    if "state.checkpoint-storage" in flat or "state.checkpoints.dir" in flat:
        storage = storage_from_config(flat)
    else:
        storage = backend.default_checkpoint_storage() or FileSystemCheckpointStorage.from_config(
            {**flat, "state.checkpoints.dir": f"{target}/statekit"})
    if isinstance(storage, JobManagerCheckpointStorage):
        raise ConfigError("state.checkpoint-storage", "JobManager storage keeps state in a "
                                                      "driver's memory: an import needs a "
                                                      "durable place")
    return AdapterSpec(
        function=plan.function, backend=backend, storage=storage, operator_id=plan.operator_id,
        key_columns=[], output_columns=[],
        max_parallelism=cfg.read(flat, "pipeline.max-parallelism"),
        versions_retained=cfg.read(flat, VERSIONS_RETAINED_KEY), conf=flat,
        allow_missing_state=True, rescalable=False)


def _write_state(spark: Any, plan: _Plan, spec: AdapterSpec, query_id: str, committed: int
                 ) -> tuple[int, int, int]:
    """Every partition's state as statekit's version ``committed``; (keys, entries, timers)."""
    read = _reader(spark, plan.source, committed, plan.operator)
    streams = {}
    for name, kind, _ttl, _declared in plan.variables:
        df = _read_variable(read, name, kind) if kind != "GroupState" else read()
        streams[name] = _by_partition(df)
    if plan.timers:
        streams["$timers"] = _by_partition(read(readRegisteredTimers="true"))
    kinds = {name: (kind, ttl, declared) for name, kind, ttl, declared in plan.variables}
    keys = entries = timers = 0
    for partition in range(plan.partitions):
        info = TaskInfo(committed, query_id, partition, 0, new_attempt_token("import", partition))
        task = PartitionTask(spec, info)
        try:
            function = task.function
            function.begin(task)
            seen: set[Any] = set()
            for name, stream in streams.items():
                for row in stream.take(partition):
                    task.clock.now = plan.batch_time
                    key = state_key(tuple(row.key))
                    seen.add(key)
                    task.backend.set_current_key(key)
                    if name == "$timers":
                        function.handle.registerTimer(int(row.expiration_timestamp_ms))
                        timers += 1
                    elif name == "groupState":
                        value = row.value
                        timeout = value["timeoutTimestamp"] if len(value) > 1 else None
                        function.restore(value.groupState,
                                         NO_TIMESTAMP if timeout is None else int(timeout))
                        entries += 1
                    else:
                        entries += _put(function.handle.variables[name], task, row,
                                        *kinds[name])
            keys += len(seen)
            function.end()
            task.commit()
        finally:
            task.abort()
    return keys, entries, timers


def _put(variable: Any, task: PartitionTask, row: Any, kind: str, ttl: bool,
         declared_ttl: int | None) -> int:
    """One reader row into ``variable`` (the current key set), keeping Spark's TTL expiry."""
    def at(stored: Any) -> Any:
        """The value, with the clock set so that statekit's expiry is Spark's."""
        if not ttl:
            return stored
        if declared_ttl is not None and stored.ttlExpirationMs is not None:
            task.clock.now = int(stored.ttlExpirationMs) - declared_ttl
        return stored.value

    if kind == "Value":
        variable.update(tuple(at(row.value)))
        return 1
    if kind == "List":
        for element in row.list_value:
            variable.appendValue(tuple(at(element)))
        return len(row.list_value)
    variable.updateValue(tuple(row.user_map_key), tuple(at(row.user_map_value)))
    return 1


class _ByPartition:
    """A reader's rows in Spark partition order, taken one partition at a time."""

    def __init__(self, rows: Iterator[Any]) -> None:
        self.groups = itertools.groupby(rows, key=lambda row: row.partition_id)
        self.head: tuple[int, Iterator[Any]] | None = next(self.groups, None)

    def take(self, partition: int) -> Iterator[Any]:
        while self.head is not None and self.head[0] <= partition:
            pid, rows = self.head
            if pid == partition:
                yield from rows
            self.head = next(self.groups, None)


def _by_partition(df: Any) -> _ByPartition:
    return _ByPartition(df.orderBy("partition_id").toLocalIterator())


def _batch_time(store: Any, committed: int) -> int:
    """The processing time Spark ran batch ``committed`` at (its offset log entry)."""
    try:
        return int(spark_checkpoint.log_entry(store.get(f"offsets/{committed}"))[1]
                   .get("batchTimestampMs", 0))
    except (OSError, ValueError, IndexError):
        return 0


def _path(location: str) -> str:
    """A checkpoint location as statekit's stores spell it (a local path made absolute)."""
    from statekit.spark.jobmanager import fsspec_url

    url = fsspec_url(str(location))
    return url if "://" in url else os.path.abspath(url)


def _spark_location(url: str) -> str:
    """The location as Spark writes paths into its metadata."""
    return f"file:{url}" if url.startswith("/") else url.replace("s3://", "s3a://", 1)
