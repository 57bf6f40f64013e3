"""State access matrix on the RocksDB backend, each op next to raw ``rocksdict`` (raw mode, same run).

Run: ``pytest benchmarks/test_state_access_rocksdb.py`` (``STATEKIT_BENCH_QUICK=1`` for small sizes).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks._common import STRICT, TARGETS, interleaved, loadavg, scratch_dir
from benchmarks._state_access import (
    BULK_OPERATIONS,
    KEYS,
    OPERATIONS,
    OPS,
    ROUNDS,
    Env,
    rocksdb_env,
    rocksdb_op,
    run_bulk_vs_per_key,
)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    workdir = scratch_dir("access-rocksdb")
    e = rocksdb_env(workdir)
    yield e
    for fn in e.cleanup:
        fn()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("op", OPERATIONS)
def test_rocksdb_state_access(benchmark: Any, env: Env, op: str) -> None:
    benchmark.group = f"state-access-{op}"
    target, baselines = rocksdb_op(env, op)
    figures = interleaved(benchmark, target, baselines, ops=OPS["rocksdb"], rounds=ROUNDS)
    figures.update({"backend": "rocksdb", "op": op, "keys": KEYS, "loadavg": loadavg(), **env.setup_s})
    benchmark.extra_info.update(figures)
    print(f"\nrocksdb {op}: {figures}")
    if STRICT and op in ("value_get", "value_update"):
        assert figures["ratio_vs_raw"] >= TARGETS["rocksdb"]


@pytest.mark.parametrize("op", BULK_OPERATIONS)
def test_rocksdb_bulk_vs_per_key(benchmark: Any, env: Env, op: str) -> None:
    """Bulk list and map access against the same work key by key."""
    run_bulk_vs_per_key(benchmark, env, "rocksdb", op)
