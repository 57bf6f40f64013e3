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
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks._common import QUICK, STRICT, loadavg, scratch_dir
from benchmarks.diskprofiles.profiles import remove_device_state, subprocess_env

N = int(os.environ.get("STATEKIT_BENCH_LOCALREC_KEYS") or (20_000 if QUICK else 1_000_000))
_REPO = Path(__file__).resolve().parents[1]


def _run(root: Path, backend: str, local: bool, profile: str) -> dict[str, Any]:
    env = dict(os.environ)
    if profile != "nvme":
        env = subprocess_env(profile, [root / "remote"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.local_recovery_driver", "--root", str(root),
             "--keys", str(N), "--backend", backend, "--local", str(int(local)),
             "--interval", "200 ms" if QUICK else "1 s"],
            env=env, cwd=_REPO, capture_output=True, text=True, timeout=3600)
        if out.returncode:
            raise AssertionError(f"the driver failed ({out.returncode}):\n{out.stderr[-4000:]}")
    finally:
        if "IODELAY_SHM" in env:  # the shim's device state in /dev/shm
            remove_device_state(env["IODELAY_SHM"])
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
            # the checkpoint's asynchronous part (median of those holding every key): the cost
            # of keeping the local copy
            "remote_checkpoint_async_s": remote["checkpoint_async_s"],
            "local_checkpoint_async_s": local["checkpoint_async_s"],
            "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nlocal recovery:", figures)
        if STRICT and profile != "nvme":
            assert figures["local_vs_remote"] <= 0.5
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_checkpoint_cost_of_the_local_copy(benchmark: Any, kind: str) -> None:
    """A full checkpoint of the same state with and without keeping a local copy, interleaved
    round by round (checkpoint storage and the copy on the same disk): the copy's cost."""
    from benchmarks.test_checkpoint import Case
    from statekit.checkpoint.localstate import TaskLocalStateStore

    benchmark.group = f"local-copy-checkpoint-{kind}"
    keys = N if N < 1_000_000 else 300_000
    root = scratch_dir(f"localcopy-{kind}")
    case = Case(kind, keys, 1100, root)
    case.add("s", incremental=False)
    local = TaskLocalStateStore(root / "local", root / "local" / "task", "bench")
    times: dict[str, list[float]] = {"remote": [], "with_copy": []}
    try:
        def rounds() -> None:
            cid = 0
            for _ in range(1 if QUICK else 3):
                for name in ("remote", "with_copy"):
                    cid += 1
                    streams = case.access["s"].streams(cid, "task")
                    if name == "with_copy":
                        streams = local.streams(cid, streams)
                    start = time.perf_counter()
                    handle = case.backends["s"].snapshot(cid, streams).run()
                    case.access["s"].commit(cid, {"tasks": {"task": handle}})
                    if name == "with_copy":
                        assert local.complete(cid, handle)
                    times[name].append(time.perf_counter() - start)
                    case.backends["s"].notify_checkpoint_complete(cid)
                    case.access["s"].discard(cid, [])

        benchmark.pedantic(rounds, rounds=1, iterations=1)
        figures = {
            "kind": kind, "keys": keys,
            "checkpoint_s": [round(x, 3) for x in times["remote"]],
            "with_copy_s": [round(x, 3) for x in times["with_copy"]],
            "with_copy_vs_without": round(statistics.median(times["with_copy"])
                                          / statistics.median(times["remote"]), 3),
            "loadavg": loadavg(),
        }
        benchmark.extra_info.update(figures)
        print("\nlocal copy checkpoint cost:", figures)
    finally:
        local.dispose()
        case.close()
        shutil.rmtree(root, ignore_errors=True)
