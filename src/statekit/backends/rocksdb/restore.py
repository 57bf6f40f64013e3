"""RocksDB restores: native checkpoints (rescaled by key-group ranges) and backend-neutral ones.

The native handle that overlaps this backend's range most becomes the database (downloaded,
SSTs hard-linked where the store allows, foreign ranges deleted with ``delete_range``); the
in-range keys of other native handles are copied in, and backend-neutral handles (heap
checkpoints, savepoints) are ingested entry by entry.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rocksdict import Rdict, WriteBatch

from statekit.backends.kvformat import KV_FORMATS, kept_indices, read_kv_states
from statekit.backends.rocksdb.checks import pinned
from statekit.backends.rocksdb.db import open_db
from statekit.backends.rocksdb.encoding import KG_END, NIL, grouped, kg_after, scan, split_array
from statekit.backends.rocksdb.nativefiles import Subset, check_native_db, download_native
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT, DatabaseOwner
from statekit.backends.rocksdb.timers import column_families, index_name, ts8
from statekit.backends.timers import TIMERS_KIND, timer_stamps
from statekit.checkpoint.reader import FileCheck, StateReader
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.keytypes import RestoreCheck
from statekit.serde.msgpack import packb, unpack_each

if TYPE_CHECKING:
    from statekit.backends.base import RestoreSource



class RestoreOwner(DatabaseOwner, Protocol):
    """What a restore uses beyond :class:`~statekit.backends.rocksdb.snapshot.DatabaseOwner`:
    where the database lives, each key group's key prefix, and the restored states' bookkeeping.
    The backend imports this module, never the other way."""

    db_path: Path
    heap_timers: bool
    kg_prefixes: list[bytes]
    lazy_restore: bool

    def check_later(self, checks: list[FileCheck], side: Path | None = None) -> None:
        """Check these restored files in the background, the state in use meanwhile."""
        ...

    def restore_key_check(self, handle: dict[str, Any]) -> RestoreCheck | None:
        """How the keys of ``handle`` restore here."""
        ...

    def note_restored(self, name: str, entry: dict[str, Any]) -> None:
        """Record a restored state's layout and kind."""
        ...

    def compact_later(self, ranges: list[tuple[Any, bytes, bytes]]) -> None:
        """Compact these ``(column family, begin, end)`` ranges in the background."""
        ...

    def poison(self, why: str) -> None:
        """Make every state and timer queue raise (the database is gone)."""
        ...


_BATCH = 20_000  # puts per write batch while restoring (bounds the batch's memory)


class _BatchWriter:
    """Puts into write batches of at most about ``_BATCH`` entries, each written when full."""

    def __init__(self, db: Rdict) -> None:
        self.db = db
        self.batch = WriteBatch(raw_mode=True)

    def put(self, key: bytes, value: bytes, column_family: Any) -> None:
        self.batch.put(key, value, column_family)

    def write_if_full(self) -> None:
        if len(self.batch) >= _BATCH:
            self.db.write(self.batch)
            self.batch = WriteBatch(raw_mode=True)

    def close(self) -> None:
        if len(self.batch):
            self.db.write(self.batch)


def filters_natively(handle: dict[str, Any], max_parallelism: int) -> bool:
    """Whether a restore keeps some keys of this handle by reading its files directly: a native
    handle of ``max_parallelism`` without timers (timers take the conversion to a savepoint)."""
    states = handle.get("states")
    return (handle.get("format") == ROCKSDB_FORMAT and not handle.get("heap_timers")
            and int(handle.get("max_parallelism", max_parallelism)) == max_parallelism
            and isinstance(states, dict)
            and all(isinstance(e, dict) and e.get("kind") in ("value", "list", "map")
                    for e in states.values()))


class RocksDBRestoreOperation:
    """Restores one RocksDB keyed backend from task handles of any partitioning."""

    def __init__(self, backend: RestoreOwner) -> None:
        self.backend = backend

    def restore(self, sources: list[RestoreSource], key_filter: Callable[[Any], bool] | None = None,
                skip_states: frozenset[str] = frozenset()) -> None:
        """Replace the backend's database with the key groups of its range from ``sources``."""
        backend = self.backend
        mine = backend.key_group_range
        native: list[tuple[int, dict[str, Any], StateReader]] = []
        neutral: list[tuple[dict[str, Any], StateReader, RestoreCheck | None]] = []
        filtered: list[tuple[dict[str, Any], StateReader, RestoreCheck | None]] = []
        checked: set[str] = set()  # states of native handles whose keys need a type check
        native_check: RestoreCheck | None = None
        for handle, reader in sources:
            fmt = handle.get("format")
            kgr = KeyGroupRange.of(handle["key_group_range"])
            if len(kgr.intersection(mine)) == 0:
                continue
            key_check = backend.restore_key_check(handle)  # before anything is loaded
            if fmt == ROCKSDB_FORMAT:
                if int(handle.get("max_parallelism", backend.max_parallelism)) != backend.max_parallelism:
                    raise CorruptCheckpointError(
                        f"checkpoint was taken with max_parallelism {handle['max_parallelism']}, "
                        f"this job uses {backend.max_parallelism}"
                    )
                if key_filter is not None or skip_states:
                    if not filters_natively(handle, backend.max_parallelism):
                        raise CorruptCheckpointError(
                            "a native RocksDB checkpoint with timers restores only whole key "
                            "groups: convert it first (statekit.backends.transfer.restore_into)")
                    filtered.append((handle, reader, key_check))
                    continue
                native.append((len(kgr.intersection(mine)), handle, reader))
                if key_check is not None:
                    checked.update(handle["states"])
                    native_check = key_check
            elif fmt in KV_FORMATS:
                neutral.append((handle, reader, key_check))
            else:
                raise CorruptCheckpointError(f"cannot restore snapshot format {fmt!r} into RocksDB")
        self._reset_db()
        native.sort(key=lambda item: -item[0])
        if native:
            _, base, base_reader = native[0]
            deferred: list[FileCheck] | None = [] if backend.lazy_restore else None
            # whole, its files at their levels: repair would put a subset in level 0, and
            # compaction would rewrite all of it
            download_native(base, base_reader, backend.db_path, backend.pool_map,
                            deferred=deferred)
            side = backend.instance_dir / f"checks-{uuid.uuid4().hex[:8]}"
            if deferred:  # linked before RocksDB opens, and may compact, the files
                deferred = pinned(deferred, side)
            check_native_db(backend.ensure_open(), base)
            if deferred:  # from here on, scans wait for the check (restore.py's own too)
                backend.check_later(deferred, side)
            lo, hi = backend.kg_prefixes[mine.start], kg_after(mine.end, backend.kg_prefixes)
            theirs = KeyGroupRange.of(base["key_group_range"])
            foreign: list[tuple[Any, bytes, bytes]] = []
            for name in column_families(base["states"]):
                cf = backend.cf(name)
                if mine.start > 0:
                    cf.delete_range(b"", lo)
                cf.delete_range(hi, KG_END)
                if theirs.start < mine.start:
                    foreign.append((cf, b"", lo))
                if theirs.end > mine.end:
                    foreign.append((cf, hi, KG_END))
            # a rescale: the foreign key groups' files go in the background, or every
            # checkpoint of this state would carry them
            backend.compact_later(foreign)
            self._note_states(base)
            for _, handle, reader in native[1:]:
                self._copy_from(handle, reader)
            for _, handle, reader in native:
                backend.heap_store.load_plain(handle, reader)
            if native_check is not None:
                self._check_keys(checked, native_check)
        for handle, reader, key_check in filtered:
            self._copy_filtered(handle, reader, key_filter, skip_states, key_check)
        if neutral:
            self._ingest_kv(neutral, key_filter, skip_states)
        if not native and not neutral and not filtered:
            backend.ensure_open()
        backend.heap_store.settle(use_heap=backend.heap_timers)

    def _check_keys(self, names: set[str], key_check: RestoreCheck) -> None:
        """Check the type of every key of the named states (generic keys restored from native
        checkpoints under a declared key type): a scan, paid only in that case."""
        backend = self.backend
        for name in sorted(names):
            cf = backend.cf(name)
            keys: list[bytes] = []
            for _, kb, _ in grouped(cf, backend.state_info[name]["kind"]):
                keys.append(kb)
                if len(keys) >= _BATCH:
                    key_check(unpack_each(keys))
                    keys = []
            key_check(unpack_each(keys))

    def _reset_db(self) -> None:
        backend = self.backend
        if backend.db is not None:
            backend.poison("database replaced by restore")
            db, backend.db = backend.db, None
            db.close()
        backend.cfs.clear()
        shutil.rmtree(backend.db_path, ignore_errors=True)

    def _note_state(self, name: str, entry: dict[str, Any]) -> None:
        self.backend.note_restored(name, entry)

    def _note_states(self, handle: dict[str, Any]) -> None:
        for name, entry in handle["states"].items():
            self._note_state(name, entry)

    def _download_for_copy(self, handle: dict[str, Any], reader: StateReader, dest: Path,
                           want: KeyGroupRange) -> Subset | None:
        """Download a native handle to copy the key groups ``want`` from into ``dest``: only the
        SST files holding them when it holds others too, and then which (else None)."""
        backend = self.backend
        only = None
        if len(want) < len(KeyGroupRange.of(handle["key_group_range"])):
            only = Subset.plan(handle, reader, want, backend.max_parallelism, backend.options,
                               backend.instance_dir / f"probe-{uuid.uuid4().hex[:8]}")
        download_native(handle, reader, dest, backend.pool_map, only=only)
        return only

    @contextlib.contextmanager
    def _opened(self, handle: dict[str, Any], reader: StateReader
                ) -> Iterator[tuple[bytes, bytes, Callable[[str], Rdict | None]]]:
        """Another partition's native checkpoint, downloaded beside this database and opened
        read-only and checked: ``(lo, hi, family)``, the key range of this backend's key groups
        in it and each state's column family (None: no key of this range); removed
        afterwards."""
        backend = self.backend
        theirs = KeyGroupRange.of(handle["key_group_range"]).intersection(backend.key_group_range)
        lo, hi = backend.kg_prefixes[theirs.start], kg_after(theirs.end, backend.kg_prefixes)
        tmp = Path(tempfile.mkdtemp(prefix="restore-", dir=backend.instance_dir))
        try:
            only = self._download_for_copy(handle, reader, tmp / "db", theirs)
            src = open_db(tmp / "db", backend.options, read_only=True)

            def family(name: str) -> Rdict | None:
                if only is not None and name not in only.present:
                    return None  # checked: the checkpoint has it, the kept files hold none of it
                return src.get_column_family(name)

            try:
                check_native_db(src, handle, only)
                yield lo, hi, family
            finally:
                src.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _copy_from(self, handle: dict[str, Any], reader: StateReader) -> None:
        """Copy the in-range key groups of another partition's checkpoint into this database."""
        backend = self.backend
        with self._opened(handle, reader) as (lo, hi, family):
            for name in column_families(handle["states"]):
                backend.cf(name)
                source = family(name)
                if source is None:
                    continue
                target = backend.db.get_column_family_handle(name)
                writer = _BatchWriter(backend.db)
                for key, value in scan(source, lo, hi):
                    writer.put(key, value, target)
                    writer.write_if_full()
                writer.close()
                del source
        self._note_states(handle)

    def _ingest_kv(self, sources: list[tuple[dict[str, Any], StateReader, RestoreCheck | None]],
                   key_filter: Callable[[Any], bool] | None, skip_states: frozenset[str]) -> None:
        """Load backend-neutral chunks (heap checkpoints, savepoints) as RocksDB entries, the keys'
        type checked where the snapshot's key type asks for it."""
        backend = self.backend
        writer = _BatchWriter(backend.ensure_open())
        entries = ((item, key_check) for handle, reader, key_check in sources
                   for item in read_kv_states([handle], reader, backend.key_group_range,
                                              backend.max_parallelism, key_filter))
        for (name, entry, kg, keys, values), key_check in entries:
            if name in skip_states:
                continue
            if key_check is not None:
                key_check(unpack_each(keys))
            kind = entry["kind"]
            if kind == TIMERS_KIND and backend.heap_timers:  # kept on the heap, not in RocksDB
                for kb, vb in zip(keys, values, strict=True):
                    backend.heap_store.add_serialized(name, kb, vb)
                continue
            self._note_state(name, entry)
            self._put_entries(writer, name, kind, kg, keys, values)
            writer.write_if_full()
        writer.close()

    def _put_entries(self, writer: _BatchWriter, name: str, kind: str, kg: int,
                     keys: list[bytes], values: list[bytes]) -> None:
        """Write backend-neutral entries (serialized keys of key group ``kg``, values) of a state
        as this backend's RocksDB entries."""
        backend, kgp = self.backend, self.backend.kg_prefixes
        backend.cf(name)
        handle = backend.db.get_column_family_handle(name)
        index = None
        if kind == TIMERS_KIND:
            backend.cf(index_name(name))
            index = backend.db.get_column_family_handle(index_name(name))
        for kb, vb in zip(keys, values, strict=True):
            prefix = kgp[kg] + kb
            if kind == TIMERS_KIND:
                for timestamp in timer_stamps(name, vb):
                    writer.put(prefix + ts8(timestamp), packb(timestamp), handle)
                    writer.put(kgp[kg] + ts8(timestamp) + kb, b"", index)
            elif kind == "value":
                writer.put(prefix, vb, handle)
            elif kind == "list":
                for i, elem in enumerate(split_array(vb)):
                    writer.put(prefix + i.to_bytes(8, "big"), elem, handle)
            else:
                for pair in split_array(vb):
                    uk, uv = split_array(pair)
                    writer.put(prefix + uk, b"" if uv == NIL else uv, handle)

    def _copy_filtered(self, handle: dict[str, Any], reader: StateReader,
                       key_filter: Callable[[Any], bool] | None, skip_states: frozenset[str],
                       key_check: RestoreCheck | None) -> None:
        """Copy the keys ``key_filter`` keeps, of this backend's key groups, from another
        partition's native checkpoint, read directly from its files (a rescale): what a
        conversion to a savepoint and back would keep, without writing and reading it."""
        backend = self.backend
        with self._opened(handle, reader) as (lo, hi, family):
            writer = _BatchWriter(backend.ensure_open())
            for name, entry in handle["states"].items():
                if name in skip_states:
                    continue
                self._note_state(name, entry)
                backend.cf(name)
                source = family(name)
                if source is None:
                    continue
                for kg, keys, values in _chunks(grouped(source, entry["kind"], lo, hi)):
                    unpacked = unpack_each(keys) if key_check or key_filter else None
                    if key_check is not None:
                        key_check(unpacked)
                    if key_filter is not None:
                        kept = kept_indices(key_filter, unpacked)
                        keys, values = [keys[i] for i in kept], [values[i] for i in kept]
                    self._put_entries(writer, name, entry["kind"], kg, keys, values)
                    writer.write_if_full()
                del source
            writer.close()


def _chunks(items: Iterator[tuple[int, bytes, bytes]], size: int = 4096
            ) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """``(key group, keys, values)`` runs of at most ``size`` entries of one key group."""
    kg_now, keys, values = -1, [], []
    for kg, kb, value in items:
        if keys and (kg != kg_now or len(keys) >= size):
            yield kg_now, keys, values
            keys, values = [], []
        kg_now = kg
        keys.append(kb)
        values.append(value)
    if keys:
        yield kg_now, keys, values
