"""transformWithStateInPandas' timer phase: every due timer of a partition in one call."""

from __future__ import annotations

from statekit import FileSystemCheckpointStorage, HashMapStateBackend, KeyedProcessFunction
from statekit.spark.task import AdapterSpec, PartitionTask, TaskInfo
from statekit.spark.transform import _patch_client


class Echo(KeyedProcessFunction):
    """Emits each fired timer; the timer at 1_100 registers one more, due already."""

    def process_element(self, value, ctx):
        return ()

    def on_timer(self, timestamp, ctx):
        if timestamp == 1_100:
            ctx.timer_service().register_processing_time_timer(4_000)
        yield ctx.get_current_key(), timestamp


def test_timer_phase_fires_every_due_timer_in_one_call(tmp_path):
    """PySpark's timer phase asks the patched client for expired timers one at a time and calls
    ``handleExpiredTimer`` for each, each call's output a frame of its own: firing 10^5 timers
    that way took minutes (a call, a round trip for the batch's time and an output frame per
    timer).  The client now fires every due timer on the first request (in timestamp order, a
    timer registered meanwhile that is due too included) and ends the iteration there."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessorHandle
    from pyspark.sql.streaming.stateful_processor_api_client import (
        ExpiredTimerIterator,
        StatefulProcessorApiClient,
    )

    spec = AdapterSpec(function=Echo(), backend=HashMapStateBackend(),
                       storage=FileSystemCheckpointStorage(str(tmp_path)), operator_id="echo",
                       key_columns=["key"], output_columns=["key", "ts"])
    task = PartitionTask(spec, TaskInfo(0, "q", 0, 0, "t0"))
    try:
        task.firing = None
        timers = task.op.timers
        for key in range(300):
            task.backend.set_current_key(key)
            task.op.timer_service.register_processing_time_timer(1_000 + key)
        task.backend.set_current_key("late")
        task.op.timer_service.register_processing_time_timer(9_000)
        client = object.__new__(StatefulProcessorApiClient)  # no JVM: it would answer the time
        client.get_timestamps = lambda mode: (5_000, -1)
        _patch_client(StatefulProcessorHandle(client), task, "ProcessingTime")
        assert len(list(ExpiredTimerIterator(client, 5_000))) == 1  # one handleExpiredTimer call
        fired = task.firing
        assert fired == sorted([(k, 1_000 + k) for k in range(300)] + [(100, 4_000)],
                               key=lambda t: t[1])
        assert timers.count() == (0, 1)  # the timer at 9_000 is not due
        task.firing = None
        assert list(ExpiredTimerIterator(client, 5_000)) == []  # nothing more is due
    finally:
        task.abort()
