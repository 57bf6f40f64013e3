"""RocksDB incremental checkpoints in a steady state: LEVEL, UNIVERSAL and changelog checkpoints.

One ValueState of 1 KiB values at 0.1, 1 and 10 GiB; per size, LEVEL, UNIVERSAL and CHANGELOG
(LEVEL with ``state.changelog.enabled``) run one after the other in the same test, each in its
own process (``benchmarks/compaction_driver.py``): the full
checkpoint, what the build's own compactions add to the next one, then a hundred rounds of 1 %
of the keys changed and an incremental checkpoint each (``STATEKIT_BENCH_COMPACTION_ROUNDS``;
a dozen rounds mislead: UNIVERSAL's merges grow round by round until one rewrites everything).
Reported: each round's checkpoint against the full one (mean, largest, how many rounds exceed
10 %), the database's size on disk against the state, random point reads per second, the
seconds the round's writes took, a restore of the last checkpoint; each against LEVEL.  Marked
``large``; the 10 GiB size takes about 30 minutes here.

Run: ``pytest benchmarks/test_rocksdb_compaction.py -m large -s -o testpaths=benchmarks``
(``-k 1000000-`` for one size).
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

from benchmarks._common import loadavg, scratch_dir

ROUNDS = int(os.environ.get("STATEKIT_BENCH_COMPACTION_ROUNDS", "100"))
SIZES = [100_000, 1_000_000, 10_000_000]
ROOT = Path(__file__).resolve().parents[1]


def _style(style: str, keys: int, root: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.compaction_driver", style, str(keys), str(ROUNDS),
         str(root)], cwd=ROOT, capture_output=True, text=True, timeout=3600,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'src'}"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.large
@pytest.mark.parametrize("keys", SIZES, ids=[f"{k}-" for k in SIZES])
def test_incremental_checkpoints_by_compaction_style(benchmark: Any, keys: int) -> None:
    benchmark.group = "rocksdb-compaction"
    styles: dict[str, Any] = {}

    def both() -> None:
        for style in ("LEVEL", "UNIVERSAL", "CHANGELOG"):
            root = scratch_dir(f"compaction-{style.lower()}-{keys}")
            try:
                styles[style] = _style(style, keys, root)
            finally:
                shutil.rmtree(root, ignore_errors=True)

    benchmark.pedantic(both, rounds=1, iterations=1)
    level, universal, changelog = styles["LEVEL"], styles["UNIVERSAL"], styles["CHANGELOG"]
    figures = {
        "keys": keys, "state_gib": round(keys * 1024 / 2**30, 3), "rounds": ROUNDS,
        "level": level, "universal": universal, "changelog": changelog, "loadavg": loadavg(),
        "ratios": {
            "level_mean_share": level["mean_share"], "level_max_share": level["max_share"],
            "level_rounds_over_10pct": sum(s > 0.1 for s in level["round_shares"]),
            "universal_mean_share": universal["mean_share"],
            "universal_max_share": universal["max_share"],
            "universal_rounds_over_10pct": sum(s > 0.1 for s in universal["round_shares"]),
            "universal_vs_level_reads": round(universal["reads_per_s"] / level["reads_per_s"], 3),
            "universal_vs_level_disk": round(universal["db_bytes_vs_full"]
                                             / level["db_bytes_vs_full"], 3),
            "changelog_mean_share": changelog["mean_share"],
            "changelog_max_share": changelog["max_share"],
            "changelog_rounds_over_10pct": sum(s > 0.1 for s in changelog["round_shares"]),
            "changelog_materializations": changelog["materializations"],
            "changelog_vs_level_writes": round(changelog["write_s"] / level["write_s"], 3),
            "changelog_vs_level_restore": round(changelog["restore_s"] / level["restore_s"], 3),
            "changelog_vs_level_reads": round(changelog["reads_per_s"] / level["reads_per_s"], 3),
        },
    }
    benchmark.extra_info.update(figures)
    print(f"\ncompaction {keys}: {json.dumps(figures['ratios'])}")
    print(json.dumps(figures))
