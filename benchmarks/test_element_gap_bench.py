"""The pause a processing thread feels while asynchronous heap checkpoints run: the longest gap
between two consecutive elements through the local runner.

One job per configuration, the same input: every key once (the state is filled), every key again
(keys first written while a snapshot was pending are folded into the table), then every key a
third time, measured.  The keyed function reads and writes a ValueState of longs and records each
gap above 1 ms between two elements of the measured pass.  Configurations, in one run: no
checkpoints (the floor), asynchronous heap snapshots (``thread`` mode, the default) and synchronous
ones, checkpoints every 700 ms (the synchronous run every 700 ms per million keys).  Bar: the
asynchronous job's longest gap <= 5 ms, CPython's GIL switch interval, or <= 2x the floor,
whichever is larger; async / sync <= 0.05.

``STATEKIT_BENCH_GAP_KEYS`` sets the keys (default 1M; 100k with ``STATEKIT_BENCH_QUICK=1``;
10M for the large row).  Full mode asserts the bars only with ``STATEKIT_BENCH_STRICT=1``.
Run: ``pytest benchmarks/test_element_gap_bench.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from typing import Any

from benchmarks._common import QUICK, STRICT, loadavg, scratch_dir

N = int(os.environ.get("STATEKIT_BENCH_GAP_KEYS") or (100_000 if QUICK else 1_000_000))
PASSES = 3
INTERVAL = "700 ms"
SENTINEL = -1


def _gap_function() -> Any:
    from statekit import KeyedProcessFunction, Types, ValueStateDescriptor

    class Gaps(KeyedProcessFunction):
        """Counts per key; from the measured pass on, keeps every gap above 1 ms between two
        elements, and hands them out when the sentinel arrives."""

        def open(self, runtime_context: Any) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
            self.seen = 0
            self.last = 0.0
            self.gaps: list[float] = []
            self.start = 0.0

        def process_element(self, value: Any, ctx: Any) -> Any:
            if value == SENTINEL:
                return [(time.perf_counter() - self.start, self.gaps)]
            self.count.update((self.count.value() or 0) + 1)
            now = time.perf_counter()
            self.seen += 1
            if self.seen > (PASSES - 1) * N + 1 and now - self.last > 0.001:
                self.gaps.append(now - self.last)
            elif self.seen == (PASSES - 1) * N + 1:
                self.start = now
            self.last = now
            return ()

    return Gaps()


def _run(mode: str, root: Any, elements: tuple[int, ...]) -> dict[str, Any]:
    from statekit import StreamExecutionEnvironment

    conf: dict[str, Any] = {"state.backend.type": "hashmap", "parallelism.default": 1,
                            "state.checkpoints.dir": str(root / mode)}
    if mode != "none":
        # a synchronous snapshot of 10M keys takes seconds: its run checkpoints every 700 ms per
        # million keys, or it would do little else (its longest gap is one snapshot either way)
        conf["execution.checkpointing.interval"] = (
            INTERVAL if mode == "async" else f"{700 * max(1, N // 1_000_000)} ms")
        conf["state.backend.async"] = mode == "async"
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    t0 = time.perf_counter()
    result = env.from_collection(elements).key_by(lambda e: e).process(_gap_function()) \
        .execute_and_collect(f"gap-{mode}")
    (measured_s, gaps), = list(result)
    done = [s for s in result.checkpoint_stats if s.status == "completed"]
    gaps.sort(reverse=True)
    return {"max_gap_ms": round(1000 * max(gaps, default=0.0), 2),
            "top_gaps_ms": [round(1000 * g, 2) for g in gaps[:5]],
            "gaps_over_5ms": sum(1 for g in gaps if g > 0.005),
            "gaps_over_1ms": len(gaps), "measured_pass_s": round(measured_s, 2),
            "job_s": round(time.perf_counter() - t0, 2), "checkpoints": len(done)}


def test_element_gap_during_checkpoints(benchmark: Any) -> None:
    benchmark.group = "element-gap"
    root = scratch_dir("element-gap")
    elements = (*range(N), *range(N), *range(N), SENTINEL)
    gc.collect()  # the input is old before any job starts (a young big container costs every job)
    rows: dict[str, dict[str, Any]] = {}
    try:
        def each() -> None:
            for mode in ("none", "async", "sync"):
                rows[mode] = _run(mode, root, elements)
                print(f"\nelement gap, {mode}: {rows[mode]}")

        benchmark.pedantic(each, rounds=1, iterations=1)
        floor = rows["none"]["max_gap_ms"]
        async_gap, sync_gap = rows["async"]["max_gap_ms"], rows["sync"]["max_gap_ms"]
        figures = {
            "keys": N, "interval": INTERVAL, **{f"{m}_{k}": v for m, r in rows.items() for k, v in r.items()},
            "async_vs_sync": round(async_gap / max(sync_gap, 1e-9), 4),
            "async_bar_ms": max(5.0, 2 * floor),
            "throughput_async_vs_none": round(rows["none"]["measured_pass_s"]
                                              / max(rows["async"]["measured_pass_s"], 1e-9), 3),
            "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nelement gap:", figures)
        assert rows["async"]["checkpoints"] >= 2 and rows["sync"]["checkpoints"] >= 2
        if STRICT:
            assert async_gap <= figures["async_bar_ms"] and figures["async_vs_sync"] <= 0.05
    finally:
        shutil.rmtree(root, ignore_errors=True)
