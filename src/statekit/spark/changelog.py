"""Per-key change logs: record what a call did to a key's state, and replay it elsewhere.

The ``applyInPandasWithState`` adapter carries each key's recent changes in Spark's
``GroupState`` (committed atomically with the micro-batch).  Changes are recorded below TTL and
the reducing/aggregating layers, as serialized operations on value, list and map states, so a
replay reproduces exactly the stored values, and a change costs its size, not the state's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from statekit.backends.base import StateMeta
from statekit.backends.timers import (
    TIMER_STATE_PREFIX,
    TimerQueue,
    is_timer_state,
    timer_state_name,
)
from statekit.errors import CorruptCheckpointError, StateError
from statekit.state.api import ListState, MapState, State, ValueState

APPLIED_NAME = "__statekit_applied"

# operation codes
V_SET, V_CLEAR, L_ADD, L_ADD_ALL, L_SET, L_CLEAR, M_PUT, M_REMOVE, M_CLEAR, T_ADD, T_REMOVE = range(11)


class ChangeRecorder:
    """Collects the operations of the current call, per state, while recording is on."""

    def __init__(self) -> None:
        self.ops: list[list[Any]] = []
        self.active = False
        self.raw: dict[str, tuple[StateMeta, State]] = {}
        self.queues: dict[str, TimerQueue] = {}  # timer queues by state name
        #: creates a timer queue in the backend (which hands it to :meth:`intercept_timers`)
        self.create_queue: Callable[[str], Any] | None = None

    def intercept(self, meta: StateMeta, raw: State) -> State:
        """The backend's state interceptor: keep the raw state, hand out a recording one."""
        self.raw[meta.name] = (meta, raw)
        if meta.name == APPLIED_NAME:  # bookkeeping of replay itself: never logged
            return raw
        wrapper = {"value": _RecValue, "list": _RecList, "map": _RecMap}[meta.kind]
        return wrapper(raw, meta, self)  # type: ignore[abstract]

    def intercept_timers(self, queue: TimerQueue) -> TimerQueue:
        """The backend's timer interceptor: keep the raw queue, hand out a recording one."""
        name = timer_state_name(queue.name)
        self.queues[name] = queue
        return _RecTimers(queue, name, self)

    def start(self) -> None:
        self.ops = []
        self.active = True

    def stop(self) -> list[list[Any]]:
        self.active = False
        ops, self.ops = self.ops, []
        return ops

    def record(self, *op: Any) -> None:
        if self.active:
            self.ops.append(list(op))

    def replay(self, ops: Iterable[list[Any]], key: Any = None) -> None:
        """Apply recorded operations to the current key's raw states and timers (``key``; not
        recorded again)."""
        for op in ops:
            name, code, *args = op
            if code in (T_ADD, T_REMOVE):
                self._replay_timer(name, code, args, key)
                continue
            entry = self.raw.get(name)
            if entry is None:
                raise StateError(
                    "the key's change log holds changes of this state, but the function has not "
                    "registered it: register every state in open() (the applyInPandasWithState "
                    "adapter replays changes before the function runs)", name)
            meta, raw = entry
            _apply(meta, raw, code, args)

    def _replay_timer(self, name: str, code: int, args: list[Any], key: Any) -> None:
        queue = self.queues.get(name)
        if queue is None and self.create_queue is not None and is_timer_state(name):
            self.create_queue(name[len(TIMER_STATE_PREFIX):])
            queue = self.queues.get(name)
        if queue is None:
            raise CorruptCheckpointError(f"the key's change log holds timers of '{name}', which "
                                         "no timer queue of this backend takes")
        if len(args) != 1 or type(args[0]) is not int:
            raise CorruptCheckpointError(f"malformed timer change {args!r} of '{name}'")
        (queue.add if code == T_ADD else queue.remove)(key, args[0])

    def timer_queue(self, name: str) -> TimerQueue | None:
        """The raw timer queue of state ``name`` (None until the backend created it)."""
        return self.queues.get(name)

    def dump(self, key: Any = None) -> list[list[Any]]:
        """Operations that rebuild the current key's (``key``'s) states and timers from empty
        (bookkeeping aside): a key's whole state, to be replayed into another backend."""
        ops: list[list[Any]] = [[name, T_ADD, ts] for name, queue in self.queues.items()
                                for ts in queue.timers_of(key)]
        for name, (meta, raw) in self.raw.items():
            if name == APPLIED_NAME:
                continue
            stored: Any = meta.stored_serializer
            if meta.kind == "value":
                value = raw.value()  # type: ignore[attr-defined]
                if value is not None:
                    ops.append([name, V_SET, stored.serialize(value)])
            elif meta.kind == "list":
                elements = raw.get()  # type: ignore[attr-defined]
                if elements:
                    ops.append([name, L_SET, [stored.element.serialize(e) for e in elements]])
            else:
                ops.extend([name, M_PUT, stored.key.serialize(k),
                            None if v is None else stored.value.serialize(v)]
                           for k, v in raw.items())  # type: ignore[attr-defined]
        return ops

    def applied(self) -> Any:
        """The current key's applied marker, as stored."""
        return self.raw[APPLIED_NAME][1].value()  # type: ignore[attr-defined]

    def all_empty(self, now: int, key: Any = None) -> bool:
        """Whether the current key (``key``) holds nothing live (TTL-expired entries count as
        gone), timers included, so its carried state can be removed."""
        if any(queue.timers_of(key) for queue in self.queues.values()):
            return False
        for name, (meta, raw) in self.raw.items():
            if name == APPLIED_NAME:
                continue
            if meta.ttl is None and meta.kind == "map":  # no entry to read: O(1), not O(entries)
                if not raw.is_empty():  # type: ignore[attr-defined]
                    return False
                continue
            live = (lambda stamped: True) if meta.ttl is None else (
                lambda stamped, ttl=meta.ttl: not ttl.expired(stamped, now))
            if meta.kind == "value":
                value = raw.value()  # type: ignore[attr-defined]
                if value is not None and live(value):
                    return False
            elif meta.kind == "list":
                if any(live(e) for e in raw.get()):  # type: ignore[attr-defined]
                    return False
            elif any(live(v) for _, v in raw.items()):  # type: ignore[attr-defined]
                return False
        return True

    def ttl_millis(self) -> int | None:
        """The longest TTL of the registered states, or None when no state has TTL."""
        ttls = [meta.ttl.ttl for meta, _ in self.raw.values() if meta.ttl is not None]
        return max(ttls) if ttls else None

    def clear_all(self, key: Any = None) -> None:
        """Clear every state of the current key (``key``), timers included."""
        for name, (_meta, raw) in self.raw.items():
            if name != APPLIED_NAME:
                raw.clear()
        for queue in self.queues.values():
            for timestamp in queue.timers_of(key):
                queue.remove(key, timestamp)


def _apply(meta: StateMeta, raw: Any, code: int, args: list[Any]) -> None:
    stored = meta.stored_serializer
    if code == V_SET:
        raw.update(stored.deserialize(args[0]))
    elif code in (V_CLEAR, L_CLEAR, M_CLEAR):
        raw.clear()
    elif code == L_ADD:
        raw.add(stored.element.deserialize(args[0]))  # type: ignore[attr-defined]
    elif code == L_ADD_ALL:
        raw.add_all([stored.element.deserialize(b) for b in args[0]])  # type: ignore[attr-defined]
    elif code == L_SET:
        raw.update([stored.element.deserialize(b) for b in args[0]])  # type: ignore[attr-defined]
    elif code == M_PUT:
        value = None if args[1] is None else stored.value.deserialize(args[1])  # type: ignore[attr-defined]
        raw.put(stored.key.deserialize(args[0]), value)  # type: ignore[attr-defined]
    elif code == M_REMOVE:
        raw.remove(stored.key.deserialize(args[0]))  # type: ignore[attr-defined]
    else:
        raise CorruptCheckpointError(f"unknown change-log operation {code}")


class _RecTimers(TimerQueue):
    """A timer queue recording the current key's additions and removals."""

    def __init__(self, raw: TimerQueue, state_name: str, rec: ChangeRecorder) -> None:
        super().__init__(raw.name)
        self._raw, self._name, self._rec = raw, state_name, rec

    def add(self, key: Any, timestamp: int) -> bool:
        added = self._raw.add(key, timestamp)
        if added:
            self._rec.record(self._name, T_ADD, timestamp)
        return added

    def remove(self, key: Any, timestamp: int) -> bool:
        removed = self._raw.remove(key, timestamp)
        if removed:
            self._rec.record(self._name, T_REMOVE, timestamp)
        return removed

    def peek(self) -> int | None:
        return self._raw.peek()

    def poll(self, limit: int) -> tuple[Any, int] | None:
        raise StateError("timers of the applyInPandasWithState adapter fire per key, in the "
                         "key's own call", self._name)

    def timers_of(self, key: Any) -> list[int]:
        return self._raw.timers_of(key)

    def __len__(self) -> int:
        return len(self._raw)


class _RecValue(ValueState):
    def __init__(self, raw: ValueState, meta: StateMeta, rec: ChangeRecorder) -> None:
        self._raw, self._name, self._rec = raw, meta.name, rec
        self._ser = meta.stored_serializer

    def value(self) -> Any:
        return self._raw.value()

    def update(self, value: Any) -> None:
        self._raw.update(value)
        if value is None:
            self._rec.record(self._name, V_CLEAR)
        else:
            self._rec.record(self._name, V_SET, self._ser.serialize(value))

    def clear(self) -> None:
        self._raw.clear()
        self._rec.record(self._name, V_CLEAR)


class _RecList(ListState):
    def __init__(self, raw: ListState, meta: StateMeta, rec: ChangeRecorder) -> None:
        self._raw, self._name, self._rec = raw, meta.name, rec
        self._ser = meta.stored_serializer.element  # type: ignore[attr-defined]

    def get(self) -> list[Any]:
        return self._raw.get()

    def add(self, value: Any) -> None:
        self._raw.add(value)
        self._rec.record(self._name, L_ADD, self._ser.serialize(value))

    def add_all(self, values: Iterable[Any]) -> None:
        values = list(values) if values is not None else values
        self._raw.add_all(values)  # refuses None, as every list state does
        self._rec.record(self._name, L_ADD_ALL, [self._ser.serialize(v) for v in values])

    def update(self, values: Iterable[Any]) -> None:
        values = list(values) if values is not None else values
        self._raw.update(values)
        self._rec.record(self._name, L_SET, [self._ser.serialize(v) for v in values])

    def clear(self) -> None:
        self._raw.clear()
        self._rec.record(self._name, L_CLEAR)


class _RecMap(MapState):
    def __init__(self, raw: MapState, meta: StateMeta, rec: ChangeRecorder) -> None:
        self._raw, self._name, self._rec = raw, meta.name, rec
        self._key = meta.stored_serializer.key  # type: ignore[attr-defined]
        self._value = meta.stored_serializer.value  # type: ignore[attr-defined]

    def get(self, key: Any) -> Any:
        return self._raw.get(key)

    def put(self, key: Any, value: Any) -> None:
        self._raw.put(key, value)
        self._rec.record(self._name, M_PUT, self._key.serialize(key),
                         None if value is None else self._value.serialize(value))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        for k, v in dict_value.items():
            self.put(k, v)

    def remove(self, key: Any) -> None:
        self._raw.remove(key)
        self._rec.record(self._name, M_REMOVE, self._key.serialize(key))

    def contains(self, key: Any) -> bool:
        return self._raw.contains(key)

    def items(self) -> Iterable[tuple[Any, Any]]:
        return self._raw.items()

    def keys(self) -> Iterable[Any]:
        return self._raw.keys()

    def values(self) -> Iterable[Any]:
        return self._raw.values()

    def is_empty(self) -> bool:
        return self._raw.is_empty()

    def clear(self) -> None:
        self._raw.clear()
        self._rec.record(self._name, M_CLEAR)
