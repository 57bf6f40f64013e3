"""Windows on the local runner against pandas: tumbling, sliding and session windows of event
time with out-of-order input and allowed lateness (late firings, the late-data side output),
across a stop-with-savepoint and a resume at another parallelism, on both backends; and
processing-time windows driven by the test harness's clock."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from statekit import AggregateFunction, OutputTag, Types, ValueStateDescriptor
from statekit.durations import Duration
from statekit.errors import ConfigError, JobExecutionError, StateError, StateTypeError
from statekit.runtime.watermarks import WatermarkStrategy
from statekit.runtime.windows import (
    CountTrigger,
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    PurgingTrigger,
    SlidingEventTimeWindows,
    Time,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowFunction,
    Windows,
)
from statekit.testing import KeyedOneInputStreamOperatorTestHarness
from tests.runtime.envs import env_for

BACKENDS = ["hashmap", "rocksdb"]
DELAY = 20  # the watermark strategy's bounded out-of-orderness (ms)


def events(n=600, keys=7, spread=60, seed=3):
    """(key, timestamp, value): times rising with jitter up to ``spread`` ms back (some later
    than the watermark's delay allows, so some are late)."""
    rng = random.Random(seed)
    out, now = [], 0
    for _ in range(n):
        now += rng.randint(0, 4)
        out.append((f"k{rng.randrange(keys)}", max(0, now - rng.randint(0, spread)),
                    rng.randint(1, 9)))
    return out


def strategy(delay=DELAY):
    return (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(delay))
            .with_timestamp_assigner(lambda e, record_timestamp: e[1]))


class Summary(ProcessWindowFunction):
    """(key, start, end, sum, count) of a window's elements."""

    def process(self, key, context, elements):
        values = [e[2] for e in elements]
        w = context.window()
        yield key, w.start, w.end, sum(values), len(values)


class SumCount(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, accumulator):
        return (accumulator[0] + value[2], accumulator[1] + 1)

    def get_result(self, accumulator):
        return accumulator

    def merge(self, acc_a, acc_b):
        return (acc_a[0] + acc_b[0], acc_a[1] + acc_b[1])


class WithWindow(ProcessWindowFunction):
    def process(self, key, context, elements):
        (total, count), = elements
        w = context.window()
        yield key, w.start, w.end, total, count


def frame(evs, delay=DELAY):
    """The events with the watermark each one arrived at (the largest timestamp before it,
    minus the delay, minus 1: the runner emits the watermark after every element)."""
    df = pd.DataFrame(evs, columns=["key", "ts", "value"])
    df["wm"] = (df["ts"].cummax() - delay - 1).shift(1).fillna(-(2**62)).astype("int64")
    return df


def expected_fixed(evs, size, slide, lateness):
    """pandas: per (key, window) the sum and count of the elements that were not too late for
    it, how often it fired (once on time, once per late element within the lateness) and the
    dropped elements (late for every window they belong to)."""
    df = frame(evs)
    rows = []
    for j in range(size // slide):  # each element's windows: one per slide within the size
        start = df["ts"] - df["ts"] % slide - j * slide
        rows.append(df.assign(start=start, end=start + size))
    windows = pd.concat(rows)
    windows["max_ts"] = windows["end"] - 1
    windows["late"] = windows["max_ts"] + lateness <= windows["wm"]
    dropped = windows.groupby(level=0)["late"].all()
    kept = windows[~windows["late"]]
    kept = kept.assign(on_time=kept["max_ts"] > kept["wm"])
    agg = kept.groupby(["key", "start", "end"]).agg(
        total=("value", "sum"), count=("value", "size"), late_fires=("on_time", lambda s: (~s).sum()),
        on_time=("on_time", "any"))
    fires = agg["late_fires"] + agg["on_time"].astype(int)
    final = {k: (r["total"], r["count"]) for k, r in agg.iterrows()}
    late = [tuple(r) for r in df.loc[dropped[dropped].index, ["key", "ts", "value"]].itertuples(
        index=False)]
    return final, dict(fires), late


def expected_sessions(evs, gap):
    """pandas: sessions per key, a new one where the time since the session's last element
    exceeds the gap (windows [t, t + gap) that touch merge)."""
    df = pd.DataFrame(evs, columns=["key", "ts", "value"]).sort_values(["key", "ts"], kind="stable")
    new = df.groupby("key")["ts"].diff().fillna(gap + 1) > gap
    df["session"] = new.groupby(df["key"]).cumsum()
    agg = df.groupby(["key", "session"]).agg(start=("ts", "min"), last=("ts", "max"),
                                             total=("value", "sum"), count=("value", "size"))
    return {(r.Index[0], r.start): (r.last + gap, r.total, r.count) for r in agg.itertuples()}


def final_sessions(out):
    """The last result per session (a session extended after it fired fires again)."""
    return {(k, s): (e, t, c) for k, s, e, t, c in out}


def final_results(out):
    """The last result per window (later firings of a window replace earlier ones)."""
    return {(k, s, e): (t, c) for k, s, e, t, c in out}


def fire_counts(out):
    counts = {}
    for k, s, e, _, _ in out:
        counts[(k, s, e)] = counts.get((k, s, e), 0) + 1
    return counts


LATE = OutputTag("late")


def windowed(env, evs, assigner, lateness, how="process"):
    stream = (env.from_collection(evs).assign_timestamps_and_watermarks(strategy())
              .key_by(lambda e: e[0]).window(assigner).allowed_lateness(lateness)
              .side_output_late_data(LATE))
    if how == "aggregate":
        return stream.aggregate(SumCount(), WithWindow())
    if how == "reduce":
        return stream.reduce(lambda a, b: (a[0], min(a[1], b[1]), a[2] + b[2]))
    return stream.process(Summary())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("size", "slide", "how", "spread"),
                         [(50, 50, "aggregate", 60), (60, 20, "process", 120)])
def test_fixed_windows_with_lateness_equal_pandas(tmp_path, backend, size, slide, how, spread):
    evs = events(spread=spread)
    lateness = 15
    assigner = (TumblingEventTimeWindows.of(Time.milliseconds(size)) if size == slide
                else SlidingEventTimeWindows.of(size, slide))
    result = windowed(env_for(tmp_path, backend), evs, assigner, lateness, how
                      ).execute_and_collect()
    final, fires, late = expected_fixed(evs, size, slide, lateness)
    assert late and any(n > 1 for n in fires.values())  # the workload has both
    assert final_results(result) == final
    assert fire_counts(result) == fires
    assert sorted(result.get_side_output(LATE)) == sorted(late)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reduce_emits_the_reduced_value(tmp_path, backend):
    evs = events(200)
    out = windowed(env_for(tmp_path, backend), evs, TumblingEventTimeWindows.of(50), 0, "reduce"
                   ).execute_and_collect()
    final, _, _ = expected_fixed(evs, 50, 50, 0)
    # the reduced element: key, the smallest timestamp, the sum
    got = {(k, ts - ts % 50, ts - ts % 50 + 50): v for k, ts, v in out}
    assert got == {w: total for w, (total, _) in final.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_session_windows_equal_pandas(tmp_path, backend):
    evs = events(500, spread=DELAY)  # out of order, never later than the watermark allows
    gap = 12
    result = windowed(env_for(tmp_path, backend), evs, EventTimeSessionWindows.with_gap(gap), 30,
                      "aggregate").execute_and_collect()
    assert final_sessions(result) == expected_sessions(evs, gap)
    assert result.get_side_output(LATE) == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_savepoint_and_resume_at_another_parallelism(tmp_path, backend, kind):
    """Stop with a savepoint half way, resume at parallelism 3 (from 2): the outputs of both
    runs are those of one run, and equal pandas."""
    evs = events(400, spread=DELAY if kind == "session" else 60)
    assigner = {"tumbling": TumblingEventTimeWindows.of(50),
                "sliding": SlidingEventTimeWindows.of(60, 20),
                "session": EventTimeSessionWindows.with_gap(12)}[kind]
    half = len(evs) // 2
    first = windowed(env_for(tmp_path / "a", backend), evs[:half], assigner, 15
                     ).execute_and_collect(savepoint_dir=str(tmp_path / "sp"))
    env = env_for(tmp_path / "b", backend, **{"execution.savepoint.path": first.savepoint_path})
    env.set_parallelism(3)
    rest = windowed(env, evs, assigner, 15).execute_and_collect()
    whole = windowed(env_for(tmp_path / "c", backend), evs, assigner, 15).execute_and_collect()
    assert sorted(first + rest) == sorted(whole)
    assert sorted(first.get_side_output(LATE) + rest.get_side_output(LATE)) == sorted(
        whole.get_side_output(LATE))
    if kind == "session":
        assert final_sessions(whole) == expected_sessions(evs, 12)
    else:
        size, slide = (50, 50) if kind == "tumbling" else (60, 20)
        assert final_results(whole) == expected_fixed(evs, size, slide, 15)[0]


class Counting(ProcessWindowFunction):
    """Counts firings per window (window state) and windows per key (global state)."""

    def process(self, key, context, elements):
        fired = context.window_state().get_state(ValueStateDescriptor("fired", Types.LONG()))
        seen = context.global_state().get_state(ValueStateDescriptor("seen", Types.LONG()))
        fired.update((fired.value() or 0) + 1)
        seen.update((seen.value() or 0) + 1)
        yield key, context.window().start, len(list(elements)), fired.value(), seen.value()

    def clear(self, context):
        context.window_state().get_state(ValueStateDescriptor("fired", Types.LONG())).clear()


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_and_global_state_and_count_triggers(tmp_path, backend):
    evs = [("a", t, 1) for t in (1, 2, 3, 4, 5, 11, 12)]
    env = env_for(tmp_path, backend)
    stream = (env.from_collection(evs).assign_timestamps_and_watermarks(strategy(0))
              .key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(10))
              .trigger(CountTrigger.of(2)).process(Counting()))
    # fires at every 2nd element of a window; the window state counts firings, global all
    assert list(stream.execute_and_collect()) == [("a", 0, 2, 1, 1), ("a", 0, 4, 2, 2),
                                                  ("a", 10, 2, 1, 3)]
    purging = (env.from_collection(evs).assign_timestamps_and_watermarks(strategy(0))
               .key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(10))
               .trigger(PurgingTrigger.of(CountTrigger.of(2))).process(Counting()))
    assert [o[2] for o in purging.execute_and_collect()] == [2, 2, 2]


class Apply(WindowFunction):
    def apply(self, key, window, inputs):
        yield key, window.start, sorted(e[1] for e in inputs)


def test_apply_and_errors(tmp_path):
    env = env_for(tmp_path)
    evs = [("a", 5, 1), ("a", 1, 1)]
    keyed = env.from_collection(evs).assign_timestamps_and_watermarks(strategy()).key_by(
        lambda e: e[0])
    assert list(keyed.window(TumblingEventTimeWindows.of(10)).apply(Apply())
                .execute_and_collect()) == [("a", 0, [1, 5])]
    with pytest.raises(ConfigError):
        keyed.window("tumbling")
    with pytest.raises(ConfigError):
        keyed.window(TumblingEventTimeWindows.of(10)).allowed_lateness(-1)
    with pytest.raises(ConfigError):
        keyed.window(TumblingProcessingTimeWindows.of(10)).allowed_lateness(5)
    # event-time windows over a stream without timestamps fail the job with a clear cause
    plain = env_for(tmp_path / "p", **{"restart-strategy.type": "none"})
    stream = plain.from_collection(evs).key_by(lambda e: e[0]).window(
        TumblingEventTimeWindows.of(10)).process(Summary())
    with pytest.raises(JobExecutionError) as info:
        stream.execute_and_collect()
    assert isinstance(info.value.__cause__, StateError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processing_time_windows_driven_by_the_harness_clock(backend):
    tumbling = Windows.of(TumblingProcessingTimeWindows.of(Time.seconds(1))).process(Summary())
    harness = KeyedOneInputStreamOperatorTestHarness(tumbling, lambda e: e[0],
                                                     backend=backend, processing_time=100)
    with harness:
        harness.open()
        harness.process_element(("a", 0, 1))
        harness.process_element(("b", 0, 2))
        harness.set_processing_time(900)
        harness.process_element(("a", 0, 3))
        assert harness.extract_output_values() == []
        assert harness.num_processing_time_timers() == 2
        harness.set_processing_time(999)  # the windows' max timestamp
        assert sorted(harness.extract_output_values()) == [("a", 0, 1000, 4, 2),
                                                           ("b", 0, 1000, 2, 1)]
        harness.clear_output()
        harness.set_processing_time(1500)
        harness.process_element(("a", 0, 5))
        snapshot = harness.snapshot()
    restored = KeyedOneInputStreamOperatorTestHarness(tumbling, lambda e: e[0],
                                                      backend=backend)
    with restored:
        restored.initialize_state(snapshot)
        restored.open()
        restored.set_processing_time(2500)
        assert restored.extract_output_values() == [("a", 1000, 2000, 5, 1)]
        assert restored.num_processing_time_timers() == 0


def test_processing_time_sessions_driven_by_the_harness_clock():
    sessions = Windows.of(ProcessingTimeSessionWindows.with_gap(100)).process(Summary())
    with KeyedOneInputStreamOperatorTestHarness(sessions, lambda e: e[0]) as harness:
        harness.open()
        for now in (0, 50, 140):
            harness.set_processing_time(now)
            harness.process_element(("a", 0, 1))
        harness.set_processing_time(239)  # the merged session [0, 240) ends at 239
        assert harness.extract_output_values() == [("a", 0, 240, 3, 3)]
        harness.set_processing_time(400)
        harness.process_element(("a", 0, 1))
        harness.set_processing_time(500)
        assert harness.extract_output_values()[-1] == ("a", 400, 500, 1, 1)
        assert harness.num_processing_time_timers() == 0


def test_windows_as_a_keyed_function_give_the_windowed_streams_results(tmp_path):
    """``Windows.of(...)`` builds the same operator as ``KeyedStream.window(...)``, as a keyed
    function for ``process`` (and for the engines that take one)."""
    evs = events(300)
    operator = (Windows.of(SlidingEventTimeWindows.of(60, 20)).allowed_lateness(15)
                .side_output_late_data(LATE).process(Summary()))
    by_function = (env_for(tmp_path / "f").from_collection(evs)
                   .assign_timestamps_and_watermarks(strategy()).key_by(lambda e: e[0])
                   .process(operator).execute_and_collect())
    by_stream = windowed(env_for(tmp_path / "s"), evs, SlidingEventTimeWindows.of(60, 20), 15
                         ).execute_and_collect()
    assert sorted(by_function) == sorted(by_stream)
    assert by_function.get_side_output(LATE) == by_stream.get_side_output(LATE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_late_firing_and_cleanup_in_the_harness(backend):
    """Flink's WindowOperatorTest lateness cases: a window fires at its end, again for each
    element within the lateness, is dropped at end + lateness (its timers and state go), and a
    later element is late."""
    operator = (Windows.of(TumblingEventTimeWindows.of(2000)).allowed_lateness(500)
                .side_output_late_data(LATE).process(Summary()))
    with KeyedOneInputStreamOperatorTestHarness(operator, lambda e: e[0],
                                                backend=backend) as harness:
        harness.open()
        harness.process_element(("k", 1000, 1), timestamp=1000)
        harness.process_element(("k", 1500, 2), timestamp=1500)
        assert harness.num_event_time_timers() == 2  # the trigger's (1999), the cleanup (2499)
        harness.process_watermark(1999)
        assert harness.extract_output_values() == [("k", 0, 2000, 3, 2)]
        harness.process_element(("k", 1000, 4), timestamp=1000)  # late, within the lateness
        assert harness.extract_output_values()[-1] == ("k", 0, 2000, 7, 3)
        harness.process_watermark(2499)  # the cleanup: no firing
        assert len(harness.extract_output_values()) == 2
        assert harness.num_event_time_timers() == 0
        harness.backend.set_current_key("k")
        assert list(harness.backend.get_keys("window-contents", TimeWindow(0, 2000))) == []
        harness.process_element(("k", 1000, 8), timestamp=1000)  # past the lateness
        assert harness.extract_output_values()[-1] == (LATE, ("k", 1000, 8))
        assert harness.num_event_time_timers() == 0


def test_a_lateness_past_the_end_of_time_registers_no_cleanup_timer():
    """Flink's testCleanupTimeOverflow: max_timestamp + lateness past the largest long is no
    cleanup at all (the window's trigger timer only)."""
    operator = (Windows.of(TumblingEventTimeWindows.of(2000)).allowed_lateness(2**63 - 1)
                .process(Summary()))
    with KeyedOneInputStreamOperatorTestHarness(operator, lambda e: e[0]) as harness:
        harness.open()
        harness.process_element(("k", 1000, 1), timestamp=1000)
        assert harness.timers_of("k") == [1999]
        harness.process_watermark(1999)
        assert harness.extract_output_values() == [("k", 0, 2000, 1, 1)]
        harness.process_watermark(10**15)
        harness.process_element(("k", 1000, 2), timestamp=1000)  # never late: fires again
        assert harness.extract_output_values()[-1] == ("k", 0, 2000, 3, 2)


def latest_sessions(out):
    """Per key, the sessions no later result covers (a late element that joins a fired session
    fires the grown session again), as ``expected_sessions`` has them."""
    kept = {}
    for k, s, e, t, c in out:
        kept[k] = [w for w in kept.get(k, []) if not (s <= w[0] and w[1] <= e)] + [(s, e, t, c)]
    return {(k, s): (e, t, c) for k, ws in kept.items() for s, e, t, c in ws}


@pytest.mark.parametrize("backend", BACKENDS)
def test_session_windows_with_late_elements_equal_pandas(tmp_path, backend):
    """Elements later than the watermark but within the lateness join (or grow) sessions that
    fired already, which fire again; the last result of each session equals pandas'."""
    lateness, gap = 30, 12
    evs = events(500, spread=DELAY + lateness - 5)  # late, never past the lateness
    df = frame(evs)
    assert ((df["ts"] + gap - 1) <= df["wm"]).sum() > 20  # sessions ended before they came
    result = windowed(env_for(tmp_path, backend), evs, EventTimeSessionWindows.with_gap(gap),
                      lateness, "aggregate").execute_and_collect()
    expected = expected_sessions(evs, gap)
    assert len(result) > len(expected)  # some sessions fired again
    assert latest_sessions(result) == expected
    assert result.get_side_output(LATE) == []


def test_a_trigger_must_answer_with_a_trigger_result(tmp_path):
    class Forgetful(CountTrigger):
        def on_element(self, element, timestamp, window, ctx):
            super().on_element(element, timestamp, window, ctx)  # no return

    env = env_for(tmp_path, **{"restart-strategy.type": "none"})
    stream = (env.from_collection([("a", 1, 1)]).assign_timestamps_and_watermarks(strategy())
              .key_by(lambda e: e[0]).window(TumblingEventTimeWindows.of(10))
              .trigger(Forgetful(2)).process(Summary()))
    with pytest.raises(JobExecutionError) as info:
        stream.execute_and_collect()
    assert isinstance(info.value.__cause__, StateTypeError)
    assert "Forgetful.on_element returned None" in str(info.value.__cause__)
