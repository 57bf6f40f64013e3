"""RocksDB timer queues: two column families per queue, and each key group's earliest timer.

``_timer_state/<queue>`` holds one entry per timer under ``key group + key + timestamp`` (the
value is the timestamp, msgpack-encoded): it has the layout of a list state, so snapshots,
savepoints and the inspection tools read it as each key's list of timestamps.  The index
``_timer_state/<queue>/by-time`` holds ``key group + timestamp + key``, so within a key group the
earliest timer is the first entry from the group's prefix (Flink's RocksDB timer service orders
its column family the same way).  Timestamps are 8 bytes, big-endian, offset by 2**63 so that
byte order is numeric order.  In memory the queue keeps each key group's earliest timestamp and a
binary heap over them: finding the next due timer is O(1) and firing one is a seek, two deletes
and a step of the iterator.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rocksdict import WriteBatch

from statekit.backends.timers import TIMERS_KIND, TimerQueue, timer_state_name
from statekit.serde.msgpack import packb

if TYPE_CHECKING:
    from statekit.backends.rocksdb.backend import RocksDBKeyedStateBackend

INDEX_SUFFIX = "/by-time"
_OFFSET = 1 << 63


def index_name(state_name: str) -> str:
    """The column family indexing timer state ``state_name`` by time."""
    return state_name + INDEX_SUFFIX


def column_families(states: dict[str, Any]) -> Iterator[str]:
    """The column families of a native handle's ``states``: every state's, and the by-time
    index of each timer queue."""
    for name, info in states.items():
        yield name
        if isinstance(info, dict) and info.get("kind") == TIMERS_KIND:
            yield index_name(name)


def ts8(timestamp: int) -> bytes:
    """A timestamp as 8 bytes that sort in numeric order."""
    return (timestamp + _OFFSET).to_bytes(8, "big")


def _ts8(timestamp: int) -> bytes:
    return (timestamp + _OFFSET).to_bytes(8, "big")


def _ts(raw: bytes) -> int:
    return int.from_bytes(raw, "big") - _OFFSET


class RocksDBTimerQueue(TimerQueue):
    """A timer queue in two column families of a RocksDB keyed backend."""

    def __init__(self, name: str, backend: RocksDBKeyedStateBackend) -> None:
        super().__init__(name)
        self._b = backend
        self.state_name = timer_state_name(name)
        self._heads: dict[int, int] = {}  # key group -> its earliest timestamp
        self._order: list[tuple[int, int]] = []  # (timestamp, key group), stale entries skipped
        self.bind()
        self._scan_heads()

    def bind(self) -> None:
        """(Re)take the column families and their handles from the backend."""
        backend = self._b
        self._keys = backend._cf(self.state_name)
        self._time = backend._cf(index_name(self.state_name))
        db = backend._db
        self._keys_handle = db.get_column_family_handle(self.state_name)
        self._time_handle = db.get_column_family_handle(index_name(self.state_name))

    def poison(self, bad: Any) -> None:
        """Make every further use raise (the database was closed or replaced)."""
        self._keys = self._time = bad

    def _scan_heads(self) -> None:
        """Each key group's earliest timer, one seek per non-empty key group."""
        it = self._time.iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            kg = int.from_bytes(key[:2], "big")
            self._set_head(kg, _ts(key[2:10]))
            it.seek((kg + 1).to_bytes(2, "big"))
        del it

    def _set_head(self, kg: int, timestamp: int | None) -> None:
        if timestamp is None:
            self._heads.pop(kg, None)
            return
        self._heads[kg] = timestamp
        heapq.heappush(self._order, (timestamp, kg))

    def _first_of(self, kg: int) -> tuple[bytes, int] | None:
        """The serialized key and timestamp of key group ``kg``'s earliest timer."""
        prefix = kg.to_bytes(2, "big")
        it = self._time.iter()
        it.seek(prefix)
        try:
            if not it.valid():
                return None
            key = it.key()
            if key[:2] != prefix:
                return None
            return key[10:], _ts(key[2:10])
        finally:
            del it

    def add(self, key: Any, timestamp: int) -> bool:
        prefix = self._b.key_prefix(key)
        entry = prefix + _ts8(timestamp)
        if self._keys.get(entry) is not None:
            return False
        batch = WriteBatch(raw_mode=True)
        batch.put(entry, packb(timestamp), self._keys_handle)
        batch.put(prefix[:2] + entry[-8:] + prefix[2:], b"", self._time_handle)
        self._b._db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        head = self._heads.get(kg)
        if head is None or timestamp < head:
            self._set_head(kg, timestamp)
        return True

    def _delete(self, prefix: bytes, timestamp: int) -> None:
        ts8 = _ts8(timestamp)
        batch = WriteBatch(raw_mode=True)
        batch.delete(prefix + ts8, self._keys_handle)
        batch.delete(prefix[:2] + ts8 + prefix[2:], self._time_handle)
        self._b._db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        if self._heads.get(kg) == timestamp:
            first = self._first_of(kg)
            self._set_head(kg, None if first is None else first[1])

    def remove(self, key: Any, timestamp: int) -> bool:
        prefix = self._b.key_prefix(key)
        if self._keys.get(prefix + _ts8(timestamp)) is None:
            return False
        self._delete(prefix, timestamp)
        return True

    def _top(self) -> tuple[int, int] | None:
        order, heads = self._order, self._heads
        while order:
            timestamp, kg = order[0]
            if heads.get(kg) == timestamp:
                return timestamp, kg
            heapq.heappop(order)  # the key group's head moved since
        return None

    def peek(self) -> int | None:
        top = self._top()
        return None if top is None else top[0]

    def poll(self, limit: int) -> tuple[Any, int] | None:
        top = self._top()
        if top is None or top[0] > limit:
            return None
        kg = top[1]
        first = self._first_of(kg)
        if first is None:  # pragma: no cover - the heads always follow the column family
            self._set_head(kg, None)
            return self.poll(limit)
        kb, timestamp = first
        self._delete(kg.to_bytes(2, "big") + kb, timestamp)
        return self._b.key_serializer.deserialize(kb), timestamp

    def timers_of(self, key: Any) -> list[int]:
        prefix = self._b.key_prefix(key)
        return [_ts(k[-8:]) for k in self._keys_under(prefix)]

    def _keys_under(self, prefix: bytes) -> Iterator[bytes]:
        for key in self._keys.keys(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key

    def __len__(self) -> int:
        return sum(1 for _ in self._time.keys())  # noqa: SIM118 - a scan, not a dict
