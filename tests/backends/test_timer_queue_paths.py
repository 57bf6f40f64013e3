"""The timer queues' fast paths: where firing seeks in RocksDB, the heap queue's rebuild and the
check of restored timers (each against a plain model, on real backends)."""

from __future__ import annotations

import bisect
import random

import pytest

from statekit import Types
from statekit.backends.heap import HashMapStateBackend
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.backends.timers import EVENT_TIMERS, check_restored_timers
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange


def _backend(factory, max_parallelism=128):
    return factory.create_keyed_state_backend(
        key_serializer=Types.LONG().get_serializer(),
        key_group_range=KeyGroupRange.all(max_parallelism), max_parallelism=max_parallelism)


class SeekSpy:
    """A column family whose iterators record where each seek starts and what it finds."""

    def __init__(self, cf):
        self.cf = cf
        self.seeks: list[tuple[bytes, bytes | None]] = []

    def iter(self, *args):
        it, seeks = self.cf.iter(*args), self.seeks

        class Iterator:
            def seek(self, target):
                it.seek(target)
                seeks.append((target, it.key() if it.valid() else None))

            def __getattr__(self, name):
                return getattr(it, name)

        return Iterator()

    def __getattr__(self, name):
        return getattr(self.cf, name)


@pytest.mark.parametrize("same_time", [True, False], ids=["one-timestamp", "rising"])
def test_rocksdb_fires_without_stepping_over_fired_timers(tmp_path, same_time):
    """Firing seeks a key group's next timer from the fired one: the seeks step over each fired
    (deleted) timer at most once.  Seeking from the key group's start stepped over every timer
    fired before (RocksDB keeps their tombstones until compaction), so each fire cost more than
    the last: quadratic in the timers fired, and timers sharing one timestamp (a micro-batch's
    processing-time timers) the worst case."""
    factory = EmbeddedRocksDBStateBackend()
    factory.set_db_storage_paths(str(tmp_path))
    backend = _backend(factory, max_parallelism=1)  # one key group
    try:
        queue = backend.timer_queue(EVENT_TIMERS)
        n = 300
        for key in range(n):
            queue.add(key, 1_000 if same_time else 1_000 + key)
        spy = queue._time = SeekSpy(queue._time)
        fired_entries: list[bytes] = []
        stepped = 0
        while True:
            spy.seeks.clear()
            timer = queue.poll(10_000)
            if timer is None:
                break
            key, timestamp = timer
            prefix = backend.key_prefix(key)
            fired_entries.append(prefix[:2] + (timestamp + (1 << 63)).to_bytes(8, "big")
                                 + prefix[2:])
            fired_entries.sort()
            for start, found in spy.seeks:  # fired entries in [start, found) were stepped over
                end = len(fired_entries) if found is None else bisect.bisect_left(fired_entries,
                                                                                 found)
                stepped += max(0, end - bisect.bisect_left(fired_entries, start))
        assert len(fired_entries) == n and len(queue) == 0
        assert stepped <= n, f"the seeks stepped over {stepped} fired timers firing {n}"
    finally:
        backend.dispose()


def _model_run(queue, seed, keys=40, steps=3_000, model=None, limit=0):
    """Random adds, removes and polls against a sorted list of (timestamp, key) pairs (``model``:
    what the queue holds at the start)."""
    rng = random.Random(seed)
    model = set() if model is None else model
    for _ in range(steps):
        op = rng.random()
        key, ts = rng.randrange(keys), limit + rng.randrange(-5, 40)
        if op < 0.5:
            assert queue.add(key, ts) == ((ts, key) not in model)
            model.add((ts, key))
        elif op < 0.65:
            assert queue.remove(key, ts) == ((ts, key) in model)
            model.discard((ts, key))
        else:
            limit += rng.randrange(0, 8)
            due = sorted(t for t in model if t[0] <= limit)
            fired = list(queue.drain(limit))
            assert sorted((t, k) for k, t in fired) == due
            assert [t for _, t in fired] == sorted(t for _, t in fired)  # in timestamp order
            model.difference_update(due)
        assert queue.peek() == (min(model)[0] if model else None)
        assert len(queue) == len(model)
    return model


@pytest.mark.parametrize("kind", ["heap", "rocksdb", "rocksdb-heap"])
def test_queues_match_a_sorted_set(tmp_path, kind):
    """Equal timestamps across keys and key groups, an earlier timer added to a group whose head
    has the same timestamp, the head removed: the queue stays the model's sorted set."""
    if kind == "heap":
        factory = HashMapStateBackend()
    else:
        factory = EmbeddedRocksDBStateBackend()
        factory.set_db_storage_paths(str(tmp_path))
        if kind == "rocksdb-heap":
            factory.set_priority_queue_state_type("HEAP")
    backend = _backend(factory, max_parallelism=4)
    try:
        _model_run(backend.timer_queue(EVENT_TIMERS), seed=11)
    finally:
        backend.dispose()


@pytest.mark.parametrize("cached", [1, 3])
def test_rocksdb_cached_heads_match_a_sorted_set(tmp_path, monkeypatch, cached):
    """The RocksDB queue keeps each key group's first entries in memory: with a cache of 1 and 3
    entries, every path (an add before, inside and after the cached entries of a complete and an
    incomplete group, a cached entry removed, the cache run out and read again) stays the
    model's sorted set, and a queue opened again over the same column families reads the same
    timers."""
    import statekit.backends.rocksdb.timers as rocksdb_timers

    monkeypatch.setattr(rocksdb_timers, "CACHED", cached)
    factory = EmbeddedRocksDBStateBackend()
    factory.set_db_storage_paths(str(tmp_path))
    backend = _backend(factory, max_parallelism=2)
    try:
        model = _model_run(backend.timer_queue(EVENT_TIMERS), seed=cached, steps=2_000)
        again = rocksdb_timers.RocksDBTimerQueue(EVENT_TIMERS, backend)
        assert sorted((t, k) for k, t in again.drain(1 << 40)) == sorted(model)
    finally:
        backend.dispose()


def test_rocksdb_firing_reads_the_index_once_per_cached_entries(tmp_path):
    """Firing takes a key group's next timer from the entries the queue read ahead: 1,000 timers
    of one key group fire with one index read per 128 of them.  An iterator per fired timer
    (one seek each) cost more the more files and levels the index has."""
    from statekit.backends.rocksdb.timers import CACHED

    factory = EmbeddedRocksDBStateBackend()
    factory.set_db_storage_paths(str(tmp_path))
    backend = _backend(factory, max_parallelism=1)  # one key group
    try:
        queue = backend.timer_queue(EVENT_TIMERS)
        n = 1_000
        for key in range(n):
            queue.add(key, 1_000 + key % 7)
        spy = queue._time = SeekSpy(queue._time)
        fired = list(queue.drain(10_000))
        assert [t for _, t in fired] == sorted(1_000 + key % 7 for key in range(n))
        assert len(spy.seeks) <= n // CACHED + 1, f"{len(spy.seeks)} index reads firing {n}"
    finally:
        backend.dispose()


def test_heap_queue_rebuilds_during_a_pending_snapshot():
    """Removing many timers rebuilds the heap from the table, also while a snapshot holds it
    (keys removed then are tombstones, keys added then are staged): nothing lost, nothing
    resurrected, and the snapshot keeps what it captured."""
    backend = _backend(HashMapStateBackend(), max_parallelism=8)
    try:
        queue = backend.timer_queue(EVENT_TIMERS)
        for key in range(3_000):
            queue.add(key, 10 + key % 7)
        store = MemoryBlobStore()
        access = CheckpointStorageAccess(store, "memory://t", 0)
        run = backend.snapshot(1, access.streams(1, "t"))  # captured, not written yet
        for key in range(3_000, 3_100):  # staged while the snapshot is pending
            queue.add(key, 5)
        for key in range(0, 3_000, 2):  # tombstones; enough removals to rebuild the heap
            assert queue.remove(key, 10 + key % 7)
        for key in range(1, 400, 2):
            assert queue.remove(key, 10 + key % 7)
        expected = sorted([(5, k) for k in range(3_000, 3_100)]
                          + [(10 + k % 7, k) for k in range(401, 3_000, 2)])
        handle = run.run()
        assert sorted((t, k) for k, t in queue.drain(100)) == expected
        restored = _backend(HashMapStateBackend(), max_parallelism=8)
        try:
            restored.restore([handle], access.reader())
            again = restored.timer_queue(EVENT_TIMERS, create=False)
            assert sorted((t, k) for k, t in again.drain(100)) == sorted(
                (10 + k % 7, k) for k in range(3_000))
        finally:
            restored.dispose()
    finally:
        backend.dispose()


@pytest.mark.parametrize("kind", ["heap", "rocksdb-heap"])
def test_restored_heap_queue_merges_its_sorted_run_with_new_timers(tmp_path, kind):
    """A restored (or rebuilt) heap queue keeps what the table held as sorted arrays and what is
    added later in a sorted list: random adds, removes and polls over both — several timers per
    key, equal timestamps in both, stale entries in both, the arrays run out — stay the model's
    sorted set."""
    def make():
        if kind == "heap":
            return _backend(HashMapStateBackend(), max_parallelism=4)
        factory = EmbeddedRocksDBStateBackend()
        factory.set_db_storage_paths(str(tmp_path / f"db-{random.random()}"))
        factory.set_priority_queue_state_type("HEAP")
        return _backend(factory, max_parallelism=4)

    rng = random.Random(5)
    model = {(rng.randrange(-5, 60), rng.randrange(40)) for _ in range(400)}
    backend = make()
    try:
        queue = backend.timer_queue(EVENT_TIMERS)
        for timestamp, key in model:
            queue.add(key, timestamp)
        access = CheckpointStorageAccess(MemoryBlobStore(), "memory://t", 0)
        handle = backend.snapshot(1, access.streams(1, "t")).run()
    finally:
        backend.dispose()
    restored = make()
    try:
        restored.restore([handle], access.reader())
        queue = restored.timer_queue(EVENT_TIMERS, create=False)
        assert len(queue._run_stamps) == len(model)  # restored as the sorted run
        _model_run(queue, seed=3, steps=4_000, model=set(model), limit=-10)
    finally:
        restored.dispose()


@pytest.mark.parametrize("bad", [[], [3, 2], [4, 4], [True], [1.0], [2**63], [-(2**63) - 1], (1,),
                                 None])
def test_restored_timers_are_checked_in_bulk(bad):
    """Many good keys and one bad: refused, naming the bad key."""
    data = {key: [key, key + 5] if key % 3 else [key] for key in range(1_000)}
    check_restored_timers("t", data)
    data[500] = bad
    with pytest.raises(CorruptCheckpointError, match="key 500 "):
        check_restored_timers("t", data)
