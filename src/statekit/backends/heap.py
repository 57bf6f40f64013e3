"""The heap backend: working state as Python objects in dicts (Flink's ``HashMapStateBackend``).

Snapshots are copy-on-write: the synchronous part copies each table's dict (references only);
afterwards any in-place change or hand-out of a value a pending snapshot still shares copies that
value first, so the snapshot sees exactly the state at capture time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from statekit.backends.base import (
    NO_KEY,
    KeyedStateBackend,
    KvStateData,
    SnapshotRun,
    StateBackend,
    StateMeta,
    group_entries,
    kv_handle,
    read_kv_states,
    write_kv_state,
)
from statekit.checkpoint.streams import CheckpointStreams, StateReader
from statekit.errors import StateError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import TypeSerializer
from statekit.state.api import ListState, MapState, State, ValueState, check_value


class HeapTable:
    """One state's key → stored value dict, plus copy-on-write bookkeeping for pending snapshots."""

    __slots__ = ("copy", "cow", "data", "fresh", "meta", "pending")

    def __init__(self, meta: StateMeta) -> None:
        self.meta = meta
        self.data: dict[Any, Any] = {}
        self.copy: Callable[[Any], Any] = meta.stored_serializer.copy
        self.cow = False  # a pending snapshot shares this table's values
        self.pending = 0
        self.fresh: set[Any] = set()  # keys whose values were copied since the last capture

    def own(self, key: Any, value: Any) -> Any:
        """``value`` made private to the live table (copied once if a snapshot shares it)."""
        if key in self.fresh:
            return value
        value = self.copy(value)
        self.data[key] = value
        self.fresh.add(key)
        return value

    def capture(self) -> dict[Any, Any]:
        """A frozen view for a snapshot: a shallow dict copy, with copy-on-write from now on."""
        view = dict(self.data)
        if not self.meta.stored_serializer.immutable:
            self.pending += 1
            self.cow = True
            self.fresh = set()
        return view

    def release(self) -> None:
        if not self.meta.stored_serializer.immutable and self.pending:
            self.pending -= 1
            if not self.pending:
                self.cow = False
                self.fresh = set()


class _HeapState:
    __slots__ = ("_b", "_check", "_name", "_t")

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer) -> None:
        self._b = backend
        self._t = table
        self._name = table.meta.name
        self._check = element

    def _key(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        return key

    def clear(self) -> None:
        self._t.data.pop(self._key(), None)


class HeapValueState(_HeapState, ValueState):
    __slots__ = ()

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        value = table.data.get(key)
        if table.cow and value is not None:
            value = table.own(key, value)
        return value

    def update(self, value: Any) -> None:
        key = self._key()
        if value is None:
            self._t.data.pop(key, None)
            return
        check_value(self._check, value, self._name)
        self._t.data[key] = value


class HeapListState(_HeapState, ListState):
    __slots__ = ()

    def _live(self, key: Any) -> list[Any] | None:
        table = self._t
        lst = table.data.get(key)
        if lst is not None and table.cow:
            lst = table.own(key, lst)
        return lst

    def get(self) -> list[Any]:
        return self._live(self._key()) or []

    def add(self, value: Any) -> None:
        key = self._key()
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        check_value(self._check, value, self._name)
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._key()
        values = list(values)
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)
        if not values:
            return
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = values
        else:
            lst.extend(values)

    def update(self, values: Iterable[Any] | None) -> None:
        key = self._key()
        values = [] if values is None else list(values)
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)
        if values:
            self._t.data[key] = values
        else:
            self._t.data.pop(key, None)


class HeapMapState(_HeapState, MapState):
    __slots__ = ("_ukey",)

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, table, element)
        self._ukey = user_key

    def _live(self, key: Any) -> dict[Any, Any] | None:
        table = self._t
        m = table.data.get(key)
        if m is not None and table.cow:
            m = table.own(key, m)
        return m

    def get(self, key: Any) -> Any:
        m = self._live(self._key())
        return None if m is None else m.get(key)

    def put(self, key: Any, value: Any) -> None:
        current = self._key()
        check_value(self._ukey, key, self._name)
        if value is not None:
            check_value(self._check, value, self._name)
        m = self._live(current)
        if m is None:
            self._t.data[current] = {key: value}
        else:
            m[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        for k, v in dict_value.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        current = self._key()
        m = self._live(current)
        if m is not None:
            m.pop(key, None)
            if not m:
                del self._t.data[current]

    def contains(self, key: Any) -> bool:
        m = self._t.data.get(self._key())
        return m is not None and key in m

    def items(self) -> list[tuple[Any, Any]]:
        m = self._live(self._key())
        return [] if m is None else list(m.items())

    def keys(self) -> list[Any]:
        m = self._t.data.get(self._key())
        return [] if m is None else list(m)

    def values(self) -> list[Any]:
        m = self._live(self._key())
        return [] if m is None else list(m.values())

    def is_empty(self) -> bool:
        return not self._t.data.get(self._key())


class HeapKeyedStateBackend(KeyedStateBackend):
    """Working state of one partition as Python objects."""

    backend_name = "hashmap"

    def __init__(self, key_serializer: TypeSerializer, key_group_range: KeyGroupRange,
                 max_parallelism: int, clock: Callable[[], int] | None = None,
                 using_asynchronous_snapshots: bool = True) -> None:
        super().__init__(key_serializer, key_group_range, max_parallelism, clock,
                         using_asynchronous_snapshots)
        self.tables: dict[str, HeapTable] = {}
        # restored, still serialized chunks of states not registered yet
        self._restored: dict[str, KvStateData] = {}

    def _create_state(self, meta: StateMeta) -> State:
        table = HeapTable(meta)
        self.tables[meta.name] = table
        stored = meta.stored_serializer
        restored = self._restored.pop(meta.name, None)
        if restored is not None:
            key_de, val_de = self.key_serializer.deserialize, stored.deserialize
            for keys, values in restored.chunks.values():
                table.data.update(zip(map(key_de, keys), map(val_de, values), strict=True))
        if meta.kind == "value":
            return HeapValueState(self, table, stored)
        if meta.kind == "list":
            return HeapListState(self, table, stored.element)  # type: ignore[attr-defined]
        return HeapMapState(self, table, stored.value, stored.key)  # type: ignore[attr-defined]

    def snapshot(self, checkpoint_id: int, streams: CheckpointStreams, *,
                 savepoint: bool = False) -> SnapshotRun:
        start = time.perf_counter()
        tables = list(self.tables.values())
        views = [(t, t.capture()) for t in tables] if self.asynchronous else [(t, t.data) for t in tables]
        restored = dict(self._restored)

        def write() -> dict[str, Any]:
            try:
                states: dict[str, Any] = {}
                for table, view in views:
                    data = group_entries(view.items(), table.meta, self.max_parallelism)
                    states[table.meta.name] = write_kv_state(streams, table.meta.name, data)
                for name, data in restored.items():  # restored but not registered: carry over
                    states[name] = write_kv_state(streams, name, data)
                return kv_handle(self, states)
            finally:
                release()

        def release() -> None:
            if self.asynchronous:
                for table, _ in views:
                    table.release()

        if not self.asynchronous:
            handle = write()
            return SnapshotRun(lambda: handle, time.perf_counter() - start)
        return SnapshotRun(write, time.perf_counter() - start, cancel=release)

    def restore(self, handles: list[dict[str, Any]], reader: StateReader) -> None:
        for name, entry, kg, keys, values in read_kv_states(handles, reader, self.key_group_range):
            if name in self.tables:
                raise StateError("restore must happen before the state is registered", name)
            self._restored_layouts[name] = entry["layout"]
            data = self._restored.get(name)
            if data is None:
                data = self._restored[name] = KvStateData(entry["layout"], entry["kind"])
            for kb, vb in zip(keys, values, strict=True):
                data.add(kg, kb, vb)

    def dispose(self) -> None:
        self.tables.clear()
        self._restored.clear()
        self._states.clear()


class HashMapStateBackend(StateBackend):
    """Working state on the Python heap; fast, bounded by memory; snapshots asynchronous by default."""

    name = "hashmap"

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(key_serializer, key_group_range, max_parallelism, clock,
                                     self.is_using_asynchronous_snapshots())

    def __repr__(self) -> str:
        return f"HashMapStateBackend(using_asynchronous_snapshots={self._async})"
