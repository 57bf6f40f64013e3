"""The snapshot lineage of one ``applyInPandasWithState`` partition in this worker process.

Spark commits each key's ``GroupState`` with its micro-batch but tells Python nothing about task
attempts, so the adapter keeps its own evidence of which attempt Spark kept:

* each task attempt records a durable marker when it starts
  (:meth:`~statekit.checkpoint.layout.CheckpointStorageAccess.mark_attempt`).  Once a later batch
  runs, an earlier batch was committed; if it has a single marker, that attempt is the one Spark
  committed.  A process snapshots its local state only when the markers show that its own
  attempts were the only ones for every batch it holds, so no snapshot ever holds the changes of
  an attempt Spark discarded;
* a key's carried log is truncated only up to what the trusted snapshot holds for that key.  That
  is safe only if every later restore starts from a snapshot holding at least as much, i.e. if
  snapshots form one chain.  So a snapshot is taken only from the newest valid one, and it is
  written *inside the task that takes it* (before the task's first key, or inline during it):
  the tasks of one partition run one after another, so a later task in another process always
  sees it.  (An upload that outlived its task could complete after a later task had branched off
  an older snapshot; two such siblings each miss the other's keys, and a restore from one breaks
  logs truncated against the other.)
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from statekit import config as cfg
from statekit.backends.base import KeyedStateBackend
from statekit.backends.transfer import restore_into
from statekit.errors import StatekitError
from statekit.runtime.partition import QUERY_BOOKKEEPING, OperatorManifest
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer
from statekit.spark.task import AdapterSpec, TaskInfo

log = logging.getLogger("statekit.spark")

MATERIALIZE_KEY = "state.changelog.materialize-every-batches"
DEFAULT_MATERIALIZE_EVERY: int = cfg.default(MATERIALIZE_KEY)
MID_TASK_KEY = "state.changelog.materialize-after-calls"
DEFAULT_MID_TASK_CALLS: int = cfg.default(MID_TASK_KEY)
#: a task whose carried logs re-send more than this many bytes of earlier changes, and more than
#: OLD_TO_NEW_BEFORE_SNAPSHOT times its new changes, makes the next task snapshot early
OLD_LOG_BYTES_BEFORE_SNAPSHOT = 256 << 10
OLD_TO_NEW_BEFORE_SNAPSHOT = 4

Marker = tuple[int, str]  # (sequence number, attempt token) of a log entry
Attempt = tuple[int, str]  # (batch, attempt token) of a task attempt


class SnapshotId:
    """Snapshot ids of a partition, in the order a restore prefers them.

    ``(covered batch + 1) * BATCH + calls * CALL + random``: ordered by the first batch a snapshot
    does not cover, then by the key calls its task had made when it took it (later snapshots of
    one task win), with a random part keeping two processes' snapshots apart.
    """

    BATCH = 1_000_000
    CALL = 1000
    MAX_CALLS = BATCH // CALL - 1

    @classmethod
    def encode(cls, covered_batch: int, calls: int) -> int:
        return ((covered_batch + 1) * cls.BATCH + min(calls, cls.MAX_CALLS) * cls.CALL
                + random.randrange(cls.CALL))

    @classmethod
    def batch_after(cls, snapshot_id: int) -> int:
        """The first batch a snapshot does not cover."""
        return snapshot_id // cls.BATCH


@dataclass
class PendingSnapshot:
    """A snapshot this process wrote but does not trust yet (its batches not yet confirmed)."""

    snapshot_id: int
    captured: dict[Any, Marker | None]
    included: list[Attempt]


@dataclass
class Lineage:
    """What this process's local state is built from, for snapshot validity and truncation."""

    base_id: int | None = None
    own_attempts: list[Attempt] = field(default_factory=list)  # since base
    base_markers: dict[Any, Marker | None] = field(default_factory=dict)  # lazily, per key
    touched: dict[Any, Marker | None] = field(default_factory=dict)  # markers changed since base
    trusted: dict[Any, Marker | None] = field(default_factory=dict)  # of the trusted snapshot


class PartitionLineage:
    """One partition's local state in this process and the snapshot chain it belongs to.

    Restores, materializes and retires snapshots; :meth:`_open` (the per-key runtime's part)
    prepares a freshly restored backend for calls.
    """

    def __init__(self, spec: AdapterSpec, query_id: str, partition: int,
                 materialize_every: int, mid_task_calls: int = DEFAULT_MID_TASK_CALLS) -> None:
        self.spec = spec
        self.partition = partition
        self.materialize_every = max(1, materialize_every)
        self.mid_task_calls = max(1, mid_task_calls)
        self.calls = 0
        self.access = spec.storage.create_access(f"{query_id}/{spec.operator_id}/p{partition:05d}")
        self.manifest = OperatorManifest(spec.storage, query_id, spec.operator_id)
        self.backend: Any = None
        self.lineage = Lineage()
        self.token: str | None = None
        self.batch = -1
        self.pending: PendingSnapshot | None = None
        self.last_materialized_batch = -1
        self.restores = 0
        self.logged_old_bytes = 0  # bytes of earlier changes the running task sent Spark again
        self.logged_new_bytes = 0  # bytes of the running task's own changes

    def _open(self, backend: KeyedStateBackend) -> None:
        """Make a freshly restored ``backend`` the one calls use (the runtime's part)."""
        raise NotImplementedError

    # --- task lifecycle ---------------------------------------------------------------------------

    def begin_task(self, info: TaskInfo) -> None:
        """First call of a task attempt: record it durably, then maybe materialize or restore."""
        if info.attempt_token == self.token:
            return
        self.access.mark_attempt(info.batch_id, info.attempt_token)
        self.manifest.ensure(info.batch_id, max_parallelism=self.spec.max_parallelism)
        self._settle_pending(current_batch=info.batch_id)
        self.calls = 0
        if self.backend is None:
            self._restore_latest(info.batch_id)
        elif not self._own_attempts_confirmed(info.batch_id):
            log.info("partition %d: another attempt ran a batch this process holds; restoring",
                     self.partition)
            self._restore_latest(info.batch_id)
        elif info.batch_id - max(self.last_materialized_batch, self._base_batch()) \
                >= self.materialize_every or self._logs_outweigh_snapshot():
            self._materialize(info.batch_id)
        self.logged_old_bytes = self.logged_new_bytes = 0
        self.token, self.batch = info.attempt_token, info.batch_id
        self.lineage.own_attempts.append((info.batch_id, info.attempt_token))

    def _logs_outweigh_snapshot(self) -> bool:
        """Whether the last task's logs were mostly earlier changes sent again: Spark rewrites a
        key's whole log with every change, so a large entry (a key's first fill of big state)
        costs its size per batch until a trusted snapshot lets it be cut."""
        old, new = self.logged_old_bytes, self.logged_new_bytes
        return old > OLD_LOG_BYTES_BEFORE_SNAPSHOT and old > OLD_TO_NEW_BEFORE_SNAPSHOT * new

    def _base_batch(self) -> int:
        return -1 if self.lineage.base_id is None else SnapshotId.batch_after(self.lineage.base_id)

    def _confirmed(self, attempts: list[Attempt], current_batch: int) -> bool:
        """Whether each (batch, attempt) was the only attempt of its batch, and Spark committed it."""
        for batch, token in attempts:
            if batch >= current_batch or self.access.attempts(batch) != [token]:
                return False
        return True

    def _own_attempts_confirmed(self, current_batch: int) -> bool:
        return self._confirmed(self.lineage.own_attempts, current_batch)

    def _newest_valid(self, current_batch: int, trusted: int | None = None
                      ) -> tuple[int, dict[str, Any] | None] | None:
        """The newest snapshot whose attempts are all confirmed, with its metadata (``trusted``,
        already known valid, is returned unread); None when there is none."""
        for sid in reversed(self.access.completed()):
            if sid == trusted:
                return sid, None
            try:
                meta = self.access.load(sid)
            except StatekitError:  # missing or damaged: an older one may serve
                continue
            if self._confirmed([tuple(a) for a in meta.get("attempts", [])], current_batch):
                return sid, meta
        return None

    # --- restore ---------------------------------------------------------------------------------

    def _restore_latest(self, current_batch: int) -> None:
        """Replace the local state by the newest valid snapshot (or empty state)."""
        self.pending = None  # it belongs to the lineage being replaced
        if self.backend is not None:
            self.backend.dispose()
        spec = self.spec
        backend = spec.backend.create_keyed_state_backend(
            key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(spec.max_parallelism),
            max_parallelism=spec.max_parallelism, operator_id=spec.operator_id,
        )
        found = self._newest_valid(current_batch)
        if found is not None:
            meta: Any = found[1]
            reader = self.access.reader()
            restore_into(backend, [(h, reader) for h in meta["tasks"].values()])
        elif spec.savepoint_path:
            # no snapshot of this query yet: start from the other query's state; the carried
            # logs hold every change since (none is truncated before a snapshot exists)
            scaling = spec.scaling(self.partition)
            restore_into(backend, scaling.initial() if scaling.initial else [],
                         key_filter=scaling.owns, skip_states=QUERY_BOOKKEEPING)
        self.backend = backend
        self._open(backend)
        self.lineage = Lineage(base_id=None if found is None else found[0])
        self.restores += 1
        self._retire(None)

    # --- materialization -------------------------------------------------------------------------

    def _materialize(self, current_batch: int, *, mid_task: bool = False) -> None:
        """Snapshot the local state, durably, before returning (see the module's reasons).

        At a task's start it covers every batch before ``current_batch``; ``mid_task`` also
        covers the running batch's changes so far, which makes the snapshot *tentative*: it
        becomes valid (restorable, trusted) only once that batch was committed with this
        attempt as its only one — checked by whoever uses it at a later batch.
        """
        newest = self._newest_valid(current_batch, trusted=self.lineage.base_id)
        if (None if newest is None else newest[0]) != self.lineage.base_id:
            return  # another process extended the chain; snapshots must build on the newest
        covered = current_batch if mid_task else current_batch - 1
        sid = SnapshotId.encode(covered, self.calls)
        included = list(self.lineage.own_attempts)
        try:
            handle = self.backend.snapshot(sid, self.access.streams(sid, f"p{self.partition}")).run()
            self.access.commit(sid, {"attempts": included, "base": self.lineage.base_id,
                                     "batch": covered, "partition": self.partition,
                                     "tasks": {"partition": handle}})
        except Exception as exc:  # an optimisation: the carried logs still hold everything
            log.warning("partition %d: snapshot %d failed: %s", self.partition, sid, exc)
            self.access.abort(sid, [], [])
            return
        self.pending = PendingSnapshot(sid, dict(self.lineage.touched), included)
        self.last_materialized_batch = covered
        self._settle_pending(current_batch)

    def _mid_task_due(self) -> bool:
        """Whether to snapshot during this task: enough batches since the trusted base, and no
        snapshot in flight (a finished tentative one of this task is superseded)."""
        pending = self.pending
        if pending is not None and not any(b >= self.batch for b, _ in pending.included):
            return False
        return self.batch - self._base_batch() >= self.materialize_every - 1

    def _settle_pending(self, current_batch: int | None = None) -> None:
        """Trust the pending snapshot once its batches are confirmed (truncation then uses it),
        keep a tentative one until its batch is known to be committed, or drop it."""
        pending = self.pending
        if pending is None:
            return
        batch = self.batch if current_batch is None else current_batch
        if any(b >= batch for b, _ in pending.included):
            return  # tentative: re-checked when a later task starts
        self.pending = None
        if not self._confirmed(pending.included, batch):
            return  # an attempt it holds was not the committed one: never trusted, later retired
        self.backend.notify_checkpoint_complete(pending.snapshot_id)
        lineage = self.lineage
        previous = lineage.base_id
        lineage.trusted = pending.captured
        lineage.base_id = pending.snapshot_id
        lineage.own_attempts = lineage.own_attempts[len(pending.included):]
        self._retire(previous)

    def _retire(self, previous: int | None) -> None:
        """Drop snapshots older than the ones kept, and attempt markers none of those needs."""
        keep = [s for s in (previous, self.lineage.base_id) if s is not None]
        if not keep:
            return
        for sid in self.access.completed():
            if sid < min(keep):
                self.access.discard(sid, keep)
        needed = [SnapshotId.batch_after(min(keep)) - 1]
        for sid in keep:
            try:
                needed += [int(b) for b, _ in self.access.load(sid).get("attempts", [])]
            except StatekitError:
                return  # cannot tell which markers validate it: keep them all
        self.access.retire_attempts(before_batch=min(needed))
