"""State descriptors with PyFlink's names: a descriptor names a state and its type, and the backend
creates the state object from it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from statekit.durations import Time, to_millis
from statekit.errors import InvalidStateNameError, StateError
from statekit.serde.types import TypeInformation, TypeSerializer, serializer_for
from statekit.state.api import AggregateFunction, ReduceFunction
from statekit.state.ttl import StateTtlConfig

# kept importable from here, where they were defined before the state layer was split
__all__ = [
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReduceFunction",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateKind",
    "StateTtlConfig",
    "Time",
    "ValueStateDescriptor",
    "check_state_name",
    "internal_value_descriptor",
    "state_name_problem",
    "to_millis",
]


# --- descriptors ---------------------------------------------------------------------------------

#: the longest state name, in UTF-8 bytes (names become RocksDB column families and file names)
MAX_STATE_NAME_BYTES = 1024


def state_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a state on every backend (RocksDB column families take no NUL
    and only UTF-8), or None when it can."""
    if not isinstance(name, str) or not name:
        return "a state needs a non-empty string name"
    if "\x00" in name:
        return "a state name cannot contain a NUL character"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a state name must be encodable as UTF-8 (no lone surrogates)"
    if size > MAX_STATE_NAME_BYTES:
        return f"a state name has at most {MAX_STATE_NAME_BYTES} UTF-8 bytes, not {size}"
    return None


def check_state_name(name: object) -> None:
    """InvalidStateNameError unless ``name`` can name a state on every backend."""
    problem = state_name_problem(name)
    if problem is not None:
        raise InvalidStateNameError(f"{problem}: {reprlib.repr(name)}")



class StateKind(StrEnum):
    """How a state stores its value per key; backends implement VALUE, LIST and MAP."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"


class StateDescriptor:
    """Names a state and its type; backends create the state from it."""

    kind: StateKind

    def __init__(self, name: str, type_info: TypeInformation | TypeSerializer | None) -> None:
        check_state_name(name)
        if name.startswith("__statekit"):
            raise StateError("names starting with '__statekit' are reserved", name)
        self.name = name
        self.type_info = type_info
        self.ttl_config: StateTtlConfig | None = None

    def get_name(self) -> str:
        return self.name

    def enable_time_to_live(self, ttl_config: StateTtlConfig) -> None:
        self.ttl_config = ttl_config if ttl_config.is_enabled() else None

    @property
    def ttl_enabled(self) -> bool:
        return self.ttl_config is not None

    def value_serializer(self) -> TypeSerializer:
        """Serializer of one stored value (a list element for LIST, a map value for MAP)."""
        return serializer_for(self.type_info)

    def user_key_serializer(self) -> TypeSerializer | None:
        return None

    def layout(self) -> list[Any]:
        """What must match between a checkpoint and the descriptor restoring it."""
        uk = self.user_key_serializer()
        return [
            self.kind.value,
            self.value_serializer().config(),
            uk.config() if uk is not None else None,
            self.ttl_enabled,
        ]


class ValueStateDescriptor(StateDescriptor):
    """One value per key."""

    kind = StateKind.VALUE

    def __init__(self, name: str, value_type_info: TypeInformation | None = None) -> None:
        super().__init__(name, value_type_info)


class ListStateDescriptor(StateDescriptor):
    """A list of elements per key."""

    kind = StateKind.LIST

    def __init__(self, name: str, elem_type_info: TypeInformation | None = None) -> None:
        super().__init__(name, elem_type_info)


class MapStateDescriptor(StateDescriptor):
    """A map of user keys to values per key."""

    kind = StateKind.MAP

    def __init__(self, name: str, key_type_info: TypeInformation | None = None,
                 value_type_info: TypeInformation | None = None) -> None:
        super().__init__(name, value_type_info)
        self.key_type_info = key_type_info

    def user_key_serializer(self) -> TypeSerializer:
        return serializer_for(self.key_type_info)


class ReducingStateDescriptor(StateDescriptor):
    """One value per key, combined with a reduce function on every add."""

    kind = StateKind.REDUCING

    def __init__(self, name: str, reduce_function: ReduceFunction | Callable[[Any, Any], Any],
                 type_info: TypeInformation | None = None) -> None:
        super().__init__(name, type_info)
        if isinstance(reduce_function, ReduceFunction):
            self.reduce_function: Callable[[Any, Any], Any] = reduce_function.reduce
        elif callable(reduce_function):
            self.reduce_function = reduce_function
        else:
            raise StateError("reduce_function must be a ReduceFunction or a callable", name)

    def get_reduce_function(self) -> Callable[[Any, Any], Any]:
        """The function combining two values (PyFlink's getter)."""
        return self.reduce_function

    def layout(self) -> list[Any]:
        return [StateKind.VALUE.value, *super().layout()[1:]]


class AggregatingStateDescriptor(StateDescriptor):
    """One accumulator per key, updated by an aggregate function on every add."""

    kind = StateKind.AGGREGATING

    def __init__(self, name: str, agg_function: AggregateFunction,
                 state_type_info: TypeInformation | None = None) -> None:
        super().__init__(name, state_type_info)
        if not isinstance(agg_function, AggregateFunction):
            raise StateError("agg_function must be an AggregateFunction", name)
        self.agg_function = agg_function

    def get_agg_function(self) -> AggregateFunction:
        """The aggregate function (PyFlink's getter)."""
        return self.agg_function

    def layout(self) -> list[Any]:
        return [StateKind.VALUE.value, *super().layout()[1:]]


def internal_value_descriptor(name: str) -> ValueStateDescriptor:
    """A value state under a reserved ``__statekit...`` name, for statekit's own bookkeeping."""
    descriptor = ValueStateDescriptor("internal")
    descriptor.name = name
    return descriptor
