"""Connected streams on the local runner (PyFlink's ``connect``): two inputs keyed by their own
selectors into one keyed operator, a :class:`KeyedCoProcessFunction` (timers for both inputs) or
a :class:`CoMapFunction` / :class:`CoFlatMapFunction`.

The job reads the two collections alternately, one element of each in turn (Flink promises no
order between two inputs; this one is fixed, so a restore resumes at the same place), each
through its own stateless stages and watermark strategy; the operator's watermark is the smaller
of the two inputs' (an input without a strategy does not hold it back).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from statekit.errors import ConfigTypeError, StateError
from statekit.runtime.functions import Function, KeyedProcessFunction, RuntimeContext
from statekit.runtime.watermarks import SourceTime

if TYPE_CHECKING:
    from statekit.runtime.datastream import DataStream, ProcessedStream
    from statekit.serde.types import TypeInformation

class KeyedCoProcessFunction(Function, ABC):
    """Processes the elements of two connected keyed inputs, with the key's state and timers
    (``ctx`` is a :class:`KeyedProcessFunction.Context`)."""

    Context = KeyedProcessFunction.Context
    OnTimerContext = KeyedProcessFunction.OnTimerContext

    @abstractmethod
    def process_element1(self, value: Any, ctx: KeyedProcessFunction.Context
                         ) -> Iterable[Any] | None: ...

    @abstractmethod
    def process_element2(self, value: Any, ctx: KeyedProcessFunction.Context
                         ) -> Iterable[Any] | None: ...

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any] | None:
        """A timer registered by either input fired for the current key."""
        return None


class CoMapFunction(Function, ABC):
    """One output per element of either input."""

    @abstractmethod
    def map1(self, value: Any) -> Any: ...

    @abstractmethod
    def map2(self, value: Any) -> Any: ...


class CoFlatMapFunction(Function, ABC):
    """Any number of outputs per element of either input."""

    @abstractmethod
    def flat_map1(self, value: Any) -> Iterable[Any] | None: ...

    @abstractmethod
    def flat_map2(self, value: Any) -> Iterable[Any] | None: ...


class ConnectedStreams:
    """Two streams connected for one function; ``key_by`` them, then ``process``, ``map`` or
    ``flat_map``."""

    def __init__(self, first: DataStream, second: DataStream,
                 selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None,
                 key_type: TypeInformation | None = None) -> None:
        self._inputs = (first, second)
        self._selectors = selectors
        self._key_type = key_type

    def key_by(self, key_selector1: Callable[[Any], Any], key_selector2: Callable[[Any], Any],
               key_type: TypeInformation | None = None) -> ConnectedStreams:
        """Key each input by its own selector (the keys must be of one kind)."""
        return ConnectedStreams(*self._inputs, (key_selector1, key_selector2), key_type)

    def process(self, func: KeyedCoProcessFunction) -> ProcessedStream:
        if not isinstance(func, KeyedCoProcessFunction):
            raise TypeError("process() on connected streams takes a KeyedCoProcessFunction")
        return self._processed(_CoProcess(func))

    def map(self, func: CoMapFunction) -> ProcessedStream:
        if not isinstance(func, CoMapFunction):
            raise TypeError("map() on connected streams takes a CoMapFunction")
        return self._processed(_CoMap(func))

    def flat_map(self, func: CoFlatMapFunction) -> ProcessedStream:
        if not isinstance(func, CoFlatMapFunction):
            raise TypeError("flat_map() on connected streams takes a CoFlatMapFunction")
        return self._processed(_CoFlatMap(func))

    def _processed(self, adapter: KeyedProcessFunction) -> ProcessedStream:
        from statekit.runtime.datastream import DataStream, KeyedStream, ProcessedStream

        if self._selectors is None:
            raise StateError("the local runner runs connected streams keyed: call "
                             "key_by(key_selector1, key_selector2) first", "connect")
        first, second = self._inputs
        if first._env is not second._env:
            raise ConfigTypeError("connect", "both streams must come from one environment")
        merged = DataStream(first._env, _alternate(first._source, second._source), [],
                            time=lambda clock: _TwoInputTime(first, second, clock))
        sel1, sel2 = self._selectors
        keyed = KeyedStream(merged, lambda pair: sel1(pair[1]) if pair[0] == 0 else sel2(pair[1]),
                            self._key_type)
        return ProcessedStream(keyed, adapter)


def _alternate(first: list[Any], second: list[Any]) -> list[tuple[int, Any]]:
    """Both collections as ``(input, element)``, one of each in turn, the rest of the longer."""
    out: list[tuple[int, Any]] = []
    for i in range(max(len(first), len(second))):
        if i < len(first):
            out.append((0, first[i]))
        if i < len(second):
            out.append((1, second[i]))
    return out


class _TwoInputTime(SourceTime):
    """Each input's stages and watermarks; the operator's watermark is the smaller one of the
    inputs that have a strategy."""

    def __init__(self, first: DataStream, second: DataStream, clock: Callable[[], int]) -> None:
        super().__init__([], clock)
        self.inputs = (SourceTime(first._transforms, clock), SourceTime(second._transforms, clock))

    def restore(self, recorded: Any) -> None:
        super().restore(recorded)
        parts = recorded.get("inputs") if isinstance(recorded, dict) else None
        for time, part in zip(self.inputs, parts if isinstance(parts, list) else [None, None],
                              strict=False):
            time.restore(part)

    def recorded(self) -> dict[str, Any]:
        return {**super().recorded(), "inputs": [t.recorded() for t in self.inputs]}

    def next_watermark(self) -> int | None:
        timed = [t for t in self.inputs if t.generator is not None]
        if not timed:
            return None
        watermark = min(t.generator.current_watermark() for t in timed)  # type: ignore[union-attr]
        return watermark if watermark > self.watermark else None

    def records(self) -> Callable[[Any], list[tuple[Any, int | None]]]:
        each = [t.records() for t in self.inputs]

        def records(pair: Any) -> list[tuple[Any, int | None]]:
            index, element = pair
            return [((index, v), ts) for v, ts in each[index](element)]

        return records


class _CoAdapter(KeyedProcessFunction):
    """Runs a two-input function as the keyed function of ``(input, value)`` elements."""

    def __init__(self, func: Function) -> None:
        self.func = func

    def open(self, runtime_context: RuntimeContext) -> None:
        self.func.open(runtime_context)

    def close(self) -> None:
        self.func.close()

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        raise NotImplementedError


class _CoProcess(_CoAdapter):
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        func: Any = self.func
        index, v = value
        return func.process_element1(v, ctx) if index == 0 else func.process_element2(v, ctx)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        return self.func.on_timer(timestamp, ctx)  # type: ignore[attr-defined]


class _CoMap(_CoAdapter):
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        func: Any = self.func
        index, v = value
        return (func.map1(v) if index == 0 else func.map2(v),)


class _CoFlatMap(_CoAdapter):
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        func: Any = self.func
        index, v = value
        return (func.flat_map1(v) if index == 0 else func.flat_map2(v)) or ()
