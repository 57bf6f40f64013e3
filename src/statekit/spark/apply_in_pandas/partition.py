"""One key's call of the ``applyInPandasWithState`` adapter: bring the key up to its committed
change log, run the user's function, log its changes, truncate what a trusted snapshot holds.

Every call appends the key's changes (recorded state operations) to a compact log carried in its
``GroupState``, each entry tagged with (sequence number, batch, task attempt); the backend stores,
per key, the last entry it applied (the *applied marker*), and a call first applies the entries
newer than it.  A marker that is not on the committed log (a change of an attempt Spark
discarded) means the local copy is not the committed lineage: the partition is restored from the
newest valid snapshot (:mod:`~statekit.spark.apply_in_pandas.lineage`) and the log applied on top.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from statekit.backends.base import KeyedStateBackend
from statekit.backends.bulk import BulkState
from statekit.errors import CorruptCheckpointError, MissingStateError
from statekit.runtime.functions import KeyedProcessFunction, TimerService, open_function
from statekit.spark.apply_in_pandas.carried import EMPTY, LogCache
from statekit.spark.apply_in_pandas.lineage import (
    DEFAULT_MID_TASK_CALLS,
    Marker,
    PartitionLineage,
    log,
)
from statekit.spark.changelog import ChangeRecorder
from statekit.spark.frames import key_rows, rows_frame
from statekit.spark.task import AdapterSpec
from statekit.state.descriptors import internal_value_descriptor

APPLIED = internal_value_descriptor("__statekit_applied")


class PartitionRuntime(PartitionLineage):
    """One partition's statekit state in this worker process, kept across batches and tasks."""

    def __init__(self, spec: AdapterSpec, query_id: str, partition: int,
                 materialize_every: int, timeout_conf: str = "NoTimeout",
                 mid_task_calls: int = DEFAULT_MID_TASK_CALLS) -> None:
        super().__init__(spec, query_id, partition, materialize_every, mid_task_calls)
        self.timeout_conf = timeout_conf
        self._group_state: Any = None
        self.function: Any = None
        self.carried = LogCache()  # the logs this process last wrote, decoded
        self.started_empty = 0  # keys started from empty state because their snapshot was gone

    def _open(self, backend: KeyedStateBackend) -> None:
        """Record the restored backend's changes afresh and open a fresh copy of the function."""
        self.recorder = ChangeRecorder()
        backend.state_interceptor = self.recorder.intercept
        self.applied: Any = backend.get_partitioned_state(APPLIED)  # looked up once, not per call
        self.timers = TimerService(backend, self._processing_time, self._watermark)
        spec = self.spec
        self.function = open_function(spec.function, backend, spec.operator_id, self.partition,
                                      spec.max_parallelism,
                                      job_parameters={**spec.conf, "partition": self.partition})

    # --- the key's applied marker --------------------------------------------------------------

    def _processing_time(self) -> int:
        return int(self._group_state.getCurrentProcessingTimeMs())

    def _watermark(self) -> int:
        try:
            return int(self._group_state.getCurrentWatermarkMs())
        except Exception:  # Spark refuses the watermark when the query defines none
            return -(2**63)

    def _marker(self) -> Marker | None:
        value = self.applied.value()
        return None if value is None else (int(value[0]), str(value[1]))

    def _set_marker(self, key: Any, marker: Marker | None) -> None:
        self.applied.update(marker)
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

    # --- one call ----------------------------------------------------------------------------------

    def call(self, key: Any, frames: Iterator[Any], group_state: Any) -> list[Any]:
        """Bring the key up to its committed log, run the function, log its changes."""
        self._settle_pending()
        self._group_state = group_state
        self.backend.set_current_key(key)
        marker = self._marker()
        lineage = self.lineage
        if key not in lineage.touched and key not in lineage.base_markers:
            lineage.base_markers[key] = marker
        if group_state.exists:
            seq, tseq, tatt, blob = group_state.get
            carried = self.carried.get(key, blob)
        else:
            seq, tseq, tatt, carried = 0, None, None, EMPTY
            if marker is not None:  # the committed state of this key is empty
                self.recorder.clear_all()
                marker = None
                self._set_marker(key, None)
                lineage.trusted[key] = None  # a new log: no snapshot holds any of it yet
        entries = carried.entries
        if not self._consistent(marker, entries, tseq, tatt):
            marker, entries, tseq, tatt = self._recover(key, entries, tseq, tatt)
            if not entries:
                carried = EMPTY
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
        new_entry = None
        if ops:
            seq += 1
            new_entry = [seq, self.batch, self.token, ops]
            marker = (seq, self.token or "")
            self._set_marker(key, marker)
        drop, truncated = 0, False
        trusted = self._trusted_marker(key)
        if trusted is not None:
            while drop < len(entries) and entries[drop][0] <= trusted[0]:
                tseq, tatt = entries[drop][0], entries[drop][2]
                drop, truncated = drop + 1, True
            if new_entry is not None and drop == len(entries) and seq <= trusted[0]:
                tseq, tatt, new_entry, truncated = seq, self.token, None, True
        if removable:  # nothing live is left: forget the key (GroupState absent = empty state)
            if group_state.exists:
                group_state.remove()
            self.carried.forget(key)
            self.recorder.clear_all()
            self._set_marker(key, None)
            self.lineage.trusted[key] = None  # its next log starts afresh: nothing to cut it by
            carried = None
        elif ops or truncated:
            carried = carried.rewrite(drop, new_entry)
            group_state.update((seq, tseq, tatt, carried.blob))
            new_bytes = carried.last_size if new_entry is not None else 0
            self.logged_new_bytes += new_bytes
            self.logged_old_bytes += len(carried.blob) - new_bytes
            self.carried.put(key, carried)
        self._after_call(carried)
        return outputs

    def _recover(self, key: Any, entries: list[list[Any]], tseq: int | None, tatt: str | None
                 ) -> tuple[Marker | None, list[list[Any]], int | None, str | None]:
        """The local copy is not the committed lineage: restore, and return the key's restored
        marker with its log (emptied when the snapshot is missing and that is allowed)."""
        self._restore_latest(self.batch)
        self.lineage.own_attempts.append((self.batch, self.token or ""))
        self.backend.set_current_key(key)
        marker = self._marker()
        self.lineage.base_markers[key] = marker
        if self._consistent(marker, entries, tseq, tatt):
            return marker, entries, tseq, tatt
        if tseq is None and entries and entries[0][0] == 1:
            # a log never cut since the key was empty holds its whole life: the snapshot holds an
            # earlier life (the key was removed and made again after it)
            self.recorder.clear_all()
            self._set_marker(key, None)
            return None, entries, tseq, tatt
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
        self._set_marker(key, None)
        return None, [], None, None

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
        """Call the user's function on the key's rows (or its due timers); its output frames."""
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
            produced = (function.process_element(row, ctx) for row in key_rows(frames))
        rows = [row for out in produced if out is not None for row in out]
        return [rows_frame(rows, self.spec.output_columns)] if rows else []
