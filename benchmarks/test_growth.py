"""Growth curves: one ValueState of 1 KiB values at 0.1, 1 and 10 GiB (RocksDB, within a 1 GiB
memory budget) and 0.1 and 1 GiB (heap: what memory allows next to other sessions).

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

VALUE_BYTES = 1024
CASES = [("rocksdb", 100_000), ("rocksdb", 1_000_000), ("rocksdb", 10_000_000),
         ("heap", 100_000), ("heap", 1_000_000)]
ROOT = Path(__file__).resolve().parents[1]


def _phase(phase: str, kind: str, keys: int, root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.growth_driver", phase, kind, str(keys),
         str(VALUE_BYTES), str(root)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.large
@pytest.mark.parametrize(("kind", "keys"), CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_growth(benchmark: Any, kind: str, keys: int) -> None:
    benchmark.group = "growth"
    root = scratch_dir(f"growth-{kind}-{keys}")
    try:
        disk = raw_disk_throughput(root / "disk", min(keys * VALUE_BYTES, 2048 * MIB))
        built: dict[str, Any] = {}
        benchmark.pedantic(lambda: built.update(_phase("build", kind, keys, root)), rounds=1,
                           iterations=1)
        drop_tree_cache(root / "checkpoints")
        restored = _phase("restore", kind, keys, root)
        state_bytes = built["full"]["bytes"]
        figures = {
            "backend": kind, "keys": keys, "state_gib": round(keys * VALUE_BYTES / 2**30, 3),
            "build": built, "restore": restored, "disk": disk, "loadavg": loadavg(),
            "ratios": {
                "full_checkpoint_vs_disk_write": round(
                    built["full"]["write_mb_s"] / disk["write_mb_s"], 3),
                "incremental_vs_full_bytes": built["incremental"]["share_of_full"],
                "restart_to_first_element_vs_disk_read": round(
                    state_bytes / restored["restart_to_first_element_s"] / 1e6
                    / disk["read_mb_s"], 3),
                "peak_rss_build_mb": built["peak_rss_mb"],
                "peak_rss_restore_mb": restored["peak_rss_mb"],
            },
        }
        benchmark.extra_info.update(figures)
        print(f"\ngrowth {kind} {keys}: {json.dumps(figures)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
