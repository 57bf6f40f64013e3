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
from statekit.errors import CorruptCheckpointError, MissingStateError
from statekit.runtime.operator import KeyedOperator
from statekit.runtime.partition import close_quietly
from statekit.runtime.timers import TimeDomain
from statekit.spark.apply_in_pandas.carried import EMPTY, LogCache
from statekit.spark.apply_in_pandas.lineage import (
    DEFAULT_MID_TASK_CALLS,
    Marker,
    PartitionLineage,
    log,
)
from statekit.spark.changelog import ChangeRecorder
from statekit.spark.clock import epoch_ms
from statekit.spark.frames import key_rows, rows_frame
from statekit.spark.task import AdapterSpec
from statekit.state.descriptors import internal_value_descriptor

APPLIED = internal_value_descriptor("__statekit_applied")


class PartitionRuntime(PartitionLineage):
    """One partition's statekit state in this worker process, kept across batches and tasks."""

    def __init__(self, spec: AdapterSpec, query_id: str, partition: int,
                 materialize_every: int, timeout_conf: str = "NoTimeout",
                 mid_task_calls: int = DEFAULT_MID_TASK_CALLS,
                 query_has_watermark: bool = True) -> None:
        super().__init__(spec, query_id, partition, materialize_every, mid_task_calls)
        self.timeout_conf = timeout_conf
        self.query_has_watermark = query_has_watermark
        self._group_state: Any = None
        self.operator: KeyedOperator | None = None
        self.recorder = ChangeRecorder()
        self.carried = LogCache()  # the logs this process last wrote, decoded
        self.started_empty = 0  # keys started from empty state because their snapshot was gone

    def _open(self, backend: KeyedStateBackend) -> None:
        """Record the restored backend's changes afresh and open a fresh copy of the function
        (the one of the replaced state is closed)."""
        self.recorder = ChangeRecorder()
        backend.state_interceptor = self.recorder.intercept
        backend.timer_interceptor = self.recorder.intercept_timers
        self.recorder.create_queue = backend.timer_queue
        self.applied: Any = backend.get_partitioned_state(APPLIED)  # looked up once, not per call
        spec = self.spec
        previous, self.operator = self.operator, None
        if previous is not None:
            close_quietly(previous)
        self.operator = KeyedOperator(
            spec.function, backend, task_name=spec.operator_id, index=self.partition,
            max_parallelism=spec.max_parallelism,
            job_parameters={**spec.conf, "partition": self.partition},
            clock=self._processing_time, refusal=self._refusal)

    @property
    def function(self) -> Any:
        return None if self.operator is None else self.operator.function

    def _refusal(self, domain: TimeDomain) -> str | None:
        """Which timers this query's ``timeout_conf`` cannot deliver: Spark calls a key without
        input back only through its timeout."""
        conf = self.timeout_conf
        if conf == "NoTimeout":
            return ("apply_in_pandas_with_state(timeout_conf='NoTimeout') never calls a key "
                    "back without input, so its timers could not fire: use "
                    "timeout_conf='ProcessingTimeTimeout' (timers of both domains) or "
                    "'EventTimeTimeout' (event-time timers)")
        if domain is TimeDomain.PROCESSING_TIME and conf == "EventTimeTimeout":
            return ("timeout_conf='EventTimeTimeout' calls a key back only when the watermark "
                    "passes its timeout, so processing-time timers could not fire on time: use "
                    "timeout_conf='ProcessingTimeTimeout' (timers of both domains)")
        if domain is TimeDomain.EVENT_TIME and not self.query_has_watermark:
            return ("the query defines no watermark, so event-time timers would never fire: add "
                    "withWatermark(...) before groupBy")
        return None

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
                self.recorder.clear_all(key)
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
                self.recorder.replay(entry[3], key)
                marker = (entry[0], entry[2])
                self._set_marker(key, marker)
        self.recorder.start()
        outputs = self._run(key, frames, bool(getattr(group_state, "hasTimedOut", False)))
        removable = self.recorder.all_empty(self._processing_time(), key)
        if not removable:
            self._schedule_timeout(key, group_state)
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
            self.recorder.clear_all(key)
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
            self.recorder.clear_all(key)
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
        self.recorder.clear_all(key)
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

    def _schedule_timeout(self, key: Any, group_state: Any) -> None:
        """Ask Spark to call the key back for its earliest timer (or its TTL expiry).

        Spark times a key out in the first batch whose time is *past* its timeout, so the
        timeout is one millisecond before the timer (a timer due one millisecond after the batch
        fires a millisecond late: Spark takes no duration below 1).  Under
        ``ProcessingTimeTimeout`` a key with a pending event-time timer is called back every
        batch, to look at the watermark.
        """
        op = self.operator
        assert op is not None
        event = op.timers.queue(TimeDomain.EVENT_TIME).timers_of(key)
        if self.timeout_conf == "EventTimeTimeout":
            if event:
                group_state.setTimeoutTimestamp(max(event[0] - 1, self._watermark(), 1))
            return
        if self.timeout_conf != "ProcessingTimeTimeout":
            return
        now = self._processing_time()
        due = [t - 1 - now for t in op.timers.queue(TimeDomain.PROCESSING_TIME).timers_of(key)[:1]]
        if event:
            due.append(1)  # the watermark is only known in the next batch
        ttl = self.recorder.ttl_millis()
        if ttl is not None:
            due.append(ttl)  # come back to drop the key's state once it expires
        if due:
            group_state.setTimeoutDuration(max(1, min(due)))

    def _due_timers(self, key: Any) -> list[tuple[Any, int, TimeDomain]]:
        """The key's timers due at the batch's time, earliest first (removed: recorded)."""
        op = self.operator
        assert op is not None
        limits = ((TimeDomain.EVENT_TIME, self._watermark()),
                  (TimeDomain.PROCESSING_TIME, self._processing_time()))
        due = sorted((ts, domain.value, domain) for domain, limit in limits
                     for ts in op.timers.queue(domain).timers_of(key) if ts <= limit)
        for ts, _, domain in due:
            op.timers.queue(domain).remove(key, ts)
        return [(key, ts, domain) for ts, _, domain in due]

    def _run(self, key: Any, frames: Iterator[Any], timed_out: bool) -> list[Any]:
        """Fire the key's due timers, then call the user's function on its rows; the output
        frames.  Timers a timer or an element registers that are due already fire too."""
        op = self.operator
        assert op is not None
        op.timers.watermark = max(op.timers.watermark, self._watermark())
        produced: list[Any] = []
        self._fire_key(key, produced)
        if not timed_out:
            if self.spec.vectorized:
                produced.extend(out for out in (op.process_frame(frame, key) for frame in frames)
                                if out is not None and len(out))
            else:
                produced.extend(op.process_key_rows(key, key_rows(frames),
                                                    self._timestamp_of()))
            self._fire_key(key, produced)
        self.backend.set_current_key(key)
        if self.spec.vectorized:
            return [out[self.spec.output_columns] for out in produced]
        return [rows_frame(produced, self.spec.output_columns)] if produced else []

    def _timestamp_of(self) -> Any:
        index, tz = self.spec.timestamp_index, self.spec.time_zone
        return None if index is None else (lambda row: epoch_ms(row[index], tz))

    def _fire_key(self, key: Any, produced: list[Any]) -> None:
        op = self.operator
        assert op is not None
        while due := self._due_timers(key):
            op.fire(due, produced)
