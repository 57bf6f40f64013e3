"""Key-group routing of ``foreach_batch``: the key group Spark computes for a row equals
statekit's (the CRC-32 of the canonical key bytes, murmur3's finalizer, modulo max parallelism)
on every msgpack length boundary, and ``repartition(n, route)`` puts each row in the partition
owning its group; a rescale then reads only the old partitions holding a new partition's groups,
with the results exact."""

from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import functions as F

from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.inspection import open_checkpoint
from statekit.serde.keygroups import key_group_for_bytes, operator_index_for_key_group
from statekit.serde.keys import KeySerializer
from statekit.serde.types import GenericSerializer
from statekit.spark.routing import key_bytes, key_group, routable, route, route_values
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark

KEYS = KeySerializer(GenericSerializer())
#: integers on every msgpack encoding boundary, both sides
INTS = sorted({s * b + d for b in (0, 31, 32, 127, 128, 255, 256, 32767, 32768, 65535, 65536,
                                   2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62)
               for d in (-1, 0, 1) for s in (1, -1)} | {2**63 - 1, -(2**63)})
#: strings and binaries whose byte lengths cross the fix / 8 / 16 / 32-bit headers
LENGTHS = [0, 1, 31, 32, 33, 255, 256, 65535, 65536, 70000]
TEXTS = [None, "é", "日本", "a\u0000b"] + ["x" * n for n in LENGTHS] + ["é" * 16, "é" * 15 + "a"]


def _check(df, columns, types, key_of, maxp=128):
    rows = df.select(*columns, key_bytes(columns, types).alias("kb"),
                     key_group(columns, types, maxp).alias("kg")).collect()
    assert rows
    for row in rows:
        key = key_of(row)
        expected_bytes = KEYS.serialize(key)
        assert bytes(row["kb"]) == expected_bytes, key
        assert row["kg"] == key_group_for_bytes(expected_bytes, maxp), key


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.heavy)
                                  for k in ("tinyint", "smallint", "int")] + ["bigint"])
def test_integer_keys_match_statekit_bytes_and_groups(spark, kind):
    bits = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}[kind]
    values = [v for v in INTS if -(2 ** (bits - 1)) <= v < 2 ** (bits - 1)] + [None]
    df = spark.createDataFrame([(v,) for v in values], f"k {kind}")
    _check(df, ["k"], [kind], lambda r: r["k"])


def test_string_binary_and_boolean_keys_match(spark):
    df = spark.createDataFrame([(t,) for t in TEXTS], "k string")
    _check(df, ["k"], ["string"], lambda r: r["k"])
    blobs = [None] + [bytes(range(256))[: n % 256] * (n // 256 + 1) for n in LENGTHS]
    blobs = [None if b is None else b[:n] for b, n in zip(blobs, [0, *LENGTHS], strict=True)]
    df = spark.createDataFrame([(b,) for b in blobs], "k binary")
    _check(df, ["k"], ["binary"], lambda r: None if r["k"] is None else bytes(r["k"]))
    df = spark.createDataFrame([(True,), (False,), (None,)], "k boolean")
    _check(df, ["k"], ["boolean"], lambda r: r["k"])


def test_several_key_columns_are_a_tuple(spark):
    """A tuple is statekit's extension type: its header depends on the payload's length (fix
    1/2/4/8/16 bytes, then 8-, 16- and 32-bit lengths)."""
    rows = [(s, i) for s in [None, "", "a", "abc", "x" * 5, "x" * 13, "x" * 300, "y" * 70000]
            for i in [None, 0, 5, -1, 200, 2**40]]
    df = spark.createDataFrame(rows, "s string, i bigint")
    _check(df, ["s", "i"], ["string", "bigint"], lambda r: (r["s"], r["i"]))
    flags = spark.createDataFrame([(1, True, b"\x00"), (2, False, None)], "a int, f boolean, b binary")
    _check(flags, ["a", "f", "b"], ["int", "boolean", "binary"],
           lambda r: (r["a"], r["f"], None if r["b"] is None else bytes(r["b"])))


@pytest.mark.parametrize("partitions", [1, 3, pytest.param(8, marks=pytest.mark.heavy), 128])
def test_each_row_lands_in_the_partition_owning_its_key_group(spark, partitions):
    df = spark.createDataFrame([(f"user-{i}", i) for i in range(2000)], "u string, n int")
    placed = (df.withColumn("r", route(["u"], ["string"], partitions, 128))
              .repartition(partitions, "r")
              .select("u", F.spark_partition_id().alias("p")).collect())
    for user, partition in placed:
        group = key_group_for_bytes(KEYS.serialize(user), 128)
        assert operator_index_for_key_group(128, partitions, group) == partition
    assert len(route_values(partitions)) == partitions


def test_what_routes_by_key_group():
    assert routable(["string", "bigint"], 8, 128)
    assert not routable(["double"], 8, 128)  # Spark's hash partitioning instead
    assert not routable(["string"], 200, 128)  # more partitions than key groups
    assert routable(["string"], 128, 128)


def _versions(checkpoint):
    """The metadata of every committed version of every partition of the query's operator."""
    out = []
    for where in sorted(Path(checkpoint).rglob("p[0-9][0-9][0-9][0-9][0-9]")):
        access = CheckpointStorageAccess(LocalBlobStore(str(where)), str(where), 0)
        out += [access.load(v) for v in access.completed()]
    return out


@pytest.mark.parametrize("backend", ["hashmap", pytest.param("rocksdb", marks=pytest.mark.heavy)])
def test_a_rescale_reads_only_the_old_partitions_holding_its_key_groups(spark, tmp_path, backend):
    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    frames = [write_inputs(inputs, 0, 2)]
    conf = {"state.backend.type": backend}
    for partitions, more in ((4, (2, 1)), (8, (3, 1)), (3, None)):
        run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink, conf,
                       num_partitions=partitions)
        assert sink.final() == expected(pd.concat(frames)), partitions
        if more:
            frames.append(write_inputs(inputs, *more))
    versions = _versions(checkpoint)
    assert versions and all(meta.get("routing") == "key-groups" for meta in versions)
    restores = [meta["restore"] for meta in versions if meta.get("restore", {}).get("rescaled")]
    # 4 -> 8: each new partition reads one old partition; 8 -> 3: the 3 or 4 overlapping ones
    assert sorted(r["sources"] for r in restores) == [1] * 8 + [3, 3, 4]
    # the inspection tools read the run that wrote the batch, not the 8-partition run's leftovers
    view = open_checkpoint(checkpoint)
    assert len(view.partitions) == 3
    counts = view.state("c").to_pandas()
    assert dict(zip(counts["key"], counts["value"], strict=True)) == {
        k: c for k, (c, _) in expected(pd.concat(frames)).items()}


@pytest.mark.heavy
def test_a_query_moves_between_hash_and_key_group_routing_with_its_state_exact(spark, tmp_path):
    """More partitions than key groups route by Spark's hash (every partition holds keys of
    every group); at most as many, by key group; each change is a rescale, both ways."""
    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    frames = [write_inputs(inputs, 0, 2)]
    conf = {"pipeline.max-parallelism": 4}
    plan = ((8, None), (4, "key-groups"), (3, "key-groups"), (6, None))
    for n, (partitions, routing) in enumerate(plan):
        run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink, conf,
                       num_partitions=partitions)
        assert sink.final() == expected(pd.concat(frames)), partitions
        newest = max((m for m in _versions(checkpoint)), key=lambda m: m["batch"])
        assert newest.get("routing") == routing and newest["num_partitions"] == partitions
        frames.append(write_inputs(inputs, 2 + n, 1))


def test_an_empty_batch_commits_every_partition(spark, tmp_path):
    """Spark skips the partitions of an empty shuffle when nothing follows it but a projection;
    every partition must still commit the batch, or the next one finds its state missing."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    os.makedirs(inputs)
    empty = pa.table({"key": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    pq.write_table(empty, f"{inputs}/part-0000.parquet")
    os.utime(f"{inputs}/part-0000.parquet", (999_999, 999_999))
    run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                   num_partitions=3)
    assert sorted((m["batch"], m["partition"]) for m in _versions(checkpoint)) == [
        (0, 0), (0, 1), (0, 2)]
    frame = write_inputs(inputs, 1, 2)
    run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                   num_partitions=3)
    assert sink.final() == expected(frame)
