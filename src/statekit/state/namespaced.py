"""Namespaced keyed state: state of the current key *and* a namespace (Flink's ``InternalKvState``
with ``setCurrentNamespace``), the state windows keep per window.

A namespaced state is stored as a map state of the current key whose user keys are the
namespaces and whose values are what the state holds in each namespace (a value, a list, a
map).  Every backend, snapshot format, restore, rescale and inspection tool therefore handles it
as the map state it is stored as, and state without a namespace keeps its hot path untouched.
The views here turn the state interfaces into reads and writes of the current namespace's entry;
list, reducing and aggregating views also merge namespaces (Flink's ``InternalMergingState``),
which merging (session) windows need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from statekit.errors import StateError, StateTypeError
from statekit.serde.serializers import TypeSerializer
from statekit.state.api import (
    NULL_LIST,
    AggregateFunction,
    ListState,
    MapState,
    State,
    ValueBackedAggregatingState,
    ValueBackedReducingState,
    ValueState,
)

_UNSET: Any = type("NoNamespace", (), {"__repr__": lambda self: "<no current namespace>"})()


class Namespaced:
    """What every namespaced view shares: the carrier map state and the current namespace."""

    def __init__(self, carrier: MapState, name: str, namespace_serializer: TypeSerializer) -> None:
        self._carrier = carrier
        self._name = name
        self._ns_serializer = namespace_serializer
        self._ns: Any = _UNSET

    def set_current_namespace(self, namespace: Any) -> None:
        """Make ``namespace`` the one every following call reads and writes (a StateTypeError
        unless it is a hashable value of the state's namespace type)."""
        self._ns = self.checked(namespace)

    def get_current_namespace(self) -> Any:
        if self._ns is _UNSET:
            raise StateError("no current namespace (call set_current_namespace first)", self._name)
        return self._ns

    def checked(self, namespace: Any) -> Any:
        """``namespace`` if it is a value of the namespace type usable as a key."""
        problem = None if namespace is not None else "a namespace cannot be None"
        if problem is None:
            problem = self._ns_serializer.check(namespace)
        if problem is None:
            try:
                hash(namespace)
            except TypeError:
                problem = f"a namespace must be hashable, got {type(namespace).__name__}"
        if problem:
            raise StateTypeError(f"namespace {namespace!r}: {problem}", self._name)
        return namespace

    def _entry(self) -> Any:
        """The current namespace's stored value (None when it holds nothing)."""
        return self._carrier.get(self.get_current_namespace())

    def clear(self) -> None:
        self._carrier.remove(self.get_current_namespace())

    def namespaces(self) -> list[Any]:
        """The namespaces the current key holds this state in."""
        return list(self._carrier.keys())


class NamespacedValueState(Namespaced, ValueState):
    """A value per (key, namespace)."""

    def value(self) -> Any:
        return self._entry()

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
        else:
            self._carrier.put(self.get_current_namespace(), value)


class NamespacedListState(Namespaced, ListState):
    """A list per (key, namespace); adding rewrites the namespace's list (a map entry)."""

    def get(self) -> list[Any]:
        return self._entry() or []

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError("cannot add None to a list state", self._name)
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        values = self._values(values)
        if values:
            ns = self.get_current_namespace()
            old = self._carrier.get(ns)
            self._carrier.put(ns, values if old is None else [*old, *values])

    def update(self, values: Iterable[Any]) -> None:
        values = self._values(values)
        if values:
            self._carrier.put(self.get_current_namespace(), values)
        else:
            self.clear()

    def _values(self, values: Iterable[Any] | None) -> list[Any]:
        if values is None:
            raise StateError(NULL_LIST, self._name)
        values = list(values)
        if any(v is None for v in values):
            raise StateError("cannot add None to a list state", self._name)
        return values

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Append the lists of ``sources`` (in order) to ``target``'s and clear the sources."""
        carrier, target = self._carrier, self.checked(target)
        merged: list[Any] = []
        for source in sources:
            source = self.checked(source)
            if source == target:
                continue
            lst = carrier.get(source)
            if lst:
                merged.extend(lst)
                carrier.remove(source)
        if merged:
            old = carrier.get(target)
            carrier.put(target, merged if old is None else [*old, *merged])


class NamespacedMapState(Namespaced, MapState):
    """A map per (key, namespace); a change rewrites the namespace's map (a map entry)."""

    def _map(self) -> dict[Any, Any]:
        return self._entry() or {}

    def get(self, key: Any) -> Any:
        return self._map().get(key)

    def put(self, key: Any, value: Any) -> None:
        self.put_all({key: value})

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        if dict_value:
            ns = self.get_current_namespace()
            self._carrier.put(ns, {**(self._carrier.get(ns) or {}), **dict_value})

    def remove(self, key: Any) -> None:
        ns = self.get_current_namespace()
        m = self._carrier.get(ns)
        if m and key in m:
            m = {k: v for k, v in m.items() if k != key}
            if m:
                self._carrier.put(ns, m)
            else:
                self._carrier.remove(ns)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def keys(self) -> list[Any]:
        return list(self._map())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def is_empty(self) -> bool:
        return not self._map()


class _MergingValue:
    """Namespace control and merging for the reducing and aggregating views over a namespaced
    value state (``_core``) holding the reduced value or the accumulator."""

    _core: NamespacedValueState

    def set_current_namespace(self, namespace: Any) -> None:
        self._core.set_current_namespace(namespace)

    def get_current_namespace(self) -> Any:
        return self._core.get_current_namespace()

    def _merge(self, target: Any, sources: Iterable[Any], combine: Callable[[Any, Any], Any]
               ) -> None:
        core = self._core
        target = core.checked(target)
        previous = core._ns
        try:
            merged = None
            for source in sources:
                core.set_current_namespace(source)
                if source == target:
                    continue
                value = core.value()
                if value is not None:
                    merged = value if merged is None else combine(merged, value)
                    core.clear()
            if merged is not None:
                core.set_current_namespace(target)
                current = core.value()
                core.update(merged if current is None else combine(current, merged))
        finally:
            core._ns = previous


class NamespacedReducingState(_MergingValue, ValueBackedReducingState):
    """Reducing state per (key, namespace)."""

    def __init__(self, core: NamespacedValueState, reduce: Callable[[Any, Any], Any],
                 name: str) -> None:
        super().__init__(core, reduce, name)
        self._core = core

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Reduce the values of ``sources`` into ``target``'s and clear the sources."""
        self._merge(target, sources, self._reduce)


class NamespacedAggregatingState(_MergingValue, ValueBackedAggregatingState):
    """Aggregating state per (key, namespace); merging needs ``AggregateFunction.merge``."""

    def __init__(self, core: NamespacedValueState, agg: AggregateFunction) -> None:
        super().__init__(core, agg)
        self._core = core

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the accumulators of ``sources`` into ``target``'s and clear the sources."""
        self._merge(target, sources, self._agg.merge)


def namespaced_view(kind: str, carrier: MapState, name: str, namespace_serializer: TypeSerializer,
                    *, reduce: Callable[[Any, Any], Any] | None = None,
                    agg: AggregateFunction | None = None) -> State:
    """The namespaced state of a descriptor of ``kind`` (``value``, ``list``, ``map``,
    ``reducing``, ``aggregating``) over its carrier map state."""
    if kind == "list":
        return NamespacedListState(carrier, name, namespace_serializer)
    if kind == "map":
        return NamespacedMapState(carrier, name, namespace_serializer)
    core = NamespacedValueState(carrier, name, namespace_serializer)
    if kind == "reducing":
        assert reduce is not None
        return NamespacedReducingState(core, reduce, name)
    if kind == "aggregating":
        assert agg is not None
        return NamespacedAggregatingState(core, agg)
    return core
