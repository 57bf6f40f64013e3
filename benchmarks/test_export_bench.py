"""Exporting a 1 GiB state to Parquet (``statekit state export``): throughput against the disk's
own sequential write throughput measured in the same test, and the export process's peak RSS.

The checkpoint (one heap value state, 10^6 keys x 1100 random bytes, >= 1 GiB) is written by a
separate process; the export runs as the real command in its own process, from a cold page cache,
its output fsynced (as the raw disk probe's files are), and ``wait4`` reports its peak RSS.
The export is started by a small intermediate process, which reports that figure: Linux carries
the peak RSS of the process that spawned a program into the program's own (the benchmark process,
holding gigabytes after the checkpoint benchmarks, would be counted otherwise).
Marked ``large`` (minutes): ``make bench`` runs it, ``make bench-quick`` leaves it out (run with
``-m large`` in quick mode it exports 64 MiB instead).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import (
    MIB,
    QUICK,
    best_disk,
    drop_tree_cache,
    loadavg,
    raw_disk_throughput,
    scratch_dir,
)

pytestmark = pytest.mark.large

KEYS, VALUE_BYTES = (60_000, 1100) if QUICK else (1_000_000, 1100)
REPO = Path(__file__).resolve().parents[1]


#: run as ``python -c``: starts argv[2:], waits for it with ``wait4``, writes its exit code, wall
#: seconds and peak RSS (KiB) as JSON to argv[1]; its own small RSS is all the export inherits
_MEASURE = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as fh:
    json.dump({"code": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - t0,
               "maxrss_kib": usage.ru_maxrss}, fh)
"""


def _export(job: Path, out: Path) -> dict[str, Any]:
    """One export in a child process: wall seconds (including the output's fsync) and peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    args = [sys.executable, "-m", "statekit", "state", "export", str(job), "--state", "v",
            "--format", "parquet", "--to", str(out), "--json"]
    measured = out.with_name(out.name + ".measured.json")
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(measured), *args], env=env,
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    figures = json.loads(measured.read_text())
    measured.unlink()
    assert figures["code"] == 0, done.stderr.decode()[-2000:]
    t0 = time.perf_counter()
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = figures["seconds"] + time.perf_counter() - t0
    return {"seconds": seconds, "peak_rss_mib": round(figures["maxrss_kib"] / 1024, 1),
            "out_bytes": out.stat().st_size, "result": done.stdout.decode()}


def test_export_1gib_parquet(benchmark: Any) -> None:
    benchmark.group = "export"
    root = scratch_dir("export")
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.export_driver", str(root / "ck"),
                               str(KEYS), str(VALUE_BYTES)], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        assert done.returncode == 0, done.stderr[-2000:]
        state_bytes = int(done.stdout.split()[-1])
        job = root / "ck" / "job"
        probe = min(max(32 * MIB, state_bytes), 1536 * MIB)
        before = raw_disk_throughput(root / "disk", probe)
        runs: list[dict[str, Any]] = []

        def once() -> None:
            drop_tree_cache(job)
            out = root / f"out-{len(runs)}.parquet"
            runs.append(_export(job, out))
            out.unlink()

        benchmark.pedantic(once, rounds=1 if QUICK else 2, iterations=1)
        after = raw_disk_throughput(root / "disk", probe)
        disk = best_disk(before, after)
        best = min(runs, key=lambda r: r["seconds"])
        write_mb_s = best["out_bytes"] / best["seconds"] / 1e6
        info = {
            "keys": KEYS, "value_bytes": VALUE_BYTES, "state_bytes": state_bytes,
            "parquet_bytes": best["out_bytes"], "export_s": round(best["seconds"], 3),
            "all_export_s": [round(r["seconds"], 3) for r in runs],
            "export_write_mb_s": round(write_mb_s, 1),
            "state_read_mb_s": round(state_bytes / best["seconds"] / 1e6, 1),
            "disk": {"before": before, "after": after, "best": disk},
            "export_vs_disk_write": round(write_mb_s / disk["write_mb_s"], 4),
            # the export writes one file fsynced at its end: the disk probe's pattern of the same shape
            "disk_one_file_write_mb_s": max(before["write_one_file_mb_s"], after["write_one_file_mb_s"]),
            "export_vs_disk_one_file": round(write_mb_s / max(before["write_one_file_mb_s"],
                                                              after["write_one_file_mb_s"]), 4),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "command": "statekit state export <job> --state v --format parquet --to <file>",
            "loadavg": loadavg(),
        }
        benchmark.extra_info.update(info)
        print(f"\nexport: {info['state_bytes'] / MIB:.0f} MiB state -> {info['parquet_bytes'] / MIB:.0f} MiB "
              f"parquet in {info['export_s']} s ({info['export_write_mb_s']} MB/s written, disk "
              f"{disk['write_mb_s']} MB/s: {info['export_vs_disk_write']:.0%}; one fsynced file "
              f"{info['disk_one_file_write_mb_s']} MB/s: {info['export_vs_disk_one_file']:.0%}); peak RSS "
              f"{info['peak_rss_mib']} MiB")
        if not QUICK:
            assert state_bytes >= 1024 * MIB
        assert info["peak_rss_mib"] < 1024  # streamed: far below the state's size
    finally:
        shutil.rmtree(root, ignore_errors=True)
