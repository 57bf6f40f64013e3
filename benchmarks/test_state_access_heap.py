"""State access matrix on the heap backend, each op next to a raw ``dict`` baseline (same run).

Run: ``pytest benchmarks/test_state_access_heap.py`` (``STATEKIT_BENCH_QUICK=1`` for small sizes).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks._common import STRICT, TARGETS, interleaved, loadavg
from benchmarks._state_access import (
    BULK_OPERATIONS,
    KEYS,
    OPERATIONS,
    OPS,
    ROUNDS,
    Env,
    heap_env,
    heap_op,
    run_bulk_vs_per_key,
)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    e = heap_env()
    yield e
    for fn in e.cleanup:
        fn()


@pytest.mark.parametrize("op", OPERATIONS)
def test_heap_state_access(benchmark: Any, env: Env, op: str) -> None:
    benchmark.group = f"state-access-{op}"
    target, baselines = heap_op(env, op)
    figures = interleaved(benchmark, target, baselines, ops=OPS["heap"], rounds=ROUNDS)
    figures.update({"backend": "heap", "op": op, "keys": KEYS, "loadavg": loadavg(), **env.setup_s})
    benchmark.extra_info.update(figures)
    print(f"\nheap {op}: {figures}")
    if STRICT and op in ("value_get", "value_update"):
        assert figures["ratio_vs_raw"] >= TARGETS["heap"]


@pytest.mark.parametrize("op", BULK_OPERATIONS)
def test_heap_bulk_vs_per_key(benchmark: Any, env: Env, op: str) -> None:
    """Bulk list and map access against the same work key by key."""
    run_bulk_vs_per_key(benchmark, env, "heap", op)
