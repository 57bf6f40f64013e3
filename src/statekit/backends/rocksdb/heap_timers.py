"""Timers on the heap beside RocksDB state (``state.backend.rocksdb.timer-service.factory: HEAP``).

Flink lets the RocksDB backend keep its timers in memory, where firing and registering are
cheaper, while keyed state stays in RocksDB.  Here the queues are the heap backend's
(:class:`~statekit.backends.timers.HeapTimerQueue` over a heap table, captured in constant time);
a native checkpoint carries them as plain ``timers`` entries under ``heap_timers`` and a savepoint
as ordinary key-grouped entries.  Whatever a snapshot holds, after a restore the timers live where
the backend's setting says: RocksDB-held timers restored into a heap-timer backend are read out of
their column families, and heap-held ones restored into a RocksDB-timer backend are written in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rocksdict import WriteBatch

from statekit.backends.heap.capture import Capture
from statekit.backends.heap.table import HeapTable
from statekit.backends.kvformat import (
    group_entries,
    plain_in_range,
    read_plain_entry,
    write_kv_state,
    write_plain_entry,
)
from statekit.backends.kvschema import check_states
from statekit.backends.plainparts import reader_parts
from statekit.backends.rocksdb.encoding import KG_END, check_scan_end
from statekit.backends.rocksdb.timers import TimerOwner, index_name, ts8
from statekit.backends.timers import (
    TIMERS_KIND,
    TIMERS_LAYOUT,
    HeapTimerQueue,
    TimerQueue,
    check_restored_timers,
    timer_meta,
    timer_stamps,
)
from statekit.checkpoint import schema
from statekit.checkpoint.streams import CheckpointStreams
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.msgpack import packb

if TYPE_CHECKING:
    from statekit.backends.base import StateMeta
    from statekit.checkpoint.reader import StateReader

FACTORIES = ("ROCKSDB", "HEAP")


class HeapTimerOwner(TimerOwner, Protocol):
    """What the heap timers use of a RocksDB backend beyond a timer queue's needs: the states'
    kinds, the open database and its key-group range."""

    state_info: dict[str, dict[str, Any]]
    key_group_range: KeyGroupRange
    max_parallelism: int

    def ensure_open(self) -> Any:
        """The open database."""
        ...


def check_heap_timers(task: dict[str, Any], path: str, recorded: KeyGroupRange) -> None:
    """The schema pass over a native handle's ``heap_timers`` (plain ``timers`` entries)."""
    if "heap_timers" not in task:
        return
    check_states(task["heap_timers"], f"{path}.heap_timers", recorded)
    for name, entry in task["heap_timers"].items():
        if entry.get("kind") != TIMERS_KIND:
            raise schema.fail(f"{path}.heap_timers.{name}.kind", "expected timers")


class HeapTimers:
    """The heap timer queues of one RocksDB backend, and the timers restored for them."""

    def __init__(self, backend: HeapTimerOwner) -> None:
        self.backend = backend
        self.tables: dict[str, HeapTable] = {}  # by state name
        self.restored: dict[str, dict[Any, list[int]]] = {}  # by state name, not queued yet

    def queue(self, name: str, meta: StateMeta) -> TimerQueue:
        """A heap queue over a new table, holding the restored timers of ``name``."""
        table = HeapTable(meta)
        data = self.restored.pop(meta.name, None)
        if data:
            check_restored_timers(meta.name, data)
            table.data = data
        self.tables[meta.name] = table
        return HeapTimerQueue(name, table)

    # --- restore ----------------------------------------------------------------------------------

    def load_plain(self, handle: dict[str, Any], reader: StateReader,
                   key_filter: Callable[[Any], bool] | None = None) -> None:
        """The in-range timers of a native handle's ``heap_timers``."""
        backend = self.backend
        recorded = KeyGroupRange.of(handle["key_group_range"])
        key_ser = backend.key_serializer
        for name, entry in handle.get("heap_timers", {}).items():
            data = self.restored.setdefault(name, {})
            for keys, values in read_plain_entry(name, entry, reader):
                keys, values = plain_in_range(name, keys, values, recorded,
                                              backend.key_group_range, backend.max_parallelism)
                if not key_ser.identity:
                    keys = [key_ser.from_plain(k) for k in keys]
                for key, stamps in zip(keys, values, strict=True):
                    if key_filter is None or key_filter(key):
                        data[key] = stamps

    def add_serialized(self, name: str, kb: bytes, serialized: bytes) -> None:
        """One key's timers from a backend-neutral entry."""
        key = self.backend.key_serializer.deserialize(kb)
        self.restored.setdefault(name, {})[key] = timer_stamps(name, serialized)

    def settle(self, use_heap: bool) -> None:
        """After a restore: timers go where the backend keeps them (see the module docstring)."""
        backend = self.backend
        if use_heap:
            for name, info in list(backend.state_info.items()):
                if info["kind"] == TIMERS_KIND and name not in self.restored:
                    self.restored[name] = self._read_column_families(name)
            return
        for name, data in self.restored.items():
            self._write_column_families(name, data)
            backend.state_info[name] = {"layout": list(TIMERS_LAYOUT), "kind": TIMERS_KIND}
        self.restored.clear()

    def _read_column_families(self, name: str) -> dict[Any, list[int]]:
        backend = self.backend
        cf, index = backend.cf(name), backend.cf(index_name(name))
        de = backend.key_serializer.deserialize
        out: dict[Any, list[int]] = {}
        last = None
        for key in cf.keys():  # noqa: SIM118 - a scan of the column family
            out.setdefault(de(key[2:-8]), []).append(int.from_bytes(key[-8:], "big") - (1 << 63))
            last = key
        check_scan_end(cf, last)
        for store in (cf, index):  # emptied: they are not where this backend keeps timers
            store.delete_range(b"", KG_END)
        del backend.state_info[name]
        return out

    def _write_column_families(self, name: str, data: dict[Any, list[int]]) -> None:
        backend = self.backend
        db = backend.ensure_open()
        backend.cf(name)
        backend.cf(index_name(name))
        keys, index = db.get_column_family_handle(name), db.get_column_family_handle(index_name(name))
        batch = WriteBatch(raw_mode=True)
        for key, stamps in data.items():
            prefix = backend.key_prefix(key)
            for timestamp in stamps:
                batch.put(prefix + ts8(timestamp), packb(timestamp), keys)
                batch.put(prefix[:2] + ts8(timestamp) + prefix[2:], b"", index)
        db.write(batch)

    # --- snapshots --------------------------------------------------------------------------------

    def capture(self) -> list[tuple[str, StateMeta, Capture | dict[Any, Any]]]:
        """The synchronous part: a constant-time capture of each table, and the restored timers
        no queue took yet (unchanged until written)."""
        views: list[tuple[str, StateMeta, Capture | dict[Any, Any]]] = [
            (name, table.meta, table.capture()) for name, table in self.tables.items()]
        for name, data in self.restored.items():
            views.append((name, timer_meta(name[len("_timer_state/"):],
                                           self.backend.key_serializer), dict(data)))
        return views

    def write(self, views: list[tuple[str, StateMeta, Capture | dict[Any, Any]]],
              streams: CheckpointStreams, savepoint: bool) -> dict[str, Any]:
        """Write captured queues: plain entries for a checkpoint, key-grouped ones for a
        savepoint (then merged into its ``states``); releases the captures."""
        from statekit.backends.heap.capture import dict_reader

        backend = self.backend
        out: dict[str, Any] = {}
        try:
            for name, meta, view in views:
                if savepoint:
                    out[name] = write_kv_state(streams, name, group_entries(
                        view.items(), meta, backend.max_parallelism))
                    continue
                take = view.reader() if isinstance(view, Capture) else dict_reader(view)
                key_ser = meta.key_serializer
                parts = reader_parts(take, key_plain=None if key_ser.identity else key_ser.to_plain)
                out[name] = write_plain_entry(streams, name, meta.layout, TIMERS_KIND, parts)
        finally:
            self.release(views)
        return out

    def release(self, views: list[tuple[str, StateMeta, Capture | dict[Any, Any]]]) -> None:
        for name, _, view in views:
            if isinstance(view, Capture):
                self.tables[name].release(view)
