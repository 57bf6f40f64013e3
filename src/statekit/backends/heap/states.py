"""The heap backend's states: value, list and map states over a :class:`HeapTable`.

The hot path reads and writes the live dict directly; only misses, writes while a snapshot is
pending (or the backend is incremental) and removals call into the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from statekit.backends.base import NO_KEY, KeyedStateBackend
from statekit.backends.heap.table import HeapTable
from statekit.errors import StateError
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import (
    NULL_LIST,
    ListState,
    MapState,
    ValueState,
    check_user_key,
    check_value,
)

#: no user key was checked yet (None is a key a check refuses, so it cannot mark that)
_UNCHECKED: Any = object()


class _HeapState:
    """What the heap's value, list and map states share: the table, key access and type checks."""

    __slots__ = ("_b", "_check", "_exact", "_high", "_low", "_name", "_t")

    def __init__(self, backend: KeyedStateBackend, table: HeapTable,
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
        value = table.data.get(key)
        if table.watch:
            return table.live(key, value)
        return value

    def _get(self, key: Any) -> Any:
        """The key's value for reading only (not handed out for changes)."""
        table = self._t
        value = table.data.get(key)
        if value is None and table.watch:
            return table.get(key)
        return value

    def _put(self, key: Any, value: Any) -> None:
        table = self._t
        if table.watch:
            table.put(key, value)
        else:
            table.data[key] = value

    def clear(self) -> None:
        self._clear(self._key())

    def _clear(self, key: Any) -> None:
        table = self._t
        if table.watch:
            table.remove(key)
        else:
            table.data.pop(key, None)


class HeapValueState(_HeapState, ValueState):
    """Value state of immutable values: the table maps each key to its value."""

    __slots__ = ()

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        value = table.data.get(key)
        if value is None and table.watch:
            return table.get(key)
        return value

    def update(self, value: Any) -> None:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        if value is None:
            if table.watch:
                table.remove(key)
            else:
                table.data.pop(key, None)
            return
        if type(value) is not self._exact or (
                self._low is not None and not self._low <= value <= self._high):  # inlined
            check_value(self._check, value, self._name)
        if table.watch:
            table.put(key, value)
        else:
            table.data[key] = value


class HeapMutableValueState(HeapValueState):
    """Value state of mutable values (lists, dicts, ...): a value handed out may be changed in
    place, so it is made private first while a snapshot shares it (and marked dirty)."""

    __slots__ = ()

    def value(self) -> Any:
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        value = table.data.get(key)
        if table.watch:
            return table.live(key, value)
        return value


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
            self._put(key, [value])
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        key = self._key()
        if values is None:
            raise StateError(NULL_LIST, self._name)
        values = list(values)
        if not values:
            return
        self._check_all(values)
        self._append(key, values)

    def _append(self, key: Any, values: list[Any]) -> None:
        """Append checked ``values`` (not empty, owned by the state from now on) to ``key``'s list."""
        lst = self._live(key)
        if lst is None:
            self._put(key, values)
        else:
            lst.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        key = self._key()
        if values is None:
            raise StateError(NULL_LIST, self._name)
        values = list(values)
        if values:
            self._check_all(values)
            self._put(key, values)
        else:
            self.clear()

    # bulk access (statekit.backends.bulk.BulkState): keys and elements are checked there; the
    # table's dict directly unless it is watched (a snapshot pending, or incremental)

    def bulk_get(self, keys: list[Any]) -> list[list[Any]]:
        if self._t.watch:
            live = self._live
            return [live(key) or [] for key in keys]
        get = self._t.data.get
        return [get(key) or [] for key in keys]

    def bulk_add(self, keys: list[Any], values: list[Any]) -> None:
        if self._t.watch:
            self.bulk_append(keys, [[v] for v in values])
            return
        data = self._t.data
        get = data.get
        for key, value in zip(keys, values, strict=True):
            lst = get(key)
            if lst is None:
                data[key] = [value]
            else:
                lst.append(value)

    def bulk_append(self, keys: list[Any], lists: list[list[Any]]) -> None:
        if self._t.watch:
            append = self._append
            for key, values in zip(keys, lists, strict=True):
                if values:
                    append(key, values)
            return
        data = self._t.data
        get = data.get
        for key, values in zip(keys, lists, strict=True):
            if values:
                lst = get(key)
                if lst is None:
                    data[key] = values
                else:
                    lst.extend(values)


class HeapMapState(_HeapState, MapState):
    """Map state: the table maps each key to a Python dict of user keys."""

    __slots__ = ("_shared_reads", "_ukey", "_ukey_exact", "_ukey_ok")

    def __init__(self, backend: KeyedStateBackend, table: HeapTable,
                 element: TypeSerializer, user_key: TypeSerializer) -> None:
        super().__init__(backend, table, element)
        self._ukey = user_key
        exact, low, _ = user_key.exact_type()
        self._ukey_exact = exact if low is None else None  # bounded keys take the full check
        #: the user key object checked last (a namespace is put again and again: checked once)
        self._ukey_ok: Any = _UNCHECKED
        # immutable map values may be handed out without copy-on-write or dirty marking
        self._shared_reads = bool(getattr(element, "immutable", False))

    def _read(self) -> dict[Any, Any] | None:
        """The current key's map for reading: shared when its values are immutable, else private
        (one call deep: the map reads are the hot path)."""
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        m = table.data.get(key)
        if table.watch:
            if not self._shared_reads:
                return table.live(key, m)
            if m is None:
                return table.get(key)
        return m

    def _peek(self) -> dict[Any, Any] | None:
        """The current key's map, not handed out for changes."""
        key = self._b.current_key
        if key is NO_KEY:
            raise self._b.no_key(self._name)
        table = self._t
        m = table.data.get(key)
        if m is None and table.watch:
            return table.get(key)
        return m

    def get(self, key: Any) -> Any:
        m = self._read()
        return None if m is None else m.get(key)

    def put(self, key: Any, value: Any) -> None:
        current = self._key()
        if type(key) is not self._ukey_exact and key is not self._ukey_ok:
            check_user_key(self._ukey, key, self._name)
            self._ukey_ok = key
        if value is not None and self._needs_check(value):
            check_value(self._check, value, self._name)
        m = self._live(current)
        if m is None:
            self._put(current, {key: value})
        else:
            m[key] = value

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        for k, v in dict_value.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        self._remove(self._key(), key)

    def _remove(self, current: Any, key: Any) -> None:
        m = self._live(current)
        if m is not None:
            m.pop(key, None)
            if not m:
                self._clear(current)

    def contains(self, key: Any) -> bool:
        m = self._peek()
        return m is not None and key in m

    def items(self) -> list[tuple[Any, Any]]:
        m = self._read()
        return [] if m is None else list(m.items())

    def keys(self) -> list[Any]:
        m = self._peek()
        return [] if m is None else list(m)

    def values(self) -> list[Any]:
        m = self._read()
        return [] if m is None else list(m.values())

    def is_empty(self) -> bool:
        return not self._peek()

    # bulk access (statekit.backends.bulk.BulkState): keys, user keys and values are checked there

    def bulk_get_entries(self, keys: list[Any], user_keys: list[Any]) -> list[Any]:
        read = self._live if self._t.watch and not self._shared_reads else self._get
        if not self._t.watch:
            get = self._t.data.get
            return [None if (m := get(key)) is None else m.get(user_key)
                    for key, user_key in zip(keys, user_keys, strict=True)]
        out = []
        for key, user_key in zip(keys, user_keys, strict=True):
            m = read(key)
            out.append(None if m is None else m.get(user_key))
        return out

    def bulk_items(self, keys: list[Any]) -> list[dict[Any, Any]]:
        read = self._live if self._t.watch and not self._shared_reads else self._get
        return [dict(read(key) or {}) for key in keys]

    def bulk_put_entries(self, keys: list[Any], user_keys: list[Any], values: list[Any]) -> None:
        if self._t.watch:
            live, put = self._live, self._put
        else:
            data = self._t.data
            live, put = data.get, data.__setitem__
        for key, user_key, value in zip(keys, user_keys, values, strict=True):
            m = live(key)
            if m is None:
                put(key, {user_key: value})
            else:
                m[user_key] = value

    def bulk_remove_entries(self, keys: list[Any], user_keys: list[Any]) -> None:
        remove = self._remove
        for key, user_key in zip(keys, user_keys, strict=True):
            remove(key, user_key)
