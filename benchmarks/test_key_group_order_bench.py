"""What writing a heap snapshot by key group costs (``state.backend.heap.snapshot-key-group-order``).

One task holding half of the key groups (as a partition of a job at parallelism 2 does) takes a
full checkpoint with its parts by key group and one in table order, alternating over rounds, on
the same state and the same disk; the figure is the median of the per-round time ratios (by key
group / table order).  One ValueState of random ``value_bytes`` bytes per key.  What the order buys
is measured by ``benchmarks/test_rescale_bench.py`` (bytes a rescale reads).

Full mode: 1M keys; ``STATEKIT_BENCH_QUICK=1``: 100k.
Run: ``pytest benchmarks/test_key_group_order_bench.py -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import QUICK
from statekit import FileSystemCheckpointStorage, HashMapStateBackend, Types, ValueStateDescriptor
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.keys import plain_key_groups
from statekit.serde.types import serializer_for

N = 100_000 if QUICK else 1_000_000
MAXP = 128
HALF = KeyGroupRange(0, MAXP // 2 - 1)
ROUNDS = 3
STATE = ValueStateDescriptor("v", Types.PRIMITIVE_ARRAY(Types.BYTE()))


def _filled(order: str, keys: list[int], value_bytes: int) -> Any:
    backend = HashMapStateBackend(False, key_group_order=order).create_keyed_state_backend(
        key_serializer=serializer_for(Types.LONG()), key_group_range=HALF, max_parallelism=MAXP)
    backend.get_partitioned_state(STATE)
    backend.tables["v"].data.update((k, os.urandom(value_bytes)) for k in keys)
    return backend


@pytest.mark.parametrize("value_bytes", [100, 1024])
def test_key_group_order_cost(benchmark: Any, tmp_path: Path, value_bytes: int) -> None:
    benchmark.group = "key-group-order"
    candidates = list(range(2 * N))
    groups = plain_key_groups(candidates, MAXP)
    keys = [k for k, g in zip(candidates, groups.tolist(), strict=True) if g <= HALF.end][:N]
    backends = {order: _filled(order, keys, value_bytes) for order in ("true", "false")}
    times: dict[str, list[float]] = {"true": [], "false": []}
    sizes: dict[str, int] = {}

    def rounds() -> None:
        for n in range(ROUNDS):
            for order, backend in backends.items():
                root = tmp_path / f"{order}-{n}"
                access = FileSystemCheckpointStorage(str(root)).create_access("bench")
                streams = access.streams(1, "t")
                start = time.perf_counter()
                handle = backend.snapshot(1, streams).run()
                times[order].append(time.perf_counter() - start)
                sizes[order] = streams.bytes_written
                assert {len(e["groups"]) for e in handle["states"].values()}
                shutil.rmtree(root)

    benchmark.pedantic(rounds, rounds=1, iterations=1)
    for backend in backends.values():
        backend.dispose()
    ratio = statistics.median(a / b for a, b in zip(times["true"], times["false"], strict=True))
    out = {"keys": len(keys), "value_bytes": value_bytes, "rounds": ROUNDS,
           "by_key_group_s": [round(t, 4) for t in times["true"]],
           "table_order_s": [round(t, 4) for t in times["false"]],
           "bytes": sizes, "time_ratio_median": round(ratio, 3)}
    benchmark.extra_info.update(out)
    print(f"\nkey-group order, {len(keys)} keys x {value_bytes} B: {out}")
    assert abs(sizes["true"] - sizes["false"]) <= 0.01 * sizes["false"]
