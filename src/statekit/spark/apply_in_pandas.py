"""The ``applyInPandasWithState`` adapter: exactly-once without an end-of-partition hook.

Spark calls the function once per key and commits each key's ``GroupState`` atomically with the
micro-batch, but tells Python nothing when a task ends.  So (DESIGN.md rule 3):

* every call appends the key's changes (recorded state operations) to a compact log carried in
  its ``GroupState``, each entry tagged with (sequence number, batch, task attempt);
* the backend stores, per key, the last entry it applied (the *applied marker*); a call first
  applies the log entries newer than the marker, then runs the function;
* a marker that is not on the committed log (a change of an attempt Spark discarded) means the
  local copy is not the committed lineage: the partition is restored from the newest valid
  snapshot and the key's log applied on top;
* each task attempt records a durable marker when it starts; a process materializes its state
  only when those markers show that its own attempts were the only ones for every batch it
  holds, so no snapshot ever holds a discarded attempt's changes;
* a key's log is truncated, during one of its calls, only up to the marker the latest trusted
  snapshot holds for that key.  That is safe only if every later restore starts from a snapshot
  holding at least as much, i.e. if snapshots form one chain.  So a snapshot is taken only from
  the newest valid one, and it is written *inside the task that takes it* (before the task's
  first key, or inline during it): the tasks of one partition run one after another, so a later
  task in another process always sees it.  (An upload that outlived its task could complete
  after a later task had branched off an older snapshot; two such siblings each miss the other's
  keys, and a restore from one breaks logs truncated against the other.)
"""

from __future__ import annotations

import copy
import functools
import logging
import random
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from statekit import config as cfg
from statekit.backends.bulk import BulkState
from statekit.errors import (
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    MissingStateError,
    StatekitError,
)
from statekit.runtime.functions import KeyedProcessFunction, RuntimeContext, TimerService
from statekit.runtime.partition import OperatorManifest
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer, packb, unpackb
from statekit.spark.adapters import _spec
from statekit.spark.changelog import ChangeRecorder
from statekit.spark.runner import AdapterSpec, TaskInfo
from statekit.state.descriptors import internal_value_descriptor

log = logging.getLogger("statekit.spark")

STATE_SCHEMA = "seq long, tseq long, tatt string, log binary"
APPLIED = internal_value_descriptor("__statekit_applied")
MATERIALIZE_KEY = "state.changelog.materialize-every-batches"
DEFAULT_MATERIALIZE_EVERY = 5
MID_TASK_KEY = "state.changelog.materialize-after-calls"
DEFAULT_MID_TASK_CALLS = 1000

Marker = tuple[int, str]  # (sequence number, attempt token) of a log entry


@dataclass
class _Pending:
    """A snapshot this process wrote but does not trust yet (its batches not yet confirmed)."""

    snapshot_id: int
    captured: dict[Any, Marker | None]
    included: list[tuple[int, str]]


@dataclass
class _Lineage:
    """What this process's local state is built from, for snapshot validity and truncation."""

    base_id: int | None = None
    own_attempts: list[tuple[int, str]] = field(default_factory=list)  # since base
    base_markers: dict[Any, Marker | None] = field(default_factory=dict)  # lazily, per key
    touched: dict[Any, Marker | None] = field(default_factory=dict)  # markers changed since base
    trusted: dict[Any, Marker | None] = field(default_factory=dict)  # of the trusted snapshot


class PartitionRuntime:
    """One partition's statekit state in this worker process, kept across batches and tasks."""

    def __init__(self, spec: AdapterSpec, query_id: str, partition: int,
                 materialize_every: int, timeout_conf: str = "NoTimeout",
                 mid_task_calls: int = DEFAULT_MID_TASK_CALLS) -> None:
        self.spec = spec
        self.mid_task_calls = max(1, mid_task_calls)
        self.calls = 0
        self.timeout_conf = timeout_conf
        self._group_state: Any = None
        self.partition = partition
        self.materialize_every = max(1, materialize_every)
        self.access = spec.storage.create_access(f"{query_id}/{spec.operator_id}/p{partition:05d}")
        self.manifest = OperatorManifest(spec.storage, query_id, spec.operator_id)
        self.backend: Any = None
        self.function: Any = None
        self.recorder = ChangeRecorder()
        self.lineage = _Lineage()
        self.token: str | None = None
        self.batch = -1
        self.pending: _Pending | None = None
        self.last_materialized_batch = -1
        self.restores = 0
        self.started_empty = 0  # keys started from empty state because their snapshot was gone

    # --- task lifecycle ---------------------------------------------------------------------------

    def begin_task(self, info: TaskInfo) -> None:
        """First call of a task attempt: record it durably, then maybe materialize or restore."""
        if info.attempt_token == self.token:
            return
        self.access.store.put(f"attempts/b{info.batch_id:012d}/{info.attempt_token}", b"")
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
                >= self.materialize_every:
            self._materialize(info.batch_id)
        self.token, self.batch = info.attempt_token, info.batch_id
        self.lineage.own_attempts.append((info.batch_id, info.attempt_token))

    def _base_batch(self) -> int:
        return -1 if self.lineage.base_id is None else SnapshotId.batch_after(self.lineage.base_id)

    def _confirmed(self, attempts: list[tuple[int, str]], current_batch: int) -> bool:
        """Whether each (batch, attempt) was the only attempt of its batch, and Spark committed it."""
        for batch, token in attempts:
            if batch >= current_batch:
                return False
            tokens = [k.rsplit("/", 1)[-1] for k in self.access.store.list(f"attempts/b{batch:012d}/")]
            if tokens != [token]:
                return False
        return True

    def _own_attempts_confirmed(self, current_batch: int) -> bool:
        return self._confirmed(self.lineage.own_attempts, current_batch)

    # --- restore ---------------------------------------------------------------------------------

    def _restore_latest(self, current_batch: int) -> None:
        """Replace the local state by the newest valid snapshot (or empty state)."""
        self.pending = None  # it belongs to the lineage being replaced
        if self.backend is not None:
            self.backend.dispose()
        backend = self.spec.backend.create_keyed_state_backend(
            key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(self.spec.max_parallelism),
            max_parallelism=self.spec.max_parallelism, operator_id=self.spec.operator_id,
        )
        base_id = None
        for sid in reversed(self.access.completed()):
            try:
                meta = self.access.load(sid)
            except (CheckpointNotFoundError, StatekitError):
                continue
            if self._confirmed([tuple(a) for a in meta.get("attempts", [])], current_batch):
                backend.restore(list(meta["tasks"].values()), self.access.reader())
                base_id = sid
                break
        self.recorder = ChangeRecorder()
        backend.state_interceptor = self.recorder.intercept
        self.backend = backend
        backend.get_partitioned_state(APPLIED)
        self.timers = TimerService(backend, self._processing_time, self._watermark)
        self.function = copy.deepcopy(self.spec.function)
        self.function.open(RuntimeContext(backend, self.spec.operator_id, self.partition, -1,
                                          self.spec.max_parallelism, 0,
                                          {**self.spec.conf, "partition": self.partition}))
        self.lineage = _Lineage(base_id=base_id)
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
        if self._newest_valid(current_batch) != self.lineage.base_id:
            return  # another process extended the chain; snapshots must build on the newest
        covered = current_batch if mid_task else current_batch - 1
        # later snapshots of one task get larger ids; the random part keeps processes apart
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
        self.pending = _Pending(sid, dict(self.lineage.touched), included)
        self.last_materialized_batch = covered
        self._settle_pending(current_batch)

    def _mid_task_due(self) -> bool:
        """Whether to snapshot during this task: enough batches since the trusted base, and no
        snapshot in flight (a finished tentative one of this task is superseded)."""
        pending = self.pending
        if pending is not None and not any(b >= self.batch for b, _ in pending.included):
            return False
        return self.batch - self._base_batch() >= self.materialize_every - 1

    def _newest_valid(self, current_batch: int) -> int | None:
        for sid in reversed(self.access.completed()):
            if sid == self.lineage.base_id:
                return sid
            try:
                meta = self.access.load(sid)
            except (CheckpointNotFoundError, StatekitError):
                continue
            if self._confirmed([tuple(a) for a in meta.get("attempts", [])], current_batch):
                return sid
        return None

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
            except (CheckpointNotFoundError, StatekitError):
                return  # cannot tell which markers validate it: keep them all
        oldest_needed = min(needed)
        for key in self.access.store.list("attempts/"):
            if int(key.split("/")[1][1:]) < oldest_needed:
                self.access.store.delete(key)

    # --- one call ----------------------------------------------------------------------------------

    def _processing_time(self) -> int:
        return int(self._group_state.getCurrentProcessingTimeMs())

    def _watermark(self) -> int:
        try:
            return int(self._group_state.getCurrentWatermarkMs())
        except Exception:  # Spark refuses the watermark when the query defines none
            return -(2**63)

    def _marker(self) -> Marker | None:
        value = self.backend.get_partitioned_state(APPLIED).value()
        return None if value is None else (int(value[0]), str(value[1]))

    def _set_marker(self, key: Any, marker: Marker | None) -> None:
        self.backend.get_partitioned_state(APPLIED).update(marker)
        self.lineage.touched[key] = marker

    def _trusted_marker(self, key: Any) -> Marker | None:
        lineage = self.lineage
        if key in lineage.trusted:
            return lineage.trusted[key]
        return lineage.base_markers.get(key)

    @staticmethod
    def _consistent(marker: Marker | None, entries: list[list[Any]], tseq: int | None,
                    tatt: str | None) -> bool:
        if marker is None:
            return tseq is None
        if tseq is not None and marker == (tseq, tatt):
            return True
        return any(e[0] == marker[0] and e[2] == marker[1] for e in entries)

    def call(self, key: Any, frames: Iterator[Any], group_state: Any) -> list[Any]:
        """Bring the key up to its committed log, run the function, log its changes."""
        self._settle_pending()
        self._group_state = group_state
        backend = self.backend
        backend.set_current_key(key)
        marker = self._marker()
        lineage = self.lineage
        if key not in lineage.touched and key not in lineage.base_markers:
            lineage.base_markers[key] = marker
        if group_state.exists:
            seq, tseq, tatt, blob = group_state.get
            entries: list[list[Any]] = unpackb(blob) if blob else []
        else:
            seq, tseq, tatt, entries = 0, None, None, []
            if marker is not None:  # the committed state of this key is empty
                self.recorder.clear_all()
                marker = None
                self._set_marker(key, None)
        if not self._consistent(marker, entries, tseq, tatt):
            self._restore_latest(self.batch)
            self.lineage.own_attempts.append((self.batch, self.token or ""))
            backend = self.backend
            backend.set_current_key(key)
            marker = self._marker()
            self.lineage.base_markers[key] = marker
            if not self._consistent(marker, entries, tseq, tatt):
                if marker is not None and (tseq is None or marker[0] > tseq):
                    raise CorruptCheckpointError(
                        f"key {key!r}: the restored snapshot holds change {marker}, which is not "
                        f"on the change log Spark committed for the key (truncated through "
                        f"{tseq}): the snapshot holds changes of a discarded attempt")
                if not self.spec.allow_missing_state:
                    raise self._missing(key, tseq, marker)
                if not self.started_empty:  # once per partition and process, not per key
                    log.warning("partition %d: keys whose snapshot is missing start from empty "
                                "state (allow-missing-state is set), first %r", self.partition, key)
                self.started_empty += 1
                self.recorder.clear_all()
                marker, entries, tseq, tatt = None, [], None, None
                self._set_marker(key, None)
        for entry in entries:
            if marker is None or entry[0] > marker[0]:
                self.recorder.replay(entry[3])
                marker = (entry[0], entry[2])
                self._set_marker(key, marker)
        self.recorder.start()
        outputs = self._run(key, frames, bool(getattr(group_state, "hasTimedOut", False)))
        removable = self.recorder.all_empty(self._processing_time())
        if not removable:
            self._schedule_timeout(group_state)
        ops = self.recorder.stop()
        if ops:
            seq += 1
            entries.append([seq, self.batch, self.token, ops])
            marker = (seq, self.token or "")
            self._set_marker(key, marker)
        truncated = False
        trusted = self._trusted_marker(key)
        if trusted is not None:
            while entries and entries[0][0] <= trusted[0]:
                dropped = entries.pop(0)
                tseq, tatt = dropped[0], dropped[2]
                truncated = True
        if removable:  # nothing live is left: forget the key (GroupState absent = empty state)
            if group_state.exists:
                group_state.remove()
            self.recorder.clear_all()
            self._set_marker(key, None)
        elif ops or truncated:
            group_state.update((seq, tseq, tatt, packb(entries)))
        self.calls += 1
        if self.calls % self.mid_task_calls == 0 and self._mid_task_due():
            self._materialize(self.batch, mid_task=True)  # e.g. a process that never sees a next task
        return outputs

    def _missing(self, key: Any, tseq: int | None, marker: Marker | None) -> MissingStateError:
        return MissingStateError(
            f"statekit state of key {key!r} (operator {self.spec.operator_id!r}, partition "
            f"{self.partition}) is missing: the change log Spark keeps for it was truncated "
            f"through entry {tseq}, so a snapshot holding that entry must exist, but the newest "
            f"valid snapshot under {self.access.location} holds {marker}. State kept in the "
            f"driver's memory (JobManager storage) ends with the driver; a deleted or changed "
            f"checkpoint directory loses it too. Fix: point spark.statekit.state.checkpoints.dir "
            f"at the directory that held it, or set "
            f"spark.statekit.execution.state-recovery.allow-missing-state=true to start such keys "
            f"from empty state on purpose")

    def _schedule_timeout(self, group_state: Any) -> None:
        """Ask Spark to call back for the key's earliest timer (or its TTL expiry)."""
        if self.timeout_conf == "EventTimeTimeout":
            event = [ts for ts, d in self.timers.registered() if d == TimerService.EVENT_TIME]
            if event:
                group_state.setTimeoutTimestamp(max(event[0], self._watermark() + 1))
        elif self.timeout_conf == "ProcessingTimeTimeout":
            now = self._processing_time()
            due = [ts for ts, d in self.timers.registered() if d == TimerService.PROCESSING_TIME]
            ttl = self.recorder.ttl_millis()
            if ttl is not None:
                due.append(now + ttl)  # come back to drop the key's state once it expires
            if due:
                group_state.setTimeoutDuration(max(1, min(due) - now))

    def _run(self, key: Any, frames: Iterator[Any], timed_out: bool) -> list[Any]:
        import pandas as pd

        function = self.function
        if self.spec.vectorized and not timed_out:
            bulk = BulkState(self.backend)
            outputs = [out[self.spec.output_columns] for out in
                       (function.process_batch(frame, bulk) for frame in frames)
                       if out is not None and len(out)]
            self.backend.set_current_key(key)
            return outputs
        if timed_out:
            produced = (function.on_timer(ts, KeyedProcessFunction.OnTimerContext(
                self.backend, self.timers, domain))
                for ts, domain in self.timers.pop_due(self._processing_time(), self._watermark()))
        else:
            ctx = KeyedProcessFunction.Context(self.backend, self.timers)
            produced = (function.process_element(row, ctx) for frame in frames
                        for row in frame.itertuples(index=False, name=None))
        rows = [row for out in produced if out is not None for row in out]
        return [pd.DataFrame(rows, columns=self.spec.output_columns)] if rows else []


class SnapshotId:
    """Snapshot ids of a partition: ordered by the batch they reach, then by the calls a task
    had made when it took them, with a random part keeping processes apart."""

    BATCH = 1_000_000

    @classmethod
    def encode(cls, covered_batch: int, calls: int) -> int:
        return (covered_batch + 1) * cls.BATCH + min(calls, 999) * 1000 + random.randrange(1000)

    @classmethod
    def batch_after(cls, snapshot_id: int) -> int:
        """The first batch a snapshot does not cover."""
        return snapshot_id // cls.BATCH


_RUNTIMES: dict[tuple[str, str, int], PartitionRuntime] = {}
_RUNTIMES_LOCK = threading.Lock()


def _runtime(spec: AdapterSpec, info: TaskInfo, materialize_every: int,
             timeout_conf: str, mid_task_calls: int) -> PartitionRuntime:
    slot = (info.query_id, spec.operator_id, info.partition)
    with _RUNTIMES_LOCK:
        runtime = _RUNTIMES.get(slot)
        if runtime is None:
            runtime = _RUNTIMES[slot] = PartitionRuntime(spec, info.query_id, info.partition,
                                                         materialize_every, timeout_conf,
                                                         mid_task_calls)
    runtime.begin_task(info)
    return runtime


@functools.cache
def _quiet_padding_warning() -> None:
    """PySpark's applyInPandasWithState worker pads its output with all-NA rows and concatenates
    them (pandas 2.x warns about that, every batch); statekit's calls trigger exactly that
    warning in this worker process, so exactly that warning is ignored here (once per process)."""
    warnings.filterwarnings(
        "ignore", message="The behavior of DataFrame concatenation with empty or all-NA entries",
        category=FutureWarning, module="pyspark.worker")


def apply_in_pandas_with_state(grouped_df: Any, function: Any, output_schema: Any, *,
                               output_mode: str = "update", timeout_conf: str = "NoTimeout",
                               operator_id: str | None = None,
                               conf: Mapping[str, Any] | None = None) -> Any:
    """Run ``function`` per key over ``applyInPandasWithState``; a streaming DataFrame.

    The function is the same :class:`~statekit.KeyedProcessFunction` (or vectorized function)
    the other adapters run; its state lives in the backend chosen by ``spark.statekit.*`` conf.
    """
    spark = grouped_df._df.sparkSession
    spec, schema = _spec(spark, function, [], output_schema, operator_id, conf)
    every = cfg.get(spec.conf, MATERIALIZE_KEY, cfg.parse_int, DEFAULT_MATERIALIZE_EVERY)
    mid_task = cfg.get(spec.conf, MID_TASK_KEY, cfg.parse_int, DEFAULT_MID_TASK_CALLS)
    timeout = str(getattr(timeout_conf, "value", timeout_conf))
    if timeout not in ("NoTimeout", "ProcessingTimeTimeout", "EventTimeTimeout"):
        raise ConfigError("timeout_conf", f"unknown GroupStateTimeout {timeout_conf!r}")

    def call(key: tuple[Any, ...], frames: Iterator[Any], group_state: Any) -> Iterator[Any]:
        _quiet_padding_warning()
        runtime = _runtime(spec, TaskInfo.current(), every, timeout, mid_task)
        k = key[0] if len(key) == 1 else tuple(key)
        yield from runtime.call(k, frames, group_state)

    return grouped_df.applyInPandasWithState(call, schema, STATE_SCHEMA, output_mode, timeout)
