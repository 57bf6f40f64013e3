"""The one reader of checkpoint structure: for every snapshot format, the states a task handle
holds and each state's entries as plain chunks, read with every check a restore makes.

Restore, inspection, conversion and the Spark reader all read entries through the same checked
readers: ``statekit-kv`` parts and key-group chunks through :func:`~statekit.backends.kvformat.
plain_chunks` / :func:`~statekit.backends.kvformat.indexed_chunks` / :func:`~statekit.backends.
kvformat.log_chunks` (keys inside the key groups their snapshot records, values of their entry's
kind and types), native RocksDB checkpoints through the restore's own download and
:func:`~statekit.backends.rocksdb.nativefiles.check_native_db`.  So whatever a restore refuses, a
reader refuses with the same typed error, and none reads state a restore would not.  The files a
handle references are found by the one walk of :mod:`statekit.checkpoint.handles`, which the
schema pass, verification, the retention sweep and garbage collection share.

A format is one :data:`FORMATS` entry (its states, its chunks); a kind of state entry is one
:data:`statekit.backends.kinds.KINDS` entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from statekit import workdirs
from statekit.backends.heap.snapshot import HEAP_CHANGELOG_FORMAT
from statekit.backends.kvformat import (
    KV_FORMATS,
    check_kv_handle,
    indexed_chunks,
    log_chunks,
    plain_chunks,
    value_check,
)
from statekit.backends.rocksdb.db import open_db
from statekit.backends.rocksdb.encoding import grouped
from statekit.backends.rocksdb.nativefiles import check_native_db, download_native
from statekit.backends.rocksdb.options import build_options
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.handles import file_handles, file_path
from statekit.checkpoint.reader import StateReader
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.msgpack import packb, unpack_each

Progress = Callable[[int], None] | None
#: ``(plain keys, plain stored values, bytes read)``
PlainChunk = tuple[list[Any], list[Any], int]
_SCAN_BATCH = 8192  # RocksDB entries decoded per chunk


@dataclass(frozen=True)
class SnapshotFormat:
    """How one snapshot format is read.

    ``states(handle)``: each state's ``(entry, encoding)`` (the entry holds at least layout and
    kind; encoding ``plain``, ``indexed``, ``changelog`` or ``rocksdb``);
    ``chunks(handle, reader, name, key_groups, progress)``: the state's entries inside
    ``key_groups`` (part of the handle's own range), checked as a restore checks them.
    """

    states: Callable[[dict[str, Any]], dict[str, tuple[dict[str, Any], str]]]
    chunks: Callable[[dict[str, Any], StateReader, str, KeyGroupRange, Progress],
                     Iterator[PlainChunk]]


def recorded_range(handle: dict[str, Any]) -> KeyGroupRange:
    """The key groups a handle records (CorruptCheckpointError when it records none)."""
    try:
        return KeyGroupRange.of(handle["key_group_range"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CorruptCheckpointError("a task handle without a valid key_group_range") from exc


def _max_parallelism(handle: dict[str, Any]) -> int:
    maxp = handle.get("max_parallelism")
    if type(maxp) is not int or maxp < 1:
        raise CorruptCheckpointError("a task handle without a valid max_parallelism")
    return maxp


# --- statekit-kv ---------------------------------------------------------------------------------


def _encoding(entry: dict[str, Any]) -> str:
    return "plain" if entry.get("encoding") == "plain" else "indexed"


def _kv_states(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    return {name: (entry, _encoding(entry)) for name, entry in handle.get("states", {}).items()}


def _entry_chunks(handle: dict[str, Any], reader: StateReader, name: str, entry: dict[str, Any],
                  rng: KeyGroupRange, progress: Progress, skip: set[bytes] | None = None
                  ) -> Iterator[PlainChunk]:
    """One ``statekit-kv`` entry, plain or indexed; keys in ``skip`` (serialized) left out."""
    maxp, recorded = _max_parallelism(handle), recorded_range(handle)
    if entry.get("encoding") == "plain":
        sizes = iter([int(loc[1]) for loc in entry.get("parts", [])])
        for keys, values in plain_chunks(name, entry, reader, recorded, rng, maxp):
            if skip:
                kept = [i for i, key in enumerate(keys) if packb(key) not in skip]
                keys, values = [keys[i] for i in kept], [values[i] for i in kept]
            size = next(sizes, 0)
            if progress is not None:
                progress(size)
            yield keys, values, size
        return
    index = entry.get("index", {})
    for kg, kbs, _, values in indexed_chunks(name, entry, reader, rng, maxp):
        if skip:
            kept = [i for i, kb in enumerate(kbs) if kb not in skip]
            kbs, values = [kbs[i] for i in kept], [values[i] for i in kept]
        size = int(index.get(kg, [0, 0])[1])
        if progress is not None:
            progress(size)
        yield unpack_each(kbs), values, size


def _kv_chunks(handle: dict[str, Any], reader: StateReader, name: str, rng: KeyGroupRange,
               progress: Progress) -> Iterator[PlainChunk]:
    check_kv_handle(handle, _max_parallelism(handle))
    entry = handle.get("states", {}).get(name)
    if entry is not None:
        yield from _entry_chunks(handle, reader, name, entry, rng, progress)


# --- incremental heap checkpoints ----------------------------------------------------------------


def _changelog_states(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    found: dict[str, tuple[dict[str, Any], str]] = {}
    for log in handle.get("logs", []):
        for name, entry in log.items():
            found[name] = (entry, "changelog")
    for name, entry in handle.get("base", {}).items():
        found[name] = (entry, "changelog" if name in found else _encoding(entry))
    return found


def _changelog_chunks(handle: dict[str, Any], reader: StateReader, name: str, rng: KeyGroupRange,
                      progress: Progress) -> Iterator[PlainChunk]:
    """The base without the keys the changelogs touch, then per key group the last change of
    each touched key, replayed in log order (memory holds the touched keys, not the state)."""
    check_kv_handle({**handle, "format": KV_FORMATS[-1]}, _max_parallelism(handle))
    maxp = _max_parallelism(handle)
    logs = [log[name] for log in handle.get("logs", []) if name in log]
    touched: set[bytes] = set()
    for entry in logs:
        for _, puts, _, removes in log_chunks(name, entry, reader, rng, maxp):
            touched.update(puts)
            touched.update(removes)
    base = handle.get("base", {}).get(name)
    if base is not None:
        yield from _entry_chunks(handle, reader, name, base, rng, progress, skip=touched)
    groups = sorted({int(kg) for entry in logs for kg in entry.get("index", {}) if int(kg) in rng})
    for kg in groups:
        final: dict[bytes, Any] = {}
        size = 0
        for entry in logs:
            for _, puts, values, removes in log_chunks(name, entry, reader,
                                                        KeyGroupRange(kg, kg), maxp):
                final.update(zip(puts, values, strict=True))
                final.update(dict.fromkeys(removes, _REMOVED))
            loc = entry.get("index", {}).get(kg)
            size += int(loc[1]) if loc else 0
        live = [(k, v) for k, v in final.items() if v is not _REMOVED]
        if progress is not None:
            progress(size)
        if live:
            yield unpack_each([k for k, _ in live]), [v for _, v in live], size


_REMOVED = object()


# --- native RocksDB checkpoints ------------------------------------------------------------------


def _native_states(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """The column families' states, and timers kept on the heap (plain ``timers`` entries)."""
    states = {name: (entry, "rocksdb") for name, entry in handle.get("states", {}).items()}
    states.update({name: (entry, _encoding(entry))
                   for name, entry in handle.get("heap_timers", {}).items()})
    return states


@dataclass
class _OpenDb:
    """A downloaded, opened and checked native checkpoint, and how many readers use it."""

    key: tuple[Any, ...] | None
    work: Any
    db: Any
    pid: int
    users: int = 1


_lock = threading.Lock()
#: native checkpoints read inside :func:`reusing_native_dbs` blocks, kept open for the next
#: state of the same partition (the most recent ones), and how many such blocks are open
_cached: OrderedDict[tuple[Any, ...], _OpenDb] = OrderedDict()
_CACHED_MAX = 8
_scopes = 0


def _fingerprint(handle: dict[str, Any], reader: StateReader) -> tuple[Any, ...] | None:
    """What identifies a native checkpoint's download: the handle and, on the local disk, each
    file's inode, size and modification time (a file rewritten in place is downloaded again;
    not the change time, which the download's own hard links move); None (never reused) on
    other stores."""
    store = reader.store
    if not isinstance(store, LocalBlobStore):
        return None
    stats = []
    for file in file_handles(handle):
        try:
            info = os.stat(f"{store.root}/{file_path(file)}", follow_symlinks=False)
        except OSError:
            return None
        stats.append((info.st_ino, info.st_size, info.st_mtime_ns))
    return store.root, hashlib.sha256(packb(handle)).digest(), tuple(stats)


def _close(entry: _OpenDb) -> None:
    try:
        if entry.pid == os.getpid():  # never a database inherited through fork
            entry.db.close()
    finally:
        workdirs.remove(entry.work)


def _release(entry: _OpenDb) -> None:
    """One reader is done with ``entry``: kept for the next inside a reuse block, else closed
    (as are the least recent unused ones past :data:`_CACHED_MAX`)."""
    doomed: list[_OpenDb] = []
    with _lock:
        entry.users -= 1
        if entry.users:
            return
        if _scopes and entry.key is not None:
            _cached[entry.key] = entry
            _cached.move_to_end(entry.key)
            while len(_cached) > _CACHED_MAX:
                oldest = next((k for k, e in _cached.items() if not e.users), None)
                if oldest is None:
                    break
                doomed.append(_cached.pop(oldest))
        else:
            doomed.append(entry)
    for old in doomed:
        _close(old)


@contextlib.contextmanager
def reusing_native_dbs() -> Iterator[None]:
    """Within this block a native RocksDB checkpoint stays open after a state is read, for the
    next state of the same partition: one download and open per partition instead of one per
    state (conversion, counting every state).  Closed and removed when the outermost block
    ends."""
    global _scopes
    with _lock:
        _scopes += 1
    try:
        yield
    finally:
        doomed: list[_OpenDb] = []
        with _lock:
            _scopes -= 1
            if not _scopes:
                for entry in _cached.values():
                    if entry.users:  # still being read: its reader closes it
                        entry.key = None
                    else:
                        doomed.append(entry)
                _cached.clear()
        for entry in doomed:
            _close(entry)


@contextlib.contextmanager
def native_db(handle: dict[str, Any], reader: StateReader, progress: Progress = None
              ) -> Iterator[Any]:
    """A native RocksDB checkpoint downloaded (verified, as a restore downloads it) into a
    private working directory, opened read-only and checked as a restore checks it; removed
    afterwards (see :func:`reusing_native_dbs`)."""
    key = _fingerprint(handle, reader) if _scopes else None
    with _lock:
        entry = _cached.get(key) if key is not None else None
        if entry is not None and entry.pid == os.getpid():
            entry.users += 1
        else:
            entry = None
    if entry is None:
        work = workdirs.create(tempfile.gettempdir(), "statekit-inspect-")
        try:
            download_native(handle, reader, work / "db", progress=progress)
            db = open_db(work / "db", build_options, read_only=True)
        except BaseException:
            workdirs.remove(work)
            raise
        entry = _OpenDb(key, work, db, os.getpid())
        try:
            check_native_db(db, handle)
        except BaseException:
            entry.key = None  # never kept
            _release(entry)
            raise
    try:
        yield entry.db
    finally:
        _release(entry)


def _native_chunks(handle: dict[str, Any], reader: StateReader, name: str, rng: KeyGroupRange,
                   progress: Progress) -> Iterator[PlainChunk]:
    heap_timers = handle.get("heap_timers", {}).get(name)
    if heap_timers is not None:  # timers kept on the heap, beside the database
        yield from _entry_chunks(handle, reader, name, heap_timers, rng, progress)
        return
    entry = handle.get("states", {}).get(name)
    if entry is None:
        return
    check = value_check(name, entry)
    with native_db(handle, reader, progress) as db:
        cf = db.get_column_family(name)
        try:
            keys: list[bytes] = []
            values: list[bytes] = []
            size = 0
            start, end = rng.start.to_bytes(2, "big"), (rng.end + 1).to_bytes(2, "big")
            for _, kb, vb in grouped(cf, str(entry.get("kind")), start, end):
                keys.append(kb)
                values.append(vb)
                size += len(kb) + len(vb)
                if len(keys) >= _SCAN_BATCH:
                    yield _decoded(name, keys, values, check, size)
                    keys, values, size = [], [], 0
            if keys:
                yield _decoded(name, keys, values, check, size)
        finally:
            del cf


def _decoded(name: str, keys: list[bytes], values: list[bytes],
             check: Callable[[list[Any]], None], size: int) -> PlainChunk:
    try:
        plain = unpack_each(values)
    except (ValueError, TypeError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed values") from exc
    check(plain)
    return unpack_each(keys), plain, size


# --- the table ---------------------------------------------------------------------------------


FORMATS: dict[str, SnapshotFormat] = {
    **dict.fromkeys(KV_FORMATS, SnapshotFormat(_kv_states, _kv_chunks)),
    HEAP_CHANGELOG_FORMAT: SnapshotFormat(_changelog_states, _changelog_chunks),
    ROCKSDB_FORMAT: SnapshotFormat(_native_states, _native_chunks),
}


def format_of(handle: dict[str, Any]) -> SnapshotFormat:
    """The reader of a handle's format; CorruptCheckpointError for a format no backend reads."""
    found = FORMATS.get(handle.get("format"))  # type: ignore[arg-type]
    if found is None:
        raise CorruptCheckpointError(f"unknown snapshot format {handle.get('format')!r}")
    return found


def state_entries(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each state of a task handle: ``(entry, encoding)``."""
    return format_of(handle).states(handle)


def read_state(handle: dict[str, Any], reader: StateReader, name: str,
               key_groups: KeyGroupRange | None = None, progress: Progress = None
               ) -> Iterator[PlainChunk]:
    """The plain entries of state ``name`` in a task handle (inside ``key_groups`` when given),
    checked as every restore checks them."""
    fmt = format_of(handle)
    mine = recorded_range(handle)
    rng = mine if key_groups is None else mine.intersection(key_groups)
    if len(rng):
        yield from fmt.chunks(handle, reader, name, rng, progress)
