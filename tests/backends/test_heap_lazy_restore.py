"""Lazy heap restore: values stay serialized until first accessed or decoded in the background.

Both key paths (a key decoded by access, a key decoded by the background thread), checkpoints and
savepoints of a partly decoded state (bytes written through), rescale and backend switch of it,
changelogs over a lazy base, writes while a snapshot is pending, and hostile parts.
"""

from __future__ import annotations

import gc
import threading
import time
import uuid
import zlib
from typing import Any

import pytest

from statekit import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    JobManagerCheckpointStorage,
    StateTtlConfig,
    Types,
    ValueStateDescriptor,
)
from statekit.backends import plainparts
from statekit.backends.heap import HeapKeyedStateBackend
from statekit.backends.heap import lazy as lazy_module
from statekit.backends.heap import snapshot as snapshot_module
from statekit.backends.kvformat import read_plain_entry
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.msgpack import packb, pair_head_length
from statekit.serde.types import serializer_for
from tests.backends.test_heap_snapshots import COUNT, LIST, MAP, VALUE, dump, populate

MAXP = 16
N = 400


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small parts, so a restore holds several pending parts per state."""
    monkeypatch.setattr(plainparts, "PLAIN_PART_BYTES", 200)
    monkeypatch.setattr(plainparts, "PACED_PART_BYTES", 200)
    monkeypatch.setattr(plainparts, "_FIRST_PART_ENTRIES", 16)


@pytest.fixture
def no_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The background thread decodes nothing: only accesses decode."""
    monkeypatch.setattr(lazy_module, "DECODE_AHEAD", 0)


def make(rng: KeyGroupRange | None = None, **kw: Any) -> HeapKeyedStateBackend:
    return HashMapStateBackend(**kw).create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()),
        key_group_range=rng or KeyGroupRange.all(MAXP), max_parallelism=MAXP)


def rocksdb(tmp_path: Any) -> Any:
    factory = EmbeddedRocksDBStateBackend()
    factory.set_db_storage_paths(str(tmp_path))
    return factory.create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()), key_group_range=KeyGroupRange.all(MAXP),
        max_parallelism=MAXP)


def access() -> CheckpointStorageAccess:
    return JobManagerCheckpointStorage().create_access(uuid.uuid4().hex)


def checkpoint(backend: Any, acc: CheckpointStorageAccess, cid: int, *,
               savepoint: bool = False) -> dict[str, Any]:
    handle = backend.snapshot(cid, acc.streams(cid, "t"), savepoint=savepoint).run()
    acc.commit(cid, {"tasks": {"t": handle}})
    backend.notify_checkpoint_complete(cid)
    return handle


def restored(handle: dict[str, Any], acc: CheckpointStorageAccess, **kw: Any) -> Any:
    backend = make(**kw)
    backend.restore([handle], acc.reader())
    return backend


def source(n: int = N, acc: CheckpointStorageAccess | None = None, **kw: Any
           ) -> tuple[dict[str, Any], CheckpointStorageAccess, dict]:
    """A checkpoint of ``n`` populated keys (in ``acc``, else in memory), its storage, and the
    state it holds."""
    backend = make(**kw)
    populate(backend, n)
    acc = acc or access()
    handle = checkpoint(backend, acc, 1)
    expected = dump(backend, range(n))
    backend.dispose()
    return handle, acc, expected


def assert_restores(handle: dict[str, Any], acc: CheckpointStorageAccess, expected: dict) -> None:
    """A fresh backend restored from ``handle`` holds exactly ``expected``."""
    fresh = restored(handle, acc)
    assert dump(fresh, range(N)) == expected
    fresh.dispose()


def register(backend: HeapKeyedStateBackend) -> None:
    for descriptor in (VALUE, LIST, MAP, COUNT):
        backend.get_partitioned_state(descriptor)


def crcs(handle: dict[str, Any], state: str) -> list[int]:
    return [crc for _, _, crc in handle["states"][state]["parts"]]


def lazy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("statekit-lazy-")]


def test_a_key_decoded_by_access_decodes_its_part_only(no_decoder: None) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    parts = len(handle["states"]["c"]["parts"])
    assert parts >= 4
    total = backend.pending_restore()
    assert total == 4 * N  # nothing decoded yet
    backend.set_current_key(N - 1)
    assert backend.get_partitioned_state(COUNT).value() == N - 1
    left = backend.pending_restore()
    assert total - N // 2 < left < total  # one part of one state
    assert dump(backend, range(N)) == expected
    assert backend.pending_restore() == 0
    table = backend.tables["c"]
    assert table.lazy is None
    table.put(0, 5)  # the first write after the last part turns the slow path off
    assert not table.watch
    backend.dispose()


def test_keys_decoded_by_the_background_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded_on: list[str] = []
    values = lazy_module.LazyPart.values

    def recording(part: Any, *args: Any) -> list[Any]:
        if part.decoded is None:
            decoded_on.append(threading.current_thread().name)
        return values(part, *args)

    monkeypatch.setattr(lazy_module.LazyPart, "values", recording)
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    deadline = time.monotonic() + 30
    while backend.pending_restore() and time.monotonic() < deadline:
        backend.prepare_snapshot()  # installs what the thread decoded (no key is accessed)
        time.sleep(0.001)
    assert backend.pending_restore() == 0
    assert decoded_on and all(name.startswith("statekit-lazy-") for name in decoded_on)
    assert dump(backend, range(N)) == expected
    backend.dispose()
    assert not lazy_threads()


@pytest.mark.parametrize("mode", ["thread", "fork", "sync"])
def test_a_checkpoint_writes_pending_parts_through(no_decoder: None, mode: str) -> None:
    handle, acc, expected = source()
    kw: dict[str, Any] = ({"using_asynchronous_snapshots": False} if mode == "sync"
                          else {"snapshot_mode": mode})
    backend = restored(handle, acc, **kw)
    register(backend)
    backend.set_current_key(3)
    backend.get_partitioned_state(COUNT).update(-3)  # one part of "c" installed and changed
    expected["c"][3] = -3
    again = checkpoint(backend, acc, 2)
    assert set(crcs(handle, "v")) <= set(crcs(again, "v"))  # never decoded: the same bytes
    assert len(set(crcs(handle, "c")) - set(crcs(again, "c"))) == 1
    if mode == "fork":  # the parts are held now: a forked child writes them through
        again = checkpoint(backend, acc, 3)
        assert set(crcs(handle, "v")) <= set(crcs(again, "v"))
    backend.dispose()
    assert_restores(again, acc, expected)


def test_writes_while_a_snapshot_is_pending(no_decoder: None) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    run = backend.snapshot(2, acc.streams(2, "t"))
    count = backend.get_partitioned_state(COUNT)
    live = {k: v for k, v in expected["c"].items()}
    for key in (5, 200, N - 1):
        backend.set_current_key(key)
        count.update(key * 10)
        live[key] = key * 10
    backend.set_current_key(7)
    count.clear()
    del live[7]
    backend.set_current_key(N + 1)
    count.update(1)
    live[N + 1] = 1
    handle2 = run.run()
    acc.commit(2, {"tasks": {"t": handle2}})
    assert {k: count.value() for k in range(N + 2) if not backend.set_current_key(k)
            and count.value() is not None} == live
    backend.dispose()
    written = [k for keys, _ in read_plain_entry("c", handle2["states"]["c"], acc.reader())
               for k in keys]
    assert sorted(written) == list(range(N))  # each key once: installed parts were staged
    fresh = restored(handle2, acc)
    assert dump(fresh, range(N + 2)) == expected  # the snapshot saw the state at capture
    fresh.dispose()


@pytest.mark.parametrize("target", ["hashmap", "rocksdb"])
def test_a_savepoint_of_a_partly_decoded_state(no_decoder: None, target: str,
                                                tmp_path: Any) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    backend.set_current_key(11)
    backend.get_partitioned_state(LIST).add(99)
    expected["l"][11].append(99)
    savepoint = checkpoint(backend, acc, 2, savepoint=True)
    backend.dispose()
    if target == "hashmap":
        fresh = restored(savepoint, acc)
    else:
        fresh = rocksdb(tmp_path)
        fresh.restore([savepoint], acc.reader())
    assert dump(fresh, range(N)) == expected
    fresh.dispose()


def test_a_partly_decoded_state_switches_to_rocksdb_through_a_checkpoint(
        no_decoder: None, tmp_path: Any) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    backend.set_current_key(1)
    backend.get_partitioned_state(MAP).put("z", [1])
    expected["m"][1]["z"] = [1]
    again = checkpoint(backend, acc, 2)
    backend.dispose()
    fresh = rocksdb(tmp_path)
    fresh.restore([again], acc.reader())
    assert dump(fresh, range(N)) == expected
    fresh.dispose()


def test_rescale_of_a_partly_decoded_state(no_decoder: None) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    register(backend)
    backend.set_current_key(0)
    assert backend.get_partitioned_state(COUNT).value() == 0
    whole = checkpoint(backend, acc, 2)
    backend.dispose()
    halves = [KeyGroupRange(0, 6), KeyGroupRange(7, MAXP - 1)]
    handles = []
    for n, rng in enumerate(halves):
        half = restored(whole, acc, rng=rng)  # lazily, each part keeping its own keys
        register(half)
        assert half.pending_restore() > 0
        handles.append(checkpoint(half, acc, 10 + n))  # parts of kept keys, re-packed
        half.dispose()
    merged = make()
    merged.restore(handles, acc.reader())
    assert dump(merged, range(N)) == expected
    merged.dispose()


def test_changelogs_over_a_lazy_base(no_decoder: None) -> None:
    backend = make(incremental=True)
    populate(backend, N)
    acc = access()
    checkpoint(backend, acc, 1)
    count = backend.get_partitioned_state(COUNT)
    for key in range(0, N, 3):
        backend.set_current_key(key)
        count.update(-key)
    for key in range(1, N, 50):
        backend.set_current_key(key)
        count.clear()
    handle = checkpoint(backend, acc, 2)
    assert handle["incremental"]
    expected = dump(backend, range(N))
    backend.dispose()
    fresh = restored(handle, acc)
    register(fresh)
    assert fresh.pending_restore() > 0
    full = checkpoint(fresh, acc, 3)  # parts overridden by the logs are re-packed without them
    assert dump(fresh, range(N)) == expected
    fresh.dispose()
    again = restored(full, acc)
    assert dump(again, range(N)) == expected  # no removed key comes back
    again.dispose()


def test_states_not_registered_are_carried_over_lazily(no_decoder: None) -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc)
    backend.get_partitioned_state(COUNT)
    assert backend.pending_restore() == 4 * N
    again = checkpoint(backend, acc, 2)
    savepoint = checkpoint(backend, acc, 3, savepoint=True)
    assert set(crcs(handle, "m")) == set(crcs(again, "m"))
    backend.dispose()
    for h in (again, savepoint):
        assert_restores(h, acc, expected)


def test_key_enumeration_sees_pending_keys(no_decoder: None) -> None:
    handle, acc, _ = source()
    backend = restored(handle, acc)
    assert sorted(backend.get_keys("c")) == list(range(N))  # not registered yet
    register(backend)
    assert sorted(backend.get_keys("c")) == list(range(N))
    backend.dispose()


def test_ttl_full_snapshot_cleanup_decodes_at_registration() -> None:
    desc = ValueStateDescriptor("t", Types.LONG())
    desc.enable_time_to_live(StateTtlConfig.new_builder(60_000).cleanup_full_snapshot().build())
    backend = make()
    state = backend.get_partitioned_state(desc)
    for key in range(N):
        backend.set_current_key(key)
        state.update(key)
    acc = access()
    handle = checkpoint(backend, acc, 1)
    backend.dispose()
    fresh = restored(handle, acc)
    state = fresh.get_partitioned_state(desc)
    assert fresh.pending_restore() == 0  # expired entries must be dropped when written
    fresh.set_current_key(9)
    assert state.value() == 9
    fresh.dispose()


def test_lazy_restore_can_be_turned_off() -> None:
    handle, acc, expected = source()
    backend = restored(handle, acc, lazy_restore=False)
    assert backend.pending_restore() == 0
    assert dump(backend, range(N)) == expected
    backend.dispose()


def test_dispose_ends_the_background_thread(no_decoder: None) -> None:
    handle, acc, _ = source()
    backend = restored(handle, acc)
    register(backend)
    assert lazy_threads()
    backend.dispose()
    assert not lazy_threads()


# --- hostile parts (their checksums intact: forged, not damaged in transit) --------------------------


def forged(part: bytes, heads: list[list[int]] | None = None
           ) -> tuple[dict[str, Any], CheckpointStorageAccess]:
    """A handle whose state "c" is the one given part (its checksum intact), with the given
    heads (none: as written before heads were recorded)."""
    handle, acc, _ = source(n=20)
    streams = acc.streams(5, "t")
    data, locations = streams.write_parts([part], state_name="c")
    entry = {**handle["states"]["c"], "data": data, "parts": locations}
    entry.pop("heads")
    entry.pop("groups")  # as written before parts recorded their key groups
    if heads is not None:
        entry["heads"] = heads
    return {**handle, "states": {"c": entry}}, acc


def head_of(part: bytes, size: int | None = None) -> list[list[int]]:
    size = pair_head_length(part) if size is None else size
    return [[size, zlib.crc32(part[:size])]]


@pytest.mark.parametrize("part", [
    packb([1, 2]),
    packb([[1, 2, 3]]),
    packb([[1, 2], [1]]),
    packb([[1, 2], 7]),
    b"\x92\xc1",
    packb([[1, 2], [1, 2]])[:-1],
], ids=["not-arrays", "not-a-pair", "counts-differ", "values-not-an-array", "bad-byte",
        "truncated"])
def test_a_malformed_part_head_fails_the_restore(part: bytes) -> None:
    handle, acc = forged(part)  # read whole at restore (no heads recorded)
    backend = make()
    with pytest.raises(CorruptCheckpointError):
        backend.restore([handle], acc.reader())
        backend.get_partitioned_state(COUNT)
        backend.finish_restore()
    backend.dispose()


@pytest.mark.parametrize("use", ["access", "snapshot", "keys", "finish"])
def test_a_key_outside_the_recorded_key_groups_is_refused_before_use(no_decoder: None,
                                                                     use: str) -> None:
    part = packb([[1, 2], [1, 2]])
    handle, acc = forged(part, head_of(part))
    handle = {**handle, "key_group_range": [0, 0]}
    backend = make(rng=KeyGroupRange(0, 0))
    backend.restore([handle], acc.reader())  # the whole range: checked before first use
    state = backend.get_partitioned_state(COUNT)
    with pytest.raises(CorruptCheckpointError, match="outside the key groups"):
        if use == "access":
            backend.set_current_key(1)
            state.value()
        elif use == "snapshot":
            backend.snapshot(2, acc.streams(2, "t")).run()
        elif use == "keys":
            list(backend.get_keys("c"))
        else:
            backend.finish_restore()
    backend.dispose()


def test_a_key_outside_the_recorded_key_groups_fails_a_rescaling_restore() -> None:
    part = packb([[1, 2], [1, 2]])
    handle, acc = forged(part, head_of(part))
    handle = {**handle, "key_group_range": [0, 1]}
    backend = make(rng=KeyGroupRange(0, 0))  # part of the range: the keys are sorted out now
    with pytest.raises(CorruptCheckpointError, match="outside the key groups"):
        backend.restore([handle], acc.reader())
    backend.dispose()


def test_a_key_restored_twice_fails_the_restore() -> None:
    part = packb([[1, 1], [1, 2]])
    handle, acc = forged(part, head_of(part))
    backend = make()
    with pytest.raises(CorruptCheckpointError, match="twice"):
        backend.restore([handle], acc.reader())
    backend.dispose()


@pytest.mark.parametrize("values", [b"\x92\xc1\xc1", packb(["x", "y"]), b"\x92\x01"],
                         ids=["bad-bytes", "wrong-type", "truncated"])
@pytest.mark.parametrize("with_heads", [True, False])
def test_damaged_values_are_refused_where_they_are_needed(no_decoder: None, values: bytes,
                                                          with_heads: bool) -> None:
    part = b"\x92" + packb([1, 2]) + values
    handle, acc = forged(part, head_of(part) if with_heads else None)
    backend = make()
    backend.restore([handle], acc.reader())  # the keys are sound: restored lazily
    state = backend.get_partitioned_state(COUNT)
    backend.set_current_key(1)
    with pytest.raises(CorruptCheckpointError):
        state.value()
    with pytest.raises(CorruptCheckpointError):  # never written into a new snapshot
        backend.snapshot(2, acc.streams(2, "t")).run()
    backend.dispose()


def test_damaged_values_found_by_the_background_thread_surface_at_the_next_access() -> None:
    part = b"\x92" + packb([1, 2]) + b"\x92\xc1\xc1"
    handle, acc = forged(part, head_of(part))
    backend = make()
    backend.restore([handle], acc.reader())
    backend.get_partitioned_state(COUNT)
    part = next(iter(backend.tables["c"].lazy.parts.values()))
    deadline = time.monotonic() + 30
    while not part.failed and time.monotonic() < deadline:
        time.sleep(0.001)
    assert part.failed
    with pytest.raises(CorruptCheckpointError):
        backend.prepare_snapshot()  # any slow path takes the failed part and raises
    backend.dispose()


@pytest.mark.parametrize("heads", [
    [[3, 0]], [[1, 0]], [[10**6, 0]], [[2, 1, 3]], [["x", 0]],
], ids=["wrong-crc", "too-short", "past-the-part", "three-numbers", "not-a-number"])
def test_malformed_heads_fail_the_restore(heads: list[Any]) -> None:
    part = packb([[1, 2], [1, 2]])
    handle, acc = forged(part, heads)
    backend = make()
    with pytest.raises(CorruptCheckpointError):
        backend.restore([handle], acc.reader())
    backend.dispose()


@pytest.mark.parametrize("size", [2, 4], ids=["cuts-the-keys", "reaches-into-the-values"])
def test_a_head_that_is_not_exactly_the_keys_fails_the_restore(size: int) -> None:
    part = packb([[1, 2], [1, 2]])  # the head is 4 bytes: 0x92, 0x92, 1, 2
    handle, acc = forged(part, head_of(part, size if size != 4 else 5))
    backend = make()
    with pytest.raises(CorruptCheckpointError):
        backend.restore([handle], acc.reader())
    backend.dispose()


def test_a_part_that_differs_from_its_head_is_refused_when_read(no_decoder: None) -> None:
    part = packb([[1, 2], [1, 2]])
    handle, acc = forged(part, head_of(part))
    backend = make()
    backend.restore([handle], acc.reader())
    state = backend.get_partitioned_state(COUNT)
    (lazy_part,) = backend.tables["c"].lazy.parts.values()
    lazy_part.load = lambda: packb([[2, 1], [1, 2]])  # the file changed since the head was read
    backend.set_current_key(1)
    with pytest.raises(CorruptCheckpointError, match="differs from its head"):
        state.value()
    backend.dispose()


@pytest.mark.parametrize("key_type", ["int", "str"])
def test_the_key_index_is_never_walked_by_the_garbage_collector(no_decoder: None,
                                                                key_type: str) -> None:
    """Restored keys map to their parts' numbers, not to the parts: a dict of plain keys and
    ints holds no object the collector tracks, so it is never walked (a walk of 10^7 entries
    paused the first element for 0.1 s); the keys still find their parts."""
    import gc

    text = ValueStateDescriptor("s", Types.STRING())
    key_ser = serializer_for(Types.STRING() if key_type == "str" else Types.LONG())

    def with_keys() -> HeapKeyedStateBackend:
        return HashMapStateBackend().create_keyed_state_backend(
            key_serializer=key_ser, key_group_range=KeyGroupRange.all(MAXP), max_parallelism=MAXP)

    backend = with_keys()
    state = backend.get_partitioned_state(text)
    keys = [f"k{i}" if key_type == "str" else i for i in range(300)]
    for key in keys:
        backend.set_current_key(key)
        state.update(f"v{key}")
    acc = access()
    handle = checkpoint(backend, acc, 1)
    backend.dispose()
    fresh = with_keys()
    fresh.restore([handle], acc.reader())
    restored_state = fresh.get_partitioned_state(text)
    lazy = fresh.tables["s"].lazy
    assert lazy is not None and len(lazy.pending) == 300 and not gc.is_tracked(lazy.pending)
    for key in reversed(keys):
        fresh.set_current_key(key)
        assert restored_state.value() == f"v{key}"
    assert fresh.pending_restore() == 0
    fresh.dispose()


def test_a_restore_reads_only_the_heads(no_decoder: None, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    monkeypatch.setattr(plainparts, "PLAIN_PART_BYTES", 8192)
    text = ValueStateDescriptor("s", Types.STRING())
    backend = make()
    state = backend.get_partitioned_state(text)
    for key in range(2000):
        backend.set_current_key(key)
        state.update(f"{key:050d}")
    acc = access()
    handle = checkpoint(backend, acc, 1)
    backend.dispose()
    reader = acc.reader()  # counts the bytes it reads
    fresh = make()
    fresh.restore([handle], reader)
    fresh.get_partitioned_state(text)
    total = sum(length for _, length, _ in handle["states"]["s"]["parts"])
    assert len(handle["states"]["s"]["parts"]) > 3
    assert reader.bytes_read < total / 10  # the keys (1-3 bytes each), not the values (51)
    fresh.set_current_key(1999)
    assert fresh.get_partitioned_state(text).value() == f"{1999:050d}"
    fresh.dispose()


def test_entries_without_heads_restore_lazily_from_whole_parts(no_decoder: None) -> None:
    handle, acc, expected = source()
    for entry in handle["states"].values():
        entry.pop("heads")
    backend = restored(handle, acc)
    register(backend)
    assert backend.pending_restore() == 4 * N
    assert dump(backend, range(N)) == expected
    backend.dispose()


def _no_fork(*args: Any) -> Any:
    raise AssertionError("forked")


@pytest.mark.parametrize("mode", ["thread", "fork"])
def test_restored_files_may_go_once_a_checkpoint_completed(
        no_decoder: None, mode: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from statekit import FileSystemCheckpointStorage

    acc = FileSystemCheckpointStorage(str(tmp_path / "ck"), 0).create_access("job")
    backend = make()
    populate(backend, N)
    handle = checkpoint(backend, acc, 1)
    expected = dump(backend, range(N))
    backend.dispose()
    fresh = restored(handle, acc, snapshot_mode=mode)
    register(fresh)
    if mode == "fork":  # values still only on disk: no child reads them behind other threads
        monkeypatch.setattr(snapshot_module, "fork_serialize", _no_fork)
    checkpoint(fresh, acc, 2)
    gone = [p for p in (tmp_path / "ck").rglob("*") if p.is_file() and "chk-1" in str(p)]
    assert len(gone) > 1  # the metadata and the state files
    for path in gone:  # checkpoint 1's files, as retention removes them
        path.unlink()
    assert dump(fresh, range(N)) == expected
    fresh.dispose()


def test_a_backend_dropped_without_dispose_ends_its_decoder() -> None:
    """The decoder thread holds the parts' bytes and waits for the processing thread to install
    what it decoded: a backend collected without :meth:`dispose` ends it too."""
    handle, acc, _ = source()
    backend = restored(handle, acc)
    register(backend)
    assert lazy_threads()
    del backend
    gc.collect()
    deadline = time.monotonic() + 10
    while lazy_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lazy_threads()
