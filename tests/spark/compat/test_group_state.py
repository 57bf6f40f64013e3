"""``GroupState`` on statekit: Spark's rules and errors for misuse (typed), and timeouts on
statekit's timer queues with Spark's semantics, checked against Spark itself on the same input."""

import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PySparkRuntimeError, PySparkTypeError, PySparkValueError
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import LongType, StructField, StructType

from statekit.errors import ConfigError, StateError, StateTypeError
from statekit.spark.compat import apply_in_pandas_with_state
from statekit.spark.compat.group_state import _group_state_class

STATE = StructType([StructField("c", LongType())])
S = 1000


def group_state(timeout="NoTimeout", value=None, watermark=-1, present=False, now=5000):
    cls = _group_state_class()
    return cls(optionalValue=value, batchProcessingTimeMs=now, eventTimeWatermarkMs=watermark,
               timeoutConf=timeout, hasTimedOut=False, watermarkPresent=present,
               defined=value is not None, updated=False, removed=False, timeoutTimestamp=-1,
               keyAsUnsafe=b"", valueSchema=STATE)


@pytest.mark.parametrize(("call", "spark_class", "condition"), [
    (lambda s: s.setTimeoutDuration(10), PySparkRuntimeError, "CANNOT_WITHOUT"),
    (lambda s: s.setTimeoutTimestamp(10), PySparkRuntimeError, "CANNOT_WITHOUT"),
    (lambda s: s.get, PySparkValueError, "STATE_NOT_EXISTS"),
    (lambda s: s.update(None), PySparkTypeError, "CANNOT_BE_NONE"),
    (lambda s: s.getCurrentWatermarkMs(), PySparkRuntimeError, "CANNOT_WITHOUT"),
])
def test_misuse_raises_sparks_error_typed(call, spark_class, condition):
    state = group_state()
    assert isinstance(state, GroupState)
    with pytest.raises(spark_class) as caught:
        call(state)
    assert isinstance(caught.value, StateError)
    assert caught.value.getCondition() == condition
    if spark_class is PySparkTypeError:
        assert isinstance(caught.value, StateTypeError)


def test_timeout_rules_are_sparks():
    state = group_state("ProcessingTimeTimeout")
    with pytest.raises(PySparkValueError, match="VALUE_NOT_POSITIVE") as caught:
        state.setTimeoutDuration(0)
    assert isinstance(caught.value, StateError)
    state.setTimeoutDuration(250)
    assert state._timeout_timestamp == 5250  # the batch's processing time plus the duration
    event = group_state("EventTimeTimeout", watermark=7000, present=True)
    with pytest.raises(PySparkValueError, match="INVALID_TIMEOUT_TIMESTAMP"):
        event.setTimeoutTimestamp(6999)
    event.setTimeoutTimestamp(7000)
    assert event.getCurrentWatermarkMs() == 7000
    assert group_state(value=(3,)).get == (3,)
    assert group_state().getOption is None


# --- on Spark ---------------------------------------------------------------------------------


def write(directory, n, rows):
    os.makedirs(directory, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["key", "ts"])
    frame["ts"] = pd.to_datetime(frame["ts"], unit="s", utc=True)
    path = f"{directory}/part-{n:04d}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, coerce_timestamps="us")
    os.utime(path, (1_000_000 + n, 1_000_000 + n))


def expiring(key, pdf_iter, state):
    """Counts a key's rows; its timeout is its latest event time; a timed-out key says so and
    forgets its count."""
    if state.hasTimedOut:
        state.remove()
        yield pd.DataFrame({"key": [key[0]], "what": ["timeout"],
                            "n": [state.oldTimeoutTimestamp]})
        return
    count, latest = state.getOption or (0,), 0
    count = count[0]
    for pdf in pdf_iter:
        count += len(pdf)
        latest = max(latest, int(pdf["ts"].max().timestamp() * 1000))
    state.update((count,))
    state.setTimeoutTimestamp(latest)
    yield pd.DataFrame({"key": [key[0]], "what": ["count"], "n": [count]})


def run_event_time(spark, input_dir, checkpoint):
    by_batch = {}

    def sink(df, batch_id):
        by_batch[batch_id] = sorted(tuple(r) for r in df.collect())

    q = (spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1)
         .parquet(input_dir).withWatermark("ts", "10 seconds").groupBy("key")
         .applyInPandasWithState(expiring, "key string, what string, n long", STATE, "update",
                                 GroupStateTimeout.EventTimeTimeout)
         .writeStream.foreachBatch(sink).outputMode("update")
         .option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination(600)
    assert q.exception() is None
    return by_batch


def test_event_time_timeouts_as_spark(spark, backend, tmp_path):
    """Spark's own applyInPandasWithState and the switched one give the same rows per batch:
    a key times out in the first batch whose watermark is past its timeout, never in a batch
    where it has input, and its state is gone after."""
    inputs = str(tmp_path / "in")
    write(inputs, 0, [("a", 100), ("b", 100)])
    write(inputs, 1, [("a", 130)])
    write(inputs, 2, [("a", 131), ("b", 85)])  # b late (watermark for late rows 90 s): dropped
    write(inputs, 3, [("b", 140)])
    statekit_rows = run_event_time(spark, inputs, str(tmp_path / "cp-statekit"))
    from statekit.spark.compat import disable
    disable(spark)
    spark_rows = run_event_time(spark, inputs, str(tmp_path / "cp-spark"))
    assert statekit_rows == spark_rows
    assert ("b", "timeout", -1) in [r for rows in statekit_rows.values() for r in rows]


@pytest.mark.slow
def test_processing_time_timeout_fires_for_keys_without_input(spark, backend, tmp_path):
    inputs = str(tmp_path / "in")
    write(inputs, 0, [("a", 1), ("b", 1)])
    write(inputs, 1, [("a", 2)])
    seen = {}

    def sink(df, batch_id):
        seen[batch_id] = sorted(tuple(r) for r in df.collect())

    def func(key, pdf_iter, state):
        if state.hasTimedOut:
            state.remove()
            yield pd.DataFrame({"key": [key[0]], "what": ["timeout"], "n": [0]})
            return
        count = (state.getOption or (0,))[0] + sum(len(pdf) for pdf in pdf_iter)
        state.update((count,))
        state.setTimeoutDuration(1)
        yield pd.DataFrame({"key": [key[0]], "what": ["count"], "n": [count]})

    q = (spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1)
         .parquet(inputs).groupBy("key")
         .applyInPandasWithState(func, "key string, what string, n long", STATE, "update",
                                 GroupStateTimeout.ProcessingTimeTimeout)
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(processingTime="1 second").start())
    try:
        import time
        deadline = time.monotonic() + 600
        while not any(("a", "timeout", 0) in rows for rows in seen.values()):
            assert q.exception() is None and time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        q.stop()
    rows = [r for b in sorted(seen) for r in seen[b]]
    assert rows[:2] == [("a", "count", 1), ("b", "count", 1)]
    # b times out in the batch where a has input (a is counted, not timed out)...
    second = next(seen[b] for b in sorted(seen) if ("a", "count", 2) in seen[b])
    assert ("b", "timeout", 0) in second
    # ... and a once no batch gives it input; every key times out once
    assert rows.count(("a", "timeout", 0)) == rows.count(("b", "timeout", 0)) == 1


def test_bad_arguments_are_refused_at_the_call(spark, backend):
    grouped = spark.readStream.format("rate").load().groupBy("value")
    with pytest.raises(ConfigError, match="timeoutConf"):
        apply_in_pandas_with_state(grouped, expiring, "v long", STATE, "update", "Sometimes")
    with pytest.raises(ConfigError, match="outputMode"):
        apply_in_pandas_with_state(grouped, expiring, "v long", STATE, "upsert", "NoTimeout")
    with pytest.raises(ConfigError, match="watermark"):
        apply_in_pandas_with_state(grouped, expiring, "v long", STATE, "update",
                                   "EventTimeTimeout")
    with pytest.raises(ConfigError):
        apply_in_pandas_with_state(grouped, expiring, "v long", "not a schema !", "update",
                                   "NoTimeout")
