"""Spark's hash of many keys at once (numpy) equals the per-key hash bit for bit, which
``tests/spark/test_rescale.py`` checks against Spark's own ``hash()``."""

import datetime as dt
import random

import pytest

from statekit.spark.hashvec import spark_hashes
from statekit.spark.partitioning import SparkPartitioner, spark_hash

RNG = random.Random(5)


def _text(n: int) -> str:
    return "".join(RNG.choice("aé€𝄞z0\x00 ") for _ in range(n))


COLUMNS = {
    "string": lambda: _text(RNG.randrange(0, 40)),
    "binary": lambda: bytes(RNG.randrange(256) for _ in range(RNG.randrange(0, 23))),
    "bigint": lambda: RNG.randrange(-(1 << 63), 1 << 63),
    "int": lambda: RNG.randrange(-(1 << 31), 1 << 31),
    "smallint": lambda: RNG.randrange(-(1 << 15), 1 << 15),
    "tinyint": lambda: RNG.randrange(-128, 128),
    "boolean": lambda: RNG.random() < 0.5,
    "double": lambda: RNG.choice([0.0, -0.0, float("nan"), RNG.uniform(-1e9, 1e9)]),
    "date": lambda: dt.date(2000, 1, 1) + dt.timedelta(days=RNG.randrange(20000)),
}


@pytest.mark.parametrize("kind", sorted(COLUMNS))
def test_one_column_equals_the_per_key_hash(kind):
    keys = [COLUMNS[kind]() for _ in range(500)] + [None] * 3
    got = spark_hashes(keys, [kind]).tolist()
    assert got == [spark_hash([k], [kind]) for k in keys]


def test_several_columns_and_nulls_equal_the_per_key_hash():
    types = ["string", "bigint", "double", "binary"]
    keys = [tuple(None if RNG.random() < 0.1 else COLUMNS[t]() for t in types) for _ in range(400)]
    assert spark_hashes(keys, types).tolist() == [spark_hash(list(k), types) for k in keys]


def test_long_values_and_empty_input():
    keys = ["x" * 300, "y" * 3, ""]  # longer than hashed at once: per key
    assert spark_hashes(keys, ["string"]).tolist() == [spark_hash([k], ["string"]) for k in keys]
    assert spark_hashes([], ["string"]).tolist() == []


@pytest.mark.parametrize("n", [3, 8])
def test_the_partition_filter_decides_many_keys_as_one_by_one(n):
    keys = [(COLUMNS["string"](), COLUMNS["int"]()) for _ in range(300)]
    partitioner = SparkPartitioner(["string", "int"], n)
    for p in range(n):
        owns = partitioner.owns(p)
        assert owns.mask(keys) == [owns(k) for k in keys]
