"""Connected streams on the local runner (PyFlink's keyed co-process / co-map / co-flat-map cases
of test_data_stream.py): two inputs keyed by their own selectors share the key's state; timers
registered from either input fire in on_timer; event time is the smaller input watermark; state
and position survive a savepoint; both backends."""

from __future__ import annotations

from collections import defaultdict

import pytest

from statekit import (
    CoFlatMapFunction,
    CoMapFunction,
    KeyedCoProcessFunction,
    ValueStateDescriptor,
)
from statekit.durations import Duration
from statekit.errors import StateError
from statekit.runtime.watermarks import TimestampAssigner, WatermarkStrategy
from tests.runtime.envs import env_for

BACKENDS = ["hashmap", "rocksdb"]


class Enrich(KeyedCoProcessFunction):
    """Input 1: orders (id, user, amount); input 2: user names (user, name).  Orders wait in a
    state until their user's name arrives; each emits (order id, name, amount)."""

    def open(self, ctx):
        self.name = ctx.get_state(ValueStateDescriptor("name"))
        self.waiting = ctx.get_list_state(__import__("statekit").ListStateDescriptor("waiting"))

    def process_element1(self, value, ctx):
        name = self.name.value()
        if name is None:
            self.waiting.add(value)
            return
        yield value[0], name, value[2]

    def process_element2(self, value, ctx):
        self.name.update(value[1])
        for order in self.waiting.get():
            yield order[0], value[1], order[2]
        self.waiting.clear()


ORDERS = [(1, "u1", 10), (2, "u2", 20), (3, "u1", 30), (4, "u3", 40)]
NAMES = [("u2", "Bea"), ("u1", "Al"), ("u3", "Cy")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyed_co_process_shares_the_key_state(tmp_path, backend):
    env = env_for(tmp_path, backend)
    orders, names = env.from_collection(ORDERS), env.from_collection(NAMES)
    out = orders.connect(names).key_by(lambda o: o[1], lambda n: n[0]).process(Enrich())
    assert sorted(out.execute_and_collect()) == [(1, "Al", 10), (2, "Bea", 20), (3, "Al", 30),
                                                 (4, "Cy", 40)]
    # keyed streams connect with their own selectors
    keyed = env.from_collection(ORDERS).key_by(lambda o: o[1]).connect(
        env.from_collection(NAMES).key_by(lambda n: n[0]))
    assert len(keyed.process(Enrich()).execute_and_collect()) == 4


class Timeout(KeyedCoProcessFunction):
    """A request (input 1) times out 100 ms of event time after it arrives unless a response
    (input 2) for the key came first."""

    def open(self, ctx):
        self.pending = ctx.get_state(ValueStateDescriptor("pending"))

    def process_element1(self, value, ctx):
        self.pending.update(value[1])
        ctx.timer_service().register_event_time_timer(value[1] + 100)

    def process_element2(self, value, ctx):
        started = self.pending.value()
        if started is not None:
            ctx.timer_service().delete_event_time_timer(started + 100)
            self.pending.clear()
            yield ctx.get_current_key(), "answered", value[1] - started

    def on_timer(self, timestamp, ctx):
        if self.pending.value() is not None:
            self.pending.clear()
            yield ctx.get_current_key(), "timed out", timestamp


class Second(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[1]


def strategy():
    return (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(0))
            .with_timestamp_assigner(Second()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_timers_from_either_input_and_the_smaller_watermark(tmp_path, backend):
    requests = [("a", 0), ("b", 10), ("c", 20), ("d", 400)]
    responses = [("a", 50), ("c", 300), ("x", 500)]
    env = env_for(tmp_path, backend)
    out = (env.from_collection(requests).assign_timestamps_and_watermarks(strategy())
           .connect(env.from_collection(responses).assign_timestamps_and_watermarks(strategy()))
           .key_by(lambda r: r[0], lambda r: r[0]).process(Timeout()))
    got = sorted(out.execute_and_collect())
    # b's timer (110) fires once both watermarks pass it; c's response at 300 came after its
    # timeout at 120; d's timer fires at the end of input
    assert got == [("a", "answered", 50), ("b", "timed out", 110), ("c", "timed out", 120),
                   ("d", "timed out", 500)]


class Tag(CoMapFunction):
    def map1(self, value):
        return "left", value

    def map2(self, value):
        return "right", value


class Spread(CoFlatMapFunction):
    def flat_map1(self, value):
        yield from range(value)

    def flat_map2(self, value):
        return None  # nothing for the second input


@pytest.mark.parametrize("backend", BACKENDS)
def test_co_map_and_co_flat_map(tmp_path, backend):
    env = env_for(tmp_path, backend)
    out = (env.from_collection([1, 2, 3]).connect(env.from_collection([4, 5]))
           .key_by(lambda v: v % 2, lambda v: v % 2).map(Tag()).execute_and_collect())
    assert sorted(out) == [("left", 1), ("left", 2), ("left", 3), ("right", 4), ("right", 5)]
    out = (env.from_collection([2, 3]).connect(env.from_collection([9]))
           .key_by(lambda v: 0, lambda v: 0).flat_map(Spread()).execute_and_collect())
    assert sorted(out) == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_connected_state_and_position_survive_a_savepoint(tmp_path, backend):
    names_first = [("u1", "Al")]
    env = env_for(tmp_path, backend)
    first = (env.from_collection(ORDERS[:1]).connect(env.from_collection(names_first))
             .key_by(lambda o: o[1], lambda n: n[0]).process(Enrich())
             .execute_and_collect(savepoint_dir=f"{tmp_path}/sp"))
    assert list(first) == [(1, "Al", 10)]
    env = env_for(tmp_path, backend, **{"execution.savepoint.path": first.savepoint_path})
    # the same sources, longer: the job resumes after what it read, with the names it kept
    rest = (env.from_collection(ORDERS).connect(env.from_collection([*names_first, *NAMES[:1]]))
            .key_by(lambda o: o[1], lambda n: n[0]).process(Enrich()).execute_and_collect())
    by_order = defaultdict(list)
    for order_id, name, amount in rest:
        by_order[order_id].append((name, amount))
    assert dict(by_order) == {2: [("Bea", 20)], 3: [("Al", 30)]}  # u3 never named: waits


def test_connected_streams_must_be_keyed_and_take_co_functions(tmp_path):
    env = env_for(tmp_path, "hashmap")
    connected = env.from_collection([1]).connect(env.from_collection([2]))
    with pytest.raises(StateError, match="key_by"):
        connected.map(Tag())
    with pytest.raises(TypeError, match="CoMapFunction"):
        connected.key_by(lambda v: v, lambda v: v).map(lambda v: v)
    with pytest.raises(TypeError, match="KeyedCoProcessFunction"):
        connected.key_by(lambda v: v, lambda v: v).process(Tag())
