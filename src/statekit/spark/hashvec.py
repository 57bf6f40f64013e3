"""Spark's ``hash()`` of many keys at once, with numpy: what splitting state at a rescale needs.

A rescale keeps, of every old partition's keys, those Spark now sends to this partition; hashing
each key in Python (:func:`statekit.spark.partitioning.spark_hash`) cost about 2 µs a key, seconds
for a million keys in every new partition.  Integer, boolean, string and binary columns are hashed
here a word position at a time over all keys; other types fall back to the per-key hash.  The
result equals :func:`~statekit.spark.partitioning.spark_hash` bit for bit (tested against it and,
through it, against Spark).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_INTS = frozenset({"tinyint", "smallint", "int", "boolean"})
#: longest string or binary value hashed here (longer: per key)
_MAX_BYTES = 256


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h1 = h1 ^ np.asarray(length, dtype=np.uint32)
    h1 ^= h1 >> np.uint32(16)
    h1 *= np.uint32(0x85EBCA6B)
    h1 ^= h1 >> np.uint32(13)
    h1 *= np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def _ints(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    return _fmix(_mix_h1(seeds, _mix_k1(values.astype(np.uint32))), 4)


def _longs(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    low = (values & 0xFFFFFFFF).astype(np.uint32)
    high = ((values >> 32) & 0xFFFFFFFF).astype(np.uint32)
    return _fmix(_mix_h1(_mix_h1(seeds, _mix_k1(low)), _mix_k1(high)), 8)


def _bytes(values: list[bytes], seeds: np.ndarray) -> np.ndarray | None:
    """``hashUnsafeBytes``: little-endian words, then the tail one signed byte at a time."""
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    longest = int(lengths.max(initial=0))
    if longest > _MAX_BYTES:
        return None
    width = max(4, (longest + 3) // 4 * 4)
    grid = np.array(values, dtype=f"S{width}").view(np.uint8).reshape(len(values), width)
    words = grid.view("<u4")
    h1 = seeds.copy()
    aligned = lengths - lengths % 4
    for w in range(longest // 4):
        rows = aligned >= 4 * (w + 1)
        h1[rows] = _mix_h1(h1[rows], _mix_k1(words[rows, w]))
    for j in range(longest):
        rows = (aligned <= j) & (j < lengths)
        if rows.any():
            signed = grid[rows, j].astype(np.int8).astype(np.int32).astype(np.uint32)
            h1[rows] = _mix_h1(h1[rows], _mix_k1(signed))
    return _fmix(h1, lengths.astype(np.uint32))


def _column(values: list[Any], kind: str, seeds: np.ndarray) -> np.ndarray | None:
    """Each value's hash with its seed (a null leaves its seed); None: not done here."""
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    if not present.all():
        out = seeds.copy()
        kept = [v for v in values if v is not None]
        hashed = _column(kept, kind, seeds[present])
        if hashed is None:
            return None
        out[present] = hashed
        return out
    if kind in _INTS:
        return _ints(np.fromiter((int(v) for v in values), dtype=np.int64, count=len(values)),
                     seeds)
    if kind == "bigint":
        return _longs(np.fromiter(values, dtype=np.int64, count=len(values)), seeds)
    if kind == "string":
        return _bytes([str(v).encode("utf-8") for v in values], seeds)
    if kind == "binary":
        return _bytes([bytes(v) for v in values], seeds)
    return None


def spark_hashes(keys: Sequence[Any], types: Sequence[str]) -> np.ndarray:
    """Spark's ``hash(key columns)`` of each key (a key of one column is the value, of several a
    tuple), as int32: equal to :func:`~statekit.spark.partitioning.spark_hash` of each."""
    from statekit.spark.partitioning import _HASHERS, SEED

    seeds = np.full(len(keys), SEED, dtype=np.uint32)
    for i, kind in enumerate(types):
        column = list(keys) if len(types) == 1 else [key[i] for key in keys]
        hashed = _column(column, kind, seeds) if len(column) else seeds
        if hashed is None:  # per key, from each key's seed so far
            hasher = _HASHERS[kind]
            hashed = np.fromiter(
                (seed if v is None else hasher(v, int(seed)) for v, seed in zip(column, seeds,
                                                                                 strict=True)),
                dtype=np.uint32, count=len(column))
        seeds = hashed
    return seeds.view(np.int32)
