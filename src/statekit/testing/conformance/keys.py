"""Flink's ``StateBackendTestBase`` cases on key enumeration and namespaces, ported: the number of
entries, ``get_keys`` by namespace, ``apply_to_all_keys`` changing the state, changes while keys
are enumerated, a namespace serializer required.  Subclass :class:`KeyEnumerationConformance`
with a ``state_backend`` fixture returning a :class:`StateBackend`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from statekit.backends.base import StateBackend
from statekit.errors import ConcurrentModificationError, StateTypeError
from statekit.serde.types import Types
from statekit.state.descriptors import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.testing.cluster import KeyedCluster
from statekit.testing.conformance.statekinds import INT_KEYS, STRING_KEYS, at, entries, single


class KeyEnumerationConformance:
    """Counting, enumerating and visiting keys as Flink's backend tests check them."""

    @pytest.fixture
    def cluster(self, state_backend: StateBackend, tmp_path: Any) -> Iterator[KeyedCluster]:
        cluster = single(state_backend, tmp_path)
        yield cluster
        cluster.close()

    def test_num_state_entries(self, cluster: KeyedCluster) -> None:
        descriptor = ValueStateDescriptor("id", Types.STRING())
        assert entries(cluster, "id") == []
        backend = cluster.partitions[0]
        state: Any = at(backend, 0, backend.get_partitioned_state(descriptor))
        state.update("hello")
        state.update("ciao")
        assert len(entries(cluster, "id")) == 1
        at(backend, 42, state).update("foo")
        assert len(entries(cluster, "id")) == 2
        at(backend, 0, state).clear()
        assert entries(cluster, "id") == [(42, None)]
        at(backend, 42, state).clear()
        assert entries(cluster, "id") == []

    # --- namespaces: testRequireNonNullNamespace, testMapStateGetKeys ----------------------------

    def test_namespaces_are_required(self, cluster: KeyedCluster) -> None:
        """testRequireNonNullNamespace: no namespace serializer, or a None namespace, is a typed
        error."""
        descriptor = ValueStateDescriptor("id", Types.INT())
        backend = cluster.partitions[0]
        for bad in (None, Types.INT()):
            with pytest.raises(StateTypeError, match="namespace serializer"):
                backend.get_namespaced_state(descriptor, bad)  # type: ignore[arg-type]
        state: Any = backend.get_namespaced_state(descriptor, INT_KEYS)
        with pytest.raises(StateTypeError, match="namespace"):
            state.set_current_namespace(None)

    def test_map_state_get_keys(self, cluster: KeyedCluster) -> None:
        descriptor = MapStateDescriptor("get-keys-test", Types.STRING(), Types.INT())
        backend = cluster.partitions[0]
        state: Any = backend.get_namespaced_state(descriptor, STRING_KEYS)
        for namespace, keys in (("ns1", range(0, 300)), ("ns2", range(300, 600))):
            state.set_current_namespace(namespace)
            for key in keys:
                at(backend, key, state).put("he", key * 2)
                state.put("ho", key * 2)
        for namespace, keys in (("ns1", range(0, 300)), ("ns2", range(300, 600))):
            assert sorted(backend.get_keys("get-keys-test", namespace)) == list(keys)

    # --- testConcurrentModificationWithApplyToAllKeys / testApplyToAllKeysLambdaFunction --------

    def test_apply_to_all_keys(self, cluster: KeyedCluster) -> None:
        descriptor = ListStateDescriptor("foo", Types.STRING())
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(descriptor)
        for i in range(100):
            at(backend, i, state).add(f"Hello{i}")
        seen: list[int] = []

        def check(key: Any, s: Any) -> None:
            assert s.get() == [f"Hello{key}"]
            seen.append(key)

        backend.apply_to_all_keys(None, descriptor, check)
        assert sorted(seen) == list(range(100))
        backend.apply_to_all_keys(None, descriptor, lambda key, s: s.clear())
        assert entries(cluster, "foo") == []
        for i in range(100):  # clear() with add() inside the function, on every key
            at(backend, i, state).add("x")

        def renew(key: Any, s: Any) -> None:
            s.add(f"Hello{key}")
            s.clear()
            s.add(f"Hello_{key}")

        backend.apply_to_all_keys(None, descriptor, renew)
        assert {k: at(backend, k, state).get() for k in range(100)} == {
            k: [f"Hello_{k}"] for k in range(100)}

    def test_changes_while_keys_are_enumerated(self, cluster: KeyedCluster) -> None:
        """Updating the values of the keys met is fine on every backend; adding or removing keys
        meanwhile either fails the enumeration with ConcurrentModificationError (the heap
        backend, as Flink's) or leaves it with the keys it started with (RocksDB's view)."""
        descriptor = ValueStateDescriptor("v", Types.INT())
        backend = cluster.partitions[0]
        state: Any = backend.get_partitioned_state(descriptor)
        for i in range(50):
            at(backend, i, state).update(i)
        met = []
        for key in backend.get_keys("v"):
            at(backend, key, state).update(key + 100)
            met.append(key)
        assert sorted(met) == list(range(50))
        assert sorted(at(backend, k, state).value() for k in range(50)) == list(range(100, 150))
        for change in ("add", "remove"):
            met, before = [], sorted(backend.get_keys("v"))
            try:
                for key in backend.get_keys("v"):
                    met.append(key)
                    if change == "add":
                        at(backend, 1000 + key, state).update(key)
                    else:
                        at(backend, key, state).clear()
            except ConcurrentModificationError:
                continue
            assert sorted(met) == before, change
