"""The heap backend's tables and states: Python objects in one dict per state, copy-on-write.

A snapshot's synchronous part takes a shallow copy of each table (:meth:`HeapTable.capture`);
afterwards any in-place change or hand-out of a value a pending snapshot still shares copies that
value first (:meth:`HeapTable.own`), so the snapshot sees exactly the state at capture time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from statekit.backends.base import NO_KEY, StateMeta
from statekit.errors import StateError
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import ListState, MapState, ValueState, check_value

if TYPE_CHECKING:
    from statekit.backends.heap.backend import HeapKeyedStateBackend


class HeapTable:
    """One state's key → stored value dict, plus copy-on-write bookkeeping for pending snapshots."""

    __slots__ = ("copy", "cow", "data", "dirty", "fresh", "meta", "pending")

    def __init__(self, meta: StateMeta, track_dirty: bool = False) -> None:
        self.meta = meta
        self.data: dict[Any, Any] = {}
        self.copy: Callable[[Any], Any] = meta.stored_serializer.copy
        self.cow = False  # a pending snapshot shares this table's values
        self.pending = 0
        self.fresh: set[Any] = set()  # keys whose values were copied since the last capture
        # keys written (or whose mutable value was handed out) since the last capture; None when
        # the backend is not incremental
        self.dirty: set[Any] | None = set() if track_dirty else None

    def take_dirty(self) -> set[Any]:
        """The dirty keys since the last call, resetting the set (incremental snapshots)."""
        dirty = self.dirty
        if dirty is None:
            return set()
        self.dirty = set()
        return dirty

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
    """What the heap's value, list and map states share: the table, key access and type checks."""

    __slots__ = ("_b", "_check", "_exact", "_high", "_low", "_name", "_t")

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer) -> None:
        self._b = backend
        self._t = table
        self._name = table.meta.name
        self._check = element
        # values of exactly this type (within the bounds) need no call to ``element.check``
        self._exact, self._low, self._high = element.exact_type()

    def _needs_check(self, value: Any) -> bool:
        return type(value) is not self._exact or (
            self._low is not None and not self._low <= value <= self._high)

    def _check_all(self, values: list[Any]) -> None:
        """Validate a batch: one C-level pass when every element has the exact type."""
        exact = self._exact
        if exact is not None and set(map(type, values)) == {exact} and (
                self._low is None or (self._low <= min(values) and max(values) <= self._high)):
            return
        for v in values:
            if v is None:
                raise StateError("cannot add None to a list state", self._name)
            check_value(self._check, v, self._name)

    def _key(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        return key

    def _live(self, key: Any) -> Any:
        """The key's mutable value (list or dict) for an in-place change: marked dirty, and made
        private to the live table first when a pending snapshot shares it."""
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        value = table.data.get(key)
        if value is not None and table.cow:
            value = table.own(key, value)
        return value

    def clear(self) -> None:
        key = self._key()
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        table.data.pop(key, None)


class HeapValueState(_HeapState, ValueState):
    """Value state: the table maps each key to its value."""

    __slots__ = ()

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        value = table.data.get(key)
        if value is not None and not table.meta.stored_serializer.immutable:
            if table.cow:
                value = table.own(key, value)
            if table.dirty is not None:  # a mutable value handed out may be changed in place
                table.dirty.add(key)
        return value

    def update(self, value: Any) -> None:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        if table.dirty is not None:
            table.dirty.add(key)
        if value is None:
            table.data.pop(key, None)
            return
        if type(value) is not self._exact or (
                self._low is not None and not self._low <= value <= self._high):  # inlined
            check_value(self._check, value, self._name)
        table.data[key] = value


class HeapListState(_HeapState, ListState):
    """List state: the table maps each key to a Python list, appended to in place."""

    __slots__ = ()

    def get(self) -> list[Any]:
        return self._live(self._key()) or []

    def add(self, value: Any) -> None:
        key = self._key()
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        if self._needs_check(value):
            check_value(self._check, value, self._name)
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._key()
        values = list(values)
        if not values:
            return
        self._check_all(values)
        lst = self._live(key)
        if lst is None:
            self._t.data[key] = values
        else:
            lst.extend(values)

    def update(self, values: Iterable[Any] | None) -> None:
        key = self._key()
        values = [] if values is None else list(values)
        if values:
            self._check_all(values)
        if self._t.dirty is not None:
            self._t.dirty.add(key)
        if values:
            self._t.data[key] = values
        else:
            self._t.data.pop(key, None)


class HeapMapState(_HeapState, MapState):
    """Map state: the table maps each key to a Python dict of user keys."""

    __slots__ = ("_shared_reads", "_ukey", "_ukey_exact")

    def __init__(self, backend: HeapKeyedStateBackend, table: HeapTable,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, table, element)
        self._ukey = user_key
        exact, low, _ = user_key.exact_type()
        self._ukey_exact = exact if low is None else None  # bounded keys take the full check
        # immutable map values may be handed out without copy-on-write or dirty marking
        self._shared_reads = bool(getattr(element, "immutable", False))

    def _read(self, key: Any) -> dict[Any, Any] | None:
        if self._shared_reads:
            return self._t.data.get(key)
        return self._live(key)

    def get(self, key: Any) -> Any:
        m = self._read(self._key())
        return None if m is None else m.get(key)

    def put(self, key: Any, value: Any) -> None:
        current = self._key()
        if type(key) is not self._ukey_exact:
            check_value(self._ukey, key, self._name)
        if value is not None and self._needs_check(value):
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
        m = self._read(self._key())
        return [] if m is None else list(m.items())

    def keys(self) -> list[Any]:
        m = self._t.data.get(self._key())
        return [] if m is None else list(m)

    def values(self) -> list[Any]:
        m = self._read(self._key())
        return [] if m is None else list(m.values())

    def is_empty(self) -> bool:
        return not self._t.data.get(self._key())



class Restored:
    """A restored state not registered yet: its layout and kind, and key -> plain stored value
    (converted by the state's serializer when the state is registered)."""

    __slots__ = ("data", "kind", "layout", "shared")

    def __init__(self, layout: list[Any], kind: str) -> None:
        self.layout = layout
        self.kind = kind
        self.data: dict[Any, Any] = {}
        self.shared = 0  # asynchronous snapshots still writing ``data`` (carried over)
