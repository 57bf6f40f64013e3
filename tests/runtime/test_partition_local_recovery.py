"""Local recovery of versioned partition stores (the Spark adapters' state): a partition that is
not reused in memory restores from the executor's local copy of its version, and from
checkpoint storage when that copy is missing, stale or damaged."""

import os
from pathlib import Path

import pytest

from statekit import EmbeddedRocksDBStateBackend, HashMapStateBackend, Types, ValueStateDescriptor
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import UnsafePathError
from statekit.runtime.localrecovery import ROOT_NAME
from statekit.runtime.partition import PartitionStore, drop_local_state, new_attempt_token
from statekit.serde.types import GenericSerializer

COUNT = ValueStateDescriptor("count", Types.LONG())
KEYS = [f"k{i}" for i in range(300)]


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """A Spark executor's local directory, as Spark hands it to its Python workers."""
    local = tmp_path / "executor"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(local))
    drop_local_state()
    yield local / ROOT_NAME
    drop_local_state()


def backend_of(name):
    return HashMapStateBackend() if name == "hashmap" else EmbeddedRocksDBStateBackend()


def run_batch(storage, backend, batch, local_recovery=True):
    """One batch adding 1 to every key; the store after its commit (its state left in memory)."""
    s = PartitionStore(backend_of(backend), storage, "query", "op", 0, GenericSerializer(),
                       local_recovery=local_recovery)
    state_backend = s.open(batch, new_attempt_token(batch, 0))
    for k in KEYS:
        state_backend.set_current_key(k)
        state = state_backend.get_partitioned_state(COUNT)
        state.update((state.value() or 0) + 1)
    s.commit()
    return s


def reopen(storage, backend, batch):
    """A task of ``batch`` in a process that holds nothing (a new Python worker): the store and
    every key's count."""
    drop_local_state()
    s = PartitionStore(backend_of(backend), storage, "query", "op", 0, GenericSerializer(),
                       local_recovery=True)
    state_backend = s.open(batch, new_attempt_token(batch, 1))
    counts = set()
    for k in KEYS:
        state_backend.set_current_key(k)
        counts.add(state_backend.get_partitioned_state(COUNT).value())
    s.abort()
    return s, counts


def remote_files(root: Path, version: int):
    return [f for f in (root / "query" / "op" / "p00000").rglob("*")
            if f.is_file() and f.name != "_metadata"
            and (f.parent.name == f"chk-{version}" or f.parent.name == "shared")]


def copies(executor: Path):
    return sorted(executor.glob("query/op/p00000/chk-*"))


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_new_worker_restores_from_the_executors_copy(tmp_path, executor, backend):
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"), file_state_size_threshold=0)
    run_batch(storage, backend, 0)
    run_batch(storage, backend, 1)
    assert [c.name for c in copies(executor)] == ["chk-1"]  # only the newest version's copy
    for f in remote_files(tmp_path / "state", 1):  # checkpoint storage lost version 1's files
        f.unlink()
    s, counts = reopen(storage, backend, 2)
    assert s.source == "local" and counts == {2}


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("how", ["missing", "damaged", "stale"])
def test_unusable_copy_restores_from_checkpoint_storage(tmp_path, executor, backend, how):
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"), file_state_size_threshold=0)
    run_batch(storage, backend, 0)
    run_batch(storage, backend, 1)
    (copy,) = copies(executor)
    if how == "missing":
        for f in copy.rglob("*"):
            if f.is_file() and f.name != "_local":
                f.unlink()
    elif how == "damaged":  # the same sizes: only the checksums tell
        for f in copy.rglob("*"):
            if f.is_file() and f.name != "_local" and f.stat().st_size:
                size = f.stat().st_size
                f.unlink()  # never write through a link RocksDB's files share
                f.write_bytes(b"\xee" * size)
    else:  # another attempt commits version 1 again: the copy is of a version that lost
        run_batch(storage, backend, 1, local_recovery=False)
    s, counts = reopen(storage, backend, 2)
    assert s.source == "remote" and counts == {2}
    # what the copy's check found: files missing, a copy of another snapshot; damaged bytes
    # pass that check and fail the checksum during the restore, which then starts over
    assert s.local.last_source == {"missing": "damaged", "damaged": "local", "stale": "stale"}[how]


def test_copy_that_links_out_of_the_root_is_refused(tmp_path, executor):
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"), file_state_size_threshold=0)
    run_batch(storage, "hashmap", 0)
    (copy,) = copies(executor)
    outside = tmp_path / "outside"
    copy.rename(outside)
    os.symlink(outside, copy)
    s, counts = reopen(storage, "hashmap", 1)
    assert s.source == "remote" and counts == {1}
    assert s.local is not None
    with pytest.raises(UnsafePathError):
        s.local._check_inside(copy)
    assert any(outside.iterdir())  # the link's target is never followed or deleted


def test_copies_kept_only_with_local_recovery(tmp_path, executor):
    storage = FileSystemCheckpointStorage(str(tmp_path / "state"), file_state_size_threshold=0)
    run_batch(storage, "hashmap", 0, local_recovery=False)
    assert not executor.exists()
