"""Reading state the Spark way: ``format("statekit")`` takes the ``statestore`` reader's option
names with their meanings (a batch, an operator by index, one partition, the registered timers,
a change feed between two batches), and ``format("statekit-metadata")`` lists what a query's
location holds, as Spark's ``state-metadata`` does."""

from __future__ import annotations

import pandas as pd
import pytest

from statekit.errors import ConfigError
from statekit.inspection.changes import _diff
from statekit.spark.datasource import read_options
from statekit.spark.reporting import statekit_error
from tests.spark.conftest import session
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

ROWS = 600  # per batch (one input file each), over 1,500 keys: some keys skip a batch


@pytest.fixture(scope="module", params=["hashmap", pytest.param("rocksdb", marks=pytest.mark.heavy)])
def query(request, tmp_path_factory):
    spark = session()
    root = tmp_path_factory.mktemp(f"reader-{request.param}")
    frame = write_inputs(str(root / "in"), 0, 3, rows=ROWS, keys=1500)
    checkpoint = str(root / "query")
    run_until_done(spark, "foreach_batch", RunningCount(), str(root / "in"), checkpoint, Outputs(),
                   {"state.backend.type": request.param})
    return checkpoint, frame


def counts(frame: pd.DataFrame) -> dict[str, int]:
    return {k: int(v) for k, v in zip(frame["key"], frame["value"], strict=True)}


def through(frame: pd.DataFrame, batch: int) -> dict[str, int]:
    return {k: c for k, (c, _) in expected(frame.iloc[: ROWS * (batch + 1)]).items()}


@pytest.mark.spark
def test_spark_option_names_read_what_statekit_names_read(spark, query):
    checkpoint, frame = query
    spark_named = (spark.read.format("statekit").option("stateVarName", "c").option("batchId", 1)
                   .option("operatorId", 0).load(checkpoint).toPandas())
    own = (spark.read.format("statekit").option("state", "c").option("batch", 1)
           .option("operator", "RunningCount").load(checkpoint).toPandas())
    assert counts(spark_named) == counts(own) == through(frame, 1)


@pytest.mark.spark
def test_one_partition_of_a_batch(spark, query):
    checkpoint, frame = query
    parts = [counts(spark.read.format("statekit").option("stateVarName", "c")
                    .option("snapshotStartBatchId", 0).option("snapshotPartitionId", p)
                    .option("batchId", 2).load(checkpoint).toPandas()) for p in (0, 1)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    assert {**parts[0], **parts[1]} == through(frame, 2)


@pytest.mark.spark
def test_change_feed_between_two_batches(spark, query):
    checkpoint, frame = query
    feed = (spark.read.format("statekit").option("stateVarName", "c")
            .option("readChangeFeed", "true").option("changeStartBatchId", 1)
            .option("changeEndBatchId", 2).load(checkpoint).toPandas())
    assert list(feed.columns) == ["batch_id", "change_type", "key", "value", "partition_id"]
    assert set(feed["change_type"]) == {"update"}  # a running count never deletes
    for batch in (1, 2):
        before, after = through(frame, batch - 1), through(frame, batch)
        changed = {k: v for k, v in after.items() if before.get(k) != v}
        rows = feed[feed["batch_id"] == batch]
        assert counts(rows) == changed and len(rows) == len(changed)
        assert len(changed) < len(after)  # keys without input in the batch are not in its feed
    assert set(feed["partition_id"]) == {0, 1}


@pytest.mark.spark
def test_state_metadata_lists_operators_and_batches(spark, query):
    checkpoint, _ = query
    meta = spark.read.format("statekit-metadata").load(checkpoint).toPandas()
    assert set(meta["stateName"]) == {"c", "t"}
    assert set(meta["operatorName"]) == {"RunningCount"} and set(meta["operatorId"]) == {0}
    assert set(meta["numPartitions"]) == {2} and set(meta["maxBatchId"]) == {2}
    assert set(meta["minBatchId"]) <= {0, 1, 2}


@pytest.mark.spark
def test_bad_reader_options_are_typed_errors(spark, query):
    checkpoint, _ = query
    for options, words in [({"stateVarName": "c", "batchid": 1, "batch": 2}, "conflicts"),
                           ({"stateVarName": "c", "snapshotPartitionId": 7}, "no partition 7"),
                           ({"stateVarName": "c", "operatorId": 3}, "no operator '3'"),
                           ({"stateVarName": "c", "stateVarNmae": "c"}, "did you mean"),
                           ({"stateVarName": "c", "joinSide": "left"}, "joins")]:
        reader = spark.read.format("statekit")
        for k, v in options.items():
            reader = reader.option(k, v)
        with pytest.raises(Exception) as info:
            reader.load(checkpoint).collect()
        error = statekit_error(info.value)
        assert isinstance(error, ConfigError) and words in str(error), (options, info.value)


def test_option_rules_as_spark_has_them():
    assert read_options({"batchId": "3", "STATEVARNAME": "c", "readRegisteredTimers": "false"}) == {
        "batch": "3", "state": "c", "timers": "false"}
    with pytest.raises(ConfigError, match="snapshotPartitionId"):
        read_options({"snapshotStartBatchId": "1"})
    with pytest.raises(ConfigError, match="changeStartBatchId"):
        read_options({"readChangeFeed": "true"})
    with pytest.raises(ConfigError, match="cannot be combined"):
        read_options({"readChangeFeed": "true", "changeStartBatchId": "1", "batchId": "2"})
    with pytest.raises(ConfigError, match="readChangeFeed"):
        read_options({"changeStartBatchId": "1"})
    with pytest.raises(ConfigError, match="after batchId"):
        read_options({"snapshotStartBatchId": "4", "snapshotPartitionId": "0", "batchId": "2"})


def test_a_feed_deletes_what_went_and_updates_what_changed():
    row = lambda k, v: {"key": k, "value": v}  # noqa: E731
    before = {(0, "['a']"): (row("a", 1),), (0, "['b']"): (row("b", 1),), (1, "['c']"): (row("c", 5),)}
    now = {(0, "['a']"): (row("a", 2),), (1, "['c']"): (row("c", 5),), (1, "['d']"): (row("d", 1),)}
    out = list(_diff(before, now, 4, ["key", "value"], ["key"]))
    assert sorted((r["change_type"], r["key"], r["value"], r["partition_id"]) for r in out) == [
        ("delete", "b", None, 0), ("update", "a", 2, 0), ("update", "d", 1, 1)]
    assert {r["batch_id"] for r in out} == {4}
