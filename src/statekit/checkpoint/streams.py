"""Writing and reading state data for one checkpoint: inline chunks, exclusive and shared files.

Every handle records size and CRC-32; the reader verifies both, and never follows a path that
leaves the checkpoint's root.
"""

from __future__ import annotations

import re
import threading
import uuid
import zlib
from typing import Any

from statekit.checkpoint.store import BlobStore, check_key
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

    def write(self, data: bytes, *, state_name: str, shared_name: str | None = None) -> dict[str, Any]:
        """Store ``data`` and return its handle; ``shared_name`` asks for a reusable shared file."""
        if self.cancelled:
            raise CheckpointError(f"checkpoint was aborted; not writing state '{state_name}'")
        size = len(data)
        if self.max_state_size is not None and size > self.max_state_size:
            raise StateSizeError(
                f"snapshot is {size} bytes, larger than max_state_size {self.max_state_size} "
                "of the JobManager checkpoint storage; use FileSystemCheckpointStorage for "
                "larger state",
                state_name,
            )
        crc = zlib.crc32(data)
        if shared_name is None and size < self.inline_threshold:
            with self._lock:
                self.bytes_written += size
            return {"type": "inline", "data": bytes(data), "size": size, "crc": crc}
        suffix = f"{self.task}-{_UNSAFE.sub('_', shared_name or state_name)}-{uuid.uuid4().hex[:12]}"
        if shared_name is not None and self.allow_shared:
            key = SHARED_PREFIX + suffix
        else:
            key = self.prefix + suffix
        self.store.put(key, data)
        with self._lock:
            self.written.append(key)
            self.bytes_written += size
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
