"""State descriptors, TTL configuration and user function interfaces, with PyFlink's names.

A descriptor names a state and its type; the backend creates the state object from it.
"""

from __future__ import annotations

import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum, StrEnum
from typing import Any

from statekit.durations import Time, to_millis
from statekit.errors import StateError
from statekit.serde.types import TypeInformation, TypeSerializer, serializer_for


class StateTtlConfig:
    """Time-to-live of state entries, by processing time (PyFlink's builder API)."""

    class UpdateType(Enum):
        Disabled = 0
        OnCreateAndWrite = 1
        OnReadAndWrite = 2

    class StateVisibility(Enum):
        ReturnExpiredIfNotCleanedUp = 0
        NeverReturnExpired = 1

    class TtlTimeCharacteristic(Enum):
        ProcessingTime = 0

    class CleanupStrategies:
        """Which background cleanups run; full-snapshot cleanup drops expired entries on snapshot."""

        def __init__(self, full_snapshot: bool, incremental: tuple[int, bool] | None,
                     compaction_filter: int | None, in_background: bool) -> None:
            self._full_snapshot = full_snapshot
            self._incremental = incremental
            self._compaction_filter = compaction_filter
            self._in_background = in_background

        def is_cleanup_in_background(self) -> bool:
            return self._in_background

        def in_full_snapshot(self) -> bool:
            return self._full_snapshot

        def get_incremental_cleanup_strategy(self) -> tuple[int, bool] | None:
            """(cleanup size, run for every record) or None."""
            if self._incremental is not None:
                return self._incremental
            return (5, False) if self._in_background else None

        def get_rocksdb_compact_filter_cleanup_strategy(self) -> int | None:
            """Entries processed between reads of the current time, or None."""
            if self._compaction_filter is not None:
                return self._compaction_filter
            return 1000 if self._in_background else None

    def __init__(self, update_type: StateTtlConfig.UpdateType,
                 state_visibility: StateTtlConfig.StateVisibility, ttl: int,
                 cleanup_strategies: StateTtlConfig.CleanupStrategies) -> None:
        self._update_type = update_type
        self._visibility = state_visibility
        self._ttl = ttl
        self._cleanup = cleanup_strategies

    @staticmethod
    def new_builder(ttl: Time | _dt.timedelta | int) -> StateTtlConfig.Builder:
        return StateTtlConfig.Builder(ttl)

    def get_update_type(self) -> StateTtlConfig.UpdateType:
        return self._update_type

    def get_state_visibility(self) -> StateTtlConfig.StateVisibility:
        return self._visibility

    def get_ttl(self) -> Time:
        return Time(self._ttl)

    def get_ttl_millis(self) -> int:
        return self._ttl

    def get_ttl_time_characteristic(self) -> StateTtlConfig.TtlTimeCharacteristic:
        return StateTtlConfig.TtlTimeCharacteristic.ProcessingTime

    def is_enabled(self) -> bool:
        return self._update_type != StateTtlConfig.UpdateType.Disabled

    def get_cleanup_strategies(self) -> StateTtlConfig.CleanupStrategies:
        return self._cleanup

    class Builder:
        """Builds a :class:`StateTtlConfig`; every setter returns the builder."""

        def __init__(self, ttl: Time | _dt.timedelta | int) -> None:
            self._ttl = to_millis(ttl)
            self._update_type = StateTtlConfig.UpdateType.OnCreateAndWrite
            self._visibility = StateTtlConfig.StateVisibility.NeverReturnExpired
            self._full_snapshot = False
            self._incremental: tuple[int, bool] | None = None
            self._compaction_filter: int | None = None
            self._in_background = True

        def set_update_type(self, update_type: StateTtlConfig.UpdateType) -> StateTtlConfig.Builder:
            self._update_type = update_type
            return self

        def update_ttl_on_create_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)

        def update_ttl_on_read_and_write(self) -> StateTtlConfig.Builder:
            return self.set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)

        def set_state_visibility(
            self, visibility: StateTtlConfig.StateVisibility
        ) -> StateTtlConfig.Builder:
            self._visibility = visibility
            return self

        def return_expired_if_not_cleaned_up(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(
                StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp
            )

        def never_return_expired(self) -> StateTtlConfig.Builder:
            return self.set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)

        def set_ttl_time_characteristic(
            self, characteristic: StateTtlConfig.TtlTimeCharacteristic
        ) -> StateTtlConfig.Builder:
            if characteristic != StateTtlConfig.TtlTimeCharacteristic.ProcessingTime:
                raise ValueError("only processing time is supported for state TTL")
            return self

        def use_processing_time(self) -> StateTtlConfig.Builder:
            return self

        def cleanup_full_snapshot(self) -> StateTtlConfig.Builder:
            self._full_snapshot = True
            return self

        def cleanup_incrementally(
            self, cleanup_size: int = 5, run_cleanup_for_every_record: bool = False
        ) -> StateTtlConfig.Builder:
            self._incremental = (cleanup_size, run_cleanup_for_every_record)
            return self

        def cleanup_in_rocksdb_compact_filter(
            self, query_time_after_num_entries: int = 1000
        ) -> StateTtlConfig.Builder:
            self._compaction_filter = query_time_after_num_entries
            return self

        def disable_cleanup_in_background(self) -> StateTtlConfig.Builder:
            self._in_background = False
            return self

        def set_ttl(self, ttl: Time | _dt.timedelta | int) -> StateTtlConfig.Builder:
            self._ttl = to_millis(ttl)
            return self

        def build(self) -> StateTtlConfig:
            strategies = StateTtlConfig.CleanupStrategies(
                self._full_snapshot, self._incremental, self._compaction_filter, self._in_background
            )
            return StateTtlConfig(self._update_type, self._visibility, self._ttl, strategies)


# --- user functions ---------------------------------------------------------------------------------


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


# --- descriptors ---------------------------------------------------------------------------------


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
        if not isinstance(name, str) or not name:
            raise StateError("a state needs a non-empty string name")
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

    def layout(self) -> list[Any]:
        return [StateKind.VALUE.value, *super().layout()[1:]]


def internal_value_descriptor(name: str) -> ValueStateDescriptor:
    """A value state under a reserved ``__statekit...`` name, for statekit's own bookkeeping."""
    descriptor = ValueStateDescriptor("internal")
    descriptor.name = name
    return descriptor
