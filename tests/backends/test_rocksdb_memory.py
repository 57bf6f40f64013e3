"""RocksDB memory bounded as Flink bounds it: every instance of a process shares one block cache
and one write-buffer manager charged to it (``state.backend.rocksdb.memory.*``)."""

import os

import pytest

from statekit import StreamExecutionEnvironment
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.backends.rocksdb.memory import DEFAULT_MANAGED_BYTES, shared_memory
from statekit.errors import ConfigError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from tests.backends.test_rocksdb_conformance import SHM

BLOB = ValueStateDescriptor("blob", Types.PICKLED_BYTE_ARRAY())  # bytes values, never unpickled


def _backends(backend, count):
    if SHM:
        backend.set_db_storage_paths(SHM)
    return [backend.create_keyed_state_backend(
        key_serializer=Types.LONG().get_serializer(), key_group_range=KeyGroupRange(0, 127),
        max_parallelism=128, operator_id=f"op{i}") for i in range(count)]


def test_instances_share_one_budget_and_stay_within_it():
    backend = EmbeddedRocksDBStateBackend().configure(
        {"state.backend.rocksdb.memory.fixed-per-slot": "32 mb",
         "state.backend.rocksdb.memory.write-buffer-ratio": "0.4"})
    memory = shared_memory(backend.get_memory_configuration())
    assert memory is shared_memory(backend.get_memory_configuration())  # one per process
    assert memory.cache_capacity == int(32 * 2**20 * 2.6 / 3)
    assert memory.write_buffer_capacity == int(2 * 32 * 2**20 * 0.4 / 3)
    keyed = _backends(backend, 2)
    value = os.urandom(1024)
    peak = 0
    try:
        for i in range(60_000):  # 60 MB written through 2 instances, each far above the budget
            kb = keyed[i % 2]
            kb.set_current_key(i)
            kb.get_partitioned_state(BLOB).update(value)
            if i % 500 == 0:
                peak = max(peak, memory.write_buffers.get_usage())
        # memtables are flushed at the limit, which RocksDB overshoots by up to half (Flink's
        # split leaves room for that: write buffers get 2/3 of their share of the budget)
        assert 0 < peak <= memory.write_buffer_capacity * 1.5
        assert memory.usage() <= memory.budget
        for i in range(0, 60_000, 997):
            keyed[i % 2].set_current_key(i)
            assert keyed[i % 2].get_partitioned_state(BLOB).value() == value
    finally:
        for kb in keyed:
            kb.dispose()


def test_defaults_and_unmanaged_memory():
    config = EmbeddedRocksDBStateBackend().get_memory_configuration()
    assert (config.managed, config.fixed_per_slot, config.write_buffer_ratio) == (True, None, 0.5)
    assert config.budget() == DEFAULT_MANAGED_BYTES  # Flink's managed memory of a 1 GB slot
    unmanaged = EmbeddedRocksDBStateBackend()
    unmanaged.set_memory_configuration(managed=False)
    assert shared_memory(unmanaged.get_memory_configuration()) is None
    keyed = _backends(unmanaged, 1)[0]  # opens and works with RocksDB's own per-instance memory
    keyed.set_current_key(1)
    keyed.get_partitioned_state(BLOB).update(b"x")
    assert keyed.get_partitioned_state(BLOB).value() == b"x"
    keyed.dispose()
    fixed = EmbeddedRocksDBStateBackend()
    fixed.set_memory_configuration(managed=False, fixed_per_slot="1 gb")  # fixed wins, as in Flink
    assert fixed.get_memory_configuration().budget() == 2**30


@pytest.mark.parametrize(("key", "value", "match"), [
    ("state.backend.rocksdb.memory.write-buffer-ratio", "1.0", "strictly between 0 and 1"),
    ("state.backend.rocksdb.memory.write-buffer-ratio", "0", "strictly between 0 and 1"),
    ("state.backend.rocksdb.memory.fixed-per-slot", "0 mb", ">= 1|at least"),
    ("state.backend.rocksdb.memory.high-prio-pool-ratio", "0.1", "cannot take effect"),
    ("state.backend.rocksdb.memory.fixed-per-slott", "1 gb", "did you mean"),
])
def test_bad_memory_settings_are_refused_at_the_call(key, value, match):
    with pytest.raises(ConfigError, match=match):
        StreamExecutionEnvironment.get_execution_environment({key: value})
