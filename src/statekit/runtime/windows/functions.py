"""Window functions with PyFlink's names, and the internal functions that feed them a window's
contents (a list of elements, one reduced value, or one aggregate)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from statekit.runtime.functions import Function, RuntimeContext
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
    StateDescriptor,
    ValueStateDescriptor,
)


class KeyedStateStore:
    """Keyed state by descriptor (PyFlink's ``KeyedStateStore``): the window's own state in
    ``context.window_state()``, the key's state across windows in ``context.global_state()``."""

    def __init__(self, lookup: Callable[[StateDescriptor], Any]) -> None:
        self._lookup = lookup

    def get_state(self, state_descriptor: ValueStateDescriptor) -> ValueState:
        return self._lookup(state_descriptor)  # type: ignore[no-any-return]

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> ListState:
        return self._lookup(state_descriptor)  # type: ignore[no-any-return]

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> MapState:
        return self._lookup(state_descriptor)  # type: ignore[no-any-return]

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> ReducingState:
        return self._lookup(state_descriptor)  # type: ignore[no-any-return]

    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor
                              ) -> AggregatingState:
        return self._lookup(state_descriptor)  # type: ignore[no-any-return]


class ProcessWindowFunction(Function, ABC):
    """Evaluates a window with its elements and a context (PyFlink's ``ProcessWindowFunction``)."""

    class Context(ABC):
        """The window being evaluated, time, and per-window and per-key state."""

        @abstractmethod
        def window(self) -> Any: ...

        @abstractmethod
        def current_processing_time(self) -> int: ...

        @abstractmethod
        def current_watermark(self) -> int: ...

        @abstractmethod
        def window_state(self) -> KeyedStateStore:
            """State of the current key *and window* (cleared by :meth:`clear`)."""

        @abstractmethod
        def global_state(self) -> KeyedStateStore:
            """State of the current key, shared by all its windows."""

    @abstractmethod
    def process(self, key: Any, context: ProcessWindowFunction.Context,
                elements: Iterable[Any]) -> Iterable[Any] | None:
        """Yield (or return an iterable of) the window's outputs."""

    def clear(self, context: ProcessWindowFunction.Context) -> None:
        """The window is cleaned up (past its allowed lateness): delete its window state here."""


class WindowFunction(Function, ABC):
    """Evaluates a window with its elements (PyFlink's ``WindowFunction``)."""

    @abstractmethod
    def apply(self, key: Any, window: Any, inputs: Iterable[Any]) -> Iterable[Any] | None: ...


class InternalWindowFunction:
    """How the operator evaluates a window's contents and clears it (wraps the user's function)."""

    def __init__(self, user: Function | None) -> None:
        self.user = user

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.user is not None:
            self.user.open(runtime_context)

    def close(self) -> None:
        if self.user is not None:
            self.user.close()

    def process(self, key: Any, window: Any, context: ProcessWindowFunction.Context,
                contents: Any) -> Iterable[Any]:
        raise NotImplementedError

    def clear(self, context: ProcessWindowFunction.Context) -> None:
        if isinstance(self.user, ProcessWindowFunction):
            self.user.clear(context)


def _call(user: Function, key: Any, window: Any, context: ProcessWindowFunction.Context,
          elements: Iterable[Any]) -> Iterable[Any]:
    if isinstance(user, ProcessWindowFunction):
        out = user.process(key, context, elements)
    else:
        out = user.apply(key, window, elements)  # type: ignore[attr-defined]
    return () if out is None else out


class IterableWindowFunction(InternalWindowFunction):
    """The window's elements (list state) to a ProcessWindowFunction or WindowFunction."""

    def process(self, key: Any, window: Any, context: ProcessWindowFunction.Context,
                contents: Any) -> Iterable[Any]:
        return _call(self.user, key, window, context, contents)  # type: ignore[arg-type]


class SingleValueWindowFunction(InternalWindowFunction):
    """A reduced value or an aggregate's result: emitted as is, or given as a one-element
    iterable to the window function."""

    def process(self, key: Any, window: Any, context: ProcessWindowFunction.Context,
                contents: Any) -> Iterable[Any]:
        if self.user is None:
            return (contents,)
        return _call(self.user, key, window, context, (contents,))


def check_window_function(function: Any, allow_none: bool) -> Function | None:
    """``function`` if it is a ProcessWindowFunction or WindowFunction (a TypeError otherwise)."""
    if function is None and allow_none:
        return None
    if not isinstance(function, ProcessWindowFunction | WindowFunction):
        raise TypeError("expected a ProcessWindowFunction or a WindowFunction, got "
                        f"{type(function).__name__}")
    return function
