"""The local-disk blob store: atomic commits by temp file, fsync and rename, and kernel copies.

A write goes to a temp file in the key's directory, is fsynced, renamed over the key, and the
directory is fsynced: readers see the old or the whole new file, also after a crash.  Whole files
move by ``copy_file_range`` (starting the disk's writeback per 16 MiB, so the final fsync waits
less), restores may hard-link immutable files, and ranged reads use ``pread`` with the kernel
prefetching ahead.  Stretches already written back or read are dropped from the page cache, so
later I/O reuses those pages instead of faulting in fresh memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

import fsspec

from statekit.checkpoint.blobstore.base import (
    PathBlobStore,
    run_operation_hook,
    write_all,
)
from statekit.checkpoint.blobstore.beneath import check_no_links, open_regular
from statekit.checkpoint.blobstore.retry import RetryPolicy
from statekit.errors import CheckpointError, CheckpointNotFoundError, CheckpointStorageError


class LocalBlobStore(PathBlobStore):
    """Blobs as files under the local directory ``root`` (a path or ``file://`` URL).

    Transient OS errors are retried per ``retry``; permanent ones become typed checkpoint errors.
    Blobs are read only as regular files reached without following a link below ``root``, and
    nothing is written or deleted through one (:mod:`~statekit.checkpoint.blobstore.beneath`).
    """

    def __init__(self, root: str, *, retry: RetryPolicy | None = None) -> None:
        self.root_url = root.rstrip("/") or "/"
        self.retry = retry if retry is not None else RetryPolicy()
        _, path = fsspec.core.url_to_fs(self.root_url)  # the local file system's path rules
        self.root = path.rstrip("/") if path != "/" else path

    @property
    def supports_links(self) -> bool:
        return True

    @property
    def supports_streamed_writes(self) -> bool:
        return True

    @property
    def supports_temporary_files(self) -> bool:
        return True

    @property
    def local(self) -> bool:
        """Blobs are files on this machine (kept for code that checked ``FsspecBlobStore.local``)."""
        return True

    def _writable(self, key: str) -> str:
        """The path of ``key``, refused when a component below the root is a link."""
        path = self._path(key)
        check_no_links(self.root, key)
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._writable(key)
        self._call(f"write {path}", lambda: _atomic_local_write(path, data))

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """A kernel copy into a temp file, fsync, rename, fsync the directory (as ``put``)."""
        path, source = self._writable(key), os.fspath(local_path)
        self._call(f"write {path}", lambda: _atomic_local_copy(path, source))

    def get_file(self, key: str, local_path: str | os.PathLike[str], *, allow_link: bool = False) -> None:
        """A hard link when allowed and possible, else a kernel copy (retried per the policy)."""
        path, dest = self._path(key), os.fspath(local_path)
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)  # never "missing blob"

        def fetch() -> None:
            fd, info = open_regular(self.root, key)
            try:
                if allow_link and _try_link(path, dest, info):
                    return
                _local_copy(fd, dest)
            finally:
                os.close(fd)

        self._read(path, fetch)

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            fd, info = open_regular(self.root, key)
            with open(fd, "rb", closefd=True) as fh:
                begin = start or 0
                # never a buffer larger than the file holds (a forged length allocated gigabytes)
                available = max(0, info.st_size - begin)
                if begin:
                    fh.seek(begin)
                return fh.read(available if length is None else min(length, available))

        return self._read(path, read)

    def size(self, key: str) -> int:
        path = self._path(key)

        def stat_size() -> int:
            fd, info = open_regular(self.root, key)
            os.close(fd)
            return info.st_size

        return self._read(path, stat_size)

    def put_parts(self, key: str, parts: Iterable[bytes]) -> None:
        """Each part written into the temp file as it arrives, then fsync and rename (not
        retried: the parts are consumed once)."""
        path = self._writable(key)

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
        """One open file read with ``pread``, the kernel prefetching ``_PREFETCH`` bytes ahead
        (``POSIX_FADV_WILLNEED``) while the caller checks and decodes."""
        path = self._path(key)
        try:
            fd, _ = open_regular(self.root, key)
        except CheckpointError:
            raise
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
        return self._call(f"check {path}", lambda: os.path.lexists(path))

    def delete(self, key: str) -> None:
        path = self._writable(key)

        def remove() -> None:
            run_operation_hook("delete", path)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

        self._call(f"delete {path}", remove)

    def delete_prefix(self, prefix: str) -> None:
        """The blobs under ``prefix``, and the directories that emptied."""
        super().delete_prefix(prefix)
        path = self._path(prefix.rstrip("/")) if prefix else self.root
        if os.path.isdir(path):
            for dirpath, _dirs, _files in sorted(os.walk(path), reverse=True):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass

    def list_temporary(self) -> list[str]:
        if not os.path.isdir(self.root):
            return []
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            found += [f if rel == "." else f"{rel}/{f}" for f in files if f.startswith(".tmp-")]
        return sorted(found)

    def list(self, prefix: str = "") -> list[str]:
        base = self.root

        def find() -> list[str]:
            run_operation_hook("list", base)
            found = []
            for dirpath, _dirs, files in os.walk(base):
                rel = os.path.relpath(dirpath, base)
                found += [f if rel == "." else f"{rel}/{f}" for f in files]
            return found

        found = self._call(f"list {base}", find)
        return sorted(k for k in found
                      if k.startswith(prefix) and not os.path.basename(k).startswith(".tmp-"))


# --- local-disk system calls -----------------------------------------------------------------------


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
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileNotFoundError, FileExistsError, NotADirectoryError) as exc:  # not "missing"
        raise CheckpointStorageError(f"cannot create the directory {directory}: "
                                     f"{type(exc).__name__}: {exc}") from exc
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    run_operation_hook("create-temp", tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        run_operation_hook("write", tmp)
        fill(fd)
        run_operation_hook("fsync", tmp)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    run_operation_hook("rename", path)
    os.replace(tmp, path)
    run_operation_hook("fsync-dir", directory)
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
    if buffer is None:  # sized by what the file holds, never by an untrusted length alone
        buffer = memoryview(bytearray(max(0, min(length, os.fstat(fd).st_size - start))))
    got = 0
    while got < length and (n := os.preadv(fd, [buffer[got:length]], start + got)):
        got += n
    return buffer[:got]


def _local_copy(source_fd: int, dest: str) -> None:
    """``dest`` (created or truncated) as a kernel copy of the open file ``source_fd`` (from its
    start); not fsynced (a restore target)."""
    os.lseek(source_fd, 0, os.SEEK_SET)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _kernel_copy(source_fd, fd)
    finally:
        os.close(fd)


def _try_link(source: str, dest: str, expected: os.stat_result) -> bool:
    """Hard-link ``source`` as ``dest`` (replacing it); False when the file system cannot, or
    when what got linked is not the file opened and checked as ``expected`` (a link swapped in)."""
    tmp = os.path.join(os.path.dirname(dest) or ".", f".tmp-{uuid.uuid4().hex}")
    try:
        os.link(source, tmp, follow_symlinks=False)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    try:
        linked = os.stat(tmp, follow_symlinks=False)
        if (linked.st_dev, linked.st_ino) != (expected.st_dev, expected.st_ino):
            os.unlink(tmp)
            return False
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True
