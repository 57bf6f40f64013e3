"""A partition restored from its own incremental version (a task landing on another Python
worker, as Spark's worker pool does between micro-batches) continues the incremental chain: its
next version writes what changed, not the whole state again."""

import os

import pytest

from statekit import EmbeddedRocksDBStateBackend, HashMapStateBackend, Types, ValueStateDescriptor
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.runtime.partition import PartitionStore, drop_local_state, new_attempt_token
from statekit.serde.types import GenericSerializer

VALUE = ValueStateDescriptor("value", Types.PRIMITIVE_ARRAY(Types.BYTE()))
KEYS = 2_000
CHANGED = range(0, KEYS, 100)  # 1 % of the keys


@pytest.fixture
def root(tmp_path):
    drop_local_state()
    yield tmp_path / "checkpoints"
    drop_local_state()


def factory(kind):
    return (HashMapStateBackend(incremental=True) if kind == "hashmap"
            else EmbeddedRocksDBStateBackend(True))


def tree_bytes(root):
    return {os.path.join(d, f): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(root) for f in files}


def store(root, kind, retained=1):
    return PartitionStore(factory(kind), FileSystemCheckpointStorage(str(root)), "query", "op", 0,
                          GenericSerializer(), versions_retained=retained)


def batch(root, kind, batch_id, keys, fill):
    """Batch ``batch_id`` in a fresh process (nothing held in memory): write ``fill`` under
    ``keys``; the bytes the commit added to the checkpoint storage."""
    drop_local_state()
    before = tree_bytes(root)
    s = store(root, kind)
    backend = s.open(batch_id, new_attempt_token(batch_id, 0))
    assert batch_id == 0 or not s.reused
    state = backend.get_partitioned_state(VALUE)
    for k in keys:
        backend.set_current_key(k)
        state.update(bytes([fill]) * 1024)
    s.commit()
    return sum(size for path, size in tree_bytes(root).items() if path not in before)


@pytest.mark.parametrize("kind", ["hashmap", "rocksdb"])
def test_restored_partition_checkpoints_only_its_changes(root, kind):
    full = batch(root, kind, 0, range(KEYS), 1)
    for batch_id in (1, 2):  # each batch restores, and its version builds on the restored one
        written = batch(root, kind, batch_id, CHANGED, batch_id + 1)
        assert written < 0.2 * full, (batch_id, written, full)
    drop_local_state()  # every value intact through the chain (retention kept what it uses)
    s = store(root, kind)
    backend = s.open(3, new_attempt_token(3, 0))
    state = backend.get_partitioned_state(VALUE)
    for k in range(KEYS):
        backend.set_current_key(k)
        assert state.value() == bytes([3 if k in CHANGED else 1]) * 1024, k
    s.abort()
