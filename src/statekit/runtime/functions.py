"""User function interfaces and the runtime context they get state from (PyFlink names)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from statekit.backends.base import KeyedStateBackend
from statekit.errors import StateError
from statekit.serde.types import Types
from statekit.state.api import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

F = TypeVar("F", bound="Function")


class RuntimeContext:
    """What a function sees of its running partition: its index, and keyed state by descriptor."""

    def __init__(self, backend: KeyedStateBackend, task_name: str, index: int,
                 parallelism: int, max_parallelism: int, attempt: int = 0,
                 job_parameters: dict[str, Any] | None = None) -> None:
        self._backend = backend
        self._task_name = task_name
        self._index = index
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._attempt = attempt
        self._job_parameters = dict(job_parameters or {})

    def get_task_name(self) -> str:
        return self._task_name

    def get_number_of_parallel_subtasks(self) -> int:
        return self._parallelism

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self._max_parallelism

    def get_index_of_this_subtask(self) -> int:
        return self._index

    def get_attempt_number(self) -> int:
        return self._attempt

    def get_job_parameter(self, key: str, default_value: Any = None) -> Any:
        return self._job_parameters.get(key, default_value)

    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        return self._backend.get_partitioned_state(state_descriptor)  # type: ignore[return-value]

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._backend.get_partitioned_state(state_descriptor)  # type: ignore[return-value]

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        return self._backend.get_partitioned_state(state_descriptor)  # type: ignore[return-value]

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        return self._backend.get_partitioned_state(state_descriptor)  # type: ignore[return-value]

    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor
                              ) -> AggregatingState:
        return self._backend.get_partitioned_state(state_descriptor)  # type: ignore[return-value]


class Function:
    """Base of user functions: ``open`` once before the first element, ``close`` at the end."""

    def open(self, runtime_context: RuntimeContext) -> None:
        """Create state handles here."""

    def close(self) -> None:
        """Release resources."""


class KeyedProcessFunction(Function, ABC):
    """Processes each element of a keyed stream with access to the key's state."""

    class Context:
        """Per-element context: the current key, and timers where the engine offers them."""

        def __init__(self, backend: KeyedStateBackend, timers: TimerService | None = None) -> None:
            self._backend = backend
            self._timestamp: int | None = None
            self._timers = timers

        def get_current_key(self) -> Any:
            return self._backend.get_current_key()

        def timestamp(self) -> int | None:
            return self._timestamp

        def timer_service(self) -> TimerService:
            if self._timers is None:
                raise StateError("timers are available in the applyInPandasWithState adapter "
                                 "(GroupStateTimeout); this engine has no timer service")
            return self._timers

    class OnTimerContext(Context):
        """Context of ``on_timer``: which time domain fired."""

        def __init__(self, backend: KeyedStateBackend, timers: TimerService, domain: str) -> None:
            super().__init__(backend, timers)
            self._domain = domain

        def time_domain(self) -> str:
            """``"EVENT_TIME"`` or ``"PROCESSING_TIME"``."""
            return self._domain

    @abstractmethod
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context
                        ) -> Iterable[Any] | None:
        """Yield (or return an iterable of) output elements for ``value``."""

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any] | None:
        """Called when a timer registered for the current key fires."""
        return None


class TimerService:
    """Per-key timers kept in keyed state (so they are checkpointed with it)."""

    EVENT_TIME = "EVENT_TIME"
    PROCESSING_TIME = "PROCESSING_TIME"

    def __init__(self, backend: KeyedStateBackend, clock: Any, watermark: Any) -> None:
        descriptor = MapStateDescriptor("timers", Types.LONG(), Types.STRING())
        descriptor.name = "__statekit_timers"
        self._timers = backend.get_partitioned_state(descriptor)
        self._clock = clock
        self._watermark = watermark

    def current_processing_time(self) -> int:
        return int(self._clock())

    def current_watermark(self) -> int:
        return int(self._watermark())

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers.put(int(timestamp) * 2 + 1, self.PROCESSING_TIME)  # type: ignore[attr-defined]

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers.put(int(timestamp) * 2, self.EVENT_TIME)  # type: ignore[attr-defined]

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._timers.remove(int(timestamp) * 2 + 1)  # type: ignore[attr-defined]

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._timers.remove(int(timestamp) * 2)  # type: ignore[attr-defined]

    def registered(self) -> list[tuple[int, str]]:
        """The current key's timers as (timestamp, domain), earliest first."""
        return sorted((k // 2, d) for k, d in self._timers.items())  # type: ignore[attr-defined]

    def pop_due(self, processing_time: int, watermark: int) -> list[tuple[int, str]]:
        """Remove and return the current key's timers that are due, earliest first."""
        due = [(ts, d) for ts, d in self.registered()
               if ts <= (processing_time if d == self.PROCESSING_TIME else watermark)]
        for ts, d in due:
            self._timers.remove(ts * 2 + (1 if d == self.PROCESSING_TIME else 0))  # type: ignore[attr-defined]
        return due


class MapFunction(Function, ABC):
    """One output per element (on a keyed stream it may use keyed state)."""

    @abstractmethod
    def map(self, value: Any) -> Any: ...


class FlatMapFunction(Function, ABC):
    """Any number of outputs per element."""

    @abstractmethod
    def flat_map(self, value: Any) -> Iterable[Any] | None: ...


class VectorizedKeyedFunction(Function, ABC):
    """Processes many rows at once with bulk state access (the fast path of the Spark adapters).

    ``process_batch`` gets a pandas DataFrame (all rows of a micro-batch partition, or of one key
    where the engine groups by key) and a :class:`~statekit.backends.bulk.BulkState`, and returns
    the output rows as a DataFrame (or None).
    """

    @abstractmethod
    def process_batch(self, rows: Any, state: Any) -> Any: ...


def open_function(function: F, backend: KeyedStateBackend, task_name: str, index: int,
                  max_parallelism: int, *, parallelism: int = -1, attempt: int = 0,
                  job_parameters: Mapping[str, Any] | None = None) -> F:
    """A private copy of ``function``, opened on ``backend``.

    Every partition (and every restore of one) runs its own instance, so the state handles its
    ``open`` creates point at that partition's backend and never at another's.
    """
    instance = copy.deepcopy(function)
    instance.open(RuntimeContext(backend, task_name, index, parallelism, max_parallelism, attempt,
                                 dict(job_parameters or {})))
    return instance
