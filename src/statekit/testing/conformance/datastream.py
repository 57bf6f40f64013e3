"""PyFlink's ``test_data_stream.py`` keyed cases on the local runner, with PyFlink's data and
expected output: subclass :class:`DataStreamConformance` with a ``state_backend`` fixture
returning a :class:`StateBackend` (the connected-stream cases are in
:mod:`statekit.testing.conformance.connected`).

The local runner runs one keyed operator per job, so PyFlink's chains of keyed operators run
here stage by stage (each stage's output, in order, is the next one's input; parallelism 1, as
in PyFlink's cases, keeps the order), and a stateless ``map``/``filter`` after the keyed operator
is applied to the collected output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest

from statekit.backends.base import StateBackend
from statekit.errors import JobExecutionError
from statekit.runtime.batch import RuntimeExecutionMode
from statekit.runtime.datastream import DataStream
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.functions import (
    FilterFunction,
    FlatMapFunction,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
)
from statekit.runtime.watermarks import TimestampAssigner, WatermarkStrategy
from statekit.serde.types import Types
from statekit.state.api import AggregateFunction, ReduceFunction
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)

Env = Callable[..., StreamExecutionEnvironment]
MODES = [RuntimeExecutionMode.STREAMING, RuntimeExecutionMode.BATCH]


class V(NamedTuple):
    """PyFlink's ``Types.ROW_NAMED(["v1", "v2"], ...)`` rows: fields by name and position."""

    v1: Any
    v2: Any


class V3(NamedTuple):
    v1: Any
    v2: Any
    v3: Any


class ColumnTimestamp(TimestampAssigner):
    """PyFlink's ``SecondColumnTimestampAssigner`` (the column is given)."""

    def __init__(self, column: int = 1) -> None:
        self.column = column

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return int(value[self.column])


def monotonous(column: int = 1) -> WatermarkStrategy:
    return WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
        ColumnTimestamp(column))


def second(value: Any) -> Any:
    """PyFlink's ``MyKeySelector``."""
    return value[1]


def stages(env: Env, data: list[Any], *steps: Callable[[DataStream], Any],
           mode: RuntimeExecutionMode = RuntimeExecutionMode.STREAMING) -> list[Any]:
    """Run each keyed stage as a job at parallelism 1 on the previous stage's output."""
    for step in steps:
        job = env(parallelism=1)
        job.set_runtime_mode(mode)
        data = list(step(job.from_collection(data)).execute_and_collect())
    return data


class StateShow(KeyedProcessFunction):
    """test_keyed_process_function_with_state's function: value, list and map state (TTL)."""

    def open(self, runtime_context: Any) -> None:
        self.value_state = runtime_context.get_state(ValueStateDescriptor("value_state",
                                                                          Types.INT()))
        self.list_state = runtime_context.get_list_state(ListStateDescriptor("list_state",
                                                                             Types.INT()))
        descriptor = MapStateDescriptor("map_state", Types.INT(), Types.STRING())
        descriptor.enable_time_to_live(
            StateTtlConfig.new_builder(Time.seconds(1))
            .set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)
            .set_state_visibility(StateTtlConfig.StateVisibility.ReturnExpiredIfNotCleanedUp)
            .disable_cleanup_in_background().build())
        self.map_state = runtime_context.get_map_state(descriptor)

    def process_element(self, value: Any, ctx: Any) -> Iterator[str]:
        current_value = self.value_state.value()
        self.value_state.update(value[0])
        current_list = list(self.list_state.get())
        self.list_state.add(value[0])
        entries = dict(self.map_state.items())
        shown = "{" + ", ".join(f"{k}: {entries[k]}" for k in sorted(entries)) + "}"
        self.map_state.put(value[0], value[1])
        yield (f"current key: {ctx.get_current_key()}, current value state: {current_value}, "
               f"current list state: {current_list}, current map state: {shown}, "
               f"current value: {value}")


class Summing(AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: int, accumulator: int) -> int:
        return value + accumulator

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


class Appending(KeyedProcessFunction):
    """test_reducing_state / test_aggregating_state: add, then emit (state, key)."""

    def __init__(self, aggregating: bool) -> None:
        self.aggregating = aggregating

    def open(self, runtime_context: Any) -> None:
        if self.aggregating:
            descriptor = AggregatingStateDescriptor("aggregating_state", Summing(), Types.INT())
            descriptor.enable_time_to_live(
                StateTtlConfig.new_builder(Time.seconds(1))
                .set_update_type(StateTtlConfig.UpdateType.OnReadAndWrite)
                .disable_cleanup_in_background().build())
            self.state = runtime_context.get_aggregating_state(descriptor)
        else:
            self.state = runtime_context.get_reducing_state(
                ReducingStateDescriptor("reducing_state", lambda i, i2: i + i2, Types.INT()))

    def process_element(self, value: Any, ctx: Any) -> Iterator[Any]:
        self.state.add(value[0])
        yield self.state.get(), value[1]


class CountingState:
    """The ``test_state`` counter PyFlink's keyed map/flat_map/filter cases keep per key."""

    def open(self, runtime_context: Any) -> None:
        self.pre: Any = None
        self.state = runtime_context.get_state(ValueStateDescriptor("test_state", Types.INT()))

    def next_count(self) -> int:
        state_value = self.state.value()
        return 1 if state_value is None else state_value + 1


class AssertKeyMap(CountingState, MapFunction):
    def map(self, value: Any) -> Any:
        expected = {"b": 1, "c": 1, "d": 2}.get(value[0])
        if expected is not None:
            state_value = self.next_count()
            assert state_value == expected, (value, state_value)
            self.state.update(state_value)
        return value


class AssertKeyFlatMap(CountingState, FlatMapFunction):
    def flat_map(self, value: Any) -> Iterator[Any]:
        state_value = self.next_count()
        if value[0] in ("b", "d"):
            assert self.pre == {"b": "a", "d": "c"}[value[0]] and state_value == 2
        if value[0] == "e":
            assert state_value == 1
        self.pre = value[0]
        self.state.update(state_value)
        yield value


class AssertKeyFilter(CountingState, FilterFunction):
    def filter(self, value: Any) -> bool:
        state_value = self.next_count()
        if value[0] in ("b", "d"):
            assert self.pre == {"b": "a", "d": "c"}[value[0]] and state_value == 2
            return False
        if value[0] == "e":
            assert state_value == 1
        self.pre = value[0]
        self.state.update(state_value)
        return True


class StatefulReduce(ReduceFunction):
    """PyFlink's ``MyReduceFunction``: a reduce function with keyed state of its own."""

    def open(self, runtime_context: Any) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("test_state", Types.INT()))

    def reduce(self, value1: Any, value2: Any) -> Any:
        state_value = self.state.value()
        state_value = 2 if state_value is None else state_value + 1
        result = (value1[0] + value2[0], value1[1])
        assert {"ab": 2, "cde": 3}.get(result[0], state_value) == state_value, result
        self.state.update(state_value)
        return result


SIDE = OutputTag("side", Types.INT())


class SideReducing(KeyedProcessFunction):
    def open(self, context: Any) -> None:
        self.reducing_state = context.get_reducing_state(
            ReducingStateDescriptor("reduce", lambda i, j: i + j, Types.INT()))

    def process_element(self, value: Any, ctx: Any) -> Iterator[Any]:
        yield value[1]
        self.reducing_state.add(value[1])
        yield SIDE, self.reducing_state.get()


class LocalRunner:
    """The ``env`` fixture: ``env(parallelism=2)`` makes a local-runner environment on the
    backend of the ``state_backend`` fixture, checkpointing to files under ``tmp_path``."""

    @pytest.fixture
    def env(self, state_backend: StateBackend, tmp_path: Any) -> Env:
        made = iter(range(1_000))

        def make(parallelism: int = 2) -> StreamExecutionEnvironment:
            env = StreamExecutionEnvironment.get_execution_environment({
                "state.checkpoints.dir": f"{tmp_path}/chk{next(made)}",
                "state.checkpoint-storage": "filesystem"})
            env.set_state_backend(state_backend)
            env.set_parallelism(parallelism)
            return env

        return make


class DataStreamConformance(LocalRunner):
    """PyFlink's keyed DataStream cases, on the backend of ``state_backend``."""

    def test_keyed_process_function_with_state(self, env: Env) -> None:
        data = [(1, "hi", "1603708211000"), (2, "hello", "1603708224000"),
                (3, "hi", "1603708226000"), (4, "hello", "1603708289000"),
                (5, "hi", "1603708291000"), (6, "hello", "1603708293000")]
        out = (env().from_collection(data).assign_timestamps_and_watermarks(monotonous(2))
               .key_by(lambda x: x[1], key_type=Types.STRING()).process(StateShow()))
        seen = {"hi": ["None", "[]", "{}"], "hello": ["None", "[]", "{}"]}
        expected = []
        for row in data:
            value, lst, mapping = seen[row[1]]
            expected.append(f"current key: {row[1]}, current value state: {value}, current list "
                            f"state: {lst}, current map state: {mapping}, current value: {row}")
            ids = [r[0] for r in data[:data.index(row) + 1] if r[1] == row[1]]
            seen[row[1]] = [str(row[0]), str(ids), "{" + ", ".join(f"{i}: {row[1]}"
                                                                     for i in ids) + "}"]
        assert sorted(out.execute_and_collect()) == sorted(expected)
        assert "current list state: [1, 3], current map state: {1: hi, 3: hi}" in expected[4]

    @pytest.mark.parametrize("aggregating", [False, True], ids=["reducing", "aggregating"])
    def test_reducing_and_aggregating_state(self, env: Env, aggregating: bool) -> None:
        data = [(1, "hi"), (2, "hello"), (3, "hi"), (4, "hello"), (5, "hi"), (6, "hello")]
        out = env().from_collection(data).key_by(lambda x: x[1], key_type=Types.STRING()).process(
            Appending(aggregating))
        assert sorted(out.execute_and_collect()) == sorted(
            [(1, "hi"), (2, "hello"), (4, "hi"), (6, "hello"), (9, "hi"), (12, "hello")])

    def test_keyed_map_flat_map_and_filter(self, env: Env) -> None:
        data = [("a", 0), ("b", 1), ("c", 0), ("d", 1), ("e", 2)]
        out = env().from_collection(data).key_by(second, key_type=Types.INT()).map(AssertKeyMap())
        assert sorted((x[0], x[1] + 1) for x in out.execute_and_collect()) == [
            ("a", 1), ("b", 2), ("c", 1), ("d", 2), ("e", 3)]
        data = [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2)]
        out = env().from_collection(data).key_by(second, key_type=Types.INT()).flat_map(
            AssertKeyFlatMap())
        assert sorted((x[0], x[1] + 1) for x in out.execute_and_collect()) == [
            ("a", 1), ("b", 1), ("c", 2), ("d", 2), ("e", 3)]
        out = env().from_collection(data).key_by(second).filter(AssertKeyFilter())
        assert sorted(x for x in out.execute_and_collect() if x[1] > 0) == [("c", 1), ("e", 2)]

    @pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
    def test_reduce_with_state(self, env: Env, mode: RuntimeExecutionMode) -> None:
        data = [("a", 0), ("c", 1), ("d", 1), ("b", 0), ("e", 1)]
        out = stages(env, data, lambda s: s.key_by(second, key_type=Types.INT()).reduce(
            StatefulReduce()), mode=mode)
        expected = ([("a", 0), ("ab", 0), ("c", 1), ("cd", 1), ("cde", 1)]
                    if mode is RuntimeExecutionMode.STREAMING else [("ab", 0), ("cde", 1)])
        assert sorted(out) == expected

    @pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
    def test_keyed_sum(self, env: Env, mode: RuntimeExecutionMode) -> None:
        if mode is RuntimeExecutionMode.STREAMING:
            data = [V(1, 1), V(1, 2), V(1, 3), V(2, 5), V(2, 1)]
            out = stages(env, data, lambda s: s.key_by(lambda x: x[0]).sum("v2"),
                         lambda s: s.key_by(lambda x: x[0]).sum(1),
                         lambda s: s.map(lambda x: (x[1], x[0])).key_by(lambda x: x[1]).sum())
            assert sorted(out) == [(1, 1), (5, 1), (5, 2), (15, 1), (16, 2)]
            return
        data = [V(1, 1), V(1, 2), V(1, 3), V(5, 1), V(5, 5)]
        out = stages(env, data, lambda s: s.key_by(lambda x: x[0]).sum("v2"),
                     lambda s: s.key_by(lambda x: x[1]).sum(),
                     lambda s: s.flat_map(lambda row: ((12, i) for i in row))
                     .key_by(lambda x: x[0]).sum(1),
                     lambda s: s.flat_map(lambda row: iter(row)).key_by(lambda x: x).sum(),
                     mode=mode)
        assert out == [24]

    @pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
    def test_keyed_min_by_and_max(self, env: Env, mode: RuntimeExecutionMode) -> None:
        if mode is RuntimeExecutionMode.STREAMING:
            data = [V3("a", 3, 0), V3("a", 1, 1), V3("b", 5, 0), V3("b", 3, 1)]
            out = stages(env, data, lambda s: s.key_by(lambda x: x[0]).min_by("v2"),
                         lambda s: s.map(tuple).key_by(lambda x: x[2]).max(1),
                         lambda s: s.key_by(lambda x: x[2]).min(),
                         lambda s: s.map(lambda x: x[0]).key_by(lambda x: x).max_by())
            assert out == ["a", "a", "a", "a"]
            return
        data = [V3(1, "9", 0), V3(1, "5", 1), V3(1, "6", 2), V3(5, "5", 0), V3(5, "3", 1)]
        out = stages(env, data, lambda s: s.key_by(lambda x: x[0]).min_by("v2"),
                     lambda s: s.map(tuple).key_by(lambda x: x[2]).max(0),
                     # PyFlink keys by the list [1]; statekit keys must be hashable: (1,)
                     lambda s: s.flat_map(lambda row: ((int(i), 1) for i in row))
                     .key_by(lambda x: (1,)).min_by(),
                     lambda s: s.flat_map(lambda row: iter(row)).key_by(lambda x: x).max_by(),
                     mode=mode)
        assert out == [1]

    def test_keyed_process_side_output(self, env: Env) -> None:
        data = [("a", 1), ("b", 2), ("a", 3), ("b", 4)]
        result = env().from_collection(data).key_by(lambda e: e[0]).process(
            SideReducing()).execute_and_collect()
        assert sorted(result) == [1, 2, 3, 4]
        assert sorted(result.get_side_output(SIDE)) == [1, 2, 4, 6]

    def test_function_with_error(self, env: Env) -> None:
        data = [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 1)]

        def flat_map_func(x: Any) -> Iterator[Any]:
            raise ValueError("flat_map_func error")
            yield x

        keyed = env().from_collection(data).key_by(second, key_type=Types.INT())
        with pytest.raises(JobExecutionError, match="flat_map_func error"):
            keyed.flat_map(flat_map_func).execute_and_collect()
