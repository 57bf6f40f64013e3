"""Count windows with PyFlink's names: a key's element count (a value state of the key) says
which windows each element joins; a window fires when it holds ``size`` elements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from statekit.backends.timers import MAX_TIMESTAMP
from statekit.errors import ConfigError
from statekit.runtime.windows.assigners import Window, WindowAssigner
from statekit.serde.types import TypeInformation, Types
from statekit.state.descriptors import ValueStateDescriptor

if TYPE_CHECKING:
    from statekit.runtime.windows.triggers import Trigger


class CountWindow(NamedTuple):
    """The ``id``-th window of a count window assigner (it ends by count, never by time)."""

    id: int

    def max_timestamp(self) -> int:
        return MAX_TIMESTAMP


Window.register(CountWindow)


class _CountWindows(WindowAssigner):
    """Count windows: the key's element count (a value state) says which windows it joins."""

    def __init__(self, size: int, slide: int) -> None:
        for name, n in (("size", size), ("slide", slide)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ConfigError(type(self).__name__, f"needs a {name} > 0, got {n!r}")
        self._size, self._slide = size, slide
        self._count = ValueStateDescriptor(self._state_name, Types.LONG())

    _state_name = "count-assigner"

    def _next(self, context: WindowAssigner.WindowAssignerContext) -> int:
        state = context.get_runtime_context().get_state(self._count)
        count = state.value() or 0
        state.update(count + 1)
        return int(count)

    def get_window_type(self) -> TypeInformation:
        return Types.TUPLE([Types.LONG()])

    def window_of(self, fields: Sequence[Any]) -> CountWindow:
        return CountWindow(fields[0])

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import CountTrigger, PurgingTrigger

        # a count window never receives an element after it fired: purging it then frees its
        # state (PyFlink's CountTrigger alone keeps it forever), the outputs are the same
        return PurgingTrigger(CountTrigger(self._size))

    def is_event_time(self) -> bool:
        return False


class CountTumblingWindowAssigner(_CountWindows):
    """Windows of ``window_size`` elements of a key, one after another."""

    _state_name = "tumble-count-assigner"

    def __init__(self, window_size: int) -> None:
        super().__init__(window_size, window_size)

    @staticmethod
    def of(window_size: int) -> CountTumblingWindowAssigner:
        return CountTumblingWindowAssigner(window_size)

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[CountWindow]:
        return [CountWindow(self._next(context) // self._size)]

    def __repr__(self) -> str:
        return f"CountTumblingWindowAssigner({self._size})"


class CountSlidingWindowAssigner(_CountWindows):
    """Windows of ``window_size`` elements of a key, one starting every ``window_slide``."""

    _state_name = "slide-count-assigner"

    def __init__(self, window_size: int, window_slide: int) -> None:
        super().__init__(window_size, window_slide)

    @staticmethod
    def of(window_size: int, window_slide: int) -> CountSlidingWindowAssigner:
        return CountSlidingWindowAssigner(window_size, window_slide)

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[CountWindow]:
        count = self._next(context)
        last = count // self._slide
        return [CountWindow(i) for i in range(last, -1, -1)
                if i * self._slide <= count <= i * self._slide + self._size - 1]

    def __repr__(self) -> str:
        return f"CountSlidingWindowAssigner({self._size}, {self._slide})"
