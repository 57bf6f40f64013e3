"""Timer queues: the keyed backends' priority queues of timers (Flink's ``PriorityQueueSetFactory``).

A :class:`TimerQueue` holds a set of timers ``(key, timestamp)`` of one partition and one time
domain: adding a timer twice keeps one, removing a missing one does nothing, and the earliest
timer is found in O(1) and removed in O(log n).  Timers are keyed state: a snapshot writes each
queue as one state entry of kind ``"timers"`` named ``_timer_state/<queue>`` whose value per key is
the sorted list of its timestamps, so they are restored, rescaled by key group, carried between
backends and read by the inspection tools like every other state.

The heap queue (:class:`HeapTimerQueue`) keeps the per-key lists in a
:class:`~statekit.backends.heap.table.HeapTable` (so the heap backend's copy-on-write snapshots
capture timers in constant time) and orders them with one sorted list over the partition.
"""

from __future__ import annotations

import itertools
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from sortedcontainers import SortedList

from statekit.errors import CorruptCheckpointError, SerializationError, StateTypeError
from statekit.serde.msgpack import unpackb
from statekit.serde.serializers import TypeSerializer

if TYPE_CHECKING:
    from statekit.backends.base import StateMeta
    from statekit.backends.heap.table import HeapTable

#: state entries of timer queues are named ``_timer_state/<queue name>`` (Flink's names)
TIMER_STATE_PREFIX = "_timer_state/"
EVENT_TIMERS = "event_user-timers"
PROCESSING_TIMERS = "processing_user-timers"
#: the entry kind of timer queues in snapshots
TIMERS_KIND = "timers"
TIMERS_LAYOUT: list[Any] = [TIMERS_KIND, "LONG", None, False]
MIN_TIMESTAMP = -(1 << 63)
MAX_TIMESTAMP = (1 << 63) - 1


def timer_state_name(queue: str) -> str:
    """The state entry name of timer queue ``queue``."""
    return TIMER_STATE_PREFIX + queue


def is_timer_state(name: str) -> bool:
    return name.startswith(TIMER_STATE_PREFIX)


def check_timestamp(timestamp: Any) -> int:
    """``timestamp`` as an int in the signed 64-bit range (a StateTypeError otherwise)."""
    if type(timestamp) is not int:
        if isinstance(timestamp, bool) or not hasattr(timestamp, "__index__"):
            raise StateTypeError(f"a timer's timestamp must be an int (milliseconds), "
                                 f"got {type(timestamp).__name__}")
        timestamp = timestamp.__index__()  # numpy integers
    if not MIN_TIMESTAMP <= timestamp <= MAX_TIMESTAMP:
        raise StateTypeError(f"timer timestamp {timestamp} is outside the signed 64-bit range")
    return timestamp


def _well_formed(values: list[Any]) -> bool:
    """Whether every value is a non-empty, strictly rising list of int timestamps in range: a
    pass of C-level calls over all of them (a restore checks millions of timers)."""
    if not values:
        return True
    if set(map(type, values)) != {list}:
        return False
    lengths = list(map(len, values))
    if min(lengths) < 1:
        return False
    flat = list(itertools.chain.from_iterable(values))
    if set(map(type, flat)) != {int} or not MIN_TIMESTAMP <= min(flat) <= max(flat) <= MAX_TIMESTAMP:
        return False
    return lists_rising(values, strict=True, lengths=lengths)


def lists_rising(values: list[list[Any]], strict: bool, lengths: list[int] | None = None) -> bool:
    """Whether every list is in ascending order (``strict``: no two items equal); single-item
    lists, the common case of timers, cost one C-level pass over all of them."""
    compare = operator.lt if strict else operator.le
    several = itertools.compress(values, map((1).__lt__, lengths or map(len, values)))
    return all(all(map(compare, s, itertools.islice(s, 1, None))) for s in several)


def check_restored_timers(name: str, data: dict[Any, Any]) -> None:
    """CorruptCheckpointError unless every restored value is a sorted list of distinct int
    timestamps (what a timer queue wrote)."""
    if _well_formed(list(data.values())):
        return
    for key, stamps in data.items():  # find the first bad one, to name it
        if (type(stamps) is not list or not stamps or not all(type(t) is int for t in stamps)
                or any(a >= b for a, b in itertools.pairwise(stamps))
                or not MIN_TIMESTAMP <= stamps[0] <= stamps[-1] <= MAX_TIMESTAMP):
            raise CorruptCheckpointError(
                f"state '{name}': key {key!r} holds {stamps!r}, not a sorted list of distinct "
                "int timestamps")


def timer_stamps(name: str, serialized: bytes) -> list[int]:
    """One key's serialized timestamps from a snapshot, checked (CorruptCheckpointError)."""
    try:
        stamps = unpackb(serialized)
    except (SerializationError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError(f"state '{name}': malformed timers ({exc})") from None
    check_restored_timers(name, {"?": stamps})
    return stamps  # type: ignore[no-any-return]


class TimestampsSerializer(TypeSerializer):
    """One key's timers in a queue: a sorted list of int timestamps, never changed in place (the
    queue replaces it), so snapshots may share it as an immutable value."""

    identity = True
    immutable = True

    def check(self, value: Any) -> str | None:
        if not isinstance(value, list) or not all(type(t) is int for t in value):
            return "expected a list of int timestamps"
        return None

    def config(self) -> Any:
        return "timers"


class TimerQueue(ABC):
    """The timers of one time domain in one partition: a set ordered by timestamp."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def add(self, key: Any, timestamp: int) -> bool:
        """Register a timer; False when it was registered already (one timer per key and time)."""

    @abstractmethod
    def remove(self, key: Any, timestamp: int) -> bool:
        """Delete a timer; False when there was none."""

    @abstractmethod
    def peek(self) -> int | None:
        """The earliest timestamp, or None when the queue is empty (O(1) amortized)."""

    @abstractmethod
    def poll(self, limit: int) -> tuple[Any, int] | None:
        """Remove and return the earliest timer ``(key, timestamp)`` if its time is at most
        ``limit``; None otherwise."""

    @abstractmethod
    def timers_of(self, key: Any) -> list[int]:
        """The timestamps of ``key``'s timers, earliest first."""

    @abstractmethod
    def __len__(self) -> int:
        """How many timers the queue holds."""

    def drain(self, limit: int) -> Iterator[tuple[Any, int]]:
        """Remove and yield every timer due at ``limit``, in timestamp order; timers added while
        this runs that are due too are yielded as well."""
        while (timer := self.poll(limit)) is not None:
            yield timer


class HeapTimerQueue(TimerQueue):
    """Timers in a heap table (key -> sorted timestamps), ordered by two runs merged at the front.

    * The *settled run*: every timer the table held at the last rebuild (a restore, or when
      stale entries outnumbered live ones), as two NumPy arrays — timestamps sorted, and the
      index of each one's key in a list of keys — read through a cursor.  Rebuilding it is a
      sort of int64s and no Python object per timer: at 10^7 timers, building a tuple per timer
      in timestamp order cost 9 of the 12.5 s a restore took before its queue was usable
      (touching the keys in timestamp order is a cache miss per timer).
    * *Added since*: a :class:`~sortedcontainers.SortedList` of ``(timestamp, sequence, key)``;
      due timers are taken from the front of its first block, so firing touches memory in
      sequence however many timers are pending.

    Removing a timer leaves its entry behind; an entry is live iff it is its key's earliest
    timestamp when it reaches the front, and skipped otherwise.
    """

    def __init__(self, name: str, table: HeapTable) -> None:
        super().__init__(name)
        self.table = table
        self._seq = itertools.count()
        self._order: SortedList = SortedList()
        self._count = 0
        self._rebuild()

    def _rebuild(self) -> None:
        keys: list[Any] = []
        stamps: list[list[int]] = []
        for source in (self.table.data, self.table.staged or {}):
            # a None value is a key removed during a snapshot
            if all(source.values()):
                keys.extend(source)
                stamps.extend(source.values())
            else:
                live = [k for k, v in source.items() if v]
                keys.extend(live)
                stamps.extend(map(source.__getitem__, live))
        flat = np.fromiter(itertools.chain.from_iterable(stamps), dtype=np.int64)
        order = np.argsort(flat, kind="stable")
        if len(flat) == len(keys):  # one timer per key, the common case
            owner = order
        else:
            lengths = np.fromiter(map(len, stamps), dtype=np.int64, count=len(stamps))
            owner = np.repeat(np.arange(len(keys), dtype=np.int64), lengths)[order]
        self._run_stamps, self._run_owner, self._run_keys = flat[order], owner, keys
        self._cursor = 0
        self._order = SortedList()
        self._count = len(flat)

    def _get(self, key: Any) -> list[int] | None:
        table = self.table
        stamps = table.data.get(key)
        if stamps is None and table.watch:
            return table.get(key)  # type: ignore[no-any-return]
        return stamps

    def _set(self, key: Any, stamps: list[int]) -> None:
        if stamps:
            self.table.put(key, stamps)
        else:
            self.table.remove(key)

    def add(self, key: Any, timestamp: int) -> bool:
        stamps = self._get(key)
        if stamps is None:
            self._set(key, [timestamp])
        elif timestamp in stamps:
            return False
        else:
            new = [*stamps, timestamp]
            if stamps[-1] > timestamp:
                new.sort()
            self._set(key, new)
        self._order.add((timestamp, next(self._seq), key))
        self._count += 1
        return True

    def remove(self, key: Any, timestamp: int) -> bool:
        stamps = self._get(key)
        if not stamps or timestamp not in stamps:
            return False
        self._set(key, [t for t in stamps if t != timestamp])
        self._count -= 1
        entries = len(self._order) + len(self._run_stamps) - self._cursor
        if entries > 2 * self._count + 1024:
            self._rebuild()
        return True

    def _front(self) -> tuple[int, Any, bool] | None:
        """The earliest live entry: (timestamp, key, whether it is the settled run's)."""
        while True:
            order, run, cursor = self._order, self._run_stamps, self._cursor
            settled = cursor < len(run)
            if settled:
                timestamp = int(run[cursor])
                settled = not order or timestamp <= order[0][0]
            if settled:
                key = self._run_keys[self._run_owner[cursor]]
            elif order:
                timestamp, _, key = order[0]
            else:
                return None
            stamps = self._get(key)
            # the front is the earliest live timer iff it is its key's earliest timestamp
            if stamps and stamps[0] == timestamp:
                return timestamp, key, settled
            self._drop_front(settled)  # deleted (or fired through a duplicate entry)

    def _drop_front(self, settled: bool) -> None:
        if settled:
            self._cursor += 1
            if self._cursor == len(self._run_stamps):  # used up: free the arrays and keys
                self._run_stamps = self._run_owner = np.empty(0, dtype=np.int64)
                self._run_keys, self._cursor = [], 0
        else:
            self._order.pop(0)

    def peek(self) -> int | None:
        front = self._front()
        return None if front is None else front[0]

    def poll(self, limit: int) -> tuple[Any, int] | None:
        front = self._front()
        if front is None or front[0] > limit:
            return None
        timestamp, key, settled = front
        self._drop_front(settled)
        stamps = self._get(key)
        assert stamps is not None
        self._set(key, stamps[1:])
        self._count -= 1
        return key, timestamp

    def timers_of(self, key: Any) -> list[int]:
        return list(self._get(key) or ())

    def __len__(self) -> int:
        return self._count


def timer_meta(queue: str, key_serializer: TypeSerializer) -> StateMeta:
    """What a snapshot records about timer queue ``queue``: a state of kind ``timers``."""
    from statekit.backends.base import StateMeta

    return StateMeta(timer_state_name(queue), TIMERS_KIND, list(TIMERS_LAYOUT), key_serializer,
                     TimestampsSerializer())
