"""Restart within a job, with and without local recovery: the failure → the first element
processed after the restore, on the local runner, both backends.

Each run is one subprocess (``benchmarks/local_recovery_driver.py``) filling ``N`` keys x 1100 B,
failing after a checkpoint of every key, and restarting.  Checkpoint storage is the local disk
(``nvme``: no shim) or, for a slow "remote", the same directory slowed to the ``sata-ssd`` profile
by the disk-profile shim (``benchmarks/diskprofiles``); the local copies stay on the plain disk.
The figure is ``local / remote`` per backend and profile, within one run.

``STATEKIT_BENCH_QUICK=1`` uses 20k keys; full mode 1M (≥ 1 GiB) unless
``STATEKIT_BENCH_LOCALREC_KEYS`` says otherwise.  Full mode asserts nothing unless
``STATEKIT_BENCH_STRICT=1`` (then: local recovery at most half the remote restart on the slow
profile).
Run: ``pytest benchmarks/test_local_recovery_bench.py -s -o testpaths=benchmarks``.
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

from benchmarks._common import QUICK, STRICT, loadavg, scratch_dir

N = int(os.environ.get("STATEKIT_BENCH_LOCALREC_KEYS") or (20_000 if QUICK else 1_000_000))
_REPO = Path(__file__).resolve().parents[1]


def _run(root: Path, backend: str, local: bool, profile: str) -> dict[str, Any]:
    env = dict(os.environ)
    if profile != "nvme":
        from benchmarks.diskprofiles.profiles import subprocess_env

        env = subprocess_env(profile, [root / "remote"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.local_recovery_driver", "--root", str(root),
         "--keys", str(N), "--backend", backend, "--local", str(int(local)),
         "--interval", "200 ms" if QUICK else "1 s"],
        env=env, cwd=_REPO, capture_output=True, text=True, timeout=3600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("profile", ["nvme", "sata-ssd"])
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_restart_with_local_recovery(benchmark: Any, backend: str, profile: str) -> None:
    benchmark.group = f"local-recovery-{backend}-{profile}"
    if QUICK and profile != "nvme":
        pytest.skip("quick mode: checkpoint storage on the plain disk only")
    if profile != "nvme" and shutil.which("gcc") is None:
        pytest.skip("the disk-profile shim needs gcc")
    root = scratch_dir(f"localrec-{backend}")
    rows: dict[str, dict[str, Any]] = {}
    try:
        def both() -> None:
            for name, local in (("remote", False), ("local", True)):
                rows[name] = _run(root / name, backend, local, profile)

        benchmark.pedantic(both, rounds=1, iterations=1)
        remote, local = rows["remote"], rows["local"]
        assert remote["restored"] and local["restored"]
        assert local["restore_sources"] == [{"keyed-process-0": "local"}]
        assert remote["restore_sources"] == [{"keyed-process-0": "remote"}]
        figures = {
            "backend": backend, "profile": profile, "keys": N,
            "checkpoint_bytes": remote["checkpoint_bytes"],
            "remote_restart_s": round(remote["failure_to_first_element_s"], 3),
            "local_restart_s": round(local["failure_to_first_element_s"], 3),
            "local_vs_remote": round(local["failure_to_first_element_s"]
                                     / remote["failure_to_first_element_s"], 3),
            "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nlocal recovery:", figures)
        if STRICT and profile != "nvme":
            assert figures["local_vs_remote"] <= 0.5
    finally:
        shutil.rmtree(root, ignore_errors=True)
