"""The keyed state interfaces (PyFlink names), the functions reducing and aggregating states take,
and those two state kinds built once, for every backend, on a value state.

Backends implement :class:`ValueState`, :class:`ListState` and :class:`MapState` for the current
key; reducing and aggregating state (here) and TTL (:mod:`statekit.state.ttl`) are layered on top,
the way Flink wraps its states.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from statekit.errors import StateError, StateTypeError
from statekit.serde.types import TypeSerializer

NULL_LIST = "the list of values cannot be None (clear() empties a list state)"

# --- user functions -----------------------------------------------------------------------------


class ReduceFunction(ABC):
    """Combines two values of the same type (for :class:`ReducingStateDescriptor`)."""

    @abstractmethod
    def reduce(self, value1: Any, value2: Any) -> Any: ...


class AggregateFunction(ABC):
    """Incremental aggregation with an accumulator (for :class:`AggregatingStateDescriptor`)."""

    @abstractmethod
    def create_accumulator(self) -> Any: ...

    @abstractmethod
    def add(self, value: Any, accumulator: Any) -> Any: ...

    @abstractmethod
    def get_result(self, accumulator: Any) -> Any: ...

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        raise NotImplementedError("merge is not needed by keyed state")


# --- state interfaces ----------------------------------------------------------------------------


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
    def add_all(self, values: Iterable[Any]) -> None:
        """Append ``values`` (None is a StateError, as in Flink)."""

    @abstractmethod
    def update(self, values: Iterable[Any]) -> None:
        """Replace the list (an empty one clears it; None is a StateError, as in Flink)."""

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


def check_user_key(serializer: TypeSerializer, key: Any, state_name: str) -> None:
    """:func:`check_value` for a map state's user key, which must also be hashable (a list for
    a tuple type is one on no backend)."""
    check_value(serializer, key, state_name)
    try:
        hash(key)
    except TypeError:
        raise StateTypeError(f"a user key must be hashable, got {type(key).__name__}",
                             state_name) from None


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
