"""PyFlink's ``test_data_stream.py`` connected-stream cases (keyed co-process, co-map,
co-flat-map, side outputs of a co-process) on the local runner, with PyFlink's data and expected
output: subclass :class:`ConnectedStreamConformance` with a ``state_backend`` fixture returning a
:class:`StateBackend`.  Non-keyed connected streams are not offered (the local runner runs keyed
operators), so PyFlink's ``CoProcessFunction`` cases are not here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from statekit.runtime.connected import CoFlatMapFunction, CoMapFunction, KeyedCoProcessFunction
from statekit.serde.types import Types
from statekit.state.descriptors import MapStateDescriptor, ReducingStateDescriptor, ValueStateDescriptor
from statekit.testing.conformance.datastream import SIDE, Env, LocalRunner, monotonous, second


class AssertKeyCoMap(CoMapFunction):
    def open(self, runtime_context: Any) -> None:
        self.pre1 = runtime_context.get_state(ValueStateDescriptor("pre1", Types.STRING()))
        self.pre2 = runtime_context.get_state(ValueStateDescriptor("pre2", Types.STRING()))

    @staticmethod
    def check(pre: Any, value: Any) -> Any:
        if value[0] in ("b", "d"):
            assert pre.value() == {"b": "a", "d": "c"}[value[0]], value
        pre.update(value[0])
        return value

    def map1(self, value: Any) -> Any:
        return self.check(self.pre1, value)

    def map2(self, value: Any) -> Any:
        return self.check(self.pre2, value)


class RichCoFlatMap(CoFlatMapFunction):
    """PyFlink's ``MyRichCoFlatMapFunction``: map state used with ``in`` and ``[]=``."""

    def open(self, runtime_context: Any) -> None:
        self.map_state = runtime_context.get_map_state(
            MapStateDescriptor("map", Types.STRING(), Types.BOOLEAN()))

    def flat_map1(self, value: Any) -> Iterator[str]:
        yield str(value[0] + 1)
        yield str(value[0] + 1)

    def flat_map2(self, value: Any) -> Iterator[str]:
        if value[0] not in self.map_state:
            self.map_state[value[0]] = True
            yield value[0]


class CountingCoProcess(KeyedCoProcessFunction):
    """PyFlink's ``MyKeyedCoProcessFunction``: a count per key, one event-time timer at 3."""

    def open(self, runtime_context: Any) -> None:
        self.timer_registered = False
        self.count_state = runtime_context.get_state(ValueStateDescriptor("count", Types.INT()))

    def _count(self, value: Any) -> list[Any]:
        count = self.count_state.value()
        count = 1 if count is None else count + 1
        self.count_state.update(count)
        return [(value[0], count)]

    def process_element1(self, value: Any, ctx: Any) -> list[Any]:
        if not self.timer_registered:
            ctx.timer_service().register_event_time_timer(3)
            self.timer_registered = True
        return self._count(value)

    def process_element2(self, value: Any, ctx: Any) -> list[Any]:
        return self._count(value)

    def on_timer(self, timestamp: int, ctx: Any) -> list[Any]:
        return [("on_timer", timestamp)]


class SideCoReducing(KeyedCoProcessFunction):
    def open(self, context: Any) -> None:
        self.reducing_state = context.get_reducing_state(
            ReducingStateDescriptor("reduce", lambda i, j: i + j, Types.INT()))

    def _emit(self, ctx: Any, n: int) -> Iterator[Any]:
        yield ctx.get_current_key(), n
        self.reducing_state.add(1)
        yield SIDE, self.reducing_state.get()

    def process_element1(self, value: Any, ctx: Any) -> Iterator[Any]:
        return self._emit(ctx, value[1])

    def process_element2(self, value: Any, ctx: Any) -> Iterator[Any]:
        return self._emit(ctx, value[0])


class ConnectedStreamConformance(LocalRunner):
    """PyFlink's keyed connected-stream cases, on the backend of ``state_backend``."""

    def test_keyed_co_process(self, env: Env) -> None:
        job = env(parallelism=1)
        ds1 = job.from_collection([("a", 1), ("b", 2), ("c", 3)]).assign_timestamps_and_watermarks(
            monotonous())
        ds2 = job.from_collection([("b", 2), ("c", 3), ("d", 4)]).assign_timestamps_and_watermarks(
            monotonous())
        out = ds1.connect(ds2).key_by(lambda x: x[0], lambda x: x[0]).process(CountingCoProcess())
        assert sorted((x[0], x[1] + 1) for x in out.execute_and_collect()) == [
            ("a", 2), ("b", 2), ("b", 3), ("c", 2), ("c", 3), ("d", 2), ("on_timer", 4)]

    def test_keyed_co_map(self, env: Env) -> None:
        data = [("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 2)]
        job = env()
        ds1 = job.from_collection(data).key_by(second, key_type=Types.INT())
        ds2 = job.from_collection(data)
        out = ds1.connect(ds2).key_by(second, second, key_type=Types.INT()).map(AssertKeyCoMap())
        expected = [("a", 1), ("b", 1), ("c", 2), ("d", 2), ("e", 3)] * 2
        assert sorted((x[0], x[1] + 1) for x in out.execute_and_collect()) == sorted(expected)

    def test_keyed_co_flat_map(self, env: Env) -> None:
        job = env()
        ds1 = job.from_collection([(1, 1), (2, 2), (3, 3)])
        ds2 = job.from_collection([("a", "a"), ("b", "b"), ("c", "c"), ("a", "a")])
        out = ds1.connect(ds2).key_by(lambda x: 1, lambda x: 1).flat_map(RichCoFlatMap())
        assert sorted(x for x in out.execute_and_collect() if x != "4") == [
            "2", "2", "3", "3", "a", "b", "c"]

    def test_keyed_co_process_side_output(self, env: Env) -> None:
        job = env()
        ds1 = job.from_collection([("a", 1), ("b", 2), ("a", 3), ("b", 4)])
        ds2 = job.from_collection([(8, "a"), (7, "b"), (6, "a"), (5, "b")])
        result = ds1.key_by(lambda e: e[0]).connect(ds2.key_by(lambda e: e[1])).process(
            SideCoReducing()).execute_and_collect()
        assert sorted(result) == sorted([("a", 1), ("b", 2), ("a", 3), ("b", 4), ("b", 5),
                                         ("a", 6), ("b", 7), ("a", 8)])
        assert sorted(result.get_side_output(SIDE)) == [1, 1, 2, 2, 3, 3, 4, 4]
