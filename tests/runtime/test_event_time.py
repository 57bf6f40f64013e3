"""Event time, processing time and timers on the local runner: watermark strategies, the end of
input, stops with a savepoint, restarts after failures, and the function lifecycle."""

from __future__ import annotations

import pytest

from statekit import (
    FlatMapFunction,
    KeyedProcessFunction,
    RestartStrategies,
    StreamExecutionEnvironment,
    Types,
    ValueStateDescriptor,
)
from statekit.durations import Duration
from statekit.errors import ConfigError, JobExecutionError, StateTypeError
from statekit.runtime.timers import TimeDomain
from statekit.runtime.watermarks import TimestampAssigner, WatermarkStrategy
from statekit.testing.harness import ManualClock
from statekit.testing.workloads import Sessions, expected_sessions, session_events

BACKENDS = ["hashmap", "rocksdb"]


class Stamp(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp):
        return value[1]


def env_for(tmp_path, backend, **conf):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend,
        "state.checkpoints.dir": f"{tmp_path}/chk",
        "state.checkpoint-storage": "filesystem",
        **conf,
    })
    env.set_parallelism(2)
    return env


class Echo(KeyedProcessFunction):
    """Outputs each element with its timestamp and the watermark it sees; a timer at +10."""

    def process_element(self, value, ctx):
        timers = ctx.timer_service()
        timers.register_event_time_timer(ctx.timestamp() + 10)
        yield "el", value[0], ctx.timestamp(), timers.current_watermark()

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() is TimeDomain.EVENT_TIME and ctx.timestamp() == timestamp
        yield "timer", ctx.get_current_key(), timestamp, ctx.timer_service().current_watermark()


def run(env, events, func, strategy=None, **kwargs):
    stream = env.from_collection(events)
    if strategy is not None:
        stream = stream.assign_timestamps_and_watermarks(strategy)
    return stream.key_by(lambda v: v[0]).process(func).execute_and_collect(**kwargs)


def test_bounded_out_of_orderness(tmp_path):
    env = env_for(tmp_path, "hashmap")
    env.set_parallelism(1)
    strategy = (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(5))
                .with_timestamp_assigner(Stamp()))
    out = run(env, [("a", 100), ("b", 103), ("a", 98), ("a", 120)], Echo(), strategy)
    # watermark after each element: max - 5 - 1; a timer fires once the watermark passes it
    assert list(out) == [
        ("el", "a", 100, -(2**63)), ("el", "b", 103, 94), ("el", "a", 98, 97),
        ("el", "a", 120, 97),
        ("timer", "a", 108, 114), ("timer", "a", 110, 114), ("timer", "b", 113, 114),
        # the end of input: the watermark jumps to the maximum, every timer fires
        ("timer", "a", 130, 2**63 - 1),
    ]


def test_monotonous_and_no_watermarks(tmp_path):
    env = env_for(tmp_path, "hashmap")
    env.set_parallelism(1)
    events = [("a", 1), ("a", 50)]
    mono = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(
        lambda v, ts: v[1])
    out = run(env, events, Echo(), mono)
    assert next(o for o in out if o[0] == "timer") == ("timer", "a", 11, 49)
    none = WatermarkStrategy.no_watermarks().with_timestamp_assigner(lambda v, ts: v[1])
    out = run(env, events, Echo(), none)
    assert [o[3] for o in out if o[0] == "el"] == [-(2**63)] * 2
    assert [o[3] for o in out if o[0] == "timer"] == [2**63 - 1] * 2  # only at the end of input


def test_strategies_are_checked_at_the_call(tmp_path):
    env = env_for(tmp_path, "hashmap")
    stream = env.from_collection([("a", 1)])
    with pytest.raises(ConfigError, match="with_timestamp_assigner"):
        stream.assign_timestamps_and_watermarks(WatermarkStrategy.for_monotonous_timestamps())
    with pytest.raises(ConfigError):
        stream.assign_timestamps_and_watermarks("not a strategy")
    with pytest.raises(ConfigError):
        WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(-1))
    bad = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(lambda v, t: "x")
    with pytest.raises(JobExecutionError) as info:
        run(env_for(tmp_path, "hashmap", **{"restart-strategy.type": "none"}), [("a", 1)],
            Echo(), bad)
    assert isinstance(info.value.__cause__, StateTypeError)


def test_timestamp_is_none_without_event_time(tmp_path):
    class Stamps(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield ctx.timestamp()

    assert list(run(env_for(tmp_path, "hashmap"), [("a", 1)], Stamps())) == [None]


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_with_savepoint_does_not_drain(tmp_path, backend):
    """Pending event-time timers stay in the savepoint and fire after the resume; ``drain``
    fires them at the stop, as Flink's ``stop --drain``."""
    events = [("a", 100), ("b", 100), ("a", 200)]
    strategy = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner(Stamp())
    first = run(env_for(tmp_path, backend), events[:2], Echo(), strategy,
                savepoint_dir=f"{tmp_path}/sp")
    assert all(o[0] == "el" for o in first)
    rest = run(env_for(tmp_path, backend, **{"execution.savepoint.path": first.savepoint_path}),
               events, Echo(), strategy)
    timers = sorted(o[1:3] for o in rest if o[0] == "timer")
    assert timers == [("a", 110), ("a", 210), ("b", 110)]
    # the resumed job saw the watermark the first one had reached
    assert [o for o in rest if o[0] == "el"] == [("el", "a", 200, 99)]
    drained = run(env_for(tmp_path, backend), events[:2], Echo(), strategy,
                  savepoint_dir=f"{tmp_path}/sp2", drain=True)
    assert sorted(o[1:3] for o in drained if o[0] == "timer") == [("a", 110), ("b", 110)]


class Ticking(KeyedProcessFunction):
    """Processing-time timers: one per element at processing time + 100."""

    def process_element(self, value, ctx):
        timers = ctx.timer_service()
        timers.register_processing_time_timer(timers.current_processing_time() + 100)
        yield "el", value[0], timers.current_processing_time()

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain() is TimeDomain.PROCESSING_TIME
        yield "timer", ctx.get_current_key(), timestamp


@pytest.mark.parametrize("backend", BACKENDS)
def test_processing_time_timers_follow_the_clock(tmp_path, backend):
    clock = ManualClock(1000)
    env = env_for(tmp_path, backend)
    env.set_processing_time_clock(clock)
    events = [("a", 1000), ("b", 1050), ("c", 1100), ("d", 1150), ("e", 1300)]
    stream = env.from_collection(events).map(lambda v: clock.set(v[1]) or v)
    out = stream.key_by(lambda v: v[0]).process(Ticking()).execute_and_collect()
    fired = [o for o in out if o[0] == "timer"]
    # a's timer (1100) fires after c's element at 1100; b's (1150) after d's; the end of input
    # does not fire processing-time timers (as in Flink)
    assert [o[1:] for o in fired] == [("a", 1100), ("b", 1150), ("c", 1200), ("d", 1250)]
    assert out.index(("timer", "a", 1100)) == out.index(("el", "c", 1100)) + 1


class CrashOnce(Sessions):
    """Sessions that crash once (attempt 0) in the middle of firing a timer."""

    def open(self, runtime_context):
        super().open(runtime_context)
        self.attempt = runtime_context.get_attempt_number()
        self.fired = 0

    def on_timer(self, timestamp, ctx):
        self.fired += 1
        if self.attempt == 0 and self.fired == 25:
            raise RuntimeError("crash while a timer fires")
        yield from super().on_timer(timestamp, ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_event_time_sessions_exactly_once(tmp_path, backend):
    """Session windows over out-of-order input equal pandas' answer, across a crash inside
    ``on_timer`` (restart from the latest checkpoint) and a stop with a savepoint."""
    events = session_events(1500, users=20, disorder=20_000)
    strategy = (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_seconds(20))
                .with_timestamp_assigner(lambda v, ts: v[1]))
    conf = {"execution.checkpointing.interval": "10 ms",
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "3",
            "restart-strategy.fixed-delay.delay": "0 ms"}
    env = env_for(tmp_path, backend, **conf)
    first = run(env, events[:700], CrashOnce(), strategy, savepoint_dir=f"{tmp_path}/sp")
    assert first.restarts == 1
    env = env_for(tmp_path, backend, **{**conf, "execution.savepoint.path": first.savepoint_path})
    env.set_parallelism(3)  # resumed at another parallelism
    rest = run(env, events, Sessions(), strategy)
    assert sorted(list(first) + list(rest)) == expected_sessions(events)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processing_time_sessions(tmp_path, backend):
    """The same sessions on processing time, the clock driven by the input."""
    events = sorted(session_events(800, users=10, disorder=0), key=lambda e: e[1])
    clock = ManualClock(events[0][1])
    ticks = [*events, ("~tick", events[-1][1] + 10**6)]  # moves the clock past every session

    def job(source, **conf):
        env = env_for(tmp_path, backend, **conf)
        env.set_processing_time_clock(clock)
        stream = env.from_collection(source).map(lambda v: clock.set(max(clock(), v[1])) or v)
        return stream.key_by(lambda v: v[0]).process(Sessions("processing"))

    first = job(ticks[:400]).execute_and_collect(savepoint_dir=f"{tmp_path}/sp")
    rest = job(ticks, **{"execution.savepoint.path": first.savepoint_path}).execute_and_collect()
    got = sorted(o for o in list(first) + list(rest) if o[0] != "~tick")
    assert got == expected_sessions(events)


def test_open_once_and_close_once(tmp_path):
    """``open`` runs once per task, ``close`` at its end, also after a failure (Flink closes
    the operators of a failed attempt)."""
    calls = []

    class Life(KeyedProcessFunction):
        def open(self, ctx):
            calls.append(("open", ctx.get_index_of_this_subtask(), ctx.get_attempt_number()))

        def process_element(self, value, ctx):
            if value == 3 and not any(c[0] == "open" and c[2] for c in calls):
                raise RuntimeError("once")
            return ()

        def close(self):
            calls.append(("close",))

    env = env_for(tmp_path, "hashmap", **{"restart-strategy.type": "fixed-delay",
                                          "restart-strategy.fixed-delay.delay": "0 ms"})
    env.from_collection(range(6)).key_by(lambda v: v).process(Life()).execute_and_collect()
    opens = [c for c in calls if c[0] == "open"]
    assert sorted(opens) == [("open", 0, 0), ("open", 0, 1), ("open", 1, 0), ("open", 1, 1)]
    assert calls.count(("close",)) == 4


def test_keyed_flat_map_opens_its_function(tmp_path):
    """PyFlink's ``test_keyed_flat_map``: a rich FlatMapFunction that creates state in
    ``open`` (it used to fail on its first element: open was never called)."""

    class CountWords(FlatMapFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
            self.closed = False

        def flat_map(self, value):
            n = (self.count.value() or 0) + 1
            self.count.update(n)
            yield value, n

        def close(self):
            self.closed = True

    env = env_for(tmp_path, "hashmap")
    out = env.from_collection(["a", "b", "a", "a"]).key_by(lambda v: v).flat_map(
        CountWords()).execute_and_collect()
    assert sorted(out) == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]


def test_restart_strategy_none_fails(tmp_path):
    env = env_for(tmp_path, "hashmap")
    env.set_restart_strategy(RestartStrategies.no_restart())

    class Bad(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.timer_service().register_event_time_timer(1)
            return ()

        def on_timer(self, timestamp, ctx):
            raise ValueError("boom")

    with pytest.raises(JobExecutionError, match="boom"):
        env.from_collection([1]).key_by(lambda v: v).process(Bad()).execute_and_collect()
