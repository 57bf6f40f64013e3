"""Bulk state access gives the same results as per-key access, on every backend (list and map
state in depth: statekit.testing.conformance.bulk)."""

import pytest

from statekit import HashMapStateBackend, Types, ValueStateDescriptor
from statekit.backends.bulk import BulkState
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.errors import StateSizeError, StateTypeError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import GenericSerializer
from statekit.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
)


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
        bulk.get(ReducingStateDescriptor("r", lambda a, b: a + b, Types.LONG()), keys)


def test_size_limits_apply_to_bulk_writes(backend):
    """A size-limited state has no fast path: each key goes through the limits (the heap's
    value-state fast path wrote a value over the limit)."""
    backend.set_size_limits(max_value_size=64)
    bulk = BulkState(backend)
    lst, mp = ListStateDescriptor("l", Types.STRING()), MapStateDescriptor("m", Types.STRING(),
                                                                           Types.STRING())
    value = ValueStateDescriptor("v", Types.STRING())
    with pytest.raises(StateSizeError, match="'v'"):
        bulk.put(value, ["a"], ["x" * 100])
    assert bulk.get(value, ["a"]) == [None]
    with pytest.raises(StateSizeError, match="'l'"):
        bulk.add(lst, ["a"], ["x" * 100])
    with pytest.raises(StateSizeError, match="'m'"):
        bulk.put_entries(mp, ["a"], ["k"], ["x" * 100])
    bulk.add(lst, ["a"], ["small"])
    assert bulk.get(lst, ["a"]) == [["small"]] and bulk.get(mp, ["a"]) == [{}]


def test_ttl_map_state_holds_none_values(backend):
    """A map entry's value may be None with TTL as without it (per key and in bulk)."""
    mp = MapStateDescriptor("m", Types.STRING(), Types.LIST(Types.INT()))
    mp.enable_time_to_live(StateTtlConfig.new_builder(100_000).build())
    state = backend.get_partitioned_state(mp)
    backend.set_current_key("a")
    state.put("u", None)
    assert dict(state.items()) == {"u": None} and state.contains("u")
    BulkState(backend).put_entries(mp, ["b"], ["v"], [None])
    assert BulkState(backend).get(mp, ["a", "b"]) == [{"u": None}, {"v": None}]
