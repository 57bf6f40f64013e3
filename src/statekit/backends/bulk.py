"""Bulk state access for vectorized functions: many keys of one state in one call.

Value, list and map states.  Every argument is checked first (the keys' type, every list element
and map entry against the descriptor's types), so a call that raises has written nothing.  A
backend's state may then offer a fast path (``bulk_get``, ``bulk_append``, ... on its value, list
or map state class: one multi-get or one write batch, no state call per key); a state wrapped by
TTL, size limits or a state interceptor (change recording) has none, and each key is visited
through the regular state API, which applies those layers.  Either way the (key, ...) pairs are
taken in order, and a key may come many times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from statekit.backends.base import NO_KEY, KeyedStateBackend
from statekit.errors import StateError, StateTypeError
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import NULL_LIST, check_user_key, check_value
from statekit.state.descriptors import StateDescriptor, StateKind
from statekit.state.limits import LimitedValueState

_NONE_ELEMENT = "cannot add None to a list state"


class BulkState:
    """Reads and writes value, list and map states for many keys at once."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self.backend = backend
        self._serializers: dict[int, tuple[StateDescriptor, TypeSerializer,
                                           TypeSerializer | None]] = {}

    # --- shared ------------------------------------------------------------------------------

    def _check(self, descriptor: StateDescriptor, *kinds: StateKind) -> None:
        if descriptor.kind not in kinds:
            names = " and ".join(k.value for k in kinds)
            raise StateTypeError(f"this bulk call covers {names} states, not "
                                 f"{descriptor.kind.value} states", descriptor.name)

    def _state(self, descriptor: StateDescriptor, *kinds: StateKind) -> Any:
        """The registered state of ``descriptor`` (of one of ``kinds``)."""
        self._check(descriptor, *kinds)
        return self.backend.get_partitioned_state(descriptor)

    def _keys(self, keys: Sequence[Any], *others: Sequence[Any]) -> list[Any]:
        """``keys`` as a list, each a key of the declared type; ``others`` of the same length."""
        keys = list(keys)
        for other in others:
            if len(other) != len(keys):
                raise ValueError("keys and values differ in length")
        self.backend.key_check.check_all(keys)
        return keys

    def _types(self, descriptor: StateDescriptor) -> tuple[TypeSerializer, TypeSerializer | None]:
        """The element (value) serializer of ``descriptor`` and its user key serializer."""
        cached = self._serializers.get(id(descriptor))
        if cached is None or cached[0] is not descriptor:
            cached = self._serializers[id(descriptor)] = (
                descriptor, descriptor.value_serializer(), descriptor.user_key_serializer())
        return cached[1], cached[2]

    def _fast(self, name: str, descriptor: StateDescriptor) -> Any:
        """The backend's value-state fast path, unless a layer must see each key (TTL, change
        recording, size limits)."""
        if descriptor.ttl_config is not None or self.backend.state_interceptor is not None:
            return None
        if isinstance(self.backend.get_partitioned_state(descriptor), LimitedValueState):
            return None
        return getattr(self.backend, name, None)

    @staticmethod
    def _fast_of(state: Any, name: str) -> Callable[..., Any] | None:
        """The state class's own bulk method (a wrapper class, TTL or limits, has none)."""
        method = getattr(type(state), name, None)
        return None if method is None else method.__get__(state)

    @contextmanager
    def _current_key_kept(self) -> Iterator[None]:
        """Leave the backend's current key as it was (Flink: reading other keys' state, as
        queryable state does, never moves the current key); one rule for every backend."""
        previous = self.backend.current_key
        try:
            yield
        finally:
            if previous is not NO_KEY and self.backend.current_key is not previous:
                self.backend.set_current_key(previous)

    def _per_key(self, keys: Sequence[Any], call: Callable[..., Any],
                 *args: Sequence[Any]) -> list[Any]:
        """``call(*args[i])`` with ``keys[i]`` current, for each key: the results."""
        set_key = self.backend.set_current_key
        out = []
        for i, key in enumerate(keys):
            set_key(key)
            out.append(call(*(a[i] for a in args)))
        return out

    def _run(self, state: Any, fast_name: str, keys: list[Any], slow: Callable[..., Any],
             *args: Sequence[Any]) -> list[Any] | None:
        """The state's fast path ``fast_name(keys, *args)`` where it has one, else ``slow`` key by
        key; the current key is kept either way."""
        with self._current_key_kept():
            fast = self._fast_of(state, fast_name)
            if fast is not None:
                return fast(keys, *args)  # type: ignore[no-any-return]
            return self._per_key(keys, slow, *args)

    # --- every kind --------------------------------------------------------------------------

    def get(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> list[Any]:
        """Each key's state: a value state's value (None where unset), a list state's list
        (``[]`` where empty), a map state's entries as a dict (``{}`` where empty)."""
        if descriptor.kind == StateKind.LIST:
            state = self._state(descriptor, StateKind.LIST)
            return self._run(state, "bulk_get", self._keys(keys), state.get) or []
        if descriptor.kind == StateKind.MAP:
            state = self._state(descriptor, StateKind.MAP)
            return self._run(state, "bulk_items", self._keys(keys),
                             lambda: dict(state.items())) or []
        self._check(descriptor, StateKind.VALUE)
        with self._current_key_kept():
            fast = self._fast("bulk_get", descriptor)
            if fast is not None:
                return list(fast(descriptor, keys))
            read = self.backend.get_partitioned_state(descriptor).value  # type: ignore[attr-defined]
            return self._per_key(list(keys), read)

    def put(self, descriptor: StateDescriptor, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Set each key's state: a value (None clears it), a whole list (``[]`` clears it) or a
        whole map (``{}`` clears it); a key given twice keeps its last value."""
        if descriptor.kind == StateKind.LIST:
            state = self._state(descriptor, StateKind.LIST)
            keys = self._keys(keys, values)
            lists = [self._elements(descriptor, v) for v in values]
            self._run(state, "bulk_replace", keys, state.update, lists)
            return
        if descriptor.kind == StateKind.MAP:
            state = self._state(descriptor, StateKind.MAP)
            keys = self._keys(keys, values)
            maps = [self._entries(descriptor, v) for v in values]
            self._run(state, "bulk_replace", keys, lambda m: _replace_map(state, m), maps)
            return
        self._check(descriptor, StateKind.VALUE)
        if len(keys) != len(values):
            raise ValueError("keys and values differ in length")
        with self._current_key_kept():
            fast = self._fast("bulk_put", descriptor)
            if fast is not None:
                fast(descriptor, keys, values)
                return
            keys = self._keys(keys)  # every key and value checked before the first write
            value_type, name = self._types(descriptor)[0], descriptor.name
            if not _all_exact(value_type, values):
                for value in values:
                    if value is not None:
                        check_value(value_type, value, name)
            update = self.backend.get_partitioned_state(descriptor).update  # type: ignore[attr-defined]
            self._per_key(keys, update, list(values))

    def clear(self, descriptor: StateDescriptor, keys: Sequence[Any]) -> None:
        """Clear each key's value, list or map."""
        state = self._state(descriptor, StateKind.VALUE, StateKind.LIST, StateKind.MAP)
        with self._current_key_kept():
            self._per_key(self._keys(keys), state.clear)

    # --- list states -------------------------------------------------------------------------

    def add(self, descriptor: StateDescriptor, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Append ``values[i]`` to the list of ``keys[i]`` (a key may come many times: its
        elements are appended in order), e.g. one element per row of a batch."""
        state = self._state(descriptor, StateKind.LIST)
        keys = self._keys(keys, values)
        self._check_elements(descriptor, values)
        self._run(state, "bulk_add", keys, state.add, list(values))

    def add_all(self, descriptor: StateDescriptor, keys: Sequence[Any],
                values: Sequence[Sequence[Any]]) -> None:
        """Append the list ``values[i]`` to the list of ``keys[i]`` (ListState.add_all per
        key; None is a StateError, as there)."""
        state = self._state(descriptor, StateKind.LIST)
        keys = self._keys(keys, values)
        lists = [self._elements(descriptor, v) for v in values]  # copies: the state owns them
        self._run(state, "bulk_append", keys, state.add_all, lists)

    def _elements(self, descriptor: StateDescriptor, values: Any) -> list[Any]:
        """One key's list of elements, checked (a string is no list of elements here: a flat
        list of elements goes to :meth:`add`)."""
        if values is None:
            raise StateError(NULL_LIST, descriptor.name)
        if isinstance(values, str | bytes | dict) or not isinstance(values, Iterable):
            raise StateTypeError(f"expected a list of elements per key, got "
                                 f"{type(values).__name__}", descriptor.name)
        values = list(values)
        self._check_elements(descriptor, values)
        return values

    def _check_elements(self, descriptor: StateDescriptor, values: Sequence[Any]) -> None:
        """StateError for a None element, StateTypeError for one not of the element type."""
        serializer = self._types(descriptor)[0]
        if not _all_exact(serializer, values):
            for v in values:
                if v is None:
                    raise StateError(_NONE_ELEMENT, descriptor.name)
                check_value(serializer, v, descriptor.name)

    # --- map states --------------------------------------------------------------------------

    def get_entries(self, descriptor: StateDescriptor, keys: Sequence[Any],
                    user_keys: Sequence[Any]) -> list[Any]:
        """The value under ``user_keys[i]`` in the map of ``keys[i]`` (None where absent)."""
        state = self._state(descriptor, StateKind.MAP)
        keys = self._keys(keys, user_keys)
        return self._run(state, "bulk_get_entries", keys, state.get, list(user_keys)) or []

    def put_entries(self, descriptor: StateDescriptor, keys: Sequence[Any],
                    user_keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Put ``values[i]`` under ``user_keys[i]`` in the map of ``keys[i]`` (a key may come
        many times; a (key, user key) pair given twice keeps its last value)."""
        state = self._state(descriptor, StateKind.MAP)
        keys = self._keys(keys, user_keys, values)
        value_type, key_type = self._types(descriptor)
        assert key_type is not None
        name = descriptor.name
        if not _all_exact(key_type, user_keys):
            for user_key in user_keys:
                check_user_key(key_type, user_key, name)
        if not _all_exact(value_type, values):
            for value in values:
                if value is not None:
                    check_value(value_type, value, name)
        self._run(state, "bulk_put_entries", keys, state.put, list(user_keys), list(values))

    def remove_entries(self, descriptor: StateDescriptor, keys: Sequence[Any],
                       user_keys: Sequence[Any]) -> None:
        """Remove ``user_keys[i]`` from the map of ``keys[i]`` (an absent one is no error)."""
        state = self._state(descriptor, StateKind.MAP)
        keys = self._keys(keys, user_keys)
        self._run(state, "bulk_remove_entries", keys, state.remove, list(user_keys))

    def _entries(self, descriptor: StateDescriptor, entries: Any) -> dict[Any, Any]:
        if not isinstance(entries, dict):
            raise StateTypeError(f"expected a dict of entries, got {type(entries).__name__}",
                                 descriptor.name)
        value_type, key_type = self._types(descriptor)
        assert key_type is not None
        for user_key, value in entries.items():
            check_user_key(key_type, user_key, descriptor.name)
            if value is not None:
                check_value(value_type, value, descriptor.name)
        return entries


def _replace_map(state: Any, entries: dict[Any, Any]) -> None:
    state.clear()
    if entries:
        state.put_all(entries)


def _all_exact(serializer: TypeSerializer, values: Sequence[Any]) -> bool:
    """Whether every value is of the serializer's exact type within its bounds: one C-level
    pass, no check call per value (None is never of it)."""
    exact, low, high = serializer.exact_type()
    if exact is None or not values or set(map(type, values)) != {exact}:
        return not values
    return low is None or (low <= min(values) and max(values) <= high)
