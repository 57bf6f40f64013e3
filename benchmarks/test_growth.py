"""Growth curves: one ValueState of 1 KiB values at 0.1, 1 and 10 GiB (RocksDB within a 1 GiB
memory budget; the heap at 10 GiB only where about 16 GiB of memory are free); and the heap with
small values (100 B) at 10^5, 10^6 and 10^7 keys, where the per-key costs dominate.

Per size and backend, each phase in its own process (``benchmarks/growth_driver.py``): build,
full checkpoint, 1 % of the keys changed and an incremental checkpoint, then a cold restart
(page cache of the checkpoint dropped) -> first element; peak RSS of each phase; the disk's
sequential write and cold read measured in the same test.  Marked ``large`` (in ``make bench``,
not in ``make bench-quick``); the 10 GiB case alone takes about 10 minutes here.

Run: ``pytest benchmarks/test_growth.py -m large -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import MIB, drop_tree_cache, loadavg, raw_disk_throughput, scratch_dir

VALUE_BYTES, SMALL_VALUE_BYTES = 1024, 100
CASES = [("rocksdb", 100_000, VALUE_BYTES), ("rocksdb", 1_000_000, VALUE_BYTES),
         ("rocksdb", 10_000_000, VALUE_BYTES), ("heap", 100_000, VALUE_BYTES),
         ("heap", 1_000_000, VALUE_BYTES), ("heap", 10_000_000, VALUE_BYTES),
         ("heap", 100_000, SMALL_VALUE_BYTES), ("heap", 1_000_000, SMALL_VALUE_BYTES),
         ("heap", 10_000_000, SMALL_VALUE_BYTES)]
#: a heap case runs only where its state fits in memory this many times over (Python objects)
HEAP_MEMORY_FACTOR = 1.6


def _available_bytes() -> int:
    """MemAvailable (Linux), else unknown (0: a big heap case is skipped)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
ROOT = Path(__file__).resolve().parents[1]


def _phase(phase: str, kind: str, keys: int, value_bytes: int, root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.growth_driver", phase, kind, str(keys),
         str(value_bytes), str(root)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.large
@pytest.mark.parametrize(("kind", "keys", "value_bytes"), CASES,
                         ids=[f"{k}-{n}" + ("" if b == VALUE_BYTES else f"x{b}") for k, n, b in CASES])
def test_growth(benchmark: Any, kind: str, keys: int, value_bytes: int) -> None:
    benchmark.group = "growth"
    needed = keys * value_bytes * HEAP_MEMORY_FACTOR
    if kind == "heap" and needed > 2**30 and _available_bytes() < needed:
        pytest.skip(f"the heap case needs about {needed / 2**30:.0f} GiB of free memory")
    root = scratch_dir(f"growth-{kind}-{keys}x{value_bytes}")
    try:
        disk = raw_disk_throughput(root / "disk", min(keys * value_bytes, 2048 * MIB))
        built: dict[str, Any] = {}
        benchmark.pedantic(lambda: built.update(_phase("build", kind, keys, value_bytes, root)),
                           rounds=1, iterations=1)
        drop_tree_cache(root / "checkpoints")
        restored = _phase("restore", kind, keys, value_bytes, root)
        floor = (_phase("floor", kind, keys, value_bytes, root)  # the heap small-value targets' baseline
                 if kind == "heap" and value_bytes == SMALL_VALUE_BYTES else None)
        state_bytes = built["full"]["bytes"]
        figures = {
            "backend": kind, "keys": keys, "value_bytes": value_bytes,
            "state_gib": round(keys * value_bytes / 2**30, 3),
            "build": built, "restore": restored, "disk": disk, "loadavg": loadavg(),
            "ratios": {
                "full_checkpoint_vs_disk_write": round(
                    built["full"]["write_mb_s"] / disk["write_mb_s"], 3),
                "incremental_vs_full_bytes": built["incremental"]["share_of_full"],
                # times: the restart's first element against the disk's cold read of the state
                "restart_to_first_element_s_vs_cold_read_s": round(
                    restored["restart_to_first_element_s"] * disk["read_mb_s"] * 1e6
                    / state_bytes, 4),
                "peak_rss_build_mb": built["peak_rss_mb"],
                "peak_rss_restore_mb": restored["peak_rss_mb"],
                "peak_rss_restore_vs_state": round(restored["peak_rss_mb"] * 2**20 / state_bytes, 3),
                # speeds: bytes restored per second against the disk's cold read
                "restore_all_vs_disk_read": round(
                    state_bytes / restored["restore_all_s"] / 1e6 / disk["read_mb_s"], 3),
            },
        }
        if floor is not None:  # the baseline of any heap state held as Python objects
            figures["floor"] = floor
            figures["ratios"].update({
                "dict_peak_rss_vs_state": round(floor["dict_peak_rss_mb"] * 2**20 / state_bytes, 3),
                "key_index_s_vs_cold_read_s": round(
                    floor["key_index_s"] * disk["read_mb_s"] * 1e6 / state_bytes, 3),
            })
        benchmark.extra_info.update(figures)
        print(f"\ngrowth {kind} {keys} x {value_bytes} B: {json.dumps(figures)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
