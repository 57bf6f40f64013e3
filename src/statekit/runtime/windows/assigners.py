"""Windows and window assigners with PyFlink's names (``pyflink.datastream.window``).

A :class:`TimeWindow` is ``[start, end)`` in epoch milliseconds; it is a NamedTuple, so it
orders, hashes and compares as ``(start, end)`` and is its own state namespace (stored with the
serializer of ``Types.TUPLE([Types.LONG(), Types.LONG()])``).  Sizes, slides, offsets and gaps
are a :class:`~statekit.durations.Time`, a ``Duration``, a ``timedelta`` or an int of
milliseconds, as PyFlink takes them.
"""

from __future__ import annotations

import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from statekit.backends.timers import MAX_TIMESTAMP, MIN_TIMESTAMP
from statekit.durations import Time, to_millis
from statekit.errors import ConfigError, StateError
from statekit.serde.serializers import TypeSerializer
from statekit.serde.types import TypeInformation, Types

if TYPE_CHECKING:
    from statekit.runtime.windows.triggers import Trigger

Millis = Time | _dt.timedelta | int | Any


class Window(ABC):  # noqa: B024 - PyFlink's marker base; TimeWindow is a NamedTuple
    """A finite bucket of elements; all of them have arrived once time passes ``max_timestamp``."""

    def max_timestamp(self) -> int:  # pragma: no cover - every window defines it
        raise NotImplementedError


class TimeWindow(NamedTuple):
    """The time interval ``[start, end)`` (start inclusive, end exclusive), in milliseconds."""

    start: int
    end: int

    def max_timestamp(self) -> int:
        """The largest timestamp that still belongs to the window: ``end - 1``."""
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        """Whether the windows overlap or touch (PyFlink's rule, used to merge sessions)."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window covering both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))

    @staticmethod
    def get_window_start_with_offset(timestamp: int, offset: int, window_size: int) -> int:
        """The start of the window of ``window_size`` (shifted by ``offset``) holding ``timestamp``."""
        return timestamp - (timestamp - offset + window_size) % window_size

    @staticmethod
    def merge_windows(windows: Iterable[TimeWindow],
                      callback: MergingWindowAssigner.MergeCallback) -> None:
        """Merge overlapping windows: ``callback.merge(windows, cover)`` for each group of more
        than one."""
        current: TimeWindow | None = None
        group: set[TimeWindow] = set()
        merged: list[tuple[TimeWindow, set[TimeWindow]]] = []
        for candidate in sorted(windows):
            if current is None:
                current, group = candidate, {candidate}
            elif current.intersects(candidate):
                current = current.cover(candidate)
                group.add(candidate)
            else:
                merged.append((current, group))
                current, group = candidate, {candidate}
        if current is not None:
            merged.append((current, group))
        for cover, members in merged:
            if len(members) > 1:
                callback.merge(members, cover)


Window.register(TimeWindow)


class GlobalWindow(NamedTuple):
    """The one window of :class:`GlobalWindows`: every element of a key, never ending."""

    start: int = MIN_TIMESTAMP
    end: int = MAX_TIMESTAMP

    @staticmethod
    def get() -> GlobalWindow:
        return _GLOBAL

    def max_timestamp(self) -> int:
        return MAX_TIMESTAMP

    def __repr__(self) -> str:
        return "GlobalWindow"


_GLOBAL = GlobalWindow()
Window.register(GlobalWindow)


class WindowAssigner(ABC):
    """Assigns each element to zero or more windows (PyFlink's ``WindowAssigner``)."""

    class WindowAssignerContext(ABC):
        """What an assigner may ask: the current processing time."""

        @abstractmethod
        def get_current_processing_time(self) -> int: ...

        def get_runtime_context(self) -> Any:
            raise StateError("this window assigner context has no runtime context")

    @abstractmethod
    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> Collection[Any]:
        """The windows ``element`` (with event time ``timestamp``) belongs to."""

    @abstractmethod
    def get_default_trigger(self, env: Any = None) -> Trigger:
        """The trigger used when ``WindowedStream.trigger`` is not called."""

    @abstractmethod
    def is_event_time(self) -> bool:
        """Whether windows are of event time (timestamps, watermarks) or processing time."""

    def get_window_type(self) -> TypeInformation:
        """The type of the windows as state namespaces: ``(start, end)`` as two longs."""
        return Types.TUPLE([Types.LONG(), Types.LONG()])

    def get_window_serializer(self) -> TypeSerializer:
        """The serializer of the windows' namespace."""
        return self.get_window_type().get_serializer()

    def window_of(self, fields: Sequence[Any]) -> Any:
        """The window whose namespace fields are ``fields`` (as stored in state)."""
        start, end = fields
        return _GLOBAL if (start, end) == (MIN_TIMESTAMP, MAX_TIMESTAMP) else TimeWindow(start, end)


class MergingWindowAssigner(WindowAssigner):
    """An assigner whose windows merge (sessions)."""

    class MergeCallback(ABC):
        @abstractmethod
        def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
            """``to_be_merged`` become the one window ``merge_result``."""

    @abstractmethod
    def merge_windows(self, windows: Iterable[Any],
                      callback: MergingWindowAssigner.MergeCallback) -> None:
        """Tell ``callback`` which of ``windows`` merge."""


def _ms(value: Millis, name: str, minimum: int) -> int:
    if value is None:
        return 0
    return to_millis(value, name, minimum=minimum)


def _event_timestamp(timestamp: int | None, assigner: str) -> int:
    if timestamp is None or timestamp == MIN_TIMESTAMP:
        raise StateError(f"{assigner} got an element without a timestamp: give the stream event "
                         "time with assign_timestamps_and_watermarks(...) first, or use a "
                         "processing-time assigner")
    return timestamp


class _Tumbling(WindowAssigner):
    def __init__(self, size: int, offset: int) -> None:
        if size <= 0 or abs(offset) >= size:
            raise ConfigError(type(self).__name__,
                              f"needs size > 0 and abs(offset) < size, got size {size}, "
                              f"offset {offset}")
        self._size, self._offset = size, offset

    def _window(self, timestamp: int) -> list[TimeWindow]:
        start = timestamp - (timestamp - self._offset + self._size) % self._size
        return [TimeWindow(start, start + self._size)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._size}, {self._offset})"


class TumblingEventTimeWindows(_Tumbling):
    """Windows of a fixed size that do not overlap, by the elements' event time."""

    @staticmethod
    def of(size: Millis, offset: Millis = None) -> TumblingEventTimeWindows:
        return TumblingEventTimeWindows(_ms(size, "size", 1), _ms(offset, "offset", -(1 << 62)))

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._window(_event_timestamp(timestamp, "TumblingEventTimeWindows"))

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import EventTimeTrigger

        return EventTimeTrigger()

    def is_event_time(self) -> bool:
        return True


class TumblingProcessingTimeWindows(_Tumbling):
    """Windows of a fixed size that do not overlap, by the processing time of arrival."""

    @staticmethod
    def of(size: Millis, offset: Millis = None) -> TumblingProcessingTimeWindows:
        return TumblingProcessingTimeWindows(_ms(size, "size", 1),
                                             _ms(offset, "offset", -(1 << 62)))

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._window(context.get_current_processing_time())

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import ProcessingTimeTrigger

        return ProcessingTimeTrigger()

    def is_event_time(self) -> bool:
        return False


class _Sliding(WindowAssigner):
    def __init__(self, size: int, slide: int, offset: int) -> None:
        if size <= 0 or slide <= 0 or abs(offset) >= slide:
            raise ConfigError(type(self).__name__,
                              f"needs size > 0, slide > 0 and abs(offset) < slide, got size "
                              f"{size}, slide {slide}, offset {offset}")
        self._size, self._slide, self._offset = size, slide, offset

    def _windows(self, timestamp: int) -> list[TimeWindow]:
        size, slide = self._size, self._slide
        last = timestamp - (timestamp - self._offset + slide) % slide
        return [TimeWindow(start, start + size) for start in range(last, timestamp - size, -slide)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._size}, {self._slide}, {self._offset})"


class SlidingEventTimeWindows(_Sliding):
    """Windows of ``size`` starting every ``slide`` (an element may be in several), by event time."""

    @staticmethod
    def of(size: Millis, slide: Millis, offset: Millis = None) -> SlidingEventTimeWindows:
        return SlidingEventTimeWindows(_ms(size, "size", 1), _ms(slide, "slide", 1),
                                       _ms(offset, "offset", -(1 << 62)))

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._windows(_event_timestamp(timestamp, "SlidingEventTimeWindows"))

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import EventTimeTrigger

        return EventTimeTrigger()

    def is_event_time(self) -> bool:
        return True


class SlidingProcessingTimeWindows(_Sliding):
    """Windows of ``size`` starting every ``slide``, by processing time."""

    @staticmethod
    def of(size: Millis, slide: Millis, offset: Millis = None) -> SlidingProcessingTimeWindows:
        return SlidingProcessingTimeWindows(_ms(size, "size", 1), _ms(slide, "slide", 1),
                                            _ms(offset, "offset", -(1 << 62)))

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._windows(context.get_current_processing_time())

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import ProcessingTimeTrigger

        return ProcessingTimeTrigger()

    def is_event_time(self) -> bool:
        return False


class _Sessions(MergingWindowAssigner):
    def __init__(self, gap: int | None, extractor: Callable[[Any], Any] | None = None) -> None:
        if gap is not None and gap <= 0:
            raise ConfigError(type(self).__name__, f"needs a gap > 0, got {gap}")
        self._gap = gap
        self._extractor = extractor

    def _window(self, element: Any, timestamp: int) -> list[TimeWindow]:
        gap = self._gap
        if gap is None:
            extract = getattr(self._extractor, "extract", self._extractor)
            gap = to_millis(extract(element), "session gap", minimum=1)  # type: ignore[misc]
        return [TimeWindow(timestamp, timestamp + gap)]

    def merge_windows(self, windows: Iterable[TimeWindow],
                      callback: MergingWindowAssigner.MergeCallback) -> None:
        TimeWindow.merge_windows(windows, callback)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._gap})"


class EventTimeSessionWindows(_Sessions):
    """Sessions by event time: a key's elements closer than ``gap`` share a window."""

    @staticmethod
    def with_gap(size: Millis) -> EventTimeSessionWindows:
        return EventTimeSessionWindows(_ms(size, "gap", 1))

    @staticmethod
    def with_dynamic_gap(extractor: Any) -> EventTimeSessionWindows:
        """Sessions whose gap ``extractor.extract(element)`` (or ``extractor(element)``) gives."""
        return EventTimeSessionWindows(None, extractor)

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._window(element, _event_timestamp(timestamp, "EventTimeSessionWindows"))

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import EventTimeTrigger

        return EventTimeTrigger()

    def is_event_time(self) -> bool:
        return True


class ProcessingTimeSessionWindows(_Sessions):
    """Sessions by processing time: elements arriving closer than ``gap`` share a window."""

    @staticmethod
    def with_gap(size: Millis) -> ProcessingTimeSessionWindows:
        return ProcessingTimeSessionWindows(_ms(size, "gap", 1))

    @staticmethod
    def with_dynamic_gap(extractor: Any) -> ProcessingTimeSessionWindows:
        return ProcessingTimeSessionWindows(None, extractor)

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[TimeWindow]:
        return self._window(element, context.get_current_processing_time())

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import ProcessingTimeTrigger

        return ProcessingTimeTrigger()

    def is_event_time(self) -> bool:
        return False


DynamicEventTimeSessionWindows = EventTimeSessionWindows
DynamicProcessingTimeSessionWindows = ProcessingTimeSessionWindows


class GlobalWindows(WindowAssigner):
    """Every element of a key in one :class:`GlobalWindow`; fires only by a custom trigger."""

    @staticmethod
    def create() -> GlobalWindows:
        return GlobalWindows()

    def assign_windows(self, element: Any, timestamp: int | None,
                       context: WindowAssigner.WindowAssignerContext) -> list[GlobalWindow]:
        return [_GLOBAL]

    def get_default_trigger(self, env: Any = None) -> Trigger:
        from statekit.runtime.windows.triggers import NeverTrigger

        return NeverTrigger()

    def is_event_time(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "GlobalWindows()"
