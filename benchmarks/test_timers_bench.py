"""Timers: firing cost against the number of pending timers, and checkpoints of timers.

Firing (``test_timer_firing*``): 10^5, 10^6 (and, marked ``large``, 10^7) keys hold one event-time
timer each; the watermark advances so that

* (i) 1 % of the timers is due per advance: the figure is the time per fired timer (the time per
  advance grows with the timers due, 100x from 10^5 to 10^7 keys);
* (ii) a fixed 1,000 timers are due per advance: the figure is the time per advance.

The bound "time per advance at 10^7 keys <= 1.5x the time at 10^5" is checked on (ii): only with
the same number of timers due does the time per advance measure what the number of *keys* costs;
(i)'s per-timer time is reported beside it against the same 1.5x.  Fired timers are registered
again ``n`` ms later, untimed, so every advance finds ``n`` timers pending.  The sizes advance in
turn within each round (the machine is shared), and each ratio is the median of the per-round
ratios.  Levels: the backend's queue through ``InternalTimerService`` (heap; RocksDB with its
default timer service ``ROCKSDB``; RocksDB with ``HEAP``), and end to end through the test harness
(``KeyedOneInputStreamOperatorTestHarness.process_watermark``: ``on_timer`` of a function that
updates a value state, re-registers its timer and emits a row).  Beside the heap backend, a raw
``heapq`` of the same ``(timestamp, sequence, key)`` entries shows what a binary heap of Python
objects costs by itself as it outgrows the CPU caches (the heap queues keep a sorted list).

Checkpoints (``test_timer_checkpoint_restore``): a full checkpoint of ``n`` timers to
``FileSystemCheckpointStorage`` and its restore from a cold page cache (until the queue is usable),
against the same bytes written and read on the raw disk in the same test (the method of
``test_checkpoint.py``); 10^7 timers are marked ``large``.  Where the timers are Python objects (the
heap queue, also RocksDB's with ``HEAP``), ``ceiling`` is the most any checkpoint of them could
reach: the queue's table (key -> timestamps) packed by one C call of ``msgpack.packb`` (no checks,
no key groups, no write), its bytes per second against the disk's write, and the same with the
disk write of those bytes added (``pack_then_write_vs_disk``).

``STATEKIT_BENCH_STRICT=1`` asserts the targets at 10^7 (never in quick mode).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from benchmarks._common import QUICK, STRICT, TARGETS, loadavg, scratch_dir
from benchmarks._timers import (
    KINDS,
    HarnessCase,
    RawHeapCase,
    ServiceCase,
    fill,
    interleaved_advances,
    make_backend,
)
from benchmarks.test_checkpoint import Case, _full_and_restore

SIZES = [10_000, 100_000] if QUICK else [100_000, 1_000_000]
LARGE_SIZES = [*SIZES, SIZES[-1] * 10]
FIXED_DUE = 1_000
BOUND = 1.5
FIXED_ROUNDS, PERCENT_ROUNDS = (5, 3) if QUICK else (25, 6)
CHECKPOINT_SIZES = [10_000, 100_000] if QUICK else [100_000, 1_000_000]
LARGE_CHECKPOINT = CHECKPOINT_SIZES[-1] * 10


def _firing(benchmark: Any, kind: str, sizes: list[int], level: str) -> dict[str, Any]:
    root = scratch_dir(f"timers-{kind}")
    make = ServiceCase if level == "service" else HarnessCase
    cases: list[Any] = []
    load = loadavg()
    try:
        for n in sizes:
            cases.append(make(kind, n, root / str(n)))
            if kind == "heap" and level == "service":  # what a binary heap alone costs
                cases.append(RawHeapCase(n))

        def measure() -> dict[str, Any]:
            fixed = interleaved_advances(cases, lambda n: FIXED_DUE, rounds=FIXED_ROUNDS)
            percent = interleaved_advances(cases, lambda n: n // 100, rounds=PERCENT_ROUNDS)
            return {"fixed": fixed, "percent": percent}

        got = benchmark.pedantic(measure, rounds=1, iterations=1)
    finally:
        for case in cases:
            case.close()
        shutil.rmtree(root, ignore_errors=True)
    largest = max(sizes)
    fixed, percent = got["fixed"]["statekit"][largest], got["percent"]["statekit"][largest]
    out = {
        "kind": kind, "level": level, "sizes": sizes, "fixed_due": FIXED_DUE, "bound": BOUND,
        "load_s": {str(c.n): round(c.load_s, 2) for c in cases if hasattr(c, "load_s")},
        "fixed": {str(n): v for n, v in got["fixed"]["statekit"].items()},
        "percent": {str(n): v for n, v in got["percent"]["statekit"].items()},
        "baseline": {mode: {str(n): v for n, v in got[mode]["heapq"].items()}
                     for mode in ("fixed", "percent") if "heapq" in got[mode]},
        "fixed_advance_ratio": fixed["advance_ratio_to_smallest"],
        "percent_per_timer_ratio": percent["per_timer_ratio_to_smallest"],
        "checked_on": "fixed", "loadavg": load, "loadavg_end": loadavg(),
    }
    benchmark.group = f"timers-firing-{level}"
    benchmark.extra_info.update(out)
    print(f"\n{level} {kind} {sizes}: load {out['load_s']} s")
    for series in got["fixed"]:
        for n in sizes:
            f, p = got["fixed"][series][n], got["percent"][series][n]
            print(f"  {series:>8} {n:>10,}: {FIXED_DUE} due {f['advance_s'] * 1e3:8.2f} ms/advance "
                  f"(x{f['advance_ratio_to_smallest']}); 1 % due ({p['fired_per_advance']:,}) "
                  f"{p['us_per_timer']:7.2f} us/timer (x{p['per_timer_ratio_to_smallest']})")
    if STRICT and largest >= 10_000_000:
        assert out["fixed_advance_ratio"] <= BOUND, out
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_timer_firing(benchmark: Any, kind: str) -> None:
    _firing(benchmark, kind, SIZES, "service")


@pytest.mark.large
@pytest.mark.parametrize("kind", KINDS)
def test_timer_firing_large(benchmark: Any, kind: str) -> None:
    _firing(benchmark, kind, LARGE_SIZES, "service")


@pytest.mark.parametrize("kind", KINDS)
def test_timer_firing_harness(benchmark: Any, kind: str) -> None:
    _firing(benchmark, kind, SIZES, "harness")


class TimerCase(Case):
    """``test_checkpoint``'s case holding ``n`` event-time timers instead of a value state."""

    def make(self, name: str, *, incremental: bool, asynchronous: bool = True) -> Any:
        return make_backend(self.kind, self.root / "work" / name)

    def add(self, name: str, *, incremental: bool, asynchronous: bool = True) -> None:
        from statekit.backends.timers import EVENT_TIMERS

        backend = self.make(name, incremental=incremental)
        self.backends[name] = backend
        self.access[name] = self.storage.create_access(name)
        self.load_s = fill(backend.timer_queue(EVENT_TIMERS), self.keys)

    def ready(self, fresh: Any) -> None:
        """The restored queue is usable: its earliest timer (timestamp 0) is known."""
        from statekit.backends.timers import EVENT_TIMERS

        assert fresh.timer_queue(EVENT_TIMERS, create=False).peek() == 0


def _ceiling(case: TimerCase, disk_write_mb_s: float) -> dict[str, Any] | None:
    """The fastest conceivable serialization of a heap queue's timers: one C call over its table,
    best of two; None for queues that are not Python objects."""
    import msgpack

    from statekit.backends.timers import EVENT_TIMERS, HeapTimerQueue

    queue = case.backends["full"].timer_queue(EVENT_TIMERS, create=False)
    if not isinstance(queue, HeapTimerQueue):
        return None
    best, nbytes = float("inf"), 0
    for _ in range(2):
        t0 = time.perf_counter()
        nbytes = len(msgpack.packb(queue.table.data))
        best = min(best, time.perf_counter() - t0)
    pack_mb_s = nbytes / best / 1e6
    write_s = nbytes / (disk_write_mb_s * 1e6)
    return {"bytes": nbytes, "pack_s": round(best, 3), "pack_mb_s": round(pack_mb_s, 1),
            "pack_vs_disk": round(pack_mb_s / disk_write_mb_s, 4),
            "pack_then_write_vs_disk": round(nbytes / (best + write_s) / 1e6 / disk_write_mb_s, 4)}


@pytest.mark.parametrize("n", [*CHECKPOINT_SIZES,
                               pytest.param(LARGE_CHECKPOINT, marks=pytest.mark.large)])
@pytest.mark.parametrize("kind", KINDS)
def test_timer_checkpoint_restore(benchmark: Any, kind: str, n: int) -> None:
    benchmark.group = f"timers-checkpoint-{kind}"
    root = scratch_dir(f"timers-ckpt-{kind}-{n}")
    # the raw disk is probed with about the checkpoint's bytes: n x (value_bytes + 16)
    case = TimerCase(kind, n, 16 if kind == "rocksdb" else 0, root)
    try:
        load = loadavg()
        case.add("full", incremental=False)
        out = _full_and_restore(case, benchmark, sync_too=False)
        nbytes = out["full"]["bytes"]
        ceiling = _ceiling(case, out["disk"]["best"]["write_mb_s"])
        if ceiling is not None:
            out["ceiling"] = ceiling
        out.update({"backend": kind, "timers": n, "load_s": round(case.load_s, 2),
                    "bytes_per_timer": round(nbytes / n, 2),
                    "checkpoint_ns_per_timer": round(out["full"]["total_s"] / n * 1e9),
                    "restore_ns_per_timer": round(out["restore_full"]["restore_s"] / n * 1e9),
                    "loadavg": load, "loadavg_end": loadavg()})
        benchmark.extra_info.update(out)
        print(f"\n{kind} {n:,} timers: {nbytes:,} B, checkpoint {out['full']['total_s']} s "
              f"({out['full']['write_mb_s']} MB/s), restore {out['restore_full']['restore_s']} s "
              f"({out['restore_full']['read_mb_s']} MB/s); ratios {out['ratios']}; "
              f"ceiling {out.get('ceiling')}")
        if STRICT and n >= 10_000_000:
            assert out["ratios"]["checkpoint_write_vs_disk"] >= TARGETS["disk"]
            assert out["ratios"]["restore_read_vs_disk"] >= TARGETS["disk"]
    finally:
        case.close()
        shutil.rmtree(root, ignore_errors=True)
