"""Shared helpers of the statekit benchmarks: sizes, backends, interleaved A/B timing, raw disk I/O.

Every benchmark measures the library next to a baseline **in the same run and interleaved round by
round** (the machine is shared, so only ratios measured side by side are trustworthy).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

QUICK = os.environ.get("STATEKIT_BENCH_QUICK") == "1"
#: ``STATEKIT_BENCH_STRICT=1`` turns the issue's targets into assertions (never in quick mode)
STRICT = os.environ.get("STATEKIT_BENCH_STRICT") == "1" and not QUICK
MAXP = 128
MIB = 1024 * 1024

# throughput targets: the library's throughput as a fraction of its raw baseline, per medium
TARGETS = {"heap": 0.30, "rocksdb": 0.70, "disk": 0.70}


def scratch_dir(tag: str) -> Path:
    """A fresh directory on the benchmark disk (``STATEKIT_BENCH_TMP``, else the system temp dir)."""
    root = os.environ.get("STATEKIT_BENCH_TMP") or tempfile.gettempdir()
    Path(root).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"statekit-bench-{tag}-", dir=root))


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# --- backends -------------------------------------------------------------------------------------


def long_serializer() -> Any:
    from statekit import Types

    return Types.LONG().get_serializer()


def heap_backend(*, asynchronous: bool = True, incremental: bool = False) -> Any:
    from statekit import HashMapStateBackend
    from statekit.serde.keygroups import KeyGroupRange

    factory = HashMapStateBackend(asynchronous, incremental=incremental)
    return factory.create_keyed_state_backend(
        key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP), max_parallelism=MAXP)


def rocksdb_factory(workdir: Path, *, incremental: bool = False, predefined: Any = None) -> Any:
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend

    factory = EmbeddedRocksDBStateBackend(incremental)
    factory.set_db_storage_paths(str(workdir))
    if predefined is not None:
        factory.set_predefined_options(predefined)
    return factory


def rocksdb_backend(workdir: Path, *, incremental: bool = False, predefined: Any = None) -> Any:
    from statekit.serde.keygroups import KeyGroupRange

    factory = rocksdb_factory(workdir, incremental=incremental, predefined=predefined)
    return factory.create_keyed_state_backend(
        key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP), max_parallelism=MAXP)


def raw_rdict(path: Path, column_families: list[str], predefined: Any = None) -> tuple[Any, dict[str, Any]]:
    """A hand-written rocksdict user's database: raw mode, the backend's options (its default
    memory budget included), WAL off.

    Returns the database and one column-family handle per name (the same layout as the backend).
    """
    from rocksdict import Rdict, WriteOptions

    from statekit.backends.rocksdb.memory import RocksDBMemoryConfiguration, shared_memory
    from statekit.backends.rocksdb.options import PredefinedOptions, build_options

    memory = shared_memory(RocksDBMemoryConfiguration())
    opts = build_options(predefined or PredefinedOptions.DEFAULT, memory=memory)
    db = Rdict(str(path), opts)
    wo = WriteOptions()
    wo.disable_wal = True
    db.set_write_options(wo)
    cfs = {}
    for name in column_families:
        cf = db.create_column_family(name, build_options(predefined or PredefinedOptions.DEFAULT,
                                                         memory=memory))
        cf.set_write_options(wo)
        cfs[name] = cf
    return db, cfs


def key_prefix_fn() -> Callable[[int], bytes]:
    """The backend's key encoding, as a hand-written user would inline it: kg prefix + msgpack(key)."""
    from statekit.serde.keygroups import key_group_for_bytes
    from statekit.serde.types import packb

    kgp = [kg.to_bytes(2, "big") for kg in range(MAXP)]

    def encode(key: int) -> bytes:
        kb = packb(key)
        return kgp[key_group_for_bytes(kb, MAXP)] + kb

    return encode


# --- interleaved A/B timing -------------------------------------------------------------------------


def interleaved(benchmark: Any, target: Callable[[int], Any], baselines: dict[str, Callable[[int], Any]],
                *, ops: int, rounds: int, warmup: int = 1) -> dict[str, Any]:
    """Time ``target(round)`` with pytest-benchmark; run each baseline right before it every round.

    Returns per-implementation median seconds per round, ops/s, and the median of the per-round
    ratios ``baseline_time / target_time`` (= library ops/s as a fraction of the baseline's).
    """
    times: dict[str, list[float]] = {"statekit": [], **{name: [] for name in baselines}}
    counter = iter(range(1_000_000))

    def setup() -> tuple[tuple[int], dict[str, Any]]:
        i = next(counter)
        for name, fn in baselines.items():
            t0 = time.perf_counter()
            fn(i)
            times[name].append(time.perf_counter() - t0)
        return (i,), {}

    def timed(i: int) -> None:
        t0 = time.perf_counter()
        target(i)
        times["statekit"].append(time.perf_counter() - t0)

    benchmark.pedantic(timed, setup=setup, rounds=rounds, iterations=1, warmup_rounds=warmup)
    n = len(times["statekit"])
    skip = warmup if n > warmup else 0
    kept = {name: ts[skip:] for name, ts in times.items()}
    out: dict[str, Any] = {"ops_per_round": ops, "rounds": len(kept["statekit"])}
    for name, ts in kept.items():
        med = statistics.median(ts)
        out[f"{name}_s"] = round(med, 6)
        out[f"{name}_ops_s"] = round(ops / med) if med > 0 else None
    for name in baselines:
        ratios = [b / s for b, s in zip(kept[name], kept["statekit"], strict=True) if s > 0]
        out[f"ratio_vs_{name}"] = round(statistics.median(ratios), 4) if ratios else None
    return out


# --- raw sequential disk throughput ----------------------------------------------------------------


def _drop_cache(path: Path) -> None:
    """Evict ``path`` from the page cache (clean pages only), so the next read hits the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree_cache(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            try:
                _drop_cache(Path(dirpath) / f)
            except OSError:
                pass


def _raw_write(directory: Path, nbytes: int, file_bytes: int, chunk: int) -> tuple[float, list[Path]]:
    """Write ``nbytes`` sequentially into files of ``file_bytes`` (each fsynced); seconds and paths."""
    block = os.urandom(min(chunk, max(nbytes, 1)))
    paths: list[Path] = []
    t0 = time.perf_counter()
    left = nbytes
    while left > 0:
        path = directory / f".raw-disk-{os.getpid()}-{time.monotonic_ns()}"
        paths.append(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            in_file = min(left, file_bytes)
            left -= in_file
            while in_file > 0:
                view = memoryview(block)[: min(in_file, len(block))]
                in_file -= len(view)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0, paths


def raw_disk_throughput(directory: Path, nbytes: int, chunk: int = 8 * MIB) -> dict[str, float]:
    """The raw disk's sequential throughput for ``nbytes`` in ``directory`` (MB/s = 1e6 B/s).

    Write: two patterns, each with 8 MiB writes -- one file with one final fsync (the heap
    checkpoint's shape) and 64 MiB files each fsynced (the RocksDB upload's shape); the faster one
    is the disk's figure.  Read: the files read back sequentially after evicting them from the page
    cache (``POSIX_FADV_DONTNEED``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    one_s, one_paths = _raw_write(directory, nbytes, nbytes, chunk)
    for p in one_paths:
        p.unlink()
    multi_s, paths = _raw_write(directory, nbytes, 64 * MIB, chunk)
    for p in paths:
        _drop_cache(p)
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(chunk):
                pass
    read_s = time.perf_counter() - t0
    for p in paths:
        p.unlink()
    write_s = min(one_s, multi_s)
    return {"bytes": nbytes, "write_mb_s": round(nbytes / write_s / 1e6, 1),
            "write_one_file_mb_s": round(nbytes / one_s / 1e6, 1),
            "write_64mib_files_mb_s": round(nbytes / multi_s / 1e6, 1),
            "read_mb_s": round(nbytes / read_s / 1e6, 1), "write_s": round(write_s, 4),
            "read_s": round(read_s, 4)}


def best_disk(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """The disk's limit from two probes: the faster of each figure (a conservative bar)."""
    return {"bytes": a["bytes"], "write_mb_s": max(a["write_mb_s"], b["write_mb_s"]),
            "read_mb_s": max(a["read_mb_s"], b["read_mb_s"])}


def mean_disk(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: round((a[k] + b[k]) / 2, 4) for k in a}


def spark_env(driver: Any) -> Iterator[tuple[Any, Any]]:
    """A benchmark module's Spark session and inputs, warmed up, stopped and removed after it
    (``driver``: a driver module with ``Inputs``, ``make_spark``, ``warm_up``, ``stop_spark``)."""
    inputs = driver.Inputs(QUICK)
    spark = driver.make_spark()
    try:
        driver.warm_up(spark, inputs)
        yield spark, inputs
    finally:
        driver.stop_spark(spark)
        shutil.rmtree(inputs.root, ignore_errors=True)


def spark_workdir(prefix: str, conf: dict[str, Any] | None = None) -> Iterator[tuple[Any, Path]]:
    """A benchmark module's Spark session (``spark_driver.make_spark``) and a scratch directory,
    both ended after it."""
    from benchmarks import spark_driver

    spark = spark_driver.make_spark(conf)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield spark, work
    finally:
        spark_driver.stop_spark(spark)
        shutil.rmtree(work, ignore_errors=True)
