"""Lazy RocksDB restore: the database opens as soon as a checkpoint's files are in place, and
the SST files hard-linked from checkpoint storage on the same disk are checked against their
CRC-32 by a background thread.  Until the check ends, point reads run (RocksDB checks each block
it reads), scans and checkpoints wait for it; a damaged file fails the next state access, the
next checkpoint and ``finish_restore``, typed; a local copy is always checked before use.

The checkpoint storage and the RocksDB working directories share one file system here (the
test's temporary directory), so the restore links the files as it does on one machine's disk.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.checkpoint import reader as reader_module
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import ChecksumMismatchError, ConfigError, CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types
from statekit.state.descriptors import MapStateDescriptor, ValueStateDescriptor

VALUE = ValueStateDescriptor("v", Types.LONG())
MAP = MapStateDescriptor("m", Types.LONG(), Types.STRING())
KEYS = 3000


def _factory(root: Path, name: str, lazy: bool | None = None) -> EmbeddedRocksDBStateBackend:
    f = EmbeddedRocksDBStateBackend(True, lazy_restore=lazy)
    f.set_db_storage_paths(str(root / "work" / name))  # the checkpoints' file system: links
    return f


def _keyed(f: EmbeddedRocksDBStateBackend) -> Any:
    return f.create_keyed_state_backend(key_serializer=Types.LONG().get_serializer(),
                                        key_group_range=KeyGroupRange(0, 127), max_parallelism=128)


@pytest.fixture
def checkpoint(tmp_path):
    """A completed checkpoint of KEYS keys (a value and a two-entry map each): access, handle."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"), file_state_size_threshold=64)
    access = storage.create_access("job")
    kb = _keyed(_factory(tmp_path, "writer"))
    try:
        value, entries = kb.get_partitioned_state(VALUE), kb.get_partitioned_state(MAP)
        for k in range(KEYS):
            kb.set_current_key(k)
            value.update(k * 10)
            entries.put_all({1: f"a{k}", 2: f"b{k}"})
        handle = kb.snapshot(1, access.streams(1, "t0")).run()
        access.commit(1, {"tasks": {"t0": handle}})
    finally:
        kb.dispose()
    return access, handle


def _sst_paths(access: Any, handle: dict[str, Any]) -> list[Path]:
    return [Path(access.store.root) / h["path"] for h in handle["sst"].values()
            if h["type"] == "file"]


@pytest.fixture
def held(monkeypatch):
    """Holds every background file check until ``release()``: the test sees the window."""
    gate = threading.Event()
    started = threading.Event()
    original = reader_module.FileCheck.run

    def run(self: Any) -> None:
        started.set()
        assert gate.wait(30)
        original(self)

    monkeypatch.setattr(reader_module.FileCheck, "run", run)
    yield gate
    gate.set()


def _restore(tmp_path: Path, access: Any, handle: dict[str, Any], name: str = "r",
             lazy: bool | None = None) -> Any:
    kb = _keyed(_factory(tmp_path, name, lazy))
    kb.restore([handle], access.reader())
    return kb


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damaged_restore(tmp_path: Path, access: Any, handle: dict[str, Any]) -> Any:
    """A lazy restore of the checkpoint with a byte in the middle of every SST file flipped."""
    for path in _sst_paths(access, handle):
        _flip_middle(path)
    return _restore(tmp_path, access, handle)


def test_point_reads_run_while_the_files_are_checked_scans_and_checkpoints_wait(
        tmp_path, checkpoint, held):
    access, handle = checkpoint
    kb = _restore(tmp_path, access, handle)
    try:
        assert kb.pending_restore() == len(_sst_paths(access, handle)) > 0
        value, entries = kb.get_partitioned_state(VALUE), kb.get_partitioned_state(MAP)
        kb.set_current_key(7)
        assert value.value() == 70  # a point read: at once
        assert entries.get(2) == "b7"
        value.update(71)  # and writes
        scanned: list[Any] = []
        scan = threading.Thread(target=lambda: scanned.append(dict(entries.items())))
        scan.start()
        time.sleep(0.2)
        assert scan.is_alive() and not scanned  # an iteration waits for the check
        done: list[Any] = []
        snap = threading.Thread(target=lambda: done.append(
            kb.snapshot(2, access.streams(2, "t0")).run()))
        snap.start()
        time.sleep(0.2)
        assert snap.is_alive() and not done  # and so does a checkpoint
        held.set()
        scan.join(10)
        snap.join(10)
        assert scanned == [{1: "a7", 2: "b7"}] and done
        kb.finish_restore()
        assert kb.pending_restore() == 0
        assert sorted(kb.get_keys("v")) == list(range(KEYS))
    finally:
        kb.dispose()


def test_a_damaged_file_fails_the_next_access_checkpoint_and_finish(tmp_path, checkpoint, held):
    access, handle = checkpoint
    kb = _damaged_restore(tmp_path, access, handle)  # opens: the damage is in the data blocks
    held.set()
    try:
        with pytest.raises(ChecksumMismatchError):
            kb.finish_restore()
        assert kb.pending_restore() == 0
        value = None
        with pytest.raises(CorruptCheckpointError):
            value = kb.get_partitioned_state(VALUE)
            kb.set_current_key(1)
            value.value()
        with pytest.raises(CorruptCheckpointError):
            kb.snapshot(2, access.streams(2, "t0")).run()
    finally:
        kb.dispose()
    assert access.completed() == [1]


def test_damage_found_by_the_check_fails_states_already_in_use(tmp_path, checkpoint, held):
    access, handle = checkpoint
    paths = _sst_paths(access, handle)
    kb = _restore(tmp_path, access, handle)
    try:
        value = kb.get_partitioned_state(VALUE)
        kb.set_current_key(3)
        assert value.value() == 30
        for path in paths:  # damaged after the restore: only the check can tell
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            with open(path, "r+b") as fh:
                fh.seek(len(data) - 1)
                fh.write(data[-1:])
        held.set()
        with pytest.raises(CorruptCheckpointError):
            kb.finish_restore()
        with pytest.raises(CorruptCheckpointError):
            value.value()
        with pytest.raises(CorruptCheckpointError):
            kb.get_partitioned_state(MAP)
    finally:
        kb.dispose()


def test_a_damaged_data_block_is_a_typed_error_at_the_point_read(tmp_path, checkpoint, held):
    """Before the check reaches a file, RocksDB's own block checksum refuses a damaged block."""
    access, handle = checkpoint
    kb = _damaged_restore(tmp_path, access, handle)
    try:
        value = kb.get_partitioned_state(VALUE)
        failures = 0
        for k in range(KEYS):
            kb.set_current_key(k)
            try:
                assert value.value() == k * 10
            except CorruptCheckpointError:
                failures += 1
        assert failures  # never a bare exception, never a wrong value
    finally:
        held.set()
        kb.dispose()


def test_without_lazy_restore_the_restore_checks_every_file(tmp_path, checkpoint):
    access, handle = checkpoint
    _flip_middle(_sst_paths(access, handle)[0])
    kb = _keyed(_factory(tmp_path, "eager", lazy=False))
    try:
        with pytest.raises(CorruptCheckpointError):
            kb.restore([handle], access.reader())
    finally:
        kb.dispose()


def test_dispose_ends_the_check(tmp_path, checkpoint, held):
    access, handle = checkpoint
    kb = _restore(tmp_path, access, handle)
    assert any(t.name == "statekit-rocksdb-restore-check" for t in threading.enumerate())
    held.set()
    kb.dispose()
    assert not any(t.name == "statekit-rocksdb-restore-check" for t in threading.enumerate())
    assert not os.path.exists(kb.instance_dir)


def test_files_copied_from_storage_are_checked_at_restore(tmp_path, checkpoint, monkeypatch):
    """Only linked files wait for the thread: a copy is checked as it lands (cheap: cached)."""
    access, handle = checkpoint
    def no_link(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, "another file system")

    monkeypatch.setattr(os, "link", no_link)
    _flip_middle(_sst_paths(access, handle)[0])
    kb = _keyed(_factory(tmp_path, "copied"))
    try:
        with pytest.raises(CorruptCheckpointError):
            kb.restore([handle], access.reader())
    finally:
        kb.dispose()


def test_the_setting_is_checked():
    with pytest.raises(ConfigError):
        EmbeddedRocksDBStateBackend(lazy_restore="sometimes")
    assert EmbeddedRocksDBStateBackend().is_lazy_restore_enabled()
    assert not EmbeddedRocksDBStateBackend(lazy_restore=False).is_lazy_restore_enabled()
    configured = EmbeddedRocksDBStateBackend().configure(
        {"state.backend.rocksdb.lazy-restore": "false"})
    assert not configured.is_lazy_restore_enabled()
    with pytest.raises(ConfigError):
        EmbeddedRocksDBStateBackend().configure({"state.backend.rocksdb.lazy-restore": "2"})


def test_a_compaction_replacing_restored_files_does_not_fail_their_check(tmp_path, checkpoint,
                                                                          held):
    """RocksDB may compact restored files away before the thread checks them (a compaction at
    open, or a changelog's replayed logs flushed into level 0): each check reads its own link."""
    access, handle = checkpoint
    kb = _restore(tmp_path, access, handle)
    try:
        restored = [kb.db_path / name for name in handle["sst"]]
        assert restored and all(p.exists() for p in restored)
        from rocksdict import BottommostLevelCompaction, CompactOptions

        force = CompactOptions()
        force.set_bottommost_level_compaction(BottommostLevelCompaction.force())
        for name in ("default", *kb.cfs):  # rewritten on this thread: the checks are held
            kb.db.get_column_family(name).compact_range(None, None, force)
        deadline = time.monotonic() + 10
        while any(p.exists() for p in restored) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(p.exists() for p in restored)  # the names the checks were given are gone
        held.set()
        kb.finish_restore()
        assert kb.pending_restore() == 0
        value = kb.get_partitioned_state(VALUE)
        kb.set_current_key(12)
        assert value.value() == 120
    finally:
        kb.dispose()
