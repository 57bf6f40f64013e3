"""RocksDB restore from checkpoint storage: the files of a native handle download concurrently on
the transfer threads, each once and verified as it lands, a failed file stops the others, and
nothing reads the state's keys between the last file landing and the first element.

The storages are real (the local disk, and S3 through s3fs against moto on 127.0.0.1); a thin
wrapper around the store only records which reads are in flight at the same time.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.reader import StateReader
from statekit.errors import CheckpointNotFoundError, ChecksumMismatchError, TruncatedCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import Types
from statekit.state.descriptors import ValueStateDescriptor
from tests.tmpfs import rocksdb_dir

SHM = rocksdb_dir()
STATES = [ValueStateDescriptor(f"v{i}", Types.LONG()) for i in range(3)]
ALL = KeyGroupRange(0, 127)
LONG = Types.LONG()


class InFlight:
    """A blob store as it is, whose ``get_file`` calls record how many run at the same time.

    Each call waits (up to ``patience`` seconds, once) until ``want`` calls are in flight
    together, so calls that run one after another show ``peak == 1`` instead of overlapping
    by luck; ``slow`` delays every file but ``first`` (to see how many start after a failure).
    """

    def __init__(self, store: Any, want: int = 1, patience: float = 3.0,
                 slow: float = 0.0, first: str | None = None) -> None:
        self._store, self.want, self.patience, self.slow, self.first = (
            store, want, patience, slow, first)
        self.calls: list[str] = []
        self.peak = 0
        self._now = 0
        self._gave_up = False
        self._cond = threading.Condition()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get_file(self, key: str, local_path: Any, *, allow_link: bool = False) -> None:
        with self._cond:
            self.calls.append(key)
            self._now += 1
            self.peak = max(self.peak, self._now)
            self._cond.notify_all()
            if (not self._gave_up and self.peak < self.want
                    and not self._cond.wait_for(lambda: self.peak >= self.want, self.patience)):
                self._gave_up = True
        try:
            if self.slow and key != self.first:
                time.sleep(self.slow)
            self._store.get_file(key, local_path, allow_link=allow_link)
        finally:
            with self._cond:
                self._now -= 1


def factory(root: Path, name: str, threads: int, options: Any = None,
            incremental: bool = True) -> EmbeddedRocksDBStateBackend:
    f = EmbeddedRocksDBStateBackend(incremental)
    f.set_db_storage_paths(str(Path(SHM) / name) if SHM else str(root / "work" / name))
    f.set_number_of_transfering_threads(threads)
    if options is not None:
        f.set_options(options)
    return f


def keyed(f: EmbeddedRocksDBStateBackend, rng: KeyGroupRange = ALL,
          key_type: Any = LONG) -> Any:
    return f.create_keyed_state_backend(key_serializer=key_type.get_serializer(),
                                        key_group_range=rng, max_parallelism=128)


def no_compactions(opts: Any) -> Any:
    """Keep every flushed SST file, so a chain's file count does not depend on when RocksDB's
    background compactions happen to run."""
    opts.set_disable_auto_compactions(True)
    return opts


def write_chain(root: Path, access: Any, key_type: Any = LONG,
                checkpoints: int = 3, keys: int = 3000,
                options: Any = None) -> dict[str, Any]:
    """Three incremental checkpoints of three states, each adding keys (new SST files that
    re-reference the earlier ones); the last handle."""
    kb = keyed(factory(root, "writer", 2, options), key_type=key_type)
    try:
        for cid in range(1, checkpoints + 1):
            for desc in STATES:
                state = kb.get_partitioned_state(desc)
                for k in range(cid * 1000, cid * 1000 + keys):
                    kb.set_current_key(k)
                    state.update(k)
            handle = kb.snapshot(cid, access.streams(cid, "t0")).run()
            access.commit(cid, {"tasks": {"t0": handle}})
            kb.notify_checkpoint_complete(cid)
        return handle
    finally:
        kb.dispose()


def file_paths(handle: dict[str, Any]) -> list[str]:
    return [h["path"] for h in (*handle["sst"].values(), *handle["misc"].values())
            if h["type"] == "file"]


def check_restored(kb: Any, checkpoints: int = 3, keys: int = 3000) -> None:
    for desc in STATES:
        state = kb.get_partitioned_state(desc)
        for k in (1000, 1000 + keys - 1, checkpoints * 1000 + keys - 1):
            kb.set_current_key(k)
            assert state.value() == k


@pytest.fixture(params=["local", "s3"])
def access(request, tmp_path):
    if request.param == "local":
        storage = FileSystemCheckpointStorage(str(tmp_path / "chk"), file_state_size_threshold=64)
    else:
        server = request.getfixturevalue("s3_server")
        url = request.getfixturevalue("s3_url")
        storage = FileSystemCheckpointStorage(url + "/chk", file_state_size_threshold=64,
                                              storage_options=server.storage_options())
    return storage.create_access("job")


@pytest.mark.parametrize("threads", [1, 4])
def test_files_download_concurrently_each_once(tmp_path, access, threads):
    handle = write_chain(tmp_path, access)
    paths = file_paths(handle)
    shared = {p for p in paths if "/chk-3/" not in p}
    assert len(handle["sst"]) >= 6 and shared  # files the earlier checkpoints wrote
    store = InFlight(access.store, want=threads)
    kb = keyed(factory(tmp_path, f"r{threads}", threads))
    try:
        kb.restore([handle], StateReader(store))
        check_restored(kb)
    finally:
        kb.dispose()
    assert store.peak == threads  # one at a time with 1 thread; 4 in flight together with 4
    # every file of the chain, shared ones included, is fetched exactly once
    assert Counter(store.calls) == Counter(paths)


def test_rescale_merge_downloads_each_handle_concurrently(tmp_path, access):
    """Two partitions' checkpoints into one backend: the base handle becomes the database, the
    other is downloaded to copy its key groups; both on the transfer threads, each file once."""
    handles = []
    for n, rng in enumerate((KeyGroupRange(0, 63), KeyGroupRange(64, 127))):
        kb = keyed(factory(tmp_path, f"w{n}", 1), rng)
        try:
            state = kb.get_partitioned_state(STATES[0])
            for k in range(4000):
                if kb.key_group_of(k) in rng:
                    kb.set_current_key(k)
                    state.update(k)
            handles.append(kb.snapshot(1, access.streams(1, f"t{n}")).run())
        finally:
            kb.dispose()
    store = InFlight(access.store, want=3)
    kb = keyed(factory(tmp_path, "merged", 3))
    try:
        kb.restore(handles, StateReader(store))
        state = kb.get_partitioned_state(STATES[0])
        for k in (0, 1999, 3999):
            kb.set_current_key(k)
            assert state.value() == k
    finally:
        kb.dispose()
    assert store.peak == 3
    assert Counter(store.calls) == Counter(p for h in handles for p in file_paths(h))


def test_a_failed_file_stops_the_downloads_not_yet_begun(tmp_path):
    """A file that cannot be read fails the restore without fetching the rest first (a damaged
    checkpoint of a gigabyte fails in the time of one file, not of the whole download)."""
    access = FileSystemCheckpointStorage(str(tmp_path / "chk"),
                                         file_state_size_threshold=64).create_access("job")
    handle = write_chain(tmp_path, access, checkpoints=4, keys=1500, options=no_compactions)
    paths = file_paths(handle)
    first = next(iter(handle["sst"].values()))["path"]
    access.store.delete(first)
    store = InFlight(access.store, want=1, slow=1.0, first=first)
    kb = keyed(factory(tmp_path, "broken", 2))
    try:
        with pytest.raises(CheckpointNotFoundError):
            kb.restore([handle], StateReader(store))
    finally:
        kb.dispose()
    assert len(paths) >= 10
    # the other thread finishes the file it holds (and at most one more it began meanwhile)
    assert len(store.calls) <= 4, store.calls


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_each_file_is_verified_on_its_transfer_thread(tmp_path, access, damage):
    handle = write_chain(tmp_path, access, checkpoints=2)
    sst = list(handle["sst"].values())[-1]
    data = bytearray(access.reader().read(sst))
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[-10:]
    access.store.put(sst["path"], bytes(data))
    kb = keyed(factory(tmp_path, f"bad-{damage}", 4))
    try:
        with pytest.raises(ChecksumMismatchError if damage == "flip" else TruncatedCheckpointError):
            kb.restore([handle], access.reader())
    finally:
        kb.dispose()


# --- nothing reads every key between the download and the first element --------------------------


_COUNTER = re.compile(r"^(rocksdb\.[a-z.]+) COUNT : (\d+)$", re.M)


class Statistics:
    """An options factory turning RocksDB's statistics on, keeping each Options it adjusted."""

    def __init__(self) -> None:
        self.options: list[Any] = []

    def __call__(self, options: Any) -> Any:
        options.enable_statistics()
        self.options.append(options)
        return options

    def counters(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for options in self.options:
            for name, count in _COUNTER.findall(options.get_statistics() or ""):
                total[name] += int(count)
        return total


def _restore_reads(tmp_path: Path, written_as: Any, restored_as: Any) -> Counter[str]:
    access = FileSystemCheckpointStorage(str(tmp_path / "chk"),
                                         file_state_size_threshold=64).create_access("job")
    handle = write_chain(tmp_path, access, key_type=written_as, keys=4000)
    stats = Statistics()
    kb = keyed(factory(tmp_path, "stats", 2, stats), key_type=restored_as)
    try:
        kb.restore([handle], access.reader())
        counters = stats.counters()
        check_restored(kb, keys=4000)
    finally:
        kb.dispose()
    return counters


def test_restore_reads_no_key_of_the_state(tmp_path):
    """Opening a downloaded checkpoint seeks each state's first and last key (the key-group
    range check) and reads nothing else: no scan, no lookup, however large the state."""
    counters = _restore_reads(tmp_path, Types.LONG(), Types.LONG())
    assert counters["rocksdb.number.db.next"] == 0
    assert counters["rocksdb.number.keys.read"] == 0
    assert counters["rocksdb.number.db.seek"] <= 2 * len(STATES)


def test_a_key_type_migration_is_the_one_scan(tmp_path):
    """The counters see a scan: keys written as GENERIC restored under a declared LONG key
    type are each checked (the one restore that reads every key, paid only in that case)."""
    counters = _restore_reads(tmp_path, Types.GENERIC(), Types.LONG())
    assert counters["rocksdb.number.db.next"] >= len(STATES) * 6000


def test_a_key_filtered_restore_downloads_on_the_targets_threads(tmp_path, access):
    """A native checkpoint split by key (a Spark partition taking the keys it now owns) is read
    through a temporary RocksDB backend: it downloads on the target's transfer threads too."""
    from statekit.backends.transfer import restore_into

    handle = write_chain(tmp_path, access, checkpoints=2)
    store = InFlight(access.store, want=3)
    kb = keyed(factory(tmp_path, "filtered", 3))
    try:
        restore_into(kb, [(handle, StateReader(store))], key_filter=lambda k: k % 2 == 0)
        state = kb.get_partitioned_state(STATES[0])
        for k in (1000, 1001, 2998):
            kb.set_current_key(k)
            assert state.value() == (k if k % 2 == 0 else None)
    finally:
        kb.dispose()
    assert store.peak == 3
    assert Counter(store.calls) == Counter(file_paths(handle))
