"""Key-group ranges of a plain state entry's parts.

Each part of a plain entry records the key groups its keys lie in (``groups``: ``[first, last]``
per part), so a restore that owns only some of a snapshot's key groups (a rescale) reads the
parts whose range meets its own and nothing else, as Flink's heap backend reads only its key
groups' offsets.  Every key read is checked against its part's range.  A heap snapshot by
key group (``state.backend.heap.snapshot-key-group-order``) writes parts of a few key groups
each; without it a part records the task's whole range.  Entries written before the
ranges were recorded count as one range, the task's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from statekit.backends import plainparts
from statekit.backends.kvschema import check_part_groups
from statekit.backends.plainparts import (
    PACE_SLICE,
    Take,
    joined_part,
    packed_items,
    plain_slices,
)
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.keys import plain_key_groups

#: a part's key-group range, ``(first, last)``
Groups = tuple[int, int]
#: a task's key groups are split into at most this many buckets of whole key groups, each written
#: as parts of its own (a rescale into up to this many ranges reads only its own buckets)
BUCKETS = 16
#: the smallest part a bucket writes while there is more to come
MIN_PART_BYTES = 1024 * 1024


def part_ranges(name: str, entry: dict[str, Any], recorded: KeyGroupRange) -> list[KeyGroupRange]:
    """Each part's key groups: as the entry records them (checked as the metadata pass checks
    them: one per part, inside ``recorded``), else ``recorded`` for every part."""
    parts = entry.get("parts") or []
    groups = entry.get("groups")
    if groups is None:
        return [recorded] * len(parts)
    check_part_groups(groups, parts, f"state '{name}'.groups", recorded)
    return [KeyGroupRange(lo, hi) for lo, hi in groups]


def meeting(ranges: list[KeyGroupRange], mine: KeyGroupRange) -> list[int]:
    """The indices of the parts whose key groups meet ``mine``."""
    return [n for n, r in enumerate(ranges) if r.start <= mine.end and mine.start <= r.end]


def recording(parts: Iterable[tuple[bytes | memoryview, Any]], groups: list[list[int]]
              ) -> Iterator[bytes | memoryview]:
    """The parts' bytes, appending each one's ``[first, last]`` key group to ``groups``."""
    for part, (lo, hi) in parts:
        groups.append([int(lo), int(hi)])
        yield part
        del part  # not held while the next part is packed (into the buffer it views)


def ranged(parts: Iterable[bytes | memoryview], rng: KeyGroupRange
           ) -> Iterator[tuple[bytes | memoryview, Groups]]:
    """Parts whose keys may lie anywhere in ``rng``."""
    groups = (rng.start, rng.end)
    for part in parts:
        yield part, groups
        del part  # not held while the next part is packed (into the buffer it views)


class _Bucket:
    """The entries of one bucket of key groups gathered for its next part, packed slice by
    slice (as :func:`statekit.backends.plainparts.reader_parts`'s paced steps are)."""

    __slots__ = ("high", "key_items", "low", "n", "size", "value_items")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.key_items: list[memoryview] = []
        self.value_items: list[memoryview] = []
        self.n = self.size = 0
        self.low, self.high = 1 << 30, -1

    def add(self, keys: list[Any], values: list[Any], low: int, high: int) -> None:
        self.key_items.append(packed_items(keys))
        self.value_items.append(packed_items(values))
        self.n += len(keys)
        self.size += len(self.key_items[-1]) + len(self.value_items[-1])
        self.low, self.high = min(self.low, low), max(self.high, high)

    def flush(self) -> tuple[bytes, Groups]:
        """The gathered entries as one part, with its range; the bucket starts empty again."""
        out = joined_part(self.n, self.key_items, self.value_items), (self.low, self.high)
        self.clear()
        return out


def grouped_parts(take: Take, rng: KeyGroupRange, max_parallelism: int, *,
                  key_plain: Callable[[Any], Any] | None = None,
                  value_plain: Callable[[Any], Any] | None = None,
                  drop: Callable[[Any], Any] | None = None,
                  pace: Callable[[], None] | None = None) -> Iterator[tuple[bytes, Groups]]:
    """The entries ``take`` reads as plain parts by key group, each with the range of its keys'
    key groups: ``rng`` is split into at most :data:`BUCKETS` buckets of whole key groups and
    each slice read is split among them (the entries stay near each other in memory: a sort of
    the whole table read them in random order, at 5-9x the cost of writing them), each bucket
    writing a part once it holds its share of :data:`PLAIN_PART_BYTES` (``drop``, ``pace``: as
    :func:`reader_parts`)."""
    width = -(-len(rng) // BUCKETS)
    count = -(-len(rng) // width)
    target = max(MIN_PART_BYTES, plainparts.PLAIN_PART_BYTES // count)
    buckets = [_Bucket() for _ in range(count)]
    plain = plain_slices(key_plain, value_plain, drop)
    step = PACE_SLICE if pace is not None else PACE_SLICE * 4
    while (chunk := take(step)) is not None:
        if pace is not None:
            pace()
        ks, vs = plain(*chunk)
        if not ks:
            continue
        groups = plain_key_groups(ks, max_parallelism).astype(np.int64)
        # keys outside ``rng`` (none in a routed task) go to the edge buckets with their true
        # groups: the labels say where they are, and a restore refuses them as before
        index = np.clip((groups - rng.start) // width, 0, count - 1).astype(np.uint8)
        order = np.argsort(index, kind="stable")
        picked = order.tolist()
        ks, vs, groups = [ks[i] for i in picked], [vs[i] for i in picked], groups[order]
        pos = 0
        for b, n in enumerate(np.bincount(index, minlength=count).tolist()):
            if n:
                run = groups[pos:pos + n]
                bucket = buckets[b]
                bucket.add(ks[pos:pos + n], vs[pos:pos + n], int(run.min()), int(run.max()))
                pos += n
                if bucket.size >= target:
                    yield bucket.flush()
    for bucket in buckets:
        if bucket.n:
            yield bucket.flush()
