"""A rescaling RocksDB restore reads, of the checkpoints it copies keys from, only the SST files
holding its key groups: which ones, each checkpoint's MANIFEST tells; RocksDB's repair builds a
database of them.  Exact in every case, and a damaged or inconsistent checkpoint is refused, never
restored short of keys."""

from __future__ import annotations

import functools
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options

from statekit import EmbeddedRocksDBStateBackend
from statekit.backends.rocksdb.nativefiles import Subset
from statekit.checkpoint.handles import file_path
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from tests.backends.test_rocksdb import SHM, checkpoint, keyed, storage_access

VALUE = ValueStateDescriptor("v", Types.STRING())
LIST = ListStateDescriptor("l", Types.INT())
MAP = MapStateDescriptor("m", Types.STRING(), Types.INT())
LOW = ValueStateDescriptor("low", Types.INT())  # keys of key groups 0..15 only
KEYS = 3000
SMALL_FILES = {"state.backend.rocksdb.compaction.level.target-file-size-base": "256 kb",
               "state.backend.rocksdb.writebuffer.size": "256 kb"}


def backend(incremental: bool = False) -> EmbeddedRocksDBStateBackend:
    made = EmbeddedRocksDBStateBackend(incremental).configure(SMALL_FILES)
    if SHM:
        made.set_db_storage_paths(SHM)
    return made


def write(kb: Any, keys: range) -> dict[str, tuple]:
    """Every state of ``keys`` (values random, so files keep their size); what they hold."""
    value, lst, mp, low = (kb.get_partitioned_state(d) for d in (VALUE, LIST, MAP, LOW))
    want = {}
    for i in keys:
        key = f"key-{i}"
        kb.set_current_key(key)
        text = os.urandom(400).hex()
        value.update(text)
        lst.add_all([i, i + 1])
        mp.put_all({"a": i, "b": -i})
        if kb.key_group_of(key) < 16:
            low.update(i)
        want[key] = (text, [i, i + 1], {"a": i, "b": -i}, i if kb.key_group_of(key) < 16 else None)
    return want


def contents(kb: Any, keys: list[str]) -> dict[str, tuple]:
    value, lst, mp, low = (kb.get_partitioned_state(d) for d in (VALUE, LIST, MAP, LOW))
    out = {}
    for key in keys:
        kb.set_current_key(key)
        out[key] = (value.value(), list(lst.get() or []), dict(mp.items()), low.value())
    return out


def settled(kb: Any) -> None:
    """Every column family compacted: its files lie in key-group order at the bottom level."""
    for name in list(kb.cfs):
        kb.cf(name).compact_range(None, None)


def built(tmp_path: Path, kind: str = "filesystem", incremental: bool = False
          ) -> tuple[Any, Any, dict]:
    """Checkpoint storage, a checkpoint of every state of ``KEYS`` keys, and what it holds."""
    access = storage_access(tmp_path, kind)
    kb = keyed(backend(incremental))
    try:
        want = write(kb, range(KEYS))
        settled(kb)
        handle, _ = checkpoint(kb, access, 1)
    finally:
        kb.dispose()
    return access, handle, want


def sst_bytes(*handles: dict[str, Any]) -> int:
    return sum(h["size"] for handle in handles for h in handle["sst"].values())


def restored(handles: list[dict[str, Any]], access: Any, rng: KeyGroupRange,
             incremental: bool = False) -> tuple[Any, int]:
    """A backend of ``rng`` restored from ``handles``, and the bytes its restore read."""
    kb = keyed(backend(incremental), rng)
    reader = access.reader()
    kb.restore(handles, reader)
    kb.finish_restore()
    return kb, reader.bytes_read


def mine(want: dict[str, tuple], kb: Any) -> dict[str, tuple]:
    empty = (None, [], {}, None)
    return {k: (v if kb.key_group_of(k) in kb.key_group_range else empty) for k, v in want.items()}


HALVES = [KeyGroupRange(0, 63), KeyGroupRange(64, 127)]


def halves(tmp_path: Path, kind: str = "filesystem", incremental: bool = False
           ) -> tuple[Any, list[dict[str, Any]], dict]:
    """Storage, checkpoints of two partitions (key groups 0..63 and 64..127), what they hold."""
    access, handle, want = built(tmp_path, kind, incremental)
    out = []
    for cid, rng in enumerate(HALVES, start=2):
        kb, _ = restored([handle], access, rng, incremental)
        try:
            settled(kb)
            out.append(checkpoint(kb, access, cid)[0])
            assert len(out[-1]["sst"]) >= 5
        finally:
            kb.dispose()
    return access, out, want


@pytest.mark.parametrize(("rng", "kind", "incremental"), [
    (KeyGroupRange(32, 95), "filesystem", False), (KeyGroupRange(0, 95), "filesystem", False),
    (KeyGroupRange(48, 127), "filesystem", False), (KeyGroupRange(32, 95), "filesystem", True),
    (KeyGroupRange(48, 127), "jobmanager", False)])
def test_a_rescale_reads_only_the_files_of_its_key_groups_from_the_partitions_it_copies(
        tmp_path, rng, kind, incremental):
    access, parts, want = halves(tmp_path, kind, incremental)
    kb, read = restored(parts, access, rng, incremental)
    try:
        assert contents(kb, list(want)) == mine(want, kb)
        overlaps = [len(rng.intersection(h)) for h in HALVES]
        base = max(range(2), key=lambda i: overlaps[i])  # taken whole; the other copied from
        other = 1 - base
        bound = sst_bytes(parts[base]) + sst_bytes(parts[other]) * (overlaps[other] / 64 + 0.25)
        counted = kind == "filesystem"  # the job manager's in-memory files count no reads
        assert read <= bound and (read > 0) == counted, (read, bound)
        for key in kb.cfs["v"].keys():  # noqa: SIM118 - an Rdict: no foreign key is visible
            assert int.from_bytes(key[:2], "big") in rng
        again, _ = checkpoint(kb, access, 9)  # and its checkpoint restores exactly
    finally:
        kb.dispose()
    back, _ = restored([again], access, rng)
    try:
        assert contents(back, list(want)) == mine(want, back)
    finally:
        back.dispose()
    whole, read = restored(parts, access, KeyGroupRange(0, 127))  # the sources are intact
    try:
        assert read >= sst_bytes(*parts) or not counted  # a restart reads every file
        assert contents(whole, list(want)) == want
    finally:
        whole.dispose()


def test_a_state_without_keys_in_the_files_kept_restores_empty_and_stays_usable(tmp_path):
    access, parts, want = halves(tmp_path)
    rng = KeyGroupRange(48, 127)  # of the lower half, no file of 'low' (key groups 0..15)
    kb, read = restored(parts, access, rng)
    try:
        assert read < sst_bytes(parts[1]) + 0.6 * sst_bytes(parts[0])
        assert contents(kb, list(want)) == mine(want, kb)
        key = next(k for k in want if kb.key_group_of(k) in rng)
        kb.set_current_key(key)
        low = kb.get_partitioned_state(LOW)
        assert low.value() is None
        low.update(7)
        again, _ = checkpoint(kb, access, 9)
    finally:
        kb.dispose()
    back, _ = restored([again], access, rng)
    try:
        back.set_current_key(key)
        assert back.get_partitioned_state(LOW).value() == 7
    finally:
        back.dispose()


def refused(parts: list[dict[str, Any]], access: Any, match: str) -> None:
    """A restore of key groups 48..127 (a copy from the lower half) fails, naming the damage."""
    kb = keyed(backend(), KeyGroupRange(48, 127))
    try:
        with pytest.raises(CorruptCheckpointError, match=match):
            kb.restore(parts, access.reader())
    finally:
        kb.dispose()


def test_a_manifest_naming_a_file_its_handle_lacks_is_refused(tmp_path):
    access, parts, _ = halves(tmp_path)
    parts[0]["sst"].pop(sorted(parts[0]["sst"])[-1])
    refused(parts, access, "MANIFEST")


def test_a_kept_file_rocksdb_cannot_read_is_refused_not_left_out(tmp_path):
    """Files whose size and CRC-32 match their handles but whose bytes are not tables: repair
    would set them aside and build the database without their keys."""
    access, parts, _ = halves(tmp_path)
    for entry in parts[0]["sst"].values():
        data = os.urandom(4096)
        if entry["type"] == "inline":
            entry["data"] = data
        else:
            (Path(access.location) / file_path(entry)).write_bytes(data)
        entry.update(size=len(data), crc=zlib.crc32(data))
    refused(parts, access, "left out")


def test_a_damaged_manifest_is_refused(tmp_path):
    access, parts, _ = halves(tmp_path)
    name = next(n for n in parts[0]["misc"] if n.startswith("MANIFEST-"))
    entry = parts[0]["misc"][name]
    assert entry["type"] == "inline"
    data = bytearray(entry["data"])
    data[len(data) // 2] ^= 0xFF
    entry["data"] = bytes(data)  # the CRC-32 no longer matches
    refused(parts, access, "checksum|CRC")


def test_a_checkpoint_with_entries_in_its_logs_is_read_whole(tmp_path):
    """Repair would replay a log's entries over files that may hold newer, compacted values."""
    access, parts, _ = halves(tmp_path)
    handle = parts[0]
    plan = functools.partial(Subset.plan, reader=access.reader(), want=KeyGroupRange(48, 63),
                             max_parallelism=128, options_factory=lambda: Options(raw_mode=True),
                             probe=tmp_path / "probe")
    assert plan(handle) is not None
    log = next(n for n in handle["misc"] if n.endswith(".log"))
    data = b"\x00" * 64
    handle["misc"][log] = {"type": "inline", "data": data, "size": len(data),
                           "crc": zlib.crc32(data)}
    assert plan(handle) is None
    assert plan({**parts[1], "changelog": {"segments": []}}) is None
