"""The checkpoint coordinator: triggers checkpoints per ``CheckpointConfig`` and completes them.

It runs the synchronous snapshot part of every task on the caller's (processing) thread and the
asynchronous part on a pool of transfer threads, then writes ``_metadata`` last.  It enforces
interval, min pause, max concurrent checkpoints, timeout (aborting and deleting partial files),
tolerable failures, retention with subsumption, and records metrics per checkpoint.

Backends hear ``notify_checkpoint_complete`` / ``notify_checkpoint_aborted`` so incremental ones
only build on durable checkpoints.  A retained checkpoint is never discarded while an in-flight
checkpoint may still reference its files (its base floor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from statekit.backends.base import KeyedStateBackend, SnapshotRun
from statekit.backends.operator import OperatorStateBackend
from statekit.checkpoint.config import CheckpointConfig
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.localstate import TaskLocalStateStore
from statekit.checkpoint.schema import OPERATOR_STATE
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointError, CheckpointTimeoutError, StatekitError

log = logging.getLogger("statekit.checkpoint")


@dataclass
class CheckpointStats:
    """Metrics of one checkpoint attempt."""

    checkpoint_id: int
    status: str = "in_progress"  # completed | failed | aborted
    sync_seconds: float = 0.0
    async_seconds: float = 0.0
    bytes_written: int = 0
    files_written: int = 0
    incremental: bool = False
    path: str | None = None
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The metrics as a plain dict (for logs, JSON or a metrics system)."""
        return dict(self.__dict__)


@dataclass
class _PendingCheckpoint:
    checkpoint_id: int
    started: float
    payload: dict[str, Any]
    streams: dict[str, CheckpointStreams]
    runs: dict[str, SnapshotRun]
    futures: dict[str, Future[dict[str, Any]]] = field(default_factory=dict)
    stats: CheckpointStats | None = None
    tasks: dict[str, KeyedStateBackend] = field(default_factory=dict)
    #: the tasks' operator state writes, in task order (None: a task without operator state)
    operator: list[Future[dict[str, Any]] | None] = field(default_factory=list)
    base_floor: float = float("inf")  # oldest retained checkpoint this attempt may build on


class CheckpointCoordinator:
    """Triggers and completes the checkpoints of one job (one operator's tasks)."""

    def __init__(self, config: CheckpointConfig, access: CheckpointStorageAccess,
                 transfer_threads: int = 1, first_checkpoint_id: int = 1,
                 clock: Callable[[], float] = time.monotonic,
                 on_complete: Callable[[int], None] | None = None,
                 local: dict[str, TaskLocalStateStore] | None = None) -> None:
        self.config = config
        #: the tasks' local copies (local recovery), by task name
        self.local = local if local is not None else {}
        self.access = access
        self.clock = clock
        self.next_id = first_checkpoint_id
        self.pending: dict[int, _PendingCheckpoint] = {}
        # complete checkpoints of this job written by earlier attempts are retained (and trimmed)
        try:
            earlier = [c for c in access.completed() if c < first_checkpoint_id]
        except (StatekitError, OSError) as exc:
            log.warning("could not list earlier checkpoints (%s); starting with none retained", exc)
            earlier = []
        self.retained: list[int] = earlier
        self.savepoints: list[tuple[int, str]] = []
        self._zombies: list[_PendingCheckpoint] = []  # aborted attempts whose threads may still write
        self.stats: list[CheckpointStats] = []
        self.consecutive_failures = 0
        self._last_end = -float("inf")
        self._last_trigger = -float("inf")
        self._pool = ThreadPoolExecutor(max(1, transfer_threads), thread_name_prefix="statekit-snapshot")
        # deletes subsumed checkpoints off the processing thread, one at a time, in order (as
        # Flink's CheckpointsCleaner does); shutdown waits for it
        self._cleaner = ThreadPoolExecutor(1, thread_name_prefix="statekit-cleaner")
        self._on_complete = on_complete

    # --- triggering --------------------------------------------------------------------------------

    def due(self) -> bool:
        """Whether a periodic checkpoint may be triggered now."""
        if not self.config.is_checkpointing_enabled():
            return False
        now = self.clock()
        if len(self.pending) >= self.config.get_max_concurrent_checkpoints():
            return False
        if (now - self._last_trigger) * 1000 < self.config.get_checkpoint_interval():
            return False
        return (now - self._last_end) * 1000 >= self.config.get_min_pause_between_checkpoints()

    def trigger(self, tasks: dict[str, KeyedStateBackend], payload: dict[str, Any],
                operator_state: list[bytes | None] | None = None) -> int:
        """Snapshot every task now (synchronous parts here, asynchronous parts on the pool);
        ``operator_state``: the tasks' operator state snapshots, in task order, written with
        their keyed state."""
        cid = self.next_id
        self.next_id += 1
        self._last_trigger = self.clock()
        stats = CheckpointStats(cid)
        self.stats.append(stats)
        pending = _PendingCheckpoint(cid, self.clock(), payload, {}, {}, stats=stats, tasks=dict(tasks))
        latest = self.latest_completed()
        pending.base_floor = float("inf") if latest is None else latest
        self.pending[cid] = pending
        try:
            for name, backend in tasks.items():
                streams = self.access.streams(cid, name)
                if name in self.local:
                    streams = self.local[name].streams(cid, streams)
                pending.streams[name] = streams
                run = backend.snapshot(cid, streams)
                pending.runs[name] = run
                stats.sync_seconds += run.sync_seconds
            for name, run in pending.runs.items():
                pending.futures[name] = self._pool.submit(self._timed, run, stats)
            for name, data in zip(pending.streams, operator_state or [None] * len(tasks),
                                  strict=True):
                pending.operator.append(None if data is None else self._pool.submit(
                    OperatorStateBackend.write, data, pending.streams[name]))
        except Exception as exc:
            self._fail(pending, exc)
        return cid

    @staticmethod
    def _timed(run: SnapshotRun, stats: CheckpointStats) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return run.run()
        finally:
            stats.async_seconds += time.perf_counter() - start

    # --- completion --------------------------------------------------------------------------------

    def poll(self, wait: bool = False) -> list[int]:
        """Complete finished checkpoints (all of them when ``wait``); returns completed ids."""
        self._sweep_zombies()
        done = []
        for cid in sorted(self.pending):
            pending = self.pending.get(cid)
            if pending is None:
                continue
            timeout = self.config.get_checkpoint_timeout() / 1000
            if wait:
                remaining = max(0.0, timeout - (self.clock() - pending.started))
                for future in _all_futures(pending):
                    try:
                        future.result(timeout=remaining)
                    except Exception:  # inspected below
                        break
            if self.clock() - pending.started > timeout and not all(
                f.done() for f in _all_futures(pending)
            ):
                self._fail(pending, CheckpointTimeoutError(
                    f"checkpoint {cid} exceeded the timeout of "
                    f"{self.config.get_checkpoint_timeout()} ms and was aborted"))
                continue
            if not all(f.done() for f in _all_futures(pending)):
                continue
            errors = [f.exception() for f in _all_futures(pending) if f.exception()]
            if errors:
                self._fail(pending, errors[0])  # type: ignore[arg-type]
                continue
            try:
                self._complete(pending)
            except CheckpointError as exc:
                if cid in self.pending:  # committing _metadata failed: a failed checkpoint
                    self._fail(pending, exc)
                    continue
                raise
            done.append(cid)
        if wait:  # and the subsumed checkpoints are deleted
            self._cleaner.submit(int).result()
        return done

    def _complete(self, pending: _PendingCheckpoint) -> None:
        cid = pending.checkpoint_id
        handles = {name: f.result() for name, f in pending.futures.items()}
        body = {**pending.payload, "tasks": handles, "timestamp": int(time.time() * 1000)}
        if any(f is not None for f in pending.operator):
            body[OPERATOR_STATE] = [None if f is None else f.result() for f in pending.operator]
        stats = pending.stats
        assert stats is not None
        stats.path = self.access.commit(cid, body)
        stats.status = "completed"
        stats.bytes_written = sum(s.bytes_written for s in pending.streams.values())
        stats.files_written = sum(s.files_written for s in pending.streams.values())
        stats.incremental = any(h.get("incremental") for h in handles.values())
        del self.pending[cid]
        self.consecutive_failures = 0
        self._last_end = self.clock()
        for backend in pending.tasks.values():
            backend.notify_checkpoint_complete(cid)
        for name, handle in handles.items():
            if name in self.local:
                self.local[name].complete(cid, handle)
        # subsumption: older pending checkpoints can never be needed now
        for older in [c for c in self.pending if c < cid]:
            self._abort(self.pending[older], f"subsumed by checkpoint {cid}")
        self.retained.append(cid)
        self._trim_retained()
        log.info("checkpoint %d completed: sync %.1f ms, async %.1f ms, %d bytes, %d files, %s",
                 cid, stats.sync_seconds * 1000, stats.async_seconds * 1000, stats.bytes_written,
                 stats.files_written, "incremental" if stats.incremental else "full")
        if self._on_complete is not None:
            self._on_complete(cid)

    def _trim_retained(self) -> None:
        """Discard the oldest checkpoints beyond the retained number, except those an in-flight
        checkpoint may build on (their shared files must survive until it completes)."""
        floor = min((p.base_floor for p in self.pending.values()), default=float("inf"))
        while (len(self.retained) > self.config.get_num_retained_checkpoints()
               and self.retained[0] < floor):
            self._cleaner.submit(self._discard, self.retained.pop(0), list(self.retained))

    def _discard(self, checkpoint_id: int, retained: list[int]) -> None:
        try:
            self.access.discard(checkpoint_id, retained)
        except Exception:  # what is left is only files: log it, as Flink's cleaner does
            log.warning("could not delete subsumed checkpoint %d", checkpoint_id, exc_info=True)

    def _sweep_zombies(self) -> None:
        """Delete what aborted attempts wrote after their abort, once their threads have ended."""
        still = []
        for pending in self._zombies:
            if all(f.done() for f in _all_futures(pending)):
                written = [p for s in pending.streams.values() for p in s.written]
                self.access.abort(pending.checkpoint_id, written, self.retained)
            else:
                still.append(pending)
        self._zombies = still

    def _abort(self, pending: _PendingCheckpoint, reason: str) -> None:
        for streams in pending.streams.values():
            streams.cancelled = True
        for future in _all_futures(pending):
            future.cancel()
        for run in pending.runs.values():
            run.cancel()
        del self.pending[pending.checkpoint_id]
        for backend in pending.tasks.values():
            backend.notify_checkpoint_aborted(pending.checkpoint_id)
        for name in pending.streams:
            if name in self.local:
                self.local[name].abort(pending.checkpoint_id)
        written = [p for s in pending.streams.values() for p in s.written]
        self.access.abort(pending.checkpoint_id, written, self.retained)
        if not all(f.done() for f in _all_futures(pending)):
            self._zombies.append(pending)
        if pending.stats is not None:
            pending.stats.status = "aborted"
            pending.stats.failure = reason
        log.info("checkpoint %d aborted: %s", pending.checkpoint_id, reason)
        self._last_end = self.clock()
        self._trim_retained()

    def _fail(self, pending: _PendingCheckpoint, exc: BaseException) -> None:
        self._abort(pending, str(exc))
        assert pending.stats is not None
        pending.stats.status = "failed"
        self.consecutive_failures += 1
        log.warning("checkpoint %d failed: %s", pending.checkpoint_id, exc)
        if self.consecutive_failures > self.config.get_tolerable_checkpoint_failure_number():
            raise CheckpointError(
                f"checkpoint {pending.checkpoint_id} failed ({exc}); "
                f"{self.consecutive_failures} consecutive failures exceed the tolerable "
                f"{self.config.get_tolerable_checkpoint_failure_number()}"
            ) from exc

    # --- lifecycle ---------------------------------------------------------------------------------

    def latest_completed(self) -> int | None:
        return self.retained[-1] if self.retained else None

    def stats_of(self, checkpoint_id: int) -> CheckpointStats | None:
        """The metrics of one checkpoint attempt, if this coordinator triggered it."""
        return next((s for s in self.stats if s.checkpoint_id == checkpoint_id), None)

    def record_savepoint(self, checkpoint_id: int, path: str) -> None:
        """Remember a savepoint taken at ``checkpoint_id`` as a recovery candidate."""
        self.savepoints.append((checkpoint_id, path))

    def recovery_point(self) -> tuple[str, int | str] | None:
        """What to recover from: ``("checkpoint", id)`` or ``("savepoint", path)``, or None.

        The newest of retained checkpoints and recorded savepoints, except that with
        ``prefer_checkpoint_for_recovery`` a retained checkpoint always wins over a newer savepoint.
        """
        latest = self.latest_completed()
        newest_sp = max(self.savepoints, default=None)
        if latest is not None and (
            newest_sp is None or self.config.is_prefer_checkpoint_for_recovery()
            or latest >= newest_sp[0]
        ):
            return ("checkpoint", latest)
        if newest_sp is not None:
            return ("savepoint", newest_sp[1])
        return None

    def discard_retained(self) -> None:
        """Delete every retained checkpoint (cancellation without externalized retention)."""
        for cid in list(self.retained):
            self.access.discard(cid, [])
        self.retained.clear()

    def abort_all(self, reason: str) -> None:
        for pending in list(self.pending.values()):
            self._abort(pending, reason)

    def shutdown(self, wait_for_cleaner: bool = True) -> ThreadPoolExecutor:
        """Abort what is in flight, wait for the transfer threads, and sweep their leftovers.

        Without ``wait_for_cleaner`` the deletion of subsumed checkpoints already queued goes on
        in the background (a restart need not wait for it; the retained ones are never among
        them); the caller then shuts the returned cleaner down before it ends.
        """
        pending = list(self.pending.values())
        self.abort_all("job ended")
        self._pool.shutdown(wait=True)
        self._cleaner.shutdown(wait=wait_for_cleaner)
        for p in pending:  # a thread may have written after the abort: delete again
            written = [path for s in p.streams.values() for path in s.written]
            self.access.abort(p.checkpoint_id, written, self.retained)
        self._sweep_zombies()
        return self._cleaner


def _all_futures(pending: _PendingCheckpoint) -> list[Future[dict[str, Any]]]:
    """Every write of a checkpoint attempt: keyed state and operator state."""
    return [*pending.futures.values(), *(f for f in pending.operator if f is not None)]
