"""Flink's ``StateBackendTestBase`` cases on snapshots, ported to statekit: key-group restore at
other parallelisms, restores of state never accessed, empty snapshots, serializer mismatches on
restore, asynchronous and concurrent snapshots, aborted checkpoints and the timer queue.
Subclass :class:`SnapshotConformance` with a ``state_backend`` fixture returning a
:class:`StateBackend`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from statekit.backends.base import SnapshotRun, StateBackend
from statekit.errors import StatekitError, StateNameClashError
from statekit.serde.keygroups import key_group_for_bytes
from statekit.serde.types import Types
from statekit.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)
from statekit.testing.cluster import KeyedCluster
from statekit.testing.conformance.backend import ManualClock, refuses_full_snapshot_cleanup
from statekit.testing.conformance.statekinds import (
    STRING_KEYS,
    ImmutableAdding,
    appending,
    at,
    entries,
    single,
)


def begin(cluster: KeyedCluster) -> tuple[int, dict[str, SnapshotRun]]:
    """The synchronous part of a checkpoint of every partition: its id and the runs."""
    cid = cluster.next_checkpoint
    cluster.next_checkpoint += 1
    return cid, {f"p{i}": b.snapshot(cid, cluster.access.streams(cid, f"p{i}"))
                 for i, b in enumerate(cluster.partitions)}


def finish(cluster: KeyedCluster, cid: int, handles: dict[str, Any]) -> int:
    """Commit a checkpoint whose runs returned ``handles`` and tell the partitions."""
    cluster.access.commit(cid, {"tasks": handles, "max_parallelism": cluster.max_parallelism})
    for backend in cluster.partitions:
        backend.notify_checkpoint_complete(cid)
    cluster.completed.append(cid)
    return cid


def key_in_group(cluster: KeyedCluster, group: int, start: int = 0) -> int:
    """The first INT key from ``start`` in key group ``group``."""
    key = start
    while key_group_for_bytes(cluster.key_serializer.serialize(key),
                              cluster.max_parallelism) != group:
        key += 1
    return key


VALUE_TEST = ValueStateDescriptor("test", Types.INT())


class SnapshotConformance:
    """Snapshots and restores as Flink's backend tests check them."""

    @pytest.fixture
    def cluster(self, state_backend: StateBackend, tmp_path: Any) -> Iterator[KeyedCluster]:
        cluster = single(state_backend, tmp_path)
        yield cluster
        cluster.close()

    # --- testKeyGroupSnapshotRestoreScale(Up|Down), testKeyGroupsSnapshotRestore(NoRescale|
    #     ScaleUpUnEvenDistribute|ScaleDownUnEvenDistribute) ----------------------------------------

    @pytest.mark.parametrize("source,target", [(4, 2), (2, 4), (2, 2), (15, 77), (77, 15)])
    def test_key_group_snapshot_restore(self, state_backend: StateBackend, tmp_path: Any,
                                        source: int, target: int) -> None:
        """128 key groups, a key in each; each partition writes a state of its own (partitions
        of one operator may hold different states; Flink names one per key group); after a
        restore at another parallelism each key group's value is in the partition owning it."""
        cluster = single(state_backend, tmp_path, max_parallelism=128, parallelism=source)
        try:
            keys, owner, expected = {}, {}, {}
            for index, backend in enumerate(cluster.partitions):
                descriptor = ValueStateDescriptor(f"state{index}", Types.STRING())
                state: Any = backend.get_partitioned_state(descriptor)
                for group in backend.key_group_range:
                    keys[group] = key_in_group(cluster, group, start=group * 1000)
                    owner[group], expected[group] = index, f"{index}:{group}"
                    at(backend, keys[group], state).update(expected[group])
            cluster.restore(cluster.checkpoint(), parallelism=target)
            got = {}
            for backend in cluster.partitions:
                for group in backend.key_group_range:
                    descriptor = ValueStateDescriptor(f"state{owner[group]}", Types.STRING())
                    state = at(backend, keys[group], backend.get_partitioned_state(descriptor))
                    got[group] = state.value()
                    other = ValueStateDescriptor(f"state{(owner[group] + 1) % source}",
                                                 Types.STRING())
                    if source > 1:  # no other partition's state holds this group's key
                        assert at(backend, keys[group],
                                  backend.get_partitioned_state(other)).value() is None
            assert got == expected
        finally:
            cluster.close()

    def test_each_kind_restores_after_rescale(self, state_backend: StateBackend,
                                              tmp_path: Any) -> None:
        """Every state kind, 2 -> 3 -> 1 partitions, each key's state whole."""
        cluster = single(state_backend, tmp_path, max_parallelism=128, parallelism=2)
        kinds: dict[str, StateDescriptor] = {
            "value": ValueStateDescriptor("v", Types.INT()),
            "list": ListStateDescriptor("l", Types.INT()),
            "map": MapStateDescriptor("m", Types.INT(), Types.STRING()),
            "reducing": ReducingStateDescriptor("r", appending, Types.STRING()),
            "aggregating": AggregatingStateDescriptor("a", ImmutableAdding(), Types.LONG())}

        def read(key: int) -> tuple[Any, ...]:
            s: Any = {k: cluster.state(key, d) for k, d in kinds.items()}
            return (s["value"].value(), s["list"].get(), dict(s["map"].items()),
                    s["reducing"].get(), s["aggregating"].get())

        try:
            for key in range(60):
                s: Any = {k: cluster.state(key, d) for k, d in kinds.items()}
                s["value"].update(key)
                s["list"].add_all([key, -key])
                s["map"].put_all({key: str(key), -1: "x"})
                for part in ("a", str(key)):
                    s["reducing"].add(part)
                    s["aggregating"].add(key)
            expected = {key: read(key) for key in range(60)}
            assert expected[7] == (7, [7, -7], {7: "7", -1: "x"}, "a,7", 14)
            for parallelism in (3, 1):
                cluster.restore(cluster.checkpoint(), parallelism=parallelism)
                assert {key: read(key) for key in range(60)} == expected
        finally:
            cluster.close()

    def test_snapshot_non_accessed_state(self, state_backend: StateBackend,
                                         tmp_path: Any) -> None:
        """A restored state nobody registered again is in the next snapshot."""
        cluster = single(state_backend, tmp_path, STRING_KEYS)
        descriptor = MapStateDescriptor("test-name", Types.INT(), Types.STRING())
        try:
            for key, (user_key, value) in {"1": (11, "foo"), "2": (8, "bar"),
                                           "3": (91, "hello world")}.items():
                cluster.state(key, descriptor).put(user_key, value)  # type: ignore[attr-defined]
            cluster.restore(cluster.checkpoint())
            cluster.restore(cluster.checkpoint())  # nothing accessed in between
            got = {key: cluster.state(key, descriptor).get(uk)  # type: ignore[attr-defined]
                   for key, uk in (("1", 11), ("2", 8), ("3", 91))}
            assert got == {"1": "foo", "2": "bar", "3": "hello world"}
        finally:
            cluster.close()

    def test_empty_state_checkpointing(self, cluster: KeyedCluster) -> None:
        cluster.restore(cluster.checkpoint())
        assert entries(cluster, "id") == []
        assert cluster.state(1, ListStateDescriptor("id", Types.STRING())).get() == []  # type: ignore[attr-defined]
        cluster.restore(cluster.checkpoint())  # a registered but empty state, too
        assert cluster.state(1, ListStateDescriptor("id", Types.STRING())).get() == []  # type: ignore[attr-defined]

    # --- testValue|List|Reducing|MapStateRestoreWithWrongSerializers ------------------------------

    WRONG: dict[str, tuple[StateDescriptor, StateDescriptor]] = {
        "value": (ValueStateDescriptor("id", Types.STRING()),
                  ValueStateDescriptor("id", Types.FLOAT())),
        "list": (ListStateDescriptor("id", Types.STRING()),
                 ListStateDescriptor("id", Types.FLOAT())),
        "reducing": (ReducingStateDescriptor("id", appending, Types.STRING()),
                     ReducingStateDescriptor("id", appending, Types.FLOAT())),
        "map": (MapStateDescriptor("id", Types.STRING(), Types.STRING()),
                MapStateDescriptor("id", Types.FLOAT(), Types.STRING())),
        "map-values": (MapStateDescriptor("id", Types.STRING(), Types.STRING()),
                       MapStateDescriptor("id", Types.STRING(), Types.INT())),
        "value-as-list": (ValueStateDescriptor("id", Types.STRING()),
                          ListStateDescriptor("id", Types.STRING())),
        "int-as-long": (ValueStateDescriptor("id", Types.INT()),
                        ValueStateDescriptor("id", Types.LONG())),
    }

    @pytest.mark.parametrize("kind", list(WRONG))
    def test_restore_with_wrong_serializers(self, cluster: KeyedCluster, kind: str) -> None:
        """A state restored under another value (or user key) type is refused with a typed error
        naming it (Flink: StateMigrationException); the right type still reads it."""
        right, wrong = self.WRONG[kind]
        value = 2 if kind == "int-as-long" else "2"

        def write(state: Any) -> None:
            (state.put("2", "First") if isinstance(right, MapStateDescriptor) else
             state.update(value) if isinstance(right, ValueStateDescriptor) else state.add("2"))

        def read(state: Any) -> Any:
            return (dict(state.items()) if isinstance(right, MapStateDescriptor) else
                    state.value() if isinstance(right, ValueStateDescriptor) else state.get())

        write(cluster.state(2, right))
        expected = read(cluster.state(2, right))
        cluster.restore(cluster.checkpoint())
        with pytest.raises(StateNameClashError, match="'id'"):
            cluster.state(1, wrong)
        assert read(cluster.state(2, right)) == expected and expected not in (None, [], {})

    # --- testAsyncSnapshot / testParallelAsyncSnapshots / concurrency -----------------------------

    def test_async_snapshot(self, cluster: KeyedCluster) -> None:
        """Writes while the snapshot's asynchronous part runs on another thread are live, and
        absent from the snapshot."""
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(VALUE_TEST)
        for i in range(10):
            at(backend, i, state).update(i)
        cid, runs = begin(cluster)
        handles: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: handles.update(p0=runs["p0"].run()))
        runner.start()
        for i in range(20):
            at(backend, i, state).update(i + 1)
        runner.join()
        assert {i: at(backend, i, state).value() for i in range(20)} == {
            i: i + 1 for i in range(20)}
        cluster.restore(finish(cluster, cid, handles))
        restored: Any = cluster.partitions[0].get_partitioned_state(VALUE_TEST)
        assert {i: at(cluster.partitions[0], i, restored).value() for i in range(12)} == {
            **{i: i for i in range(10)}, 10: None, 11: None}

    def test_parallel_async_snapshots(self, cluster: KeyedCluster) -> None:
        """A second snapshot taken and completed while the first one's asynchronous part still
        runs; both hold what was there at their synchronous part."""
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(VALUE_TEST)
        for i in range(10):
            at(backend, i, state).update(i)
        first, first_runs = begin(cluster)
        for i in range(5, 15):
            at(backend, i, state).update(i + 1)
        second, second_runs = begin(cluster)
        handles: dict[int, dict[str, Any]] = {}
        runner = threading.Thread(target=lambda: handles.update({first: {"p0":
                                                                         first_runs["p0"].run()}}))
        runner.start()
        handles[second] = {"p0": second_runs["p0"].run()}
        runner.join()
        finish(cluster, second, handles[second])
        finish(cluster, first, handles[first])
        for cid, expected in ((first, {i: i for i in range(10)}),
                              (second, {i: i if i < 5 else i + 1 for i in range(15)})):
            cluster.restore(cid)
            restored: Any = cluster.partitions[0].get_partitioned_state(VALUE_TEST)
            assert {i: at(cluster.partitions[0], i, restored).value() for i in range(16)} == {
                **{i: None for i in range(16)}, **expected}

    def test_snapshots_while_registering_states(self, cluster: KeyedCluster) -> None:
        """testCheckConcurrencyProblemWhenPerformingCheckpointAsync: a state registered and
        written between snapshots whose asynchronous parts run on another thread."""
        backend = cluster.partitions[0]
        with ThreadPoolExecutor(1) as pool:
            futures = []
            for i in range(10):
                state: Any = at(backend, i, backend.get_partitioned_state(
                    ValueStateDescriptor(f"id{i}", Types.INT())))
                state.update(i)
                cid, runs = begin(cluster)
                futures.append((cid, pool.submit(runs["p0"].run)))
            handles = [(cid, future.result(timeout=20)) for cid, future in futures]
        for cid, handle in handles:
            finish(cluster, cid, {"p0": handle})
        cluster.restore()
        assert [cluster.state(i, ValueStateDescriptor(f"id{i}", Types.INT())).value()  # type: ignore[attr-defined]
                for i in range(10)] == list(range(10))

    def test_concurrent_snapshots_with_ttl_cleanup(self, state_backend: StateBackend,
                                                   tmp_path: Any) -> None:
        """testNonConcurrentSnapshotTransformerAccess: two snapshots that drop expired entries
        (full-snapshot TTL cleanup) run at once; each drops exactly the expired ones."""
        from statekit.checkpoint.filesystem import FileSystemCheckpointStorage

        clock = ManualClock()
        cluster = KeyedCluster(state_backend, FileSystemCheckpointStorage(str(tmp_path / "c")), 1,
                               key_serializer=Types.INT().get_serializer(), clock=clock)
        descriptor = ValueStateDescriptor("ttl", Types.INT())
        descriptor.enable_time_to_live(
            StateTtlConfig.new_builder(Time.seconds(10)).cleanup_full_snapshot().build())
        try:
            if refuses_full_snapshot_cleanup(cluster, descriptor, 0):
                return
            for i in range(200):
                cluster.state(i, descriptor).update(i)  # type: ignore[attr-defined]
                if i == 99:
                    clock.now += 6_000
            clock.now += 6_000  # the first hundred expired
            runs = [begin(cluster) for _ in range(2)]
            with ThreadPoolExecutor(2) as pool:
                done = [(cid, pool.submit(r["p0"].run)) for cid, r in runs]
                handles = [(cid, future.result(timeout=20)) for cid, future in done]
            clock.now -= 12_000  # read back before anything expired: only dropped ones are gone
            for cid, handle in handles:
                cluster.restore(finish(cluster, cid, {"p0": handle}))
                values = [cluster.state(i, descriptor).value()  # type: ignore[attr-defined]
                          for i in range(200)]
                assert values == [None] * 100 + list(range(100, 200))
        finally:
            cluster.close()

    # --- testAsyncSnapshotCancellation; statekit: aborted checkpoints ---------------------------

    def test_dispose_cancels_an_in_flight_snapshot(self, cluster: KeyedCluster) -> None:
        """A backend disposed between a snapshot's two parts fails the asynchronous part (it
        never returns a handle); the last completed checkpoint still restores."""
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(VALUE_TEST)
        for i in range(10):
            at(backend, i, state).update(i)
        done = cluster.checkpoint()
        at(backend, 0, state).update(100)
        _, runs = begin(cluster)
        backend.dispose()
        with pytest.raises(StatekitError, match="disposed"):
            runs["p0"].run()
        cluster.restore(done)
        assert cluster.state(0, VALUE_TEST).value() == 0  # type: ignore[attr-defined]

    def test_aborted_checkpoint_leaves_the_next_whole(self, cluster: KeyedCluster) -> None:
        """A checkpoint aborted after its synchronous part (cancelled, never committed) does not
        disturb the next: the next restores everything, the aborted one cannot be restored."""
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(VALUE_TEST)
        for i in range(10):
            at(backend, i, state).update(i)
        cluster.checkpoint()
        aborted, runs = begin(cluster)
        at(backend, 3, state).update(33)
        runs["p0"].cancel()
        backend.notify_checkpoint_aborted(aborted)
        at(backend, 4, state).clear()
        cluster.restore(cluster.checkpoint())
        assert aborted not in cluster.completed
        restored: Any = cluster.partitions[0].get_partitioned_state(VALUE_TEST)
        assert [at(cluster.partitions[0], i, restored).value() for i in range(6)] == [
            0, 1, 2, 33, None, 5]

    @pytest.mark.parametrize("bulk", [False, True], ids=["add", "add-all"])
    def test_priority_queue(self, cluster: KeyedCluster, bulk: bool) -> None:
        """Flink's key-grouped priority queue is statekit's timer queue: one entry per (key,
        time), earliest first, entries removable, across a restore."""
        queue = cluster.partitions[0].timer_queue("key-grouped-priority-queue")
        assert queue is not None
        elements = [("a", 44), ("b", 1), ("b", 1), ("b", 3), ("a", 42)]
        added = [queue.add(key, ts) for key, ts in elements]
        if not bulk:
            assert added == [True, True, False, True, True]
        assert len(queue) == 4 and queue.timers_of("a") == [42, 44]
        assert queue.peek() == 1 and queue.poll(1_000) == ("b", 1) and queue.peek() == 3
        assert len(queue) == 3
        assert not queue.remove("b", 1) and queue.remove("b", 3) and queue.peek() == 42
        cluster.restore(cluster.checkpoint())
        restored = cluster.partitions[0].timer_queue("key-grouped-priority-queue")
        assert restored is not None
        assert list(restored.drain(1_000)) == [("a", 42), ("a", 44)] and len(restored) == 0
