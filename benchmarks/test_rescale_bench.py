"""``foreach_batch`` rescaling 4 -> 8 -> 3 partitions against restarts at the same size, both
backends (``benchmarks/rescale_driver.py``, one process per backend): per phase the micro-batch's
wall time and the bytes of checkpoint files the new partitions' restores read, against the state's
bytes.  Marked ``large`` and ``spark`` (in ``make bench``, not in ``make bench-quick``).

``STATEKIT_BENCH_RESCALE_KEYS`` sets the keys (default 1,000,000: 1 GiB of 1 KiB values; the
RocksDB case then takes several minutes).
Run: ``pytest benchmarks/test_rescale_bench.py -m large -s -o testpaths=benchmarks``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import loadavg, scratch_dir

KEYS = int(os.environ.get("STATEKIT_BENCH_RESCALE_KEYS") or 1_000_000)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.large
@pytest.mark.spark
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_rescale_4_8_3(benchmark: Any, backend: str) -> None:
    benchmark.group = "rescale"
    root = scratch_dir(f"rescale-{backend}")
    out: dict[str, Any] = {}

    def run() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.rescale_driver", "--root", str(root), "--keys",
             str(KEYS), "--touch", str(min(10_000, KEYS // 10)), "--backend", backend],
            cwd=ROOT, capture_output=True, text=True, timeout=5400, check=False,
            env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"})
        assert done.returncode == 0, done.stderr[-3000:]
        out.update(json.loads(done.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    out["loadavg"] = loadavg()
    benchmark.extra_info.update(out)
    print(f"\nrescale {backend}: {json.dumps(out)}")
    assert all(p["rescaled"] == (p["phase"] == "rescale") for p in out["phases"])
