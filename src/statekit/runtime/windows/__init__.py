"""Windows on the local runner with PyFlink's names: ``key_by(...).window(assigner)``, triggers,
allowed lateness, late-data side outputs and window functions (see ``docs/windows.md``)."""

from statekit.durations import Time
from statekit.runtime.windows.assigners import (
    DynamicEventTimeSessionWindows,
    DynamicProcessingTimeSessionWindows,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    MergingWindowAssigner,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    Window,
    WindowAssigner,
)
from statekit.runtime.windows.counting import (
    CountSlidingWindowAssigner,
    CountTumblingWindowAssigner,
    CountWindow,
)
from statekit.runtime.windows.functions import (
    KeyedStateStore,
    ProcessWindowFunction,
    WindowFunction,
)
from statekit.runtime.windows.stream import WindowedStream, Windows
from statekit.runtime.windows.triggers import (
    CountTrigger,
    EventTimeTrigger,
    NeverTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)

__all__ = [
    "CountSlidingWindowAssigner",
    "CountTrigger",
    "CountTumblingWindowAssigner",
    "CountWindow",
    "DynamicEventTimeSessionWindows",
    "DynamicProcessingTimeSessionWindows",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "GlobalWindow",
    "GlobalWindows",
    "KeyedStateStore",
    "MergingWindowAssigner",
    "NeverTrigger",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "Time",
    "TimeWindow",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "Window",
    "WindowAssigner",
    "WindowFunction",
    "WindowedStream",
    "Windows",
]
