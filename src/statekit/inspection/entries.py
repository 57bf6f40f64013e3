"""Streaming one state's entries out of one task handle, whatever wrote it, as plain chunks.

Every format goes through the readers the backends restore with: ``statekit-kv`` entries (heap
checkpoints' plain parts, savepoints' key-grouped chunks) through :mod:`statekit.backends.kvformat`,
incremental heap checkpoints as their base plus changelogs, native RocksDB checkpoints by
downloading their files (verified) into a private working directory and scanning the state's
column family.  Memory holds one part, one key group or one scan batch at a time; an incremental
heap checkpoint also holds the set of keys its changelogs touch.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from statekit import workdirs
from statekit.backends.heap.snapshot import HEAP_CHANGELOG_FORMAT
from statekit.backends.kvformat import (
    KV_FORMATS,
    check_kv_handle,
    plain_in_range,
    read_kv_entry,
    read_plain_entry,
)
from statekit.backends.rocksdb.db import open_db
from statekit.backends.rocksdb.encoding import grouped
from statekit.backends.rocksdb.options import build_options
from statekit.backends.rocksdb.restore import download_native
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT
from statekit.checkpoint.blobstore.base import BlobStore, check_key
from statekit.checkpoint.reader import StateReader
from statekit.errors import CorruptCheckpointError, StateError
from statekit.inspection.arrow import Chunk
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.msgpack import packb, unpack_each

Progress = Callable[[int], None] | None
_SCAN_BATCH = 8192  # RocksDB entries decoded per chunk


@dataclass
class PartitionSource:
    """One task handle and the blob store of the job directory its paths are relative to
    (picklable: Spark ships it to the executor that reads the partition)."""

    store: BlobStore
    handle: dict[str, Any]
    location: str

    @property
    def reader(self) -> StateReader:
        return StateReader(self.store)

    @property
    def format(self) -> str:
        return str(self.handle.get("format"))

    @property
    def key_groups(self) -> KeyGroupRange:
        try:
            return KeyGroupRange.of(self.handle["key_group_range"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptCheckpointError(f"{self.location}: a task handle without a valid "
                                         "key_group_range") from exc

    @property
    def max_parallelism(self) -> int:
        return int(self.handle.get("max_parallelism") or 128)


def state_entries(handle: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each state of a handle: ``(entry, encoding)``; the entry holds at least layout and kind."""
    fmt = handle.get("format")
    if fmt in KV_FORMATS:
        return {name: (entry, "plain" if entry.get("encoding") == "plain" else "indexed")
                for name, entry in handle.get("states", {}).items()}
    if fmt == HEAP_CHANGELOG_FORMAT:
        found: dict[str, tuple[dict[str, Any], str]] = {}
        for log in handle.get("logs", []):
            for name, entry in log.items():
                found[name] = (entry, "changelog")
        for name, entry in handle.get("base", {}).items():
            found[name] = (entry, "changelog" if name in found else
                           "plain" if entry.get("encoding") == "plain" else "indexed")
        return found
    if fmt == ROCKSDB_FORMAT:
        return {name: (entry, "rocksdb") for name, entry in handle.get("states", {}).items()}
    raise CorruptCheckpointError(f"unknown snapshot format {fmt!r}")


def iter_chunks(source: PartitionSource, name: str, key_groups: KeyGroupRange | None = None,
                progress: Progress = None) -> Iterator[Chunk]:
    """The plain entries of state ``name`` in ``source`` (inside ``key_groups`` when given)."""
    handle, fmt = source.handle, source.format
    mine = source.key_groups
    rng = mine if key_groups is None else mine.intersection(key_groups)
    if not len(rng):
        return
    whole = rng == mine
    if fmt in KV_FORMATS:
        check_kv_handle(handle, source.max_parallelism)
        entry = handle.get("states", {}).get(name)
        if entry is not None:
            yield from _kv_entry(source, name, entry, rng, whole, progress)
    elif fmt == HEAP_CHANGELOG_FORMAT:
        yield from _changelog(source, name, rng, whole, progress)
    elif fmt == ROCKSDB_FORMAT:
        yield from _rocksdb(source, name, rng, progress)
    else:
        raise CorruptCheckpointError(f"unknown snapshot format {fmt!r}")


def _kv_entry(source: PartitionSource, name: str, entry: dict[str, Any], rng: KeyGroupRange,
              whole: bool, progress: Progress, skip: set[bytes] | None = None) -> Iterator[Chunk]:
    """One ``statekit-kv`` entry, plain or indexed; keys in ``skip`` (serialized) left out."""
    reader = source.reader
    if entry.get("encoding") == "plain":
        lengths = [int(loc[1]) for loc in entry.get("parts", [])]
        for n, (keys, values) in enumerate(read_plain_entry(name, entry, reader)):
            if not whole:  # a part holds any of the partition's key groups, in any order
                keys, values = plain_in_range(name, keys, values, source.key_groups, rng,
                                              source.max_parallelism)
            if skip:
                kept = [i for i, key in enumerate(keys) if packb(key) not in skip]
                keys, values = [keys[i] for i in kept], [values[i] for i in kept]
            size = lengths[n] if n < len(lengths) else 0
            if progress is not None:
                progress(size)
            yield Chunk(keys, values, size)
        return
    index = entry.get("index", {})
    for kg, parts in read_kv_entry(name, entry, reader, rng):
        if len(parts) < 2:
            raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed chunk")
        kbs, vbs = parts[0], parts[1]
        if skip:
            pairs = [(k, v) for k, v in zip(kbs, vbs, strict=True) if k not in skip]
            kbs, vbs = [k for k, _ in pairs], [v for _, v in pairs]
        loc = index.get(kg, index.get(str(kg), [0, 0, 0]))
        if progress is not None:
            progress(int(loc[1]))
        yield Chunk(unpack_each(kbs), unpack_each(vbs), int(loc[1]))


def _changelog(source: PartitionSource, name: str, rng: KeyGroupRange, whole: bool,
               progress: Progress) -> Iterator[Chunk]:
    """An incremental heap checkpoint: the base without the keys the changelogs touch, then per
    key group the last change of each touched key, replayed in log order."""
    handle, reader = source.handle, source.reader
    logs = [log[name] for log in handle.get("logs", []) if name in log]
    touched: set[bytes] = set()
    for entry in logs:
        for kg, parts in read_kv_entry(name, entry, reader, rng):
            if len(parts) != 3:
                raise CorruptCheckpointError(f"state '{name}' key group {kg}: malformed log")
            touched.update(parts[0])
            touched.update(parts[2])
    base = handle.get("base", {}).get(name)
    if base is not None:
        yield from _kv_entry(source, name, base, rng, whole, progress, skip=touched)
    groups = sorted({int(kg) for entry in logs for kg in entry.get("index", {}) if int(kg) in rng})
    for kg in groups:
        final: dict[bytes, bytes | None] = {}
        size = 0
        for entry in logs:
            for _, (puts_k, puts_v, removes) in read_kv_entry(name, entry, reader,
                                                               KeyGroupRange(kg, kg)):
                final.update(zip(puts_k, puts_v, strict=True))
                final.update(dict.fromkeys(removes))
            loc = entry.get("index", {}).get(kg)
            size += int(loc[1]) if loc else 0
        live = [(k, v) for k, v in final.items() if v is not None]
        if progress is not None:
            progress(size)
        if live:
            yield Chunk(unpack_each([k for k, _ in live]), unpack_each([v for _, v in live]), size)


@contextlib.contextmanager
def native_db(source: PartitionSource, progress: Progress = None) -> Iterator[Any]:
    """A native RocksDB checkpoint downloaded (verified) into a private working directory and
    opened read-only; the directory is removed on exit."""
    work = workdirs.create(tempfile.gettempdir(), "statekit-inspect-")
    try:
        download_native(source.handle, source.reader, work / "db", progress=progress)
        db = open_db(work / "db", build_options, read_only=True)
        try:
            yield db
        finally:
            db.close()
    finally:
        workdirs.remove(work)


def _rocksdb(source: PartitionSource, name: str, rng: KeyGroupRange, progress: Progress
             ) -> Iterator[Chunk]:
    entry = source.handle.get("states", {}).get(name)
    if entry is None:
        return
    with native_db(source, progress) as db:
        try:
            cf = db.get_column_family(name)
        except Exception as exc:
            raise CorruptCheckpointError(
                f"{source.location}: state '{name}' has no column family in its RocksDB checkpoint"
            ) from exc
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
                    yield Chunk(unpack_each(keys), unpack_each(values), size)
                    keys, values, size = [], [], 0
            if keys:
                yield Chunk(unpack_each(keys), unpack_each(values), size)
        finally:
            del cf


def peek_count(source: PartitionSource, entry: dict[str, Any]) -> int | None:
    """The number of keys of a ``statekit-kv`` entry from the headers of its parts or key-group
    chunks (a few bytes each), without reading the entries; None when it cannot tell."""
    if "parts" in entry and entry.get("encoding") == "plain":
        locations = [(int(loc[0]), int(loc[1])) for loc in entry["parts"]]
    elif isinstance(entry.get("index"), dict):
        locations = [(int(loc[0]), int(loc[1])) for loc in entry["index"].values()]
    else:
        return None
    data = entry.get("data", {})
    try:
        if data.get("type") == "inline":
            blob = data["data"]
            heads: Any = (blob[offset:offset + min(length, 16)] for offset, length in locations)
        elif data.get("type") == "file":
            heads = source.store.get_ranges(check_key(str(data["path"])),
                                            [(offset, min(length, 16)) for offset, length in locations])
        else:
            return None
        total = 0
        for head in heads:
            unpacker = msgpack.Unpacker()
            unpacker.feed(bytes(head))
            unpacker.read_array_header()
            total += unpacker.read_array_header()
        return total
    except (StateError, CorruptCheckpointError, ValueError, KeyError, TypeError,
            msgpack.OutOfData, msgpack.UnpackException):
        return None


