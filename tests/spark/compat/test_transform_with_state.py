# ruff: noqa: B905 -- the input helpers are Spark's own
"""Spark's ``transformWithStateInPandas`` / ``transformWithState`` tests (python/pyspark/sql/tests/
pandas/test_pandas_transform_with_state.py and its helper processors, ported case by case): the
processors as Spark's tests define them (``tws_processors``), the expected results as Spark's
tests assert them, only the switch added (the ``backend`` fixture).  Every case runs on both
backends, with the pandas API and the Row API (as Spark's newest file runs them).  The default
run has one API of the basic and processing-timer cases; the rest are marked slow.

Differences from Spark's file: 2 shuffle partitions instead of 5 (no case depends on the count);
input files are ordered by their modification time instead of sleeping between them.

Left out, and why:

- the state-data-source, state-metadata and custom-metrics cases (they read Spark's state store,
  which holds no state here: statekit's own reader, ``format("statekit")``, reads it instead);
- the schema-evolution cases (they restart a query with a changed processor on Spark's state
  schema files);
- the cases whose processors only Spark's newest helper defines beyond the ones ported here
  (composite types, large values, chunked initial state, top-k, word frequency,
  all-methods); they are the next to port;
- ``deleteIfExists`` of a variable that holds data: statekit deletes the variable for the
  processor (using it raises Spark's error, as the basic case checks) but keeps its stored values;
- the Row API of the TTL-expiration case (see that test).

On a loaded machine Spark's Python workers can miss their start-up deadline ("Python worker
failed to connect back"); that is Spark's worker launch, not a result of a case.
"""

import datetime
import os
import shutil
import tempfile
import time

import pytest
from pyspark.sql.functions import split
from pyspark.sql.types import IntegerType, Row, StringType, StructField, StructType, TimestampType
from pyspark.testing import assertDataFrameEqual

from tests.spark.compat.tws_processors import (
    EventTimeStatefulProcessorFactory,
    InvalidSimpleStatefulProcessorFactory,
    ListStateProcessorFactory,
    MapStateProcessorFactory,
    ProcTimeStatefulProcessorFactory,
    SimpleStatefulProcessorFactory,
    SimpleStatefulProcessorWithInitialStateFactory,
    SimpleTTLStatefulProcessorFactory,
    StatefulProcessorChainingOpsFactory,
    StatefulProcessorWithInitialStateTimersFactory,
    TTLStatefulProcessorFactory,
)

pytestmark = pytest.mark.spark
slow = pytest.mark.slow
API = [pytest.param(True, id="pandas"), pytest.param(False, id="row")]
_FILES = [0]


@pytest.fixture
def tws(spark, backend):
    """Spark's test conf for these cases; ``tws(grouped, use_pandas)`` is the API under test."""
    spark.conf.set("spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch", "2")
    dirs = []

    def method(grouped, use_pandas):
        return grouped.transformWithStateInPandas if use_pandas else grouped.transformWithState

    method.dirs = dirs
    yield method
    for q in spark.streams.active:
        q.stop()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _mkdtemp(tws):
    path = tempfile.mkdtemp()
    tws.dirs.append(path)
    return path


def _prepare_input_data(input_path, col1, col2):
    with open(input_path, "w") as fw:
        for e1, e2 in zip(col1, col2):
            fw.write(f"{e1}, {e2}\n")
    _FILES[0] += 1  # later files are later batches (maxFilesPerTrigger orders by time)
    os.utime(input_path, (1_000_000 + _FILES[0], 1_000_000 + _FILES[0]))


def _prepare_test_resource1(input_path):
    _prepare_input_data(input_path + "/text-test1.txt", [0, 0, 1, 1], [123, 46, 146, 346])


def _prepare_test_resource2(input_path):
    _prepare_input_data(input_path + "/text-test2.txt", [0, 0, 0, 1, 1], [123, 223, 323, 246, 6])


def _prepare_test_resource3(input_path):
    _prepare_input_data(input_path + "/text-test3.txt", [0, 1], [123, 6])


def _build_test_df(spark, input_path):
    df = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(input_path)
    df_split = df.withColumn("split_values", split(df["value"], ","))
    df_final = df_split.select(
        df_split.split_values.getItem(0).alias("id").cast("string"),
        df_split.split_values.getItem(1).alias("temperature").cast("int"),
    )
    return df_final


def _run(q):
    try:
        q.processAllAvailable()
        q.awaitTermination(10)
        assert q.exception() is None
    finally:
        q.stop()


def _test_transform_with_state_basic(spark, tws, stateful_processor, check_results,
                                     single_batch=False, timeMode="None", use_pandas=True):
    input_path = _mkdtemp(tws)
    _prepare_test_resource1(input_path)
    if not single_batch:
        _prepare_test_resource2(input_path)

    df = _build_test_df(spark, input_path)
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("countAsString", StringType(), True),
        ]
    )

    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Update",
            timeMode=timeMode,
        )
        .writeStream.queryName("this_query")
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )
    assert q.name == "this_query"
    assert q.isActive
    _run(q)


@pytest.mark.parametrize("use_pandas", [API[0], pytest.param(False, id="row", marks=slow)])
def test_transform_with_state_basic(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", countAsString="2"),
                Row(id="1", countAsString="2"),
            }
        else:
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", countAsString="3"),
                Row(id="1", countAsString="2"),
            }

    _test_transform_with_state_basic(
        spark, tws, SimpleStatefulProcessorFactory().get(use_pandas), check_results,
        use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_non_exist_value_state(spark, tws, use_pandas):
    def check_results(batch_df, _):
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", countAsString="0"),
            Row(id="1", countAsString="0"),
        }

    _test_transform_with_state_basic(
        spark, tws, InvalidSimpleStatefulProcessorFactory().get(use_pandas), check_results, True,
        use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_query_restarts(spark, tws, use_pandas):
    root_path = _mkdtemp(tws)
    input_path = root_path + "/input"
    os.makedirs(input_path, exist_ok=True)
    checkpoint_path = root_path + "/checkpoint"
    output_path = root_path + "/output"

    _prepare_test_resource1(input_path)

    df = _build_test_df(spark, input_path)
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("countAsString", StringType(), True),
        ]
    )

    base_query = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=SimpleStatefulProcessorFactory().get(use_pandas),
            outputStructType=output_schema,
            outputMode="Update",
            timeMode="None",
        )
        .writeStream.queryName("this_query")
        .format("parquet")
        .outputMode("append")
        .option("checkpointLocation", checkpoint_path)
        .option("path", output_path)
    )
    q = base_query.start()
    assert q.name == "this_query"
    assert q.isActive
    _run(q)

    _prepare_test_resource2(input_path)

    q = base_query.start()
    assert q.name == "this_query"
    assert q.isActive
    _run(q)
    result_df = spark.read.parquet(output_path)
    assert set(result_df.sort("id").collect()) == {
        Row(id="0", countAsString="2"),
        Row(id="0", countAsString="3"),
        Row(id="1", countAsString="2"),
        Row(id="1", countAsString="2"),
    }


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_list_state(spark, tws, use_pandas):
    def check_results(batch_df, _):
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", countAsString="2"),
            Row(id="1", countAsString="2"),
        }

    _test_transform_with_state_basic(
        spark, tws, ListStateProcessorFactory().get(use_pandas), check_results, True,
        use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_map_state(spark, tws, use_pandas):
    def check_results(batch_df, _):
        assert set(batch_df.sort("id").collect()) == {
            Row(id="0", countAsString="2"),
            Row(id="1", countAsString="2"),
        }

    _test_transform_with_state_basic(
        spark, tws, MapStateProcessorFactory().get(use_pandas), check_results, True,
        use_pandas=use_pandas)


# test value state with ttl has the same behavior as value state when
# state doesn't expire.
@slow
@pytest.mark.parametrize("use_pandas", API)
def test_value_state_ttl_basic(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", countAsString="2"),
                Row(id="1", countAsString="2"),
            }
        elif batch_id == 1:
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", countAsString="3"),
                Row(id="1", countAsString="2"),
            }
        else:
            for q in spark.streams.active:
                q.stop()

    _test_transform_with_state_basic(
        spark, tws, SimpleTTLStatefulProcessorFactory().get(use_pandas), check_results, False,
        "processingTime", use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", [API[0]])
def test_value_state_ttl_expiration(spark, tws, use_pandas):
    """Timing-dependent, as Spark's: batch 1 must start within 10 s of batch 0 (it sleeps 6 s in
    batch 0's sink).  The Row API is left out: Spark's RowTTLStatefulProcessor returns
    ``iter(ret)`` after binding ``iter`` only when its list state exists, so it raises
    UnboundLocalError in the first batch on Spark as well.  statekit's TTL boundary itself is
    checked without timing in test_handle.py."""
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assertDataFrameEqual(
                batch_df,
                [
                    Row(id="ttl-count-0", count=1),
                    Row(id="count-0", count=1),
                    Row(id="ttl-list-state-count-0", count=1),
                    Row(id="ttl-map-state-count-0", count=1),
                    Row(id="ttl-count-1", count=1),
                    Row(id="count-1", count=1),
                    Row(id="ttl-list-state-count-1", count=1),
                    Row(id="ttl-map-state-count-1", count=1),
                ],
            )
        elif batch_id == 1:
            assertDataFrameEqual(
                batch_df,
                [
                    Row(id="ttl-count-0", count=2),
                    Row(id="count-0", count=2),
                    Row(id="ttl-list-state-count-0", count=3),
                    Row(id="ttl-map-state-count-0", count=2),
                    Row(id="ttl-count-1", count=2),
                    Row(id="count-1", count=2),
                    Row(id="ttl-list-state-count-1", count=3),
                    Row(id="ttl-map-state-count-1", count=2),
                ],
            )
        elif batch_id == 2:
            # ttl-count-0 expire and restart from count 0.
            # The TTL for value state ttl_count_state gets reset in batch 1 because of the
            # update operation and ttl-count-1 keeps the state.
            # ttl-list-state-count-0 expire and restart from count 0.
            # The TTL for list state ttl_list_state gets reset in batch 1 because of the
            # put operation and ttl-list-state-count-1 keeps the state.
            # non-ttl state never expires
            assertDataFrameEqual(
                batch_df,
                [
                    Row(id="ttl-count-0", count=1),
                    Row(id="count-0", count=3),
                    Row(id="ttl-list-state-count-0", count=1),
                    Row(id="ttl-map-state-count-0", count=1),
                    Row(id="ttl-count-1", count=3),
                    Row(id="count-1", count=3),
                    Row(id="ttl-list-state-count-1", count=7),
                    Row(id="ttl-map-state-count-1", count=3),
                ],
            )
        else:
            for q in spark.streams.active:
                q.stop()
        if batch_id == 0 or batch_id == 1:
            time.sleep(6)

    input_path = _mkdtemp(tws)
    df = _build_test_df(spark, input_path)
    _prepare_input_data(input_path + "/batch1.txt", [1, 0], [0, 0])
    _prepare_input_data(input_path + "/batch2.txt", [1, 0], [0, 0])
    _prepare_input_data(input_path + "/batch3.txt", [1, 0], [0, 0])
    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("count", IntegerType(), True),
        ]
    )

    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=TTLStatefulProcessorFactory().get(use_pandas),
            outputStructType=output_schema,
            outputMode="Update",
            timeMode="processingTime",
        )
        .writeStream.foreachBatch(check_results)
        .outputMode("update")
        .start()
    )
    assert q.isActive
    _run(q)


def _test_transform_with_state_proc_timer(spark, tws, stateful_processor, check_results,
                                          use_pandas):
    input_path = _mkdtemp(tws)
    _prepare_test_resource3(input_path)
    _prepare_test_resource1(input_path)
    _prepare_test_resource2(input_path)

    df = _build_test_df(spark, input_path)
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("countAsString", StringType(), True),
            StructField("timeValues", StringType(), True),
        ]
    )

    query_name = "processing_time_test_query"
    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Update",
            timeMode="processingtime",
        )
        .writeStream.queryName(query_name)
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )

    assert q.name == query_name
    assert q.isActive
    _run(q)


@pytest.mark.parametrize("use_pandas", [pytest.param(True, id="pandas", marks=slow), API[1]])
def test_transform_with_state_proc_timer(spark, tws, use_pandas):
    first = {}

    # helper function to check expired timestamp is smaller than current processing time
    def check_timestamp(batch_df):
        expired_df = (
            batch_df.filter(batch_df["countAsString"] == "-1")
            .select("id", "timeValues")
            .withColumnRenamed("timeValues", "expiredTimestamp")
        )
        count_df = (
            batch_df.filter(batch_df["countAsString"] != "-1")
            .select("id", "timeValues")
            .withColumnRenamed("timeValues", "countStateTimestamp")
        )
        joined_df = expired_df.join(count_df, on="id")
        for row in joined_df.collect():
            assert row["expiredTimestamp"] < row["countStateTimestamp"]

    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assert set(batch_df.sort("id").select("id", "countAsString").collect()) == {
                Row(id="0", countAsString="1"),
                Row(id="1", countAsString="1"),
            }
        elif batch_id == 1:
            # for key 0, the accumulated count is emitted before the count state is cleared
            # during the timer process
            assert set(batch_df.sort("id").select("id", "countAsString").collect()) == {
                Row(id="0", countAsString="3"),
                Row(id="0", countAsString="-1"),
                Row(id="1", countAsString="3"),
            }
            first["expired"] = batch_df.filter(
                batch_df["countAsString"] == -1
            ).first()["timeValues"]
            check_timestamp(batch_df)

        elif batch_id == 2:
            assert set(batch_df.sort("id").select("id", "countAsString").collect()) == {
                Row(id="0", countAsString="3"),
                Row(id="0", countAsString="-1"),
                Row(id="1", countAsString="5"),
            }
            # The expired timestamp in current batch is larger than expiry timestamp in batch 1
            # because this is a new timer registered in batch1 and
            # different from the one registered in batch 0
            current_batch_expired_timestamp = batch_df.filter(
                batch_df["countAsString"] == -1
            ).first()["timeValues"]
            assert current_batch_expired_timestamp > first["expired"]

        else:
            for q in spark.streams.active:
                q.stop()

    _test_transform_with_state_proc_timer(
        spark, tws, ProcTimeStatefulProcessorFactory().get(use_pandas), check_results, use_pandas)


def _test_transform_with_state_event_time(spark, tws, stateful_processor, check_results,
                                          use_pandas):
    import pyspark.sql.functions as f

    input_path = _mkdtemp(tws)

    def prepare_batch1(input_path):
        _prepare_input_data(input_path + "/text-test3.txt", ["a"], [20])

    def prepare_batch2(input_path):
        _prepare_input_data(input_path + "/text-test1.txt", ["a"], [4])

    def prepare_batch3(input_path):
        _prepare_input_data(input_path + "/text-test2.txt", ["a", "a", "a"], [11, 13, 15])

    prepare_batch1(input_path)
    prepare_batch2(input_path)
    prepare_batch3(input_path)

    df = _build_test_df(spark, input_path)
    df = df.select(
        "id", f.from_unixtime(f.col("temperature")).alias("eventTime").cast("timestamp")
    ).withWatermark("eventTime", "10 seconds")
    assert df.isStreaming

    output_schema = StructType(
        [StructField("id", StringType(), True), StructField("timestamp", StringType(), True)]
    )

    query_name = "event_time_test_query"
    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Update",
            timeMode="eventtime",
        )
        .writeStream.queryName(query_name)
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )

    assert q.name == query_name
    assert q.isActive
    _run(q)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_event_time(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            # check timer registered in the same batch is expired
            assert set(batch_df.sort("id").collect()) == {
                Row(id="a", timestamp="20"),
                Row(id="a-expired", timestamp="0"),
            }
        elif batch_id == 1:
            # value state is cleared in batch 0, so timestamp=4 is returned here
            assert set(batch_df.sort("id").collect()) == {
                Row(id="a", timestamp="4"),
                Row(id="a-expired", timestamp="10000"),
            }
        elif batch_id == 2:
            # event time is still 20-10=10, so we will see expired row with timestamp=10s
            assert set(batch_df.sort("id").collect()) == {
                Row(id="a", timestamp="15"),
                Row(id="a-expired", timestamp="10000"),
            }
        else:
            for q in spark.streams.active:
                q.stop()

    _test_transform_with_state_event_time(
        spark, tws, EventTimeStatefulProcessorFactory().get(use_pandas), check_results,
        use_pandas)


def _test_transform_with_state_init_state(spark, tws, stateful_processor, check_results,
                                          time_mode="None", use_pandas=True):
    input_path = _mkdtemp(tws)
    _prepare_test_resource1(input_path)
    _prepare_input_data(input_path + "/text-test2.txt", [0, 3], [67, 12])

    df = _build_test_df(spark, input_path)
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("value", StringType(), True),
        ]
    )

    data = [("0", 789), ("3", 987)]
    initial_state = spark.createDataFrame(data, "id string, initVal int").groupBy("id")

    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Update",
            timeMode=time_mode,
            initialState=initial_state,
        )
        .writeStream.queryName("this_query")
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )

    assert q.name == "this_query"
    assert q.isActive
    _run(q)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_init_state(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            # for key 0, initial state was processed and it was only processed once;
            # for key 1, it did not appear in the initial state df;
            # for key 3, it did not appear in the first batch of input keys
            # so it won't be emitted
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46)),
                Row(id="1", value=str(146 + 346)),
            }
        else:
            # for key 0, verify initial state was only processed once in the first batch;
            # for key 3, verify init state was processed and reflected in the accumulated value
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46 + 67)),
                Row(id="3", value=str(987 + 12)),
            }

    _test_transform_with_state_init_state(
        spark, tws, SimpleStatefulProcessorWithInitialStateFactory().get(use_pandas),
        check_results, use_pandas=use_pandas)


def _prepare_input_data_with_3_cols(input_path, col1, col2, col3):
    with open(input_path, "w") as fw:
        for e1, e2, e3 in zip(col1, col2, col3):
            fw.write(f"{e1},{e2},{e3}\n")


def _build_test_df_with_3_cols(spark, input_path):
    df = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(input_path)
    df_split = df.withColumn("split_values", split(df["value"], ","))
    df_final = df_split.select(
        df_split.split_values.getItem(0).alias("id1").cast("string"),
        df_split.split_values.getItem(1).alias("temperature").cast("int"),
        df_split.split_values.getItem(2).alias("id2").cast("string"),
    )
    return df_final


def _test_transform_with_state_non_contiguous_grouping_cols(
        spark, tws, stateful_processor, check_results, initial_state=None, use_pandas=True):
    input_path = _mkdtemp(tws)
    _prepare_input_data_with_3_cols(
        input_path + "/text-test1.txt", [0, 0, 1, 1], [123, 46, 146, 346], [1, 1, 2, 2]
    )

    df = _build_test_df_with_3_cols(spark, input_path)
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id1", StringType(), True),
            StructField("id2", StringType(), True),
            StructField("value", StringType(), True),
        ]
    )

    q = (
        tws(df.groupBy("id1", "id2"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Update",
            timeMode="None",
            initialState=initial_state,
        )
        .writeStream.queryName("this_query")
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )

    assert q.name == "this_query"
    assert q.isActive
    _run(q)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_non_contiguous_grouping_cols(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assert set(batch_df.collect()) == {
                Row(id1="0", id2="1", value=str(123 + 46)),
                Row(id1="1", id2="2", value=str(146 + 346)),
            }
        else:
            for q in spark.streams.active:
                q.stop()

    _test_transform_with_state_non_contiguous_grouping_cols(
        spark, tws, SimpleStatefulProcessorWithInitialStateFactory().get(use_pandas),
        check_results, use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_non_contiguous_grouping_cols_with_init_state(spark, tws,
                                                                          use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            # initial state for key (0, 1) is processed
            assert set(batch_df.collect()) == {
                Row(id1="0", id2="1", value=str(789 + 123 + 46)),
                Row(id1="1", id2="2", value=str(146 + 346)),
            }
        else:
            for q in spark.streams.active:
                q.stop()

    # grouping key of initial state is also not starting from the beginning of attributes
    data = [(789, "0", "1"), (987, "3", "2")]
    initial_state = spark.createDataFrame(
        data, "initVal int, id1 string, id2 string"
    ).groupBy("id1", "id2")

    _test_transform_with_state_non_contiguous_grouping_cols(
        spark, tws, SimpleStatefulProcessorWithInitialStateFactory().get(use_pandas),
        check_results, initial_state, use_pandas=use_pandas)


def _test_transform_with_state_chaining_ops(spark, tws, stateful_processor, check_results,
                                            timeMode="None", grouping_cols=("outputTimestamp",),
                                            use_pandas=True):
    import pyspark.sql.functions as f

    input_path = _mkdtemp(tws)
    _prepare_input_data(input_path + "/text-test3.txt", ["a", "b"], [10, 15])
    _prepare_input_data(input_path + "/text-test4.txt", ["a", "c"], [11, 25])
    _prepare_input_data(input_path + "/text-test1.txt", ["a"], [5])

    df = _build_test_df(spark, input_path)
    df = df.select(
        "id", f.from_unixtime(f.col("temperature")).alias("eventTime").cast("timestamp")
    ).withWatermark("eventTime", "5 seconds")
    assert df.isStreaming

    output_schema = StructType(
        [
            StructField("id", StringType(), True),
            StructField("outputTimestamp", TimestampType(), True),
        ]
    )

    q = (
        tws(df.groupBy("id"), use_pandas)(
            statefulProcessor=stateful_processor,
            outputStructType=output_schema,
            outputMode="Append",
            timeMode=timeMode,
            eventTimeColumnName="outputTimestamp",
        )
        .groupBy(list(grouping_cols))
        .count()
        .writeStream.queryName("chaining_ops_query")
        .foreachBatch(check_results)
        .outputMode("append")
        .start()
    )

    assert q.name == "chaining_ops_query"
    assert q.isActive
    _run(q)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_chaining_ops(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            assert batch_df.isEmpty()
        elif batch_id == 1:
            # eviction watermark = 15 - 5 = 10 (max event time from batch 0),
            # late event watermark = 0 (eviction event time from batch 0)
            assert set(
                batch_df.sort("outputTimestamp").select("outputTimestamp", "count").collect()
            ) == {
                Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 10), count=1),
            }
        elif batch_id == 2:
            # eviction watermark = 25 - 5 = 20, late event watermark = 10;
            # row with watermark=5<10 is dropped so it does not show up in the results;
            # row with eventTime<=20 are finalized and emitted
            assert set(
                batch_df.sort("outputTimestamp").select("outputTimestamp", "count").collect()
            ) == {
                Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 11), count=1),
                Row(outputTimestamp=datetime.datetime(1970, 1, 1, 0, 0, 15), count=1),
            }

    _test_transform_with_state_chaining_ops(
        spark, tws, StatefulProcessorChainingOpsFactory().get(use_pandas), check_results,
        "eventTime", use_pandas=use_pandas)
    _test_transform_with_state_chaining_ops(
        spark, tws, StatefulProcessorChainingOpsFactory().get(use_pandas), check_results,
        "eventTime", ["outputTimestamp", "id"], use_pandas=use_pandas)


@slow
@pytest.mark.parametrize("use_pandas", API)
def test_transform_with_state_init_state_with_timers(spark, tws, use_pandas):
    def check_results(batch_df, batch_id):
        if batch_id == 0:
            # timers are registered and handled in the first batch for
            # rows in initial state; For key=0 and key=3 which contains
            # expired timers, both should be handled by handleExpiredTimers
            # regardless of whether key exists in the data rows or not
            expired_df = batch_df.filter(batch_df["id"].contains("expired"))
            data_df = batch_df.filter(~batch_df["id"].contains("expired"))
            assert set(expired_df.sort("id").select("id").collect()) == {
                Row(id="0-expired"),
                Row(id="3-expired"),
            }
            assert set(data_df.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46)),
                Row(id="1", value=str(146 + 346)),
            }
        elif batch_id == 1:
            # handleInitialState is only processed in the first batch,
            # no more timer is registered so no more expired timers
            assert set(batch_df.sort("id").collect()) == {
                Row(id="0", value=str(789 + 123 + 46 + 67)),
                Row(id="3", value=str(987 + 12)),
            }
        else:
            for q in spark.streams.active:
                q.stop()

    _test_transform_with_state_init_state(
        spark, tws, StatefulProcessorWithInitialStateTimersFactory().get(use_pandas),
        check_results, "processingTime", use_pandas=use_pandas)
