"""Writing state data for one checkpoint: inline chunks, exclusive and shared files.

Every handle records size and CRC-32 (:mod:`statekit.checkpoint.handles`); reading them back is
:mod:`statekit.checkpoint.reader`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.checksum import crc32, crc32_combine, crc_while_copying, part_locations
from statekit.checkpoint.handles import file_handle, inline_handle
from statekit.errors import CheckpointError, StateSizeError

SHARED_PREFIX = "shared/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: the name of every file :class:`CheckpointStreams` writes (``<task>-<state>-<12 hex digits>``),
#: so that garbage collection deletes nothing else
STATE_FILE = re.compile(r"[A-Za-z0-9_.-]*-[0-9a-f]{12}")
#: the most characters of a task or state name in a file name (the uuid suffix keeps it unique;
#: file systems take 255 bytes per name)
_NAME_IN_FILE = 96


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
        self.task = safe_name(task_name)[:_NAME_IN_FILE]
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
        name = safe_name(shared_name or state_name)[:_NAME_IN_FILE]
        suffix = f"{self.task}-{name}-{uuid.uuid4().hex[:12]}"
        if shared_name is not None and self.allow_shared:
            return SHARED_PREFIX + suffix
        return self.prefix + suffix

    def _wrote(self, key: str, size: int) -> None:
        with self._lock:
            self.written.append(key)
            self.bytes_written += size

    def write_parts(self, parts: Iterable[bytes | memoryview], *, state_name: str,
                    shared_name: str | None = None, beside: bool = False
                    ) -> tuple[dict[str, Any], list[list[int]]]:
        """Store the concatenation of ``parts`` (chunks the caller produces lazily, each valid
        while it is held); returns the handle, as :meth:`write` of the joined bytes, and
        ``[offset, length, crc]`` per part.  A result under ``inline_threshold`` becomes
        inline.  The local disk writes each part as it comes, so the file is never held in
        memory whole (once the file is large, on a helper thread of its own while the next part
        is produced: :class:`PartWriter`).

        ``beside``: the producer paces itself beside a processing thread; a store without a
        writer of its own then takes the parts on a helper thread, so the writes go on while the
        producer yields the GIL (without it the snapshot took 1.2x as long and the processing
        thread ran 0.85x as fast)."""
        it = iter(parts)
        head: list[bytes | memoryview] = []
        total = 0
        while shared_name is None and total < self.inline_threshold:
            part = next(it, None)
            if part is None:  # small: one inline handle
                data = b"".join(head)
                return self.write(data, state_name=state_name), part_locations(head)
            head.append(part)
            total += len(part)
            self._check(total, state_name)
        part = None  # the head holds it until written
        key = self._key(state_name, shared_name)
        locs: list[list[int]] = []
        whole = 0  # the file's CRC, combined part by part

        def checked() -> Iterator[bytes | memoryview]:
            nonlocal whole
            offset = 0
            while (part := head.pop(0) if head else next(it, None)) is not None:
                self._check(offset + len(part), state_name)
                crc = crc32(part)
                locs.append([offset, len(part), crc])
                whole = crc32_combine(whole, crc, len(part))
                offset += len(part)
                yield part
                del part  # not held while the next one is produced (its buffer is reused)

        if beside and not self.store.writes_parts_beside:
            self._put_beside(key, checked())
        else:
            self.store.put_parts(key, checked())
        total = sum(loc[1] for loc in locs)
        self._wrote(key, total)
        return file_handle(key, total, whole), locs

    def _put_beside(self, key: str, parts: Iterator[bytes | memoryview]) -> None:
        """``store.put_parts(key, parts)`` on a helper thread, ``parts`` produced on this one
        (a few parts ahead at most); a failure on either side stops both."""
        feed: queue.Queue[Any] = queue.Queue(maxsize=4)
        failed: list[BaseException] = []
        ended_seen: list[bool] = []  # the writer has taken the producer's end marker

        def consume() -> Iterator[bytes | memoryview]:
            while (item := feed.get()) is not None:
                if isinstance(item, BaseException):
                    ended_seen.append(True)
                    raise item
                yield item
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
            for part in parts:
                if failed:
                    break
                feed.put(part)
        except BaseException as exc:
            ended = exc
        feed.put(ended)
        thread.join()
        if ended is not None:
            raise ended
        if failed:
            raise failed[0]

    def write(self, data: bytes, *, state_name: str, shared_name: str | None = None) -> dict[str, Any]:
        """Store ``data`` and return its handle; ``shared_name`` asks for a reusable shared file."""
        size = len(data)
        self._check(size, state_name)
        crc = crc32(data)
        if shared_name is None and size < self.inline_threshold:
            with self._lock:
                self.bytes_written += size
            return inline_handle(data, crc)
        key = self._key(state_name, shared_name)
        self.store.put(key, data)
        self._wrote(key, size)
        return file_handle(key, size, crc)

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
            crc, seen = crc_while_copying(transfer, local_path, size)
            if seen != size:
                raise CheckpointError(f"{os.fspath(local_path)} changed while being checkpointed "
                                      f"({size} bytes, then {seen})")
        except BaseException:
            if stored:  # the copy succeeded but its checksum did not: leave no orphan behind
                with contextlib.suppress(Exception):
                    self.store.delete(key)
            raise
        self._wrote(key, size)
        return file_handle(key, size, crc)

    @property
    def files_written(self) -> int:
        return len(self.written)

