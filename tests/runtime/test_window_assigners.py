"""Window assigners, triggers and Flink's merging window set, without a job (PyFlink's
test_window.py assigner cases and Flink's MergingWindowSetTest, ported)."""

from __future__ import annotations

import datetime as dt

import pytest

from statekit import StateBackend, Time
from statekit.errors import ConfigError, StateError
from statekit.registry import backend_registry
from statekit.runtime.windows import (
    CountTrigger,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from statekit.runtime.windows.merging import MergingWindowSet, merging_set_descriptor
from statekit.serde.keygroups import key_group_range_for_operator
from statekit.serde.keys import as_key_serializer
from statekit.serde.types import serializer_for


class Clock(WindowAssigner.WindowAssignerContext):
    def __init__(self, now):
        self.now = now

    def get_current_processing_time(self):
        return self.now


def test_time_window():
    w = TimeWindow(0, 10)
    assert w.max_timestamp() == 9 and w.start == 0 and w.end == 10
    assert w.intersects(TimeWindow(10, 20)) and not w.intersects(TimeWindow(11, 20))
    assert w.cover(TimeWindow(5, 15)) == TimeWindow(0, 15)
    assert TimeWindow.get_window_start_with_offset(7, 0, 5) == 5
    assert TimeWindow.get_window_start_with_offset(-3, 0, 5) == -5
    assert TimeWindow.get_window_start_with_offset(7, 3, 5) == 3
    assert sorted([TimeWindow(5, 9), TimeWindow(0, 10), TimeWindow(0, 5)]) == [
        TimeWindow(0, 5), TimeWindow(0, 10), TimeWindow(5, 9)]


def test_tumbling_assigners_with_offsets_and_sizes_as_pyflink_takes_them():
    ctx = Clock(0)
    assert TumblingEventTimeWindows.of(Time.milliseconds(5)).assign_windows(None, 7, ctx) == [
        TimeWindow(5, 10)]
    assert TumblingEventTimeWindows.of(5, 2).assign_windows(None, 1, ctx) == [TimeWindow(-3, 2)]
    assert TumblingEventTimeWindows.of(dt.timedelta(seconds=1)).assign_windows(
        None, 1500, ctx) == [TimeWindow(1000, 2000)]
    assert TumblingProcessingTimeWindows.of(Time.seconds(1)).assign_windows(
        None, None, Clock(2500)) == [TimeWindow(2000, 3000)]
    assert TumblingEventTimeWindows.of(5).is_event_time()
    assert not TumblingProcessingTimeWindows.of(5).is_event_time()
    assert isinstance(TumblingEventTimeWindows.of(5).get_default_trigger(), EventTimeTrigger)
    for bad in (lambda: TumblingEventTimeWindows.of(0), lambda: TumblingEventTimeWindows.of(5, 5),
                lambda: SlidingEventTimeWindows.of(10, 0), lambda: SlidingEventTimeWindows.of(
                    10, 5, 5), lambda: EventTimeSessionWindows.with_gap(0)):
        with pytest.raises(ConfigError):
            bad()


def test_event_time_assigners_refuse_elements_without_a_timestamp():
    with pytest.raises(StateError, match="assign_timestamps_and_watermarks"):
        TumblingEventTimeWindows.of(5).assign_windows("x", None, Clock(0))


def test_sliding_assigners():
    ctx = Clock(0)
    windows = SlidingEventTimeWindows.of(Time.milliseconds(10), Time.milliseconds(5)).assign_windows(
        None, 7, ctx)
    assert windows == [TimeWindow(5, 15), TimeWindow(0, 10)]
    assert SlidingEventTimeWindows.of(6, 2, 1).assign_windows(None, 4, ctx) == [
        TimeWindow(3, 9), TimeWindow(1, 7), TimeWindow(-1, 5)]
    assert SlidingProcessingTimeWindows.of(10, 5).assign_windows(None, None, Clock(12)) == [
        TimeWindow(10, 20), TimeWindow(5, 15)]


class Collect:
    def __init__(self):
        self.merges = []

    def merge(self, to_be_merged, merge_result):
        self.merges.append((sorted(to_be_merged), merge_result))


def test_session_assigners_merge_touching_windows():
    sessions = EventTimeSessionWindows.with_gap(Time.milliseconds(10))
    assert sessions.assign_windows(None, 3, Clock(0)) == [TimeWindow(3, 13)]
    dynamic = EventTimeSessionWindows.with_dynamic_gap(lambda element: element)
    assert dynamic.assign_windows(7, 3, Clock(0)) == [TimeWindow(3, 10)]
    assert ProcessingTimeSessionWindows.with_gap(4).assign_windows(None, None, Clock(9)) == [
        TimeWindow(9, 13)]
    collect = Collect()
    sessions.merge_windows([TimeWindow(0, 10), TimeWindow(10, 20), TimeWindow(5, 8),
                            TimeWindow(30, 40)], collect)
    assert collect.merges == [([TimeWindow(0, 10), TimeWindow(5, 8), TimeWindow(10, 20)],
                               TimeWindow(0, 20))]


def test_trigger_results_and_pyflink_trigger_names():
    assert TriggerResult.FIRE_AND_PURGE.is_fire() and TriggerResult.FIRE_AND_PURGE.is_purge()
    assert not TriggerResult.CONTINUE.is_fire() and TriggerResult.PURGE.is_purge()
    assert CountTrigger.of(3).can_merge() and PurgingTrigger.of(CountTrigger.of(1)).can_merge()
    assert PurgingTrigger._purging(TriggerResult.FIRE) is TriggerResult.FIRE_AND_PURGE
    with pytest.raises(ConfigError):
        CountTrigger.of(0)
    with pytest.raises(ConfigError):
        PurgingTrigger.of("not a trigger")
    assert GlobalWindows.create().assign_windows(None, None, Clock(0))[0].max_timestamp() == 2**63 - 1


@pytest.fixture(params=["hashmap", "rocksdb"])
def window_set_state(request, tmp_path):
    factory = backend_registry.create(request.param, {}, StateBackend)
    backend = factory.create_keyed_state_backend(
        key_serializer=as_key_serializer(serializer_for(None)),
        key_group_range=key_group_range_for_operator(128, 1, 0), max_parallelism=128,
        operator_id="windows")
    backend.set_current_key("k")
    yield backend.get_partitioned_state(merging_set_descriptor())
    backend.dispose()


class Merges:
    def __init__(self):
        self.calls = []

    def __call__(self, result, merged, state_result, merged_states):
        self.calls.append((result, sorted(merged), state_result, sorted(merged_states)))


def test_merging_window_set_keeps_state_windows(window_set_state):
    """Flink's MergingWindowSetTest: a merge result keeps one merged window's state window."""
    sessions = EventTimeSessionWindows.with_gap(10)
    windows = MergingWindowSet(sessions, window_set_state)
    merges = Merges()
    assert windows.add_window(TimeWindow(0, 4), merges) == TimeWindow(0, 4)
    assert windows.get_state_window(TimeWindow(0, 4)) == TimeWindow(0, 4) and not merges.calls
    assert windows.add_window(TimeWindow(5, 9), merges) == TimeWindow(5, 9)  # no overlap
    # one that touches both merges the three; the state window is the first merged one's
    assert windows.add_window(TimeWindow(3, 6), merges) == TimeWindow(0, 9)
    assert merges.calls == [(TimeWindow(0, 9), [TimeWindow(0, 4), TimeWindow(5, 9)],
                             TimeWindow(0, 4), [TimeWindow(5, 9)])]
    assert windows.get_state_window(TimeWindow(0, 9)) == TimeWindow(0, 4)
    assert windows.get_state_window(TimeWindow(5, 9)) is None
    # a window inside an existing one merges into it without anything to merge
    assert windows.add_window(TimeWindow(1, 2), merges) == TimeWindow(0, 9)
    assert len(merges.calls) == 1
    windows.persist()
    again = MergingWindowSet(sessions, window_set_state)  # read back from the key's state
    assert again.mapping == {TimeWindow(0, 9): TimeWindow(0, 4)}
    again.retire_window(TimeWindow(0, 9))
    with pytest.raises(StateError):
        again.retire_window(TimeWindow(0, 9))
    again.persist()
    assert MergingWindowSet(sessions, window_set_state).mapping == {}


def test_merging_window_set_extends_a_window(window_set_state):
    windows = MergingWindowSet(EventTimeSessionWindows.with_gap(10), window_set_state)
    merges = Merges()
    windows.add_window(TimeWindow(0, 10), merges)
    assert windows.add_window(TimeWindow(8, 20), merges) == TimeWindow(0, 20)
    # the new window had no state: nothing to fold into the kept state window
    assert merges.calls == [(TimeWindow(0, 20), [TimeWindow(0, 10)], TimeWindow(0, 10), [])]
    assert windows.mapping == {TimeWindow(0, 20): TimeWindow(0, 10)}
