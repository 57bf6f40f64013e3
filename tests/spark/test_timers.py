"""Timers on Spark, every adapter and backend: processing-time timers fire in the first micro-batch
whose timestamp passes them, event-time timers in the first whose watermark does, for keys with
and without input, before the key's input of that batch, and across a restart of the query."""

from __future__ import annotations

import os
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statekit import KeyedProcessFunction, Types, ValueStateDescriptor
from statekit.errors import StateError
from statekit.runtime.timers import TimeDomain
from statekit.spark import (
    apply_in_pandas_with_state,
    foreach_batch,
    statekit_error,
    transform_with_state,
)

pytestmark = pytest.mark.spark

OUTPUT = "key string, kind string, n long, ts long"
ADAPTERS = ["foreach_batch", "transform_with_state", "apply_in_pandas_with_state"]
BACKENDS = ["hashmap", "rocksdb"]
S = 1000


class Alarm(KeyedProcessFunction):
    """Counts a key's elements; an event-time timer 10 s after each element's event time and a
    processing-time timer 1 ms after the key's first element.  Every element and fired timer is
    an output ``(key, kind, count, time)``: the count tells whether a timer fired before or after
    the key's input of the batch."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, row, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        timers = ctx.timer_service()
        timers.register_event_time_timer(ctx.timestamp() + 10 * S)
        if n == 1:
            timers.register_processing_time_timer(timers.current_processing_time() + 1)
        yield ctx.get_current_key(), "el", n, ctx.timestamp()

    def on_timer(self, timestamp, ctx):
        kind = "event" if ctx.time_domain() is TimeDomain.EVENT_TIME else "proc"
        yield ctx.get_current_key(), kind, self.count.value() or 0, timestamp


def write(directory, n, rows):
    os.makedirs(directory, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["key", "ts"])
    frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
    path = f"{directory}/part-{n:04d}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, coerce_timestamps="us")
    os.utime(path, (1_000_000 + n, 1_000_000 + n))


def wait_for(condition, what, timeout=600):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


class Sink:
    def __init__(self):
        self.by_batch = {}

    def __call__(self, df, batch_id):  # a batch run again replaces its rows
        self.by_batch[batch_id] = [tuple(r) for r in df.collect()]


def start(spark, adapter, backend, input_dir, checkpoint, sink, function=None, **options):
    source = (spark.readStream.schema("key string, ts timestamp")
              .option("maxFilesPerTrigger", 1).parquet(input_dir))
    conf = {"state.backend.type": backend}
    function = function or Alarm()
    if adapter == "foreach_batch":
        writer = source.writeStream.foreachBatch(foreach_batch(
            function, "key", OUTPUT, sink, event_time_column="ts", allowed_lateness=5 * S,
            conf=conf, operator_id=f"alarm-{backend}", **options))
    else:
        grouped = source.withWatermark("ts", "5 seconds").groupBy("key")
        if adapter == "transform_with_state":
            out = transform_with_state(grouped, function, OUTPUT, event_time_column="ts",
                                       conf=conf, operator_id=f"alarm-{backend}",
                                       **{"time_mode": "EventTime", **options})
        else:
            out = apply_in_pandas_with_state(grouped, function, OUTPUT, event_time_column="ts",
                                             conf=conf, operator_id=f"alarm-{backend}",
                                             **{"timeout_conf": "ProcessingTimeTimeout",
                                                **options})
        writer = out.writeStream.foreachBatch(sink).outputMode("update")
    # not availableNow: with processing-time timeouts Spark runs batches without input at every
    # trigger, so such a query would never end by itself
    return writer.option("checkpointLocation", checkpoint).start()


#: each adapter once per half, the backends alternating: the default run has the first half
HALVES = [[(a, BACKENDS[(i + h) % 2]) for i, a in enumerate(ADAPTERS)] for h in (0, 1)]


@pytest.mark.parametrize("runs", [pytest.param(HALVES[0], id="first-half"),
                                  pytest.param(HALVES[1], id="second-half",
                                               marks=pytest.mark.heavy)])
def test_timers_on_every_adapter_and_backend(spark, tmp_path, runs):
    inputs = {run: str(tmp_path / f"in-{run[0]}-{run[1]}") for run in runs}
    sinks = {run: Sink() for run in runs}
    for run in runs:
        write(inputs[run], 0, [("a", 100 * S), ("b", 100 * S)])
        write(inputs[run], 1, [("a", 130 * S)])

    def run_all(done):
        """Run each query until its sink shows ``done``, then stop it (queries with
        processing-time timeouts run batches without input forever, so no query ends itself)."""
        started = {run: start(spark, *run, inputs[run], str(tmp_path / f"cp-{run[0]}-{run[1]}"),
                              sinks[run])
                   for run in runs}  # three queries at a time: each adapter once
        for run, query in started.items():
            wait_for(lambda run=run, query=query: done(sinks[run]) or query.exception(),
                     f"{run}: {sinks[run].by_batch}")
            # the sink sees a batch before Spark commits it: stop only once the batch that
            # showed ``done`` is committed (the reader below reads the committed state)
            seen = max(sinks[run].by_batch)
            wait_for(lambda query=query, seen=seen: query.exception() or (
                query.lastProgress is not None and query.lastProgress["batchId"] >= seen),
                f"{run}: batch {seen} committed")
            query.stop()
            assert query.exception() is None, run

    def first_done(sink):
        seen = {(k, kind, n) for rows in sink.by_batch.values() for k, kind, n, _ in rows}
        return {("a", "el", 2), ("a", "proc", 1), ("b", "proc", 1)} <= seen

    def second_done(sink):
        seen = {(k, kind, ts) for rows in sink.by_batch.values() for k, kind, _, ts in rows}
        return {("a", "event", 110 * S), ("b", "event", 110 * S), ("c", "el", 131 * S)} <= seen

    run_all(first_done)
    for run in runs:  # more input for a restarted query: the timers were checkpointed
        write(inputs[run], 2, [("c", 131 * S)])
    run_all(second_done)
    for run in runs:
        got = sinks[run].by_batch
        rows = {b: sorted(rows) for b, rows in got.items()}
        # batch 0: the elements; processing-time timers at batch 0's time + 1
        assert sorted((k, kind, n) for k, kind, n, _ in rows[0]) == [
            ("a", "el", 1), ("b", "el", 1)], run
        # batch 1: both processing-time timers fire (b has no input), a's before a's input
        assert sorted((k, kind, n) for k, kind, n, _ in rows[1]) == [
            ("a", "el", 2), ("a", "proc", 1), ("b", "proc", 1)], run
        # batch 2, after the restart: the watermark is 130 s - 5 s, so the event-time timers at
        # 110 s fire (a has no input, b has none either); a's timer at 140 s stays pending
        fired = sorted((k, kind, n, ts) for b, batch in rows.items() if b >= 2
                       for k, kind, n, ts in batch)
        assert ("a", "event", 2, 110 * S) in fired and ("b", "event", 1, 110 * S) in fired, run
        assert ("c", "el", 1, 131 * S) in fired, run
        assert not [r for r in fired if r[3] == 140 * S], run
        # every timer fired at most once over the whole run
        timers = [(k, kind, ts) for batch in rows.values() for k, kind, _, ts in batch
                  if kind != "el"]
        assert len(timers) == len(set(timers)), run
        if run[0] != "apply_in_pandas_with_state":  # (its snapshots may lag the committed state)
            # the pending timers, read the Spark way: format("statekit") with the timer option
            pending = (spark.read.format("statekit").option("timers", "true")
                       .load(str(tmp_path / f"cp-{run[0]}-{run[1]}")).toPandas())
            event = pending[pending["domain"] == "EVENT_TIME"]
            assert sorted(zip(event["key"], event["timestamp"], strict=True)) == [
                ("a", 140 * S), ("c", 141 * S)], run


class Misplaced(KeyedProcessFunction):
    """Registers an event-time timer on every element."""

    def process_element(self, row, ctx):
        ctx.timer_service().register_event_time_timer(1)
        return ()


@pytest.mark.parametrize("adapter,options,setting", [
    ("transform_with_state", {"time_mode": "None"}, "time_mode"),
    ("apply_in_pandas_with_state", {"timeout_conf": "NoTimeout"}, "timeout_conf"),
])
def test_timers_an_adapter_cannot_deliver_are_refused(spark, tmp_path, adapter, options, setting):
    """A timer the adapter's setting could never fire is refused when it is registered, with
    the setting to change named, never accepted and dropped."""
    write(str(tmp_path / "in"), 0, [("a", 100 * S)])
    query = start(spark, adapter, "hashmap", str(tmp_path / "in"), str(tmp_path / "cp"), Sink(),
                  function=Misplaced(), **options)
    with pytest.raises(Exception) as info:
        query.processAllAvailable()
    query.stop()
    error = statekit_error(info.value)
    assert isinstance(error, StateError) and setting in str(error)


def test_foreach_batch_event_timers_need_an_event_time_column():
    from statekit.spark.clock import refusal

    refuse = refusal("foreach_batch", processing=None, event="pass event_time_column")
    assert refuse(TimeDomain.PROCESSING_TIME) is None
    assert "event_time_column" in refuse(TimeDomain.EVENT_TIME)
