"""The checkpoint storage conformance suite: subclass :class:`StorageConformance` with a
``checkpoint_storage`` fixture to test a storage plugin through its public interface."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.checkpoint.metadata import encode_metadata
from statekit.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    TruncatedCheckpointError,
    UnsafePathError,
    UnsupportedFormatVersionError,
)

STORAGE_KINDS = ("jobmanager", "filesystem", "memory-fs")


def make_storage(kind: str, tmp_path: Any) -> CheckpointStorage:
    """A fresh storage of one of :data:`STORAGE_KINDS`."""
    if kind == "jobmanager":
        return JobManagerCheckpointStorage()
    if kind == "filesystem":
        return FileSystemCheckpointStorage(str(tmp_path / "checkpoints"), file_state_size_threshold=64)
    return FileSystemCheckpointStorage(f"memory://statekit-{uuid.uuid4().hex}")


class StorageConformance:
    """The behaviour every checkpoint storage must have (commit, list, discard, integrity)."""

    @pytest.fixture
    def access(self, checkpoint_storage: CheckpointStorage) -> Any:
        access = checkpoint_storage.create_access(uuid.uuid4().hex)
        yield access
        access.delete_all()

    def _commit(self, access: Any, cid: int, payload: bytes) -> dict[str, Any]:
        streams = access.streams(cid, "task")
        handle = streams.write(payload, state_name="s")
        access.commit(cid, {"tasks": {"task": {"data": handle}}})
        return handle

    def test_commit_list_load(self, access: Any) -> None:
        assert access.completed() == []
        self._commit(access, 1, b"a" * 10)
        self._commit(access, 2, b"b" * 50_000)
        assert access.completed() == [1, 2]
        meta = access.load(2)
        assert access.reader().read(meta["tasks"]["task"]["data"]) == b"b" * 50_000

    def test_uncommitted_checkpoint_is_invisible(self, access: Any) -> None:
        access.streams(7, "task").write(b"x" * 100_000, state_name="s")
        assert access.completed() == []

    def test_discard_and_abort_remove_files(self, access: Any) -> None:
        self._commit(access, 1, b"x" * 100_000)
        self._commit(access, 2, b"y" * 100_000)
        access.discard(1, [2])
        assert access.completed() == [2]
        streams = access.streams(3, "task")
        streams.write(b"z" * 100_000, state_name="s")
        access.abort(3, streams.written, [2])
        assert all(not k.startswith("chk-1/") and not k.startswith("chk-3/")
                   for k in access.store.list())

    def test_shared_files_survive_while_referenced(self, access: Any) -> None:
        shared = access.streams(1, "task").write(b"s" * 100_000, state_name="s", shared_name="sst1")
        access.commit(1, {"tasks": {"task": {"data": shared}}})
        access.commit(2, {"tasks": {"task": {"data": shared}}})
        access.discard(1, [2])
        assert access.reader().read(shared) == b"s" * 100_000
        access.discard(2, [])
        assert not access.store.exists(shared["path"])

    def test_damaged_metadata_is_typed(self, access: Any) -> None:
        self._commit(access, 1, b"ok")
        key = "chk-1/_metadata"
        good = access.store.get(key)
        for damaged, error in [
            (good[:-3], TruncatedCheckpointError),
            (good[:20] + bytes([good[20] ^ 0xFF]) + good[21:], ChecksumMismatchError),
            (good[:8] + b"\x00\x09" + good[10:], UnsupportedFormatVersionError),
            (b"garbage" * 10, CorruptCheckpointError),
        ]:
            access.store.put(key, damaged)
            with pytest.raises(error):
                access.load(1)

    def test_damaged_state_is_typed(self, access: Any) -> None:
        handle = self._commit(access, 1, b"p" * 100_000)
        reader = access.reader()
        if handle["type"] == "file":
            access.store.put(handle["path"], b"p" * 99_999)
            with pytest.raises(TruncatedCheckpointError):
                reader.read(handle)
            access.store.put(handle["path"], b"q" * 100_000)
            with pytest.raises(ChecksumMismatchError):
                reader.read(handle)
        with pytest.raises(ChecksumMismatchError):
            reader.read({**handle, "crc": handle["crc"] ^ 1} if handle["type"] == "inline"
                        else handle)

    def test_paths_escaping_the_job_directory_are_rejected(self, access: Any) -> None:
        reader = access.reader()
        for path in ("../other-job/chk-1/x", "/etc/passwd", "shared/../../x", "s3://b/x"):
            with pytest.raises(UnsafePathError):
                reader.read({"type": "file", "path": path, "size": 1, "crc": 0})
        access.store.put("chk-9/_metadata", encode_metadata(
            {"tasks": {"t": {"data": {"type": "file", "path": "../../x", "size": 1, "crc": 0}}}}))
        with pytest.raises(UnsafePathError):
            reader.read(access.load(9)["tasks"]["t"]["data"])
