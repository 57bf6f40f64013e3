"""The broadcast state pattern on the local runner (PyFlink's ``DataStream.broadcast``):
``stream.connect(broadcast_stream).process(BroadcastProcessFunction)`` and
``keyed_stream.connect(broadcast_stream).process(KeyedBroadcastProcessFunction)``.

Every element of the broadcast stream goes to every subtask, whose
``process_broadcast_element`` may change its broadcast state (a map, the same in every subtask
as long as the function treats every subtask alike); the other input's elements go to one
subtask each (keyed: by key; non-keyed: round-robin) and see the broadcast
state read-only.  The two inputs are read alternately, as connected streams are
(:mod:`statekit.runtime.connected`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from statekit.backends.operator import BroadcastState, OperatorStateBackend, ReadOnlyBroadcastState
from statekit.errors import ConfigTypeError, StateError
from statekit.runtime.connected import _alternate, _TwoInputTime
from statekit.runtime.functions import Function, KeyedProcessFunction, RuntimeContext
from statekit.runtime.timers import TimeDomain, TimerService
from statekit.state.api import State
from statekit.state.descriptors import MapStateDescriptor

if TYPE_CHECKING:
    from statekit.runtime.datastream import DataStream, ProcessedStream
    from statekit.serde.types import TypeInformation


class Route(enum.Enum):
    """Where an element of a broadcast-connected job goes (its selector's answer)."""

    BROADCAST = "every subtask"
    UNKEYED = "one subtask, round-robin"


class Router:
    """Delivers the elements that have no key, for one run of a job: broadcast ones to every
    task, non-keyed ones round-robin (Flink's rebalance; after a restore the turn starts again
    at subtask 0, and a replayed element may go to another subtask than before the failure)."""

    def __init__(self) -> None:
        self.sent = 0

    def deliver(self, kind: Route, tasks: list[Any], value: Any, timestamp: int | None,
                out: list[Any]) -> None:
        if kind is Route.BROADCAST:
            for task in tasks:
                produced = task.op.process_broadcast(value, timestamp)
                if produced is not None:
                    out.extend(produced)
            return
        task = tasks[self.sent % len(tasks)]
        self.sent += 1
        produced = task.op.process_unkeyed(value, timestamp)
        if produced is not None:
            out.extend(produced)


# --- user functions (PyFlink's names) -----------------------------------------------------------


class _BaseContext:
    """Time and the element's timestamp (PyFlink's ``BaseBroadcastProcessFunction.BaseContext``)."""

    def __init__(self, adapter: _BroadcastAdapter) -> None:
        self._adapter = adapter
        self._ctx: KeyedProcessFunction.Context | None = None

    def timestamp(self) -> int | None:
        return self._ctx.timestamp() if self._ctx is not None else None

    def current_processing_time(self) -> int:
        return self._ctx.timer_service().current_processing_time()  # type: ignore[union-attr]

    def current_watermark(self) -> int:
        return self._ctx.timer_service().current_watermark()  # type: ignore[union-attr]


class BaseBroadcastProcessFunction(Function, ABC):
    """What both broadcast process functions share: their contexts."""

    class Context(_BaseContext):
        """The broadcast side's context: read-write access to the broadcast state."""

        def get_broadcast_state(self, state_descriptor: MapStateDescriptor) -> BroadcastState:
            return self._adapter.broadcast_state(state_descriptor)

    class ReadOnlyContext(_BaseContext):
        """The other side's context: a read-only view of the broadcast state (writes raise
        :class:`~statekit.errors.ReadOnlyStateError`)."""

        def get_broadcast_state(self, state_descriptor: MapStateDescriptor
                                ) -> ReadOnlyBroadcastState:
            return self._adapter.broadcast_state(state_descriptor).read_only()


class BroadcastProcessFunction(BaseBroadcastProcessFunction):
    """A non-keyed stream connected with a broadcast stream."""

    Context = BaseBroadcastProcessFunction.Context
    ReadOnlyContext = BaseBroadcastProcessFunction.ReadOnlyContext

    @abstractmethod
    def process_element(self, value: Any, ctx: BaseBroadcastProcessFunction.ReadOnlyContext
                        ) -> Iterable[Any] | None: ...

    @abstractmethod
    def process_broadcast_element(self, value: Any, ctx: BaseBroadcastProcessFunction.Context
                                  ) -> Iterable[Any] | None: ...


class KeyedBroadcastProcessFunction(BaseBroadcastProcessFunction):
    """A keyed stream connected with a broadcast stream: keyed state and timers on the keyed
    side, ``apply_to_keyed_state`` on the broadcast side."""

    class Context(BaseBroadcastProcessFunction.Context):
        def apply_to_keyed_state(self, state_descriptor: Any,
                                 function: Callable[[Any, State], None]) -> None:
            """Call ``function(key, state)`` for every key of this subtask holding the state
            (Flink's ``applyToKeyedState``; PyFlink lacks it)."""
            self._adapter.backend().apply_to_all_keys(None, state_descriptor, function)

    class ReadOnlyContext(BaseBroadcastProcessFunction.ReadOnlyContext):
        def timer_service(self) -> TimerService:
            return self._ctx.timer_service()  # type: ignore[union-attr]

        def get_current_key(self) -> Any:
            return self._ctx.get_current_key()  # type: ignore[union-attr]

    class OnTimerContext(ReadOnlyContext):
        def time_domain(self) -> TimeDomain:
            return self._ctx.time_domain()  # type: ignore[union-attr]

    @abstractmethod
    def process_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext
                        ) -> Iterable[Any] | None: ...

    @abstractmethod
    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.Context
                                  ) -> Iterable[Any] | None: ...

    def on_timer(self, timestamp: int, ctx: KeyedBroadcastProcessFunction.OnTimerContext
                 ) -> Iterable[Any] | None:
        """A timer registered on the keyed side fired for the current key."""
        return None


# --- streams ------------------------------------------------------------------------------------


class BroadcastStream:
    """A stream whose elements go to every subtask, with the broadcast states they maintain."""

    def __init__(self, stream: DataStream, descriptors: tuple[MapStateDescriptor, ...]) -> None:
        if not descriptors:
            raise ConfigTypeError("broadcast", "name at least one MapStateDescriptor")
        for descriptor in descriptors:
            if not isinstance(descriptor, MapStateDescriptor):
                raise ConfigTypeError("broadcast", "broadcast state descriptors are "
                                      f"MapStateDescriptors, not {type(descriptor).__name__}")
        self._stream = stream
        self._descriptors = descriptors


class BroadcastConnectedStream:
    """A (keyed or non-keyed) stream connected with a broadcast stream; ``process`` it."""

    def __init__(self, stream: DataStream, broadcast: BroadcastStream,
                 selector: Callable[[Any], Any] | None,
                 key_type: TypeInformation | None) -> None:
        if stream._env is not broadcast._stream._env:
            raise ConfigTypeError("connect", "both streams must come from one environment")
        self._stream = stream
        self._broadcast = broadcast
        self._selector = selector
        self._key_type = key_type

    def process(self, func: BroadcastProcessFunction | KeyedBroadcastProcessFunction,
                output_type: TypeInformation | None = None) -> ProcessedStream:
        from statekit.runtime.datastream import DataStream, KeyedStream, ProcessedStream

        keyed = self._selector is not None
        wanted = KeyedBroadcastProcessFunction if keyed else BroadcastProcessFunction
        if not isinstance(func, wanted):
            raise TypeError(f"process() on a {'keyed' if keyed else 'non-keyed'} stream "
                            f"connected with a broadcast stream takes a {wanted.__name__}")
        first, second = self._stream, self._broadcast._stream
        merged = DataStream(first._env, _alternate(first._source, second._source), [],
                            time=lambda clock: _TwoInputTime(first, second, clock))
        selector = self._selector
        if selector is None:
            def pick(pair: Any) -> Any:
                return Route.UNKEYED if pair[0] == 0 else Route.BROADCAST
        else:
            def pick(pair: Any) -> Any:
                return selector(pair[1]) if pair[0] == 0 else Route.BROADCAST
        adapter = _BroadcastAdapter(func, self._broadcast._descriptors, keyed)
        return ProcessedStream(KeyedStream(merged, pick, self._key_type), adapter)


class _BroadcastAdapter(KeyedProcessFunction):
    """Runs a broadcast process function as the operator's function of ``(input, value)``."""

    #: the local runner refuses BATCH execution for it
    broadcast = True

    def __init__(self, func: Function, descriptors: tuple[MapStateDescriptor, ...],
                 keyed: bool) -> None:
        self.func = func
        self.descriptors = descriptors
        self.keyed = keyed
        self._store: OperatorStateBackend | None = None
        self._backend: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self._store = runtime_context.operator_state
        self._backend = runtime_context._backend
        for descriptor in self.descriptors:  # registered (and restored) before any element
            self._store.get_broadcast_state(descriptor)
        kind = KeyedBroadcastProcessFunction if self.keyed else BroadcastProcessFunction
        self._read_only = kind.ReadOnlyContext(self)
        self._writable = kind.Context(self)
        self._on_timer = KeyedBroadcastProcessFunction.OnTimerContext(self)
        self.func.open(runtime_context)

    def close(self) -> None:
        self.func.close()

    def backend(self) -> Any:
        return self._backend

    def broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        """The broadcast state of a descriptor given to ``broadcast()``."""
        name = getattr(descriptor, "name", None)
        if not any(d.name == name for d in self.descriptors):
            raise StateError("no such broadcast state: name its MapStateDescriptor in "
                             "DataStream.broadcast(...)", name)
        return self._store.get_broadcast_state(descriptor)  # type: ignore[union-attr]

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        context = self._read_only
        context._ctx = ctx
        return self.func.process_element(value[1], context)  # type: ignore[attr-defined]

    def process_broadcast(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        context = self._writable
        context._ctx = ctx
        return self.func.process_broadcast_element(value[1], context)  # type: ignore[attr-defined]

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        context = self._on_timer
        context._ctx = ctx
        return self.func.on_timer(timestamp, context)  # type: ignore[attr-defined]
