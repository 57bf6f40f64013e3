"""The timer conformance suite: Flink's ``InternalTimerServiceImplTest`` cases on a backend.

Subclass :class:`TimerConformance` with a ``state_backend`` fixture (a :class:`StateBackend`,
or a function ``() -> StateBackend`` for a fresh one per restore).  Flink's cases register timers
under two namespaces (``"ciao"``, ``"hello"``); PyFlink's timers have none, so here the two
namespaces are two timestamps (10 and 11) or two keys, and every assertion keeps its meaning:
what fires, how often, in which order, and what a snapshot restores into one or more partitions
(also of the other backend).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.errors import CorruptCheckpointError, StateTypeError
from statekit.runtime.functions import KeyedProcessFunction
from statekit.runtime.timers import TimeDomain
from statekit.serde.keygroups import KeyGroupRange, key_group_for_bytes
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from statekit.testing.harness import KeyedOneInputStreamOperatorTestHarness, OperatorSubtaskState

EVENT, PROC = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME
COUNT = ValueStateDescriptor("count", Types.LONG())


class TimerDriver(KeyedProcessFunction):
    """Registers and deletes timers as its elements say; every fired timer is an output.

    An element is ``(key, action, timestamp)`` with action ``"event"``, ``"proc"``,
    ``"del-event"``, ``"del-proc"`` or ``"count"``; a fired timer outputs ``(key, timestamp,
    domain name, count)`` and, when ``then`` maps its timestamp to another, registers that one in
    the same domain (a timer registered inside ``on_timer``)."""

    def __init__(self, then: dict[int, int] | None = None) -> None:
        self.then = dict(then or {})

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(COUNT)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterable[Any]:
        _, action, timestamp = value
        timers = ctx.timer_service()
        {"event": timers.register_event_time_timer,
         "proc": timers.register_processing_time_timer,
         "del-event": timers.delete_event_time_timer,
         "del-proc": timers.delete_processing_time_timer,
         "count": lambda _: self.count.update((self.count.value() or 0) + 1)}[action](timestamp)
        return ()

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterable[Any]:
        assert ctx.timestamp() == timestamp
        yield ctx.get_current_key(), timestamp, ctx.time_domain().name, self.count.value()
        following = self.then.get(timestamp)
        if following is not None:
            timers = ctx.timer_service()
            if ctx.time_domain() is EVENT:
                timers.register_event_time_timer(following)
            else:
                timers.register_processing_time_timer(following)


def keys_in(key_groups: KeyGroupRange, max_parallelism: int, n: int, seed: int = 7) -> list[int]:
    """``n`` distinct int keys whose key groups lie in ``key_groups``."""
    from statekit.serde.keys import as_key_serializer
    from statekit.serde.types import serializer_for

    ser = as_key_serializer(serializer_for(Types.INT()))
    rng, keys = random.Random(seed), []
    while len(keys) < n:
        key = rng.randrange(-(2**31), 2**31)
        if key not in keys and key_group_for_bytes(ser.serialize(key), max_parallelism) in key_groups:
            keys.append(key)
    return keys


class TimerConformance:
    """Timer semantics every keyed backend must have (Flink's timer service tests, ported)."""

    @pytest.fixture
    def state_backend(self) -> StateBackend:
        raise NotImplementedError("provide a state_backend fixture")

    @pytest.fixture
    def other_backend(self) -> StateBackend:
        """The backend snapshots are also restored into (default: the heap backend)."""
        from statekit.backends.heap import HashMapStateBackend

        return HashMapStateBackend()

    def harness(self, backend: StateBackend, *, then: dict[int, int] | None = None,
                parallelism: int = 1, index: int = 0, max_parallelism: int = 128
                ) -> KeyedOneInputStreamOperatorTestHarness:
        h = KeyedOneInputStreamOperatorTestHarness(
            TimerDriver(then), lambda v: v[0], Types.INT(), backend=backend,
            parallelism=parallelism, subtask_index=index, max_parallelism=max_parallelism)
        return h

    # --- time ----------------------------------------------------------------------------------

    def test_current_processing_time(self, state_backend: StateBackend) -> None:
        with self.harness(state_backend) as h:
            h.open()
            h.set_processing_time(17)
            assert h.operator.timer_service.current_processing_time() == 17  # type: ignore[union-attr]
            h.set_processing_time(42)
            assert h.operator.timer_service.current_processing_time() == 42  # type: ignore[union-attr]

    def test_current_event_time(self, state_backend: StateBackend) -> None:
        with self.harness(state_backend) as h:
            h.process_watermark(17)
            assert h.current_watermark() == 17
            h.process_watermark(42)
            assert h.current_watermark() == 42
            h.process_watermark(30)  # a watermark never goes back
            assert h.current_watermark() == 42

    # --- set, fire, delete ---------------------------------------------------------------------

    @pytest.mark.parametrize("domain", ["event", "proc"])
    def test_set_and_fire_timers(self, state_backend: StateBackend, domain: str) -> None:
        with self.harness(state_backend) as h:
            key1, key2 = keys_in(h.key_groups, 128, 2)
            for key in (key1, key2):
                for ts in (10, 11):  # Flink's "ciao" and "hello" namespaces
                    h.process_element((key, domain, ts))
            counts = (h.num_event_time_timers(), h.num_processing_time_timers())
            assert counts == ((4, 0) if domain == "event" else (0, 4))
            self._advance(h, domain, 11)
            fired = h.extract_output_values()
            assert sorted(fired) == sorted((k, t, (EVENT if domain == "event" else PROC).name, None)
                                           for k in (key1, key2) for t in (10, 11))
            assert [t for _, t, _, _ in fired] == sorted(t for _, t, _, _ in fired)
            assert (h.num_event_time_timers(), h.num_processing_time_timers()) == (0, 0)

    @pytest.mark.parametrize("domain", ["event", "proc"])
    def test_delete_timers(self, state_backend: StateBackend, domain: str) -> None:
        with self.harness(state_backend) as h:
            key1, key2 = keys_in(h.key_groups, 128, 2)
            for key in (key1, key2):
                for ts in (10, 11):
                    h.process_element((key, domain, ts))
            h.process_element((key1, "del-" + domain, 11))
            h.process_element((key2, "del-" + domain, 10))
            h.process_element((key2, "del-" + domain, 99))  # never registered: nothing happens
            self._advance(h, domain, 11)
            fired = {(k, t) for k, t, _, _ in h.extract_output_values()}
            assert fired == {(key1, 10), (key2, 11)}
            assert (h.num_event_time_timers(), h.num_processing_time_timers()) == (0, 0)

    def test_registering_twice_is_one_timer(self, state_backend: StateBackend) -> None:
        with self.harness(state_backend) as h:
            (key,) = keys_in(h.key_groups, 128, 1)
            for _ in range(3):
                h.process_element((key, "event", 10))
                h.process_element((key, "proc", 10))
            assert (h.num_event_time_timers(), h.num_processing_time_timers()) == (1, 1)
            assert h.timers_of(key, EVENT) == [10] and h.timers_of(key, PROC) == [10]
            h.process_watermark(10)
            h.set_processing_time(10)
            assert len(h.extract_output_values()) == 2

    def test_domains_are_separate(self, state_backend: StateBackend) -> None:
        """An event-time timer does not fire on processing time, nor the other way round, and
        deleting one domain's timer leaves the other's."""
        with self.harness(state_backend) as h:
            (key,) = keys_in(h.key_groups, 128, 1)
            h.process_element((key, "event", 10))
            h.process_element((key, "proc", 10))
            h.process_element((key, "del-proc", 10))
            h.set_processing_time(100)
            assert h.extract_output_values() == []
            h.process_watermark(10)
            assert h.extract_output_values() == [(key, 10, "EVENT_TIME", None)]

    def test_only_due_timers_fire(self, state_backend: StateBackend) -> None:
        """Flink's ``testOnlySetsOnePhysicalProcessingTimeTimer``: timers fire as time reaches
        them, earliest first, and the count of pending timers follows."""
        with self.harness(state_backend) as h:
            (key,) = keys_in(h.key_groups, 128, 1)
            for ts in (10, 20, 30, 11, 21):
                h.process_element((key, "proc", ts))
            assert h.num_processing_time_timers() == 5
            h.set_processing_time(10)
            assert h.num_processing_time_timers() == 4
            h.set_processing_time(20)
            assert h.num_processing_time_timers() == 2
            h.set_processing_time(30)
            assert h.num_processing_time_timers() == 0
            assert [t for _, t, _, _ in h.extract_output_values()] == [10, 11, 20, 21, 30]

    def test_timer_registered_in_on_timer(self, state_backend: StateBackend) -> None:
        """Flink's ``testRegisteringProcessingTimeTimerInOnProcessingTimeDoesNotLeak...``: a timer
        registered while one fires is pending once, and fires when its time comes (an event-time
        timer that is due already fires in the same watermark advance)."""
        with self.harness(state_backend, then={10: 20, 20: 30, 5: 7}) as h:
            (key,) = keys_in(h.key_groups, 128, 1)
            h.process_element((key, "proc", 10))
            h.set_processing_time(10)
            assert h.num_processing_time_timers() == 1 and h.timers_of(key, PROC) == [20]
            h.set_processing_time(20)
            assert h.timers_of(key, PROC) == [30]
            h.process_element((key, "event", 5))
            h.process_watermark(8)  # 5 fires, registers 7, which is due too
            assert [(t, d) for _, t, d, _ in h.extract_output_values()] == [
                (10, "PROCESSING_TIME"), (20, "PROCESSING_TIME"), (5, "EVENT_TIME"),
                (7, "EVENT_TIME")]
            assert h.num_event_time_timers() == 0

    def test_timers_see_the_keys_state(self, state_backend: StateBackend) -> None:
        with self.harness(state_backend) as h:
            key1, key2 = keys_in(h.key_groups, 128, 2)
            h.process_element((key1, "count", 0))
            h.process_element((key1, "count", 0))
            h.process_element((key2, "count", 0))
            h.process_element((key1, "event", 5))
            h.process_element((key2, "event", 5))
            h.process_watermark(5)
            assert sorted(h.extract_output_values()) == sorted(
                [(key1, 5, "EVENT_TIME", 2), (key2, 5, "EVENT_TIME", 1)])

    def test_order_across_keys_and_key_groups(self, state_backend: StateBackend) -> None:
        """Many timers over many keys and key groups fire exactly once each, in timestamp order."""
        rng = random.Random(11)
        with self.harness(state_backend) as h:
            keys = keys_in(h.key_groups, 128, 200)
            registered: set[tuple[int, int]] = set()
            for _ in range(1500):
                key, ts = rng.choice(keys), rng.randrange(1000)
                if rng.random() < 0.8:
                    h.process_element((key, "event", ts))
                    registered.add((key, ts))
                else:
                    h.process_element((key, "del-event", ts))
                    registered.discard((key, ts))
            assert h.num_event_time_timers() == len(registered)
            for limit in (-1, 99, 100, 555, 999):
                h.process_watermark(limit)
            fired = [(k, t) for k, t, _, _ in h.extract_output_values()]
            assert sorted(fired) == sorted(registered)
            assert [t for _, t in fired] == sorted(t for _, t in fired)

    def test_timestamps_are_ints(self, state_backend: StateBackend) -> None:
        with self.harness(state_backend) as h:
            (key,) = keys_in(h.key_groups, 128, 1)
            for bad in (1.5, "10", True, None, 2**63):
                with pytest.raises(StateTypeError):
                    h.process_element((key, "event", bad))
            h.process_element((key, "event", -5))  # before the epoch is a time too
            h.process_watermark(-5)
            assert h.extract_output_values() == [(key, -5, "EVENT_TIME", None)]

    # --- snapshots --------------------------------------------------------------------------------

    def _filled(self, backend: StateBackend, key_groups: KeyGroupRange | None = None
                ) -> tuple[OperatorSubtaskState, set[tuple[int, int, str]]]:
        """A snapshot with event and processing timers of several keys (Flink's two keys, each
        with one timer per domain and "namespace"), plus counts."""
        with self.harness(backend) as h:
            keys = keys_in(key_groups or h.key_groups, 128, 6, seed=3)
            timers = set()
            for n, key in enumerate(keys):
                h.process_element((key, "count", 0))
                for domain in ("event", "proc"):
                    ts = 10 + n % 2
                    h.process_element((key, domain, ts))
                    timers.add((key, ts, EVENT.name if domain == "event" else PROC.name))
            h.process_element((keys[0], "event", 1000))  # stays pending
            timers.add((keys[0], 1000, EVENT.name))
            return h.snapshot(), timers

    def _fire_all(self, h: KeyedOneInputStreamOperatorTestHarness) -> set[tuple[int, int, str]]:
        h.set_processing_time(10**12)
        h.process_watermark(10**12)
        return {(k, t, d) for k, t, d, _ in h.extract_output_values()}

    @pytest.mark.parametrize("into", ["same", "other"])
    def test_snapshot_and_restore(self, state_backend: StateBackend, other_backend: StateBackend,
                                  into: str) -> None:
        snapshot, timers = self._filled(state_backend)
        with self.harness(state_backend if into == "same" else other_backend) as h:
            h.initialize_state(snapshot)
            h.open()
            assert h.num_event_time_timers() + h.num_processing_time_timers() == len(timers)
            fired = self._fire_all(h)
            assert fired == timers
            assert all(c == 1 for _, _, _, c in h.extract_output_values())

    @pytest.mark.parametrize("into", ["same", "other"])
    @pytest.mark.parametrize("parallelism", [2, 3])
    def test_snapshot_and_rebalancing_restore(self, state_backend: StateBackend,
                                              other_backend: StateBackend, into: str,
                                              parallelism: int) -> None:
        """Each timer fires exactly once, in the partition that owns its key's key group."""
        snapshot, timers = self._filled(state_backend)
        fired: list[tuple[int, int, str]] = []
        for index in range(parallelism):
            backend = state_backend if into == "same" else other_backend
            with self.harness(backend, parallelism=parallelism, index=index) as h:
                h.initialize_state(snapshot)
                h.open()
                for key, _, _ in self._fire_all(h):
                    assert h.backend.key_group_of(key) in h.key_groups
                fired += [(k, t, d) for k, t, d, _ in h.extract_output_values()]
        assert sorted(fired) == sorted(timers)

    def test_scale_in_restore(self, state_backend: StateBackend) -> None:
        """Snapshots of two partitions restore into one, every timer once."""
        snapshots, timers = [], set()
        for index in range(2):
            with self.harness(state_backend, parallelism=2, index=index) as h:
                for key in keys_in(h.key_groups, 128, 3, seed=index):
                    h.process_element((key, "event", 50 + index))
                    timers.add((key, 50 + index, EVENT.name))
                snapshots.append(h.snapshot())
        with self.harness(state_backend) as h:
            h.initialize_state(snapshots)
            h.open()
            assert self._fire_all(h) == timers

    def test_snapshot_taken_before_later_changes(self, state_backend: StateBackend) -> None:
        """A snapshot holds the timers as they were when it was taken, not later registrations,
        deletions or firings (asynchronous snapshots included)."""
        with self.harness(state_backend) as h:
            key1, key2 = keys_in(h.key_groups, 128, 2)
            h.process_element((key1, "event", 10))
            h.process_element((key2, "event", 20))
            snapshot = h.snapshot()
            h.process_element((key1, "event", 30))
            h.process_element((key2, "del-event", 20))
            h.process_watermark(10)
        with self.harness(state_backend) as h:
            h.initialize_state(snapshot)
            assert self._fire_all(h) == {(key1, 10, "EVENT_TIME"), (key2, 20, "EVENT_TIME")}

    def test_restored_timers_fire_once_after_repeated_snapshots(self, state_backend: StateBackend
                                                                ) -> None:
        """Fired timers are gone from later snapshots: restore, fire some, snapshot, restore."""
        snapshot, timers = self._filled(state_backend)
        with self.harness(state_backend) as h:
            h.initialize_state(snapshot)
            h.process_watermark(10)
            h.set_processing_time(10)
            first = {(k, t, d) for k, t, d, _ in h.extract_output_values()}
            second_snapshot = h.snapshot()
        with self.harness(state_backend) as h:
            h.initialize_state(second_snapshot)
            rest = self._fire_all(h)
        assert not first & rest and first | rest == timers

    @pytest.mark.parametrize("bad", [[3, 2], [1, 1], ["x"], [], [2**64], "10"])
    def test_damaged_timers_are_refused(self, state_backend: StateBackend, bad: Any) -> None:
        """Restored timers that are no sorted list of distinct int timestamps: a typed error,
        never a queue that fires wrongly."""
        from statekit.backends.kvformat import kv_handle, write_plain_entry
        from statekit.backends.timers import TIMERS_KIND, TIMERS_LAYOUT
        from statekit.checkpoint.blobstore.memory import MemoryBlobStore
        from statekit.checkpoint.layout import CheckpointStorageAccess
        from statekit.serde.msgpack import packb

        store = MemoryBlobStore()
        access = CheckpointStorageAccess(store, "memory://harness", 0)
        name = "_timer_state/event_user-timers"
        entry = write_plain_entry(access.streams(1, "t"), name, list(TIMERS_LAYOUT), TIMERS_KIND,
                                  [packb([[1], [bad]])])
        with self.harness(self._heap()) as writer:
            handle = dict(kv_handle(writer.backend, {name: entry}))
        damaged = OperatorSubtaskState(handle, store, 0, 0)
        with self.harness(state_backend) as h, pytest.raises(CorruptCheckpointError):
            h.initialize_state(damaged)
            h.open()
            h.process_element((1, "event", 1))

    @staticmethod
    def _heap() -> StateBackend:
        from statekit.backends.heap import HashMapStateBackend

        return HashMapStateBackend()

    @staticmethod
    def _advance(h: KeyedOneInputStreamOperatorTestHarness, domain: str, time: int) -> None:
        if domain == "event":
            h.process_watermark(time)
        else:
            h.set_processing_time(time)
