"""The local runner's job: keyed stateful pipelines without Spark, with Flink's checkpoint and
restart semantics.

A :class:`LocalJob` runs ``parallelism`` partitions in this process, routed by key group.  The
source position and every partition's state go into each checkpoint; outputs are released only
when the checkpoint covering them completes, so after a failure the job restores the latest
checkpoint, replays the source from its position, and neither state nor collected output sees an
element twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekit import config as cfg
from statekit.backends.base import KeyedStateBackend
from statekit.backends.operator import OperatorStateBackend, shares
from statekit.checkpoint.config import ExternalizedCheckpointCleanup
from statekit.checkpoint.layout import RECOVER_FROM_OLDER_KEY, CheckpointStorageAccess
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.savepoint import Savepoint, open_external
from statekit.checkpoint.schema import OPERATOR_STATE, recorded_key_groups
from statekit.errors import CheckpointError, ConfigError, JobExecutionError, StatekitError
from statekit.runtime.batch import MODE_KEY, check_batch_job, is_batch, process_bounded
from statekit.runtime.broadcast import Route, Router
from statekit.runtime.coordinator import CheckpointCoordinator, CheckpointStats
from statekit.runtime.localrecovery import JobLocalState, enabled, restore_preferring_local, root_dirs
from statekit.runtime.operator import KeyedOperator
from statekit.runtime.outputs import CollectResult, Outputs
from statekit.runtime.restart import RestartTracker
from statekit.runtime.timers import MAX_WATERMARK
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes, key_group_range_for_operator
from statekit.serde.keys import as_key_serializer
from statekit.serde.types import serializer_for
from statekit.state.limits import MAX_KEY_SIZE_KEY, MAX_VALUE_SIZE_KEY

if TYPE_CHECKING:
    from statekit.runtime.datastream import ProcessedStream

log = logging.getLogger("statekit.runtime")

OPERATOR = "keyed-process"


@dataclass
class _Task:
    index: int
    name: str
    key_group_range: KeyGroupRange
    backend: KeyedStateBackend
    op: KeyedOperator


@dataclass
class _RestorePoint:
    metadata: dict[str, Any]
    reader: StateReader
    path: str


class _UserFailure(Exception):
    """Wraps an exception raised by user code so the runner can tell it from its own."""


class LocalJob:
    """One execution of a keyed pipeline, with restarts per the environment's restart strategy."""

    def __init__(self, stream: ProcessedStream, name: str | None, limit: int | None,
                 savepoint_dir: str | None, sink: Callable[[Any], None] | None,
                 drain: bool = False) -> None:
        self.env = stream._env
        keyed = stream._keyed
        self.upstream = keyed._upstream
        self.source = keyed._upstream._source
        self.clock = self.env.get_processing_time_clock()
        # the end of input fires every event-time timer, except at a stop with a savepoint
        self.drain = savepoint_dir is None or drain
        self.time = self.upstream.source_time(self.clock)
        self.selector = keyed._selector
        self.key_serializer = as_key_serializer(serializer_for(keyed._key_type))
        self.func = stream._func
        self.name = name or "statekit job"
        self.limit = limit
        self.savepoint_dir = savepoint_dir
        self.job_id = uuid.uuid4().hex
        self.parallelism = self.env.get_parallelism()
        self.max_parallelism = self.env.effective_max_parallelism()
        if self.parallelism > self.max_parallelism:
            raise ConfigError("parallelism.default",
                              f"{self.parallelism} exceeds max parallelism {self.max_parallelism}")
        self.backend_factory = self.env.resolved_state_backend()
        self.checkpoint_config = self.env.get_checkpoint_config()
        self.storage = self.env.resolved_checkpoint_storage()
        if self.checkpoint_config.is_checkpointing_enabled():
            self.storage.check_writable()  # an unwritable directory fails here, not every checkpoint
        self.access: CheckpointStorageAccess = self.storage.create_access(self.job_id)
        self.outputs = Outputs(sink=sink, side_sinks=dict(stream._side_sinks))
        self.stats: list[CheckpointStats] = []
        self.batch = is_batch(self.env.get_runtime_mode())
        conf = self.env.get_configuration()
        #: the tasks' local copies of their snapshots (local recovery), gone when the job ends
        self.local = JobLocalState(root_dirs(conf), self.job_id) if enabled(conf) else None
        #: per restore, where each task's state came from: ``local``, ``mixed`` or ``remote``
        self.restore_sources: list[dict[str, str]] = []
        #: cleaners of failed attempts' coordinators, still deleting subsumed checkpoints
        self._cleaners: list[Any] = []
        if self.batch:
            check_batch_job(self, savepoint_dir)

    # --- the job --------------------------------------------------------------------------------

    def run(self) -> CollectResult:
        try:
            return self._run()
        finally:
            for cleaner in self._cleaners:
                cleaner.shutdown(wait=True)
            if self.local is not None:
                self.local.dispose()

    def _run(self) -> CollectResult:
        restore = self._initial_restore_point()
        tracker = RestartTracker(self.env.get_restart_strategy())
        next_checkpoint = 1 + int(restore.metadata.get("checkpoint_id", 0)) if restore else 1
        attempt = 0
        while True:
            coordinator = CheckpointCoordinator(
                self.checkpoint_config, self.access,
                transfer_threads=_transfer_threads(self.backend_factory),
                first_checkpoint_id=next_checkpoint, on_complete=self.outputs.commit_through,
                local=self.local.tasks if self.local is not None else None,
            )
            tasks: list[_Task] = []
            try:
                tasks = self._create_tasks(restore, attempt)
                position = self._process(tasks, coordinator, restore)
                savepoint = self._stop(tasks, coordinator, position)
                return self._result(coordinator, attempt, savepoint)
            except (_UserFailure, CheckpointError) as exc:
                cause = exc.__cause__ if isinstance(exc, _UserFailure) else exc
                # subsumed checkpoints still being deleted: in the background, done by the end
                self._cleaners.append(coordinator.shutdown(wait_for_cleaner=False))
                self.stats.extend(coordinator.stats)
                next_checkpoint = coordinator.next_id
                self.outputs.discard_uncommitted()
                delay = tracker.next_delay_ms()
                if delay is None:
                    raise JobExecutionError(
                        f"job {self.name!r} failed after {attempt} restart(s) "
                        f"({tracker.strategy.describe()}): {type(cause).__name__}: {cause}"
                    ) from cause
                log.warning("job %s failed (%s); restarting in %d ms", self.job_id, cause, delay)
                time.sleep(delay / 1000)
                found = self._latest(coordinator.retained)
                if found is not None:
                    latest, metadata = found
                    restore = _RestorePoint(metadata, self.access.reader(),
                                            self.access.checkpoint_path(latest))
                attempt += 1
            finally:
                for task in tasks:
                    _close_quietly(task)
                    task.backend.dispose()

    def _latest(self, retained: list[int]) -> tuple[int, dict[str, Any]] | None:
        """The checkpoint a restart restores: checked file by file first only when an older one may
        stand in for it (the restore checks each byte it reads, wherever and whenever)."""
        if not retained:
            return None
        if not self._recover_from_older():
            return retained[-1], self.access.load(retained[-1])
        return self.access.latest_valid(retained, self._recover_from_older())

    def _initial_restore_point(self) -> _RestorePoint | None:
        path = self.env.get_configuration().get("execution.savepoint.path")
        if not path:
            return None
        metadata, reader = open_external(
            str(path), getattr(self.storage, "storage_options", None),
            getattr(self.storage, "retry", None), fallback_to_older=self._recover_from_older())
        recorded = int(metadata.get("max_parallelism", self.max_parallelism))
        if recorded != self.max_parallelism:
            raise ConfigError(
                "pipeline.max-parallelism",
                f"the checkpoint at {path} was taken with max parallelism {recorded}; "
                f"restoring needs the same value, not {self.max_parallelism}",
            )
        return _RestorePoint(metadata, reader, str(path))

    def _size_limits(self) -> tuple[int | None, int | None]:
        """Configured ``state.backend.max-key-size`` / ``max-value-size`` (None: default)."""
        conf = self.env.get_configuration()
        return cfg.read(conf, MAX_KEY_SIZE_KEY), cfg.read(conf, MAX_VALUE_SIZE_KEY)

    def _recover_from_older(self) -> bool:
        """Whether a damaged newest checkpoint may be skipped for an older intact one."""
        return bool(cfg.read(self.env.get_configuration(), RECOVER_FROM_OLDER_KEY))

    def _create_tasks(self, restore: _RestorePoint | None, attempt: int) -> list[_Task]:
        tasks = []
        operator_states = shares(restore.metadata.get(OPERATOR_STATE) if restore else None,
                                 restore.reader if restore else None, self.parallelism)
        restored_id = None if restore is None else int(restore.metadata.get("checkpoint_id", 0))
        sources: dict[str, str] = {}
        for index in range(self.parallelism):
            rng = key_group_range_for_operator(self.max_parallelism, self.parallelism, index)
            name = f"{OPERATOR}-{index}"

            def create(rng: KeyGroupRange = rng) -> KeyedStateBackend:
                backend = self.backend_factory.create_keyed_state_backend(
                    key_serializer=self.key_serializer, key_group_range=rng,
                    max_parallelism=self.max_parallelism, operator_id=OPERATOR,
                )
                backend.set_size_limits(*self._size_limits())
                return backend

            local = None if self.local is None else self.local.task(
                index, name, f"{self.access.location}|{name}|{rng.start}-{rng.end}")
            if restore is None:
                backend = create()
            else:
                handles = {
                    n: h for n, h in restore.metadata.get("tasks", {}).items()
                    if len(recorded_key_groups(h).intersection(rng))
                }
                # a task reads its own local copy, if any, of the checkpoint being restored
                readers = [None if local is None or n != name or restored_id is None
                           else local.reader(restored_id, h) for n, h in handles.items()]
                # any backend's checkpoint restores into any backend (the one config flag)
                backend, sources[name] = restore_preferring_local(
                    create, [(h, restore.reader) for h in handles.values()], readers)
            try:
                op = KeyedOperator(self.func, backend, task_name=name, index=index,
                                   max_parallelism=self.max_parallelism,
                                   parallelism=self.parallelism, attempt=attempt, clock=self.clock,
                                   job_parameters={MODE_KEY: "BATCH" if self.batch else "STREAMING"},
                                   operator_state=OperatorStateBackend(operator_states[index]),
                                   restored_checkpoint_id=restored_id)
            except StatekitError:
                backend.dispose()
                raise
            except Exception as exc:
                backend.dispose()
                raise _UserFailure() from exc
            tasks.append(_Task(index, name, rng, backend, op))
        if restore is not None:
            self.restore_sources.append(sources)
            log.info("job %s restored from %s: %s", self.job_id, restore.path, sources)
        self._restore_time(tasks, restore)
        return tasks

    def _restore_time(self, tasks: list[_Task], restore: _RestorePoint | None) -> None:
        """The watermark (and the largest timestamp seen) the restored checkpoint recorded, so a
        restored job goes on with the time its input had reached."""
        self.time = self.upstream.source_time(self.clock)
        self.time.restore(restore.metadata.get("time") if restore is not None else None)
        for task in tasks:
            task.op.timers.watermark = self.time.watermark

    def _process(self, tasks: list[_Task], coordinator: CheckpointCoordinator,
                 restore: _RestorePoint | None) -> int:
        """Run the source to its end or until ``limit`` outputs are committed; the position."""
        if self.batch:  # no checkpoints: the outputs are final once the input is processed
            try:
                position = process_bounded(self, tasks)
            except Exception as exc:
                raise _UserFailure() from exc
            self.outputs.release(self.outputs.open)
            self.outputs.open = []
            return position
        position = int(restore.metadata.get("source", {}).get("offset", 0)) if restore else 0
        source = self.source
        maxp, p = self.max_parallelism, self.parallelism
        serialize, selector = self.key_serializer.serialize, self.selector
        outputs = self.outputs
        checkpointing = self.checkpoint_config.is_checkpointing_enabled()
        records, source_time, clock = self.time.records(), self.time, self.clock
        router = Router()
        next_processing = min(t.op.timers.next_processing for t in tasks)
        next_poll = 0.0
        while position < len(source):
            try:
                produced_records = records(source[position])
            except Exception as exc:  # a timestamp assigner or a stateless stage failed
                raise _UserFailure() from exc
            for value, timestamp in produced_records:
                try:
                    key = selector(value)
                    if key.__class__ is Route:  # a broadcast element, or one without a key
                        router.deliver(key, tasks, value, timestamp, outputs.open)
                        continue
                    task = tasks[key_group_for_bytes(serialize(key), maxp) * p // maxp]
                    produced = task.op.process_element(key, value, timestamp)
                    if produced is not None:
                        outputs.open.extend(produced)
                except Exception as exc:
                    raise _UserFailure() from exc
                if task.op.timers.next_processing < next_processing:
                    next_processing = task.op.timers.next_processing
            position += 1
            watermark = source_time.next_watermark()
            if watermark is not None:
                self._advance_watermark(tasks, watermark)
                next_processing = min(t.op.timers.next_processing for t in tasks)
            if next_processing != MAX_WATERMARK:
                now = clock()
                if next_processing <= now:
                    self._fire_processing(tasks, now)
                    next_processing = min(t.op.timers.next_processing for t in tasks)
            if not checkpointing:
                outputs.release(outputs.open)
                outputs.open = []
            elif (tick := time.monotonic()) >= next_poll:  # at most once a millisecond: cheap per element
                next_poll = tick + 0.001
                if coordinator.pending:
                    coordinator.poll()
                if coordinator.due() and all([t.backend.prepare_snapshot() for t in tasks]):
                    self._checkpoint(tasks, coordinator, position)
            if self.limit is not None and len(outputs.committed) >= self.limit:
                return position
        if self.drain:  # the end of bounded input: every event-time timer fires
            natural = self.time.watermark
            self._advance_watermark(tasks, MAX_WATERMARK)
            self.time.watermark = natural  # what a resumed job goes on from
            if not checkpointing:
                outputs.release(outputs.open)
                outputs.open = []
        if checkpointing:  # a final checkpoint, so a later run can resume at the end of input
            self._checkpoint(tasks, coordinator, position)
        coordinator.poll(wait=True)
        return position

    def _advance_watermark(self, tasks: list[_Task], watermark: int) -> None:
        self.time.watermark = watermark
        for task in tasks:
            try:
                task.op.advance_watermark(watermark, self.outputs.open)
            except Exception as exc:
                raise _UserFailure() from exc

    def _fire_processing(self, tasks: list[_Task], now: int) -> None:
        for task in tasks:
            try:
                task.op.advance_processing_time(now, self.outputs.open)
            except Exception as exc:
                raise _UserFailure() from exc

    def _checkpoint(self, tasks: list[_Task], coordinator: CheckpointCoordinator,
                    position: int) -> int:
        payload = self._payload(position)
        cid = coordinator.next_id
        self.outputs.barrier(cid)
        coordinator.trigger({t.name: t.backend for t in tasks}, payload,
                            self._operator_snapshots(tasks, cid))
        return cid

    def _operator_snapshots(self, tasks: list[_Task], checkpoint_id: int) -> list[bytes | None]:
        """Every task's operator state now (``snapshot_state`` of the user's function first)."""
        now = int(time.time() * 1000)
        try:
            return [task.op.snapshot_operator_state(checkpoint_id, now) for task in tasks]
        except StatekitError:
            raise
        except Exception as exc:  # the user's snapshot_state failed
            raise _UserFailure() from exc

    def _payload(self, position: int) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "job_name": self.name,
            "source": {"offset": position},
            "max_parallelism": self.max_parallelism,
            "parallelism": self.parallelism,
            "backend": self.backend_factory.name,
            "time": self.time.recorded(),
        }

    def _stop(self, tasks: list[_Task], coordinator: CheckpointCoordinator, position: int
              ) -> str | None:
        """Take the stop savepoint if asked (releasing outputs up to it), close the functions
        and apply the cancellation retention to the checkpoints."""
        savepoint = None
        if self.savepoint_dir is not None:
            savepoint = self._savepoint(tasks, coordinator.next_id, position)
            self.outputs.commit_through(coordinator.next_id)
            self.outputs.release(self.outputs.open)
            self.outputs.open = []
        for task in tasks:
            try:
                task.op.close()
            except Exception as exc:
                raise _UserFailure() from exc
        coordinator.shutdown()
        retain = (self.checkpoint_config.get_externalized_checkpoint_retention()
                  == ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
        if not retain:
            for cid in list(coordinator.retained):
                self.access.discard(cid, [])
            coordinator.retained.clear()
            self.access.store.remove_if_empty()  # the job's directory, emptied: gone with it
        return savepoint

    def _savepoint(self, tasks: list[_Task], checkpoint_id: int, position: int) -> str:
        """A self-contained, backend-neutral savepoint of the live state (stop-with-savepoint)."""
        savepoint = Savepoint(self.savepoint_dir, self.job_id,  # type: ignore[arg-type]
                              getattr(self.storage, "storage_options", None),
                              getattr(self.storage, "retry", None))
        threshold = getattr(self.storage, "get_min_file_size_threshold", lambda: 20 * 1024)()
        operator = self._operator_snapshots(tasks, checkpoint_id)
        handles, operator_handles = {}, []
        for task, data in zip(tasks, operator, strict=True):
            streams = savepoint.streams(task.name, threshold)
            handles[task.name] = task.backend.snapshot(checkpoint_id, streams, savepoint=True).run()
            operator_handles.append(None if data is None else OperatorStateBackend.write(data, streams))
        body = {**self._payload(position), "tasks": handles, "checkpoint_id": checkpoint_id,
                "timestamp": int(time.time() * 1000)}
        if any(h is not None for h in operator_handles):
            body[OPERATOR_STATE] = operator_handles
        return savepoint.commit(body)

    def _result(self, coordinator: CheckpointCoordinator, attempt: int, savepoint: str | None
                ) -> CollectResult:
        self.stats.extend(coordinator.stats)
        # every committed output, also past ``limit``: the state behind them is in the retained
        # checkpoints and savepoint, so dropping them here would lose them for good
        result = CollectResult(self.outputs.committed)
        result.job_id = self.job_id
        result.restarts = attempt
        result.checkpoint_stats = self.stats
        result.retained_checkpoints = [self.access.checkpoint_path(c) for c in coordinator.retained]
        result.savepoint_path = savepoint
        result.side_outputs = self.outputs.side
        result.restore_sources = self.restore_sources
        return result


def _close_quietly(task: _Task) -> None:
    """Close a task's function after a failure (Flink closes operators on failover too); an
    error there must not hide the failure itself."""
    try:
        task.op.close()
    except Exception:
        log.warning("closing %s after a failure failed", task.name, exc_info=True)


def _transfer_threads(backend: Any) -> int:
    getter = getattr(backend, "get_number_of_transfering_threads", None)
    return int(getter()) if callable(getter) else 1
