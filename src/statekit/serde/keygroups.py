"""Key groups: the unit by which keyed state is partitioned, snapshotted and rescaled (as in Flink).

A key's group is a stable hash of its serialized bytes (never Python's salted ``hash()``)
modulo ``max_parallelism``; partition ``i`` of ``n`` owns one contiguous range of groups.
"""

from __future__ import annotations

import array
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from statekit.config import default

DEFAULT_MAX_PARALLELISM: int = default("pipeline.max-parallelism")
UPPER_BOUND_MAX_PARALLELISM = 1 << 15


def key_group_for_bytes(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of a serialized key: CRC-32 with murmur3's finalizer, mod max parallelism."""
    h = zlib.crc32(key_bytes)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h % max_parallelism


def key_groups_for_crcs(crcs: Any, max_parallelism: int) -> Any:
    """:func:`key_group_for_bytes` of many keys from their CRC-32s, vectorized (a numpy array:
    restores check every key's group)."""
    import numpy as np  # only restores need it

    h = np.asarray(crcs, dtype=np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h = h * np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h % np.uint32(max_parallelism)


def key_groups_for_bytes(keys: Iterable[bytes], max_parallelism: int) -> Any:
    """:func:`key_group_for_bytes` of each serialized key (a numpy array)."""
    return key_groups_for_crcs(array.array("I", map(zlib.crc32, keys)), max_parallelism)


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups; empty when ``end < start``."""

    start: int
    end: int

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        return KeyGroupRange(max(self.start, other.start), min(self.end, other.end))

    def to_list(self) -> list[int]:
        return [self.start, self.end]

    @classmethod
    def of(cls, bounds: list[int] | tuple[int, int]) -> KeyGroupRange:
        return cls(int(bounds[0]), int(bounds[1]))

    @classmethod
    def all(cls, max_parallelism: int) -> KeyGroupRange:
        return cls(0, max_parallelism - 1)


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """The contiguous range of key groups that partition ``operator_index`` of ``parallelism`` owns."""
    if not 0 < parallelism <= max_parallelism:
        raise ValueError(f"parallelism {parallelism} must be in 1..{max_parallelism}")
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The partition that owns ``key_group`` (inverse of :func:`key_group_range_for_operator`)."""
    return key_group * parallelism // max_parallelism
