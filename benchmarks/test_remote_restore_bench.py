"""RocksDB restore from checkpoint storage on 1, 2, 4 and 8 transfer threads, against the raw
download of the same files on as many threads, in the same run.

One RocksDB backend is filled with ``size`` bytes of state (1 KiB values) and checkpointed in
full twice: to a FileSystem storage on the local disk and to S3 (s3fs against moto's server on
127.0.0.1). Then, per storage and thread count, interleaved: the raw download (fsspec
``get_file`` of every file of the checkpoint on a pool of ``threads`` threads, nothing verified)
and a restart (a new backend restores the checkpoint, the state is registered, the first key
read), each into a fresh directory.  Figures: ``restore / raw`` (time), and restart → first
element.  The local storage hard-links SST files at restore (a copy in the raw download), so its
ratio may be below 1.

Sizes: ``STATEKIT_BENCH_QUICK=1`` 8 MiB and 1 or 4 threads; full mode 0.1 GiB, and 1 GiB (marker
``large``: in ``make bench``, not in ``make bench-quick``).
Run: ``pytest benchmarks/test_remote_restore_bench.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import MAXP, MIB, QUICK, loadavg, long_serializer, rocksdb_factory, scratch_dir

VALUE_BYTES = 1024
GIB = 1024 * MIB
SIZES = [8 * MIB] if QUICK else [GIB // 10, pytest.param(GIB, marks=pytest.mark.large)]
THREADS = [1, 4] if QUICK else [1, 2, 4, 8]
ROUNDS = 1 if QUICK else 2
_POOL = os.urandom(4 * MIB)


class Checkpointed:
    """One state of ``size`` bytes, checkpointed to the local disk and to S3."""

    def __init__(self, size: int, s3: Any) -> None:
        from statekit.checkpoint.filesystem import FileSystemCheckpointStorage

        self.size = size
        self.keys = size // VALUE_BYTES
        self.root = scratch_dir(f"remote-restore-{size // MIB}m")
        bucket = s3.create_bucket(f"restore-{size // MIB}m-{os.getpid()}")
        self.storage_options = s3.storage_options()
        self.access = {
            "filesystem": FileSystemCheckpointStorage(str(self.root / "chk")).create_access("job"),
            "s3": FileSystemCheckpointStorage(bucket + "/chk", storage_options=self.storage_options
                                              ).create_access("job"),
        }
        self.handles: dict[str, dict[str, Any]] = {}
        kb = self._backend(self.root / "writer", 4)
        try:
            state = kb.get_partitioned_state(_descriptor())
            for key in range(self.keys):
                off = (key * 7919) % (len(_POOL) - VALUE_BYTES)
                kb.set_current_key(key)
                state.update(_POOL[off:off + VALUE_BYTES])
            for cid, (name, access) in enumerate(self.access.items(), start=1):
                self.handles[name] = kb.snapshot(cid, access.streams(cid, "t0")).run()
                access.commit(cid, {"tasks": {"t0": self.handles[name]}})
        finally:
            kb.dispose()
        handle = self.handles["filesystem"]
        files = [*handle["sst"].values(), *handle["misc"].values()]
        self.files = len(files)
        self.bytes = sum(int(h.get("size", 0)) for h in files)

    @staticmethod
    def _backend(workdir: Path, threads: int) -> Any:
        from statekit.serde.keygroups import KeyGroupRange

        factory = rocksdb_factory(workdir)
        factory.set_number_of_transfering_threads(threads)
        return factory.create_keyed_state_backend(
            key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP),
            max_parallelism=MAXP)

    def raw(self, storage: str, threads: int, dest: Path) -> float:
        """Seconds to download the checkpoint's files with fsspec on ``threads`` threads."""
        import fsspec

        handle = self.handles[storage]
        paths = [h["path"] for h in (*handle["sst"].values(), *handle["misc"].values())
                 if h["type"] == "file"]
        access = self.access[storage]
        if storage == "s3":  # the storage's own s3fs client (connections already open)
            fs, base = access.store.fs, access.location.removeprefix("s3://")
        else:
            fs, base = fsspec.filesystem("file"), access.location
        fs.info(f"{base}/{paths[0]}")
        dest.mkdir(parents=True)
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda p: fs.get_file(f"{base}/{p}", str(dest / p.replace("/", "_"))),
                          paths))
        return time.perf_counter() - start

    def restart(self, storage: str, threads: int, workdir: Path) -> tuple[float, float]:
        """(restore seconds, restart → first element seconds) of a new backend."""
        start = time.perf_counter()
        kb = self._backend(workdir, threads)
        try:
            kb.restore([self.handles[storage]], self.access[storage].reader())
            restored = time.perf_counter()
            state = kb.get_partitioned_state(_descriptor())
            kb.set_current_key(self.keys // 2)
            assert state.value() is not None
            first = time.perf_counter()
        finally:
            kb.dispose()
        return restored - start, first - start

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _descriptor() -> Any:
    from statekit import Types, ValueStateDescriptor

    return ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE()))


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    from statekit.testing.s3 import LocalS3Server

    server = LocalS3Server().start()
    try:
        yield server
    finally:
        server.stop()


_BUILT: dict[int, Checkpointed] = {}


@pytest.fixture(scope="module")
def built(s3: Any) -> Iterator[dict[int, Checkpointed]]:
    try:
        yield _BUILT
    finally:
        for state in _BUILT.values():
            state.close()
        _BUILT.clear()


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("storage", ["filesystem", "s3"])
@pytest.mark.parametrize("size", SIZES)
def test_rocksdb_restore_from_storage(benchmark: Any, built: dict[int, Checkpointed], s3: Any,
                                      size: int, storage: str, threads: int) -> None:
    benchmark.group = f"remote-restore-{size // MIB}MiB-{storage}"
    for other in [s for s in _BUILT if s != size]:  # one size on disk (and in moto) at a time
        _BUILT.pop(other).close()
    if size not in _BUILT:
        _BUILT[size] = Checkpointed(size, s3)
    state = _BUILT[size]
    times: dict[str, list[float]] = {"raw": [], "restore": [], "first": []}
    work = state.root / f"run-{storage}-{threads}"

    def rounds() -> None:
        for n in range(ROUNDS):
            times["raw"].append(state.raw(storage, threads, work / f"raw-{n}"))
            shutil.rmtree(work / f"raw-{n}", ignore_errors=True)
            restore, first = state.restart(storage, threads, work / f"db-{n}")
            times["restore"].append(restore)
            times["first"].append(first)

    try:
        benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw, restore, first = (statistics.median(times[k]) for k in ("raw", "restore", "first"))
    figures = {
        "storage": storage, "threads": threads, "state_bytes": state.bytes, "files": state.files,
        "keys": state.keys, "raw_s": round(raw, 3), "restore_s": round(restore, 3),
        "first_element_s": round(first, 3), "restore_vs_raw": round(restore / raw, 3),
        "first_element_vs_raw": round(first / raw, 3),
        "raw_mib_s": round(state.bytes / MIB / raw, 1), "loadavg": loadavg(),
    }
    benchmark.extra_info.update(figures)
    print("\nremote restore:", figures)
