"""Writing and reading state data for one checkpoint: inline chunks, exclusive and shared files.

Every handle records size and CRC-32; the reader verifies both, and never follows a path that
leaves the checkpoint's root.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import threading
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

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


def safe_name(text: str) -> str:
    """``text`` usable in a file name: every run of other characters becomes one ``_``."""
    return _UNSAFE.sub("_", text)


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
        self.task = safe_name(task_name)
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
        suffix = f"{self.task}-{safe_name(shared_name or state_name)}-{uuid.uuid4().hex[:12]}"
        if shared_name is not None and self.allow_shared:
            return SHARED_PREFIX + suffix
        return self.prefix + suffix

    def _wrote(self, key: str, size: int) -> None:
        with self._lock:
            self.written.append(key)
            self.bytes_written += size

    def write_parts(self, parts: Iterable[bytes], *, state_name: str, shared_name: str | None = None
                    ) -> tuple[dict[str, Any], list[list[int]]]:
        """Store the concatenation of ``parts`` (chunks the caller produces lazily); returns the
        handle, as :meth:`write` of the joined bytes, and ``[offset, length, crc]`` per part.

        A helper thread checksums and writes each part while the caller produces the next (CRC-32
        and file writes release the GIL), so the file is never held in memory whole; the file's
        CRC is combined from the parts'.  A result under ``inline_threshold`` becomes inline.
        """
        it = iter(parts)
        head: list[bytes] = []
        total = 0
        while shared_name is None and total < self.inline_threshold:
            part = next(it, None)
            if part is None:  # small: one inline handle
                data = b"".join(head)
                return self.write(data, state_name=state_name), _part_locations(head)
            head.append(part)
            total += len(part)
            self._check(total, state_name)
        key = self._key(state_name, shared_name)
        locs: list[list[int]] = []
        feed: queue.Queue[Any] = queue.Queue(maxsize=4)
        failed: list[BaseException] = []
        ended_seen: list[bool] = []  # the writer has taken the producer's end marker

        def consume() -> Iterator[bytes]:
            offset = 0
            while (part := feed.get()) is not None:
                if isinstance(part, BaseException):
                    ended_seen.append(True)
                    raise part
                locs.append([offset, len(part), zlib.crc32(part)])
                offset += len(part)
                yield part
            ended_seen.append(True)

        def writer() -> None:
            try:
                self.store.put_parts(key, consume())
            except BaseException as exc:  # re-raised on the producing thread
                failed.append(exc)
                while not ended_seen:  # drain, so the producer never blocks on a dead writer
                    if isinstance(feed.get(), BaseException | None):
                        ended_seen.append(True)

        thread = threading.Thread(target=writer, name="statekit-writer", daemon=True)
        thread.start()
        ended: BaseException | None = None
        try:
            for part in head:
                feed.put(part)
            for part in it:
                if failed:
                    break
                total += len(part)
                self._check(total, state_name)
                feed.put(part)
        except BaseException as exc:
            ended = exc
        feed.put(ended)
        thread.join()
        if ended is not None:
            raise ended
        if failed:
            raise failed[0]
        self._wrote(key, total)
        return {"type": "file", "path": key, "size": total, "crc": _combined_crc(locs)}, locs

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

    def read_parts(self, handle: dict[str, Any], locations: list[list[int]]
                   ) -> Iterator[bytes | memoryview]:
        """The ``[offset, length, crc]`` parts of ``handle`` in order, each verified before it is
        handed out (as a ``memoryview``, valid until the next part is requested).

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
        ahead: queue.Queue[Any] = queue.Queue()
        # reused read buffers (also bounding the read-ahead): fresh memory for every read costs
        # page faults a restore cannot spare
        free: queue.Queue[bytearray | None] = queue.Queue()
        size = max((length for _, length, _ in spans), default=0)
        for _ in range(_READ_BUFFERS):
            free.put(bytearray(size))

        def into(length: int) -> memoryview:
            buffer = free.get()
            if buffer is None:
                raise _Stopped
            return memoryview(buffer)[:length]

        def read_ahead() -> None:
            try:
                ranges = [(start, length) for start, length, _ in spans]
                for data, (_, length, parts) in zip(self.store.get_ranges(path, ranges, into),
                                                    spans, strict=False):
                    intact = len(data) == length and zlib.crc32(data) == _combined_crc(parts)
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
                for offset, length, crc in parts:
                    at = offset - start
                    part = view[at:at + length]
                    yield part if intact else _verified(path, part, offset, length, crc)
                free.put(view.obj)  # its parts were handed out: the buffer may be refilled
        finally:
            free.put(None)  # stops a reader waiting for a buffer
            thread.join()

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
        if offset is not None:
            return _verified(where, data, offset, length, crc)
        if len(data) != handle.get("size"):
            raise TruncatedCheckpointError(
                f"{where}: {len(data)} bytes, metadata records {handle.get('size')}"
            )
        return _verified(where, data, 0, len(data), handle.get("crc"))

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


#: one reused, cache-sized buffer: each chunk is checksummed while still in the CPU cache
_CRC_CHUNK = 1024 * 1024
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
    """CRC-32 and length of a local file, read sequentially into one reused 1 MiB buffer.

    The kernel's sequential read-ahead keeps a cold file's disk reads going while a chunk is
    checksummed; a reader thread with 8 MiB buffers measured slower, hot (checkpoint) and cold
    (restore), and competed with the copy for the CPU.
    """
    with open(local_path, "rb", buffering=0) as fh:
        if hasattr(os, "posix_fadvise"):  # a larger read-ahead window
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(_CRC_CHUNK)
        view = memoryview(buf)
        crc = total = 0
        while got := fh.readinto(buf):
            crc = zlib.crc32(view[:got], crc)
            total += got
        return crc, total


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


_Data = TypeVar("_Data", bytes, memoryview)


def _verified(where: str, data: _Data, offset: int, length: int | None, crc: int | None) -> _Data:
    """``data`` read for ``length`` bytes at ``offset``, checked for length and CRC-32."""
    if len(data) != length:
        raise TruncatedCheckpointError(
            f"{where}: chunk at {offset} is short ({len(data)} of {length} bytes)"
        )
    if crc is not None and zlib.crc32(data) != crc:
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


def _combined_crc(parts: list[list[int]]) -> int:
    """CRC-32 of consecutive parts from their ``[offset, length, crc]``."""
    crc = 0
    for _, length, part_crc in parts:
        crc = crc32_combine(crc, int(part_crc), int(length))
    return crc


def _part_locations(parts: list[bytes]) -> list[list[int]]:
    locs, offset = [], 0
    for part in parts:
        locs.append([offset, len(part), zlib.crc32(part)])
        offset += len(part)
    return locs


_CRC_POLY = 0xEDB88320


def _gf2_times(matrix: list[int], vector: int) -> int:
    out, row = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[row]
        vector >>= 1
        row += 1
    return out


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


@functools.cache
def _zero_operators() -> tuple[list[int], ...]:
    """Operator ``i`` advances a CRC-32 over ``2**i`` zero bytes (zlib's ``crc32_combine``)."""
    one_bit = [_CRC_POLY] + [1 << (n - 1) for n in range(1, 32)]
    matrix = _gf2_square(_gf2_square(one_bit))  # four zero bits
    ops = []
    for _ in range(64):
        matrix = _gf2_square(matrix)  # 8, 16, 32... zero bits
        ops.append(matrix)
    return tuple(ops)


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (no pass over the data)."""
    ops = _zero_operators()
    bit = 0
    while length2:
        if length2 & 1:
            crc1 = _gf2_times(ops[bit], crc1)
        length2 >>= 1
        bit += 1
    return crc1 ^ crc2
