"""PyFlink's test_window.py cases on the local runner: subclass :class:`WindowConformance` with a
``state_backend`` fixture returning a :class:`StateBackend`.

Ported: the keyed window cases (tumbling, sliding and session windows of event time, dynamic
session gaps, count windows, reduce / aggregate with and without a window function, purging
triggers, global windows, the late-data side output).  Left out: ``window_all`` (the local runner
runs keyed streams) and the chained window (one keyed operator per job).  PyFlink's watermarks
are periodic (every 200 ms) and the local runner's follow every element; where a case relies on
the watermark not having moved between elements (the late session merge), the strategy allows
that much out-of-orderness instead.
"""

from __future__ import annotations

from typing import Any

import pytest

from statekit import AggregateFunction, OutputTag, StreamExecutionEnvironment, Types
from statekit.backends.base import StateBackend
from statekit.durations import Duration
from statekit.runtime.watermarks import TimestampAssigner, WatermarkStrategy
from statekit.runtime.windows import (
    CountSlidingWindowAssigner,
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    Time,
    TumblingEventTimeWindows,
    WindowFunction,
)

HI = [("hi", 1), ("hi", 2), ("hi", 3), ("hi", 4), ("hi", 5), ("hi", 8), ("hi", 9), ("hi", 15)]
AB = [("a", 1), ("a", 2), ("b", 3), ("a", 6), ("b", 8), ("b", 9), ("a", 15)]


class SecondColumnTimestampAssigner(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return int(value[1])


class CountWindowProcessFunction(ProcessWindowFunction):
    def process(self, key, context, elements):
        return [(key, context.window().start, context.window().end, len(list(elements)))]

    def clear(self, context):
        pass


class SumWindowFunction(WindowFunction):
    def apply(self, key, window, inputs):
        return [(key, sum(i[0] for i in inputs))]


class EvenOddAggregate(AggregateFunction):
    def create_accumulator(self):
        return "", {0: 0, 1: 0}

    def add(self, value, accumulator):
        number_map = dict(accumulator[1])
        number_map[value[1] % 2] += 1
        return value[0], number_map

    def get_result(self, accumulator):
        return accumulator[0], accumulator[1][0] - accumulator[1][1]

    def merge(self, acc_a, acc_b):
        return acc_a[0], {0: acc_a[1][0] + acc_b[1][0], 1: acc_a[1][1] + acc_b[1][1]}


class SumAggregate(AggregateFunction):
    def create_accumulator(self):
        return 0, ""

    def add(self, value, accumulator):
        return value[1] + accumulator[0], value[0]

    def get_result(self, accumulator):
        return accumulator[1], accumulator[0]

    def merge(self, acc_a, acc_b):
        return acc_a[0] + acc_b[0], acc_a[1]


def keyed(env, data, strategy=None):
    strategy = strategy or WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
        SecondColumnTimestampAssigner())
    return env.from_collection(data).assign_timestamps_and_watermarks(strategy).key_by(
        lambda x: x[0], key_type=Types.STRING())


def run(stream):
    return sorted(stream.execute_and_collect())


class WindowConformance:
    """PyFlink's keyed window cases: subclass with a ``state_backend`` fixture."""

    @pytest.fixture
    def env(self, state_backend: StateBackend, tmp_path: Any) -> StreamExecutionEnvironment:
        env = StreamExecutionEnvironment.get_execution_environment({
            "state.checkpoints.dir": f"{tmp_path}/chk", "state.checkpoint-storage": "filesystem"})
        env.set_state_backend(state_backend)
        env.set_parallelism(2)
        return env

    def test_event_time_tumbling_window(self, env: Any):
        out = keyed(env, HI).window(TumblingEventTimeWindows.of(Time.milliseconds(5))).process(
            CountWindowProcessFunction())
        assert run(out) == [("hi", 0, 5, 4), ("hi", 5, 10, 3), ("hi", 15, 20, 1)]

    def test_count_tumbling_window(self, env: Any):
        data = [(1, "hi"), (2, "hello"), (3, "hi"), (4, "hello"), (5, "hi"), (6, "hello"),
                (6, "hello")]
        out = env.from_collection(data).key_by(lambda x: x[1]).count_window(3).apply(
            SumWindowFunction())
        assert run(out) == [("hello", 12), ("hi", 9)]

    def test_event_time_sliding_window(self, env: Any):
        out = keyed(env, HI).window(SlidingEventTimeWindows.of(
            Time.milliseconds(5), Time.milliseconds(2))).process(CountWindowProcessFunction())
        assert run(out) == sorted([("hi", -2, 3, 2), ("hi", 0, 5, 4), ("hi", 2, 7, 4),
                                   ("hi", 4, 9, 3), ("hi", 6, 11, 2), ("hi", 8, 13, 2),
                                   ("hi", 12, 17, 1), ("hi", 14, 19, 1)])

    def test_count_sliding_window(self, env: Any):
        data = [(1, "hi"), (2, "hello"), (3, "hi"), (4, "hello"), (5, "hi"), (6, "hello")]
        out = env.from_collection(data).key_by(lambda x: x[1]).window(
            CountSlidingWindowAssigner(2, 1)).apply(SumWindowFunction())
        assert run(out) == [("hello", 6), ("hello", 10), ("hi", 4), ("hi", 8)]

    def test_event_time_session_window(self, env: Any):
        data = [e for e in HI if e[1] != 5]
        out = keyed(env, data).window(EventTimeSessionWindows.with_gap(Time.milliseconds(5))).process(
            CountWindowProcessFunction())
        assert run(out) == [("hi", 1, 14, 6), ("hi", 15, 20, 1)]

    def test_event_time_dynamic_gap_session_window(self, env: Any):
        env.set_parallelism(1)
        data = [("hi", 1), ("hi", 2), ("hi", 3), ("hi", 4), ("hi", 9), ("hi", 9), ("hi", 15)]
        out = keyed(env, data).window(EventTimeSessionWindows.with_dynamic_gap(
            lambda element: element[1])).process(CountWindowProcessFunction())
        assert run(out) == [("hi", 1, 8, 4), ("hi", 9, 30, 3)]

    def test_window_reduce_passthrough(self, env: Any):
        out = keyed(env, AB).window(EventTimeSessionWindows.with_gap(Time.milliseconds(2))).reduce(
            lambda a, b: (b[0], a[1] + b[1]), output_type=Types.TUPLE([Types.STRING(), Types.INT()]))
        assert run(out) == [("a", 3), ("a", 6), ("a", 15), ("b", 3), ("b", 17)]

    def test_window_reduce_process(self, env: Any):
        class MyProcessFunction(ProcessWindowFunction):
            def process(self, key, context, elements):
                yield (f"current window start at {context.window().start}, reduce result "
                       f"{next(iter(elements))}")

        out = keyed(env, AB).window(EventTimeSessionWindows.with_gap(Time.milliseconds(2))).reduce(
            lambda a, b: (b[0], a[1] + b[1]), window_function=MyProcessFunction())
        assert run(out) == sorted([
            "current window start at 1, reduce result ('a', 3)",
            "current window start at 15, reduce result ('a', 15)",
            "current window start at 3, reduce result ('b', 3)",
            "current window start at 6, reduce result ('a', 6)",
            "current window start at 8, reduce result ('b', 17)"])

    def test_window_aggregate_passthrough(self, env: Any):
        out = keyed(env, AB).window(EventTimeSessionWindows.with_gap(Time.milliseconds(2))).aggregate(
            EvenOddAggregate())
        assert run(out) == [("a", -1), ("a", 0), ("a", 1), ("b", -1), ("b", 0)]

    def test_window_aggregate_accumulator_type(self, env: Any):
        out = keyed(env, AB).window(EventTimeSessionWindows.with_gap(Time.milliseconds(2))).aggregate(
            SumAggregate(), accumulator_type=Types.TUPLE([Types.INT(), Types.STRING()]))
        assert run(out) == [("a", 3), ("a", 6), ("a", 15), ("b", 3), ("b", 17)]

    def test_window_aggregate_process(self, env: Any):
        class MyProcessWindowFunction(ProcessWindowFunction):
            def process(self, key, context, elements):
                agg_result = next(iter(elements))
                yield f"key {agg_result[0]} timestamp sum {agg_result[1]}"

        out = keyed(env, AB).window(EventTimeSessionWindows.with_gap(Time.milliseconds(2))).aggregate(
            SumAggregate(), window_function=MyProcessWindowFunction(),
            accumulator_type=Types.TUPLE([Types.INT(), Types.STRING()]))
        assert run(out) == sorted(["key a timestamp sum 15", "key a timestamp sum 3",
                                   "key a timestamp sum 6", "key b timestamp sum 17",
                                   "key b timestamp sum 3"])

    def test_session_window_late_merge(self, env: Any):
        # PyFlink's periodic watermark had not passed 4 when ('hi', 4) came: allow 5 ms
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(5)
                                                                   ).with_timestamp_assigner(
            SecondColumnTimestampAssigner())
        out = keyed(env, [("hi", 0), ("hi", 8), ("hi", 4)], strategy).window(
            EventTimeSessionWindows.with_gap(Time.milliseconds(5))).process(
            CountWindowProcessFunction())
        assert run(out) == [("hi", 0, 13, 3)]

    def test_event_time_session_window_with_purging_trigger(self, env: Any):
        data = [e for e in HI if e[1] != 5]
        out = keyed(env, data).window(EventTimeSessionWindows.with_gap(Time.milliseconds(3))).trigger(
            PurgingTrigger.of(EventTimeTrigger.create())).process(CountWindowProcessFunction())
        assert run(out) == [("hi", 1, 7, 4), ("hi", 8, 12, 2), ("hi", 15, 18, 1)]

    def test_global_window_with_purging_trigger(self, env: Any):
        env.set_parallelism(1)

        class MyProcessFunction(ProcessWindowFunction):
            def process(self, key, context, elements):
                return [(key, len(list(elements)))]

        out = keyed(env, [("hi", 1)] * 7).window(GlobalWindows.create()).trigger(
            PurgingTrigger.of(CountTrigger.of(2))).process(MyProcessFunction())
        assert run(out) == [("hi", 2)] * 3

    def test_side_output_late_data(self, env: Any):
        env.set_parallelism(1)
        tag = OutputTag("late-data", type_info=Types.ROW([Types.STRING(), Types.INT()]))
        out = keyed(env, [("a", 0), ("a", 8), ("a", 4), ("a", 6)]).window(
            TumblingEventTimeWindows.of(Time.milliseconds(5))).allowed_lateness(0
                                                                               ).side_output_late_data(
            tag).process(CountWindowProcessFunction())
        result = out.execute_and_collect()
        assert sorted(result) == [("a", 0, 5, 1), ("a", 5, 10, 2)]
        assert result.get_side_output(tag) == [("a", 4)]
        assert out.get_side_output(tag).execute_and_collect() == [("a", 4)]
