"""Every ``PredefinedOptions`` profile on every disk profile (``benchmarks/diskprofiles``).

Each case runs ``benchmarks/rocksdb_profile_driver.py`` in a subprocess under
``subprocess_env(profile, [workdir, ckptdir])`` -- the LD_PRELOAD shim applies per process -- and
records the driver's JSON in ``benchmark.extra_info``.  The four option profiles of one disk
profile run back to back so they share the machine's conditions; compare within a disk profile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import QUICK, loadavg, scratch_dir
from benchmarks.diskprofiles.profiles import remove_device_state, subprocess_env

DISKS = ["nvme", "sata-ssd", "hdd-7200"]
OPTIONS = ["DEFAULT", "FLASH_SSD_OPTIMIZED", "SPINNING_DISK_OPTIMIZED", "SPINNING_DISK_OPTIMIZED_HIGH_MEM"]
# > the largest block cache (HIGH_MEM: 256 MiB) in full mode; quick mode only checks the plumbing
KEYS = 20_000 if QUICK else 320_000
VALUE_BYTES = 1024
MIX_SECONDS = 0.7 if QUICK else 6.0
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("disk", "options"), [(d, o) for d in DISKS for o in OPTIONS])
def test_rocksdb_options_on_disk_profile(benchmark: Any, disk: str, options: str) -> None:
    benchmark.group = f"disk-profile-{disk}"
    root = scratch_dir(f"disk-{disk}-{options}")
    workdir, ckptdir = root / "work", root / "ckpt"
    workdir.mkdir()
    ckptdir.mkdir()
    env = subprocess_env(disk, [workdir, ckptdir])
    env["PYTHONPATH"] = f"{REPO}{':' + env['PYTHONPATH'] if env.get('PYTHONPATH') else ''}"
    argv = [sys.executable, "-m", "benchmarks.rocksdb_profile_driver", "--workdir", str(workdir),
            "--ckptdir", str(ckptdir), "--options", options, "--keys", str(KEYS),
            "--value-bytes", str(VALUE_BYTES), "--mix-seconds", str(MIX_SECONDS)]
    holder: dict[str, Any] = {}

    def run() -> None:
        proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        holder["result"] = json.loads(proc.stdout.strip().splitlines()[-1])

    try:
        benchmark.pedantic(run, rounds=1, iterations=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if "IODELAY_SHM" in env:
            remove_device_state(env["IODELAY_SHM"])
    result = holder["result"]
    assert result["profile"] == disk
    result.update({"disk": disk, "loadavg": loadavg()})
    benchmark.extra_info.update(result)
    print(f"\n{disk} {options}: {result}")
