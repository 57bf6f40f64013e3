"""Window aggregation on the local runner against a raw-Python implementation of the same
algorithm, in the same run, interleaved round by round.

The workload: ``N`` events over 10^4 keys, ten per millisecond of event time, up to 200 ms out
of order, a watermark 200 ms behind the largest timestamp seen (emitted after every element, as
the runner does); a sum per window by ``reduce``.  Tumbling windows of 10 s (about ten events per
key and window) and event-time sessions with a 1.5 s gap (about four events per session).

The baseline is the same algorithm in plain Python with nothing in between: one dict of running
sums per (key, window), a ``heapq`` of window ends as timers, the watermark after every element,
sessions merged by the same rule (windows that touch merge), late elements dropped.  The runner
adds what a job is: routing by key group, the keyed backend (window contents under the window
as namespace, the merging window set, the timer index, the timer queues), the trigger and the
window function.  Both produce the same windows (checked).

The figure is ``throughput(runner) / throughput(raw)`` per backend and window kind, the median of
the rounds; beside it ``floor_ratio``, the same for a job over the same events whose keyed function
does nothing (routing, event time and the job loop alone: the most any window operator on the
local runner could reach); and on RocksDB ``rocksdb_ceiling_ratio``, the same for the baseline's
algorithm with its windows in a raw rocksdict instead of a dict (msgpack keys and values, nothing
a backend adds: the most any job keeping its windows in RocksDB could reach), for tumbling windows
also batched (``rocksdb_batched_ceiling_ratio``: one multi-get and one write batch per 4,096
events);
``STATEKIT_BENCH_STRICT=1`` asserts the target (0.3).  ``N`` is 10^6 on the heap
backend and 10^5 on RocksDB (10^6 there takes minutes per round); ``STATEKIT_BENCH_QUICK=1``
uses 10^5 and 2 * 10^4.  Run: ``pytest benchmarks/test_window_bench.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import heapq
import random
import shutil
import statistics
import time
from itertools import islice
from typing import Any

import pytest

from benchmarks._common import QUICK, STRICT, loadavg, scratch_dir

KEYS = 10_000
SIZE_MS = 10_000
GAP_MS = 1_500
DELAY_MS = 200
TARGET = 0.30
SIZES = {"hashmap": 100_000 if QUICK else 1_000_000, "rocksdb": 20_000 if QUICK else 100_000}
ROUNDS = 2 if QUICK else 3
MIN_TS = -(2**63)


def workload(n: int, seed: int = 7) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    return [(rng.randrange(KEYS), max(0, i // 10 - rng.randrange(DELAY_MS)), rng.randint(1, 9))
            for i in range(n)]


def reduce_sum(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return (a[0], a[1], a[2] + b[2])


# --- the baseline: the same algorithm in plain Python -----------------------------------------------


def raw_tumbling(events: list[tuple[int, int, int]]) -> list[Any]:
    contents: dict[tuple[int, int], Any] = {}
    timers: list[tuple[int, int, int]] = []
    out: list[Any] = []
    watermark = largest = MIN_TS
    for event in events:
        key, ts, _ = event
        start = ts - ts % SIZE_MS
        if start + SIZE_MS - 1 > watermark:  # else: late, dropped
            window = (key, start)
            acc = contents.get(window)
            if acc is None:
                contents[window] = event
                heapq.heappush(timers, (start + SIZE_MS - 1, key, start))
            else:
                contents[window] = reduce_sum(acc, event)
        if ts > largest:
            largest = ts
            if largest - DELAY_MS - 1 > watermark:
                watermark = largest - DELAY_MS - 1
                while timers and timers[0][0] <= watermark:
                    _, k, s = heapq.heappop(timers)
                    out.append(contents.pop((k, s)))
    while timers:
        _, k, s = heapq.heappop(timers)
        out.append(contents.pop((k, s)))
    return out


def _merged(open_: dict[tuple[int, int], Any], event: tuple[int, int, int], start: int,
            end: int) -> tuple[Any, int, int]:
    """``event``'s session [start, end) merged with the key's open sessions it touches (taken out
    of ``open_``): the merged sum, start and end."""
    acc: Any = event
    for s, e in [w for w in open_ if w[0] <= end and w[1] >= start]:
        acc = reduce_sum(open_.pop((s, e)), acc)
        start, end = min(start, s), max(end, e)
    return acc, start, end


def raw_sessions(events: list[tuple[int, int, int]]) -> list[Any]:
    sessions: dict[int, dict[tuple[int, int], Any]] = {}  # key -> (start, end) -> sum
    timers: list[tuple[int, int, int, int]] = []
    out: list[Any] = []
    watermark = largest = MIN_TS

    def fire(limit: int) -> None:
        while timers and timers[0][0] <= limit:
            _, k, s, e = heapq.heappop(timers)
            open_ = sessions.get(k)
            if open_ is not None and (s, e) in open_:  # else merged away meanwhile
                out.append(open_.pop((s, e)))

    for event in events:
        key, ts, _ = event
        open_ = sessions.setdefault(key, {})
        acc, start, end = _merged(open_, event, ts, ts + GAP_MS)
        if end - 1 > watermark:
            open_[(start, end)] = acc
            heapq.heappush(timers, (end - 1, key, start, end))
        if ts > largest:
            largest = ts
            if largest - DELAY_MS - 1 > watermark:
                watermark = largest - DELAY_MS - 1
                fire(watermark)
    fire(2**63 - 1)
    return out


# --- the ceiling of state in RocksDB: the same algorithm on a raw rocksdict -------------------------


def _watermarked(events: list[tuple[int, int, int]]) -> Any:
    """Each event with the watermark it meets and the watermark after it if that moved (else
    None): the baseline's rule, for the rocksdict versions."""
    watermark = largest = MIN_TS
    for event in events:
        before, ts = watermark, event[1]
        if ts > largest:
            largest = ts
            if largest - DELAY_MS - 1 > watermark:
                watermark = largest - DELAY_MS - 1
        yield event, before, (watermark if watermark != before else None)


def _driven(db: Any, events: list[tuple[int, int, int]], step: Any, fire: Any) -> None:
    """``step(event, watermark)`` for every event, ``fire(watermark)`` whenever the watermark
    moves and for everything at the end; ``db`` closed afterwards."""
    try:
        for event, watermark, moved in _watermarked(events):
            step(event, watermark)
            if moved is not None:
                fire(moved)
        fire(2**63 - 1)
    finally:
        db.close()


def _rdict(path: Any) -> Any:
    from rocksdict import Options, Rdict

    return Rdict(str(path), Options(raw_mode=True))


def _tumbling_firing(db: Any, timers: list[tuple[int, int, int]], out: list[Any]) -> Any:
    """``fire(limit)``: every tumbling window due at ``limit`` out of ``db`` into ``out``."""
    import msgpack

    pack, unpack = msgpack.packb, msgpack.unpackb

    def fire(limit: int) -> None:
        while timers and timers[0][0] <= limit:
            _, k, s = heapq.heappop(timers)
            name = pack((k, s))
            out.append(tuple(unpack(db[name])))
            del db[name]

    return fire


def raw_tumbling_rocksdict(events: list[tuple[int, int, int]], path: Any) -> list[Any]:
    """``raw_tumbling`` with each window's sum in a raw rocksdict (msgpack keys and values)
    instead of a dict: nothing a backend adds, so no job that keeps its windows in RocksDB can be
    faster."""
    import msgpack

    pack, unpack, db = msgpack.packb, msgpack.unpackb, _rdict(path)
    timers: list[tuple[int, int, int]] = []
    out: list[Any] = []

    def step(event: tuple[int, int, int], watermark: int) -> None:
        key, ts, _ = event
        start = ts - ts % SIZE_MS
        if start + SIZE_MS - 1 > watermark:
            kb = pack((key, start))
            acc = db.get(kb)
            if acc is None:
                db[kb] = pack(event)
                heapq.heappush(timers, (start + SIZE_MS - 1, key, start))
            else:
                db[kb] = pack(reduce_sum(tuple(unpack(acc)), event))

    _driven(db, events, step, _tumbling_firing(db, timers, out))
    return out


def raw_tumbling_rocksdict_batched(events: list[tuple[int, int, int]], path: Any,
                                   batch: int = 4096) -> list[Any]:
    """``raw_tumbling_rocksdict`` at RocksDB's best: per ``batch`` events, one sum per window in
    a dict, one multi-get of the stored sums and one ``WriteBatch`` (lateness still judged per
    element; windows fire at the batch's end, so they come out later but the same)."""
    import msgpack
    from rocksdict import WriteBatch

    pack, unpack, db = msgpack.packb, msgpack.unpackb, _rdict(path)
    timers: list[tuple[int, int, int]] = []
    out: list[Any] = []
    fire = _tumbling_firing(db, timers, out)
    timed = _watermarked(events)
    try:
        while chunk := list(islice(timed, batch)):
            sums: dict[tuple[int, int], Any] = {}
            for event, watermark, _ in chunk:
                key, ts, _ = event
                start = ts - ts % SIZE_MS
                if start + SIZE_MS - 1 > watermark:
                    acc = sums.get((key, start))
                    sums[(key, start)] = event if acc is None else reduce_sum(acc, event)
            windows = list(sums)
            names = [pack(w) for w in windows]
            writes = WriteBatch(raw_mode=True)
            for (key, start), name, stored in zip(windows, names, db[names], strict=True):
                acc = sums[(key, start)]
                if stored is None:
                    heapq.heappush(timers, (start + SIZE_MS - 1, key, start))
                else:
                    acc = reduce_sum(tuple(unpack(stored)), acc)
                writes.put(name, pack(acc))
            db.write(writes)
            _, before, after = chunk[-1]
            fire(before if after is None else after)
        fire(2**63 - 1)
    finally:
        db.close()
    return out


def raw_sessions_rocksdict(events: list[tuple[int, int, int]], path: Any) -> list[Any]:
    """``raw_sessions`` with each key's open sessions in a raw rocksdict (one msgpack list per
    key)."""
    import msgpack

    pack, unpack, db = msgpack.packb, msgpack.unpackb, _rdict(path)
    timers: list[tuple[int, int, int, int]] = []
    out: list[Any] = []

    def fire(limit: int) -> None:
        while timers and timers[0][0] <= limit:
            _, k, s, e = heapq.heappop(timers)
            kb = pack(k)
            stored = db.get(kb)
            open_ = {(a, b): tuple(acc) for a, b, acc in unpack(stored)} if stored else {}
            if (s, e) in open_:  # else merged away meanwhile
                out.append(open_.pop((s, e)))
                db[kb] = pack([[a, b, acc] for (a, b), acc in open_.items()])

    def step(event: tuple[int, int, int], watermark: int) -> None:
        key, ts, _ = event
        kb = pack(key)
        stored = db.get(kb)
        open_ = {(a, b): tuple(acc) for a, b, acc in unpack(stored)} if stored else {}
        acc, start, end = _merged(open_, event, ts, ts + GAP_MS)
        if end - 1 > watermark:
            open_[(start, end)] = acc
            heapq.heappush(timers, (end - 1, key, start, end))
        db[kb] = pack([[a, b, v] for (a, b), v in open_.items()])

    _driven(db, events, step, fire)
    return out


# --- the runner --------------------------------------------------------------------------------------


def runner(events: list[tuple[int, int, int]], backend: str, kind: str, directory: Any) -> list[Any]:
    from statekit import StreamExecutionEnvironment, Types
    from statekit.durations import Duration
    from statekit.runtime.watermarks import WatermarkStrategy
    from statekit.runtime.windows import EventTimeSessionWindows, TumblingEventTimeWindows

    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend, "state.checkpoints.dir": str(directory / "chk"),
        "parallelism.default": 1})
    strategy = (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(DELAY_MS))
                .with_timestamp_assigner(lambda event, record_timestamp: event[1]))
    assigner = (TumblingEventTimeWindows.of(SIZE_MS) if kind == "tumbling"
                else EventTimeSessionWindows.with_gap(GAP_MS))
    return list(env.from_collection(events).assign_timestamps_and_watermarks(strategy)
                .key_by(lambda event: event[0]).window(assigner)
                .reduce(reduce_sum, output_type=Types.TUPLE([Types.LONG()] * 3))
                .execute_and_collect("window bench"))


def runner_floor(events: list[tuple[int, int, int]], backend: str, directory: Any) -> None:
    """The same job with a keyed function that does nothing: what routing, event time and the
    job loop cost by themselves (the most a window operator could reach)."""
    from statekit import KeyedProcessFunction, StreamExecutionEnvironment
    from statekit.durations import Duration
    from statekit.runtime.watermarks import WatermarkStrategy

    class Nothing(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            return ()

    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend, "state.checkpoints.dir": str(directory / "chk"),
        "parallelism.default": 1})
    strategy = (WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(DELAY_MS))
                .with_timestamp_assigner(lambda event, record_timestamp: event[1]))
    env.from_collection(events).assign_timestamps_and_watermarks(strategy).key_by(
        lambda event: event[0]).process(Nothing()).execute_and_collect("window bench floor")


def _sums(out: list[Any]) -> list[tuple[int, int]]:
    return sorted((key, total) for key, _, total in out)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("kind", ["tumbling", "session"])
def test_window_aggregation(benchmark: Any, backend: str, kind: str) -> None:
    benchmark.group = f"windows-{kind}"
    n = SIZES[backend]
    events = workload(n)
    raw = raw_tumbling if kind == "tumbling" else raw_sessions
    raw_rocksdict = raw_tumbling_rocksdict if kind == "tumbling" else raw_sessions_rocksdict
    root = scratch_dir(f"windows-{backend}-{kind}")
    rows: list[dict[str, float]] = []
    try:
        def one_round() -> None:
            t0 = time.perf_counter()
            expected = raw(events)
            raw_s = time.perf_counter() - t0
            directory = root / f"r{len(rows)}"
            t0 = time.perf_counter()
            got = runner(events, backend, kind, directory)
            runner_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            runner_floor(events, backend, directory / "floor")
            floor_s = time.perf_counter() - t0
            row = {"raw_s": raw_s, "runner_s": runner_s, "floor_s": floor_s, "windows": len(got)}
            if backend == "rocksdb":
                t0 = time.perf_counter()
                in_rocksdb = raw_rocksdict(events, directory / "raw-rocksdict")
                row["raw_rocksdict_s"] = time.perf_counter() - t0
                assert _sums(in_rocksdb) == _sums(expected)
                if kind == "tumbling":
                    t0 = time.perf_counter()
                    batched = raw_tumbling_rocksdict_batched(events, directory / "raw-batched")
                    row["raw_rocksdict_batched_s"] = time.perf_counter() - t0
                    assert _sums(batched) == _sums(expected)
            shutil.rmtree(directory, ignore_errors=True)
            assert _sums(got) == _sums(expected)  # the same windows, the same sums
            rows.append(row)

        benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
        ratios = [r["raw_s"] / r["runner_s"] for r in rows]
        figures = {
            "backend": backend, "kind": kind, "events": n, "keys": KEYS,
            "windows": int(rows[0]["windows"]),
            "raw_events_per_s": round(n / statistics.median(r["raw_s"] for r in rows)),
            "runner_events_per_s": round(n / statistics.median(r["runner_s"] for r in rows)),
            "ratio": round(statistics.median(ratios), 4),
            # a job whose keyed function does nothing, against the same raw run: the ceiling
            "floor_ratio": round(statistics.median(r["raw_s"] / r["floor_s"] for r in rows), 4),
            "all_ratios": [round(x, 4) for x in ratios], "target": TARGET, "loadavg": loadavg(),
        }
        if backend == "rocksdb":  # the most any job keeping its windows in RocksDB could reach
            figures["rocksdb_ceiling_ratio"] = round(
                statistics.median(r["raw_s"] / r["raw_rocksdict_s"] for r in rows), 4)
            if kind == "tumbling":
                figures["rocksdb_batched_ceiling_ratio"] = round(
                    statistics.median(r["raw_s"] / r["raw_rocksdict_batched_s"] for r in rows), 4)
        benchmark.extra_info.update(figures)
        print(f"\nwindow aggregation {backend} {kind}:", figures)
        if STRICT:
            assert figures["ratio"] >= TARGET
    finally:
        shutil.rmtree(root, ignore_errors=True)
