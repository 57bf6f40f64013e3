"""Blob stores: the small byte-level interface every checkpoint storage writes through.

Modelled on zarr v3's store ABC: a handful of operations on relative keys, capability flags, and
one implementation per medium.  Keys are validated so nothing reads or writes outside the root.
"""

from __future__ import annotations

import errno
import os
import posixpath
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import fsspec

from statekit.checkpoint.retry import RetryPolicy
from statekit.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    UnsafePathError,
)

T = TypeVar("T")

#: called as ``hook(operation, path)`` before every file operation of an :class:`FsspecBlobStore`
#: (and before each step of a local atomic write); crash tests use it to die between two operations
OperationHook = Callable[[str, str], None]
_operation_hook: OperationHook | None = None


def set_operation_hook(hook: OperationHook | None) -> OperationHook | None:
    """Install a process-wide hook run before each blob-store file operation; returns the old one."""
    global _operation_hook
    previous, _operation_hook = _operation_hook, hook
    return previous


def _op(operation: str, path: str) -> None:
    hook = _operation_hook
    if hook is not None:
        hook(operation, path)


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
        data = self.get(key)
        write_local_file(os.fspath(local_path), data)

    def put_parts(self, key: str, parts: Iterable[bytes]) -> None:
        """Store the concatenation of ``parts`` under ``key``, atomically as ``put``.

        The default joins them and calls :meth:`put` (retried as a whole); the local disk
        overrides it to write each part as it arrives.  An exception raised by ``parts`` aborts
        the write and leaves nothing behind.
        """
        self.put(key, b"".join(parts))

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]],
                   into: Callable[[int], memoryview] | None = None) -> Iterator[bytes | memoryview]:
        """The ``(offset, length)`` ranges of the blob ``key``, in order (a short read at the end
        of a truncated blob is returned short; the caller verifies).

        ``into(length)`` supplies a buffer for each range (reused buffers spare a restore from
        faulting in fresh memory for every read); the filled part of it is yielded.
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
    directory.  Object stores: one PUT of the final key (a multipart upload above
    ``multipart_threshold`` bytes, whose completion is equally atomic); never rename, never fsspec
    transactions.  Transient failures are retried per ``retry``; the file system is created anew
    in each process (fork safety) and shared by the transfer threads (s3fs is thread-safe for
    plain operations; its instance cache is skipped so no state leaks between stores).
    """

    DEFAULT_MULTIPART_THRESHOLD = 16 * 1024 * 1024
    DEFAULT_PART_SIZE = 8 * 1024 * 1024
    MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy | None = None, multipart_threshold: int | None = None,
                 part_size: int | None = None) -> None:
        self.root_url = root.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry if retry is not None else RetryPolicy()
        self.multipart_threshold = (self.DEFAULT_MULTIPART_THRESHOLD if multipart_threshold is None
                                    else int(multipart_threshold))
        self.part_size = max(self.MIN_PART_SIZE, int(part_size or self.DEFAULT_PART_SIZE))
        self._fs: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()
        fs, path = self._resolve()
        self.local = "file" in _protocols(fs)
        self.root = path.rstrip("/") if path != "/" else path

    def _resolve(self) -> tuple[Any, str]:
        options = dict(self.storage_options)
        if "::" not in self.root_url:
            options.setdefault("skip_instance_cache", True)
        fs, path = fsspec.core.url_to_fs(self.root_url, **options)
        return fs, path

    @property
    def fs(self) -> Any:
        """The file system, created anew in each process (fsspec async file systems are not fork-safe)."""
        pid = os.getpid()
        if self._fs is None or self._pid != pid:
            if self._lock_pid != pid:  # a lock inherited through fork may be held forever
                self._lock, self._lock_pid = threading.Lock(), pid
            with self._lock:
                if self._fs is None or self._pid != pid:
                    self._fs, _ = self._resolve()
                    self._pid = pid
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        state["_pid"] = -1
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def describe(self) -> str:
        return self.root_url

    def _call(self, what: str, operation: Callable[[], T]) -> T:
        """``operation`` with retries; permanent errors become typed checkpoint errors."""
        try:
            return self.retry.call(operation, what)
        except CheckpointError:
            raise
        except FileNotFoundError as exc:
            raise CheckpointNotFoundError(f"{what}: not found ({exc})") from exc
        except OSError as exc:
            raise CheckpointStorageError(f"cannot {what}: {type(exc).__name__}: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self.local:
            self._call(f"write {path}", lambda: _atomic_local_write(path, data))
        elif len(data) > self.multipart_threshold:
            self._call(f"write {path}", lambda: self._multipart_put(path, data))
        else:
            def pipe() -> None:
                _op("put", path)
                self.fs.pipe_file(path, bytes(data))
            self._call(f"write {path}", pipe)

    def _multipart_put(self, path: str, data: bytes) -> None:
        """A multipart upload: invisible until its completion, aborted on any failure."""
        _op("multipart-start", path)
        handle = self.fs.open(path, "wb", block_size=self.part_size)
        try:
            view = memoryview(data)
            for start in range(0, len(view), self.part_size):
                _op("multipart-part", path)
                handle.write(view[start:start + self.part_size])
            _op("multipart-complete", path)
            handle.close()
        except BaseException:
            discard = getattr(handle, "discard", None)
            try:
                if callable(discard):
                    discard()
            finally:
                handle.closed = True  # never let close() or __del__ commit a partial upload
            raise

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """Local disk: kernel copy into a temp file, fsync, rename, fsync the directory (as ``put``).
        Object stores: ``fs.put_file`` (s3fs streams large files as a multipart upload, which is
        invisible until its completion)."""
        path, source = self._path(key), os.fspath(local_path)
        if self.local:
            self._call(f"write {path}", lambda: _atomic_local_copy(path, source))
        else:
            def upload() -> None:
                _op("put", path)
                self.fs.put_file(source, path)
            self._call(f"write {path}", upload)

    def get_file(self, key: str, local_path: str | os.PathLike[str], *, allow_link: bool = False) -> None:
        """Local disk: a hard link when allowed and possible, else a kernel copy.  Object stores:
        ``fs.get_file`` (a streamed download).  Retried per the store's policy."""
        path, dest = self._path(key), os.fspath(local_path)
        parent = os.path.dirname(os.path.abspath(dest))
        os.makedirs(parent, exist_ok=True)  # a missing parent must not look like a missing blob
        if self.local:
            def fetch() -> None:
                if allow_link and _try_link(path, dest):
                    return
                _local_copy(path, dest)
        else:
            def fetch() -> None:
                self.fs.get_file(path, dest)
        try:
            self._call(f"read {path}", fetch)
        except CheckpointNotFoundError as exc:
            raise CheckpointNotFoundError(f"missing checkpoint file {path}") from exc

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            if start is None:
                return bytes(self.fs.cat_file(path))
            end = None if length is None else start + length
            return bytes(self.fs.cat_file(path, start=start, end=end))

        try:
            return self._call(f"read {path}", read)
        except CheckpointNotFoundError as exc:
            raise CheckpointNotFoundError(f"missing checkpoint file {path}") from exc

    def put_parts(self, key: str, parts: Iterable[bytes]) -> None:
        """Local disk: each part written into the temp file as it arrives, then fsync and rename
        (not retried: the parts are consumed once).  Object stores: one retried ``put``."""
        if not self.local:
            super().put_parts(key, parts)
            return
        path = self._path(key)

        def fill(fd: int) -> None:
            advise = getattr(os, "posix_fadvise", None)
            offset = started = 0
            for part in parts:
                write_all(fd, part)
                offset += len(part)
                if advise is not None and offset - started >= _COPY_CHUNK:
                    # start the disk writes of this stretch now (as the kernel copy does), so
                    # fsync waits less, and drop the stretches written back by now from the page
                    # cache, so later writes reuse their pages instead of faulting in fresh memory
                    advise(fd, started, offset - started, os.POSIX_FADV_DONTNEED)
                    advise(fd, 0, started, os.POSIX_FADV_DONTNEED)
                    started = offset

        try:
            _atomic_local_commit(path, fill)
        except CheckpointError:
            raise
        except OSError as exc:
            raise CheckpointStorageError(f"cannot write {path}: {type(exc).__name__}: {exc}") from exc

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]],
                   into: Callable[[int], memoryview] | None = None) -> Iterator[bytes | memoryview]:
        """Local disk: one open file read with ``pread``, the kernel prefetching ``_PREFETCH``
        bytes ahead (``POSIX_FADV_WILLNEED``) while the caller checks and decodes."""
        if not self.local:
            yield from super().get_ranges(key, ranges, into)
            return
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise CheckpointNotFoundError(f"missing checkpoint file {path}") from exc
        except OSError as exc:
            raise CheckpointStorageError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
        advise = getattr(os, "posix_fadvise", None)
        prefetched = 0  # the kernel was asked to read everything below this offset
        try:
            if advise is not None:
                advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            for start, length in ranges:
                if advise is not None and start + length + _PREFETCH // 2 > prefetched:
                    prefetched = max(prefetched, start)
                    advise(fd, prefetched, _PREFETCH, os.POSIX_FADV_WILLNEED)
                    prefetched += _PREFETCH
                try:
                    data = _pread_full(fd, start, length, None if into is None else into(length))
                    if advise is not None:  # read: its page-cache pages can serve the prefetch
                        advise(fd, 0, start + len(data), os.POSIX_FADV_DONTNEED)
                except OSError as exc:
                    raise CheckpointStorageError(
                        f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
                yield data
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        path = self._path(key)

        def check() -> bool:
            if not self.local:
                self.fs.invalidate_cache(posixpath.dirname(path))
            return bool(self.fs.exists(path))

        return self._call(f"check {path}", check)

    def delete(self, key: str) -> None:
        path = self._path(key)

        def remove() -> None:
            _op("delete", path)
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass

        self._call(f"delete {path}", remove)

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

    def list_temporary(self) -> list[str]:
        if not self.local or not os.path.isdir(self.root):
            return []
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            found += [f if rel == "." else f"{rel}/{f}" for f in files if f.startswith(".tmp-")]
        return sorted(found)

    def list(self, prefix: str = "") -> list[str]:
        base = self.root

        def find() -> list[str]:
            _op("list", base)
            if not self.local:
                self.fs.invalidate_cache(base)
            try:
                return list(self.fs.find(base, withdirs=False))
            except FileNotFoundError:
                return []

        found = self._call(f"list {base}", find)
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


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _atomic_local_write(path: str, data: bytes) -> None:
    _atomic_local_commit(path, lambda fd: write_all(fd, data))


def _atomic_local_copy(path: str, source: str) -> None:
    """``path`` atomically replaced by a copy of the local file ``source`` (copied in the kernel)."""
    with open(source, "rb", buffering=0) as src:  # opened first: a missing source leaves no temp file
        _atomic_local_commit(path, lambda fd: _kernel_copy(src.fileno(), fd, start_writeback=True))


def _atomic_local_commit(path: str, fill: Callable[[int], None]) -> None:
    """Write a temp file in ``path``'s directory with ``fill(fd)``, fsync it, rename it over
    ``path`` and fsync the directory: readers see the old or the whole new file."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    _op("create-temp", tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _op("write", tmp)
        fill(fd)
        _op("fsync", tmp)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    _op("rename", path)
    os.replace(tmp, path)
    _op("fsync-dir", directory)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_COPY_CHUNK = 16 * 1024 * 1024
#: how far ahead of a ranged local read the kernel is asked to read
_PREFETCH = 128 * 1024 * 1024
#: errors of ``copy_file_range`` / ``link`` meaning "not supported here": fall back to a plain copy
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM,
                errno.EACCES, errno.EMLINK, errno.ETXTBSY}


def _kernel_copy(src_fd: int, dst_fd: int, *, start_writeback: bool = False) -> None:
    """Copy from ``src_fd``'s offset to its end into ``dst_fd``: ``copy_file_range`` (no copy
    through user space; a reflink where the file system can) with a read/write fallback.

    ``start_writeback`` (for a copy about to be fsynced): after each chunk, start the disk writes
    of the chunk (``POSIX_FADV_DONTNEED`` on dirty pages starts their writeback without waiting,
    like RocksDB's ``bytes_per_sync``), so the final fsync does not wait for the whole file.
    """
    advise = getattr(os, "posix_fadvise", None) if start_writeback else None
    offset = os.lseek(dst_fd, 0, os.SEEK_CUR) if advise is not None else 0
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            while n := copy_range(src_fd, dst_fd, _COPY_CHUNK):
                if advise is not None and n == _COPY_CHUNK:  # more follows: start the writes now
                    advise(dst_fd, offset, n, os.POSIX_FADV_DONTNEED)
                offset += n
            # some file systems report 0 ("nothing to copy") too early: finish with read/write
            if os.lseek(src_fd, 0, os.SEEK_CUR) >= os.fstat(src_fd).st_size:
                return
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
        # both offsets advanced by what was copied: continue from there
    buf = bytearray(_COPY_CHUNK)
    view = memoryview(buf)
    while n := os.readv(src_fd, [buf]):
        write_all(dst_fd, view[:n])
        if advise is not None and n == _COPY_CHUNK:
            advise(dst_fd, offset, n, os.POSIX_FADV_DONTNEED)
        offset += n


def _pread_full(fd: int, start: int, length: int, buffer: memoryview | None = None
                ) -> bytes | memoryview:
    """``length`` bytes at ``start`` (fewer only at the end of the file), read into ``buffer``
    (and its filled part returned) when one is given."""
    if buffer is None:
        buffer = memoryview(bytearray(length))
    got = 0
    while got < length and (n := os.preadv(fd, [buffer[got:length]], start + got)):
        got += n
    return buffer[:got]


def _local_copy(source: str, dest: str) -> None:
    """``dest`` (created or truncated) as a kernel copy of ``source``; not fsynced (a restore target)."""
    with open(source, "rb", buffering=0) as src:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _kernel_copy(src.fileno(), fd)
        finally:
            os.close(fd)


def _try_link(source: str, dest: str) -> bool:
    """Hard-link ``source`` as ``dest`` (replacing it); False when the file system cannot."""
    tmp = os.path.join(os.path.dirname(dest) or ".", f".tmp-{uuid.uuid4().hex}")
    try:
        os.link(source, tmp)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    try:
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def write_local_file(path: str, data: bytes) -> None:
    """``path`` created or truncated and filled with ``data`` (a restore target: no fsync)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
