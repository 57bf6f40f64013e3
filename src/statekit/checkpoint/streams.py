"""Writing and reading state data for one checkpoint: inline chunks, exclusive and shared files.

Every handle records size and CRC-32; the reader verifies both, and never follows a path that
leaves the checkpoint's root.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from statekit.checkpoint.store import BlobStore, check_key, write_local_file
from statekit.errors import (
    CheckpointError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    StateSizeError,
    TruncatedCheckpointError,
)

SHARED_PREFIX = "shared/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class CheckpointStreams:
    """Where one task writes the state of one checkpoint (or savepoint).

    Chunks under ``inline_threshold`` bytes become inline handles stored inside ``_metadata``;
    larger ones become files under ``prefix`` (exclusive) or ``shared/`` (reusable by later
    checkpoints).  ``max_state_size`` bounds any single state (JobManager storage).
    """

    def __init__(self, store: BlobStore, prefix: str, task_name: str, inline_threshold: int,
                 max_state_size: int | None = None, allow_shared: bool = True) -> None:
        self.store = store
        self.prefix = prefix
        self.task = _UNSAFE.sub("_", task_name)
        self.inline_threshold = inline_threshold
        self.max_state_size = max_state_size
        self.allow_shared = allow_shared
        self.written: list[str] = []
        self.bytes_written = 0
        self.cancelled = False  # set when the checkpoint is aborted: stop writing
        self._lock = threading.Lock()

    def _check(self, size: int, state_name: str) -> None:
        if self.cancelled:
            raise CheckpointError(f"checkpoint was aborted; not writing state '{state_name}'")
        if self.max_state_size is not None and size > self.max_state_size:
            raise StateSizeError(
                f"snapshot is {size} bytes, larger than max_state_size {self.max_state_size} "
                "of the JobManager checkpoint storage; use FileSystemCheckpointStorage for "
                "larger state",
                state_name,
            )

    def _key(self, state_name: str, shared_name: str | None) -> str:
        suffix = f"{self.task}-{_UNSAFE.sub('_', shared_name or state_name)}-{uuid.uuid4().hex[:12]}"
        if shared_name is not None and self.allow_shared:
            return SHARED_PREFIX + suffix
        return self.prefix + suffix

    def _wrote(self, key: str, size: int) -> None:
        with self._lock:
            self.written.append(key)
            self.bytes_written += size

    def write(self, data: bytes, *, state_name: str, shared_name: str | None = None) -> dict[str, Any]:
        """Store ``data`` and return its handle; ``shared_name`` asks for a reusable shared file."""
        size = len(data)
        self._check(size, state_name)
        crc = zlib.crc32(data)
        if shared_name is None and size < self.inline_threshold:
            with self._lock:
                self.bytes_written += size
            return {"type": "inline", "data": bytes(data), "size": size, "crc": crc}
        key = self._key(state_name, shared_name)
        self.store.put(key, data)
        self._wrote(key, size)
        return {"type": "file", "path": key, "size": size, "crc": crc}

    def write_file(self, local_path: str | os.PathLike[str], *, state_name: str,
                   shared_name: str | None = None) -> dict[str, Any]:
        """Store the contents of the local file ``local_path`` (which must not change meanwhile);
        the same handle as :meth:`write` of its bytes, without holding them in memory.

        The CRC-32 is computed by a streaming read of the file (just written, so normally in the
        page cache) on a helper thread while the store copies the file (a kernel copy on local
        disk, a streamed or multipart upload on object stores); a file whose length changed
        meanwhile fails the write and its copy is deleted.
        """
        size = os.stat(local_path).st_size
        self._check(size, state_name)
        if shared_name is None and size < self.inline_threshold:
            with open(local_path, "rb") as fh:
                data = fh.read()
            if len(data) != size:
                raise CheckpointError(f"{os.fspath(local_path)} changed while being checkpointed")
            return self.write(data, state_name=state_name)
        key = self._key(state_name, shared_name)
        stored = []

        def transfer() -> None:
            self.store.put_file(key, local_path)
            stored.append(key)

        try:
            crc, seen = _crc_while(transfer, local_path, size)
            if seen != size:
                raise CheckpointError(f"{os.fspath(local_path)} changed while being checkpointed "
                                      f"({size} bytes, then {seen})")
        except BaseException:
            if stored:  # the copy succeeded but its checksum did not: leave no orphan behind
                with contextlib.suppress(Exception):
                    self.store.delete(key)
            raise
        self._wrote(key, size)
        return {"type": "file", "path": key, "size": size, "crc": crc}

    @property
    def files_written(self) -> int:
        return len(self.written)


class StateReader:
    """Reads handles back from a checkpoint's root, verifying size and checksum."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def read(self, handle: dict[str, Any], offset: int | None = None, length: int | None = None,
             crc: int | None = None) -> bytes:
        """The handle's bytes, or ``length`` bytes at ``offset`` checked against ``crc``."""
        kind = handle.get("type")
        if kind == "inline":
            blob = handle["data"]
            if not isinstance(blob, bytes):
                raise CorruptCheckpointError("inline state is not bytes")
            data = blob if offset is None else blob[offset : offset + (length or 0)]
        elif kind == "file":
            path = check_key(str(handle.get("path")))
            data = self.store.get(path) if offset is None else self.store.get(path, offset, length)
        else:
            raise CorruptCheckpointError(f"unknown state handle type {kind!r}")
        where = handle.get("path", "inline state")
        if offset is None:
            if len(data) != handle.get("size"):
                raise TruncatedCheckpointError(
                    f"{where}: {len(data)} bytes, metadata records {handle.get('size')}"
                )
            crc = handle.get("crc")
        elif len(data) != length:
            raise TruncatedCheckpointError(
                f"{where}: chunk at {offset} is short ({len(data)} of {length} bytes)"
            )
        if crc is not None and zlib.crc32(data) != crc:
            raise ChecksumMismatchError(f"{where}: checksum mismatch")
        return data

    def read_file(self, handle: dict[str, Any], local_path: str | os.PathLike[str], *,
                  allow_link: bool = False) -> None:
        """Write the handle's bytes into the local file ``local_path``, verifying size and CRC-32
        (TruncatedCheckpointError / ChecksumMismatchError; the bad file is removed).

        ``allow_link`` lets a local-disk store hard-link the checkpoint file instead of copying it:
        only for files that are never modified in place (RocksDB's SST files).
        """
        kind = handle.get("type")
        if kind == "inline":
            write_local_file(os.fspath(local_path), self.read(handle))
            return
        if kind != "file":
            raise CorruptCheckpointError(f"unknown state handle type {kind!r}")
        path = check_key(str(handle.get("path")))
        self.store.get_file(path, local_path, allow_link=allow_link)
        try:
            size = os.stat(local_path).st_size
            if size != handle.get("size"):
                raise TruncatedCheckpointError(f"{path}: {size} bytes, metadata records {handle.get('size')}")
            crc, seen = file_crc(local_path)
            if seen != size:
                raise TruncatedCheckpointError(f"{path}: {seen} bytes read, {size} expected")
            if crc != handle.get("crc"):
                raise ChecksumMismatchError(f"{path}: checksum mismatch")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(local_path)
            raise


_CRC_CHUNK = 8 * 1024 * 1024
#: files at least this large are checksummed on a helper thread while the store copies them
_PARALLEL_CRC = 4 * 1024 * 1024


def _crc_while(transfer: Callable[[], None], local_path: str | os.PathLike[str],
               size: int) -> tuple[int, int]:
    """Run ``transfer()`` and :func:`file_crc` of ``local_path`` side by side (both release the GIL:
    a kernel copy or network upload, and the CRC); the CRC's result once both are done."""
    if size < _PARALLEL_CRC:
        result = file_crc(local_path)
        transfer()
        return result
    box: dict[str, Any] = {}

    def checksum() -> None:
        try:
            box["crc"] = file_crc(local_path)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    helper = threading.Thread(target=checksum, name="statekit-crc", daemon=True)
    helper.start()
    try:
        transfer()
    finally:
        helper.join()
    if "error" in box:
        raise box["error"]
    return box["crc"]


def file_crc(local_path: str | os.PathLike[str]) -> tuple[int, int]:
    """CRC-32 and length of a local file, read in 8 MiB chunks (no whole-file buffer).

    A file longer than one chunk is read on a helper thread while this one checksums the previous
    chunk (both release the GIL), so a cold file is checksummed at the disk's read speed.
    """
    with open(local_path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):  # a larger readahead window
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        first = bytearray(_CRC_CHUNK)
        n = fh.readinto(first)
        if n < _CRC_CHUNK:
            return zlib.crc32(memoryview(first)[:n]), n
        full: queue.Queue[tuple[Any, int]] = queue.Queue()
        free: queue.Queue[bytearray | None] = queue.Queue()
        free.put(bytearray(_CRC_CHUNK))
        full.put((first, n))

        def read_ahead() -> None:
            try:
                while (buf := free.get()) is not None:
                    got = fh.readinto(buf)
                    full.put((buf, got))
                    if not got:
                        return
            except BaseException as exc:  # re-raised on the checksumming thread
                full.put((exc, 0))

        reader = threading.Thread(target=read_ahead, name="statekit-crc-read", daemon=True)
        reader.start()
        crc = total = 0
        try:
            while True:
                buf, got = full.get()
                if isinstance(buf, BaseException):
                    raise buf
                if not got:
                    return crc, total
                crc = zlib.crc32(memoryview(buf)[:got], crc)
                total += got
                free.put(buf)
        finally:
            free.put(None)  # wakes the reader if it waits for a buffer
            reader.join()


def file_paths(obj: Any) -> set[str]:
    """Every file path a metadata body or handle references (found recursively)."""
    found: set[str] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "file" and isinstance(item.get("path"), str):
                found.add(item["path"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found
