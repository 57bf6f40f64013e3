"""A RocksDB rescale keeps only its own key groups' files: the foreign ranges of the database it
took over are compacted away at the restore, so its checkpoints do not carry them (a restart
after a 4 -> 8 rescale read every byte twice before)."""

import threading

from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from tests.backends.test_rocksdb import checkpoint, keyed, rocks, storage_access

TEXT = ValueStateDescriptor("v", Types.STRING())


def _sst_bytes(handle):
    assert handle["format"] == ROCKSDB_FORMAT
    return sum(h["size"] for h in handle["sst"].values())


def _checkpointed(tmp_path, keys):
    """A RocksDB backend factory, checkpoint storage and a checkpoint of ``keys`` values."""
    access = storage_access(tmp_path)
    backend = rocks()
    kb = keyed(backend)
    try:
        state = kb.get_partitioned_state(TEXT)
        for i in range(keys):
            kb.set_current_key(f"key-{i}")
            state.update(f"{i}-" + "x" * 300)
        whole, _ = checkpoint(kb, access, 1)
    finally:
        kb.dispose()
    return backend, access, whole


def test_a_rescaled_database_checkpoints_only_its_own_key_groups(tmp_path):
    backend, access, whole = _checkpointed(tmp_path, 20_000)
    halves = []
    for cid, rng in enumerate([KeyGroupRange(0, 63), KeyGroupRange(64, 127)], start=2):
        part = keyed(backend, rng)
        try:
            part.restore([whole], access.reader())
            state = part.get_partitioned_state(TEXT)
            kept = 0
            for i in range(20_000):
                part.set_current_key(f"key-{i}")
                if part.key_group_of(f"key-{i}") in rng:
                    assert state.value() == f"{i}-" + "x" * 300
                    kept += 1
            assert 8_000 < kept < 12_000
            handle, _ = checkpoint(part, access, cid)
            halves.append(_sst_bytes(handle))
        finally:
            part.dispose()
    for half in halves:
        assert half < 0.65 * _sst_bytes(whole), (half, _sst_bytes(whole))


def test_disposing_during_the_compaction_ends_its_thread(tmp_path):
    backend, access, whole = _checkpointed(tmp_path, 5_000)
    before = {t.name for t in threading.enumerate()}
    part = keyed(backend, KeyGroupRange(0, 31))
    part.restore([whole], access.reader())
    part.dispose()  # at once: the check and the compaction end with the backend
    assert not {t.name for t in threading.enumerate()} - before


_NEVER_DISPOSED = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from statekit.serde.keygroups import KeyGroupRange
from tests.backends.test_rocksdb import keyed
from tests.backends.test_rocksdb_rescale_files import _checkpointed
backend, access, whole = _checkpointed(Path({tmp!r}), 60_000)
keyed(backend, KeyGroupRange(64, 127)).restore([whole], access.reader())
print("restored")
"""


def test_exiting_during_the_compaction_of_a_backend_never_disposed_is_clean(tmp_path):
    """The interpreter waits for the range being compacted at exit: a thread stopped inside
    RocksDB aborted the process ("FATAL: exception not rethrown", exit 134)."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _NEVER_DISPOSED.format(root=root, tmp=str(tmp_path))],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0 and "restored" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert "FATAL" not in done.stderr
