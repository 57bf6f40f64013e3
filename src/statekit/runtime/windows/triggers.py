"""Triggers with PyFlink's names: when a window's pane is evaluated (and purged).

A trigger is asked on every element added to a window and when one of the timers it registered
through its :class:`Trigger.TriggerContext` fires; it answers with a :class:`TriggerResult`.
Triggers keep no state of their own: what they remember lives in the window's namespace
(``ctx.get_partitioned_state(descriptor)``), so it is checkpointed, restored and merged with the
window's contents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum
from typing import Any

from statekit.errors import ConfigError
from statekit.serde.types import Types
from statekit.state.api import ReduceFunction, State
from statekit.state.descriptors import ReducingStateDescriptor, StateDescriptor


class TriggerResult(Enum):
    """What happens to a window: CONTINUE (nothing), FIRE (evaluate, keep the contents), PURGE
    (drop the contents), FIRE_AND_PURGE (evaluate, then drop)."""

    CONTINUE = (False, False)
    FIRE_AND_PURGE = (True, True)
    FIRE = (True, False)
    PURGE = (False, True)

    def is_fire(self) -> bool:
        return bool(self.value[0])

    def is_purge(self) -> bool:
        return bool(self.value[1])


class Trigger(ABC):
    """Decides when a window fires (PyFlink's ``Trigger``)."""

    class TriggerContext(ABC):
        """Timers and window-scoped state for the trigger's current key and window."""

        @abstractmethod
        def get_current_processing_time(self) -> int: ...

        @abstractmethod
        def get_current_watermark(self) -> int: ...

        @abstractmethod
        def register_processing_time_timer(self, time: int) -> None: ...

        @abstractmethod
        def register_event_time_timer(self, time: int) -> None: ...

        @abstractmethod
        def delete_processing_time_timer(self, time: int) -> None: ...

        @abstractmethod
        def delete_event_time_timer(self, time: int) -> None: ...

        @abstractmethod
        def get_partitioned_state(self, state_descriptor: StateDescriptor) -> State:
            """The state of ``state_descriptor`` in the current key and window."""

        def get_metric_group(self) -> Any:
            return None

    class OnMergeContext(TriggerContext):
        @abstractmethod
        def merge_partitioned_state(self, state_descriptor: StateDescriptor) -> None:
            """Merge the merged windows' state of ``state_descriptor`` into the new window."""

    @abstractmethod
    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult: ...

    @abstractmethod
    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult: ...

    @abstractmethod
    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult: ...

    def can_merge(self) -> bool:
        """Whether the trigger works with merging (session) windows; then define ``on_merge``."""
        return False

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        """Windows were merged into ``window``: set up its timers and state."""
        raise ConfigError("trigger", f"{type(self).__name__} does not support merging windows")

    @abstractmethod
    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        """Delete the timers and state the trigger holds for ``window``."""


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (and again for each late element)."""

    @staticmethod
    def create() -> EventTimeTrigger:
        return EventTimeTrigger()

    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult:
        if window.max_timestamp() <= ctx.get_current_watermark():
            return TriggerResult.FIRE  # a late element within the allowed lateness
        ctx.register_event_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp() else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        if window.max_timestamp() > ctx.get_current_watermark():
            ctx.register_event_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp())


class ProcessingTimeTrigger(Trigger):
    """Fires once processing time passes the window's end."""

    @staticmethod
    def create() -> ProcessingTimeTrigger:
        return ProcessingTimeTrigger()

    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp())
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult:
        return TriggerResult.FIRE

    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        if window.max_timestamp() > ctx.get_current_processing_time():
            ctx.register_processing_time_timer(window.max_timestamp())

    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp())


class _Sum(ReduceFunction):
    def reduce(self, value1: Any, value2: Any) -> Any:
        return value1 + value2


class CountTrigger(Trigger):
    """Fires each time the window has received ``count`` more elements (its count is window
    state named ``count``)."""

    def __init__(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ConfigError("CountTrigger", f"needs a count > 0, got {count!r}")
        self._count = count
        self._descriptor = ReducingStateDescriptor("count", _Sum(), Types.LONG())

    @staticmethod
    def of(count: int) -> CountTrigger:
        return CountTrigger(count)

    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult:
        state: Any = ctx.get_partitioned_state(self._descriptor)
        state.add(1)
        if state.get() >= self._count:
            state.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        ctx.merge_partitioned_state(self._descriptor)

    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        ctx.get_partitioned_state(self._descriptor).clear()

    def __repr__(self) -> str:
        return f"CountTrigger({self._count})"


class PurgingTrigger(Trigger):
    """Another trigger whose every FIRE becomes FIRE_AND_PURGE."""

    def __init__(self, nested_trigger: Trigger) -> None:
        if not isinstance(nested_trigger, Trigger):
            raise ConfigError("PurgingTrigger", f"wraps a Trigger, got {nested_trigger!r}")
        self.nested_trigger = nested_trigger

    @staticmethod
    def of(nested_trigger: Trigger) -> PurgingTrigger:
        return PurgingTrigger(nested_trigger)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire() else result

    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult:
        return self._purging(self.nested_trigger.on_element(element, timestamp, window, ctx))

    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult:
        return self._purging(self.nested_trigger.on_processing_time(time, window, ctx))

    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult:
        return self._purging(self.nested_trigger.on_event_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.nested_trigger.can_merge()

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        self.nested_trigger.on_merge(window, ctx)

    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        self.nested_trigger.clear(window, ctx)

    def __repr__(self) -> str:
        return f"PurgingTrigger({self.nested_trigger!r})"


class NeverTrigger(Trigger):
    """Never fires: the default of :class:`~statekit.runtime.windows.GlobalWindows`."""

    def on_element(self, element: Any, timestamp: int | None, window: Any,
                   ctx: Trigger.TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                           ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: Any, ctx: Trigger.TriggerContext
                      ) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: Any, ctx: Trigger.OnMergeContext) -> None:
        return None

    def clear(self, window: Any, ctx: Trigger.TriggerContext) -> None:
        return None
