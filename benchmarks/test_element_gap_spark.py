"""The pause a row feels inside a Spark task while statekit checkpoints every micro-batch: the
longest gap between two consecutive rows of one task, through ``foreach_batch`` on local[2].

One query per backend reads parquet files one per trigger (``availableNow``): the first fills
``KEYS`` keys, each later one touches every key again (a read and a write of a ValueState of
longs).  The keyed function records, per row, the time since the previous row of the same task
attempt (0 for a task's first row); the sink keeps each micro-batch's longest gap and its number
of gaps above 1 and 5 ms.  On Spark a partition's snapshot is taken when its last row has been
processed (the commit of the micro-batch), so no row waits behind it inside a task; the run shows
what a row does wait for.  The baseline (run first, in the same session) does the same per-row
work in a plain ``mapInArrow`` function with a dict: its gaps are Spark's own (Arrow batches
arriving and leaving).  Bar: <= 5 ms or <= 2x the baseline's longest gap, whichever is larger.

``STATEKIT_BENCH_QUICK=1``: 10,000 keys.  Marked ``spark``.
Run: ``pytest benchmarks/test_element_gap_spark.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from benchmarks._common import QUICK, loadavg, spark_workdir
from statekit import KeyedProcessFunction, Types, ValueStateDescriptor

pytestmark = [pytest.mark.spark]

KEYS = 10_000 if QUICK else 100_000
BATCHES = 6  # measured micro-batches, after the one that fills the keys
OUTPUT = "key long, batch long, gap double"
_LAST: dict[str, Any] = {"task": None, "at": 0.0}


class GapCount(KeyedProcessFunction):
    """Counts per key and emits ``(key, batch, seconds since the task's previous row)``."""

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        from pyspark import TaskContext

        key, batch = value
        self.count.update((self.count.value() or 0) + 1)
        now = time.perf_counter()
        task = TaskContext.get().taskAttemptId()
        gap = now - _LAST["at"] if task == _LAST["task"] else 0.0
        _LAST["task"], _LAST["at"] = task, time.perf_counter()
        yield key, batch, gap


def plain_rows(batches: Any) -> Any:
    """The baseline: the same per-row work in a plain ``mapInArrow`` function, a dict for the
    state, no statekit (what Spark, Arrow and Python cost a row alone)."""
    import pyarrow as pa
    from pyspark import TaskContext

    counts: dict[int, int] = {}
    for batch in batches:
        keys, numbers = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        gaps = []
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
            now = time.perf_counter()
            task = TaskContext.get().taskAttemptId()
            gaps.append(now - _LAST["at"] if task == _LAST["task"] else 0.0)
            _LAST["task"], _LAST["at"] = task, time.perf_counter()
        yield pa.RecordBatch.from_arrays([pa.array(keys, pa.int64()), pa.array(numbers, pa.int64()),
                                          pa.array(gaps, pa.float64())],
                                         names=["key", "batch", "gap"])


class Sink:
    """Per micro-batch: the longest gap and the gaps above 1 and 5 ms (only these rows reach
    the driver)."""

    def __init__(self) -> None:
        self.batches: dict[int, dict[str, Any]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        row = df.agg(F.max("gap").alias("max"), F.count("*").alias("rows"),
                     F.sum((F.col("gap") > 0.001).cast("long")).alias("over_1ms"),
                     F.sum((F.col("gap") > 0.005).cast("long")).alias("over_5ms")).collect()[0]
        self.batches[batch_id] = {"max_gap_ms": round(1000 * (row["max"] or 0.0), 2),
                                  "rows": row["rows"], "over_1ms": row["over_1ms"],
                                  "over_5ms": row["over_5ms"]}


@pytest.fixture(scope="module")
def env():
    yield from spark_workdir("statekit-gap-spark-")


RESULTS: dict[str, float] = {}


@pytest.mark.parametrize("backend", ["baseline", "hashmap", "rocksdb"])
def test_element_gap_in_a_spark_task(benchmark: Any, env: Any, backend: str) -> None:
    import pandas as pd

    from statekit.spark import foreach_batch

    spark, work = env
    benchmark.group = "element-gap-spark"
    inputs = work / f"in-{backend}"
    inputs.mkdir()
    for batch in range(BATCHES + 1):
        keys = list(range(KEYS))
        pd.DataFrame({"key": keys, "batch": [batch] * KEYS}).to_parquet(
            inputs / f"part-{batch:04d}.parquet")
    sink = Sink()
    conf = {"state.backend.type": backend, "state.checkpoints.dir": str(work / f"state-{backend}")}
    if backend == "baseline":
        def each(df: Any, batch_id: int) -> None:
            sink(df.repartition(2, "key").mapInArrow(plain_rows, OUTPUT), batch_id)
    else:
        each = foreach_batch(GapCount(), "key", OUTPUT, sink, num_partitions=2, conf=conf)

    def run() -> None:
        query = (spark.readStream.schema("key long, batch long").option("maxFilesPerTrigger", 1)
                 .parquet(str(inputs)).writeStream.foreachBatch(each)
                 .option("checkpointLocation", str(work / f"query-{backend}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    benchmark.pedantic(run, rounds=1, iterations=1)
    measured = [sink.batches[b] for b in sorted(sink.batches)[1:]]
    assert len(measured) == BATCHES and all(m["rows"] == KEYS for m in measured), sink.batches
    figures = {"backend": backend, "keys": KEYS, "batches": measured,
               "max_gap_ms": max(m["max_gap_ms"] for m in measured),
               "over_5ms": sum(m["over_5ms"] for m in measured),
               "over_1ms": sum(m["over_1ms"] for m in measured), "loadavg": loadavg()}
    RESULTS[backend] = figures["max_gap_ms"]
    if backend != "baseline" and "baseline" in RESULTS:
        figures["vs_baseline"] = round(figures["max_gap_ms"] / max(RESULTS["baseline"], 1e-9), 3)
        figures["bar_ms"] = max(5.0, 2 * RESULTS["baseline"])
    benchmark.extra_info.update(figures)
    print(f"\nelement gap in a Spark task ({backend}):", figures)
