"""The heap backend through the shared conformance suite."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.testing.conformance import BackendConformance


class TestHeapAsync(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()


class TestHeapSync(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend(using_asynchronous_snapshots=False)


def test_keys_added_while_enumerating_are_a_concurrent_modification():
    """Flink's testConcurrentModificationWithGetKeys on the heap backend: adding a key of the
    state while its keys are enumerated fails the enumeration with a typed error."""
    from statekit import JobManagerCheckpointStorage
    from statekit.errors import ConcurrentModificationError
    from statekit.testing.cluster import KeyedCluster
    from statekit.testing.conformance.backend import VALUE

    cluster = KeyedCluster(HashMapStateBackend(), JobManagerCheckpointStorage(), 1)
    try:
        for i in range(10):
            cluster.state(f"k{i}", VALUE).update(i)
        backend = cluster.partitions[0]
        with pytest.raises(ConcurrentModificationError, match="collect them first"):
            for n, _key in enumerate(backend.get_keys(VALUE.name)):
                cluster.state(f"new{n}", VALUE).update(n)
        updated = 0
        for key in backend.get_keys(VALUE.name):  # changing values of existing keys is fine
            cluster.state(key, VALUE).update(100)
            updated += 1
        assert updated == 11
    finally:
        cluster.close()
