"""An ``applyInPandasWithState`` query's state as of a committed batch, for the tools.

The adapter keeps each key's changes since the last snapshot in the key's ``GroupState``, which
Spark commits with the micro-batch; snapshots lag behind the query (by design: they are taken now
and then, by whichever worker process runs a task).  The query's state as of committed batch *N*
is therefore, per partition: the newest valid snapshot covering no batch after *N*, restricted to
the keys Spark holds a ``GroupState`` for at *N* (a key without one has no state), with each
key's carried log replayed on top, exactly as the next task would.  Spark's own reader
(``spark.read.format("statestore")``) reads the logs; the merged state is written as a
backend-neutral savepoint in a private working directory (removed when this process exits), which
inspection, export, convert and ``spark.read.format("statekit")`` then read like any other.

:func:`read_carried` is registered with :mod:`statekit.inspection.views`, so ``open_checkpoint``
on such a query gives this state by default.  It needs a SparkSession: the active one, or (for the
``statekit`` command) a local one it starts.  :func:`install_reader` makes
``spark.read.format("statekit")`` resolve it in the driver (Spark plans Python data sources in a
separate worker process, which has no session).
"""

from __future__ import annotations

import functools
import tempfile
import threading
import time
from typing import Any

from statekit import workdirs
from statekit.backends.heap.factory import HashMapStateBackend
from statekit.backends.transfer import restore_into
from statekit.checkpoint.metadata import decode_metadata
from statekit.checkpoint.savepoint import Savepoint
from statekit.errors import (
    CarriedStateError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MissingStateError,
    StatekitError,
)
from statekit.inspection import catalog
from statekit.inspection.committed import SparkQuery, find_query
from statekit.inspection.entries import state_entries
from statekit.inspection.model import CheckpointInfo
from statekit.inspection.views import CheckpointView, open_checkpoint, register_carried_reader
from statekit.runtime.partition import OperatorManifest
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange
from statekit.serde.msgpack import unpackb
from statekit.serde.types import GenericSerializer, serializer_from_config
from statekit.spark.apply_in_pandas.partition import APPLIED, PartitionRuntime
from statekit.spark.changelog import APPLIED_NAME, ChangeRecorder
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from statekit.state.ttl import StateTtlConfig, Time

OPERATOR_NAME = "applyInPandasWithState"  # Spark's name of the operator in its state metadata
_INLINE = 20 * 1024
_local_session_allowed = False
_cache: dict[tuple[str, int], tuple[str, CheckpointInfo]] = {}
_cache_lock = threading.Lock()


def allow_local_session() -> None:
    """Let :func:`read_carried` start a local SparkSession when none is active (the CLI)."""
    global _local_session_allowed
    _local_session_allowed = True


def _session() -> Any:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        return active
    if _local_session_allowed:
        from statekit.spark.session import local_spark

        return local_spark(master="local[1]", app_name="statekit-inspect")
    raise CarriedStateError(
        "reading an applyInPandasWithState query's state needs a SparkSession (Spark's state "
        "store holds the changes since each snapshot): start one first; the statekit command "
        "starts a local one. spark.read.format('statekit') reads it when statekit.spark is "
        "imported in the driver; .option('snapshotsOnly', 'true') reads the snapshots alone")


def read_carried(query: SparkQuery, batch: int | None, storage_options: dict[str, Any]
                 ) -> CheckpointView:
    """The state of the applyInPandasWithState query ``query`` as of ``batch`` (default: its
    last committed batch): its view says which batch (``info.batch``, status ``committed``)."""
    path, info = materialize(query, batch, storage_options)
    view = open_checkpoint(path)
    view.info = info
    return view


def materialize(query: SparkQuery, batch: int | None, storage_options: dict[str, Any]
                ) -> tuple[str, CheckpointInfo]:
    """A savepoint of the query's state as of ``batch`` (cached per query and batch in this
    process) and the record that describes it."""
    if query.committed is None:
        raise CheckpointNotFoundError(f"{query.location}: the query has not committed a batch yet")
    batch = query.committed if batch is None else int(batch)
    if batch > query.committed:
        raise CheckpointNotFoundError(f"{query.location}: batch {batch} is not committed (the "
                                      f"last committed batch is {query.committed})")
    slot = (query.location, batch)
    with _cache_lock:
        if slot in _cache:
            return _cache[slot]
        found = _write(query, batch, storage_options)
        _cache[slot] = found
        return found


def _write(query: SparkQuery, batch: int, storage_options: dict[str, Any]
           ) -> tuple[str, CheckpointInfo]:
    listing = catalog.scan(query.statekit, storage_options)
    jobs = [j for j in [*catalog.jobs_of(listing, ["spark"]), *listing.carried.values()]
            if j.attempts or any(cid >= 1_000_000 for cid in j.complete)]
    operators = sorted({j.operator or "" for j in jobs})
    if len(operators) != 1:
        raise CarriedStateError(f"{query.statekit} holds {len(operators)} applyInPandasWithState "
                                "operators; reading their carried state needs one")
    query_id, operator = jobs[0].spark_names()
    facts = _manifest(listing, operators[0])
    spark = _session()
    logs = _carried_logs(spark, query.location, batch)
    maxp = int(facts.get("max_parallelism") or DEFAULT_MAX_PARALLELISM)
    snapshots = [found for job in jobs if (found := _snapshot(listing, job, batch)) is not None]
    layouts = dict(facts.get("states") or {})
    for handle, _ in snapshots:
        layouts.update({name: entry.get("layout") for name, (entry, _) in
                        state_entries(handle).items() if entry.get("layout")})
    keys = {key: carried for partition in logs.values() for key, carried in partition.items()}
    # one backend for the operator: Spark's partitions hold disjoint keys, and a savepoint's
    # tasks must not overlap in key groups (each applyInPandasWithState partition spans all)
    backend = _merged(snapshots, layouts, keys, maxp, str(operator))
    work = workdirs.create(tempfile.gettempdir(), "statekit-carried-")
    savepoint = Savepoint(str(work), str(query_id))
    try:
        streams = savepoint.streams(str(operator), _INLINE)
        tasks = {str(operator): backend.snapshot(0, streams, savepoint=True).run()}
    finally:
        backend.dispose()
    path = savepoint.commit({"tasks": tasks, "query_id": query_id, "operator_id": operator,
                             "batch": batch, "max_parallelism": maxp, "backend": "hashmap",
                             "checkpoint_id": batch, "timestamp": int(time.time() * 1000)})
    described = open_checkpoint(path).info
    info = CheckpointInfo(**{**described.__dict__, "path": query.location, "kind": "version",
                             "job": f"{query_id}/{operator}", "id": batch, "batch": batch,
                             "status": "committed", "query": query_id, "operator": operator,
                             "committed_batch": query.committed})
    return path, info


def _manifest(listing: catalog.Listing, operator_rel: str) -> dict[str, Any]:
    """What the operator's manifest records (max parallelism, the states' layouts)."""
    key = f"{operator_rel}/{OperatorManifest.NAME}" if operator_rel else OperatorManifest.NAME
    try:
        return decode_metadata(listing.store.get(key), f"{listing.url}/{key}")
    except (StatekitError, OSError):
        return {}


def _snapshot(listing: catalog.Listing, job: catalog.JobDir, batch: int
              ) -> tuple[dict[str, Any], Any] | None:
    """The partition's newest valid snapshot covering no batch after ``batch``: (handle, reader)."""
    access = listing.access(job)
    for cid in sorted(job.complete, reverse=True):
        try:
            body = access.load(cid)
        except StatekitError:
            continue  # as a restore does: an older one may serve
        attempts = body.get("attempts") or []
        if int(body.get("batch", batch + 1)) > batch or any(int(b) > batch for b, _ in attempts):
            continue
        if catalog.valid_snapshot(job, body):
            return body["tasks"]["partition"], access.reader()
    return None


def _carried_logs(spark: Any, location: str, batch: int) -> dict[int, dict[Any, tuple[Any, ...]]]:
    """Each partition's keys with their carried ``(seq, tseq, tatt, log)`` as of ``batch``."""
    reader = spark.read.format("statestore").option("batchId", batch)
    operator = _spark_operator(spark, location)
    if operator is not None:
        reader = reader.option("operatorId", operator)
    frame = reader.load(location).selectExpr(
        "partition_id", "key", "value.groupState.seq AS seq", "value.groupState.tseq AS tseq",
        "value.groupState.tatt AS tatt", "value.groupState.log AS log")
    out: dict[int, dict[Any, tuple[Any, ...]]] = {}
    for row in frame.toLocalIterator():
        columns = tuple(row["key"])
        key = columns[0] if len(columns) == 1 else columns
        log = row["log"]
        out.setdefault(int(row["partition_id"]), {})[key] = (
            row["seq"], row["tseq"], row["tatt"], None if log is None else bytes(log))
    return out


def _spark_operator(spark: Any, location: str) -> int | None:
    """Spark's id of the query's applyInPandasWithState operator (None: Spark's default)."""
    try:
        rows = spark.read.format("state-metadata").load(location).collect()
    except Exception:  # a checkpoint without operator metadata: Spark's default operator
        return None
    found = sorted({int(r["operatorId"]) for r in rows if r["operatorName"] == OPERATOR_NAME})
    if len(found) > 1:
        raise CarriedStateError(f"{location} has {len(found)} applyInPandasWithState operators; "
                                "reading their carried state needs one")
    return found[0] if found else None


def _descriptor(name: str, layout: list[Any]) -> StateDescriptor:
    """A descriptor with exactly the recorded layout (kind, serializers, TTL), for raw replay."""
    kind, value, user_key, ttl = [*layout, None, None, None, False][:4]
    serializer = serializer_from_config(value)
    descriptor: StateDescriptor
    if kind == "list":
        descriptor = ListStateDescriptor("recorded", serializer)
    elif kind == "map":
        descriptor = MapStateDescriptor("recorded", serializer_from_config(user_key), serializer)
    else:
        descriptor = ValueStateDescriptor("recorded", serializer)
    descriptor.name = name  # the recorded name, internal ones included
    if ttl:  # stamps are replayed as written; nothing expires or is cleaned up here
        descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.days(365_000))
                                       .disable_cleanup_in_background().build())
    return descriptor


def _merged(snapshots: list[tuple[dict[str, Any], Any]], layouts: dict[str, Any],
            logs: dict[Any, tuple[Any, ...]], maxp: int, operator: str) -> Any:
    """The operator's state: the snapshots' keys that Spark still holds, each key's log
    replayed after the change its applied marker names (as the adapter's next call would)."""
    backend = HashMapStateBackend().create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(maxp),
        max_parallelism=maxp, operator_id=operator)
    try:
        if snapshots:
            restore_into(backend, snapshots, key_filter=logs.__contains__)
        recorder = ChangeRecorder()
        backend.state_interceptor = recorder.intercept
        backend.timer_interceptor = recorder.intercept_timers  # timers ride in the logs too
        recorder.create_queue = backend.timer_queue
        for name, layout in layouts.items():
            if name != APPLIED_NAME:
                backend.get_partitioned_state(_descriptor(name, layout))
        applied = backend.get_partitioned_state(APPLIED)
        for key, (_seq, tseq, tatt, blob) in logs.items():
            backend.set_current_key(key)
            value = applied.value()
            marker = None if value is None else (int(value[0]), str(value[1]))
            entries = unpackb(blob) if blob else []
            if not PartitionRuntime._consistent(marker, entries, tseq, tatt):
                if tseq is None and entries and entries[0][0] == 1:
                    recorder.clear_all(key)  # the log holds the key's whole history since empty
                    marker = None
                elif marker is None:
                    raise MissingStateError(
                        f"key {key!r} of operator {operator!r}: Spark's log for it was cut "
                        f"through change {tseq}, but no valid snapshot holds the key")
                else:
                    raise CorruptCheckpointError(
                        f"key {key!r} of operator {operator!r}: the snapshot holds change "
                        f"{marker}, which is not on the log Spark committed for the key")
            for entry in entries:
                if marker is None or entry[0] > marker[0]:
                    recorder.replay(entry[3], key)
                    marker = (int(entry[0]), str(entry[2]))
            applied.update(marker)
    except BaseException:
        backend.dispose()
        raise
    return backend


@functools.cache
def install_reader() -> None:
    """``spark.read.format("statekit").load(PATH)`` on an applyInPandasWithState query: the
    state as of its last committed batch (or the ``batch`` option), resolved here, in the
    driver, unless ``snapshotsOnly`` is set."""
    from pyspark.sql.readwriter import DataFrameReader

    original_format, original_option = DataFrameReader.format, DataFrameReader.option
    original_options, original_load = DataFrameReader.options, DataFrameReader.load

    def format_(self: Any, source: str) -> Any:
        self._statekit_source = str(source)
        return original_format(self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        self.__dict__.setdefault("_statekit_options", {})[str(key)] = value
        return original_option(self, key, value)

    def options(self: Any, **given: Any) -> Any:
        self.__dict__.setdefault("_statekit_options", {}).update(given)
        return original_options(self, **given)

    def load(self: Any, path: Any = None, format: Any = None, schema: Any = None,
             **options: Any) -> Any:
        source = format or getattr(self, "_statekit_source", None)
        if str(source).lower() == "statekit" and isinstance(path, str):
            given = {**getattr(self, "_statekit_options", {}), **options}
            resolved = _resolve(path, given)
            if resolved is not None:
                return original_load(self, resolved, format, schema, **options)
        return original_load(self, path, format, schema, **options)

    DataFrameReader.format = format_  # type: ignore[method-assign]
    DataFrameReader.option = option  # type: ignore[method-assign]
    DataFrameReader.options = options  # type: ignore[method-assign]
    DataFrameReader.load = load  # type: ignore[method-assign]


def _resolve(path: str, options: dict[str, Any]) -> str | None:
    """The savepoint of the applyInPandasWithState query at ``path`` the reader should read,
    or None (another kind of state, or snapshots asked for)."""
    import json

    lowered = {str(k).lower(): v for k, v in options.items()}
    if str(lowered.get("snapshotsonly", "false")).lower() == "true":
        return None
    storage = lowered.get("storageoptions")
    storage_options = json.loads(storage) if storage else {}
    query = find_query(path, storage_options)
    if query is None:
        return None
    listing = catalog.scan(query.statekit, storage_options) if _has_statekit(query, storage_options) \
        else None
    if listing is None or not (listing.carried or any(
            j.attempts for j in catalog.jobs_of(listing, ["spark"]))):
        return None
    batch = lowered.get("batch")
    return materialize(query, None if batch is None else int(batch), storage_options)[0]


def _has_statekit(query: SparkQuery, storage_options: dict[str, Any]) -> bool:
    try:
        catalog.open_store(query.statekit, storage_options)
    except CheckpointNotFoundError:
        return False
    return True


register_carried_reader(read_carried)
