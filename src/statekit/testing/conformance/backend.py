"""The keyed state backend conformance suite: subclass :class:`BackendConformance` with a
``state_backend`` fixture returning a :class:`StateBackend`; each case runs against every storage
from the ``checkpoint_storage`` fixture (JobManager, local files, fsspec memory — override it to
add more), through public interfaces only."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Iterator
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.backends.bulk import BulkState
from statekit.checkpoint.base import CheckpointStorage
from statekit.errors import (
    InvalidStateNameError,
    NoKeyContextError,
    StateError,
    StatekitError,
    StateNameClashError,
    StateTypeError,
)
from statekit.serde.types import Types
from statekit.state.descriptors import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    Time,
    ValueStateDescriptor,
)
from statekit.testing.cluster import KeyedCluster
from statekit.testing.conformance.bulk import BulkStateConformance
from statekit.testing.conformance.storage import STORAGE_KINDS, make_storage


class _Avg(AggregateFunction):
    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[int]) -> float:
        return accumulator[0] / accumulator[1]


class ManualClock:
    """A settable millisecond clock for TTL tests."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


VALUE = ValueStateDescriptor("v", Types.LONG())
LIST = ListStateDescriptor("l", Types.STRING())
MAP = MapStateDescriptor("m", Types.STRING(), Types.LIST(Types.INT()))
REDUCE = ReducingStateDescriptor("r", lambda a, b: a + b, Types.LONG())
AGG = AggregatingStateDescriptor("a", _Avg(), Types.LIST(Types.LONG()))


def refuses_full_snapshot_cleanup(cluster: KeyedCluster, descriptor: Any, key: Any = "k") -> bool:
    """Whether the backend refuses ``descriptor``'s full-snapshot TTL cleanup where it cannot
    apply it (RocksDB's changelog checkpoints), with a typed error at registration: the case
    then ends there, having checked the refusal."""
    try:
        cluster.state(key, descriptor)
    except StateError as exc:
        assert "cleanup_full_snapshot" in str(exc)
        return True
    return False


class BackendConformance(BulkStateConformance):
    """The behaviour every keyed state backend must have, over every storage (bulk access to
    list and map state: :class:`BulkStateConformance`)."""

    @pytest.fixture(params=STORAGE_KINDS)
    def checkpoint_storage(self, request: Any, tmp_path: Any) -> CheckpointStorage:
        return make_storage(request.param, tmp_path)

    @pytest.fixture
    def cluster(self, state_backend: StateBackend, checkpoint_storage: CheckpointStorage
                ) -> Iterator[KeyedCluster]:
        cluster = KeyedCluster(state_backend, checkpoint_storage, parallelism=2)
        yield cluster
        cluster.close()

    # --- semantics -------------------------------------------------------------------------------

    def test_value_state(self, cluster: KeyedCluster) -> None:
        s = cluster.state("a", VALUE)
        assert s.value() is None
        s.update(5)
        assert cluster.state("a", VALUE).value() == 5
        assert cluster.state("b", VALUE).value() is None
        cluster.state("a", VALUE).update(None)
        assert cluster.state("a", VALUE).value() is None

    def test_list_state(self, cluster: KeyedCluster) -> None:
        s = cluster.state("k", LIST)
        assert list(s.get()) == []
        s.add("x")
        s.add_all(["y", "z"])
        assert list(cluster.state("k", LIST).get()) == ["x", "y", "z"]
        cluster.state("k", LIST).update(["q"])
        assert list(cluster.state("k", LIST)) == ["q"]
        with pytest.raises(StateError, match="'l'"):
            cluster.state("k", LIST).add(None)
        for call in ("add_all", "update"):  # Flink: "List of values to add cannot be null"
            with pytest.raises(StateError, match="cannot be None"):
                getattr(cluster.state("k", LIST), call)(None)
        assert list(cluster.state("k", LIST)) == ["q"]  # nothing lost by the refusal
        cluster.state("k", LIST).update([])  # an empty list clears
        assert list(cluster.state("k", LIST)) == []
        cluster.state("k", LIST).clear()
        assert list(cluster.state("k", LIST).get()) == []

    def test_map_state(self, cluster: KeyedCluster) -> None:
        s = cluster.state("k", MAP)
        assert s.is_empty()
        s.put("a", [1])
        s.put_all({"b": [2], "c": [3]})
        assert s.get("a") == [1] and s.contains("b") and not s.contains("zz")
        s.remove("b")
        assert sorted(s.keys()) == ["a", "c"]
        assert sorted(s.values()) == [[1], [3]]
        assert dict(s.items()) == {"a": [1], "c": [3]}
        assert s["c"] == [3] and "a" in s
        assert cluster.state("other", MAP).is_empty()
        s.clear()
        assert cluster.state("k", MAP).is_empty()

    def test_reducing_and_aggregating_state(self, cluster: KeyedCluster) -> None:
        for n in (1, 2, 3):
            cluster.state("k", REDUCE).add(n)
            cluster.state("k", AGG).add(n)
        assert cluster.state("k", REDUCE).get() == 6
        assert cluster.state("k", AGG).get() == 2.0
        assert cluster.state("other", AGG).get() is None

    def test_typed_errors(self, cluster: KeyedCluster) -> None:
        with pytest.raises(StateTypeError, match="'v'"):
            cluster.state("k", VALUE).update("not a long")
        with pytest.raises(StateTypeError, match="'m'"):
            cluster.state("k", MAP).put("a", ["x"])
        with pytest.raises(StateNameClashError, match="'v'"):
            cluster.state("k", ListStateDescriptor("v", Types.LONG()))
        longs = ListStateDescriptor("longs", Types.LONG())
        counts = MapStateDescriptor("counts", Types.STRING(), Types.LONG())
        cluster.state("k", longs).add_all([1, 2])
        cluster.state("k", counts).put("a", 1)
        for bad in (1 << 63, True, 1.5):  # out of range, a subclass, another type
            with pytest.raises(StateTypeError):
                cluster.state("k", VALUE).update(bad)
            with pytest.raises(StateTypeError):
                cluster.state("k", longs).add(bad)
            with pytest.raises(StateTypeError):
                cluster.state("k", longs).add_all([3, bad])
            with pytest.raises(StateTypeError):
                cluster.state("k", longs).update([bad])
            with pytest.raises(StateTypeError):
                cluster.state("k", counts).put("b", bad)
        with pytest.raises(StateError):
            cluster.state("k", longs).add_all([3, None])
        with pytest.raises(StateTypeError):
            cluster.state("k", counts).put(7, 1)  # a user key of another type
        assert list(cluster.state("k", longs).get()) == [1, 2]  # failed calls changed nothing
        assert dict(cluster.state("k", counts).items()) == {"a": 1}
        backend = cluster.partitions[0]
        state = backend.get_partitioned_state(ValueStateDescriptor("fresh", Types.LONG()))
        fresh = cluster.backend_factory.create_keyed_state_backend(
            key_serializer=cluster.key_serializer, key_group_range=backend.key_group_range,
            max_parallelism=cluster.max_parallelism)
        try:
            with pytest.raises(NoKeyContextError, match="'fresh'"):
                fresh.get_partitioned_state(ValueStateDescriptor("fresh", Types.LONG())).value()
        finally:
            fresh.dispose()
        assert state is backend.get_partitioned_state(ValueStateDescriptor("fresh", Types.LONG()))

    def test_ttl_expiry(self, state_backend: StateBackend, checkpoint_storage: CheckpointStorage
                        ) -> None:
        clock = ManualClock()
        cluster = KeyedCluster(state_backend, checkpoint_storage, 1, clock=clock)
        ttl = StateTtlConfig.new_builder(Time.seconds(10)).cleanup_full_snapshot().build()
        v = ValueStateDescriptor("ttl_v", Types.LONG())
        v.enable_time_to_live(ttl)
        m = MapStateDescriptor("ttl_m", Types.STRING(), Types.LONG())
        m.enable_time_to_live(ttl)
        lst = ListStateDescriptor("ttl_l", Types.LONG())
        lst.enable_time_to_live(ttl)
        try:
            if refuses_full_snapshot_cleanup(cluster, v):
                return
            cluster.state("k", v).update(1)
            cluster.state("k", m).put("old", 1)
            cluster.state("k", lst).add(1)
            clock.now += 6_000
            cluster.state("k", m).put("new", 2)
            cluster.state("k", lst).add(2)
            clock.now += 6_000
            assert cluster.state("k", v).value() is None
            assert dict(cluster.state("k", m).items()) == {"new": 2}
            assert list(cluster.state("k", lst).get()) == [2]
            cluster.state("k2", v).update(7)
            clock.now += 11_000
            cluster.checkpoint()  # full-snapshot cleanup drops k2's expired value
            clock.now -= 11_000
            cluster.restore()
            assert cluster.state("k2", v).value() is None
        finally:
            cluster.close()

    # --- one key semantics -----------------------------------------------------------------------

    def test_equal_keys_are_one_key(self, cluster: KeyedCluster) -> None:
        """Keys Python calls equal are one key, also after a rescaling restore."""
        d = ValueStateDescriptor("any", None)
        utc, plus1 = dt.UTC, dt.timezone(dt.timedelta(hours=1))
        groups = [
            [1, 1.0, True, decimal.Decimal("1.000")],
            [0, -0.0, False],
            [(1, "a"), (True, "a"), (1.0, "a")],
            [frozenset({1, "a", b"b"}), frozenset({True, "a", b"b"})],
            [decimal.Decimal("1.50"), decimal.Decimal("1.5"), 1.5],
            [dt.datetime(2026, 1, 1, 12, tzinfo=utc), dt.datetime(2026, 1, 1, 13, tzinfo=plus1)],
            [2**70, float(2**70)],
            [None],
        ]
        for n, group in enumerate(groups):
            cluster.state(group[0], d).update(n)

        def check() -> None:
            for n, group in enumerate(groups):
                assert [cluster.state(key, d).value() for key in group] == [n] * len(group)
            assert cluster.state(2, d).value() is None
            assert cluster.state(1.5000001, d).value() is None

        check()
        cluster.checkpoint()
        cluster.restore(parallelism=3)
        check()

    def test_keys_no_backend_can_hold_are_typed_errors(self, cluster: KeyedCluster) -> None:
        deep: Any = 1
        for _ in range(40):
            deep = (deep,)
        bad = [float("nan"), (1, float("nan")), decimal.Decimal("NaN"), [1], {1: 2}, {1}, (1, [2]),
               bytearray(b"x"), deep, dt.time(1, tzinfo=dt.UTC), object()]
        backend = cluster.partitions[0]
        state = backend.get_partitioned_state(VALUE)
        for key in bad:
            with pytest.raises(StateTypeError, match="invalid key"):
                backend.set_current_key(key)
                state.value()
        backend.set_current_key("fine")
        state.update(1)
        assert state.value() == 1

    def test_state_names_every_backend_can_hold(self, cluster: KeyedCluster) -> None:
        for name in ("a\x00b", "\ud800", "x" * 1025, ""):
            with pytest.raises(InvalidStateNameError):
                ValueStateDescriptor(name, Types.LONG())
        forged = ValueStateDescriptor("ok", Types.LONG())
        forged.name = "bad\x00"  # registration checks names too
        with pytest.raises(InvalidStateNameError):
            cluster.state("k", forged)
        names = ["default", "a/b", "new\nline", "ü😀", " ", "x" * 1024]
        for n, name in enumerate(names):  # values large enough to be files, named by the state
            cluster.state("k", ValueStateDescriptor(name, Types.STRING())).update(str(n) * 200)
        cluster.checkpoint()
        cluster.restore()
        assert [cluster.state("k", ValueStateDescriptor(name, Types.STRING())).value()
                for name in names] == [str(n) * 200 for n in range(len(names))]

    # --- key types -------------------------------------------------------------------------------

    def test_restore_with_wrong_key_serializer(self, state_backend: StateBackend,
                                               checkpoint_storage: CheckpointStorage) -> None:
        """Flink's testRestoreWithWrongKeySerializer: INT keys do not restore as DOUBLE or STRING
        keys (1 would read back as 1.0, "1" would find nothing)."""
        ints = Types.INT().get_serializer()
        cluster = KeyedCluster(state_backend, checkpoint_storage, 2, key_serializer=ints)
        ident = ValueStateDescriptor("id", Types.STRING())
        try:
            cluster.state(1, ident).update("1")
            cluster.state(2, ident).update("2")
            cluster.checkpoint()
            for wrong, name in ((Types.DOUBLE(), "DOUBLE"), (Types.STRING(), "STRING")):
                with pytest.raises(StateTypeError, match=rf"keys are INT.* key type is {name}"):
                    cluster.restore(key_serializer=wrong.get_serializer())
            cluster.restore(key_serializer=ints)
            assert [cluster.state(k, ident).value() for k in (1, 2)] == ["1", "2"]
        finally:
            cluster.close()

    def test_key_serializer_upgrade(self, state_backend: StateBackend,
                                    checkpoint_storage: CheckpointStorage) -> None:
        """Flink's testKeySerializerUpgrade with a compatible new key type: a wider one holds
        every key unchanged; the state reads back, and snapshots again under the new type."""
        cluster = KeyedCluster(state_backend, checkpoint_storage, 2,
                               key_serializer=Types.INT().get_serializer())
        try:
            cluster.state(123, VALUE).update(1)
            cluster.state(456, VALUE).update(5)
            cluster.checkpoint()
            cluster.restore(key_serializer=Types.LONG().get_serializer())
            assert [cluster.state(k, VALUE).value() for k in (123, 456)] == [1, 5]
            cluster.state(1 << 40, VALUE).update(7)  # a LONG key no INT holds
            cluster.checkpoint()
            with pytest.raises(StateTypeError, match=r"keys are LONG.* key type is INT"):
                cluster.restore(key_serializer=Types.INT().get_serializer())
            cluster.restore(key_serializer=Types.LONG().get_serializer(), parallelism=3)
            assert [cluster.state(k, VALUE).value() for k in (123, 456, 1 << 40)] == [1, 5, 7]
        finally:
            cluster.close()

    def test_declared_key_type_is_enforced_at_access(self, state_backend: StateBackend,
                                                     checkpoint_storage: CheckpointStorage
                                                     ) -> None:
        cluster = KeyedCluster(state_backend, checkpoint_storage, 1,
                               key_serializer=Types.STRING().get_serializer())
        try:
            backend = cluster.partitions[0]
            state = backend.get_partitioned_state(VALUE)
            backend.set_current_key("1")
            state.update(1)
            for bad in (1, 1.0, True, b"1", ("1",), None):
                with pytest.raises(StateTypeError, match="declared key type STRING"):
                    backend.set_current_key(bad)
                assert backend.get_current_key() == "1" and state.value() == 1  # unchanged
            bulk = BulkState(backend)
            with pytest.raises(StateTypeError, match="declared key type STRING"):
                bulk.put(VALUE, ["2", 2], [2, 2])
            with pytest.raises(StateTypeError, match="declared key type STRING"):
                bulk.get(VALUE, ["1", 1])
            assert bulk.get(VALUE, ["1", "2"]) == [1, None]  # the failed put wrote nothing
        finally:
            cluster.close()

    # --- snapshots -------------------------------------------------------------------------------

    def _fill(self, cluster: KeyedCluster, n: int) -> dict[str, Any]:
        expected = {}
        for i in range(n):
            key = f"key-{i}"
            cluster.state(key, VALUE).update(i)
            cluster.state(key, LIST).add_all([str(i), "x"])
            cluster.state(key, MAP).put("m", [i])
            expected[key] = (i, [str(i), "x"], {"m": [i]})
        return expected

    def _read(self, cluster: KeyedCluster, keys: Any) -> dict[str, Any]:
        return {k: (cluster.state(k, VALUE).value(), list(cluster.state(k, LIST).get()),
                    dict(cluster.state(k, MAP).items())) for k in keys}

    def test_checkpoint_restore_roundtrip(self, cluster: KeyedCluster) -> None:
        expected = self._fill(cluster, 60)
        cid = cluster.checkpoint()
        cluster.state("key-1", VALUE).update(999)  # after the checkpoint: must be gone
        cluster.state("late", VALUE).update(1)
        cluster.restore(cid)
        assert self._read(cluster, expected) == expected
        assert cluster.state("late", VALUE).value() is None

    def test_rescale_4_2_3(self, state_backend: StateBackend,
                           checkpoint_storage: CheckpointStorage) -> None:
        cluster = KeyedCluster(state_backend, checkpoint_storage, parallelism=4)
        try:
            expected = self._fill(cluster, 80)
            for parallelism in (2, 3, 1):
                cluster.checkpoint()
                cluster.restore(parallelism=parallelism)
                assert cluster.parallelism == parallelism
                assert self._read(cluster, expected) == expected
        finally:
            cluster.close()

    def test_snapshot_isolated_from_later_writes(self, cluster: KeyedCluster) -> None:
        expected = self._fill(cluster, 20)
        cid = cluster.next_checkpoint
        cluster.next_checkpoint += 1
        runs = {f"p{i}": b.snapshot(cid, cluster.access.streams(cid, f"p{i}"))
                for i, b in enumerate(cluster.partitions)}
        for key in expected:  # mutate in place and overwrite between the two phases
            cluster.state(key, LIST).add("later")
            cluster.state(key, MAP).put("m", [-1])
            cluster.state(key, VALUE).update(-1)
        handles = {n: r.run() for n, r in runs.items()}
        cluster.access.commit(cid, {"tasks": handles})
        cluster.completed.append(cid)
        cluster.restore(cid)
        assert self._read(cluster, expected) == expected

    def test_dispose_fails_an_in_flight_snapshot(self, cluster: KeyedCluster) -> None:
        """Flink's testAsyncSnapshotCancellation: a backend disposed between a snapshot's
        synchronous and asynchronous parts fails the snapshot; it never completes afterwards."""
        self._fill(cluster, 10)
        backend = cluster.partitions[0]
        if not backend.asynchronous:
            pytest.skip("synchronous snapshots are complete when snapshot() returns")
        cid = cluster.next_checkpoint
        cluster.next_checkpoint += 1
        run = backend.snapshot(cid, cluster.access.streams(cid, "p0"))
        backend.dispose()
        with pytest.raises(StatekitError, match="disposed"):
            run.run()

    def test_get_keys(self, cluster: KeyedCluster) -> None:
        """Flink's testGetKeys / testGetKeysAndNamespaces: every key holding a state, once per
        partition, of each state kind; none for a state never written; None namespaces only."""
        keys = {f"k{i}" for i in range(40)}
        for key in keys:
            cluster.state(key, VALUE).update(1)
            if key < "k2":
                cluster.state(key, LIST).add_all(["a", "b"])
                cluster.state(key, MAP).put_all({"x": [1], "y": [2]})
        found = [k for b in cluster.partitions for k in b.get_keys(VALUE.name)]
        assert sorted(found) == sorted(keys)
        in_list = {k for b in cluster.partitions for k in b.get_keys(LIST.name)}
        assert in_list == {k for k in keys if k < "k2"}
        assert {k for b in cluster.partitions for k in b.get_keys(MAP.name)} == in_list
        assert {kn for b in cluster.partitions for kn in b.get_keys_and_namespaces(LIST.name)} == {
            (k, None) for k in in_list}
        assert [k for b in cluster.partitions for k in b.get_keys("never")] == []
        with pytest.raises(StateError, match="namespace"):
            cluster.partitions[0].get_keys(VALUE.name, "window-1")
        cluster.state("k0", LIST).clear()  # a cleared key holds the state no more
        assert "k0" not in {k for b in cluster.partitions for k in b.get_keys(LIST.name)}

    def test_apply_to_all_keys_may_change_the_state(self, cluster: KeyedCluster) -> None:
        """Flink's testApplyToAllKeysLambdaFunction and testConcurrentModificationWithApplyToAllKeys:
        the function sees each key's state as current and may clear it; keys are those at the
        start."""
        for i in range(30):
            cluster.state(f"k{i}", LIST).add_all([f"v{i}"])
        seen: dict[str, list[str]] = {}

        def clear_each(key: Any, state: Any) -> None:
            seen[key] = list(state.get())
            state.clear()

        for backend in cluster.partitions:
            backend.apply_to_all_keys(None, LIST, clear_each)
        assert seen == {f"k{i}": [f"v{i}"] for i in range(30)}
        assert [k for b in cluster.partitions for k in b.get_keys(LIST.name)] == []
