"""Window functions on Spark through ``foreach_batch``: ``Windows.of(assigner)...process(f)`` is
the window operator as a keyed function; event time from ``event_time_column``, windows fire in
the first micro-batch whose watermark passes their end, state in either backend."""

from __future__ import annotations

import pytest

from statekit.runtime.windows import ProcessWindowFunction, TumblingEventTimeWindows, Windows
from statekit.spark import foreach_batch
from tests.spark.test_timers import S, Sink, wait_for, write

pytestmark = pytest.mark.spark

OUTPUT = "key string, start long, end long, n long"


class CountPerWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        w = context.window()
        yield key, w.start, w.end, len(list(elements))


def test_tumbling_windows_through_foreach_batch(spark, tmp_path):
    """Both backends' queries at once (one Spark session), each over its own input."""
    batches = [[("a", 1 * S), ("a", 2 * S), ("b", 3 * S)], [("a", 12 * S), ("b", 15 * S)],
               [("c", 100 * S)], [("c", 200 * S)]]
    windows = Windows.of(TumblingEventTimeWindows.of(10 * S)).process(CountPerWindow())
    sinks, queries = {}, {}
    for backend in ("hashmap", "rocksdb"):
        inputs = str(tmp_path / f"in-{backend}")
        for n, rows in enumerate(batches):
            write(inputs, n, rows)
        sinks[backend] = Sink()
        queries[backend] = (
            spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1)
            .parquet(inputs).writeStream.foreachBatch(foreach_batch(
                windows, "key", OUTPUT, sinks[backend], event_time_column="ts",
                conf={"state.backend.type": backend}, operator_id=f"windows-{backend}"))
            .option("checkpointLocation", str(tmp_path / f"cp-{backend}"))
            .trigger(availableNow=True).start())
    for backend, query in queries.items():
        wait_for(lambda q=query: not q.isActive or q.exception(), f"{backend}'s query")
        query.awaitTermination()
        assert query.exception() is None, backend
        # batch 2's watermark (15 s, the largest time before it) ends the first windows, batch
        # 3's (100 s) the second ones; c's windows stay open (no later batch moves the watermark)
        assert {b: sorted(rows) for b, rows in sinks[backend].by_batch.items() if rows} == {
            2: [("a", 0, 10 * S, 2), ("b", 0, 10 * S, 1)],
            3: [("a", 10 * S, 20 * S, 1), ("b", 10 * S, 20 * S, 1)]}, backend


def test_tumbling_windows_through_transform_with_state(spark, tmp_path):
    """The same window function through ``transform_with_state`` (event time from Spark's
    watermark, ``withWatermark("ts", "5 seconds")``): every window fires once, when Spark's
    watermark passes its end."""
    from statekit.spark import transform_with_state

    batches = [[("a", 1 * S), ("a", 2 * S), ("b", 3 * S)], [("a", 12 * S), ("b", 15 * S)],
               [("c", 100 * S)], [("c", 200 * S)]]
    inputs = str(tmp_path / "in")
    for n, rows in enumerate(batches):
        write(inputs, n, rows)
    sink = Sink()
    grouped = (spark.readStream.schema("key string, ts timestamp").option("maxFilesPerTrigger", 1)
               .parquet(inputs).withWatermark("ts", "5 seconds").groupBy("key"))
    windows = Windows.of(TumblingEventTimeWindows.of(10 * S)).process(CountPerWindow())
    query = (transform_with_state(grouped, windows, OUTPUT, event_time_column="ts",
                                  time_mode="EventTime", conf={"state.backend.type": "rocksdb"},
                                  operator_id="windows-tws")
             .writeStream.foreachBatch(sink).outputMode("update")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    wait_for(lambda: not query.isActive or query.exception(), "the query")
    query.awaitTermination()
    assert query.exception() is None
    fired = [row for rows in sink.by_batch.values() for row in rows]
    closed = {("a", 0, 10 * S, 2), ("b", 0, 10 * S, 1), ("a", 10 * S, 20 * S, 1),
              ("b", 10 * S, 20 * S, 1)}
    assert len(fired) == len(set(fired))  # each window once
    # c's first window closes only if Spark runs a batch after the last one's watermark (195 s)
    assert closed <= set(fired) <= closed | {("c", 100 * S, 110 * S, 1)}


def test_a_late_data_side_output_is_refused_at_the_adapter_call(spark, tmp_path):
    """A side output is not a row of a query: a window with ``side_output_late_data`` is refused
    before the query starts, on every adapter, instead of failing a batch when an element is
    late."""
    from statekit import OutputTag
    from statekit.errors import StateError
    from statekit.spark import apply_in_pandas_with_state, transform_with_state

    windows = (Windows.of(TumblingEventTimeWindows.of(10 * S))
               .side_output_late_data(OutputTag("late")).process(CountPerWindow()))
    source = spark.readStream.schema("key string, ts timestamp").parquet(str(tmp_path))
    grouped = source.withWatermark("ts", "5 seconds").groupBy("key")
    calls = [lambda: foreach_batch(windows, "key", OUTPUT, Sink(), event_time_column="ts"),
             lambda: transform_with_state(grouped, windows, OUTPUT, event_time_column="ts",
                                          time_mode="EventTime"),
             lambda: apply_in_pandas_with_state(grouped, windows, OUTPUT, event_time_column="ts",
                                                timeout_conf="EventTimeTimeout")]
    for call in calls:
        with pytest.raises(StateError, match="side_output_late_data"):
            call()
