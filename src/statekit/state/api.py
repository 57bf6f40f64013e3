"""The keyed state interfaces (PyFlink names) and the backend-independent state kinds built on them.

Backends implement :class:`ValueState`, :class:`ListState` and :class:`MapState` for the current
key.  Reducing and aggregating state, and TTL, are layered on top here once, for every backend,
the way Flink wraps its states.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statekit.errors import StateError, StateTypeError
from statekit.serde.types import TypeSerializer
from statekit.state.descriptors import AggregateFunction, StateTtlConfig


class State(ABC):
    """A state of the current key."""

    @abstractmethod
    def clear(self) -> None:
        """Remove the current key's value."""


class ValueState(State):
    """One value per key; ``value()`` of an unset key is None."""

    @abstractmethod
    def value(self) -> Any: ...

    @abstractmethod
    def update(self, value: Any) -> None:
        """Set the value; ``update(None)`` clears it, as in Flink."""


class AppendingState(State):
    """A state values are added to (list, reducing, aggregating)."""

    @abstractmethod
    def get(self) -> Any: ...

    @abstractmethod
    def add(self, value: Any) -> None: ...


class ListState(AppendingState):
    """A list per key; ``get()`` of an empty list is an empty list."""

    @abstractmethod
    def get(self) -> list[Any]: ...

    @abstractmethod
    def add_all(self, values: Iterable[Any]) -> None: ...

    @abstractmethod
    def update(self, values: Iterable[Any] | None) -> None:
        """Replace the list (None or empty clears it)."""

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())


class MapState(State):
    """A map of user keys to values per key."""

    @abstractmethod
    def get(self, key: Any) -> Any: ...

    @abstractmethod
    def put(self, key: Any, value: Any) -> None: ...

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        for k, v in dict_value.items():
            self.put(k, v)

    @abstractmethod
    def remove(self, key: Any) -> None: ...

    @abstractmethod
    def contains(self, key: Any) -> bool: ...

    @abstractmethod
    def items(self) -> Iterable[tuple[Any, Any]]: ...

    def keys(self) -> Iterable[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> Iterable[Any]:
        return [v for _, v in self.items()]

    @abstractmethod
    def is_empty(self) -> bool: ...

    def __getitem__(self, key: Any) -> Any:
        return self.get(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        self.remove(key)

    def __contains__(self, key: Any) -> bool:
        return self.contains(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())


class ReducingState(AppendingState):
    """A single value per key, combined with the reduce function on every ``add``."""


class AggregatingState(AppendingState):
    """An accumulator per key; ``get()`` returns the aggregate function's result."""


def check_value(serializer: TypeSerializer, value: Any, state_name: str) -> None:
    """Raise :class:`StateTypeError` naming the state when ``value`` does not fit ``serializer``."""
    problem = serializer.check(value)
    if problem is not None:
        raise StateTypeError(problem, state_name)


# --- reducing and aggregating state, over any backend's ValueState --------------------------------


class ValueBackedReducingState(ReducingState):
    """Reducing state stored as a plain value."""

    def __init__(self, inner: ValueState, reduce: Callable[[Any, Any], Any], name: str) -> None:
        self._inner = inner
        self._reduce = reduce
        self._name = name

    def get(self) -> Any:
        return self._inner.value()

    def add(self, value: Any) -> None:
        if value is None:
            raise StateError("cannot add None to a reducing state", self._name)
        current = self._inner.value()
        self._inner.update(value if current is None else self._reduce(current, value))

    def clear(self) -> None:
        self._inner.clear()


class ValueBackedAggregatingState(AggregatingState):
    """Aggregating state whose accumulator is stored as a plain value."""

    def __init__(self, inner: ValueState, agg: AggregateFunction) -> None:
        self._inner = inner
        self._agg = agg

    def get(self) -> Any:
        acc = self._inner.value()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        acc = self._inner.value()
        if acc is None:
            acc = self._agg.create_accumulator()
        self._inner.update(self._agg.add(value, acc))

    def clear(self) -> None:
        self._inner.clear()


# --- TTL: values are stored as (value, last access timestamp in ms) --------------------------------


class TtlSerializer(TypeSerializer):
    """Stores ``(value, timestamp_ms)``; wraps a state's serializer when TTL is enabled."""

    identity = False

    def __init__(self, inner: TypeSerializer) -> None:
        self.inner = inner
        self.immutable = inner.immutable
        self.uses_pickle = inner.uses_pickle

    def to_plain(self, value: Any) -> Any:
        return [self.inner.to_plain(value[0]), value[1]]

    def from_plain(self, plain: Any) -> Any:
        return (self.inner.from_plain(plain[0]), plain[1])

    def copy(self, value: Any) -> Any:
        return (self.inner.copy(value[0]), value[1])

    def check(self, value: Any) -> str | None:
        return self.inner.check(value[0])

    def config(self) -> Any:
        return ["ttl", self.inner.config()]


class TtlPolicy:
    """Expiry arithmetic for one TTL config and clock, shared by all TTL state kinds."""

    def __init__(self, config: StateTtlConfig, clock: Callable[[], int]) -> None:
        self.ttl = config.get_ttl_millis()
        self.clock = clock
        self.update_on_read = config.get_update_type() == StateTtlConfig.UpdateType.OnReadAndWrite
        self.return_expired = (
            config.get_state_visibility()
            == StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
        )
        self.cleanup_full_snapshot = config.get_cleanup_strategies().in_full_snapshot()

    def expired(self, stamped: tuple[Any, int], now: int) -> bool:
        return stamped[1] + self.ttl <= now

    def drop_expired(self, kind: str, stored: Any, now: int) -> Any:
        """``stored`` without expired entries (None when nothing is left): snapshot-time cleanup."""
        if kind == "value":
            return None if self.expired(stored, now) else stored
        if kind == "list":
            kept = [e for e in stored if not self.expired(e, now)]
            return kept or None
        kept_map = {k: e for k, e in stored.items() if not self.expired(e, now)}
        return kept_map or None


class TtlValueState(ValueState):
    """Value state with expiry; wraps a backend value state holding ``(value, ts)``."""

    def __init__(self, inner: ValueState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def value(self) -> Any:
        stamped = self._inner.value()
        if stamped is None:
            return None
        now = self._p.clock()
        if self._p.expired(stamped, now):
            if not self._p.return_expired:
                self._inner.clear()
                return None
        elif self._p.update_on_read:
            self._inner.update((stamped[0], now))
        return stamped[0]

    def update(self, value: Any) -> None:
        if value is None:
            self._inner.clear()
        else:
            self._inner.update((value, self._p.clock()))

    def clear(self) -> None:
        self._inner.clear()


class TtlListState(ListState):
    """List state with per-element expiry."""

    def __init__(self, inner: ListState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def get(self) -> list[Any]:
        stored = self._inner.get()
        if not stored:
            return []
        now = self._p.clock()
        live = [e for e in stored if not self._p.expired(e, now)]
        if len(live) != len(stored) and not self._p.return_expired:
            self._inner.update(live)
        elif self._p.update_on_read:
            self._inner.update([(e[0], now) for e in (stored if self._p.return_expired else live)])
        return [e[0] for e in (stored if self._p.return_expired else live)]

    def add(self, value: Any) -> None:
        self._inner.add((value, self._p.clock()))

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._p.clock()
        self._inner.add_all([(v, now) for v in values])

    def update(self, values: Iterable[Any] | None) -> None:
        now = self._p.clock()
        self._inner.update(None if values is None else [(v, now) for v in values])

    def clear(self) -> None:
        self._inner.clear()


class TtlMapState(MapState):
    """Map state with per-entry expiry."""

    def __init__(self, inner: MapState, policy: TtlPolicy) -> None:
        self._inner = inner
        self._p = policy

    def _live(self, key: Any, stamped: Any, now: int) -> Any:
        """The entry's value after the expiry check, or a miss marker."""
        if stamped is None:
            return _MISS
        if self._p.expired(stamped, now):
            if not self._p.return_expired:
                self._inner.remove(key)
                return _MISS
        elif self._p.update_on_read:
            self._inner.put(key, (stamped[0], now))
        return stamped[0]

    def get(self, key: Any) -> Any:
        value = self._live(key, self._inner.get(key), self._p.clock())
        return None if value is _MISS else value

    def put(self, key: Any, value: Any) -> None:
        self._inner.put(key, (value, self._p.clock()))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        now = self._p.clock()
        self._inner.put_all({k: (v, now) for k, v in dict_value.items()})

    def remove(self, key: Any) -> None:
        self._inner.remove(key)

    def contains(self, key: Any) -> bool:
        return self._live(key, self._inner.get(key), self._p.clock()) is not _MISS

    def items(self) -> list[tuple[Any, Any]]:
        now = self._p.clock()
        out = []
        for k, stamped in list(self._inner.items()):
            value = self._live(k, stamped, now)
            if value is not _MISS:
                out.append((k, value))
        return out

    def is_empty(self) -> bool:
        return not self.items()

    def clear(self) -> None:
        self._inner.clear()


_MISS = object()
