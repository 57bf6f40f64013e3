# ruff: noqa: UP031, SIM108 -- the user functions are Spark's own, kept as Spark writes them
"""Spark's ``applyInPandasWithState`` tests (python/pyspark/sql/tests/pandas/
test_pandas_grouped_map_with_state.py), ported case by case: the functions and expected results
as Spark's tests define them, only the switch added (the ``backend`` fixture: ``enable(spark)``
and the backend flag).  Every case runs on both backends; the default run has the basic,
more-data and null cases, the rest are marked slow.

Differences from Spark's file: the session has 2 shuffle partitions instead of 5 (a cost on two
cores; no case depends on the count); the random-worker-failure case is marked slow.
"""

import random
import shutil
import string
import sys
import tempfile

import pandas as pd
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, Row, StringType, StructField, StructType
from pyspark.testing.utils import eventually

pytestmark = pytest.mark.spark


def _test_apply_in_pandas_with_state_basic(spark, func, check_results):
    input_path = tempfile.mkdtemp()

    def prepare_test_resource():
        with open(input_path + "/text-test.txt", "w") as fw:
            fw.write("hello\n")
            fw.write("this\n")

    prepare_test_resource()

    df = spark.readStream.format("text").load(input_path)

    for q in spark.streams.active:
        q.stop()
    assert df.isStreaming

    output_type = StructType(
        [StructField("key", StringType()), StructField("countAsString", StringType())]
    )
    state_type = StructType([StructField("c", LongType())])

    q = (
        df.groupBy(df["value"])
        .applyInPandasWithState(
            func, output_type, state_type, "Update", GroupStateTimeout.NoTimeout
        )
        .writeStream.queryName("this_query")
        .foreachBatch(check_results)
        .outputMode("update")
        .start()
    )

    try:
        assert q.name == "this_query"
        assert q.isActive
        q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
        shutil.rmtree(input_path, ignore_errors=True)


def test_apply_in_pandas_with_state_basic(spark, backend):
    def func(key, pdf_iter, state):
        assert isinstance(state, GroupState)

        total_len = 0
        for pdf in pdf_iter:
            total_len += len(pdf)

        state.update((total_len,))
        assert state.get[0] == 1
        yield pd.DataFrame({"key": [key[0]], "countAsString": [str(total_len)]})

    def check_results(batch_df, _):
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="1"),
            Row(key="this", countAsString="1"),
        }

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


@pytest.mark.slow
def test_apply_in_pandas_with_state_basic_no_state(spark, backend):
    def func(key, pdf_iter, state):
        assert isinstance(state, GroupState)
        # 2 data rows
        yield pd.DataFrame({"key": [key[0], "foo"], "countAsString": ["100", "222"]})

    def check_results(batch_df, _):
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="100"),
            Row(key="this", countAsString="100"),
            Row(key="foo", countAsString="222"),
        }

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


@pytest.mark.slow
def test_apply_in_pandas_with_state_basic_no_state_no_data(spark, backend):
    def func(key, pdf_iter, state):
        assert isinstance(state, GroupState)
        # 2 data rows
        yield pd.DataFrame({"key": [], "countAsString": []})

    def check_results(batch_df, _):
        assert len(set(batch_df.sort("key").collect())) == 0

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


def test_apply_in_pandas_with_state_basic_more_data(spark, backend):
    # Test data rows returned are more or fewer than state.
    def func(key, pdf_iter, state):
        state.update((1,))
        assert isinstance(state, GroupState)
        # 3 rows
        yield pd.DataFrame(
            {"key": [key[0], "foo", key[0] + "_2"], "countAsString": ["1", "666", "2"]}
        )

    def check_results(batch_df, _):
        assert set(batch_df.sort("key").collect()) == {
            Row(key="hello", countAsString="1"),
            Row(key="foo", countAsString="666"),
            Row(key="hello_2", countAsString="2"),
            Row(key="this", countAsString="1"),
            Row(key="this_2", countAsString="2"),
        }

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


@pytest.mark.slow
def test_apply_in_pandas_with_state_basic_fewer_data(spark, backend):
    # Test data rows returned are more or fewer than state.
    def func(key, pdf_iter, state):
        state.update((1,))
        assert isinstance(state, GroupState)
        yield pd.DataFrame({"key": [], "countAsString": []})

    def check_results(batch_df, _):
        assert len(set(batch_df.sort("key").collect())) == 0

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


def test_apply_in_pandas_with_state_basic_with_null(spark, backend):
    def func(key, pdf_iter, state):
        assert isinstance(state, GroupState)

        total_len = 0
        for pdf in pdf_iter:
            total_len += len(pdf)

        state.update((total_len,))
        assert state.get[0] == 1
        yield pd.DataFrame({"key": [None], "countAsString": [str(total_len)]})

    def check_results(batch_df, _):
        assert set(batch_df.sort("key").collect()) == {Row(key=None, countAsString="1")}

    _test_apply_in_pandas_with_state_basic(spark, func, check_results)


@pytest.mark.slow
def test_apply_in_pandas_with_state_python_worker_random_failure(spark, backend):
    input_path = tempfile.mkdtemp()
    output_path = tempfile.mkdtemp()
    checkpoint_loc = tempfile.mkdtemp()

    shutil.rmtree(output_path)
    shutil.rmtree(checkpoint_loc)

    def prepare_test_resource():
        data_range = list(string.ascii_lowercase)
        for i in range(5):
            picked_data = [
                data_range[random.randrange(0, len(data_range) - 1)] for x in range(100)
            ]

            with open(input_path + "/part-%i.txt" % i, "w") as fw:
                for data in picked_data:
                    fw.write(data + "\n")

    def run_query():
        df = (
            spark.readStream.format("text")
            .option("maxFilesPerTrigger", "1")
            .load(input_path)
        )

        for q in spark.streams.active:
            q.stop()
        assert df.isStreaming

        output_type = StructType(
            [StructField("value", StringType()), StructField("count", LongType())]
        )
        state_type = StructType([StructField("cnt", LongType())])

        def func(key, pdf_iter, state):
            assert isinstance(state, GroupState)

            # user function call will happen at most 26 times
            # should be huge enough to not trigger kill in every batches
            # but should be also reasonable to trigger kill multiple times across batches
            if random.randrange(30) == 1:
                sys.exit(1)

            count = state.getOption
            if count is None:
                count = 0
            else:
                count = count[0]

            for pdf in pdf_iter:
                count += len(pdf)

            state.update((count,))
            yield pd.DataFrame({"value": [key[0]], "count": [count]})

        query = (
            df.groupBy(df["value"])
            .applyInPandasWithState(
                func, output_type, state_type, "Append", GroupStateTimeout.NoTimeout
            )
            .writeStream.queryName("this_query")
            .format("json")
            .outputMode("append")
            .option("path", output_path)
            .option("checkpointLocation", checkpoint_loc)
            .start()
        )

        return query

    prepare_test_resource()

    expected = (
        spark.read.format("text")
        .load(input_path)
        .groupBy("value")
        .count()
        .sort("value")
        .collect()
    )

    q = run_query()
    assert q.name == "this_query"
    assert q.isActive

    def assert_test():
        nonlocal q
        if not q.isActive:
            print("query has been terminated, rerunning query...")

            # rerunning query as the query may have been killed by killed python worker
            q = run_query()

            assert q.name == "this_query"
            assert q.isActive

        curr_status = q.status
        if not curr_status["isDataAvailable"] and not curr_status["isTriggerActive"]:
            # The query is active but not running due to no further data available
            # Check the output now.
            result = (
                spark.read.schema("value string, count int")
                .format("json")
                .load(output_path)
                .groupBy("value")
                .max("count")
                .selectExpr("value", "`max(count)` AS count")
                .sort("value")
                .collect()
            )

            return result == expected
        else:
            # still processing the data, defer checking the output.
            return False

    try:
        eventually(timeout=600)(assert_test)()
    finally:
        q.stop()
        for path in (input_path, output_path, checkpoint_loc):
            shutil.rmtree(path, ignore_errors=True)
