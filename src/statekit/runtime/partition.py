"""Versioned partition stores: the state of one (query, operator, partition) per micro-batch.

Version ``N`` is the state after batch ``N``.  A task of batch ``N`` opens the newest durable
version before ``N``; it reuses the copy this process holds only when the durable metadata of that
version names the very attempt that produced the local copy, and restores from checkpoint storage
otherwise: a copy built by an attempt Spark discarded (a failed or speculative one, or one in
another process) would otherwise carry changes the committed lineage never had.  ``commit`` makes
version ``N`` durable, recording which attempt wrote it, so that check has something to compare;
a retried or speculative attempt that commits ``N`` again replaces the metadata atomically, and
its files never share a name with another attempt's.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from statekit.backends.base import KeyedStateBackend, RestoreSource, StateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.localstate import TaskLocalStateStore
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.savepoint import open_external
from statekit.checkpoint.schema import KEY_GROUP_ROUTING, OPERATOR_STATE
from statekit.config import default
from statekit.errors import (
    CheckpointNotFoundError,
    ConfigError,
    MissingStateError,
    StatekitError,
)
from statekit.runtime.localrecovery import partition_store, restore_preferring_local
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange
from statekit.serde.keygroups import key_group_range_for_operator as owned_range
from statekit.serde.types import TypeSerializer

log = logging.getLogger("statekit.partition")

DEFAULT_VERSIONS_RETAINED: int = default("state.partition.versions-retained")


@dataclass
class _Local:
    version: int
    attempt: str
    backend: KeyedStateBackend
    #: what runs on the backend (the opened user function), kept and dropped with it
    operator: Any = None

    def drop(self) -> None:
        """Close the operator (quietly: the state is being discarded) and the backend."""
        close_quietly(self.operator)
        self.backend.dispose()


def close_quietly(operator: Any) -> None:
    """Close ``operator`` whose state is being dropped; an error there is logged, not raised."""
    if operator is None:
        return
    try:
        operator.close()
    except Exception:
        log.warning("closing the function of a dropped partition state failed", exc_info=True)


_LOCAL: dict[tuple[str, str, int], _Local] = {}
_LOCAL_LOCK = threading.Lock()


class OperatorManifest:
    """A small record an operator's tasks write with their first durable state.

    It tells "this operator never had state" (a new query, or one whose state is gone as a
    whole) from "this partition's state is missing", and records what the state was written
    with.  One blob per (query, operator), beside the partitions' directories.
    """

    NAME = "_operator"
    _known: set[tuple[str, str]] = set()  # (location, name) of manifests this process has seen

    def __init__(self, storage: CheckpointStorage, query_id: str, operator_id: str) -> None:
        self.access = storage.create_access(f"{query_id}/{operator_id}")
        self.query_id = query_id
        self.operator_id = operator_id

    @property
    def location(self) -> str:
        return self.access.location

    def exists(self) -> bool:
        slot = (self.access.location, self.NAME)
        if slot in self._known:
            return True
        if self.access.store.exists(self.NAME):
            self._known.add(slot)
            return True
        return False

    def load(self) -> dict[str, Any]:
        return decode_metadata(self.access.store.get(self.NAME), f"{self.location}/{self.NAME}")

    def ensure(self, batch_id: int, **facts: Any) -> None:
        """Write the manifest unless it exists (racing writers write equivalent records)."""
        if self.exists():
            return
        self.access.store.put(self.NAME, encode_metadata({
            "layout": "operator", "query_id": self.query_id, "operator_id": self.operator_id,
            "first_batch": batch_id, "timestamp": int(time.time() * 1000), **facts}))
        self._known.add((self.access.location, self.NAME))

    def missing(self, batch_id: int, partition: int | None = None) -> MissingStateError:
        """The error for a task of ``batch_id`` that finds no state where state must be."""
        where = self.location
        if partition is not None and self.exists():
            return MissingStateError(
                f"the state of partition {partition} of operator {self.operator_id!r} (query "
                f"{self.query_id}) is missing at batch {batch_id}: the operator has state under "
                f"{where}, but not for this partition. Restore the partition's directory, or "
                f"restart the query from a savepoint or checkpoint that holds it")
        memory = where.startswith("jobmanager://")
        why = ("JobManager checkpoint storage keeps state in the driver's memory, which this "
               "driver does not have" if memory else f"{where} holds no statekit state for it")
        return MissingStateError(
            f"statekit state of operator {self.operator_id!r} (query {self.query_id}) is "
            f"missing: Spark resumes the query at batch {batch_id}, but {why}. Fix: keep state "
            f"in a durable place (leave spark.statekit.state.checkpoint-storage unset to keep it "
            f"under the query's checkpointLocation, or set spark.statekit.state.checkpoints.dir "
            f"to the directory that held it), or set "
            f"spark.statekit.execution.state-recovery.allow-missing-state=true to start this "
            f"query from empty state on purpose")


def new_attempt_token(*parts: Any) -> str:
    """A token unique to one task attempt (Spark's ids are not unique across applications)."""
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:12]


@dataclass
class Scaling:
    """How a partition's keys relate to the others': what lets state move between partitionings.

    ``num_partitions`` is the partition count of this run, or None where it never changes within
    a query (Spark pins it for its own stateful operators); ``owns`` keeps the keys this
    partition owns under this run's partitioning; ``initial`` yields the restore sources of
    another query's state, used when this operator has none yet (``execution.savepoint.path``).
    ``key_groups``: rows are routed by key group and this partition owns these groups (its
    backend holds only them, and a rescale reads only the old partitions that held them).
    """

    num_partitions: int | None = None
    owns: Callable[[Any], bool] | None = None
    initial: Callable[[], list[RestoreSource]] | None = None
    key_groups: KeyGroupRange | None = None

    @property
    def routing(self) -> str | None:
        """``routing`` of this partition's versions (None: Spark's hash of the key)."""
        return None if self.key_groups is None else KEY_GROUP_ROUTING


#: states that describe one query's own progress (applyInPandasWithState's applied markers),
#: never carried into another query's state
QUERY_BOOKKEEPING = frozenset({"__statekit_applied"})


def external_sources(path: str, operator_id: str,
                     storage_options: dict[str, Any] | None = None) -> list[RestoreSource]:
    """Restore sources of another job's state at ``path``: a checkpoint or savepoint (of the
    local runner, or one version of a partition), a job's checkpoint directory (its newest
    checkpoint), or a Spark query's operator directory ``<root>/<query>/<operator>`` or query
    directory ``<root>/<query>`` (every partition of its latest run)."""
    root = path.rstrip("/")
    store = blob_store_for(root, storage_options)
    names = {key.split("/", 1)[0] for key in store.list()}
    if "p00000" not in names and operator_id in names:
        root, store = f"{root}/{operator_id}", blob_store_for(f"{root}/{operator_id}", storage_options)
        names = {key.split("/", 1)[0] for key in store.list()}
    if "p00000" not in names:
        meta, reader = open_external(root, storage_options)
        if meta.get(OPERATOR_STATE):  # never dropped silently (Flink: --allowNonRestoredState)
            raise ConfigError("execution.savepoint.path", f"{path} holds operator state "
                              "(CheckpointedFunction, broadcast state), which runs on the local "
                              "runner only: convert it without (convert_savepoint(..., "
                              "keep_operator_state=False)) to restore its keyed state here")
        return [(handle, reader) for handle in meta.get("tasks", {}).values()]
    first = CheckpointStorageAccess(blob_store_for(f"{root}/p00000", storage_options),
                                    f"{root}/p00000", 0)
    if not first.completed():
        raise CheckpointNotFoundError(f"no complete version of partition 0 under {root}")
    meta = first.load(max(first.completed()))
    batch, count = int(meta.get("batch", 0)), int(meta.get("num_partitions") or 0)
    count = count or len([n for n in names if re.fullmatch(r"p\d{5}", n)])
    sources: list[RestoreSource] = []
    for partition in range(count):
        where = f"{root}/p{partition:05d}"
        access = CheckpointStorageAccess(blob_store_for(where, storage_options), where, 0)
        tasks = access.load(batch)["tasks"]
        sources += [(handle, access.reader()) for handle in tasks.values()]
    return sources


class PartitionStore:
    """Opens, commits and retains the versions of one partition's keyed state."""

    def __init__(self, backend: StateBackend, storage: CheckpointStorage, query_id: str,
                 operator_id: str, partition: int, key_serializer: TypeSerializer,
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM,
                 versions_retained: int = DEFAULT_VERSIONS_RETAINED,
                 allow_missing_state: bool = False, scaling: Scaling | None = None,
                 local_recovery: bool = False) -> None:
        self.backend_factory = backend
        self.storage = storage
        self.manifest = OperatorManifest(storage, query_id, operator_id)
        self.allow_missing_state = allow_missing_state
        self.scaling = scaling or Scaling()
        self.query_id = query_id
        self.operator_id = operator_id
        self.partition = partition
        self.key_serializer = key_serializer
        self.max_parallelism = max_parallelism
        self.versions_retained = max(2, versions_retained)
        self.access: CheckpointStorageAccess = storage.create_access(
            f"{query_id}/{operator_id}/p{partition:05d}")
        self._slot = (query_id, operator_id, partition)
        self.batch: int | None = None
        self.attempt: str | None = None
        self.backend: KeyedStateBackend | None = None
        self.restored_from: int | None = None
        #: what the last open restored (None: nothing, or this process's state reused): recorded
        #: with the version it commits, with the bytes its readers read by then
        self.restore_info: dict[str, Any] | None = None
        self._restore_readers: list[Any] = []
        self.reused = False
        #: where the last open found the state: ``reused`` (this process's), ``local`` (the
        #: executor's local copy), ``remote`` (checkpoint storage), None (nothing to restore)
        self.source: str | None = None
        #: the executor's local copies of this partition's versions (local recovery)
        self.local: TaskLocalStateStore | None = partition_store(
            self.access.location, query_id, operator_id, partition) if local_recovery else None
        #: the operator running on the backend: kept with the local copy across batches, so the
        #: user's function is opened once per partition and process (again only after a restore)
        self.operator: Any = None

    # --- open -----------------------------------------------------------------------------------

    def open(self, batch_id: int, attempt: str) -> KeyedStateBackend:
        """The keyed backend holding this partition's state as of the end of batch ``batch_id - 1``:
        its own newest version, or (partition count changed, new query from another's state) the
        keys it now owns from the partitions of the run before."""
        self.batch, self.attempt = batch_id, attempt
        self.restore_info = None
        base, sources, owns, skip = self._plan(batch_id)
        with _LOCAL_LOCK:
            local = _LOCAL.pop(self._slot, None)
        if local is not None and sources is None and base is not None and local.version == base:
            try:
                durable_attempt = self.access.load(base).get("attempt")
            except (CheckpointNotFoundError, StatekitError):
                durable_attempt = None
            if durable_attempt == local.attempt:
                self.backend, self.reused, self.restored_from = local.backend, True, base
                self.operator, self.source = local.operator, "reused"
                return local.backend
        if local is not None:
            local.drop()
        self.operator = None

        def create() -> KeyedStateBackend:
            return self.backend_factory.create_keyed_state_backend(
                key_serializer=self.key_serializer,
                key_group_range=self.scaling.key_groups or KeyGroupRange.all(self.max_parallelism),
                max_parallelism=self.max_parallelism, operator_id=self.operator_id,
            )

        readers: list[Any] = []
        own = sources is None and base is not None
        if own:
            tasks = self.access.load(base)["tasks"]
            sources = [(h, self.access.reader()) for h in tasks.values()]
            if self.local is not None:  # its own version: the executor's copy, if intact
                readers = [self.local.reader(base, h) for h in tasks.values()]
        if sources:
            started = time.perf_counter()
            backend, self.source = restore_preferring_local(
                create, sources, readers or [None] * len(sources), key_filter=owns,
                skip_states=skip)
            used = {id(r): r for r in [*(r for _, r in sources), *readers] if r is not None}
            self._restore_readers = list(used.values())
            self.restore_info = {"from": base, "rescaled": not own,
                                 "sources": len(sources), "source": self.source,
                                 "seconds": round(time.perf_counter() - started, 4)}
            if own and len(sources) == 1:  # its own version, whole: the next one's base
                backend.adopt_restored_base(sources[0][0])
        else:
            backend, self.source = create(), None
        self.backend, self.reused, self.restored_from = backend, False, base
        return backend

    def _plan(self, batch_id: int) -> tuple[int | None, list[RestoreSource] | None,
                                            Callable[[Any], bool] | None, frozenset[str]]:
        """What to restore: ``(own version, None, ...)`` normally, else explicit sources with
        the key filter and the states to leave out."""
        base = max((v for v in self.access.completed() if v < batch_id), default=None)
        count = self.scaling.num_partitions
        if base is not None and (count is None or self._current(base, batch_id, count)):
            return base, None, None, frozenset()
        latest = None if count is None else self._latest_run(batch_id)
        if latest is not None:  # the partitioning changed: take the keys this one now owns
            batch, previous, routing = latest
            log.info("partition %d of %d restores from %d partitions at batch %d",
                     self.partition, count, previous, batch)
            return None, self._run_sources(batch, previous, routing), self.scaling.owns, frozenset()
        if not self._starts_now(batch_id):  # the operator had state, this partition has none
            raise self.manifest.missing(batch_id, self.partition)
        if self.scaling.initial is not None:
            return None, self.scaling.initial(), self.scaling.owns, QUERY_BOOKKEEPING
        if batch_id > 0 and not self.manifest.exists() and not self.allow_missing_state:
            raise self.manifest.missing(batch_id, self.partition)
        return None, None, None, frozenset()

    def _starts_now(self, batch_id: int) -> bool:
        """Whether the operator's state starts with this batch: no state written before it (its
        partitions may already have committed this very batch, in a run starting now)."""
        return not self.manifest.exists() or int(
            self.manifest.load().get("first_batch", -1)) >= batch_id

    def _current(self, base: int, batch_id: int, count: int) -> bool:
        """Whether version ``base`` belongs to the operator's latest run, at this partition count
        and routing."""
        meta = self.access.load(base)
        if int(meta.get("num_partitions", count)) != count or meta.get("routing") != self.scaling.routing:
            return False
        if base == batch_id - 1:  # every partition commits every batch: the common case
            return True
        latest = self._latest_run(batch_id)
        return latest is not None and latest[0] == base

    def _sibling(self, partition: int) -> CheckpointStorageAccess:
        return self.storage.create_access(f"{self.query_id}/{self.operator_id}/p{partition:05d}")

    def _latest_run(self, batch_id: int) -> tuple[int, int, str | None] | None:
        """``(batch, partition count, routing)`` of the newest version before ``batch_id`` of
        partition 0, which every run writes; None when the operator has no state."""
        first = self._sibling(0)
        newest = max((v for v in first.completed() if v < batch_id), default=None)
        if newest is None:
            return None
        meta = first.load(newest)
        same_groups = int(meta.get("max_parallelism", self.max_parallelism)) == self.max_parallelism
        return (int(meta.get("batch", newest)), int(meta.get("num_partitions", 1)),
                meta.get("routing") if same_groups else None)  # other groups: read every one

    def _run_sources(self, batch: int, count: int, routing: str | None) -> list[RestoreSource]:
        """The versions ``batch`` of the run that wrote it (``count`` partitions) that may hold
        keys of this partition: every one, or where both runs route by key group, those whose
        key groups overlap this partition's."""
        sources: list[RestoreSource] = []
        mine = self.scaling.key_groups
        for partition in range(count):
            if mine is not None and routing == KEY_GROUP_ROUTING and not len(mine.intersection(
                    owned_range(self.max_parallelism, count, partition))):
                continue
            access = self._sibling(partition)
            try:
                tasks = access.load(batch)["tasks"]
            except CheckpointNotFoundError:
                raise self.manifest.missing(batch + 1, partition) from None
            sources += [(handle, access.reader()) for handle in tasks.values()]
        return sources

    # --- commit / abort -----------------------------------------------------------------------

    def commit(self, extra: dict[str, Any] | None = None) -> str:
        """Make the state durable as version ``batch_id``; keep the backend for the next batch."""
        if self.backend is None or self.batch is None:
            raise StatekitError("commit() without open()")
        start = time.perf_counter()
        streams = self.access.streams(self.batch, f"p{self.partition}-{uuid.uuid4().hex[:8]}")
        if self.local is not None:
            streams = self.local.streams(self.batch, streams)
        try:
            run = self.backend.snapshot(self.batch, streams)
            synced = time.perf_counter()
            handle = run.run()
        except BaseException:
            if self.local is not None:
                self.local.abort(self.batch)
            raise
        ran = time.perf_counter()
        body = {
            "tasks": {"partition": handle}, "attempt": self.attempt, "batch": self.batch,
            "partition": self.partition, "num_partitions": self.scaling.num_partitions,
            **({"routing": self.scaling.routing} if self.scaling.routing else {}),
            "query_id": self.query_id,
            "operator_id": self.operator_id, "max_parallelism": self.max_parallelism,
            "timestamp": int(time.time() * 1000), **(extra or {}),
        }
        # the snapshot (a RocksDB rescale's compaction wait included) and its upload
        body["commit"] = {"sync_s": round(synced - start, 4), "async_s": round(ran - synced, 4),
                          "bytes_written": streams.bytes_written}
        if self.restore_info is not None:  # this attempt restored: what that read, and from where
            body["restore"] = {**self.restore_info, "bytes_read": sum(
                r.bytes_read for r in self._restore_readers)}
        try:
            path = self.access.commit(self.batch, body)
        except BaseException:
            if self.local is not None:
                self.local.abort(self.batch)
            raise
        if self.local is not None:
            self.local.complete(self.batch, handle)
        self.manifest.ensure(self.batch, max_parallelism=self.max_parallelism)
        self.backend.notify_checkpoint_complete(self.batch)
        with _LOCAL_LOCK:
            previous = _LOCAL.pop(self._slot, None)
            _LOCAL[self._slot] = _Local(self.batch, self.attempt or "", self.backend,
                                        self.operator)
        if previous is not None and previous.backend is not self.backend:
            previous.drop()
        self._retire_old_versions()
        log.info("committed %s version %d (%d bytes, %.1f ms, %s)", self.access.location,
                 self.batch, streams.bytes_written, (time.perf_counter() - start) * 1000,
                 "reused local state" if self.reused else
                 f"restored from {self.restored_from} ({self.source or 'nothing'})")
        self.backend = None
        self.operator = None
        return path

    def abort(self) -> None:
        """Drop the local state of an attempt that will not commit (it is never reused)."""
        if self.backend is not None:
            _Local(-1, "", self.backend, self.operator).drop()
            self.backend = None
            self.operator = None

    def _retire_old_versions(self) -> None:
        versions = self.access.completed()
        keep = versions[-self.versions_retained:]
        for old in versions[: -self.versions_retained]:
            self.access.discard(old, keep)


def drop_local_state() -> None:
    """Dispose every partition state this process holds (tests, worker shutdown)."""
    with _LOCAL_LOCK:
        locals_ = list(_LOCAL.values())
        _LOCAL.clear()
    for local in locals_:
        local.drop()
