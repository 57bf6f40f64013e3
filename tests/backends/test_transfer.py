"""Any snapshot into any backend: a checkpoint of either backend restores into the other, and a
key filter keeps exactly the keys a new partition owns (rescaling by an ownership function)."""

import pytest

from statekit import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    Types,
    ValueStateDescriptor,
)
from statekit.backends.transfer import restore_into
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer

COUNT = ValueStateDescriptor("count", Types.LONG())
SEEN = ListStateDescriptor("seen", Types.STRING())
BY = MapStateDescriptor("by", Types.STRING(), Types.LONG())
KEYS = [f"k{i}" for i in range(300)] + list(range(50))


def backend_of(kind, incremental=False):
    factory = (HashMapStateBackend(incremental=incremental) if kind == "hashmap"
               else EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=incremental))
    return factory.create_keyed_state_backend(
        key_serializer=GenericSerializer(), key_group_range=KeyGroupRange.all(128),
        max_parallelism=128, operator_id="op")


def fill(backend, keys, round_):
    for key in keys:
        backend.set_current_key(key)
        backend.get_partitioned_state(COUNT).update(round_ * 1000 + len(str(key)))
        backend.get_partitioned_state(SEEN).add(f"{key}-{round_}")
        backend.get_partitioned_state(BY).put(f"r{round_}", round_)


def read(backend, keys):
    out = {}
    for key in keys:
        backend.set_current_key(key)
        count = backend.get_partitioned_state(COUNT).value()
        if count is not None:
            out[key] = (count, backend.get_partitioned_state(SEEN).get(),
                        dict(backend.get_partitioned_state(BY).items()))
    return out


def checkpoint(tmp_path, source, incremental):
    """Two checkpoints (the second incremental when asked); the handle of the last one."""
    access = FileSystemCheckpointStorage(str(tmp_path / "ck")).create_access("job")
    fill(source, KEYS, 1)
    handle = None
    for cid in (1, 2):
        if cid == 2:
            fill(source, KEYS[::7], 2)
        handle = source.snapshot(cid, access.streams(cid, "t")).run()
        access.commit(cid, {"tasks": {"t": handle}})
        source.notify_checkpoint_complete(cid)
    return handle, access.reader()


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize(("source_kind", "target_kind"),
                         [("rocksdb", "hashmap"), ("hashmap", "rocksdb"), ("rocksdb", "rocksdb"),
                          ("hashmap", "hashmap")])
def test_any_checkpoint_restores_into_any_backend_split_by_owner(tmp_path, source_kind,
                                                                   target_kind, incremental):
    source = backend_of(source_kind, incremental)
    handle, reader = checkpoint(tmp_path, source, incremental)
    want = read(source, KEYS)
    source.dispose()
    halves = {}
    for part in (0, 1):  # two new partitions split the keys by an ownership function
        target = backend_of(target_kind)
        restore_into(target, [(handle, reader)], key_filter=lambda k, p=part: hash(str(k)) % 2 == p)
        halves[part] = read(target, KEYS)
        target.dispose()
    assert {**halves[0], **halves[1]} == want
    assert all(hash(str(k)) % 2 == p for p, got in halves.items() for k in got)
    whole = backend_of(target_kind)
    restore_into(whole, [(handle, reader)], skip_states=frozenset({"seen"}))
    for key in KEYS[:20]:
        whole.set_current_key(key)
        assert whole.get_partitioned_state(SEEN).get() == []
        assert whole.get_partitioned_state(COUNT).value() == want[key][0]
    whole.dispose()


def test_a_rocksdb_rescale_reads_the_native_files_without_converting_them(tmp_path, monkeypatch):
    """RocksDB into RocksDB with a key filter copies the kept keys straight from the restored
    files (no savepoint written and read back), exactly as the conversion would; a checkpoint
    with timers still goes through the conversion."""
    from statekit.backends import transfer

    source = backend_of("rocksdb")
    handle, reader = checkpoint(tmp_path, source, False)
    want = read(source, KEYS)
    source.dispose()
    converted = []
    real = transfer._neutral
    monkeypatch.setattr(transfer, "_neutral", lambda *a: converted.append(1) or real(*a))
    halves = {}
    for part in (0, 1):
        target = backend_of("rocksdb")
        restore_into(target, [(handle, reader)], key_filter=lambda k, p=part: hash(str(k)) % 2 == p)
        halves[part] = read(target, KEYS)
        target.dispose()
    assert not converted
    assert {**halves[0], **halves[1]} == want and halves[0] and halves[1]

    timed = backend_of("rocksdb")
    timed.set_current_key("k1")
    timed.get_partitioned_state(COUNT).update(1)
    timed.timer_queue("event-timers").add("k1", 5)
    access = FileSystemCheckpointStorage(str(tmp_path / "ck2")).create_access("job")
    with_timers = timed.snapshot(1, access.streams(1, "t")).run()
    timed.dispose()
    target = backend_of("rocksdb")
    restore_into(target, [(with_timers, access.reader())], key_filter=lambda k: True)
    assert len(target.timer_queue("event-timers")) == 1
    target.dispose()
    assert converted
