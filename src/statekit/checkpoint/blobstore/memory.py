"""The in-memory blob store: blobs in a dict owned by this process (JobManager checkpoint storage).

Not fsspec's ``memory://`` file system, whose one global dict every user of the process shares:
each job gets its own store (:meth:`MemoryBlobStore.named`).
"""

from __future__ import annotations

import threading

from statekit.checkpoint.blobstore.base import BlobStore, check_key
from statekit.errors import MissingFileError


class MemoryBlobStore(BlobStore):
    """Blobs in a dict owned by this process (JobManager checkpoint storage)."""

    _named: dict[str, MemoryBlobStore] = {}
    _named_lock = threading.Lock()

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> MemoryBlobStore:
        """The process-wide store called ``name`` (a job's in-memory checkpoints)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = MemoryBlobStore()
            return store

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._blobs[check_key(key)] = bytes(data)

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        with self._lock:
            blob = self._blobs.get(check_key(key))
        if blob is None:
            raise MissingFileError(key, f"no blob {key!r} in memory")
        if start is None:
            return blob
        return blob[start:] if length is None else blob[start:start + length]

    def size(self, key: str) -> int:
        return len(self.get(key))  # the stored bytes themselves: no copy

    def exists(self, key: str) -> bool:
        with self._lock:
            return check_key(key) in self._blobs

    def delete(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(check_key(key), None)

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self._blobs if k.startswith(prefix))
