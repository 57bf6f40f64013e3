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
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import make_path_posix

from statekit.checkpoint.blobstore import beneath
from statekit.checkpoint.blobstore.base import (
    PathBlobStore,
    check_key,
    is_url,
    run_operation_hook,
    write_all,
)
from statekit.checkpoint.blobstore.beneath import open_regular
from statekit.checkpoint.blobstore.partwriter import PartWriter
from statekit.checkpoint.blobstore.retry import RetryPolicy
from statekit.errors import (
    CheckpointError,
    CheckpointStorageError,
    MissingFileError,
)


class LocalBlobStore(PathBlobStore):
    """Blobs as files under the local directory ``root`` (a path or ``file://`` URL).

    Transient OS errors are retried per ``retry``; permanent ones become typed checkpoint errors.
    Blobs are regular files reached without following a link below ``root``: each is read,
    written and deleted relative to its opened parent directory, never through a link, and a
    listing holds no links (:mod:`~statekit.checkpoint.blobstore.beneath`).
    """

    def __init__(self, root: str, *, retry: RetryPolicy | None = None) -> None:
        self.root_url = root.rstrip("/") or "/"
        self.retry = retry if retry is not None else RetryPolicy()
        self.root = local_path(self.root_url)

    @property
    def supports_links(self) -> bool:
        return True

    @property
    def supports_streamed_writes(self) -> bool:
        return True

    @property
    def writes_parts_beside(self) -> bool:
        return True

    @property
    def supports_temporary_files(self) -> bool:
        return True

    @property
    def local(self) -> bool:
        """Blobs are files on this machine (kept for code that checked ``FsspecBlobStore.local``)."""
        return True

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._call(f"write {path}", lambda: _atomic_local_commit(
            self.root, key, lambda fd: write_all(fd, data)))

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        """A kernel copy into a temp file, fsync, rename, fsync the directory (as ``put``)."""
        path, source = self._path(key), os.fspath(local_path)

        def transfer() -> None:
            with open(source, "rb", buffering=0) as src:  # first: a missing source leaves no temp
                _atomic_local_commit(self.root, key, lambda fd: _kernel_copy(
                    src.fileno(), fd, start_writeback=True))

        self._call(f"write {path}", transfer)

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
        """Each part written into the temp file as it arrives (on a helper thread while the
        next is produced: :class:`PartWriter`), then fsync and rename (not retried: the parts
        are consumed once)."""
        path = self._path(key)

        def fill(fd: int) -> None:
            with PartWriter(fd) as writer:
                for part in parts:
                    writer.add(part)
                    del part  # not held while the next one is produced (a reused buffer)

        try:
            _atomic_local_commit(self.root, key, fill)
        except CheckpointError:
            raise
        except OSError as exc:
            raise CheckpointStorageError(f"cannot write {path}: {type(exc).__name__}: {exc}") from exc

    def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]],
                   into: Callable[[int], memoryview] | None = None, *, sparse: bool = False
                   ) -> Iterator[bytes | memoryview]:
        """One open file read with ``pread``, the kernel prefetching ``_PREFETCH`` bytes ahead
        (``POSIX_FADV_WILLNEED``) while the caller checks and decodes; ``sparse`` ranges are
        all asked for at once instead, and nothing else is read (the kernel reads them in
        parallel while the first are copied out)."""
        path = self._path(key)
        try:
            fd, _ = open_regular(self.root, key)
        except CheckpointError:
            raise
        except FileNotFoundError as exc:
            raise MissingFileError(path) from exc
        except OSError as exc:
            raise CheckpointStorageError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
        advise = getattr(os, "posix_fadvise", None)
        prefetched = 0  # the kernel was asked to read everything below this offset
        try:
            if sparse:
                yield from _sparse_reads(fd, path, ranges, into, advise)
                return
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
        """Unlink the regular file ``key`` relative to its opened parent directory: a link (or a
        directory swapped for one) is never followed, and a link itself is left alone
        (UnsafePathError)."""
        path = self._path(key)
        self._call(f"delete {path}", lambda: beneath.unlink(
            self.root, key, lambda: run_operation_hook("delete", path)))

    def delete_prefix(self, prefix: str) -> None:
        """The blobs under ``prefix``, and the directories that emptied."""
        super().delete_prefix(prefix)
        self.prune(prefix)

    def prune(self, prefix: str) -> None:
        """Remove the directories under ``prefix`` (and its own) that are empty."""
        names = [n for n in check_key(prefix.rstrip("/")).split("/") if n] if prefix.strip("/") else []
        beneath.prune(self.root, names)

    def remove_if_empty(self) -> None:
        self.prune("")
        with contextlib.suppress(OSError):  # not empty (or gone): it stays as it is
            os.rmdir(self.root)

    def list_temporary(self) -> list[str]:
        return sorted(k for k in beneath.regular_files(self.root) if _TEMP.fullmatch(k.rsplit("/", 1)[-1]))

    def list(self, prefix: str = "") -> list[str]:
        base = self.root

        def find() -> list[str]:
            run_operation_hook("list", base)
            return list(beneath.regular_files(base))

        found = self._call(f"list {base}", find)
        return sorted(k for k in found
                      if k.startswith(prefix) and not os.path.basename(k).startswith(".tmp-"))


def local_path(url: str) -> str:
    """The absolute local path a plain path or ``file://`` URL names.  Only a URL with another
    scheme goes through fsspec's URL parser: it reads ``::`` as a chain of file systems, and a
    directory named ``a::b`` became ``a`` (a store rooted in the wrong directory)."""
    if url.startswith("file://"):
        path = url[len("file://"):]
    elif is_url(url):
        _, path = fsspec.core.url_to_fs(url)
    else:
        path = url
    path = make_path_posix(path)  # absolute, ``~`` expanded: the local file system's rules
    return path.rstrip("/") if path.rstrip("/") else "/"


# --- local-disk system calls -----------------------------------------------------------------------

#: temp files of interrupted writes (``.tmp-`` and a uuid's 32 hex digits)
_TEMP = re.compile(r"\.tmp-[0-9a-f]+")


def _atomic_local_commit(root: str, key: str, fill: Callable[[int], None]) -> None:
    """Write a temp file in ``key``'s directory with ``fill(fd)``, fsync it, rename it over
    ``key`` and fsync the directory: readers see the old or the whole new file.  Every step acts
    relative to the directory opened (and created) without following links below ``root``."""
    parent, name = beneath.parent_of(root, key, create=True)
    directory = os.path.dirname(f"{root}/{key}")
    try:
        tmp = f".tmp-{uuid.uuid4().hex}"
        run_operation_hook("create-temp", f"{directory}/{tmp}")
        fd = os.open(tmp, beneath.CREATE, 0o644, dir_fd=parent)
        try:
            run_operation_hook("write", f"{directory}/{tmp}")
            fill(fd)
            run_operation_hook("fsync", f"{directory}/{tmp}")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=parent)
            raise
        os.close(fd)
        run_operation_hook("rename", f"{directory}/{name}")
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        run_operation_hook("fsync-dir", directory)
        os.fsync(parent)
    finally:
        os.close(parent)


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


def _sparse_reads(fd: int, path: str, ranges: Sequence[tuple[int, int]],
                  into: Callable[[int], memoryview] | None, advise: Any
                  ) -> Iterator[bytes | memoryview]:
    """``pread`` of far-apart ranges of one open file, while a helper thread asks the kernel for
    all of them (asking can block while the disk is busy: the reads go on meanwhile)."""
    def ask() -> None:
        with contextlib.suppress(OSError):  # only advice: the reads report real errors
            advise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for start, length in ranges:
                if length:
                    advise(fd, start, length, os.POSIX_FADV_WILLNEED)

    helper = None
    if advise is not None and len(ranges) > 1:
        helper = threading.Thread(target=ask, name="statekit-read-advice", daemon=True)
        helper.start()
    try:
        for start, length in ranges:
            yield _pread_full(fd, start, length, None if into is None else into(length))
    except OSError as exc:
        raise CheckpointStorageError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        if helper is not None:
            helper.join()  # before the caller closes the file


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
