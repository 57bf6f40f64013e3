"""RocksDB timer queues: two column families per queue, and each key group's earliest timer.

``_timer_state/<queue>`` holds one entry per timer under ``key group + key + timestamp`` (the
value is the timestamp, msgpack-encoded): it has the layout of a list state, so snapshots,
savepoints and the inspection tools read it as each key's list of timestamps.  The index
``_timer_state/<queue>/by-time`` holds ``key group + timestamp + key``, so within a key group the
earliest timer is the first entry from the group's prefix (Flink's RocksDB timer service orders
its column family the same way).  Timestamps are 8 bytes, big-endian, offset by 2**63 so that
byte order is numeric order.  In memory the queue keeps each key group's first index entries
(up to ``CACHED`` of them, Flink's ``RocksDBCachingPriorityQueueSet``) and a binary heap over
the groups' earliest timestamps: finding the next due timer is O(1), and firing one is two
deletes and a pop from the group's cached entries; the index is read again, ``CACHED`` entries
with one iterator, only when a group's cached entries run out.  An iterator per fired timer
would cost more the more files and levels the index has (10^7 timers are several levels).

Reading again from the last fired entry, bounded by the key group's end, matters: the deletes
leave tombstones at the head of the index until compaction drops them, and a read from the
group's prefix would step over every timer fired since, making each fire slower than the last.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from rocksdict import ReadOptions, WriteBatch

from statekit.backends.rocksdb.encoding import check_scan_end, raise_stopped
from statekit.backends.timers import TIMERS_KIND, TimerQueue, timer_state_name
from statekit.serde.msgpack import packb

if TYPE_CHECKING:
    from rocksdict import Rdict

    from statekit.serde.serializers import TypeSerializer


class TimerOwner(Protocol):
    """What a RocksDB timer queue uses of its backend: the database, its column families and the
    key prefixes.  The backend imports this module, never the other way."""

    db: Any
    key_serializer: TypeSerializer

    def cf(self, name: str) -> Rdict:
        """The column family ``name``, created on first use."""
        ...

    def key_prefix(self, key: Any) -> bytes:
        """Key group and serialized key of ``key``."""
        ...

INDEX_SUFFIX = "/by-time"
_OFFSET = 1 << 63
#: how many of a key group's first index entries the queue keeps in memory (Flink keeps 128)
CACHED = 128


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

    def __init__(self, name: str, backend: TimerOwner) -> None:
        super().__init__(name)
        self._b = backend
        self.state_name = timer_state_name(name)
        self._heads: dict[int, int] = {}  # key group -> its earliest timestamp
        # key group -> its first index entries, in order; ``_complete`` holds the groups whose
        # list is all of their entries (a group without timers has no list)
        self._cache: dict[int, list[bytes]] = {}
        self._complete: set[int] = set()
        self._order: list[tuple[int, int]] = []  # (timestamp, key group), stale entries skipped
        self._bounds: dict[int, ReadOptions] = {}  # key group -> reads that stop at its end
        self.bind()
        self._scan_heads()

    def bind(self) -> None:
        """(Re)take the column families and their handles from the backend."""
        backend = self._b
        self._keys = backend.cf(self.state_name)
        self._time = backend.cf(index_name(self.state_name))
        db = backend.db
        self._keys_handle = db.get_column_family_handle(self.state_name)
        self._time_handle = db.get_column_family_handle(index_name(self.state_name))

    def poison(self, bad: Any) -> None:
        """Make every further use raise (the database was closed or replaced)."""
        self._keys = self._time = bad

    def _scan_heads(self) -> None:
        """Each non-empty key group's first entries, one seek per key group."""
        it = self._time.iter()
        it.seek_to_first()
        while it.valid():
            key = it.key()
            kg = int.from_bytes(key[:2], "big")
            self._load(kg, key)
            it.seek((kg + 1).to_bytes(2, "big"))
        raise_stopped(it)
        del it

    def _load(self, kg: int, start: bytes) -> None:
        """Cache key group ``kg``'s first ``CACHED`` index entries at or after ``start`` (the
        group's first ones: nothing before ``start`` is left), reading no further than the
        group's end."""
        bound = self._bounds.get(kg)
        if bound is None:
            bound = self._bounds[kg] = ReadOptions()
            bound.set_iterate_upper_bound((kg + 1).to_bytes(2, "big"))
        it = self._time.iter(bound)
        it.seek(start)
        entries = []
        try:
            while len(entries) < CACHED and it.valid():
                entries.append(it.key())
                it.next()
            complete = not it.valid()
        finally:
            del it
        if complete:
            self._complete.add(kg)
        else:
            self._complete.discard(kg)
        if entries:
            self._cache[kg] = entries
            self._set_head(kg, entries[0])
        else:
            self._cache.pop(kg, None)
            self._heads.pop(kg, None)

    def _set_head(self, kg: int, entry: bytes) -> None:
        """Key group ``kg``'s earliest index entry is ``entry``."""
        timestamp = _ts(entry[2:10])
        if self._heads.get(kg) != timestamp:
            self._heads[kg] = timestamp
            heapq.heappush(self._order, (timestamp, kg))

    def add(self, key: Any, timestamp: int) -> bool:
        prefix = self._b.key_prefix(key)
        entry = prefix + _ts8(timestamp)
        if self._keys.get(entry) is not None:
            return False
        batch = WriteBatch(raw_mode=True)
        batch.put(entry, packb(timestamp), self._keys_handle)
        index = prefix[:2] + entry[-8:] + prefix[2:]
        batch.put(index, b"", self._time_handle)
        self._b.db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        cached = self._cache.get(kg)
        if cached is None:  # the group's only timer
            self._cache[kg] = [index]
            self._complete.add(kg)
            self._set_head(kg, index)
        elif index < cached[-1]:  # among the group's first entries
            bisect.insort(cached, index)
            if len(cached) > CACHED:
                cached.pop()
                self._complete.discard(kg)
            if cached[0] == index:
                self._set_head(kg, index)
        elif kg in self._complete:  # after all of the group's entries
            if len(cached) < CACHED:
                cached.append(index)
            else:
                self._complete.discard(kg)
        return True

    def _delete(self, prefix: bytes, timestamp: int) -> None:
        ts8 = _ts8(timestamp)
        index = prefix[:2] + ts8 + prefix[2:]
        batch = WriteBatch(raw_mode=True)
        batch.delete(prefix + ts8, self._keys_handle)
        batch.delete(index, self._time_handle)
        self._b.db.write(batch)
        kg = int.from_bytes(prefix[:2], "big")
        cached = self._cache[kg]
        at = bisect.bisect_left(cached, index)
        if at == len(cached) or cached[at] != index:
            return  # beyond the cached entries
        del cached[at]
        if cached:
            if at == 0:
                self._set_head(kg, cached[0])
        elif kg in self._complete:  # the group's last timer
            del self._cache[kg]
            self._heads.pop(kg, None)
        else:  # the group's next entries follow the deleted one
            self._load(kg, index)

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
        index = self._cache[kg][0]
        kb = index[10:]
        self._delete(index[:2] + kb, timestamp)
        return self._b.key_serializer.deserialize(kb), timestamp

    def timers_of(self, key: Any) -> list[int]:
        prefix = self._b.key_prefix(key)
        return [_ts(k[-8:]) for k in self._keys_under(prefix)]

    def _keys_under(self, prefix: bytes) -> Iterator[bytes]:
        last = None
        for key in self._keys.keys(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key
            last = key
        check_scan_end(self._keys, last, prefix)

    def __len__(self) -> int:
        return sum(1 for _ in self._time.keys())  # noqa: SIM118 - a scan, not a dict
