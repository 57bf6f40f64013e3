"""Snapshots of the applyInPandasWithState adapter come on schedule whichever worker process
runs each task, and every key's carried log stays within its size and age bounds.

Driven without Spark, as in ``test_apply_in_pandas_lineage``: Spark hands each task to whichever
Python worker is idle, so a partition's tasks move between processes; a process that did not
write the chain's newest snapshot is *behind* it.
"""

import pandas as pd
import pytest

from statekit import HashMapStateBackend, KeyedProcessFunction, Types, ValueStateDescriptor
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.spark import apply_in_pandas as aip
from statekit.spark.task import AdapterSpec, TaskInfo
from tests.spark.test_apply_in_pandas_lineage import (
    KEYS,
    FakeGroupState,
    Simulation,
    _fresh_process_reads_back,
)


def covered_batch(sim, batch_id):
    """The last batch the newest valid snapshot covers, as a task of ``batch_id`` finds it
    (read only: nothing is written to the storage)."""
    found = aip.PartitionRuntime(sim.spec, "q", 0, sim.every)._newest_valid(batch_id)
    return -1 if found is None else aip.SnapshotId.batch_after(found[0]) - 1


def test_a_process_behind_the_chain_still_snapshots_on_schedule(tmp_path):
    """P2 extends the chain once; P1, which ran before, runs every later batch.  P1 used to give
    up on every snapshot (its base was not the newest), so nothing was snapshotted again and the
    carried logs of its keys grew with every batch (P2 never saw those keys, so no log told P1
    that it was behind)."""
    sim = Simulation(tmp_path, materialize_every=2)
    for b in range(3):
        assert sim.batch(b, "P1", KEYS)
    assert sim.batch(3, "P2", KEYS[:4])   # a fresh process: restores P1's snapshot
    assert sim.batch(4, "P2", KEYS[:4])   # and extends the chain
    for b in range(5, 21):
        assert sim.batch(b, "P1", KEYS[4:])
    assert max(sim.log_lengths().values()) <= sim.every + 1
    assert covered_batch(sim, 21) >= 20 - sim.every
    _fresh_process_reads_back(sim, tmp_path, 21, "end")


def test_catching_up_keeps_what_the_process_applied(tmp_path):
    """A key changed once, in a process that then falls behind the chain, reaches a snapshot
    when that process next snapshots: catching up merges its newer keys into the chain's newest
    snapshot instead of dropping them (they would live in the key's log alone)."""
    sim = Simulation(tmp_path, materialize_every=2)
    assert sim.batch(0, "P1", KEYS)
    assert sim.batch(1, "P1", KEYS)
    assert sim.batch(2, "P1", [*KEYS, "once"])  # P1 snapshots batches 0-1 first, then "once"
    assert sim.batch(3, "P2", KEYS)             # fresh: P1's snapshot, without "once"
    assert sim.batch(4, "P2", KEYS)             # the chain's newest: still without "once"
    assert sim.batch(5, "P1", KEYS)             # P1 is behind the chain
    assert sim.batch(6, "P1", KEYS)             # and due
    assert covered_batch(sim, 7) >= 5
    probe = aip.PartitionRuntime(sim.spec, "q", 0, sim.every)
    probe._restore_from(probe._newest_valid(7))  # read only: no attempt of batch 7 is recorded
    probe.backend.set_current_key("once")
    assert probe.function.count.value() == 1
    _fresh_process_reads_back(sim, tmp_path, 7, "end")


def test_fresh_processes_with_default_settings_snapshot_and_bound_logs(tmp_path):
    """Every task in a new process and fewer keys than the mid-task threshold: no task ever
    started in a process that held the partition, so no snapshot was taken and every log held
    the key's whole history.  A log older than the schedule now makes its task snapshot."""
    sim = Simulation(tmp_path, materialize_every=3)
    for b in range(12):
        sim.processes.clear()  # spark.python.worker.reuse=false
        assert sim.batch(b, "P", KEYS)
    assert covered_batch(sim, 12) >= 11 - sim.every
    assert max(sim.log_lengths().values()) <= sim.every + 1
    _fresh_process_reads_back(sim, tmp_path, 12, "end")


def test_a_log_past_the_size_bound_is_snapshotted(tmp_path):
    """Each change of this key is about 5 KiB; the schedule alone (every 100 batches) would let
    its log reach half a megabyte before anything cut it."""
    sim = Simulation(tmp_path, materialize_every=100)
    sim.spec.conf = {aip.MAX_LOG_KEY: 16 * 1024}
    sim.spec.function = Blob()
    for b in range(12):
        assert sim.batch(b, "P1" if b % 3 else "P2", ["big", "small"])
    sizes = {k: len(v[3]) for k, v in sim.committed.items()}
    assert sizes["big"] <= 16 * 1024 + 6 * 1024
    _fresh_process_reads_back(sim, tmp_path, 12, "end")


class Blob(KeyedProcessFunction):
    """Counts events and keeps a fresh 5 KiB value per event (a large change each time)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.blob = ctx.get_state(ValueStateDescriptor("blob", Types.STRING()))

    def process_element(self, row, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.blob.update(f"{n:05d}" * 1024)
        yield ctx.get_current_key(), n


@pytest.mark.parametrize("every", [1, 5])
def test_the_bounds_hold_whatever_process_runs_each_task(tmp_path, every):
    """Three processes take tasks at random (and new ones appear): each key's log holds at most
    the schedule's worth of changes (a key idle for long keeps its old log, unchanged, until it
    is next called), and the newest snapshot is never more than the schedule behind."""
    import random

    rng = random.Random(every)
    sim = Simulation(tmp_path, materialize_every=every)
    for b in range(30):
        process = rng.choice(["P1", "P2", "P3", f"new{b}"])
        assert sim.batch(b, process, rng.sample(KEYS, 6))
        assert max(sim.log_lengths().values()) <= every + 1, (b, sim.log_lengths())
        assert covered_batch(sim, b + 1) >= b - every
    _fresh_process_reads_back(sim, tmp_path, 30, "end")


def test_later_snapshots_of_a_task_win_past_a_thousand_calls(tmp_path):
    """Snapshot ids ordered the snapshots of one task by its calls so far, capped at 999: past
    that, a task's snapshots at 1000, 2000 and 3000 calls got equal orders and random ids, so a
    restore could pick an earlier one than the logs had been cut against."""
    sim = Simulation(tmp_path, materialize_every=1, task_end=False)
    written = []
    runtime = sim.runtime("P1")
    commit = runtime.access.commit
    runtime.access.commit = lambda sid, body: (written.append(sid), commit(sid, body))[1]
    keys = [f"k{i:04d}" for i in range(3100)]
    for b in range(2):
        assert sim.batch(b, "P1", keys)
    mid_task = [sid for sid in written if aip.SnapshotId.batch_after(sid) == 2]  # of batch 1
    assert len(mid_task) >= 3
    assert written == sorted(written)


def test_without_a_task_end_hook_logs_stay_bounded(tmp_path):
    """A PySpark whose worker does not let statekit see a task's end: a log past its bound
    snapshots within the task instead (and the next task of the process, at its start)."""
    import random

    rng = random.Random(3)
    sim = Simulation(tmp_path, materialize_every=2, task_end=False)
    for b in range(24):
        assert sim.batch(b, rng.choice(["P1", "P2", "P3"]), rng.sample(KEYS, 6))
    assert max(sim.log_lengths().values()) <= 2 * sim.every + 2
    assert covered_batch(sim, 24) >= 23 - 2 * sim.every
    _fresh_process_reads_back(sim, tmp_path, 24, "end")


class ClearOnNegative(KeyedProcessFunction):
    """Counts a key's events; a negative value clears the key (its GroupState is removed)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, row, ctx):
        if row[1] < 0:
            self.count.clear()
            return
        self.count.update((self.count.value() or 0) + 1)
        yield ctx.get_current_key(), self.count.value()


def test_a_key_removed_and_made_again_restores_from_an_older_snapshot(tmp_path):
    """A snapshot holds a key's old life (marker (4, ...)); the key is then removed and made
    again (a new log from sequence 1) before the next snapshot.  A process restoring that
    snapshot found its marker on no log and failed with CorruptCheckpointError, although a log
    that starts at sequence 1 and was never cut holds the key's whole new life."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"))
    spec = AdapterSpec(ClearOnNegative(), HashMapStateBackend(), storage, "c", [], ["key", "n"])
    processes, committed, outputs = {}, None, []
    for batch, process, value in [(0, "P1", 1), (1, "P1", 1), (2, "P1", 1), (3, "P1", 1),
                                  (4, "P2", -1), (5, "P2", 1), (6, "P3", 1)]:
        runtime = processes.setdefault(process, aip.PartitionRuntime(spec, "q", 0, 4))
        runtime.task_end_hook = True
        runtime.begin_task(TaskInfo(batch, "q", 0, 0, f"t{batch}"))
        state = FakeGroupState(committed)
        frames = iter([pd.DataFrame({"key": ["k"], "v": [value]})])
        outputs += [int(n) for out in runtime.call("k", frames, state) for n in out["n"]]
        runtime.end_task()  # the snapshot of batches 0-3 is taken here, at batch 3
        committed = state.get if state.updated else (None if state.removed else committed)
    assert outputs == [1, 2, 3, 4, 1, 2]
