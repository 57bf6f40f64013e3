"""Reading state back from a checkpoint: every handle verified for size and CRC-32, and no path
followed that leaves the checkpoint's root.

Plain parts are read ahead in spans on a helper thread into a few reused buffers (fresh memory
costs page faults a restore cannot spare), each span checked with one CRC-32 while the caller
decodes the previous one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from statekit.checkpoint.blobstore.base import BlobStore, check_key, write_local_file
from statekit.checkpoint.checksum import combined_crc, crc32, file_crc
from statekit.errors import (
    ChecksumMismatchError,
    CorruptCheckpointError,
    TruncatedCheckpointError,
)

#: ranged reads in flight at once on a store that is not the local disk (each a round trip)
RANGE_READERS = 4


class StateReader:
    """Reads handles back from a checkpoint's root, verifying size and checksum."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self._sized: set[str] = set()  # files whose real size was found to be the recorded one
        self._read = 0
        self._count_lock = threading.Lock()

    @property
    def bytes_read(self) -> int:
        """Bytes of checkpoint files read through this reader so far (a linked file counts with
        its size: it is read for its checksum)."""
        return self._read

    def _count(self, n: int) -> None:
        with self._count_lock:
            self._read += n

    def _check_size(self, handle: dict[str, Any], path: str) -> int:
        """The file's size after checking it is the one its handle records: a file longer than
        recorded is as damaged as a shorter one (TruncatedCheckpointError), whatever part of it
        a reader asks for.  Checked once per file and reader."""
        recorded = handle.get("size")
        if path in self._sized:
            return recorded  # type: ignore[return-value]
        real = self.store.size(path)
        if real != recorded:
            raise TruncatedCheckpointError(f"{path}: {real} bytes, metadata records {recorded}")
        self._sized.add(path)
        return real

    def read_parts(self, handle: dict[str, Any], locations: list[list[int]], *,
                   owned: bool = False) -> Iterator[bytes | memoryview]:
        """The ``[offset, length, crc]`` parts of ``handle`` in order, each verified before it is
        handed out (as a ``memoryview``, valid until the next part is requested; with ``owned``,
        for as long as the caller keeps it: each span is read into fresh memory).

        A helper thread reads ahead in spans of up to ``_SPAN`` bytes (the kernel prefetching
        further) and checks each span with one CRC-32 against the combination of its parts' CRCs
        while the caller decodes; only a span that fails is checked part by part, to hand out the
        good parts before the typed error.  (A reader thread that checksummed every part waited
        for the GIL twice per part and halved restores.)
        """
        if handle.get("type") != "file":
            for offset, length, crc in locations:
                yield self.read(handle, offset, length, crc)
            return
        path = check_key(str(handle.get("path")))
        spans = _spans(locations)
        # buffers never larger than the real file (a forged part length of 256 MiB in an 836-byte
        # file allocated a gigabyte), which is the recorded size (the parts tile it)
        real = self._check_size(handle, path)
        ahead: queue.Queue[Any] = queue.Queue()
        # reused read buffers (also bounding the read-ahead): fresh memory for every read costs
        # page faults a restore cannot spare
        # (kept parts: fresh bytes per read, the queue holding only turns)
        free: queue.Queue[bytearray | bool | None] = queue.Queue()
        size = min(max((length for _, length, _ in spans), default=0), real)
        for _ in range(_READ_BUFFERS):
            free.put(True if owned else bytearray(size))

        def into(length: int) -> memoryview:
            buffer = free.get()
            if buffer is None:
                raise _Stopped
            assert isinstance(buffer, bytearray)
            return memoryview(buffer)[:length]

        def turns(source: Iterator[bytes | memoryview]) -> Iterator[bytes | memoryview]:
            while free.get() is not None:  # a read only once a span was handed out
                data = next(source, None)
                if data is None:
                    return
                yield data
            raise _Stopped

        def read_ahead() -> None:
            try:
                ranges = [(start, length) for start, length, _ in spans]
                source = (turns(self.store.get_ranges(path, ranges)) if owned
                          else self.store.get_ranges(path, ranges, into))
                for data, (_, length, parts) in zip(source, spans, strict=False):
                    self._count(len(data))
                    intact = len(data) == length and crc32(data) == combined_crc(parts)
                    ahead.put((data, intact))
                ahead.put(None)
            except _Stopped:
                return
            except BaseException as exc:  # re-raised on the decoding thread
                ahead.put(exc)

        thread = threading.Thread(target=read_ahead, name="statekit-read-ahead", daemon=True)
        thread.start()
        try:
            for start, _, parts in spans:
                item = ahead.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    raise TruncatedCheckpointError(f"{path}: fewer parts than its metadata records")
                view, intact = item
                view = memoryview(view)  # (parts are slices of it, never copies)
                for offset, length, crc in parts:
                    at = offset - start
                    part = view[at:at + length]
                    yield part if intact else _verified(path, part, offset, length, crc)
                # its parts were handed out: the buffer may be refilled, unless they are kept
                free.put(True if owned else view.obj)
        finally:
            free.put(None)  # stops a reader waiting for a buffer
            thread.join()

    def read_ranges(self, handle: dict[str, Any], locations: list[list[int]]
                    ) -> Iterator[bytes | memoryview]:
        """Far-apart ``[offset, length, crc]`` ranges of one handle (the heads of its parts), in
        order, each verified.  A local file is opened once with the kernel asked for every range
        at once (a read per range cost more in Python than the reads themselves); other stores
        fetch the ranges on :data:`RANGE_READERS` threads (each a round trip)."""
        if handle.get("type") != "file" or not self.store.local:
            with ThreadPoolExecutor(RANGE_READERS, thread_name_prefix="statekit-ranges") as pool:
                yield from pool.map(lambda loc: self.read(handle, *loc), locations)
            return
        path = check_key(str(handle.get("path")))
        self._check_size(handle, path)
        ranges = [(offset, length) for offset, length, _ in locations]
        for data, (offset, length, crc) in zip(self.store.get_ranges(path, ranges, sparse=True),
                                               locations, strict=True):
            self._count(len(data))
            yield _verified(path, data, offset, length, crc)

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
            if offset is not None:
                self._check_size(handle, path)
            if offset is None:
                data = self.store.get(path)
            else:  # (an empty range reads nothing: some stores take length 0 as "to the end")
                data = self.store.get(path, offset, length) if length else b""
            self._count(len(data))
        else:
            raise CorruptCheckpointError(f"unknown state handle type {kind!r}")
        where = handle.get("path", "inline state")
        if offset is not None:
            return _verified(where, data, offset, length, crc)
        if len(data) != handle.get("size"):
            raise TruncatedCheckpointError(
                f"{where}: {len(data)} bytes, metadata records {handle.get('size')}"
            )
        return _verified(where, data, 0, len(data), handle.get("crc"))

    def check(self, handle: dict[str, Any], progress: Callable[[int], None] | None = None) -> int:
        """Verify the handle's bytes (path, size, CRC-32) without holding a file in memory: a file
        is read in spans of up to ``_SPAN`` bytes; ``progress(n)`` is told each span's size.
        Returns the size; typed errors as :meth:`read`."""
        if handle.get("type") != "file":
            size = len(self.read(handle))
            if progress is not None:
                progress(size)
            return size
        path = check_key(str(handle.get("path")))
        size = handle.get("size")
        if not isinstance(size, int) or size < 0:
            raise CorruptCheckpointError(f"{path}: metadata records no valid size")
        # the last span asks for one byte more: a longer file is as damaged as a shorter one
        ranges = [(start, min(_SPAN, size - start)) for start in range(0, size, _SPAN)]
        if ranges:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + 1)
        crc = seen = 0
        spans = self.store.get_ranges(path, ranges) if ranges else [self.store.get(path)]
        for data in spans:
            self._count(len(data))
            crc, seen = crc32(data, crc), seen + len(data)
            if progress is not None:
                progress(len(data))
        if seen != size:
            raise TruncatedCheckpointError(f"{path}: {seen} bytes, metadata records {size}")
        if crc != handle.get("crc"):
            raise ChecksumMismatchError(f"{path}: checksum mismatch")
        return size

    def read_file(self, handle: dict[str, Any], local_path: str | os.PathLike[str], *,
                  allow_link: bool = False, deferred: list[FileCheck] | None = None) -> None:
        """Write the handle's bytes into the local file ``local_path``, verifying size and CRC-32
        (TruncatedCheckpointError / ChecksumMismatchError; the bad file is removed).

        ``allow_link`` lets a local-disk store hard-link the checkpoint file instead of copying it:
        only for files that are never modified in place (RocksDB's SST files).  With
        ``deferred``, a file that was hard-linked is checked for its size now and its CRC-32 is
        left to the caller (a :class:`FileCheck` appended to ``deferred``): reading a linked file
        whole is the only read of it a restore would otherwise make.
        """
        kind = handle.get("type")
        if kind == "inline":
            write_local_file(os.fspath(local_path), self.read(handle))
            return
        if kind != "file":
            raise CorruptCheckpointError(f"unknown state handle type {kind!r}")
        path = check_key(str(handle.get("path")))
        self.store.get_file(path, local_path, allow_link=allow_link)
        self._count(int(handle.get("size") or 0))
        try:
            info = os.stat(local_path)
            size = info.st_size
            if size != handle.get("size"):
                raise TruncatedCheckpointError(f"{path}: {size} bytes, metadata records {handle.get('size')}")
            if deferred is not None and info.st_nlink > 1:  # linked, not copied
                deferred.append(FileCheck(os.fspath(local_path), size, handle.get("crc"), path))
                return
            crc, seen = file_crc(local_path)
            if seen != size:
                raise TruncatedCheckpointError(f"{path}: {seen} bytes read, {size} expected")
            if crc != handle.get("crc"):
                raise ChecksumMismatchError(f"{path}: checksum mismatch")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(local_path)
            raise


_Data = TypeVar("_Data", bytes, memoryview)


def _verified(where: str, data: _Data, offset: int, length: int | None, crc: int | None) -> _Data:
    """``data`` read for ``length`` bytes at ``offset``, checked for length and CRC-32."""
    if len(data) != length:
        raise TruncatedCheckpointError(
            f"{where}: chunk at {offset} is short ({len(data)} of {length} bytes)"
        )
    if crc is not None and crc32(data) != crc:
        raise ChecksumMismatchError(f"{where}: checksum mismatch")
    return data


#: the largest read of :meth:`StateReader.read_parts` (unless one part is larger), and how many
#: such reads are buffered
_SPAN = 16 * 1024 * 1024
_READ_BUFFERS = 4


class _Stopped(Exception):
    """The consumer of :meth:`StateReader.read_parts` stopped early; the reader ends quietly."""


def _spans(locations: list[list[int]]) -> list[tuple[int, int, list[list[int]]]]:
    """Consecutive parts grouped into reads of up to ``_SPAN`` bytes: ``(start, length, parts)``."""
    spans: list[tuple[int, int, list[list[int]]]] = []
    for loc in locations:
        offset, length = int(loc[0]), int(loc[1])
        if spans:
            start, size, parts = spans[-1]
            if offset == start + size and size + length <= _SPAN:
                parts.append(loc)
                spans[-1] = (start, size + length, parts)
                continue
        spans.append((offset, length, [loc]))
    return spans


@dataclass(frozen=True)
class FileCheck:
    """A local file's CRC-32 check left for later (:meth:`StateReader.read_file` ``deferred``)."""

    local_path: str
    size: int
    crc: Any
    where: str

    def run(self) -> None:
        """TruncatedCheckpointError / ChecksumMismatchError unless the file is still the one its
        handle records."""
        crc, seen = file_crc(self.local_path)
        if seen != self.size:
            raise TruncatedCheckpointError(f"{self.where}: {seen} bytes read, {self.size} expected")
        if crc != self.crc:
            raise ChecksumMismatchError(f"{self.where}: checksum mismatch")
