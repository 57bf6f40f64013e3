"""The applyInPandasWithState adapter's lineage rules, driven without Spark.

Spark's part is simulated exactly where it matters: each key's ``GroupState`` is committed only
when the task attempt that updated it succeeds, task attempts of a partition move between worker
processes (two independent runtimes over the same checkpoint storage), and attempts fail midway.
"""

import copy
import time

import pandas as pd
import pytest

from statekit import (
    HashMapStateBackend,
    KeyedProcessFunction,
    MapStateDescriptor,
    StateTtlConfig,
    Time,
    Types,
    ValueStateDescriptor,
)
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import CorruptCheckpointError
from statekit.spark import apply_in_pandas as aip
from statekit.spark.task import AdapterSpec, TaskInfo


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.seen = ctx.get_map_state(MapStateDescriptor("seen", Types.LONG(), Types.LONG()))

    def process_element(self, row, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.seen.put(row[1], n)
        yield ctx.get_current_key(), n


class FakeGroupState:
    """Spark's GroupState for one call: reads the committed value, buffers the update."""

    def __init__(self, committed):
        self._value = committed
        self.updated = False
        self.removed = False

    @property
    def exists(self):
        return self._value is not None

    @property
    def get(self):
        return self._value

    def update(self, value):
        self._value, self.updated, self.removed = value, True, False

    def remove(self):
        self._value, self.removed, self.updated = None, True, False

    hasTimedOut = False

    def getCurrentProcessingTimeMs(self):
        return int(time.time() * 1000)

    def getCurrentWatermarkMs(self):
        raise RuntimeError("no watermark defined")


class SlowCommits(FileSystemCheckpointStorage):
    """Checkpoint commits that take a while, as uploads to an object store do: a snapshot
    upload that ran past its task would then still be in flight when the next task starts."""

    def create_access(self, job_id):
        access = super().create_access(job_id)
        commit = access.commit

        def slow(checkpoint_id, body):
            time.sleep(0.004)
            return commit(checkpoint_id, body)

        access.commit = slow
        return access


class Simulation:
    """One partition's tasks as Spark runs them.  ``task_end``: the worker tells the runtime
    when a task's last call is done (the adapter's hook on PySpark's worker), as Spark does."""

    def __init__(self, tmp_path, materialize_every=2, slow=False, task_end=True, backend=None):
        storage = (SlowCommits if slow else FileSystemCheckpointStorage)(str(tmp_path / "state"))
        self.spec = AdapterSpec(Count(), backend or HashMapStateBackend(), storage, "count", [],
                                ["key", "n"])
        self.every = materialize_every
        self.committed = {}       # key -> GroupState tuple, as Spark committed it
        self.model = {}           # key -> committed event count
        self.processes = {}       # name -> PartitionRuntime (a worker process's runtime)
        self.attempt = 0
        self.task_end = task_end

    def runtime(self, process):
        if process not in self.processes:
            self.processes[process] = aip.PartitionRuntime(self.spec, "q", 0, self.every)
        return self.processes[process]

    def batch(self, batch_id, process, keys, fail_after=None):
        """One task attempt of batch ``batch_id`` in ``process``; fails after ``fail_after`` keys."""
        self.attempt += 1
        runtime = self.runtime(process)
        runtime.task_end_hook = self.task_end
        runtime.begin_task(TaskInfo(batch_id, "q", 0, 0, f"t{self.attempt}"))
        staged = {}
        for i, key in enumerate(keys):
            if fail_after is not None and i == fail_after:
                return False  # the attempt dies: nothing it staged is committed
            state = FakeGroupState(copy.deepcopy(self.committed.get(key)))
            frames = iter([pd.DataFrame({"key": [key], "v": [batch_id]})])
            outputs = runtime.call(key, frames, state)
            assert int(outputs[0]["n"].iloc[-1]) == self.model.get(key, 0) + 1
            staged[key] = state
        if self.task_end:
            runtime.end_task()  # the worker's task end, before Spark commits the batch
        for key, state in staged.items():
            if state.updated:
                self.committed[key] = state.get
            elif state.removed:
                self.committed.pop(key, None)
            self.model[key] = self.model.get(key, 0) + 1
        return True

    def log_lengths(self):
        return {k: len(aip.unpackb(v[3])) for k, v in self.committed.items()}


KEYS = [f"k{i}" for i in range(8)]


def test_failed_attempts_and_moving_partitions_stay_exact(tmp_path):
    sim = Simulation(tmp_path)
    for b in range(4):
        assert sim.batch(b, "P1", KEYS)
    assert not sim.batch(4, "P1", KEYS, fail_after=5)   # P1 now holds discarded changes
    assert sim.batch(4, "P2", KEYS)                     # the retry runs in another process
    for b in range(5, 14):                              # the partition alternates
        assert sim.batch(b, "P1" if b % 2 else "P2", KEYS[: 4 + b % 4])
    assert not sim.batch(14, "P2", KEYS, fail_after=3)
    assert sim.batch(14, "P2", KEYS)                    # retry in the same process
    for b in range(15, 20):
        assert sim.batch(b, "P1", KEYS)
    final = Simulation(tmp_path)                         # a fresh process reads everything back
    final.committed, final.model = sim.committed, sim.model
    assert final.batch(20, "P3", KEYS)
    # steady state: the carried logs stay short
    assert max(sim.log_lengths().values()) <= 2 * sim.every + 2


def test_discarded_attempt_would_poison_a_snapshot_without_attempt_markers(tmp_path, monkeypatch):
    """P1 runs a batch whose attempt Spark discards; without the attempt-marker check P1 would
    later materialize those changes, and a restore from that snapshot would count twice."""

    def scenario(path):
        # no task-end snapshots: the retry's process then leaves the chain where P1 has it
        sim = Simulation(path, materialize_every=1, task_end=False)
        for b in range(3):
            assert sim.batch(b, "P1", KEYS)
        assert not sim.batch(3, "P1", KEYS, fail_after=6)  # P1 applied 6 keys' discarded changes
        assert sim.batch(3, "P2", KEYS)                    # the retry, elsewhere
        assert sim.batch(4, "P1", KEYS[6:])                # P1 again: untouched keys only
        assert sim.batch(5, "P1", KEYS[6:])                # P1 materializes here if allowed
        assert sim.batch(6, "P3", KEYS)                    # a fresh process restores
        return sim

    scenario(tmp_path / "safe")
    monkeypatch.setattr(aip.PartitionRuntime, "_confirmed", lambda self, attempts, batch: True)
    # without the check the snapshot holds the discarded changes: wrong counts, or (when a key's
    # marker betrays it) a restore that no longer continues the committed log
    with pytest.raises((AssertionError, CorruptCheckpointError)):
        scenario(tmp_path / "unsafe")


def test_large_map_state_logs_only_the_change(tmp_path):
    sim = Simulation(tmp_path, materialize_every=100)
    for b in range(5):
        assert sim.batch(b, "P1", ["big"])
    sizes = [len(aip.packb(e[3])) for e in aip.unpackb(sim.committed["big"][3])]
    assert max(sizes) < 200  # each entry: one value update and one map put, not the whole map


class Fill(KeyedProcessFunction):
    """The first event of a key fills a large map; later ones change one entry.  Emits the event
    count, or -1 when the map is not whole (a restore or replay lost some of it)."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.m = ctx.get_map_state(MapStateDescriptor("m", Types.LONG(), Types.STRING()))

    def process_element(self, row, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if self.m.is_empty():
            self.m.put_all({i: "x" * 100 for i in range(12_000)})
        self.m.put(n, "changed")
        yield ctx.get_current_key(), n if len(list(self.m.keys())) == 12_000 else -1


def test_a_large_log_makes_the_next_task_snapshot_and_cut_it(tmp_path):
    sim = Simulation(tmp_path, materialize_every=100)
    sim.spec.function = Fill()
    for b in range(3):
        assert sim.batch(b, "P1", ["big"])
    assert sim.processes["P1"].lineage.base_id is not None  # batch 1 snapshotted, not batch 100
    assert len(sim.committed["big"][3]) < 1000  # the fill's log entry was cut
    fresh = Simulation(tmp_path, materialize_every=100)  # a new process restores and replays
    fresh.spec.function = Fill()
    fresh.committed, fresh.model, fresh.attempt = sim.committed, sim.model, sim.attempt
    assert fresh.batch(3, "FRESH", ["big"])


class Session(KeyedProcessFunction):
    """Counts events; a processing-time timer 50 ms after the last event closes the session."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, row, ctx):
        self.count.update((self.count.value() or 0) + 1)
        ctx.timer_service().register_processing_time_timer(
            ctx.timer_service().current_processing_time() + 50)
        return ()

    def on_timer(self, timestamp, ctx):
        # Two events in different milliseconds leave two timers; the first one closes the session.
        count = self.count.value()
        self.count.clear()
        if count is not None:
            yield ctx.get_current_key(), count


def test_timeouts_fire_timers_and_remove_the_key(tmp_path):
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"))
    spec = AdapterSpec(Session(), HashMapStateBackend(), storage, "sessions", [], ["key", "n"])
    runtime = aip.PartitionRuntime(spec, "q", 0, 5, "ProcessingTimeTimeout")
    runtime.begin_task(TaskInfo(0, "q", 0, 0, "a0"))
    state = FakeGroupState(None)
    durations = []
    state.setTimeoutDuration = durations.append
    assert runtime.call("u", iter([pd.DataFrame({"key": ["u", "u"], "v": [1, 2]})]), state) == []
    assert state.updated and 0 < durations[-1] <= 50
    time.sleep(0.15)
    runtime.begin_task(TaskInfo(1, "q", 0, 0, "a1"))
    timed_out = FakeGroupState(state.get)
    timed_out.hasTimedOut = True
    out = runtime.call("u", iter([]), timed_out)
    assert out[0].values.tolist() == [["u", 2]]
    assert timed_out.removed  # nothing left for the key: its GroupState is removed


def test_ttl_expired_state_removes_the_key(tmp_path):
    class Ttl(KeyedProcessFunction):
        def open(self, ctx):
            d = ValueStateDescriptor("last", Types.LONG())
            d.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(30)).build())
            self.last = ctx.get_state(d)

        def process_element(self, row, ctx):
            self.last.update(row[1])
            return ()

    storage = FileSystemCheckpointStorage(str(tmp_path / "state"))
    spec = AdapterSpec(Ttl(), HashMapStateBackend(), storage, "ttl", [], ["key", "n"])
    runtime = aip.PartitionRuntime(spec, "q", 0, 5, "ProcessingTimeTimeout")
    runtime.begin_task(TaskInfo(0, "q", 0, 0, "b0"))
    state = FakeGroupState(None)
    durations = []
    state.setTimeoutDuration = durations.append
    runtime.call("u", iter([pd.DataFrame({"key": ["u"], "v": [7]})]), state)
    assert state.updated and durations == [30]
    time.sleep(0.05)
    timed_out = FakeGroupState(state.get)
    timed_out.hasTimedOut = True
    runtime.call("u", iter([]), timed_out)
    assert timed_out.removed


def test_fresh_processes_materialize_mid_task_and_logs_stay_bounded(tmp_path):
    """Every task in a new process (``spark.python.worker.reuse=false``): snapshots are taken
    during the task, trusted only by later processes once the batch was committed, and the
    carried logs are truncated."""
    sim = Simulation(tmp_path, materialize_every=1)
    sim.spec.conf = {}
    for b in range(12):
        sim.processes.clear()  # a fresh worker process per task
        sim.processes["P"] = aip.PartitionRuntime(sim.spec, "q", 0, 1, mid_task_calls=4)
        ok = sim.batch(b, "P", KEYS, fail_after=5 if b == 6 else None)
        if not ok:
            sim.processes.clear()
            sim.processes["P"] = aip.PartitionRuntime(sim.spec, "q", 0, 1, mid_task_calls=4)
            assert sim.batch(b, "P", KEYS)
    assert max(sim.log_lengths().values()) <= 3
    final = Simulation(tmp_path)
    final.committed, final.model = sim.committed, sim.model
    assert final.batch(12, "P9", KEYS)


def _fresh_process_reads_back(sim, tmp_path, batch_id, tag):
    """A new driver's first task (in a copy of the storage, so the real run is undisturbed)
    restores, replays every key's committed log and must see exactly the committed counts."""
    import shutil

    copy_dir = tmp_path / f"fresh-{tag}"
    shutil.copytree(tmp_path / "state", copy_dir / "state")
    fresh = Simulation(copy_dir, sim.every, task_end=sim.task_end, backend=sim.spec.backend)
    fresh.committed, fresh.model = copy.deepcopy(sim.committed), dict(sim.model)
    try:
        assert fresh.batch(batch_id, "FRESH", list(sim.committed))
    finally:
        shutil.rmtree(copy_dir)


@pytest.mark.parametrize("seed", [*range(3),
                                  *(pytest.param(s, marks=pytest.mark.heavy) for s in range(3, 10))])
def test_random_lineages_restore_exactly_in_a_fresh_process(tmp_path, seed):
    """The partition moves between three worker processes at random, attempts fail midway,
    snapshots are taken at task starts and mid-task; after every few batches a fresh process
    (a restarted driver) must restore and continue every key's log exactly.  (Snapshot uploads
    that outlived their task let two processes branch off one base; a fresh process then
    restored the wrong sibling and found logs truncated past it.)"""
    _random_lineage(tmp_path, seed, None)


@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.heavy) for s in (1, 2))])
def test_random_lineages_on_rocksdb_changelog_checkpoints(tmp_path, seed):
    """The same on RocksDB whose snapshots extend a write-ahead log (changelog checkpoints)."""
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend

    backend = EmbeddedRocksDBStateBackend(True).configure({
        "state.changelog.enabled": True, "state.changelog.periodic-materialize.interval": "1 ms"})
    _random_lineage(tmp_path, seed, backend)


def _random_lineage(tmp_path, seed, backend):
    import random

    rng = random.Random(seed)
    sim = Simulation(tmp_path, materialize_every=rng.choice([1, 2, 3]), slow=True, backend=backend)
    keys = [f"k{i}" for i in range(rng.choice([6, 20, 40]))]
    mid_task = {p: rng.choice([4, 15, 1000]) for p in ("P1", "P2", "P3")}
    made = sim.runtime

    def runtime(process):
        new = process not in sim.processes
        rt = made(process)
        if new:
            rt.mid_task_calls = mid_task[process]
        return rt

    sim.runtime = runtime
    for b in range(24):
        chosen = rng.sample(keys, rng.randint(1, len(keys)))
        fail = rng.randint(0, len(chosen) - 1) if rng.random() < 0.15 else None
        if not sim.batch(b, rng.choice(list(mid_task)), chosen, fail_after=fail):
            assert sim.batch(b, rng.choice(list(mid_task)), chosen)   # Spark's retry
        if b % 3 == 2:
            _fresh_process_reads_back(sim, tmp_path, b + 1, b)


def test_adapter_package_names_its_parts():
    from statekit.spark.apply_in_pandas import lineage, partition

    assert aip.PartitionRuntime is partition.PartitionRuntime
    assert issubclass(aip.PartitionRuntime, lineage.PartitionLineage)
    assert aip.SnapshotId.batch_after(aip.SnapshotId.encode(6, 5000)) == 7
