"""Heap state through the local runner: the checkpoint stall, and a restart with 1 GiB of state.

* ``test_runner_checkpoint_stall``: the same job (1M keys, a ValueState of longs, checkpoints every
  300 ms per million keys) once with asynchronous and once with synchronous heap snapshots; the stall is the
  synchronous part the coordinator records per checkpoint (``CheckpointStats.sync_seconds``),
  taken over the checkpoints that hold every key (the median of the last three).
* ``test_runner_restart_1gib`` (hashmap, rocksdb, and rocksdb with ``lazy-restore`` off, which
  checks every restored file before opening the database): a job fills 1M keys x 1100 B (>= 1 GiB of
  state), ends with a retained checkpoint, and a second job resumes from it; the figure is the
  time from calling ``execute_and_collect`` to the first element processed after the restore,
  against a cold read (page cache dropped with ``posix_fadvise(DONTNEED)``) of the checkpoint's
  files, measured right before, in the same test. The restarted job's input is built, and the
  garbage collector run, before the clock starts.

Full mode asserts nothing unless ``STATEKIT_BENCH_STRICT=1``; ``STATEKIT_BENCH_QUICK=1`` uses 100k
keys; ``STATEKIT_BENCH_HEAP_KEYS`` sets the stall test's keys.
Run: ``pytest benchmarks/test_heap_runner_bench.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import MIB, QUICK, STRICT, drop_tree_cache, loadavg, scratch_dir

N = 100_000 if QUICK else 1_000_000
#: keys of the stall test (``STATEKIT_BENCH_HEAP_KEYS`` overrides, e.g. 10_000_000)
STALL_N = int(os.environ.get("STATEKIT_BENCH_HEAP_KEYS") or N)
#: the stall test's checkpoint interval: 300 ms per million keys (a synchronous snapshot of 10M
#: keys takes seconds; at 300 ms the synchronous run would mostly snapshot)
STALL_INTERVAL_MS = 300 * max(1, STALL_N // 1_000_000)
VALUE_BYTES = 1100
_POOL = os.urandom(8 * MIB)


def _conf(directory: Path, asynchronous: bool = True, resume: str | None = None,
          interval_ms: int = 300, backend: str = "hashmap") -> dict[str, Any]:
    conf: dict[str, Any] = {
        "state.backend.type": backend,
        "state.backend.async": asynchronous,
        "state.checkpoints.dir": str(directory),
        "execution.checkpointing.interval": f"{interval_ms} ms",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "parallelism.default": 1,
    }
    if resume is not None:
        conf["execution.savepoint.path"] = resume
    return conf


def _run(conf: dict[str, Any], elements: list[Any], function: Any) -> Any:
    from statekit import StreamExecutionEnvironment

    env = StreamExecutionEnvironment.get_execution_environment(conf)
    return env.from_collection(elements).key_by(lambda e: e[0] if isinstance(e, tuple) else e) \
        .process(function) \
        .execute_and_collect("heap runner bench")


def _counter() -> Any:
    from statekit import KeyedProcessFunction, Types, ValueStateDescriptor

    class Count(KeyedProcessFunction):
        def open(self, runtime_context: Any) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.count.update((self.count.value() or 0) + 1)
            return ()

    return Count()


def _filler() -> Any:
    from statekit import KeyedProcessFunction, Types, ValueStateDescriptor

    class Fill(KeyedProcessFunction):
        def open(self, runtime_context: Any) -> None:
            self.value = runtime_context.get_state(
                ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE())))

        def process_element(self, element: Any, ctx: Any) -> Any:
            key, fill = element
            if fill:
                off = (key * 7919) % (len(_POOL) - VALUE_BYTES)
                self.value.update(_POOL[off:off + VALUE_BYTES])
                return ()
            # the element after the restart: when it arrived, and whether its restored value is there
            return [(time.perf_counter(), self.value.value() is not None)]

    return Fill()


def _stall(stats: list[Any]) -> tuple[float, list[float]]:
    done = [s.sync_seconds for s in stats if s.status == "completed"]
    return statistics.median(done[-3:]), done


def test_runner_checkpoint_stall(benchmark: Any) -> None:
    root = scratch_dir("runner-stall")
    elements = list(range(STALL_N)) + list(range(0, STALL_N, 2))  # the second pass: every key
    try:
        results: dict[str, Any] = {}

        def both() -> None:
            for name, asynchronous in (("sync", False), ("async", True)):
                t0 = time.perf_counter()
                res = _run(_conf(root / name, asynchronous, interval_ms=STALL_INTERVAL_MS), elements,
                           _counter())
                results[name] = (_stall(res.checkpoint_stats), time.perf_counter() - t0)

        benchmark.pedantic(both, rounds=1, iterations=1)
        (sync_stall, sync_all), sync_s = results["sync"]
        (async_stall, async_all), async_s = results["async"]
        figures = {
            "keys": STALL_N, "sync_stall_s": round(sync_stall, 5), "async_stall_s": round(async_stall, 6),
            "stall_ratio": round(async_stall / max(sync_stall, 1e-9), 5),
            "async_stall_max_s": round(max(async_all), 6),
            "sync_checkpoints": len(sync_all), "async_checkpoints": len(async_all),
            "sync_job_s": round(sync_s, 2), "async_job_s": round(async_s, 2), "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nrunner checkpoint stall:", figures)
        if STRICT:
            assert figures["stall_ratio"] <= 0.10 and async_stall <= 0.005
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cold_read(paths: list[Path]) -> float:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    t0 = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(8 * MIB):
                pass
    return time.perf_counter() - t0


def _checkpoint_files(root: Path, checkpoint: str) -> list[Path]:
    """The state files of one retained checkpoint (its directory and the job's shared files)."""
    chk = Path(checkpoint)
    files = [p for p in chk.rglob("*") if p.is_file()]
    shared = chk.parent / "shared"
    if shared.is_dir():
        files += [p for p in shared.rglob("*") if p.is_file()]
    return files


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb", "rocksdb-eager"])
def test_runner_restart_1gib(benchmark: Any, backend: str) -> None:
    benchmark.group = f"runner-restart-{backend}"
    root = scratch_dir(f"runner-restart-{backend}")
    # rocksdb-eager: the restore checks every linked file before opening (lazy-restore off)
    eager = backend == "rocksdb-eager"
    backend = backend.removesuffix("-eager")
    try:
        t0 = time.perf_counter()
        fill = [(k, True) for k in range(N)]
        first = _run(_conf(root, interval_ms=60_000, backend=backend), fill, _filler())
        fill_s = time.perf_counter() - t0
        checkpoint = first.latest_checkpoint
        assert checkpoint is not None
        files = _checkpoint_files(root, checkpoint)
        nbytes = sum(p.stat().st_size for p in files)
        rows: list[dict[str, float]] = []

        def restart() -> None:
            disk_s = _cold_read(files)  # the disk's time for the same bytes, right before
            drop_tree_cache(root)
            # the input is the harness's, built before the clock starts (a tuple: the source
            # keeps it as it is), and the collector run on it now: a collection traversing
            # its million young elements took 26 ms of the window otherwise
            elements = (*fill, (N - 1, False))  # the source resumes after the first N
            gc.collect()
            start = time.perf_counter()
            conf = _conf(root / "again", resume=checkpoint, interval_ms=60_000, backend=backend)
            if eager:
                conf["state.backend.rocksdb.lazy-restore"] = False
            out = list(_run(conf, elements, _filler()))
            assert len(out) == 1 and out[0][1]
            rows.append({"disk_s": disk_s, "first_element_s": out[0][0] - start,
                         "job_s": time.perf_counter() - start})

        benchmark.pedantic(restart, rounds=1 if QUICK else 3, iterations=1)
        ratios = [r["first_element_s"] / r["disk_s"] for r in rows]
        figures = {
            "backend": backend + ("-eager" if eager else ""), "keys": N, "value_bytes": VALUE_BYTES,
            "state_bytes": nbytes,
            "fill_s": round(fill_s, 2),
            "disk_cold_read_s": [round(r["disk_s"], 3) for r in rows],
            "restart_to_first_element_s": [round(r["first_element_s"], 3) for r in rows],
            "restart_job_s": [round(r["job_s"], 3) for r in rows],
            "restart_vs_disk": round(statistics.median(ratios), 3),
            "all_ratios": [round(x, 3) for x in ratios], "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nrunner restart:", figures)
        if not QUICK:
            assert nbytes >= 1024 * MIB
        if STRICT:
            assert figures["restart_vs_disk"] <= 1.5
    finally:
        shutil.rmtree(root, ignore_errors=True)

