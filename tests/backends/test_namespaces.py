"""Namespaced keyed state (window state) through the shared conformance suite, both backends."""

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.testing.conformance import NamespaceConformance
from tests.backends.test_rocksdb_conformance import rocks


class TestHeapNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend()


class TestHeapIncrementalNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return HashMapStateBackend(incremental=True)


class TestRocksDBNamespaces(NamespaceConformance):
    @pytest.fixture
    def state_backend(self):
        return rocks(True)


@pytest.mark.parametrize("factory", [HashMapStateBackend, lambda: rocks()], ids=["heap", "rocksdb"])
def test_a_user_key_checked_once_lets_no_other_through(factory):
    """Map states check a user key object once (a namespace is put again and again): the same
    object again is not checked, any other still is, None included."""
    from statekit.errors import StateTypeError
    from statekit.serde.keygroups import KeyGroupRange
    from statekit.serde.types import Types
    from statekit.state.descriptors import MapStateDescriptor

    backend = factory().create_keyed_state_backend(
        key_serializer=Types.LONG().get_serializer(), key_group_range=KeyGroupRange(0, 127),
        max_parallelism=128)
    try:
        backend.set_current_key(1)
        state = backend.get_partitioned_state(
            MapStateDescriptor("m", Types.TUPLE([Types.LONG()]), Types.LONG()))
        for bad in (None, ("x",), [1]):
            with pytest.raises(StateTypeError, match="'m'"):
                state.put(bad, 1)
        good = (1,)
        state.put(good, 1)
        state.put(good, 2)
        for bad in (None, ("x",)):
            with pytest.raises(StateTypeError, match="'m'"):
                state.put(bad, 3)
        assert dict(state.items()) == {(1,): 2}
    finally:
        backend.dispose()
