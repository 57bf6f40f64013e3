"""Namespaced keyed state conformance (ported from Flink's ``StateBackendTestBase``: the merging,
key-enumeration and snapshot cases that use namespaces): subclass :class:`NamespaceConformance`
with a ``state_backend`` fixture returning a :class:`StateBackend`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import StateError, StateNameClashError, StateTypeError
from statekit.serde.serializers import TypeSerializer
from statekit.serde.types import Types
from statekit.state.api import AggregateFunction, State
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

INT_NS: TypeSerializer = Types.INT().get_serializer()
STR_NS: TypeSerializer = Types.STRING().get_serializer()
WINDOW_NS: TypeSerializer = Types.TUPLE([Types.LONG(), Types.LONG()]).get_serializer()


class _MutableSum(AggregateFunction):
    """Flink's MutableAggregatingAddingFunction: the accumulator is changed in place."""

    def create_accumulator(self) -> list[int]:
        return [0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += value
        return accumulator

    def get_result(self, accumulator: list[int]) -> int:
        return accumulator[0]

    def merge(self, acc_a: list[int], acc_b: list[int]) -> list[int]:
        acc_a[0] += acc_b[0]
        return acc_a


class _ImmutableSum(AggregateFunction):
    """Flink's ImmutableAggregatingAddingFunction: every call returns a new accumulator."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: int, accumulator: int) -> int:
        return accumulator + value

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, acc_a: int, acc_b: int) -> int:
        return acc_a + acc_b


def _ns(cluster: KeyedCluster, key: Any, descriptor: StateDescriptor, namespace: Any,
        serializer: TypeSerializer = INT_NS) -> Any:
    """``descriptor``'s namespaced state with ``key`` and ``namespace`` current."""
    backend = cluster.partition_of(key)
    backend.set_current_key(key)
    state: Any = backend.get_namespaced_state(descriptor, serializer)
    state.set_current_namespace(namespace)
    return state


def _entries(cluster: KeyedCluster, name: str) -> list[tuple[Any, Any]]:
    """Every (key, namespace) holding ``name`` over all partitions (Flink's
    ``numKeyValueStateEntries`` is its length)."""
    return sorted(pair for backend in cluster.partitions
                  for pair in backend.get_keys_and_namespaces(name))


def _populate_for_merging(cluster: KeyedCluster, descriptor: StateDescriptor) -> None:
    """Flink's merging layout: ``abc`` spreads its values over three namespaces, ``def`` over
    two (one empty), ``ghi`` is empty, ``jkl`` has all in the target, ``mno`` all in a source."""
    layout = {"abc": {1: [33, 55], 2: [22, 11], 3: [44]}, "def": {1: [11, 44], 3: [22, 55, 33]},
              "jkl": {1: [11, 22, 33, 44, 55]}, "mno": {3: [11, 22, 33, 44, 55]}}
    for key, spaces in layout.items():
        for namespace, values in spaces.items():
            state = _ns(cluster, key, descriptor, namespace)
            for value in values:
                state.add(value)


class NamespaceConformance:
    """Namespaced state (windows' state) on every backend."""

    @pytest.fixture
    def cluster(self, state_backend: StateBackend, tmp_path: Any) -> Iterator[KeyedCluster]:
        storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
        cluster = KeyedCluster(state_backend, storage, parallelism=2)
        yield cluster
        cluster.close()

    def _merge_all(self, cluster: KeyedCluster, descriptor: StateDescriptor) -> dict[str, Any]:
        out = {}
        for key in ("abc", "def", "ghi", "jkl", "mno"):
            state = _ns(cluster, key, descriptor, 1)
            state.merge_namespaces(1, [2, 3])
            state.set_current_namespace(1)
            out[key] = state.get()
        return out

    def _clear_all(self, cluster: KeyedCluster, descriptor: StateDescriptor) -> None:
        for key in ("abc", "def", "ghi", "jkl", "mno"):
            _ns(cluster, key, descriptor, 1).clear()
        assert _entries(cluster, descriptor.name) == []  # the backend is empty again

    # --- Flink's testListStateMerging / testReducingStateMerging / testAggregatingStateMerging* --

    def test_list_state_merging(self, cluster: KeyedCluster) -> None:
        descriptor = ListStateDescriptor("my-state", Types.LONG())
        _populate_for_merging(cluster, descriptor)
        merged = self._merge_all(cluster, descriptor)
        for key in ("abc", "def", "jkl", "mno"):
            assert sorted(merged[key]) == [11, 22, 33, 44, 55], key
        assert merged["ghi"] == []
        assert _ns(cluster, "abc", descriptor, 1).get() == [33, 55, 22, 11, 44]  # target first
        assert ("abc", 2) not in _entries(cluster, descriptor.name)  # sources are cleared
        self._clear_all(cluster, descriptor)

    def test_reducing_state_merging(self, cluster: KeyedCluster) -> None:
        descriptor = ReducingStateDescriptor("my-state", lambda a, b: a + b, Types.LONG())
        _populate_for_merging(cluster, descriptor)
        merged = self._merge_all(cluster, descriptor)
        assert merged == {"abc": 165, "def": 165, "ghi": None, "jkl": 165, "mno": 165}
        self._clear_all(cluster, descriptor)

    @pytest.mark.parametrize("function", [_MutableSum(), _ImmutableSum()],
                             ids=["mutable-accumulator", "immutable-accumulator"])
    def test_aggregating_state_merging(self, cluster: KeyedCluster, function: Any) -> None:
        accumulator = Types.LIST(Types.LONG()) if isinstance(function, _MutableSum) else Types.LONG()
        descriptor = AggregatingStateDescriptor("my-state", function, accumulator)
        _populate_for_merging(cluster, descriptor)
        merged = self._merge_all(cluster, descriptor)
        assert merged == {"abc": 165, "def": 165, "ghi": None, "jkl": 165, "mno": 165}
        self._clear_all(cluster, descriptor)

    # --- Flink's testGetKeys (with namespaces) / testGetKeysAndNamespaces -------------------------

    def test_get_keys_by_namespace(self, cluster: KeyedCluster) -> None:
        descriptor = ValueStateDescriptor("get-keys-test", Types.INT())
        for key in range(150):
            _ns(cluster, key, descriptor, "ns1", STR_NS).update(key * 2)
        for key in range(150, 250):
            _ns(cluster, key, descriptor, "ns2", STR_NS).update(key)
        for namespace, expected in (("ns1", range(150)), ("ns2", range(150, 250))):
            keys = sorted(k for b in cluster.partitions for k in b.get_keys(descriptor.name,
                                                                             namespace))
            assert keys == list(expected)
        assert [k for b in cluster.partitions for k in b.get_keys(descriptor.name, "ns3")] == []

    def test_get_keys_and_namespaces(self, cluster: KeyedCluster) -> None:
        descriptor = ValueStateDescriptor("get-keys-test", Types.INT())
        for key in range(200):
            _ns(cluster, key, descriptor, "ns1", STR_NS).update(key)
            _ns(cluster, key, descriptor, "ns2", STR_NS).update(key)
        expected = sorted((key, ns) for key in range(200) for ns in ("ns1", "ns2"))
        assert _entries(cluster, descriptor.name) == expected

    def test_apply_to_all_keys_in_a_namespace(self, cluster: KeyedCluster) -> None:
        descriptor = ListStateDescriptor("l", Types.STRING())
        for key in range(20):
            _ns(cluster, key, descriptor, 1).add(f"a{key}")
            _ns(cluster, key, descriptor, 2).add(f"b{key}")
        seen: list[Any] = []

        def clear_one(key: Any, state: State) -> None:
            seen.append((key, list(state.get())))  # type: ignore[attr-defined]
            state.clear()

        for backend in cluster.partitions:
            backend.apply_to_all_keys(1, descriptor, clear_one)
        assert sorted(seen) == sorted((key, [f"a{key}"]) for key in range(20))
        assert _entries(cluster, "l") == [(key, 2) for key in range(20)]

    # --- statekit: every state kind, isolation, snapshot, rescale, errors -------------------------

    def test_namespaces_are_isolated(self, cluster: KeyedCluster) -> None:
        value = ValueStateDescriptor("v", Types.LONG())
        mapping = MapStateDescriptor("m", Types.STRING(), Types.LONG())
        for window in ((0, 10), (10, 20)):
            _ns(cluster, "k", value, window, WINDOW_NS).update(window[0] + 1)
            m = _ns(cluster, "k", mapping, window, WINDOW_NS)
            m.put("a", window[0])
            m.put_all({"b": 2, "c": None})
        assert _ns(cluster, "k", value, (0, 10), WINDOW_NS).value() == 1
        assert _ns(cluster, "k", value, (20, 30), WINDOW_NS).value() is None
        assert _ns(cluster, "other", value, (0, 10), WINDOW_NS).value() is None
        m = _ns(cluster, "k", mapping, (10, 20), WINDOW_NS)
        assert dict(m.items()) == {"a": 10, "b": 2, "c": None} and m.contains("c")
        m.remove("a")
        m.remove("missing")
        assert sorted(m.keys()) == ["b", "c"] and not m.is_empty()
        _ns(cluster, "k", value, (0, 10), WINDOW_NS).clear()
        assert _entries(cluster, "v") == [("k", (10, 20))]
        assert dict(_ns(cluster, "k", mapping, (0, 10), WINDOW_NS).items()) == {
            "a": 0, "b": 2, "c": None}

    def test_snapshot_restore_and_rescale(self, cluster: KeyedCluster) -> None:
        lists = ListStateDescriptor("buffer", Types.LONG())
        sums = ReducingStateDescriptor("sum", lambda a, b: a + b, Types.LONG())
        expected = {}
        for key in range(60):
            for window in ((0, 10), (10, 20)):
                _ns(cluster, key, lists, window, WINDOW_NS).add_all([key, window[0]])
                _ns(cluster, key, sums, window, WINDOW_NS).add(key + window[0])
                expected[(key, window)] = ([key, window[0]], key + window[0])
        first = cluster.checkpoint()
        _ns(cluster, 0, lists, (0, 10), WINDOW_NS).add(99)  # after the checkpoint: not restored
        for parallelism in (3, 1):
            cluster.restore(first, parallelism=parallelism)
            with pytest.raises(StateError, match="register the restored state"):
                [pair for b in cluster.partitions for pair in b.get_keys_and_namespaces("buffer")]
            for backend in cluster.partitions:
                backend.get_namespaced_state(lists, WINDOW_NS)
            got = {(key, w): (_ns(cluster, key, lists, w, WINDOW_NS).get(),
                              _ns(cluster, key, sums, w, WINDOW_NS).get())
                   for key, w in _entries(cluster, "buffer")}
            assert got == expected, parallelism
            cluster.checkpoint()

    def test_backend_switch_and_inspection(self, cluster: KeyedCluster, tmp_path: Any) -> None:
        """Namespaced state restores into the other backend, and the inspection tools show it as
        the map from namespace to value it is stored as."""
        from statekit.backends.heap import HashMapStateBackend
        from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
        from statekit.inspection import open_checkpoint

        sums = ReducingStateDescriptor("sum", lambda a, b: a + b, Types.LONG())
        for key in range(10):
            for window in ((0, 10), (10, 20)):
                _ns(cluster, key, sums, window, WINDOW_NS).add(key + window[0])
        checkpoint = cluster.checkpoint()
        view = open_checkpoint(str(tmp_path / "chk"))
        rows = [row for state in view.states() if state.name == "sum"  # a partition per task
                for row in state.to_pandas().itertuples(index=False)]
        assert sorted((r.key, tuple(r.user_key.values()), r.value) for r in rows) == sorted(
            (key, w, key + w[0]) for key in range(10) for w in ((0, 10), (10, 20)))
        other = (EmbeddedRocksDBStateBackend() if isinstance(cluster.backend_factory,
                                                             HashMapStateBackend)
                 else HashMapStateBackend())
        cluster.backend_factory = other
        cluster.restore(checkpoint, parallelism=3)
        for key in range(10):
            assert _ns(cluster, key, sums, (10, 20), WINDOW_NS).get() == key + 10

    def test_restored_namespaced_state_keeps_its_layout(self, cluster: KeyedCluster) -> None:
        descriptor = ValueStateDescriptor("v", Types.LONG())
        _ns(cluster, "k", descriptor, (0, 10), WINDOW_NS).update(1)
        cluster.restore(cluster.checkpoint())
        backend = cluster.partition_of("k")
        with pytest.raises(StateNameClashError, match="'v'"):
            backend.get_partitioned_state(descriptor)  # the same name without namespaces
        with pytest.raises(StateNameClashError, match="'v'"):
            backend.get_namespaced_state(descriptor, STR_NS)  # another namespace type
        assert _ns(cluster, "k", descriptor, (0, 10), WINDOW_NS).value() == 1

    def test_typed_errors(self, cluster: KeyedCluster) -> None:
        backend = cluster.partition_of("k")
        backend.set_current_key("k")
        value = ValueStateDescriptor("v", Types.LONG())
        state: Any = backend.get_namespaced_state(value, WINDOW_NS)
        with pytest.raises(StateError, match="no current namespace"):
            state.value()
        for bad in (("a", "b"), [0, 10], None, (1,)):
            with pytest.raises(StateTypeError, match="namespace"):
                state.set_current_namespace(bad)
        state.set_current_namespace((0, 10))
        with pytest.raises(StateTypeError, match="'v'"):
            state.update("not a long")
        listed: Any = backend.get_namespaced_state(ListStateDescriptor("l", Types.LONG()), INT_NS)
        listed.set_current_namespace(1)
        with pytest.raises(StateError, match="None"):
            listed.add(None)
        with pytest.raises(StateError, match="cannot be None"):
            listed.add_all(None)
        with pytest.raises(StateTypeError, match="namespace"):
            listed.merge_namespaces(1, ["x"])
        with pytest.raises(StateNameClashError, match="'v'"):
            backend.get_partitioned_state(value)
        plain = ValueStateDescriptor("plain", Types.LONG())
        backend.get_partitioned_state(plain)
        with pytest.raises(StateNameClashError, match="'plain'"):
            backend.get_namespaced_state(plain, INT_NS)
        ttl = ValueStateDescriptor("ttl", Types.LONG())
        ttl.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(1)).build())
        with pytest.raises(StateError, match="TTL"):
            backend.get_namespaced_state(ttl, INT_NS)
        with pytest.raises(StateError, match="no namespaces"):
            list(backend.get_keys("plain", 1))
        with pytest.raises(StateError, match="register"):
            list(backend.get_keys("never-registered", 1))
