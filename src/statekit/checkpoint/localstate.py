"""Task-local copies of completed snapshots: Flink's local recovery (``state.backend.local-recovery``).

While a task writes a snapshot to checkpoint storage, every file also lands in a local pending
directory: the bytes of streamed parts are written there as they pass (heap), whole files are
hard-linked (RocksDB's native checkpoint, itself hard links to the live SST files).  When the
checkpoint completes, files the snapshot re-references from earlier checkpoints (incremental
snapshots) are linked from the previous copy, a manifest is written last and the directory is
renamed to ``chk-<id>``; older copies are deleted (Flink does so on ``notifyCheckpointComplete``).

A restore asks for the copy of one checkpoint id with the handle ``_metadata`` records.  The copy
is used only when it is a directory below the root (never a link), its manifest names the same
scope, checkpoint and handle digest, and every file the handle names is a regular file of the
recorded size; the restore then reads it through the usual :class:`StateReader`, which checks
every byte against the handle's CRC-32.  The remote copy stays primary: a local copy is a cache
that may be missing, stale or damaged, never a reason to fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from statekit.checkpoint.blobstore.base import check_key
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.handles import file_handles
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.reader import FileCheck, StateReader
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CorruptCheckpointError, StatekitError, UnsafePathError
from statekit.serde.msgpack import packb

log = logging.getLogger("statekit.localrecovery")

MANIFEST = "_local"
_T = TypeVar("_T")
_COPY = re.compile(r"chk-(0|[1-9][0-9]{0,18})")
_PENDING = re.compile(r"\.pending-(0|[1-9][0-9]{0,18})-[0-9a-f]{12}")


def handle_digest(handle: dict[str, Any]) -> bytes:
    """A digest of a task handle: a local copy restores only the handle it was made for."""
    return hashlib.sha256(packb(handle)).digest()


class TaskLocalStateStore:
    """The local copies of one task's snapshots under ``directory`` (below ``root``).

    ``scope`` names the task (job or query, operator, partition); a copy made under another
    scope is stale.  ``last_source`` tells what the last :meth:`reader` call decided
    (``"local"``, or why not: ``"missing"``, ``"stale"``, ``"damaged"``).
    """

    def __init__(self, root: str | os.PathLike[str], directory: str | os.PathLike[str],
                 scope: str) -> None:
        self.root = Path(root)
        self.directory = Path(directory)
        self.scope = scope
        self.last_source: str | None = None
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()

    # --- writing ------------------------------------------------------------------------------

    def streams(self, checkpoint_id: int, remote: CheckpointStreams) -> CheckpointStreams:
        """Streams writing like ``remote`` and keeping a local copy of every file they write."""
        pending = _Pending(self.directory / f".pending-{checkpoint_id}-{uuid.uuid4().hex[:12]}")
        with self._lock:
            old = self._pending.pop(checkpoint_id, None)
            self._pending[checkpoint_id] = pending
        if old is not None:
            old.discard()
        return CheckpointStreams(_TeeStore(remote.store, pending), remote.prefix, remote.task,
                                 remote.inline_threshold, remote.max_state_size,
                                 remote.allow_shared)

    def complete(self, checkpoint_id: int, handle: dict[str, Any]) -> bool:
        """Keep the copy of the completed checkpoint ``checkpoint_id`` (the task's ``handle``)
        and delete older ones; False when no whole copy could be made (nothing is kept then)."""
        with self._lock:
            pending = self._pending.pop(checkpoint_id, None)
            older = [c for c in self._pending if c < checkpoint_id]
        for cid in older:
            self.abort(cid)
        if pending is None:
            return False
        try:
            kept = pending.finish(self._previous(checkpoint_id), handle, encode_metadata({
                "layout": "local-copy", "scope": self.scope, "checkpoint_id": checkpoint_id,
                "digest": handle_digest(handle)}))
            if kept:
                target = self.directory / f"chk-{checkpoint_id}"
                _remove_tree(target)
                os.rename(pending.path, target)
        except (OSError, StatekitError) as exc:  # a local copy never fails a checkpoint
            log.warning("no local copy of checkpoint %d kept (%s)", checkpoint_id, exc)
            kept = False
        if not kept:
            pending.discard()
        self._delete_copies(lambda cid: cid < checkpoint_id or (not kept and cid == checkpoint_id))
        return kept

    def abort(self, checkpoint_id: int) -> None:
        """Drop what an aborted checkpoint wrote locally."""
        with self._lock:
            pending = self._pending.pop(checkpoint_id, None)
        if pending is not None:
            pending.discard()

    def _previous(self, checkpoint_id: int) -> Path | None:
        """The newest kept copy before ``checkpoint_id`` (files an incremental snapshot
        re-references are linked from it)."""
        ids = [c for c in self._copies() if c < checkpoint_id]
        previous = self.directory / f"chk-{max(ids)}" if ids else None
        return None if previous is None or previous.is_symlink() else previous

    def _copies(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _COPY.fullmatch(n)))

    def _delete_copies(self, doomed: Any) -> None:
        for cid in self._copies():
            if doomed(cid):
                _remove_tree(self.directory / f"chk-{cid}")

    # --- reading ------------------------------------------------------------------------------

    def reader(self, checkpoint_id: int, handle: dict[str, Any]) -> StateReader | None:
        """A reader of the local copy of ``checkpoint_id`` made for ``handle``, or None (missing,
        stale or damaged: logged, and told by :attr:`last_source`)."""
        path = self.directory / f"chk-{checkpoint_id}"
        try:
            if not os.path.lexists(path):
                self.last_source = "missing"
                return None
            self._check_inside(path)
            store = LocalBlobStore(str(path))
            manifest = decode_metadata(store.get(MANIFEST), f"{path}/{MANIFEST}", checkpoint_id)
            if (manifest.get("scope") != self.scope
                    or manifest.get("digest") != handle_digest(handle)):
                self.last_source = "stale"
                log.info("local copy %s is of another task or snapshot; restoring from "
                         "checkpoint storage", path)
                return None
            for file in file_handles(handle):
                key = check_key(str(file.get("path")))
                if store.size(key) != file.get("size"):
                    raise CorruptCheckpointError(f"{path}/{key}: not the size its handle records")
        except (StatekitError, OSError) as exc:
            self.last_source = "damaged"
            log.warning("local copy %s is unusable (%s); restoring from checkpoint storage",
                        path, exc)
            return None
        self.last_source = "local"
        return StateReader(store)

    def _check_inside(self, path: Path) -> None:
        """``path`` must be a directory below the root, reached without a link."""
        if path.is_symlink() or not path.is_dir():
            raise UnsafePathError(f"{path}: a local copy must be a directory, not a link")
        real, root = os.path.realpath(path), os.path.realpath(self.root)
        if os.path.commonpath([real, root]) != root or real == root:
            raise UnsafePathError(f"{path}: leads outside the local state root {self.root}")

    def dispose(self) -> None:
        """Delete every copy of this task (its owner ends)."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for p in pending:
            p.discard()
        _remove_tree(self.directory)


class FallbackReader(StateReader):
    """Reads a local copy, and once :meth:`arm` is called (the restore has returned), reads from
    checkpoint storage whatever the copy fails to give: a lazy restore reads its values long
    after the restore, when falling back as a whole is no longer possible.  Every byte is still
    checked against the handle's CRC-32 either way, so the state is exact; once the copy failed
    a read, every later read goes to checkpoint storage."""

    def __init__(self, local: StateReader, remote: StateReader) -> None:
        super().__init__(local.store)
        self.local, self.remote = local, remote
        self.armed = False
        self.failed = False

    @property
    def bytes_read(self) -> int:
        return self.local.bytes_read + self.remote.bytes_read

    def arm(self) -> None:
        """From now on a failing read of the local copy reads checkpoint storage instead."""
        self.armed = True

    def _use_local(self) -> bool:
        return not (self.armed and self.failed)

    def _fall_back(self, exc: BaseException) -> None:
        if not self.armed:
            raise exc
        self.failed = True
        log.warning("a read of the local copy failed (%s); reading checkpoint storage instead",
                    exc)

    def _either(self, local: Callable[[], _T], remote: Callable[[], _T]) -> _T:
        """``local()``, or ``remote()`` once the copy failed (see :meth:`_fall_back`)."""
        if self._use_local():
            try:
                return local()
            except (StatekitError, OSError) as exc:
                self._fall_back(exc)
        return remote()

    def read(self, handle: dict[str, Any], offset: int | None = None, length: int | None = None,
             crc: int | None = None) -> bytes:
        return self._either(lambda: self.local.read(handle, offset, length, crc),
                            lambda: self.remote.read(handle, offset, length, crc))

    def read_parts(self, handle: dict[str, Any], locations: list[list[int]], *,
                   owned: bool = False) -> Iterator[bytes | memoryview]:
        return self._each(lambda reader, rest: reader.read_parts(handle, rest, owned=owned),
                          locations)

    def read_ranges(self, handle: dict[str, Any], locations: list[list[int]]
                    ) -> Iterator[bytes | memoryview]:
        return self._each(lambda reader, rest: reader.read_ranges(handle, rest), locations)

    def _each(self, read: Callable[[StateReader, list[list[int]]], Iterator[bytes | memoryview]],
              locations: list[list[int]]) -> Iterator[bytes | memoryview]:
        """``read(reader, locations)`` from the local copy; once the copy failed, the locations
        not read yet from checkpoint storage."""
        done = 0
        if self._use_local():
            try:
                for data in read(self.local, locations):
                    yield data
                    done += 1
                return
            except (StatekitError, OSError) as exc:
                self._fall_back(exc)
        yield from read(self.remote, locations[done:])

    def check(self, handle: dict[str, Any],
              progress: Callable[[int], None] | None = None) -> int:
        return self._either(lambda: self.local.check(handle, progress),
                            lambda: self.remote.check(handle, progress))

    def read_file(self, handle: dict[str, Any], local_path: str | os.PathLike[str], *,
                  allow_link: bool = False, deferred: list[FileCheck] | None = None) -> None:
        """As :meth:`StateReader.read_file`; a local copy's files are always checked now (a
        later failure could no longer fall back), those of checkpoint storage as asked."""
        self._either(lambda: self.local.read_file(handle, local_path, allow_link=allow_link),
                     lambda: self.remote.read_file(handle, local_path, allow_link=allow_link,
                                                   deferred=deferred))


class _Pending:
    """The local files of one checkpoint being written (writes that fail only spoil the copy)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.spoiled = False
        self.written: set[str] = set()
        self._lock = threading.Lock()

    def target(self, key: str) -> str:
        path = os.path.join(self.path, check_key(key))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def wrote(self, key: str) -> None:
        with self._lock:
            self.written.add(check_key(key))

    def spoil(self, exc: BaseException) -> None:
        if not self.spoiled:
            log.warning("local copy %s spoiled (%s); the checkpoint goes on without it",
                        self.path, exc)
        self.spoiled = True

    def finish(self, previous: Path | None, handle: dict[str, Any], manifest: bytes) -> bool:
        """Link what the snapshot re-references from ``previous``, write the manifest; whether
        the copy is whole."""
        if self.spoiled:
            return False
        for file in file_handles(handle):
            key = check_key(str(file.get("path")))
            if key in self.written:
                continue
            source = None if previous is None else previous / key
            if source is None or source.is_symlink() or not source.is_file():
                log.info("no local copy of %s (written before this task's copies began)", key)
                return False
            os.link(source, self.target(key))
        os.makedirs(self.path, exist_ok=True)  # a snapshot kept all inline wrote no file here
        with open(os.path.join(self.path, MANIFEST), "wb") as fh:
            fh.write(manifest)
        return True

    def discard(self) -> None:
        self.spoiled = True
        _remove_tree(self.path)


class _TeeStore:
    """A blob store that writes through to ``remote`` and keeps a copy of each file locally."""

    def __init__(self, remote: Any, pending: _Pending) -> None:
        self._remote = remote
        self._pending = pending

    def __getattr__(self, name: str) -> Any:
        return getattr(self._remote, name)

    def _keep(self, key: str, write: Any) -> None:
        if self._pending.spoiled:
            return
        try:
            write(self._pending.target(key))
            self._pending.wrote(key)
        except (OSError, StatekitError) as exc:
            self._pending.spoil(exc)

    def put(self, key: str, data: bytes) -> None:
        self._remote.put(key, data)
        self._keep(key, lambda path: Path(path).write_bytes(data))

    def put_file(self, key: str, local_path: str | os.PathLike[str]) -> None:
        self._remote.put_file(key, local_path)
        self._keep(key, lambda path: _link_or_copy(os.fspath(local_path), path))

    def put_parts(self, key: str, parts: Iterable[bytes]) -> None:
        """The parts go to the remote store as they come; a helper thread writes each locally
        meanwhile (both writes release the GIL, so they overlap)."""
        if self._pending.spoiled:
            self._remote.put_parts(key, parts)
            return
        local = _LocalWriter(self._pending, key)

        def tee() -> Iterator[bytes]:
            for part in parts:
                local.put(part)
                yield part

        try:
            self._remote.put_parts(key, tee())
        finally:
            local.close()


class _LocalWriter:
    """Writes one local file on a helper thread from the parts handed to :meth:`put`: the disk's
    writeback starts every 16 MiB and stretches written back leave the page cache (as the local
    blob store writes), so the copy does not fault in fresh memory for every byte."""

    _CHUNK = 16 * 1024 * 1024

    def __init__(self, pending: _Pending, key: str) -> None:
        self.pending = pending
        self.key = key
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self.thread = threading.Thread(target=self._write, name="statekit-local-copy", daemon=True)
        self.thread.start()

    def put(self, part: bytes) -> None:
        if self.thread.is_alive():
            self.queue.put(part)

    def close(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
        self.thread.join()

    def _write(self) -> None:
        advise = getattr(os, "posix_fadvise", None)
        fd: int | None = None
        try:
            fd = os.open(self.pending.target(self.key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o600)
            offset = started = 0
            while (part := self.queue.get()) is not None:
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view):]
                offset += len(part)
                if advise is not None and offset - started >= self._CHUNK:
                    advise(fd, started, offset - started, os.POSIX_FADV_DONTNEED)
                    advise(fd, 0, started, os.POSIX_FADV_DONTNEED)
                    started = offset
            self.pending.wrote(self.key)
        except Exception as exc:  # never leaves the producer blocked on a full queue
            self.pending.spoil(exc)
            while self.queue.get() is not None:  # drain: the producer never blocks on us
                pass
        finally:
            if fd is not None:
                os.close(fd)


def _link_or_copy(source: str, dest: str) -> None:
    """A hard link (RocksDB's files are immutable), a copy where the file system cannot link."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(dest)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def _remove_tree(path: Path) -> None:
    """Remove ``path``: a link is unlinked, never followed."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
