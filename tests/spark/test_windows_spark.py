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
