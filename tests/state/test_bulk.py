"""Bulk value-state access gives the same results as per-key access, on every backend."""

import pytest

from statekit import HashMapStateBackend, Types, ValueStateDescriptor
from statekit.backends.bulk import BulkState
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.errors import StateTypeError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer
from statekit.state.descriptors import ListStateDescriptor


@pytest.fixture(params=["hashmap", "rocksdb"])
def backend(request):
    factory = HashMapStateBackend() if request.param == "hashmap" else EmbeddedRocksDBStateBackend()
    b = factory.create_keyed_state_backend(key_serializer=GenericSerializer(),
                                           key_group_range=KeyGroupRange.all(128), max_parallelism=128)
    yield b
    b.dispose()


def test_bulk_matches_single_access(backend):
    desc = ValueStateDescriptor("v", Types.LONG())
    bulk = BulkState(backend)
    keys = [f"k{i}" for i in range(100)]
    bulk.put(desc, keys, list(range(100)))
    assert bulk.get(desc, [*keys, "missing"]) == [*list(range(100)), None]
    backend.set_current_key("k7")
    assert backend.get_partitioned_state(desc).value() == 7
    bulk.put(desc, ["k7"], [None])
    assert bulk.get(desc, ["k7"]) == [None]
    with pytest.raises(StateTypeError, match="'v'"):
        bulk.put(desc, ["k1"], ["not a long"])
    with pytest.raises(TypeError):
        bulk.get(ListStateDescriptor("l"), keys)
