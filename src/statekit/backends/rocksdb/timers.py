"""RocksDB timer queues: two column families per queue, and each key group's earliest timer.

``_timer_state/<queue>`` holds one entry per timer under ``key group + key + timestamp`` (the
value is the timestamp, msgpack-encoded): it has the layout of a list state, so snapshots,
savepoints and the inspection tools read it as each key's list of timestamps.  The index
``_timer_state/<queue>/by-time`` holds ``key group + timestamp + key``, so within a key group the
earliest timer is the first entry from the group's prefix (Flink's RocksDB timer service orders
its column family the same way).  Timestamps are 8 bytes, big-endian, offset by 2**63 so that
byte order is numeric order.  In memory the queue keeps each key group's earliest entry and a
binary heap over their timestamps: finding the next due timer is O(1), and firing one is two
deletes and one seek, from the fired entry, for the group's next one.

Seeking from the fired entry, bounded by the key group's end, matters: the deletes leave
tombstones at the head of the index until compaction drops them, and a seek from the group's
prefix would step over every timer fired since, making each fire slower than the last.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rocksdict import ReadOptions, WriteBatch

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
        self._head_keys: dict[int, bytes] = {}  # key group -> its earliest entry in the index
        self._order: list[tuple[int, int]] = []  # (timestamp, key group), stale entries skipped
        self._bounds: dict[int, ReadOptions] = {}  # key group -> reads that stop at its end
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
            self._set_head(kg, key)
            it.seek((kg + 1).to_bytes(2, "big"))
        del it

    def _set_head(self, kg: int, entry: bytes | None) -> None:
        """Key group ``kg``'s earliest index entry is ``entry`` (None: the group has no timers)."""
        if entry is None:
            self._heads.pop(kg, None)
            self._head_keys.pop(kg, None)
            return
        timestamp = _ts(entry[2:10])
        self._head_keys[kg] = entry
        if self._heads.get(kg) != timestamp:
            self._heads[kg] = timestamp
            heapq.heappush(self._order, (timestamp, kg))

    def _first_from(self, kg: int, start: bytes) -> bytes | None:
        """The first index entry of key group ``kg`` at or after ``start``, reading no further
        than the group's end (so neither its fired timers nor the next group's are stepped
        over)."""
        bound = self._bounds.get(kg)
        if bound is None:
            bound = self._bounds[kg] = ReadOptions()
            bound.set_iterate_upper_bound((kg + 1).to_bytes(2, "big"))
        it = self._time.iter(bound)
        it.seek(start)
        try:
            return it.key() if it.valid() else None
        finally:
            del it

    def add(self, key: Any, timestamp: int) -> bool:
        prefix = self._b.key_prefix(key)
        entry = prefix + _ts8(timestamp)
        if self._keys.get(entry) is not None:
            return False
        batch = WriteBatch(raw_mode=True)
        batch.put(entry, packb(timestamp), self._keys_handle)
        index = prefix[:2] + entry[-8:] + prefix[2:]
        batch.put(index, b"", self._time_handle)
        self._b._db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        head = self._head_keys.get(kg)
        if head is None or index < head:
            self._set_head(kg, index)
        return True

    def _delete(self, prefix: bytes, timestamp: int) -> None:
        ts8 = _ts8(timestamp)
        index = prefix[:2] + ts8 + prefix[2:]
        batch = WriteBatch(raw_mode=True)
        batch.delete(prefix + ts8, self._keys_handle)
        batch.delete(index, self._time_handle)
        self._b._db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        if self._head_keys.get(kg) == index:  # the group's next timer follows the deleted one
            self._set_head(kg, self._first_from(kg, index))

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
        timestamp, kg = top
        index = self._head_keys[kg]
        kb = index[10:]
        self._delete(index[:2] + kb, timestamp)
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
