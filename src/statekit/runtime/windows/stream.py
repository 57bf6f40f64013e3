"""``KeyedStream.window(assigner)`` -> :class:`WindowedStream` (PyFlink's names): set the
trigger, the allowed lateness and the late-data side output, then ``reduce``, ``aggregate``,
``process`` or ``apply``.  :class:`Windows` is the same without a stream: its operations return
the window operator itself, a keyed function for the engines that take one (the Spark
adapters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from statekit.durations import to_millis
from statekit.errors import ConfigError, ConfigTypeError
from statekit.runtime.functions import OutputTag
from statekit.runtime.windows.assigners import MergingWindowAssigner, WindowAssigner
from statekit.runtime.windows.functions import (
    IterableWindowFunction,
    ProcessWindowFunction,
    SingleValueWindowFunction,
    WindowFunction,
    check_window_function,
)
from statekit.runtime.windows.operator import WindowOperator
from statekit.runtime.windows.triggers import Trigger
from statekit.serde.types import TypeInformation
from statekit.state.api import AggregateFunction, ReduceFunction
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)

if TYPE_CHECKING:
    from statekit.runtime.datastream import KeyedStream, ProcessedStream

#: the namespaced state holding each window's contents (Flink's name)
WINDOW_CONTENTS = "window-contents"


class _Windowing:
    """The window operation being built: assigner, trigger, lateness, late-data output."""

    def __init__(self, window_assigner: WindowAssigner, env: Any = None) -> None:
        if not isinstance(window_assigner, WindowAssigner):
            raise ConfigTypeError("window_assigner", "expected a WindowAssigner, got "
                                  f"{type(window_assigner).__name__}")
        self._assigner = window_assigner
        self._trigger: Trigger = window_assigner.get_default_trigger(env)
        self._lateness = 0
        self._late_tag: OutputTag | None = None

    def trigger(self, trigger: Trigger) -> Self:
        """Fire windows by ``trigger`` instead of the assigner's default trigger."""
        if not isinstance(trigger, Trigger):
            raise ConfigTypeError("trigger", f"expected a Trigger, got {type(trigger).__name__}")
        if isinstance(self._assigner, MergingWindowAssigner) and not trigger.can_merge():
            raise ConfigError("trigger", f"{type(trigger).__name__} cannot merge windows, so it "
                              f"cannot fire the merging windows of {self._assigner!r}")
        self._trigger = trigger
        return self

    def allowed_lateness(self, time_ms: int | Any) -> Self:
        """Keep each event-time window's state ``time_ms`` past its end: an element arriving
        that late still joins it and fires it again (Flink's late firing)."""
        lateness = to_millis(time_ms, "allowed_lateness", minimum=0)
        if lateness and not self._assigner.is_event_time():
            raise ConfigError("allowed_lateness", "only event-time windows have a lateness; "
                              f"{self._assigner!r} runs on processing time")
        self._lateness = lateness
        return self

    def side_output_late_data(self, output_tag: OutputTag) -> Self:
        """Send elements that arrive after their windows' lateness to ``output_tag``."""
        if not isinstance(output_tag, OutputTag):
            raise ConfigTypeError("output_tag", "expected an OutputTag, got "
                                  f"{type(output_tag).__name__}")
        self._late_tag = output_tag
        return self

    def reduce(self, reduce_function: ReduceFunction | Callable[[Any, Any], Any],
               window_function: ProcessWindowFunction | WindowFunction | None = None,
               output_type: TypeInformation | None = None) -> Any:
        """Each window reduced incrementally (a reducing state per window); its result, or the
        window function's outputs for it.  Without a window function, ``output_type`` (the
        reduced value's type) is the type the window contents are stored with."""
        if not isinstance(reduce_function, ReduceFunction) and not callable(reduce_function):
            raise ConfigTypeError("reduce_function", "expected a ReduceFunction or a callable")
        descriptor = ReducingStateDescriptor(WINDOW_CONTENTS, reduce_function,
                                             output_type if window_function is None else None)
        return self._run(descriptor, SingleValueWindowFunction(
            check_window_function(window_function, allow_none=True)))

    def aggregate(self, aggregate_function: AggregateFunction,
                  window_function: ProcessWindowFunction | WindowFunction | None = None,
                  accumulator_type: TypeInformation | None = None,
                  output_type: TypeInformation | None = None) -> Any:
        """Each window aggregated incrementally (an aggregating state per window)."""
        if not isinstance(aggregate_function, AggregateFunction):
            raise ConfigTypeError("aggregate_function", "expected an AggregateFunction, got "
                                  f"{type(aggregate_function).__name__}")
        descriptor = AggregatingStateDescriptor(WINDOW_CONTENTS, aggregate_function,
                                                accumulator_type)
        return self._run(descriptor, SingleValueWindowFunction(
            check_window_function(window_function, allow_none=True)))

    def process(self, function: ProcessWindowFunction,
                output_type: TypeInformation | None = None) -> Any:
        """Each window's elements (a list state per window) to ``function.process``."""
        if not isinstance(function, ProcessWindowFunction):
            raise ConfigTypeError("function", "expected a ProcessWindowFunction, got "
                                  f"{type(function).__name__}")
        return self._run(ListStateDescriptor(WINDOW_CONTENTS), IterableWindowFunction(function))

    def apply(self, window_function: WindowFunction, output_type: TypeInformation | None = None
              ) -> Any:
        """Each window's elements to ``window_function.apply(key, window, inputs)``."""
        if not isinstance(window_function, WindowFunction):
            raise ConfigTypeError("window_function", "expected a WindowFunction, got "
                                  f"{type(window_function).__name__}")
        return self._run(ListStateDescriptor(WINDOW_CONTENTS),
                         IterableWindowFunction(window_function))

    def _operator(self, contents: StateDescriptor, function: Any) -> WindowOperator:
        return WindowOperator(self._assigner, self._trigger, contents, function, self._lateness,
                              self._late_tag)

    def _run(self, contents: StateDescriptor, function: Any) -> Any:
        raise NotImplementedError


class WindowedStream(_Windowing):
    """A keyed stream cut into windows; ``reduce``, ``aggregate``, ``process`` and ``apply``
    return the :class:`~statekit.runtime.datastream.ProcessedStream` of one
    :class:`WindowOperator`."""

    def __init__(self, keyed_stream: KeyedStream, window_assigner: WindowAssigner) -> None:
        super().__init__(window_assigner, keyed_stream._upstream._env)
        self._keyed = keyed_stream

    def get_execution_environment(self) -> Any:
        return self._keyed._upstream._env

    def _run(self, contents: StateDescriptor, function: Any) -> ProcessedStream:
        from statekit.runtime.datastream import ProcessedStream

        return ProcessedStream(self._keyed, self._operator(contents, function))


class Windows(_Windowing):
    """Windows without a stream: ``Windows.of(assigner)...reduce(f)`` is the window operator, a
    :class:`~statekit.KeyedProcessFunction` for any engine that runs one (``foreach_batch``)."""

    @staticmethod
    def of(window_assigner: WindowAssigner) -> Windows:
        return Windows(window_assigner)

    def _run(self, contents: StateDescriptor, function: Any) -> WindowOperator:
        return self._operator(contents, function)
