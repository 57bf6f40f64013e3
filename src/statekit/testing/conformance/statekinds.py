"""Flink's ``StateBackendTestBase`` cases on the semantics of each state kind, ported to statekit's
(PyFlink's) API: subclass :class:`StateKindConformance` with a ``state_backend`` fixture returning
a :class:`StateBackend`.  Each case names the Flink test it ports; ``docs/conformance.md`` maps
every Flink test to its port or says why it is left out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.bulk import BulkState
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.errors import StateError
from statekit.serde.serializers import TypeSerializer
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
from statekit.testing.conformance.namespaces import _ImmutableSum as ImmutableAdding
from statekit.testing.conformance.namespaces import _MutableSum as MutableAdding

INT_KEYS: TypeSerializer = Types.INT().get_serializer()
STRING_KEYS: TypeSerializer = Types.STRING().get_serializer()


def appending(a: str, b: str) -> str:
    """Flink's ``AppendingReduce``."""
    return f"{a},{b}"


def single(state_backend: StateBackend, tmp_path: Any, keys: TypeSerializer = INT_KEYS,
           max_parallelism: int = 10, parallelism: int = 1) -> KeyedCluster:
    """Flink's test backend: one partition of ``max_parallelism`` key groups (10, as Flink's
    ``createKeyedBackend``), checkpointed to files under ``tmp_path``."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    return KeyedCluster(state_backend, storage, parallelism, max_parallelism=max_parallelism,
                        key_serializer=keys)


def entries(cluster: KeyedCluster, name: str) -> list[tuple[Any, Any]]:
    """Every (key, namespace) holding ``name`` (Flink's ``numKeyValueStateEntries`` is its
    length)."""
    return sorted((pair for b in cluster.partitions for pair in b.get_keys_and_namespaces(name)),
                  key=repr)


def at(backend: KeyedStateBackend, key: Any, state: Any) -> Any:
    """``state`` with ``key`` current (Flink's ``backend.setCurrentKey(key)``)."""
    backend.set_current_key(key)
    return state


class StateKindConformance:
    """Value, list, reducing, aggregating and map state as Flink's backend tests check them."""

    @pytest.fixture
    def cluster(self, state_backend: StateBackend, tmp_path: Any) -> Iterator[KeyedCluster]:
        cluster = single(state_backend, tmp_path)
        yield cluster
        cluster.close()

    @pytest.fixture
    def strings(self, state_backend: StateBackend, tmp_path: Any) -> Iterator[KeyedCluster]:
        cluster = single(state_backend, tmp_path, STRING_KEYS)
        yield cluster
        cluster.close()

    # --- testValueState / testListState / testReducingState: two snapshots, both restored -------

    KINDS: dict[str, tuple[StateDescriptor, Callable[[Any, str], None], Callable[[Any], Any]]] = {
        "value": (ValueStateDescriptor("id", Types.STRING()),
                  lambda s, v: s.update(v), lambda s: s.value()),
        "list": (ListStateDescriptor("id", Types.STRING()),
                 lambda s, v: s.add(v), lambda s: ",".join(s.get()) or None),
        "reducing": (ReducingStateDescriptor("id", appending, Types.STRING()),
                     lambda s, v: s.add(v), lambda s: s.get()),
    }

    @pytest.mark.parametrize("kind", list(KINDS))
    def test_state_across_two_snapshots(self, cluster: KeyedCluster, kind: str) -> None:
        descriptor, write, read = self.KINDS[kind]
        backend = cluster.partitions[0]
        state = backend.get_partitioned_state(descriptor)
        assert read(at(backend, 1, state)) is None
        write(state, "1")
        assert read(at(backend, 2, state)) is None
        if kind == "list":
            state.update(["2"])  # type: ignore[attr-defined]
        else:
            write(state, "2")
        assert read(at(backend, 1, state)) == "1"
        first = cluster.checkpoint()
        for key in (1, 2, 3):
            write(at(backend, key, state), f"u{key}")
        second = cluster.checkpoint()
        later = {1: "u1", 2: "u2", 3: "u3"} if kind == "value" else {1: "1,u1", 2: "2,u2",
                                                                       3: "u3"}
        assert {k: read(at(backend, k, state)) for k in later} == later
        for checkpoint, expected in ((first, {1: "1", 2: "2", 3: None}), (second, later)):
            cluster.restore(checkpoint)
            backend = cluster.partitions[0]
            restored = backend.get_partitioned_state(descriptor)
            assert {k: read(at(backend, k, restored)) for k in (1, 2, 3)} == expected

    def test_value_state_with_ttl_holds_a_mutable_value(self, cluster: KeyedCluster) -> None:
        """testValueStateWorkWithTtl."""
        descriptor = ValueStateDescriptor("id", Types.LIST(Types.LONG()))
        descriptor.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(1)).build())
        state: Any = cluster.state(1, descriptor)
        state.update([0])
        assert state.value() == [0]
        cluster.restore(cluster.checkpoint())
        assert cluster.state(1, descriptor).value() == [0]  # type: ignore[attr-defined]

    def test_value_state_race(self, cluster: KeyedCluster) -> None:
        """testValueStateRace: reading another key's value (here through bulk access) leaves the
        current key and its value alone, also while another thread reads it."""
        descriptor = ValueStateDescriptor("id", Types.STRING())
        backend = cluster.partitions[0]
        state: Any = at(backend, 1, backend.get_partitioned_state(descriptor))
        state.update("2")
        bulk = BulkState(backend)
        ttl = ValueStateDescriptor("ttl", Types.STRING())  # bulk access key by key
        ttl.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(100)).build())
        for other in (descriptor, ttl):
            assert bulk.get(other, [3]) == [None]
            bulk.put(other, [4, 5], ["4", "5"])
            assert backend.get_current_key() == 1 and state.value() == "2"
        at(backend, 10, state).update("1")
        failures: list[BaseException] = []
        stop = time.monotonic() + 0.1

        def read_elsewhere() -> None:
            try:
                while time.monotonic() < stop:
                    assert bulk.get(descriptor, [10]) == ["1"]
            except BaseException as e:  # reported by the main thread
                failures.append(e)

        reader = threading.Thread(target=read_elsewhere)
        reader.start()
        while time.monotonic() < stop:
            assert state.value() == "1"
        reader.join()
        assert failures == []

    def test_multiple_value_states(self, state_backend: StateBackend, tmp_path: Any) -> None:
        """testMultipleValueStates: two states of one key, one key group, across a restore."""
        cluster = single(state_backend, tmp_path, max_parallelism=1)
        text = ValueStateDescriptor("a-string", Types.STRING())
        number = ValueStateDescriptor("an-integer", Types.INT())
        try:
            first: Any = cluster.state(1, text)
            second: Any = cluster.state(1, number)
            assert (first.value(), second.value()) == (None, None)
            first.update("1")
            assert (first.value(), second.value()) == ("1", None)
            second.update(13)
            cluster.restore(cluster.checkpoint())
            assert cluster.state(1, text).value() == "1"  # type: ignore[attr-defined]
            assert cluster.state(1, number).value() == 13  # type: ignore[attr-defined]
        finally:
            cluster.close()

    def test_value_state_update_none_clears(self, cluster: KeyedCluster) -> None:
        """testValueStateNullUpdate: ``update(None)`` acts as ``clear()`` and stores nothing (a
        LONG serializer could not write None), across a restore."""
        descriptor = ValueStateDescriptor("id", Types.LONG())
        backend = cluster.partitions[0]
        state: Any = at(backend, 1, backend.get_partitioned_state(descriptor))
        state.update(1)
        assert state.value() == 1 and at(backend, 2, state).value() is None
        at(backend, 1, state).clear()
        assert state.value() is None
        state.update(17)
        state.update(None)
        assert state.value() is None and entries(cluster, "id") == []
        cluster.restore(cluster.checkpoint())
        assert cluster.state(1, descriptor).value() is None  # type: ignore[attr-defined]

    # --- testListStateAddNull / AddAllNull / AddAllNullEntries / UpdateNull / UpdateNullEntries --

    @pytest.mark.parametrize("call", [("add", None), ("add_all", None), ("add_all", [3, None, 5]),
                                      ("update", None), ("update", [3, None, 5])],
                             ids=["add-none", "add-all-none", "add-all-none-entry", "update-none",
                                  "update-none-entry"])
    def test_list_state_refuses_none(self, strings: KeyedCluster, call: tuple[str, Any]) -> None:
        """One rule on every backend: a typed error, nothing stored (Flink: an NPE)."""
        state: Any = strings.state("abc", ListStateDescriptor("my-state", Types.LONG()))
        assert state.get() == []
        with pytest.raises(StateError, match="'my-state'"):
            getattr(state, call[0])(call[1])
        assert state.get() == [] and entries(strings, "my-state") == []
        state.add_all([1, 2])
        with pytest.raises(StateError, match="'my-state'"):
            getattr(state, call[0])(call[1])
        assert state.get() == [1, 2]

    def test_list_state_apis(self, strings: KeyedCluster) -> None:
        """testListStateAPIs (an empty list reads as ``[]``, PyFlink's spelling of Java's null)."""
        backend = strings.partitions[0]
        state: Any = backend.get_partitioned_state(ListStateDescriptor("my-state", Types.LONG()))
        assert at(backend, "def", state).get() == []
        state.add(17)
        state.add(11)
        assert sorted(state.get()) == [11, 17]
        state.update([])
        assert state.get() == [] and entries(strings, "my-state") == []
        state.update([10, 16])
        assert sorted(state.get()) == [10, 16]
        assert at(backend, "abc", state).get() == []
        at(backend, "g", state).add_all([])
        assert state.get() == [] and entries(strings, "my-state") == [("def", None)]
        state.add_all([3, 4])
        state.add_all([])
        state.add_all([5, 6])
        assert sorted(state.get()) == [3, 4, 5, 6]
        state.update([1, 2])
        assert sorted(state.get()) == [1, 2]
        assert sorted(at(backend, "def", state).get()) == [10, 16]
        state.clear()
        assert state.get() == []
        for value in (3, 2, 1):
            at(backend, "g", state).add(value)
        assert at(backend, "def", state).get() == []
        assert sorted(at(backend, "g", state).get()) == [1, 1, 2, 2, 3]
        state.update([5, 6])
        assert sorted(state.get()) == [5, 6]
        state.clear()
        assert entries(strings, "my-state") == []

    # --- testReducingStateAddAndGet / testAggregatingStateAddAndGetWith(Mutable|Immutable)Acc. --

    @pytest.mark.parametrize("kind", ["reducing", "aggregating-mutable", "aggregating-immutable"])
    def test_add_and_get(self, strings: KeyedCluster, kind: str) -> None:
        descriptor: StateDescriptor
        if kind == "reducing":
            descriptor = ReducingStateDescriptor("my-state", lambda a, b: a + b, Types.LONG())
        elif kind == "aggregating-mutable":
            descriptor = AggregatingStateDescriptor("my-state", MutableAdding(),
                                                    Types.LIST(Types.LONG()))
        else:
            descriptor = AggregatingStateDescriptor("my-state", ImmutableAdding(), Types.LONG())
        backend = strings.partitions[0]
        state: Any = backend.get_partitioned_state(descriptor)
        assert at(backend, "abc", state).get() is None
        assert at(backend, "def", state).get() is None
        state.add(17)
        state.add(11)
        assert state.get() == 28
        assert at(backend, "abc", state).get() is None
        assert at(backend, "g", state).get() is None
        state.add(1)
        state.add(2)
        assert at(backend, "def", state).get() == 28
        state.clear()
        assert state.get() is None
        for value in (3, 2, 1):
            at(backend, "g", state).add(value)
        assert at(backend, "def", state).get() is None
        assert at(backend, "g", state).get() == 9
        state.clear()
        assert entries(strings, "my-state") == []

    # --- testMapState / testMapStateIsEmpty / testMapStateIteratorArbitraryAccess ----------------

    def test_map_state(self, strings: KeyedCluster) -> None:
        descriptor = MapStateDescriptor("id", Types.INT(), Types.STRING())
        backend = strings.partitions[0]
        state: Any = backend.get_partitioned_state(descriptor)
        assert at(backend, "1", state).get(1) is None
        state.put(1, "1")
        assert at(backend, "2", state).get(2) is None
        state.put(2, "2")
        at(backend, "11", state).put(11, "11")
        assert at(backend, "1", state).contains(1) and state.get(1) == "1"
        assert dict(at(backend, "11", state).items()) == {11: "11"}
        first = strings.checkpoint()
        at(backend, "1", state).put(1, "101")
        at(backend, "2", state).put(102, "102")
        at(backend, "3", state).put(103, "103")
        state.put_all({1031: "1031", 1032: "1032"})
        second = strings.checkpoint()
        later = {"1": {1: "101"}, "2": {2: "2", 102: "102"}, "11": {11: "11"},
                 "3": {103: "103", 1031: "1031", 1032: "1032"}}
        assert {k: dict(at(backend, k, state).items()) for k in later} == later
        assert sorted(state.keys()) == [103, 1031, 1032]
        assert sorted(state.values()) == ["103", "1031", "1032"]
        at(backend, "1", state).clear()
        at(backend, "2", state).remove(102)
        at(backend, "3", state)
        for key, value in state.items():  # change and remove entries while iterating
            if len(value) != 4:
                state.remove(key)
            else:
                state.put(key, value + "_updated")
        assert not at(backend, "2", state).contains(102)
        assert dict(at(backend, "3", state).items()) == {1031: "1031_updated",
                                                         1032: "1032_updated"}
        assert entries(strings, "id") == [("11", None), ("2", None), ("3", None)]
        for checkpoint, expected in ((first, {"1": {1: "1"}, "2": {2: "2"}, "11": {11: "11"},
                                              "3": {}}), (second, later)):
            strings.restore(checkpoint)
            restored: Any = strings.partitions[0].get_partitioned_state(descriptor)
            assert {k: dict(at(strings.partitions[0], k, restored).items())
                    for k in expected} == expected

    def test_map_state_is_empty(self, cluster: KeyedCluster) -> None:
        state: Any = cluster.state(1, MapStateDescriptor("id", Types.INT(), Types.LONG()))
        assert state.is_empty()
        for i in range(1024):
            state.put(i, i * 2)
            assert not state.is_empty()
        for i in range(1024):
            assert not state.is_empty()
            state.remove(i)
        assert state.is_empty() and entries(cluster, "id") == []

    def test_map_state_iteration_with_removal(self, cluster: KeyedCluster) -> None:
        """testMapStateIteratorArbitraryAccess: removing entries (twice, too) while iterating
        sees every entry once; the removed ones are gone afterwards."""
        state: Any = cluster.state(1, MapStateDescriptor("id", Types.INT(), Types.LONG()))
        for i in range(4096):
            state.put(i, i * 2)
        seen, removed = [], set()
        for key, value in state.items():
            assert value == key * 2
            seen.append(key)
            if key % 3 == 0:
                state.remove(key)
                state.remove(key)  # removing an absent user key does nothing
                removed.add(key)
            elif key % 3 == 1:
                state.contains(key + 1)
                state.remove(key)
                removed.add(key)
        assert sorted(seen) == list(range(4096))
        assert sorted(state.keys()) == sorted(set(range(4096)) - removed)

    # --- testValueStateNullAsDefaultValue / testReducing|List|MapStateDefaultValue --------------

    @pytest.mark.parametrize("kind", ["value", "reducing", "list", "map"])
    def test_empty_state_reads(self, cluster: KeyedCluster, kind: str) -> None:
        """An unset value and reducing state read None, an empty list ``[]`` and an empty map no
        entries; after a write and a ``clear()`` again."""
        if kind == "value":
            state: Any = cluster.state(1, ValueStateDescriptor("id", Types.STRING()))
            read, write = state.value, lambda: state.update("Ciao")
        elif kind == "reducing":
            state = cluster.state(1, ReducingStateDescriptor("id", appending, Types.STRING()))
            read, write = state.get, lambda: state.add("Ciao")
        elif kind == "list":
            state = cluster.state(1, ListStateDescriptor("id", Types.STRING()))
            read, write = state.get, lambda: state.update(["Ciao", "Bello"])
        else:
            state = cluster.state(1, MapStateDescriptor("id", Types.STRING(), Types.STRING()))
            read, write = (lambda: list(state.items())), (
                lambda: state.put_all({"Ciao": "Hello", "Bello": "Nice"}))
        empty = [] if kind in ("list", "map") else None
        assert read() == empty
        write()
        assert read() not in (None, [])
        state.clear()
        assert read() == empty
