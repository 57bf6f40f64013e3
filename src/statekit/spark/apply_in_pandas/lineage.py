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

Since tasks move between processes, a process is often *behind* the chain: another process
extended it since this one's base.  Such a process catches up at its next task's start
(:meth:`PartitionLineage._rebase`): it restores the chain's newest snapshot and carries over the
keys it changed that the chain has not changed since, so it can extend the chain itself and
nothing it applied is dropped.  Snapshots are then due by the chain's age, whichever process runs
the task, and a key whose carried log passes its bound (bytes, or changes older than the
schedule) makes its task snapshot within the task.
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
from statekit.spark.apply_in_pandas.carried import CarriedLog
from statekit.spark.changelog import ChangeRecorder
from statekit.spark.task import AdapterSpec, TaskInfo

log = logging.getLogger("statekit.spark")

MATERIALIZE_KEY = "state.changelog.materialize-every-batches"
DEFAULT_MATERIALIZE_EVERY: int = cfg.default(MATERIALIZE_KEY)
MID_TASK_KEY = "state.changelog.materialize-after-calls"
DEFAULT_MID_TASK_CALLS: int = cfg.default(MID_TASK_KEY)
MAX_LOG_KEY = "state.changelog.max-log-bytes"
#: attempt markers are kept this many batches longer than snapshots need them, so that a process
#: that did not run the partition for a while can still prove its last attempts and catch up
MARKER_MARGIN_BATCHES = 64
#: a task whose carried logs re-send more than this many bytes of earlier changes, and more than
#: OLD_TO_NEW_BEFORE_SNAPSHOT times its new changes, makes the next task snapshot early
OLD_LOG_BYTES_BEFORE_SNAPSHOT = 256 << 10
OLD_TO_NEW_BEFORE_SNAPSHOT = 4

Marker = tuple[int, str]  # (sequence number, attempt token) of a log entry
Attempt = tuple[int, str]  # (batch, attempt token) of a task attempt


class SnapshotId:
    """Snapshot ids of a partition, in the order a restore prefers them.

    ``(covered batch + 1) * BATCH + order * CALL + random``: ordered by the first batch a snapshot
    does not cover, then by its ``order`` within that batch: the n-th snapshot taken within the
    batch's task has order n, and one taken at the next task's start (the whole batch) has
    :attr:`WHOLE_BATCH`, so a later snapshot of the same batch always wins; a random part keeps
    two processes' snapshots apart.
    """

    BATCH = 1_000_000
    CALL = 1000
    MAX_CALLS = BATCH // CALL - 1
    WHOLE_BATCH = MAX_CALLS

    @classmethod
    def encode(cls, covered_batch: int, order: int) -> int:
        return ((covered_batch + 1) * cls.BATCH + min(order, cls.MAX_CALLS) * cls.CALL
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
        self.max_log_bytes: int = cfg.read(spec.conf, MAX_LOG_KEY)
        self.calls = 0
        self.snapshots_in_task = 0  # snapshots taken within the running task
        self.bound_calls = 0  # calls of the running task at its last snapshot for a log's bound
        self.over_bound = False  # a log passed its bound after the running task's last snapshot
        #: whether :meth:`end_task` is called when a task's last call is done (the adapter hooks
        #: the worker's task end); without it, logs past their bound snapshot within the task
        self.task_end_hook = False
        self.recorder = ChangeRecorder()  # the current backend's (the runtime's ``_open`` sets it)
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
        self._settle_pending(current_batch=info.batch_id)
        self.calls = self.snapshots_in_task = 0
        if self.backend is None:
            self._restore_latest(info.batch_id)
        elif not self._own_attempts_confirmed(info.batch_id):
            log.info("partition %d: another attempt ran a batch this process holds; restoring",
                     self.partition)
            self._restore_latest(info.batch_id)
        else:
            self.lineage.own_attempts = []  # each was Spark's committed one: nothing to name
            self._catch_up(info.batch_id)
            if info.batch_id - max(self.last_materialized_batch, self._base_batch()) \
                    >= self.materialize_every or self._logs_outweigh_snapshot() or self.over_bound:
                self._materialize(info.batch_id)
        # what the state is written with, for reading carried changes without a snapshot
        self.manifest.ensure(info.batch_id, max_parallelism=self.spec.max_parallelism,
                             states={name: meta.layout for name, (meta, _) in self.recorder.raw.items()})
        self.logged_old_bytes = self.logged_new_bytes = 0
        self.bound_calls, self.over_bound = 0, False
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
        if self.backend is not None:
            self.backend.dispose()
            self.backend = None
        self._restore_from(self._newest_valid(current_batch))

    def _restore_from(self, found: tuple[int, dict[str, Any] | None] | None) -> None:
        """Make the snapshot ``found`` (id, metadata; None: empty state) the local state."""
        self.pending = None  # it belongs to the lineage being replaced
        spec = self.spec
        backend = spec.backend.create_keyed_state_backend(
            key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(spec.max_parallelism),
            max_parallelism=spec.max_parallelism, operator_id=spec.operator_id,
        )
        if found is not None:
            meta: Any = found[1] if found[1] is not None else self.access.load(found[0])
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

    def _catch_up(self, current_batch: int) -> None:
        """Move onto the chain's newest valid snapshot when another process extended the chain
        since this process's base (else this process could never snapshot again)."""
        found = self._newest_valid(current_batch, trusted=self.lineage.base_id)
        if found is not None and found[0] != self.lineage.base_id:
            self._rebase(found)

    def _rebase(self, found: tuple[int, dict[str, Any] | None]) -> None:
        """Restore ``found`` and carry over each key this process changed since its base that
        the chain did not change since (the key's marker there is still this base's): that
        version is newer.  Every other key is taken from ``found``.  Both are on the committed
        lineage (this process's attempts were all just confirmed, so the next snapshot need not
        name them), so the result is too."""
        old_backend, old_recorder, old = self.backend, self.recorder, self.lineage
        mine = {key: self._trusted_marker(key) for key, marker in old.touched.items()
                if marker != self._trusted_marker(key)}
        self.backend = None
        self._restore_from(found)
        lineage, carried = self.lineage, 0
        for key, base_marker in mine.items():
            self.backend.set_current_key(key)
            if self._marker() != base_marker:
                continue  # the chain changed the key too: its version stands
            old_backend.set_current_key(key)
            ops, marker = old_recorder.dump(key), old_recorder.applied()
            self.recorder.clear_all(key)
            self.recorder.replay(ops, key)
            self.backend.set_current_key(key)
            self._set_marker(key, None if marker is None else (int(marker[0]), str(marker[1])))
            lineage.base_markers[key] = base_marker
            carried += 1
        old_backend.dispose()
        log.info("partition %d: caught up with snapshot %d, %d newer key(s) carried over",
                 self.partition, found[0], carried)

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
        order = self.snapshots_in_task + 1 if mid_task else SnapshotId.WHOLE_BATCH
        if order >= SnapshotId.WHOLE_BATCH and (mid_task or self._base_batch() > covered):
            return  # its id could not order it after the base (a retry's start, or too many)
        sid = SnapshotId.encode(covered, order)
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
        self.snapshots_in_task += mid_task
        self.last_materialized_batch = covered
        self._settle_pending(current_batch)

    def _after_call(self, carried: CarriedLog | None) -> None:
        """After a key's call: note when its log (``carried``, None when the key was removed)
        passed its bound, for the snapshot at the task's end; snapshot within the task when the
        mid-task schedule says so.  Without a task-end hook a log past its bound snapshots at
        once, at most each time the task's calls double (a task of many such keys takes few),
        and one past it after the task's last snapshot makes the next task's start snapshot."""
        self.calls += 1
        if carried is not None and carried.entries and (
                len(carried.blob) > self.max_log_bytes
                or self.batch - int(carried.entries[0][1]) >= self.materialize_every):
            self.over_bound = True
            if not self.task_end_hook and self.calls >= 2 * self.bound_calls:
                self.bound_calls = self.calls
                self._materialize(self.batch, mid_task=True)
                self.over_bound = False
                return
        if self.calls % self.mid_task_calls == 0 and self._mid_task_due():
            self._materialize(self.batch, mid_task=True)  # e.g. a process that never sees a next task

    def end_task(self) -> None:
        """The running task's last call is done (still inside the task: Spark commits the
        batch after this returns).  Snapshot the whole batch when a log passed its bound or the
        next task would be due, so that the next task finds it whichever process runs it."""
        if self.backend is None or self.token is None:
            return
        due = self.batch + 1 - max(self.last_materialized_batch, self._base_batch())
        if self.over_bound or due >= self.materialize_every:
            self._materialize(self.batch, mid_task=True)
        self.over_bound = False

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
        self.access.retire_attempts(before_batch=min(needed) - MARKER_MARGIN_BATCHES)
