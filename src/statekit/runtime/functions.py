"""User function interfaces and the runtime context they get state from (PyFlink names)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from statekit.backends.base import KeyedStateBackend
from statekit.errors import StateError
from statekit.runtime.timers import TimeDomain, TimerService
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

    #: the subtask's operator state (statekit's adapters reach it here; user functions through
    #: ``CheckpointedFunction.initialize_state``, as in Flink)
    operator_state: Any = None

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

    def get_task_name_with_subtasks(self) -> str:
        """The task name with its subtask (Flink's ``name (index+1/parallelism)#attempt``)."""
        total = self._parallelism if self._parallelism > 0 else "?"
        return f"{self._task_name} ({self._index + 1}/{total})#{self._attempt}"

    def begin_attempt(self, attempt: int, **job_parameters: Any) -> None:
        """A kept function runs a new task attempt (on Spark, the next micro-batch): its
        attempt number and per-attempt parameters (``batch_id``) change."""
        self._attempt = attempt
        self._job_parameters.update(job_parameters)

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
    """Processes each element of a keyed stream with access to the key's state and timers."""

    class Context:
        """Per-element context: the current key, the element's timestamp, timers and time."""

        __slots__ = ("_backend", "_timers", "_timestamp")

        def __init__(self, backend: KeyedStateBackend, timers: TimerService | None = None) -> None:
            self._backend = backend
            self._timestamp: int | None = None
            self._timers = timers

        def get_current_key(self) -> Any:
            return self._backend.get_current_key()

        def timestamp(self) -> int | None:
            """The element's event-time timestamp (None without one); in ``on_timer`` the timer's."""
            return self._timestamp

        def timer_service(self) -> TimerService:
            """Timers of the current key, the processing time and the watermark."""
            if self._timers is None:
                raise StateError("this engine has no timer service here")
            return self._timers

    class OnTimerContext(Context):
        """Context of ``on_timer``: which time domain fired."""

        __slots__ = ("_domain",)

        def __init__(self, backend: KeyedStateBackend, timers: TimerService | None = None,
                     domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
            super().__init__(backend, timers)
            self._domain = domain

        def time_domain(self) -> TimeDomain:
            """``TimeDomain.EVENT_TIME`` or ``TimeDomain.PROCESSING_TIME``."""
            return self._domain

    @abstractmethod
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context
                        ) -> Iterable[Any] | None:
        """Yield (or return an iterable of) output elements for ``value``."""

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any] | None:
        """Called when a timer registered for the current key fires; yields output elements."""
        return None


class MapFunction(Function, ABC):
    """One output per element (on a keyed stream it may use keyed state)."""

    @abstractmethod
    def map(self, value: Any) -> Any: ...


class FilterFunction(Function, ABC):
    """Keeps the elements for which ``filter`` is true."""

    @abstractmethod
    def filter(self, value: Any) -> bool: ...


class FlatMapFunction(Function, ABC):
    """Any number of outputs per element."""

    @abstractmethod
    def flat_map(self, value: Any) -> Iterable[Any] | None: ...


class VectorizedKeyedFunction(Function, ABC):
    """Processes many rows at once with bulk state access (the fast path of the Spark adapters).

    ``process_batch`` gets a pandas DataFrame (all rows of a micro-batch partition, or of one key
    where the engine groups by key) and ``state``: bulk access to value, list and map state
    (:class:`~statekit.backends.bulk.BulkState`), the rows' key (``state.get_current_key()``
    where the rows are one key's, ``state.get_current_keys()`` on every engine) and timers of
    many keys; it returns the output rows as a DataFrame (or None).
    """

    @abstractmethod
    def process_batch(self, rows: Any, state: Any) -> Any: ...

    def on_timers(self, timers: Any, state: Any) -> Any:
        """Called with due timers as a DataFrame (``key``, ``timestamp``, ``domain`` columns, in
        timestamp order); returns output rows as a DataFrame (or None).  Define it to register
        timers (``state.register_event_time_timers(keys, timestamps)``, ...)."""
        return None


def open_function(function: F, runtime_context: RuntimeContext,
                  before_open: Callable[[F], None] | None = None) -> F:
    """A private copy of ``function``, opened with ``runtime_context`` (``before_open`` runs on
    the copy first: operator state's ``initialize_state``).

    Every partition (and every restore of one) runs its own instance, so the state handles its
    ``open`` creates point at that partition's backend and never at another's.
    """
    instance = copy.deepcopy(function)
    if before_open is not None:
        before_open(instance)
    instance.open(runtime_context)
    return instance


class OutputTag:
    """Names a side output (PyFlink's ``OutputTag``): a function yields ``(tag, value)`` to
    send ``value`` there instead of to the main output.  Tags are equal by ``tag_id``."""

    __slots__ = ("tag_id", "type_info")

    def __init__(self, tag_id: str, type_info: Any = None) -> None:
        if not isinstance(tag_id, str) or not tag_id:
            raise TypeError(f"an OutputTag needs a non-empty string id, got {tag_id!r}")
        self.tag_id = tag_id
        self.type_info = type_info

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.tag_id == self.tag_id

    def __hash__(self) -> int:
        return hash(("OutputTag", self.tag_id))

    def __repr__(self) -> str:
        return f"OutputTag({self.tag_id!r})"


def side_output_of(item: Any) -> OutputTag | None:
    """The tag of an output sent to a side output (``(tag, value)``), else None."""
    if type(item) is tuple and len(item) == 2 and type(item[0]) is OutputTag:
        return item[0]
    return None
