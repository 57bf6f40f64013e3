"""Rescaling stateful queries, which Spark itself cannot do: a new partition count, a flipped
backend flag, a new query from another query's state; each new partition restores exactly the
keys Spark now routes to it, from several old partitions.  Results must equal pandas."""

import datetime as dt

import pandas as pd
import pytest
from pyspark.sql import functions as F

from statekit.spark.partitioning import SparkPartitioner, spark_hash
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark

FLIP = {"hashmap": "rocksdb", "rocksdb": "hashmap"}


def test_python_partitioner_matches_spark(spark):
    rows = [(f"k{i}-é", i, i * 7_000_000_000, i / 3, i % 2 == 0, bytes([i, 200, 3]),
             dt.date(2020, 1, 1 + i % 28), dt.datetime(2024, 5, 1, i % 24, tzinfo=dt.UTC))
            for i in range(200)]
    df = spark.createDataFrame(rows, "s string, i int, l long, d double, b boolean, x binary, "
                                     "dt date, ts timestamp")
    cols = df.columns
    types = [f.dataType.simpleString() for f in df.schema.fields]
    got = df.select(*cols, F.hash(*cols).alias("h"), *[F.hash(c).alias(f"h_{c}") for c in cols]
                    ).collect()
    for row in got:
        assert spark_hash(list(row[:8]), types) == row["h"]
        for c, t in zip(cols, types, strict=True):
            assert spark_hash([row[c]], [t]) == row[f"h_{c}"], c
    for n in (3, 4):
        placed = (df.select("s", "i").repartition(n, "s", "i")
                  .select("s", "i", F.spark_partition_id().alias("p")).collect())
        owner = SparkPartitioner(["string", "int"], n).owner
        assert all(owner((s, i)) == p for s, i, p in placed)


@pytest.mark.parametrize("backend", ["hashmap", pytest.param("rocksdb", marks=pytest.mark.heavy)])
def test_foreach_batch_4_to_2_to_3_partitions_with_the_backend_flipped(spark, tmp_path, backend):
    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    frames = [write_inputs(inputs, 0, 2)]
    conf = {"state.backend.type": backend}
    more = {4: (2, 1), 2: (3, 2), 3: (5, 2)}  # after each run: the next files arrive
    for partitions, flag in ((4, backend), (2, backend), (3, FLIP[backend])):
        run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                       {**conf, "state.backend.type": flag}, num_partitions=partitions)
        assert sink.final() == expected(pd.concat(frames)), (partitions, flag)
        frames.append(write_inputs(inputs, *more[partitions]))
    run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                   {"state.backend.type": FLIP[backend]}, num_partitions=3)
    assert sink.final() == expected(pd.concat(frames))
    assert sum(len(r) for r in sink.by_batch.values()) == sum(len(f) for f in frames)


def test_shuffle_partitions_changed_under_foreach_batch(spark, tmp_path):
    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    frame = write_inputs(inputs, 0, 2)
    run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                   num_partitions=None)
    frame2 = write_inputs(inputs, 2, 2)
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        run_until_done(spark, "foreach_batch", RunningCount(), inputs, checkpoint, sink,
                       num_partitions=None)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert sink.final() == expected(pd.concat([frame, frame2]))


@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state",
                                     "apply_in_pandas_with_state"])
def test_a_new_query_starts_from_another_querys_state(spark, tmp_path, adapter):
    inputs, sink = str(tmp_path / "in"), Outputs()
    frame = write_inputs(inputs, 0, 2)
    run_until_done(spark, "foreach_batch", RunningCount(), inputs, str(tmp_path / "a"), sink,
                   {"state.backend.type": "rocksdb"}, num_partitions=4)
    operator = next((tmp_path / "a" / "statekit").glob("*/RunningCount"))
    # query b reads only new files, from a state that already counted the old ones
    new_inputs = str(tmp_path / "in2")
    frame2 = write_inputs(new_inputs, 2, 2)
    run_until_done(spark, adapter, RunningCount(), new_inputs, str(tmp_path / "b"), sink,
                   {"state.backend.type": "hashmap", "execution.savepoint.path": str(operator)},
                   num_partitions=3)
    assert sink.final() == expected(pd.concat([frame, frame2]))
