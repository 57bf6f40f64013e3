"""Versioned partition stores: a version records the attempt that wrote it, and local state is
reused only when it is the committed lineage; otherwise the partition restores."""

import pytest

from statekit import HashMapStateBackend, Types, ValueStateDescriptor
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.runtime import partition as partition_module
from statekit.runtime.partition import PartitionStore, drop_local_state, new_attempt_token
from statekit.serde.types import GenericSerializer

COUNT = ValueStateDescriptor("count", Types.LONG())


@pytest.fixture(params=["jobmanager", "filesystem"])
def storage(request, tmp_path):
    drop_local_state()
    yield (JobManagerCheckpointStorage() if request.param == "jobmanager"
           else FileSystemCheckpointStorage(str(tmp_path)))
    drop_local_state()


def store(storage, partition=0, retained=3):
    return PartitionStore(HashMapStateBackend(), storage, "query", "op", partition,
                          GenericSerializer(), versions_retained=retained)


def run_batch(storage, batch, keys, commit=True, attempt=None):
    s = store(storage)
    backend = s.open(batch, attempt or new_attempt_token(batch, 0))
    for k in keys:
        backend.set_current_key(k)
        state = backend.get_partitioned_state(COUNT)
        state.update((state.value() or 0) + 1)
    if commit:
        s.commit()
    else:
        s.abort()
    return s


def read(storage, batch, key):
    s = store(storage)
    backend = s.open(batch, new_attempt_token("read"))
    backend.set_current_key(key)
    value = backend.get_partitioned_state(COUNT).value()
    s.abort()
    return value


def test_versions_chain_and_reuse_local_state(storage):
    assert not run_batch(storage, 0, ["a", "b"]).reused
    s = run_batch(storage, 1, ["a"])
    assert s.reused and s.restored_from == 0
    assert read(storage, 2, "a") == 2 and read(storage, 2, "b") == 1


def test_retry_of_a_batch_restores_the_previous_version(storage):
    run_batch(storage, 0, ["a"])
    run_batch(storage, 1, ["a"])            # attempt 0 of batch 1 commits version 1 ...
    s = run_batch(storage, 1, ["a"])        # ... and the retry of batch 1 must not build on it
    assert not s.reused and s.restored_from == 0
    assert read(storage, 2, "a") == 2


def test_failed_attempt_is_never_reused(storage):
    run_batch(storage, 0, ["a"])
    run_batch(storage, 1, ["a"], commit=False)   # task failed mid-partition
    run_batch(storage, 1, ["a"])
    assert read(storage, 2, "a") == 2


def test_other_process_committed_the_version(storage):
    run_batch(storage, 0, ["a"])
    # another worker process wrote version 1: simulate by overwriting the durable attempt
    other = store(storage)
    backend = other.open(1, new_attempt_token("other-process"))
    backend.set_current_key("a")
    backend.get_partitioned_state(COUNT).update(41)
    other.commit()
    drop_local_state()  # this process never held version 1
    s = run_batch(storage, 2, ["a"])
    assert not s.reused and read(storage, 3, "a") == 42


def test_speculative_duplicate_commit_leaves_one_version(storage):
    run_batch(storage, 0, ["a"])
    first = run_batch(storage, 1, ["a"])        # cached locally with its attempt token
    loser_cache = dict(partition_module._LOCAL)
    # a speculative attempt of batch 1 in another process commits last and wins
    twin = store(storage)
    twin_backend = twin.open(1, new_attempt_token("speculative"))
    twin_backend.set_current_key("a")
    twin_backend.get_partitioned_state(COUNT).update(100)
    twin.commit()
    partition_module._LOCAL.clear()
    partition_module._LOCAL.update(loser_cache)  # this process still holds the loser's copy
    assert first.access.load(1)["attempt"] != first.attempt
    s = run_batch(storage, 2, ["a"])  # must restore the winner's version, not reuse the loser's
    assert not s.reused and read(storage, 3, "a") == 101


def test_old_versions_are_retired(storage):
    for batch in range(6):
        s = run_batch(storage, batch, ["a"])
    assert s.access.completed() == [3, 4, 5]
    assert read(storage, 6, "a") == 6


def test_a_resumed_query_without_its_state_fails_unless_allowed(storage):
    """Batch 5 with no state ever written (a lost driver, a deleted directory): MissingStateError
    naming the setting; with the setting, the partition starts empty on purpose."""
    from statekit.errors import MissingStateError

    def lost(allow=False):  # a query of its own: in-memory storage outlives one test
        return PartitionStore(HashMapStateBackend(), storage, "lost-query", "op", 0,
                              GenericSerializer(), allow_missing_state=allow)

    with pytest.raises(MissingStateError, match="allow-missing-state"):
        lost().open(5, new_attempt_token(5, 0))
    allowed = lost(allow=True)
    backend = allowed.open(5, new_attempt_token(5, 0))
    backend.set_current_key("a")
    assert backend.get_partitioned_state(COUNT).value() is None
    allowed.commit()
    resumed = lost()  # the next batch resumes from what the allowed one wrote: no error
    resumed.open(6, new_attempt_token(6, 0))
    resumed.abort()


def test_a_version_records_what_its_restore_read(tmp_path):
    """A committed version tells whether its attempt restored, from where, and how many bytes
    of checkpoint files that read (the measure of a rescale's cost); a reused state, nothing.
    Every version also tells how long its checkpoint's two parts took."""
    from statekit.checkpoint.handles import file_handles
    from statekit.runtime.partition import Scaling

    storage = FileSystemCheckpointStorage(str(tmp_path), file_state_size_threshold=0)
    keys = [f"k{i}" for i in range(300)]

    def batch(batch_id, partition, count, owns=None, touched=()):
        # an eager restore: every byte read once, at the restore (a lazy one reads later)
        s = PartitionStore(HashMapStateBackend(lazy_restore=False), storage, "query", "op",
                           partition, GenericSerializer(), scaling=Scaling(count, owns))
        backend = s.open(batch_id, new_attempt_token(batch_id, partition))
        for k in touched:
            backend.set_current_key(k)
            state = backend.get_partitioned_state(COUNT)
            state.update((state.value() or 0) + 1)
        s.commit()
        return s.access.load(batch_id)

    drop_local_state()
    try:
        first = batch(0, 0, 1, touched=keys)
        assert "restore" not in first  # nothing to restore
        # every version records its checkpoint's snapshot and upload times, and what it wrote
        written = sum(h["size"] for h in file_handles(first["tasks"]))
        assert first["commit"]["bytes_written"] == written > 0
        assert first["commit"]["sync_s"] >= 0 and first["commit"]["async_s"] >= 0
        drop_local_state()  # a new process: the next batch restores version 0
        info = batch(1, 0, 1, touched=keys[:1])["restore"]
        assert info["from"] == 0 and not info["rescaled"] and info["sources"] == 1
        assert info["source"] == "remote" and info["seconds"] >= 0
        size = sum(h["size"] for h in file_handles(batch_meta(storage, 0, 0)["tasks"]))
        assert info["bytes_read"] == size
        assert "restore" not in batch(2, 0, 1, touched=keys[:1])  # reused: no restore
        drop_local_state()
        # two partitions now: each restores its keys from the one partition before
        low = batch(3, 0, 2, lambda key: key < "k5", keys[:1])["restore"]
        high = batch(3, 1, 2, lambda key: key >= "k5")["restore"]
        size = sum(h["size"] for h in file_handles(batch_meta(storage, 2, 0)["tasks"]))
        for info in (low, high):  # (today each reads all of it: see docs/operations.md)
            assert info["rescaled"] and info["from"] is None and info["sources"] == 1
            assert info["bytes_read"] == size
    finally:
        drop_local_state()


def batch_meta(storage, batch_id, partition):
    return storage.create_access(f"query/op/p{partition:05d}").load(batch_id)
