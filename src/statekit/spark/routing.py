"""Key-group routing: ``foreach_batch`` sends each row to the partition owning its key's group.

Flink gives partition ``i`` of ``n`` one contiguous range of key groups, so that a rescale reads
from each old partition only the groups the new one owns.  Spark's ``repartition(n, key)``
scatters the groups over every partition instead.  Here Spark computes statekit's key group of
each row (:func:`statekit.serde.keygroups.key_group_for_bytes` of the canonical msgpack form of
the key, built with Spark SQL functions), the owning partition from it, and a routing value whose
Spark hash lands in that partition: ``repartition(n, route)`` then does the rest.  Keys of
integer, boolean, string and binary columns (and tuples of them) are routed so; other types keep
Spark's hash partitioning (:mod:`statekit.spark.partitioning`).  ``tests/spark/test_routing.py``
checks the SQL against the Python function key by key.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from statekit.serde.keygroups import KeyGroupRange, key_group_range_for_operator
from statekit.spark.partitioning import SparkPartitioner

#: the column foreach_batch routes by (dropped before the user's function sees the rows)
ROUTE_COLUMN = "__statekit_route"
_INTEGERS = frozenset({"tinyint", "smallint", "int", "bigint"})
ROUTABLE = _INTEGERS | {"boolean", "string", "binary"}
#: msgpack's extension type of a tuple in statekit's format (see statekit.serde.msgpack)
_EXT_TUPLE = 1


def routable(types: Sequence[str], partitions: int, max_parallelism: int) -> bool:
    """Whether keys of these column types route by key group at this partition count (every
    partition must own at least one group, as Flink requires parallelism <= max parallelism)."""
    return bool(types) and all(t in ROUTABLE for t in types) and partitions <= max_parallelism


def owned_groups(partition: int, partitions: int, max_parallelism: int) -> KeyGroupRange:
    """The key groups ``partition`` of ``partitions`` owns under key-group routing."""
    return key_group_range_for_operator(max_parallelism, partitions, partition)


@functools.lru_cache(maxsize=64)
def route_values(partitions: int) -> tuple[int, ...]:
    """For each partition ``p``, the smallest int whose Spark hash sends a row to ``p``."""
    owner = SparkPartitioner(["int"], partitions).owner
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(owner(value), value)
        value += 1
    return tuple(found[p] for p in range(partitions))


def _hex(n: Any, width: int) -> Any:
    from pyspark.sql import functions as F

    return F.lpad(F.hex(n), 2 * width, "0")


def _int(col: Any) -> Any:
    """msgpack's smallest encoding of an integer (``packb(int)``)."""
    from pyspark.sql import functions as F

    x = col.cast("bigint")
    low = F.lpad(F.hex(x), 16, "0")  # two's complement for negatives

    def tail(width: int, prefix: str = "") -> Any:
        return F.concat(F.lit(prefix), F.substring(low, 17 - 2 * width, 2 * width))

    return F.unhex(
        F.when(x >= 0, F.when(x < 128, tail(1)).when(x < 256, tail(1, "CC"))
               .when(x < 65536, tail(2, "CD")).when(x < 2**32, tail(4, "CE"))
               .otherwise(tail(8, "CF")))
        .when(x >= -32, tail(1)).when(x >= -128, tail(1, "D0")).when(x >= -32768, tail(2, "D1"))
        .when(x >= -(2**31), tail(4, "D2")).otherwise(tail(8, "D3")))


def _length_header(n: Any, codes: tuple[str, str, str], suffix: str = "") -> Any:
    """msgpack's header (hex) for a length ``n``: its 8-, 16- or 32-bit form, ``suffix`` after
    the length (an extension's type)."""
    from pyspark.sql import functions as F

    return (F.when(n < 256, F.concat(F.lit(codes[0]), _hex(n, 1), F.lit(suffix)))
            .when(n < 65536, F.concat(F.lit(codes[1]), _hex(n, 2), F.lit(suffix)))
            .otherwise(F.concat(F.lit(codes[2]), _hex(n, 4), F.lit(suffix))))


def _sized(data: Any, small: int | None, codes: tuple[str, str, str]) -> Any:
    """``data`` (binary) behind msgpack's header for its length: a fix code below ``small``
    (a string's), else the 8-, 16- or 32-bit length forms."""
    from pyspark.sql import functions as F

    n = F.octet_length(data)
    header = _length_header(n, codes)
    if small is not None:
        header = F.when(n < small, _hex(n + 0xA0, 1)).otherwise(header)
    return F.concat(F.unhex(header), data)


def _value(col: Any, kind: str) -> Any:
    """The canonical msgpack bytes of one key column's value (null: msgpack's nil)."""
    from pyspark.sql import functions as F

    if kind in _INTEGERS:
        packed = _int(col)
    elif kind == "boolean":  # canonical keys hold booleans as the ints 0 and 1
        packed = F.when(col, F.unhex(F.lit("01"))).otherwise(F.unhex(F.lit("00")))
    elif kind == "string":
        packed = _sized(F.encode(col, "UTF-8"), 32, ("D9", "DA", "DB"))
    else:
        packed = _sized(col.cast("binary"), None, ("C4", "C5", "C6"))
    return F.when(col.isNull(), F.unhex(F.lit("C0"))).otherwise(packed)


def _tuple(items: list[Any]) -> Any:
    """A tuple: statekit's extension type holding a msgpack array of the items."""
    from pyspark.sql import functions as F

    payload = F.concat(F.unhex(F.lit(f"{0x90 + len(items):02X}")), *items)
    n = F.octet_length(payload)
    ext = f"{_EXT_TUPLE:02X}"
    header = _length_header(n, ("C7", "C8", "C9"), ext)
    for size, code in {1: "D4", 2: "D5", 4: "D6", 8: "D7", 16: "D8"}.items():
        header = F.when(n == size, F.lit(code + ext)).otherwise(header)
    return F.concat(F.unhex(header), payload)


def key_bytes(columns: Sequence[str], types: Sequence[str]) -> Any:
    """A Spark column of each row's serialized key, as statekit's key serializer writes it."""
    from pyspark.sql import functions as F

    values = [_value(F.col(c), t) for c, t in zip(columns, types, strict=True)]
    return values[0] if len(values) == 1 else _tuple(values)


def _mul32(h: Any, factor: int) -> Any:
    """``h * factor mod 2**32`` in 64-bit arithmetic that never overflows (ANSI mode)."""
    from pyspark.sql import functions as F

    low = h.bitwiseAND(F.lit(0xFFFF))
    high = F.shiftright(h, 16)
    return (low * factor + (high * factor).bitwiseAND(F.lit(0xFFFF)) * 65536).bitwiseAND(
        F.lit(0xFFFFFFFF))


def key_group(columns: Sequence[str], types: Sequence[str], max_parallelism: int) -> Any:
    """A Spark column of each row's key group (CRC-32 of the key, murmur3's finalizer, modulo)."""
    from pyspark.sql import functions as F

    h = F.crc32(key_bytes(columns, types))
    h = h.bitwiseXOR(F.shiftright(h, 16))
    h = _mul32(h, 0x85EBCA6B)
    h = h.bitwiseXOR(F.shiftright(h, 13))
    h = _mul32(h, 0xC2B2AE35)
    h = h.bitwiseXOR(F.shiftright(h, 16))
    return h % max_parallelism


def route(columns: Sequence[str], types: Sequence[str], partitions: int,
          max_parallelism: int) -> Any:
    """The column to ``repartition(partitions, ...)`` by: each row lands in the partition
    owning its key group (Flink's ``key_group * n // max_parallelism``)."""
    from pyspark.sql import functions as F

    owner = (key_group(columns, types, max_parallelism) * partitions / max_parallelism).cast("int")
    values = F.array(*(F.lit(v) for v in route_values(partitions)))
    return F.element_at(values, owner + 1)
