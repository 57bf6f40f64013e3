"""Shared pieces of the Spark end-to-end tests: input files, functions, runs, checks."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from statekit import ListStateDescriptor, MapStateDescriptor, Types
from statekit.errors import NoKeyContextError
from statekit.spark import apply_in_pandas_with_state, foreach_batch, transform_with_state
from statekit.testing import workloads

OUTPUT = "key string, c long, t long"


def write_inputs(directory: str, first: int, count: int, rows: int = 600, keys: int = 40) -> pd.DataFrame:
    """Parquet files ``first..first+count-1`` (one micro-batch each); the rows as pandas."""
    os.makedirs(directory, exist_ok=True)
    frames = []
    for i in range(first, first + count):
        rng = np.random.default_rng(i)
        df = pd.DataFrame({"key": [f"k{x:03d}" for x in rng.integers(0, keys, rows)],
                           "v": rng.integers(0, 100, rows).astype("int64")})
        path = f"{directory}/part-{i:04d}.parquet"
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


class RunningCount(workloads.RunningCount):
    """Per-key running count and sum; fails once mid-partition in (batch 1, partition 0, attempt 0)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def open(self, ctx):
        super().open(ctx)
        self.inject = (self.fail and ctx.get_job_parameter("batch_id") == 1
                       and ctx.get_job_parameter("partition") == 0 and ctx.get_attempt_number() == 0)
        self.seen = 0

    def process_element(self, row, ctx):
        self.seen += 1
        if self.inject and self.seen == 50:
            raise RuntimeError("injected task failure mid-partition")
        yield from super().process_element(row, ctx)


class Outputs:
    """A foreachBatch sink keeping each batch's rows by batch id (a re-run batch replaces its rows),
    failing once after batch ``fail_batch`` was processed, like a driver dying before Spark commits."""

    def __init__(self, fail_batch: int | None = None) -> None:
        self.by_batch: dict[int, list] = {}
        self.fail_batch = fail_batch

    def __call__(self, df, batch_id):
        self.by_batch[batch_id] = [tuple(r) for r in df.collect()]
        if batch_id == self.fail_batch:
            self.fail_batch = None
            raise RuntimeError("sink failed after the state was committed")

    def final(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for rows in self.by_batch.values():
            for k, c, t in rows:
                if c > out.get(k, (0, 0))[0]:
                    out[k] = (c, t)
        return out


def expected(frame: pd.DataFrame) -> dict[str, tuple[int, int]]:
    g = frame.groupby("key")["v"].agg(["size", "sum"])
    return {k: (int(r["size"]), int(r["sum"])) for k, r in g.iterrows()}


def start(spark, adapter: str, function, input_dir: str, checkpoint: str, sink: Outputs,
          conf: dict | None = None, num_partitions: int | None = 2):
    """Start an availableNow query over the input files through one adapter."""
    source = spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1).parquet(input_dir)
    if adapter == "foreach_batch":
        writer = source.writeStream.foreachBatch(
            foreach_batch(function, "key", OUTPUT, sink, num_partitions=num_partitions, conf=conf))
    elif adapter == "transform_with_state":
        writer = transform_with_state(source.groupBy("key"), function, OUTPUT, conf=conf
                                      ).writeStream.foreachBatch(sink).outputMode("update")
    else:
        writer = apply_in_pandas_with_state(source.groupBy("key"), function, OUTPUT, conf=conf
                                            ).writeStream.foreachBatch(sink).outputMode("update")
    return writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()


def run_until_done(spark, adapter, function, input_dir, checkpoint, sink, conf=None, restarts=2,
                   num_partitions=2):
    """Run the query to the end of its input, restarting it after a failure (as an operator would)."""
    for _ in range(restarts + 1):
        query = start(spark, adapter, function, input_dir, checkpoint, sink, conf, num_partitions)
        try:
            query.awaitTermination()
            return
        except Exception as exc:  # the sink's injected failure: restart from the checkpoint
            if "sink failed" not in str(exc):
                raise
    raise AssertionError("query did not finish")


class KeyedVectorCount(workloads.VectorCount):
    """The vectorized count, using the current key: where the engine hands one key's rows
    (``state.get_current_key()``) through the state handles ``open`` created, as a per-element
    function does; where the rows are of many keys (foreach_batch), by ``get_current_keys()``.
    It also keeps every value in a list state and the last one in a map state, by bulk access,
    and checks them against the count."""

    def open(self, ctx):
        super().open(ctx)
        self.count, self.total = ctx.get_state(self.c), ctx.get_state(self.t)
        self.values = ListStateDescriptor("values", Types.LONG())
        self.last = MapStateDescriptor("last", Types.STRING(), Types.LONG())
        ctx.get_list_state(self.values)
        ctx.get_map_state(self.last)

    def process_batch(self, rows, state):
        keys = state.get_current_keys()
        assert keys == rows["key"].tolist(), (keys, rows)
        out = self._count(rows, state, keys)
        values = rows["v"].tolist()
        state.add(self.values, keys, values)
        state.put_entries(self.last, keys, ["v"] * len(keys), values)
        lists = state.get(self.values, out["key"].tolist())
        assert [len(v) for v in lists] == out["c"].tolist()
        assert [sum(v) for v in lists] == out["t"].tolist()
        last = dict(zip(keys, values, strict=True))
        assert state.get_entries(self.last, list(last), ["v"] * len(last)) == list(last.values())
        return out

    def _count(self, rows, state, keys):
        try:
            key = state.get_current_key()
        except NoKeyContextError:  # a partition's rows of many keys
            rows = rows.assign(key=keys)
            return super().process_batch(rows, state)
        assert set(keys) == {key}
        c, t = (self.count.value() or 0) + len(rows), (self.total.value() or 0) + int(rows["v"].sum())
        self.count.update(c)
        self.total.update(t)
        return pd.DataFrame({"key": [key], "c": [c], "t": [t]})
