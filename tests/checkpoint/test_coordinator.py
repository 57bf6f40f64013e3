"""The checkpoint coordinator against CheckpointConfig: timeouts, failures, retention, recovery."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    ExternalizedCheckpointCleanup,
    FileSystemCheckpointStorage,
    HashMapStateBackend,
    JobManagerCheckpointStorage,
    KeyedProcessFunction,
    RestartStrategies,
    StreamExecutionEnvironment,
    Types,
    ValueStateDescriptor,
)
from statekit.backends.base import SnapshotRun
from statekit.backends.heap import HeapKeyedStateBackend
from statekit.checkpoint.config import CheckpointConfig
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointError
from statekit.runtime.coordinator import CheckpointCoordinator
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import serializer_for

COUNT = ValueStateDescriptor("count", Types.LONG())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedBackend(HeapKeyedStateBackend):
    """A real heap backend whose asynchronous part can be held back or made to fail."""

    def __init__(self, incremental: bool = False) -> None:
        super().__init__(serializer_for(Types.LONG()), KeyGroupRange.all(8), 8, incremental=incremental)
        self.gate: threading.Event | None = None
        self.fail_next = 0
        self.completed: list[int] = []
        self.aborted: list[int] = []
        state = self.get_partitioned_state(COUNT)
        for k in range(50):
            self.set_current_key(k)
            state.update(k)

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        inner = super().snapshot(checkpoint_id, streams, savepoint=savepoint)
        gate, fail = self.gate, self.fail_next > 0
        self.fail_next = max(0, self.fail_next - 1)

        def run() -> dict[str, Any]:
            if gate is not None:  # write part of the data, then hang
                streams.write(b"x" * 4096, state_name="partial", shared_name="partial")
                streams.write(b"y" * 4096, state_name="partial")
                gate.wait(10)
            if fail:
                inner.cancel()
                raise OSError("disk full")
            return inner.run()

        return SnapshotRun(run, inner.sync_seconds, inner.cancel)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.completed.append(checkpoint_id)
        super().notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.aborted.append(checkpoint_id)
        super().notify_checkpoint_aborted(checkpoint_id)


def fs_access(tmp_path: Path, threshold: int = 0) -> CheckpointStorageAccess:
    return FileSystemCheckpointStorage(str(tmp_path), threshold).create_access("job")


def files(tmp_path: Path) -> set[str]:
    return {str(p.relative_to(tmp_path / "job")) for p in (tmp_path / "job").rglob("*") if p.is_file()}


def test_timed_out_checkpoint_is_aborted_and_leaves_no_files(tmp_path: Path) -> None:
    clock = Clock()
    config = CheckpointConfig().set_checkpoint_timeout(1000).set_tolerable_checkpoint_failure_number(1)
    access = fs_access(tmp_path)
    coordinator = CheckpointCoordinator(config, access, clock=clock)
    backend = ScriptedBackend()
    assert coordinator.trigger({"t": backend}, {}) == 1
    coordinator.poll(wait=True)  # a good checkpoint to keep
    before = files(tmp_path)
    backend.gate = threading.Event()
    coordinator.trigger({"t": backend}, {})
    while not any("partial" in f for f in files(tmp_path)):  # the writer is mid-way
        threading.Event().wait(0.005)
    clock.now += 2.0
    assert coordinator.poll() == []
    stats = coordinator.stats_of(2)
    assert stats is not None and stats.status == "failed" and "timeout" in (stats.failure or "")
    assert backend.aborted == [2]
    backend.gate.set()  # the hung writer finishes late; its files are swept
    coordinator.shutdown()
    assert files(tmp_path) == before
    assert access.completed() == [1]


def test_tolerable_failures_then_fail(tmp_path: Path) -> None:
    config = CheckpointConfig().set_tolerable_checkpoint_failure_number(1)
    coordinator = CheckpointCoordinator(config, fs_access(tmp_path))
    backend = ScriptedBackend()
    backend.fail_next = 1
    coordinator.trigger({"t": backend}, {})
    coordinator.poll(wait=True)  # 1 failure: tolerated
    assert coordinator.consecutive_failures == 1
    coordinator.trigger({"t": backend}, {})
    coordinator.poll(wait=True)  # success resets the count
    assert coordinator.consecutive_failures == 0
    backend.fail_next = 2
    coordinator.trigger({"t": backend}, {})
    coordinator.poll(wait=True)
    coordinator.trigger({"t": backend}, {})
    with pytest.raises(CheckpointError, match="exceed the tolerable 1"):
        coordinator.poll(wait=True)
    assert [s.status for s in coordinator.stats] == ["failed", "completed", "failed", "failed"]
    coordinator.shutdown()


def test_fail_on_checkpointing_errors(tmp_path: Path) -> None:
    strict = CheckpointCoordinator(CheckpointConfig(), fs_access(tmp_path / "a"))
    backend = ScriptedBackend()
    backend.fail_next = 1
    strict.trigger({"t": backend}, {})
    with pytest.raises(CheckpointError):
        strict.poll(wait=True)
    strict.shutdown()
    lenient = CheckpointCoordinator(CheckpointConfig().set_fail_on_checkpointing_errors(False),
                                    fs_access(tmp_path / "b"))
    backend.fail_next = 5
    for _ in range(5):
        lenient.trigger({"t": backend}, {})
        lenient.poll(wait=True)
    assert lenient.consecutive_failures == 5 and lenient.latest_completed() is None
    lenient.shutdown()


@pytest.mark.parametrize("storage", ["fs", "jobmanager"])
def test_retention_keeps_the_configured_number(tmp_path: Path, storage: str) -> None:
    config = CheckpointConfig().set_num_retained_checkpoints(2)
    access = (fs_access(tmp_path) if storage == "fs"
              else JobManagerCheckpointStorage().create_access(uuid.uuid4().hex))
    coordinator = CheckpointCoordinator(config, access)
    backend = ScriptedBackend(incremental=True)
    for _ in range(5):
        coordinator.trigger({"t": backend}, {"source": {}})
        coordinator.poll(wait=True)
    assert coordinator.retained == access.completed() == [4, 5]
    assert backend.completed == [1, 2, 3, 4, 5]
    # a later coordinator of the same job (a restart) adopts and trims them
    again = CheckpointCoordinator(config, access, first_checkpoint_id=6)
    assert again.retained == [4, 5]
    again.trigger({"t": backend}, {})
    again.poll(wait=True)
    assert access.completed() == [5, 6]
    again.discard_retained()
    assert access.completed() == []
    coordinator.shutdown()
    again.shutdown()


def test_subsumed_checkpoints_are_deleted_off_the_processing_thread(tmp_path: Path) -> None:
    """Deleting a subsumed checkpoint is file I/O (tens of ms for big files): the cleaner thread
    does it, in order, and a waiting poll or shutdown waits for it (Flink's CheckpointsCleaner)."""
    config = CheckpointConfig().set_num_retained_checkpoints(1)
    access = fs_access(tmp_path)
    threads: list[str] = []
    discard = access.discard

    def recorded(checkpoint_id: int, retained: list[int]) -> None:
        threads.append(threading.current_thread().name)
        discard(checkpoint_id, retained)

    access.discard = recorded  # type: ignore[method-assign]
    coordinator = CheckpointCoordinator(config, access)
    backend = ScriptedBackend()
    for _ in range(4):
        coordinator.trigger({"t": backend}, {"source": {}})
        coordinator.poll(wait=True)
    assert access.completed() == coordinator.retained == [4]
    assert len(threads) == 3 and all(t.startswith("statekit-cleaner") for t in threads)
    coordinator.shutdown()


def test_interval_min_pause_and_max_concurrent(tmp_path: Path) -> None:
    clock = Clock()
    config = (CheckpointConfig().set_checkpoint_interval(100).set_min_pause_between_checkpoints(50)
              .set_max_concurrent_checkpoints(2))
    coordinator = CheckpointCoordinator(config, fs_access(tmp_path), clock=clock)
    backend = ScriptedBackend()
    assert coordinator.due()
    backend.gate = threading.Event()
    coordinator.trigger({"t": backend}, {})
    assert not coordinator.due()  # interval not elapsed
    clock.now += 0.1
    assert coordinator.due()  # one pending < max concurrent 2, no checkpoint ended yet
    coordinator.trigger({"t": backend}, {})
    clock.now += 0.1
    assert not coordinator.due()  # two pending = max concurrent
    backend.gate.set()
    coordinator.poll(wait=True)
    assert not coordinator.due()  # min pause after the last end
    clock.now += 0.06
    assert coordinator.due()
    coordinator.shutdown()


def test_subsumption_aborts_older_pending_and_removes_its_files(tmp_path: Path) -> None:
    config = CheckpointConfig().set_max_concurrent_checkpoints(2)
    access = fs_access(tmp_path)
    coordinator = CheckpointCoordinator(config, access, transfer_threads=2)
    slow, fast = ScriptedBackend(), ScriptedBackend()
    slow.gate = threading.Event()
    coordinator.trigger({"t": slow}, {})
    while not any("partial" in f for f in files(tmp_path)):
        threading.Event().wait(0.005)
    coordinator.trigger({"t": fast}, {})
    coordinator.pending[2].futures["t"].result(timeout=10)
    assert coordinator.poll() == [2]
    assert coordinator.stats_of(1).status == "aborted"  # type: ignore[union-attr]
    assert slow.aborted == [1] and fast.completed == [2]
    slow.gate.set()
    coordinator.shutdown()
    assert access.completed() == [2]
    assert not any("partial" in f for f in files(tmp_path))


def test_retained_checkpoint_is_kept_while_an_inflight_one_builds_on_it(tmp_path: Path) -> None:
    config = CheckpointConfig().set_max_concurrent_checkpoints(2)
    access = fs_access(tmp_path)
    coordinator = CheckpointCoordinator(config, access, transfer_threads=2)
    backend = ScriptedBackend(incremental=True)
    coordinator.trigger({"t": backend}, {})
    coordinator.poll(wait=True)
    backend.set_current_key(1)
    backend.get_partitioned_state(COUNT).update(-1)
    coordinator.trigger({"t": backend}, {})  # incremental on top of 1
    backend.gate = threading.Event()
    coordinator.trigger({"t": backend}, {})  # in flight; built on 1 (2 was not confirmed yet)
    coordinator.pending[2].futures["t"].result(timeout=10)
    assert coordinator.poll() == [2]
    assert coordinator.retained == [1, 2]  # 1 survives: checkpoint 3 may reference its files
    backend.gate.set()
    assert coordinator.poll(wait=True) == [3]
    assert coordinator.retained == access.completed() == [3]
    restored = HeapKeyedStateBackend(serializer_for(Types.LONG()), KeyGroupRange.all(8), 8)
    restored.restore([access.load(3)["tasks"]["t"]], access.reader())
    state = restored.get_partitioned_state(COUNT)
    restored.set_current_key(1)
    assert state.value() == -1
    coordinator.shutdown()
    restored.dispose()  # its lazy restore's decoder thread ends with it
    backend.dispose()


def test_prefer_checkpoint_for_recovery(tmp_path: Path) -> None:
    config = CheckpointConfig()
    coordinator = CheckpointCoordinator(config, fs_access(tmp_path))
    assert coordinator.recovery_point() is None
    coordinator.trigger({"t": ScriptedBackend()}, {})
    coordinator.poll(wait=True)
    coordinator.record_savepoint(5, "/savepoints/sp-5")
    assert coordinator.recovery_point() == ("savepoint", "/savepoints/sp-5")
    config.set_prefer_checkpoint_for_recovery(True)
    assert coordinator.recovery_point() == ("checkpoint", 1)
    coordinator.shutdown()


def test_metrics_are_programmatic_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = CheckpointCoordinator(CheckpointConfig(), fs_access(tmp_path))
    backend = ScriptedBackend(incremental=True)
    with caplog.at_level(logging.INFO, logger="statekit.checkpoint"):
        for k in range(2):
            backend.set_current_key(k)
            backend.get_partitioned_state(COUNT).update(-1)
            coordinator.trigger({"t": backend}, {})
            coordinator.poll(wait=True)
    first, second = coordinator.stats
    assert first.status == second.status == "completed"
    assert not first.incremental and second.incremental
    assert first.bytes_written > second.bytes_written > 0
    assert first.files_written == 1 and second.files_written == 1
    assert first.sync_seconds > 0 and first.async_seconds > 0
    assert set(first.as_dict()) >= {"sync_seconds", "async_seconds", "bytes_written", "incremental"}
    assert "checkpoint 2 completed" in caplog.text and "incremental" in caplog.text
    coordinator.shutdown()


class Counter(KeyedProcessFunction):
    failed = False

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(COUNT)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        if value == 150 and not Counter.failed:
            Counter.failed = True
            raise RuntimeError("boom")
        time.sleep(0.0004)  # let the 10 ms checkpoint interval elapse several times
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield (value % 5, n)


@pytest.mark.parametrize("retention", [ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION,
                                       ExternalizedCheckpointCleanup.DELETE_ON_CANCELLATION])
def test_local_runner_incremental_recovery_and_retention(tmp_path: Path,
                                                         retention: ExternalizedCheckpointCleanup) -> None:
    Counter.failed = False
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(2)
    env.set_state_backend(HashMapStateBackend(incremental=True, materialization_interval=3))
    env.enable_checkpointing(10)
    env.get_checkpoint_config().set_checkpoint_storage(FileSystemCheckpointStorage(str(tmp_path), 0))
    env.get_checkpoint_config().set_externalized_checkpoint_cleanup(retention)
    env.get_checkpoint_config().set_num_retained_checkpoints(2)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(2, 0))
    source = list(range(300))
    result = (env.from_collection(source).key_by(lambda v: v % 5, key_type=Types.LONG())
              .process(Counter()).execute_and_collect())
    assert result.restarts == 1
    completed = [s for s in result.checkpoint_stats if s.status == "completed"]
    assert any(s.incremental for s in completed) and any(not s.incremental for s in completed)
    assert sorted(result) == sorted((k, n) for k in range(5) for n in range(1, 61))
    job_dir = tmp_path / result.job_id
    chk_dirs = sorted(p.name for p in job_dir.glob("chk-*")) if job_dir.exists() else []
    if retention == ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION:
        assert len(chk_dirs) == 2 and result.retained_checkpoints
    else:
        assert chk_dirs == [] and not list(job_dir.glob("shared/*"))
