"""Helpers of the timer benchmarks: backends holding n timers, interleaved advances, checkpoints.

A case holds ``n`` keys with one event-time timer each, at timestamps ``0 .. n-1`` in a random
order.  An advance moves the watermark ``step`` milliseconds on and fires the ``step`` timers it
passes; each fired timer is then registered again ``n`` milliseconds later (outside the timed
part), so every advance finds ``n`` timers pending.
"""

from __future__ import annotations

import heapq
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import MAXP, long_serializer, rocksdb_factory

#: heap backend; RocksDB with its default timer service (``ROCKSDB``) and with ``HEAP``
KINDS = ["heap", "rocksdb", "rocksdb-heap"]


def make_backend_factory(kind: str, workdir: Path) -> Any:
    """The state backend of ``kind`` (RocksDB's working directories under ``workdir``)."""
    from statekit import HashMapStateBackend

    if kind == "heap":
        return HashMapStateBackend()
    factory = rocksdb_factory(workdir)
    if kind == "rocksdb-heap":
        factory.set_priority_queue_state_type("HEAP")
    return factory


def make_backend(kind: str, workdir: Path) -> Any:
    """A keyed backend of ``kind`` over all ``MAXP`` key groups, ``Long`` keys."""
    from statekit.serde.keygroups import KeyGroupRange

    return make_backend_factory(kind, workdir).create_keyed_state_backend(
        key_serializer=long_serializer(), key_group_range=KeyGroupRange.all(MAXP),
        max_parallelism=MAXP)


def timestamps(n: int, seed: int = 1) -> list[int]:
    """Key ``k``'s timer: a permutation of ``0 .. n-1``."""
    return np.random.default_rng(seed).permutation(n).tolist()  # type: ignore[no-any-return]


def fill(queue: Any, n: int) -> float:
    """Register key k's timer for every k < n directly in ``queue``, in timestamp order (as a
    stream registers them, roughly); seconds taken."""
    add = queue.add
    order = np.argsort(np.asarray(timestamps(n)), kind="stable").tolist()
    t0 = time.perf_counter()
    for ts, key in enumerate(order):  # key ``order[ts]`` holds the timer at ``ts``
        add(key, ts)
    return time.perf_counter() - t0


class ServiceCase:
    """``n`` timers in a backend's event-time queue, fired through ``InternalTimerService``."""

    series = "statekit"

    def __init__(self, kind: str, n: int, workdir: Path) -> None:
        from statekit.backends.timers import EVENT_TIMERS
        from statekit.runtime.timers import InternalTimerService, TimeDomain

        self.kind, self.n, self.workdir = kind, n, workdir
        self.backend = make_backend(kind, workdir)
        self.load_s = fill(self.backend.timer_queue(EVENT_TIMERS), n)
        self.service = InternalTimerService(self.backend)
        self.service.watermark = -1
        self.domain = TimeDomain.EVENT_TIME

    def advance(self, step: int) -> tuple[float, int]:
        """Move the watermark ``step`` on and fire what is due: (seconds, timers fired)."""
        service = self.service
        fired = []
        poll = service.poll_event
        t0 = time.perf_counter()
        service.watermark += step
        while (timer := poll()) is not None:
            fired.append(timer)
        seconds = time.perf_counter() - t0
        set_key, register, n = self.backend.set_current_key, service.register, self.n
        for key, ts in fired:  # re-armed, untimed: n timers stay pending
            set_key(key)
            register(self.domain, ts + n)
        return seconds, len(fired)

    def close(self) -> None:
        self.backend.dispose()
        shutil.rmtree(self.workdir, ignore_errors=True)


class HarnessCase:
    """``n`` timers of a :class:`Rearm` function in a test harness, fired by watermarks."""

    series = "statekit"

    def __init__(self, kind: str, n: int, workdir: Path) -> None:
        from statekit import Types
        from statekit.backends.timers import EVENT_TIMERS
        from statekit.testing.harness import KeyedOneInputStreamOperatorTestHarness

        self.kind, self.n, self.workdir = kind, n, workdir
        factory = make_backend_factory(kind, workdir)
        self.harness = KeyedOneInputStreamOperatorTestHarness(
            rearm_function(n), lambda value: value[0], Types.LONG(), max_parallelism=MAXP,
            backend=factory)
        # what n elements' registrations write, written directly (10^7 elements take minutes)
        self.load_s = fill(self.harness.backend.timer_queue(EVENT_TIMERS), n)
        self.harness.open()
        self.watermark = -1

    def advance(self, step: int) -> tuple[float, int]:
        harness = self.harness
        self.watermark += step
        t0 = time.perf_counter()
        harness.process_watermark(self.watermark)
        seconds = time.perf_counter() - t0
        fired = len(harness.output)
        harness.clear_output()
        return seconds, fired

    def close(self) -> None:
        self.harness.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def rearm_function(period: int) -> Any:
    """A function whose timer re-arms itself ``period`` later and counts its firings in state."""
    from statekit import KeyedProcessFunction, Types, ValueStateDescriptor

    class Rearm(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.fired = ctx.get_state(ValueStateDescriptor("fired", Types.LONG()))

        def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
            ctx.timer_service().register_event_time_timer(value[1])
            return ()

        def on_timer(self, timestamp: int, ctx: Any) -> Iterable[Any]:
            count = (self.fired.value() or 0) + 1
            self.fired.update(count)
            ctx.timer_service().register_event_time_timer(timestamp + period)
            yield ctx.get_current_key(), timestamp, count

    return Rearm()


class RawHeapCase:
    """A binary heap baseline: ``heapq`` over the ``(timestamp, sequence, key)`` tuples that
    ``HeapTimerQueue`` keeps in its sorted list, with nothing around them (what a binary heap of
    Python objects costs by itself as it outgrows the CPU caches)."""

    series = "heapq"

    def __init__(self, n: int) -> None:
        self.n = n
        self.heap = [(ts, key, key) for key, ts in enumerate(timestamps(n))]
        heapq.heapify(self.heap)
        self.watermark = -1

    def advance(self, step: int) -> tuple[float, int]:
        heap, pop = self.heap, heapq.heappop
        fired = []
        t0 = time.perf_counter()
        self.watermark += step
        while heap and heap[0][0] <= self.watermark:
            fired.append(pop(heap))
        seconds = time.perf_counter() - t0
        for ts, seq, key in fired:
            heapq.heappush(heap, (ts + self.n, seq, key))
        return seconds, len(fired)

    def close(self) -> None:
        self.heap = []


def interleaved_advances(cases: list[Any], step_of: Callable[[int], int], *, rounds: int,
                         warmup: int = 1) -> dict[str, dict[int, dict[str, Any]]]:
    """``rounds`` advances of every case, the cases in a rotating order within each round (the
    machine is shared: sizes compared round by round see the same load).  Per series (a case's
    ``series``) and size: the median seconds per advance and per fired timer, and the median of
    the per-round ratios of each size's time to the series' smallest size's."""
    times: dict[tuple[str, int], list[float]] = {(c.series, c.n): [] for c in cases}
    fired: dict[tuple[str, int], list[int]] = {(c.series, c.n): [] for c in cases}
    for r in range(warmup + rounds):
        shift = r % len(cases)
        for case in cases[shift:] + cases[:shift]:
            seconds, count = case.advance(step_of(case.n))
            if r >= warmup:
                times[case.series, case.n].append(seconds)
                fired[case.series, case.n].append(count)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for (series, n), ts in times.items():
        low = (series, min(m for s, m in times if s == series))
        per_timer = [s / max(c, 1) for s, c in zip(ts, fired[series, n], strict=True)]
        out.setdefault(series, {})[n] = {
            "advance_s": round(statistics.median(ts), 6),
            "fired_per_advance": round(statistics.median(fired[series, n])),
            "us_per_timer": round(statistics.median(per_timer) * 1e6, 3),
            "advance_ratio_to_smallest": round(statistics.median(
                [a / b for a, b in zip(ts, times[low], strict=True)]), 3),
            "per_timer_ratio_to_smallest": round(statistics.median(
                [(a / max(c, 1)) / (b / max(d, 1)) for a, c, b, d in
                 zip(ts, fired[series, n], times[low], fired[low], strict=True)]), 3),
            "rounds": len(ts),
        }
    return out
