"""BATCH execution of the local runner (PyFlink's batch cases of test_data_stream.py, single
stage): elements processed key by key, each key's timers fired at its end with no watermark
before, rolling aggregations emitting each key's final value only, no checkpoints; AUTOMATIC is
BATCH on the runner's bounded input; both backends."""

from __future__ import annotations

import pytest

from statekit import (
    KeyedProcessFunction,
    RuntimeExecutionMode,
    StreamExecutionEnvironment,
    ValueStateDescriptor,
)
from statekit.errors import ConfigError, ConfigTypeError
from statekit.runtime.timers import MIN_WATERMARK

BACKENDS = ["hashmap", "rocksdb"]


def batch_env(backend, mode=RuntimeExecutionMode.BATCH, **conf):
    env = StreamExecutionEnvironment.get_execution_environment(
        {"state.backend.type": backend, **conf})
    env.set_parallelism(2)
    env.set_runtime_mode(mode)
    return env


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_sum_and_reduce_emit_each_key_s_final_value(backend):
    rows = [(1, 1), (1, 2), (1, 3), (5, 1), (5, 5)]
    out = batch_env(backend).from_collection(rows).key_by(lambda x: x[0]).sum(1)
    assert sorted(out.execute_and_collect()) == [(1, 6), (5, 6)]
    out = (batch_env(backend, RuntimeExecutionMode.AUTOMATIC).from_collection(rows)
           .key_by(lambda x: x[0]).reduce(lambda a, b: (a[0], a[1] * b[1])))
    assert sorted(out.execute_and_collect()) == [(1, 6), (5, 5)]
    rows = [("a", 3, 0), ("a", 1, 1), ("b", 5, 0), ("b", 3, 1)]
    out = batch_env(backend).from_collection(rows).key_by(lambda x: x[0]).min_by(1)
    assert sorted(out.execute_and_collect()) == [("a", 1, 1), ("b", 3, 1)]


class Trace(KeyedProcessFunction):
    """Records the order of calls, the watermark each element sees, and a timer per element."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process_element(self, value, ctx):
        self.count.update((self.count.value() or 0) + 1)
        ctx.timer_service().register_event_time_timer(value[1])
        ctx.timer_service().register_processing_time_timer(10**15)
        yield "element", value, ctx.timer_service().current_watermark() == MIN_WATERMARK

    def on_timer(self, timestamp, ctx):
        yield "timer", (ctx.get_current_key(), timestamp, self.count.value())


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_key_runs_to_its_end_then_its_timers_fire(backend):
    env = batch_env(backend)
    env.set_parallelism(1)
    rows = [("a", 5), ("b", 7), ("a", 3), ("b", 1)]
    out = list(env.from_collection(rows).key_by(lambda r: r[0]).process(Trace())
               .execute_and_collect())
    # one key's elements together (input order), then its timers (both domains, in order),
    # then the next key; no watermark while elements run
    firsts = [o[1][0] for o in out]
    assert firsts in (["a", "a", "a", "a", "a", "b", "b", "b", "b", "b"],
                      ["b", "b", "b", "b", "b", "a", "a", "a", "a", "a"])
    by_key = {k: [o for o in out if o[1][0] == k] for k in "ab"}
    assert by_key["a"] == [("element", ("a", 5), True), ("element", ("a", 3), True),
                           ("timer", ("a", 3, 2)), ("timer", ("a", 5, 2)),
                           ("timer", ("a", 10**15, 2))]
    assert [o[1][1] for o in by_key["b"] if o[0] == "timer"] == [1, 7, 10**15]


def test_batch_refuses_checkpoints_and_savepoints(tmp_path):
    env = batch_env("hashmap", **{"execution.checkpointing.interval": "1 s",
                                  "state.checkpoints.dir": str(tmp_path)})
    stream = env.from_collection([1]).key_by(lambda x: x).sum()
    with pytest.raises(ConfigError, match="without checkpoints"):
        stream.execute_and_collect()
    stream = batch_env("hashmap").from_collection([1]).key_by(lambda x: x).sum()
    with pytest.raises(ConfigError, match="savepoints"):
        stream.execute_and_collect(savepoint_dir=str(tmp_path / "sp"))
    with pytest.raises(ConfigTypeError, match="RuntimeExecutionMode"):
        batch_env("hashmap").set_runtime_mode("BATCH")


def test_the_mode_is_a_configuration_key():
    env = StreamExecutionEnvironment.get_execution_environment({"execution.runtime-mode": "batch"})
    assert env.get_runtime_mode() is RuntimeExecutionMode.BATCH
    assert StreamExecutionEnvironment.get_execution_environment().get_runtime_mode() is (
        RuntimeExecutionMode.STREAMING)
    with pytest.raises(ConfigError, match="STREAMING, BATCH, AUTOMATIC"):
        StreamExecutionEnvironment.get_execution_environment({"execution.runtime-mode": "bach"})
