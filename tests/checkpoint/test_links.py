"""Links and special files inside a checkpoint: a symbolic link pointing out of the checkpoint
is never followed, and a FIFO in place of a state file is a typed error at once, not a hang."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
from collections.abc import Iterator

import pytest

from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.errors import (
    CheckpointNotFoundError,
    CheckpointStorageError,
    CorruptCheckpointError,
    UnsafePathError,
)
from tests.checkpoint.conftest import WRITERS
from tests.checkpoint.forge import expected_state, restore_and_read


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the run) when the body blocks for ``seconds``."""
    def expired(*_):
        raise TimeoutError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _state_file(where: str) -> str:
    return sorted(p for p in glob.glob(f"{where}/chk-2/p0-*") if os.path.isfile(p))[0]


@pytest.mark.parametrize("reader", WRITERS)
def test_a_state_file_linked_outside_the_checkpoint_is_refused(copy, tmp_path, reader):
    """The link points at an identical copy outside: following it would restore "fine"."""
    _, where = copy
    victim = _state_file(where)
    outside = tmp_path / "outside"
    shutil.copyfile(victim, outside)
    os.unlink(victim)
    os.symlink(outside, victim)
    with pytest.raises(UnsafePathError, match="link"):
        restore_and_read(reader, f"{where}/chk-2")


def test_linked_metadata_is_refused(copy, tmp_path):
    _, where = copy
    outside = tmp_path / "outside-metadata"
    shutil.copyfile(f"{where}/chk-2/_metadata", outside)
    os.unlink(f"{where}/chk-2/_metadata")
    os.symlink(outside, f"{where}/chk-2/_metadata")
    with pytest.raises((UnsafePathError, CorruptCheckpointError)):
        restore_and_read("hashmap", f"{where}/chk-2")


@pytest.mark.parametrize("reader", WRITERS)
def test_a_fifo_in_place_of_a_state_file_is_a_typed_error_not_a_hang(copy, reader):
    _, where = copy
    victim = _state_file(where)
    os.unlink(victim)
    os.mkfifo(victim)
    with deadline(20), pytest.raises(CorruptCheckpointError, match="not a regular file"):
        restore_and_read(reader, f"{where}/chk-2")


def test_a_directory_in_place_of_a_state_file_is_corrupt(copy):
    _, where = copy
    victim = _state_file(where)
    os.unlink(victim)
    os.mkdir(victim)
    with pytest.raises(CorruptCheckpointError):
        restore_and_read("hashmap", f"{where}/chk-2")


def test_the_store_never_writes_or_deletes_through_a_linked_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"x")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "sub")
    store = LocalBlobStore(str(root))
    with pytest.raises(UnsafePathError):
        store.put("sub/new", b"y")
    with pytest.raises(UnsafePathError):
        store.delete("sub/keep")
    with pytest.raises(UnsafePathError):
        store.get("sub/keep")
    assert sorted(os.listdir(outside)) == ["keep"]


def test_a_linked_root_is_trusted_and_intact_checkpoints_restore(copy, tmp_path):
    """The configured directory itself may be a link; only links below it are refused."""
    writer, where = copy
    os.symlink(where, tmp_path / "alias")
    assert restore_and_read(writer, f"{tmp_path}/alias/chk-2") == expected_state(2)


@pytest.mark.parametrize("where", ["under a regular file", "under /proc"])
def test_a_root_that_cannot_hold_directories_is_a_storage_error(tmp_path, where):
    """Writes under a regular file raised a bare NotADirectoryError, and under /proc a "not
    found" CheckpointNotFoundError, as if something to read were missing."""
    (tmp_path / "file").write_text("x")
    root = str(tmp_path / "file" / "q") if where == "under a regular file" else "/proc/statekit-q"
    store = LocalBlobStore(root)
    for write in (lambda: store.put("chk-1/_metadata", b"x"),
                  lambda: store.put_parts("shared/a", [b"x"])):
        with pytest.raises(CheckpointStorageError, match=r"cannot (write|create)") as caught:
            write()
        assert not isinstance(caught.value, CheckpointNotFoundError)
