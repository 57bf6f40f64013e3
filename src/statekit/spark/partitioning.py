"""Which Spark partition a key lands in: Spark's own hash partitioning, computed in Python.

Spark routes a row to partition ``pmod(murmur3(key columns, seed 42), n)`` for
``repartition(n, cols)`` and for the shuffle of a ``groupBy`` (HashPartitioning).  When a
query's partition count changes, or a new query starts from another query's state, statekit
splits the old partitions' state with exactly this function, so each new partition holds the
keys Spark will send it.  The hash follows Spark's ``Murmur3_x86_32`` (including its
byte-at-a-time tail for strings and binaries); ``tests/spark/test_rescale.py`` checks it against
Spark's ``hash()``.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

from statekit.errors import ConfigError

SEED = 42
_M = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593
_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * _C1) & _M, 15) * _C2) & _M


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M
    return h1 ^ (h1 >> 16)


def hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed & _M, _mix_k1(value & _M)), 4)


def hash_long(value: int, seed: int) -> int:
    h1 = _mix_h1(seed & _M, _mix_k1(value & _M))
    return _fmix(_mix_h1(h1, _mix_k1((value >> 32) & _M)), 8)


def hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``hashUnsafeBytes``: 4-byte little-endian words, then one signed byte at a time."""
    n = len(data)
    aligned = n - n % 4
    h1 = seed & _M
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i:i + 4], "little")))
    for i in range(aligned, n):
        byte = data[i] - 256 if data[i] > 127 else data[i]
        h1 = _mix_h1(h1, _mix_k1(byte & _M))
    return _fmix(h1, n)


def _double(value: float, seed: int) -> int:
    if value == 0.0:
        value = 0.0  # -0.0 hashes as 0.0
    if math.isnan(value):
        return hash_long(0x7FF8000000000000, seed)
    return hash_long(struct.unpack("<q", struct.pack("<d", value))[0], seed)


def _float(value: float, seed: int) -> int:
    if value == 0.0:
        return hash_int(0, seed)
    if math.isnan(value):
        return hash_int(0x7FC00000, seed)
    return hash_int(struct.unpack("<i", struct.pack("<f", value))[0], seed)


def _timestamp(value: Any, seed: int) -> int:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        delta = value - _EPOCH
        value = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return hash_long(int(value), seed)


def _date(value: Any, seed: int) -> int:
    days = (value - _EPOCH_DATE).days if isinstance(value, _dt.date) else int(value)
    return hash_int(days, seed)


#: Spark type (``DataType.simpleString()``) -> hash of a non-null value of it
_HASHERS: dict[str, Callable[[Any, int], int]] = {
    "string": lambda v, s: hash_bytes(str(v).encode("utf-8"), s),
    "binary": lambda v, s: hash_bytes(bytes(v), s),
    "boolean": lambda v, s: hash_int(1 if v else 0, s),
    "tinyint": lambda v, s: hash_int(int(v), s),
    "smallint": lambda v, s: hash_int(int(v), s),
    "int": lambda v, s: hash_int(int(v), s),
    "bigint": lambda v, s: hash_long(int(v), s),
    "float": lambda v, s: _float(float(v), s),
    "double": lambda v, s: _double(float(v), s),
    "date": _date,
    "timestamp": _timestamp,
    "timestamp_ntz": _timestamp,
}


def spark_hash(values: Sequence[Any], types: Sequence[str]) -> int:
    """Spark's ``hash(col1, col2, ...)`` of one row's key columns (a signed 32-bit int)."""
    h = SEED
    for value, kind in zip(values, types, strict=True):
        if value is not None:
            h = _HASHERS[kind](value, h)
    return h - (1 << 32) if h & 0x80000000 else h


class SparkPartitioner:
    """``owner(key)``: the partition (of ``num_partitions``) Spark sends a key's rows to.

    ``types`` are the key columns' Spark types; a key of one column is the value itself, of
    several a tuple, as the adapters pass keys to the keyed function.
    """

    def __init__(self, types: Sequence[str], num_partitions: int) -> None:
        unknown = [t for t in types if t not in _HASHERS]
        if unknown:
            raise ConfigError("key", f"statekit cannot split state keyed by columns of type "
                                     f"{', '.join(unknown)} (supported: {', '.join(_HASHERS)})")
        if num_partitions < 1:
            raise ConfigError("num_partitions", f"must be at least 1, got {num_partitions}")
        self.types = tuple(types)
        self.num_partitions = num_partitions

    def owner(self, key: Any) -> int:
        values = (key,) if len(self.types) == 1 else tuple(key)
        return spark_hash(values, self.types) % self.num_partitions

    def owns(self, partition: int) -> Owns:
        """A key filter keeping the keys of ``partition``."""
        return Owns(self, partition)


class Owns:
    """Whether Spark sends a key to one partition: ``owns(key)``, or ``owns.mask(keys)`` for many
    at once (vectorized: what a rescale's restore uses)."""

    def __init__(self, partitioner: SparkPartitioner, partition: int) -> None:
        self.partitioner, self.partition = partitioner, partition

    def __call__(self, key: Any) -> bool:
        return self.partitioner.owner(key) == self.partition

    def mask(self, keys: Sequence[Any]) -> list[bool]:
        """``[owns(key) for key in keys]``, hashed many at a time."""
        from statekit.spark.hashvec import spark_hashes

        hashes = spark_hashes(keys, self.partitioner.types).astype("int64")
        return ((hashes % self.partitioner.num_partitions) == self.partition).tolist()


def key_types(schema: Any, columns: Sequence[str]) -> list[str]:
    """The Spark types of ``columns`` in ``schema`` (a ``StructType``)."""
    return [schema[name].dataType.simpleString() for name in columns]


def grouping_types(grouped_df: Any) -> list[str]:
    """The Spark types of a ``GroupedData``'s grouping expressions (resolved against its input)."""
    exprs = grouped_df._jgd.groupingExprs()
    sql = [exprs.apply(i).sql() for i in range(exprs.size())]
    schema = grouped_df._df.selectExpr(*sql).schema
    return [field.dataType.simpleString() for field in schema.fields]
