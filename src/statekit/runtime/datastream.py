"""The PyFlink-style stream builder of the local runner: ``DataStream`` -> ``KeyedStream`` ->
``ProcessedStream``, stateless transformations before ``key_by`` and map adapters after it.

Building a stream runs nothing; :meth:`ProcessedStream.execute_and_collect` (or ``env.execute()``
for streams with sinks) runs it as a :class:`~statekit.runtime.job.LocalJob`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from statekit.errors import ConfigTypeError
from statekit.runtime.aggregations import Accumulate, FilterAdapter, ReduceAdapter, accumulator
from statekit.runtime.broadcast import BroadcastConnectedStream, BroadcastStream
from statekit.runtime.connected import ConnectedStreams
from statekit.runtime.functions import (
    FilterFunction,
    FlatMapFunction,
    Function,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    RuntimeContext,
)
from statekit.runtime.job import LocalJob
from statekit.runtime.outputs import CollectResult
from statekit.runtime.watermarks import SourceTime, WatermarkStrategy
from statekit.serde.types import TypeInformation
from statekit.state.api import ReduceFunction
from statekit.state.descriptors import MapStateDescriptor

if TYPE_CHECKING:
    from statekit.runtime.windows.assigners import WindowAssigner
    from statekit.runtime.windows.stream import WindowedStream


class DataStream:
    """A stream from a replayable collection, with stateless transformations before ``key_by``."""

    def __init__(self, env: Any, source: Sequence[Any],
                 transforms: list[Callable[[Any], Iterable[Any]] | WatermarkStrategy],
                 time: Callable[[Callable[[], int]], SourceTime] | None = None) -> None:
        self._env = env
        self._source = source
        self._transforms = transforms
        self._time = time

    def source_time(self, clock: Callable[[], int]) -> SourceTime:
        """The event time of this stream's elements (timestamps, watermarks) for one run."""
        return self._time(clock) if self._time is not None else SourceTime(self._transforms, clock)

    def _with(self, transform: Callable[[Any], Iterable[Any]]) -> DataStream:
        return DataStream(self._env, self._source, [*self._transforms, transform])

    def map(self, func: Callable[[Any], Any]) -> DataStream:
        return self._with(lambda v: (func(v),))

    def filter(self, func: Callable[[Any], bool]) -> DataStream:
        return self._with(lambda v: (v,) if func(v) else ())

    def flat_map(self, func: Callable[[Any], Iterable[Any] | None]) -> DataStream:
        return self._with(lambda v: func(v) or ())

    def assign_timestamps_and_watermarks(self, watermark_strategy: WatermarkStrategy
                                         ) -> DataStream:
        """Give each element an event-time timestamp and the stream watermarks (checked here: a
        strategy without a timestamp assigner is refused, the collection has no timestamps)."""
        if not isinstance(watermark_strategy, WatermarkStrategy):
            raise ConfigTypeError("watermark_strategy", "expected a WatermarkStrategy, got "
                                  f"{type(watermark_strategy).__name__}")
        watermark_strategy.create_generator()  # refuses a strategy that cannot assign timestamps
        return DataStream(self._env, self._source, [*self._transforms, watermark_strategy])

    def key_by(self, key_selector: Callable[[Any], Any], key_type: TypeInformation | None = None
               ) -> KeyedStream:
        return KeyedStream(self, key_selector, key_type)

    def connect(self, other: DataStream | KeyedStream | BroadcastStream
                ) -> ConnectedStreams | BroadcastConnectedStream:
        """This stream and ``other`` as the two inputs of one function (``key_by`` them next;
        with a broadcast stream, ``process`` a BroadcastProcessFunction)."""
        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self, other, None, None)
        return ConnectedStreams(self, _stream_of(other))

    def broadcast(self, *broadcast_state_descriptors: MapStateDescriptor) -> BroadcastStream:
        """This stream sent to every subtask of the function it is connected to, which keeps
        the named broadcast states."""
        return BroadcastStream(self, broadcast_state_descriptors)


def _stream_of(stream: DataStream | KeyedStream) -> DataStream:
    if isinstance(stream, KeyedStream):
        return stream._upstream
    if not isinstance(stream, DataStream):
        raise TypeError(f"connect() takes a DataStream, got {type(stream).__name__}")
    return stream


class KeyedStream:
    """A stream partitioned by key; its function gets keyed state for the current key."""

    def __init__(self, upstream: DataStream, key_selector: Callable[[Any], Any],
                 key_type: TypeInformation | None) -> None:
        self._upstream = upstream
        self._selector = key_selector
        self._key_type = key_type

    def connect(self, other: DataStream | KeyedStream | BroadcastStream
                ) -> ConnectedStreams | BroadcastConnectedStream:
        """This keyed stream and ``other`` connected; both keyed by their own selectors (this
        one's, and ``other``'s when keyed); with a broadcast stream, ``process`` a
        KeyedBroadcastProcessFunction."""
        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self._upstream, other, self._selector, self._key_type)
        sel2 = other._selector if isinstance(other, KeyedStream) else None
        connected = ConnectedStreams(self._upstream, _stream_of(other))
        return connected if sel2 is None else connected.key_by(self._selector, sel2,
                                                               self._key_type)

    def process(self, func: KeyedProcessFunction, output_type: TypeInformation | None = None
                ) -> ProcessedStream:
        if not isinstance(func, KeyedProcessFunction):
            raise TypeError("process() takes a KeyedProcessFunction")
        return ProcessedStream(self, func)

    def map(self, func: MapFunction | Callable[[Any], Any]) -> ProcessedStream:
        return ProcessedStream(self, _MapAdapter(func))

    def window(self, window_assigner: WindowAssigner) -> WindowedStream:
        """The stream cut into the windows of ``window_assigner`` (a
        :class:`~statekit.runtime.windows.WindowedStream`; see ``docs/windows.md``)."""
        from statekit.runtime.windows.stream import WindowedStream

        return WindowedStream(self, window_assigner)

    def count_window(self, size: int, slide: int = 0) -> WindowedStream:
        """Windows of ``size`` elements of a key, tumbling (``slide`` 0) or sliding."""
        from statekit.runtime.windows.counting import (
            CountSlidingWindowAssigner,
            CountTumblingWindowAssigner,
        )

        return self.window(CountTumblingWindowAssigner(size) if slide == 0
                           else CountSlidingWindowAssigner(size, slide))

    def flat_map(self, func: FlatMapFunction | Callable[[Any], Iterable[Any]]) -> ProcessedStream:
        return ProcessedStream(self, _FlatMapAdapter(func))

    def reduce(self, func: ReduceFunction | Callable[[Any, Any], Any]) -> ProcessedStream:
        """The key's running reduction, emitted after every element (its value state is
        ``_reduce_state``)."""
        return ProcessedStream(self, ReduceAdapter(func))

    def filter(self, func: FilterFunction | Callable[[Any], bool]) -> ProcessedStream:
        """The elements ``func`` keeps (a rich FilterFunction may use keyed state)."""
        return ProcessedStream(self, FilterAdapter(func))

    def sum(self, position_to_sum: int | str = 0) -> ProcessedStream:
        """The rolling sum of a field (an index, a field name, or 0 for a basic value)."""
        return self.reduce(accumulator(position_to_sum, Accumulate.SUM))

    def min(self, position_to_min: int | str = 0) -> ProcessedStream:
        """The key's first element with the field replaced by its rolling minimum."""
        return self.reduce(accumulator(position_to_min, Accumulate.MIN))

    def max(self, position_to_max: int | str = 0) -> ProcessedStream:
        """The key's first element with the field replaced by its rolling maximum."""
        return self.reduce(accumulator(position_to_max, Accumulate.MAX))

    def min_by(self, position_to_min_by: int | str = 0) -> ProcessedStream:
        """The element with the smallest field so far (the first one on ties)."""
        return self.reduce(accumulator(position_to_min_by, Accumulate.MIN_BY))

    def max_by(self, position_to_max_by: int | str = 0) -> ProcessedStream:
        """The element with the largest field so far (the first one on ties)."""
        return self.reduce(accumulator(position_to_max_by, Accumulate.MAX_BY))


class ProcessedStream:
    """The output of the keyed function: collect it, or send it to a sink and ``env.execute()``."""

    def __init__(self, keyed: KeyedStream, func: KeyedProcessFunction) -> None:
        self._keyed = keyed
        self._func = func
        self._env = keyed._upstream._env
        self._side_sinks: dict[str, Callable[[Any], None]] = {}

    def execute_and_collect(self, job_execution_name: str | None = None, limit: int | None = None,
                            *, savepoint_dir: str | None = None, drain: bool = False
                            ) -> CollectResult:
        """Run the job and return its (exactly-once) outputs.

        ``limit`` stops (cancels) the job once at least that many outputs are committed (all
        committed outputs are returned, since the checkpoints hold their state);
        ``savepoint_dir`` stops the job with a savepoint when it reaches the end of its input.
        The end of bounded input moves the watermark to the maximum (every event-time timer
        fires); a stop with a savepoint does not, unless ``drain`` (Flink's ``stop --drain``):
        pending timers stay in the savepoint and fire after the resume.
        """
        job = LocalJob(self, job_execution_name, limit, savepoint_dir, sink=None, drain=drain)
        return job.run()

    def add_sink(self, sink: Callable[[Any], None]) -> ProcessedStream:
        """Deliver committed outputs to ``sink`` when ``env.execute()`` runs."""
        self._env.register_sink(self, sink)
        return self

    def get_side_output(self, output_tag: OutputTag) -> SideOutputStream:
        """The values the function sends to ``output_tag`` (``yield output_tag, value``)."""
        if not isinstance(output_tag, OutputTag):
            raise TypeError(f"get_side_output takes an OutputTag, got {type(output_tag).__name__}")
        return SideOutputStream(self, output_tag)


class SideOutputStream:
    """A side output of a keyed function: collected with the same job as the main output (one
    run: :meth:`execute_and_collect` runs it and returns the side output's values), or sent to
    a sink when ``env.execute()`` runs the main stream."""

    def __init__(self, main: ProcessedStream, tag: OutputTag) -> None:
        self._main = main
        self._tag = tag

    def execute_and_collect(self, job_execution_name: str | None = None, **kwargs: Any
                            ) -> list[Any]:
        """Run the job; the committed values of this side output."""
        return self._main.execute_and_collect(job_execution_name, **kwargs).get_side_output(
            self._tag)

    def add_sink(self, sink: Callable[[Any], None]) -> SideOutputStream:
        """Deliver this side output's committed values to ``sink`` when ``env.execute()`` runs
        the main stream's job (registered with a sink of its own, or run for this one)."""
        self._main._side_sinks[self._tag.tag_id] = sink
        self._main._env.register_side_output(self._main)
        return self


class _MapAdapter(KeyedProcessFunction):
    """A map (or flat map) function or callable run as the keyed function; a rich function's
    ``open`` and ``close`` run as the keyed function's do."""

    def __init__(self, func: MapFunction | FlatMapFunction | Callable[[Any], Any]) -> None:
        self.func = func

    def open(self, runtime_context: RuntimeContext) -> None:
        if isinstance(self.func, Function):
            self.func.open(runtime_context)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        return (self.func.map(value) if isinstance(self.func, MapFunction) else self.func(value),)  # type: ignore[operator]

    def close(self) -> None:
        if isinstance(self.func, Function):
            self.func.close()


class _FlatMapAdapter(_MapAdapter):
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        out = (self.func.flat_map(value) if isinstance(self.func, FlatMapFunction)  # type: ignore[union-attr]
               else self.func(value))  # type: ignore[operator]
        return out or ()
