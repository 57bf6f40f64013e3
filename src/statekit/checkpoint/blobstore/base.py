"""The blob store ABC: the small byte-level interface every checkpoint storage writes through.

Modelled on zarr v3's store ABC: a handful of operations on relative keys, capability flags
(properties a caller or a test suite can branch on), and one implementation per medium.  Keys are
validated so nothing reads or writes outside the root.
"""

from __future__ import annotations

import copy
import os
import posixpath
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from statekit.checkpoint.blobstore.retry import RetryPolicy, call_typed
from statekit.errors import CheckpointNotFoundError, MissingFileError, UnsafePathError

T = TypeVar("T")

#: called as ``hook(operation, path)`` before every file operation of a file-backed store (and
#: before each step of a local atomic write); crash tests use it to die between two operations
OperationHook = Callable[[str, str], None]
_operation_hook: OperationHook | None = None


def set_operation_hook(hook: OperationHook | None) -> OperationHook | None:
    """Install a process-wide hook run before each blob-store file operation; returns the old one."""
    global _operation_hook
    previous, _operation_hook = _operation_hook, hook
    return previous


def run_operation_hook(operation: str, path: str) -> None:
    """Run the installed operation hook, if any (stores call this before each file operation)."""
    hook = _operation_hook
    if hook is not None:
        hook(operation, path)


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*(://|::)")


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL (``s3://...``, a chain like ``simplecache::s3://...``)
    rather than a local path: only a scheme at its start makes it one, so a directory named
    ``a::b`` or holding ``http://`` further down stays a path."""
    match = _SCHEME.match(location)
    return match is not None and (match.group(1) == "://" or "://" in location)


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


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_local_file(path: str, data: bytes) -> None:
    """``path`` created or truncated and filled with ``data`` (a restore target: no fsync)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


class BlobStore(ABC):
    """Bytes under relative keys; ``put`` is atomic: readers see the old or the whole new blob."""

    # --- capabilities (the defaults describe a plain in-memory or remote store) ------------------

    @property
    def supports_atomic_put(self) -> bool:
        """Whether ``put``, ``put_file`` and ``put_parts`` replace a blob atomically (a rename on
        local disk, a single PUT or completed multipart upload on object stores)."""
        return True

    @property
    def supports_links(self) -> bool:
        """Whether ``get_file(..., allow_link=True)`` may hard-link the blob (local disk)."""
        return False

    @property
    def supports_streamed_writes(self) -> bool:
        """Whether ``put_parts`` writes each part as it arrives instead of joining them first."""
        return False

    @property
    def writes_parts_beside(self) -> bool:
        """Whether ``put_parts`` writes on a helper thread of its own while the caller produces
        the next part (so a caller pacing itself beside a processing thread need not hand the
        parts to one)."""
        return False

    @property
    def supports_temporary_files(self) -> bool:
        """Whether interrupted writes can leave temp files behind (see :meth:`list_temporary`)."""
        return False

    @property
    def local(self) -> bool:
        """Blobs are files on this machine: a ranged read costs a system call, not a round trip."""
        return False

    @property
    def atomic_put(self) -> bool:
        """The earlier name of :attr:`supports_atomic_put`."""
        return self.supports_atomic_put

    # --- the operations ------------------------------------------------------------------------

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        """The blob (or ``length`` bytes from ``start``); CheckpointNotFoundError when missing."""

    def size(self, key: str) -> int:
        """The blob's length in bytes; CheckpointNotFoundError when missing.  Readers compare it
        with a handle's recorded size before sizing any buffer by the handle.  The default reads
        the blob; stores that can ask for the length alone override it."""
        return len(self.get(key))

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

    def prune(self, prefix: str) -> None:
        """Remove directories under ``prefix`` that are empty (stores with real directories)."""

    def remove_if_empty(self) -> None:
        """Remove the store's own directory, and the empty ones below it, when it holds no blob
        (stores with real directories; one holding anything keeps it)."""

    def list_temporary(self) -> list[str]:
        """Leftover temp files of interrupted atomic writes (local disk only)."""
        return []

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Store the contents of the local file ``local_path`` under ``key``, atomically as ``put``.

        The default reads the file into memory and calls :meth:`put`; stores that can copy
        without the round trip through Python (kernel copy, multipart upload) override it.
        """
        with open(local_path, "rb") as fh:
            data = fh.read()
        self.put(key, data)

    def get_file(self, key: str, local_path: str | os.PathLike[str], *, allow_link: bool = False) -> None:
        """Write the blob ``key`` into the local file ``local_path`` (created or replaced).

        ``allow_link`` lets a store on the local disk hard-link the blob instead of copying it; the
        caller then promises never to modify ``local_path`` in place (only read, rename, delete).
        CheckpointNotFoundError when the blob is missing.  The caller verifies the contents.
        """
        write_local_file(os.fspath(local_path), self.get(key))

    def put_parts(self, key: str, parts: Iterable[bytes]) -> None:
        """Store the concatenation of ``parts`` under ``key``, atomically as ``put``.

        The default joins them and calls :meth:`put` (retried as a whole); the local disk
        overrides it to write each part as it arrives.  An exception raised by ``parts`` aborts
        the write and leaves nothing behind.
        """
        self.put(key, b"".join(parts))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]],
                   into: Callable[[int], memoryview] | None = None, *, sparse: bool = False
                   ) -> Iterator[bytes | memoryview]:
        """The ``(offset, length)`` ranges of the blob ``key``, in order (a short read at the end
        of a truncated blob is returned short; the caller verifies).

        ``into(length)`` supplies a buffer for each range (reused buffers spare a restore from
        faulting in fresh memory for every read); the filled part of it is yielded.
        ``sparse``: the ranges lie far apart (part heads), so nothing between them is read ahead.
        """
        for start, length in ranges:
            # an empty range reads nothing (fsspec's ranged reads take end=0 as "to the end")
            data = self.get(key, start, length) if length else b""
            if into is None:
                yield data
            else:
                view = into(length)
                view[:len(data)] = data
                yield view[:len(data)]

    def describe(self) -> str:
        return type(self).__name__


class PathBlobStore(BlobStore):
    """A store whose blobs are files under ``root`` (the local disk, an fsspec file system):
    keys become paths, and every operation is retried with typed errors."""

    root_url: str
    root: str
    retry: RetryPolicy

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def describe(self) -> str:
        return self.root_url

    def child(self, rel: str) -> PathBlobStore:
        """The store rooted at the directory ``rel`` below this one, with the same options,
        joined as a path (never parsed as a URL again: a directory named ``a::b`` stays one)."""
        if not rel or "\x00" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
            raise UnsafePathError(f"{rel!r} is not a directory below {self.root_url}")
        store = copy.copy(self)
        store.root_url = f"{self.root_url.rstrip('/')}/{rel}"
        store.root = f"{self.root.rstrip('/')}/{rel}"
        return store

    def _call(self, what: str, operation: Callable[[], T]) -> T:
        return call_typed(self.retry, what, operation)

    def _read(self, path: str, operation: Callable[[], T]) -> T:
        """A read of ``path``; a missing file is a typed "missing checkpoint file" error."""
        try:
            return self._call(f"read {path}", operation)
        except CheckpointNotFoundError as exc:
            raise MissingFileError(path) from exc

