"""Blob stores: the small byte-level interface every checkpoint storage writes through.

Modelled on zarr v3's store ABC: a handful of operations on relative keys, capability flags, and
one implementation per medium.  Keys are validated so nothing reads or writes outside the root.
"""

from __future__ import annotations

import os
import posixpath
import threading
import uuid
from abc import ABC, abstractmethod
from typing import Any

import fsspec

from statekit.errors import CheckpointNotFoundError, CheckpointStorageError, UnsafePathError


def check_key(key: str) -> str:
    """``key`` normalized, or :class:`UnsafePathError` when it could escape the store's root."""
    if not isinstance(key, str) or not key or "\x00" in key or "\\" in key:
        raise UnsafePathError(f"invalid path {key!r}")
    if key.startswith("/") or "://" in key or ":" in key.split("/", 1)[0]:
        raise UnsafePathError(f"path {key!r} is absolute; only relative paths are allowed")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise UnsafePathError(f"path {key!r} escapes its directory")
    return posixpath.normpath(key)


class BlobStore(ABC):
    """Bytes under relative keys; ``put`` is atomic: readers see the old or the whole new blob."""

    #: whether ``put`` replaces atomically by rename (local disk) or by a single PUT (object store)
    atomic_put = True

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        """The blob (or ``length`` bytes from ``start``); CheckpointNotFoundError when missing."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one blob; deleting a missing blob is not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (recursively), relative to the store's root."""

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    def describe(self) -> str:
        return type(self).__name__


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
            raise CheckpointNotFoundError(f"no blob {key!r} in memory")
        if start is None:
            return blob
        return blob[start:] if length is None else blob[start:start + length]

    def exists(self, key: str) -> bool:
        with self._lock:
            return check_key(key) in self._blobs

    def delete(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(check_key(key), None)

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self._blobs if k.startswith(prefix))

    def total_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._blobs.values())


class FsspecBlobStore(BlobStore):
    """Blobs on any fsspec file system under ``root`` (a path or URL).

    Local disk: write a temp file in the same directory, fsync it, rename over the key, fsync the
    directory.  Object stores: one PUT of the final key, which is atomic; never rename.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        self.root_url = root.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._pid = -1
        fs, path = self._resolve()
        self.local = "file" in _protocols(fs)
        self.root = path.rstrip("/") if path != "/" else path

    def _resolve(self) -> tuple[Any, str]:
        fs, path = fsspec.core.url_to_fs(self.root_url, **self.storage_options)
        return fs, path

    @property
    def fs(self) -> Any:
        """The file system, created anew in each process (fsspec async file systems are not fork-safe)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs, _ = self._resolve()
            self._pid = os.getpid()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        return state

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def describe(self) -> str:
        return self.root_url

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            if self.local:
                _atomic_local_write(path, data)
            else:
                self.fs.pipe_file(path, bytes(data))
        except OSError as exc:
            raise CheckpointStorageError(f"cannot write {path}: {exc}") from exc

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        path = self._path(key)
        try:
            if start is None:
                return bytes(self.fs.cat_file(path))
            end = None if length is None else start + length
            return bytes(self.fs.cat_file(path, start=start, end=end))
        except FileNotFoundError as exc:
            raise CheckpointNotFoundError(f"missing checkpoint file {path}") from exc
        except OSError as exc:
            raise CheckpointStorageError(f"cannot read {path}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self._path(key)))

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CheckpointStorageError(f"cannot delete {path}: {exc}") from exc

    def delete_prefix(self, prefix: str) -> None:
        super().delete_prefix(prefix)
        if self.local:  # remove the emptied directories too
            path = self._path(prefix.rstrip("/")) if prefix else self.root
            if os.path.isdir(path):
                for dirpath, _dirs, _files in sorted(os.walk(path), reverse=True):
                    try:
                        os.rmdir(dirpath)
                    except OSError:
                        pass

    def list(self, prefix: str = "") -> list[str]:
        base = self.root
        try:
            found = self.fs.find(base, withdirs=False)
        except FileNotFoundError:
            return []
        strip = len(base.rstrip("/")) + 1
        keys = []
        for full in found:
            rel = full[strip:] if full.startswith(base) else full
            if rel.startswith(prefix) and not posixpath.basename(rel).startswith(".tmp-"):
                keys.append(rel)
        return sorted(keys)


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _atomic_local_write(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
