"""Heap snapshots in key-group order: each plain part records the key groups of its keys, and a
restore reads only the parts that meet its own key groups (a rescale reads each byte once).

Flink's heap backend writes its snapshot per key group with offsets and a rescaling restore reads
only its own groups' ranges; these tests hold statekit's heap backend to that: parts sorted and
labelled, skipped by every restore path (lazy, eager, into RocksDB), labels carried through
checkpoints of a partly decoded state, and forged labels refused.
"""

from __future__ import annotations

import random
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    EmbeddedRocksDBStateBackend,
    HashMapStateBackend,
    Types,
)
from statekit.backends import plaingroups, plainparts
from statekit.backends.heap import lazy as lazy_module
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.reader import StateReader
from statekit.errors import ConfigError, CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.keys import plain_key_groups
from statekit.serde.msgpack import unpackb
from statekit.serde.types import serializer_for
from tests.backends.test_heap_lazy_restore import make
from tests.backends.test_heap_lazy_restore import source as lazy_source
from tests.backends.test_heap_snapshots import COUNT, LIST, MAP, VALUE, dump, populate

MAXP = 16
N = 600
LOW, HIGH = KeyGroupRange(0, 7), KeyGroupRange(8, MAXP - 1)


_ROOT: list[Path] = []


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Small parts, and a part per key group: every label is exact; checkpoints in files under
    ``tmp_path`` (their readers count the bytes they read)."""
    _ROOT[:] = [tmp_path]
    monkeypatch.setattr(plainparts, "PLAIN_PART_BYTES", 400)
    monkeypatch.setattr(plainparts, "PACED_PART_BYTES", 400)
    monkeypatch.setattr(plainparts, "_FIRST_PART_ENTRIES", 16)
    monkeypatch.setattr(plaingroups, "MIN_PART_BYTES", 400)


def storage() -> CheckpointStorageAccess:
    where = _ROOT[0] / uuid.uuid4().hex
    where.mkdir()
    return CheckpointStorageAccess(LocalBlobStore(str(where)), str(where), 0)


def checkpoint(backend: Any, acc: CheckpointStorageAccess, cid: int) -> dict[str, Any]:
    handle = backend.snapshot(cid, acc.streams(cid, "t")).run()
    acc.commit(cid, {"tasks": {"t": handle}})
    backend.notify_checkpoint_complete(cid)
    if len(backend.key_group_range) < MAXP:  # one task of several: the job's metadata is partial
        return handle
    return acc.load(cid)["tasks"]["t"]  # through the metadata checks


def source(**kw: Any) -> tuple[dict[str, Any], CheckpointStorageAccess, dict]:
    """A checkpoint of every key group, written by key group unless ``kw`` says otherwise."""
    return lazy_source(N, storage(), **{"key_group_order": True, **kw})


def in_range(expected: dict, rng: KeyGroupRange) -> dict:
    """The entries of ``expected`` whose keys lie in ``rng``."""
    groups = dict(zip(range(N), plain_key_groups(list(range(N)), MAXP).tolist(), strict=True))
    return {name: {k: v for k, v in entries.items() if groups[k] in rng}
            for name, entries in expected.items()}


def restored(handle: dict[str, Any], acc: CheckpointStorageAccess, rng: KeyGroupRange,
             **kw: Any) -> tuple[Any, StateReader]:
    backend = make(rng, **kw)
    reader = acc.reader()
    backend.restore([handle], reader)
    return backend, reader


def entry_bytes(handle: dict[str, Any]) -> int:
    return sum(int(e["data"]["size"]) for e in handle["states"].values())


def test_parts_are_written_by_key_group_each_with_its_key_groups() -> None:
    handle, acc, _ = source()
    reader = acc.reader()
    for name, entry in handle["states"].items():
        groups = entry["groups"]
        assert len(groups) == len(entry["parts"]) >= MAXP
        assert all(lo == hi for lo, hi in groups)  # a bucket per key group here
        assert sorted({lo for lo, _ in groups}) == list(range(MAXP))
        for (offset, length, crc), (lo, hi) in zip(entry["parts"], groups, strict=True):
            keys, _ = unpackb(reader.read(entry["data"], offset, length, crc))
            assert set(plain_key_groups(keys, MAXP).tolist()) <= set(range(lo, hi + 1)), name


def test_without_key_group_order_parts_record_the_whole_range() -> None:
    handle, acc, expected = source(key_group_order=False)
    for entry in handle["states"].values():
        assert {tuple(g) for g in entry["groups"]} == {(0, MAXP - 1)}
    backend, reader = restored(handle, acc, LOW)
    assert dump(backend, range(N)) == in_range(expected, LOW)
    assert reader.bytes_read >= entry_bytes(handle)  # every part is read
    backend.dispose()


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_a_rescaling_restore_reads_only_the_parts_of_its_key_groups(lazy: bool) -> None:
    handle, acc, expected = source()
    total = entry_bytes(handle)
    for rng in (LOW, HIGH, KeyGroupRange(5, 5)):
        backend, reader = restored(handle, acc, rng, lazy_restore=lazy)
        assert dump(backend, range(N)) == in_range(expected, rng)
        share = len(range(rng.start, rng.end + 1)) / MAXP
        assert reader.bytes_read <= total * (share + 0.2), (rng, reader.bytes_read, total)
        backend.dispose()


def test_a_partly_decoded_state_keeps_its_labels_through_checkpoints() -> None:
    """Parts written through unread keep their key groups; a second rescale reads only its own."""
    handle, acc, expected = source()
    half, _ = restored(handle, acc, LOW)
    for descriptor in (VALUE, LIST, MAP, COUNT):
        half.get_partitioned_state(descriptor)
    assert half.pending_restore() > 0
    again = checkpoint(half, acc, 2)  # pending parts written through
    half.dispose()
    for entry in again["states"].values():
        assert all(LOW.start <= lo <= hi <= LOW.end for lo, hi in entry["groups"])
    quarter = KeyGroupRange(0, 3)
    backend, reader = restored(again, acc, quarter)
    assert dump(backend, range(N)) == in_range(expected, quarter)
    assert reader.bytes_read <= entry_bytes(again) * 0.65
    backend.dispose()


def test_a_heap_snapshot_switches_to_rocksdb_reading_only_its_key_groups(tmp_path: Any) -> None:
    handle, acc, expected = source()
    factory = EmbeddedRocksDBStateBackend()
    factory.set_db_storage_paths(str(tmp_path))
    backend = factory.create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()), key_group_range=HIGH, max_parallelism=MAXP)
    reader = acc.reader()
    backend.restore([handle], reader)
    assert dump(backend, range(N)) == in_range(expected, HIGH)
    assert reader.bytes_read <= entry_bytes(handle) * 0.65
    backend.dispose()


@pytest.mark.parametrize("groups", [
    "missing-one", [[0, 0]], "first-after-last", "outside", "not-ints", "not-pairs", "negative",
])
def test_malformed_part_key_groups_are_refused_when_the_metadata_is_read(groups: Any) -> None:
    handle, acc, _ = source()
    entry = handle["states"]["c"]
    count = len(entry["parts"])
    edits = {
        "missing-one": entry["groups"][:-1],
        "first-after-last": [[3, 2]] * count,
        "outside": [[0, MAXP]] * count,
        "not-ints": [["0", "1"]] * count,
        "not-pairs": [[0, 1, 2]] * count,
        "negative": [[-1, 0]] * count,
    }
    forged = {**handle, "states": {**handle["states"], "c": {
        **entry, "groups": edits.get(groups, groups) if isinstance(groups, str) else groups}}}
    acc.commit(7, {"tasks": {"t": forged}})
    with pytest.raises(CorruptCheckpointError, match="groups"):
        acc.load(7)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("rng", [LOW, KeyGroupRange.all(MAXP)], ids=["rescale", "whole"])
def test_a_key_outside_its_parts_key_groups_is_refused(lazy: bool, rng: KeyGroupRange) -> None:
    """Labels swapped between parts (each inside the recorded range, so the metadata passes):
    keys no longer lie in their part's key groups, and the restore refuses them."""
    handle, acc, _ = source()
    entry = handle["states"]["c"]
    swapped = list(reversed(entry["groups"]))
    forged = {**handle, "states": {**handle["states"], "c": {**entry, "groups": swapped}}}
    acc.commit(8, {"tasks": {"t": forged}})
    forged = acc.load(8)["tasks"]["t"]
    backend = make(rng, lazy_restore=lazy)
    with pytest.raises(CorruptCheckpointError, match="outside the key groups"):
        backend.restore([forged], acc.reader())
        backend.finish_restore()
    backend.dispose()


def test_the_order_is_a_setting_auto_by_default() -> None:
    """``auto``: a task holding part of the key groups writes by key group, a task holding all
    of them in table order; ``true`` and ``false`` hold everywhere; anything else is refused."""
    assert HashMapStateBackend().get_key_group_order() == "auto"
    for setting, whole, part in (("auto", False, True), ("true", True, True),
                                 ("false", False, False)):
        factory = HashMapStateBackend().configure(
            {"state.backend.heap.snapshot-key-group-order": setting})
        for rng, ordered in ((KeyGroupRange.all(MAXP), whole), (LOW, part)):
            backend = factory.create_keyed_state_backend(
                key_serializer=serializer_for(Types.LONG()), key_group_range=rng,
                max_parallelism=MAXP)
            populate(backend, N)
            acc = storage()
            handle = checkpoint(backend, acc, 1)
            labels = {tuple(g) for e in handle["states"].values() for g in e["groups"]}
            assert (labels == {(rng.start, rng.end)}) is not ordered, (setting, rng)
            backend.dispose()
    with pytest.raises(ConfigError, match="snapshot-key-group-order"):
        HashMapStateBackend().configure({"state.backend.heap.snapshot-key-group-order": "maybe"})
    with pytest.raises(ConfigError, match="snapshot-key-group-order"):
        HashMapStateBackend(key_group_order="sorted")


def test_an_asynchronous_snapshot_in_key_group_order_holds_its_capture() -> None:
    """An asynchronous snapshot written while the processing thread changes the state: the sorted
    parts hold exactly the captured state."""
    backend = make(key_group_order=True)
    populate(backend, N)
    expected = dump(backend, range(N))
    acc = storage()
    run = backend.snapshot(1, acc.streams(1, "t"))
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("h", run.run()))
    thread.start()
    state = backend.get_partitioned_state(COUNT)
    for k in random.Random(3).sample(range(N * 2), N):
        backend.set_current_key(k)
        state.update(-k)
    thread.join()
    acc.commit(1, {"tasks": {"t": out["h"]}})
    backend.dispose()
    fresh, _ = restored(acc.load(1)["tasks"]["t"], acc, KeyGroupRange.all(MAXP))
    assert dump(fresh, range(N * 2)) == expected
    fresh.dispose()


def test_no_part_is_read_twice_by_an_access_and_the_background_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys accessed against the background thread's order while it reads ahead: every part is
    read once, by whichever comes first, and the restore is exact."""
    monkeypatch.setattr(lazy_module, "RUN_BYTES", 4000)
    handle, acc, expected = source()
    backend, reader = restored(handle, acc, KeyGroupRange.all(MAXP))
    assert dump(backend, list(reversed(range(N)))) == expected
    backend.finish_restore()
    heads = sum(h[0] for e in handle["states"].values() for h in e["heads"])
    assert reader.bytes_read <= entry_bytes(handle) + heads
    backend.dispose()
