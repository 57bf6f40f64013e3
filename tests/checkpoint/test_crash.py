"""Crash consistency: a writer killed (SIGKILL) before a randomly chosen file operation, across
many checkpoints, on local disk and on the local S3 server.  After every kill: each checkpoint
whose ``_metadata`` exists verifies completely, orphans are cleaned up, and restoring the newest
one and running to the end gives exactly the dict model's per-key state (no lost or duplicated
update).  The default run uses 12 kill points per medium; ``-m slow`` uses 50.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from statekit.checkpoint.blobstore import FsspecBlobStore
from statekit.checkpoint.handles import file_paths
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.testing.faults import KILL_AT_ENV

sys.path.insert(0, str(Path(__file__).parent))
import crash_writer as writer

WRITER = str(Path(__file__).with_name("crash_writer.py"))


def model() -> dict[str, tuple[int, int, list[int]]]:
    ids: dict[str, list[int]] = defaultdict(list)
    for key, i in writer.data():
        ids[key].append(i)
    return {k: (len(v), sum(v), sorted(v)) for k, v in ids.items()}


class Medium:
    def __init__(self, name: str, base: str, endpoint: str | None, options: dict | None) -> None:
        self.name, self.base, self.endpoint, self.options = name, base, endpoint, options or {}

    def job_dirs(self, root: str) -> list[str]:
        if self.endpoint is None:
            return [os.path.join(root, d) for d in os.listdir(root)] if os.path.isdir(root) else []
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.options)
        path = root[len("s3://"):]
        return ["s3://" + p for p in fs.ls(path, detail=False)] if fs.exists(path) else []


def run_writer(medium: Medium, root: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, WRITER, root] + ([medium.endpoint] if medium.endpoint else [])
    env = {**os.environ, KILL_AT_ENV: str(kill_at)}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def verify_after_crash(medium: Medium, root: str) -> dict[str, int]:
    """Check the storage a killed writer left and restore from it; returns counts."""
    dirs = medium.job_dirs(root)
    assert len(dirs) <= 1
    latest_path = None
    orphans = 0
    completed: list[int] = []
    if dirs:
        store = FsspecBlobStore(dirs[0], medium.options)
        access = CheckpointStorageAccess(store, dirs[0], 0)
        completed = access.completed()
        for cid in completed:  # visible as complete => complete and intact
            access.verify(cid)
        orphans = len(access.cleanup_orphans())
        referenced = set()
        for cid in completed:
            referenced |= {f"chk-{cid}/_metadata"} | file_paths(access.load(cid))
        leftover = [k for k in store.list() if k not in referenced]
        assert leftover == [], f"orphans survived cleanup: {leftover}"
        assert store.list_temporary() == []
        if completed:
            latest_path = access.checkpoint_path(completed[-1])
    conf = writer.config(root, medium.endpoint)
    if latest_path is not None:
        conf["execution.savepoint.path"] = latest_path
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(2)
    out = (env.from_collection(writer.data() + writer.sentinels()).key_by(lambda v: v[0])
           .process(writer.Counter()).execute_and_collect())
    final = {key: (count, total, ids) for key, count, total, ids in out}
    expected = model()
    lost = sum(len(set(expected[k][2]) - set(final.get(k, (0, 0, []))[2])) for k in expected)
    duplicated = sum(len(v[2]) - len(set(v[2])) for v in final.values())
    assert (lost, duplicated) == (0, 0), f"lost {lost}, duplicated {duplicated}"
    assert final == expected
    return {"completed": len(completed), "orphans": orphans, "restored": int(latest_path is not None)}


def crash_campaign(medium: Medium, points: int, seed: int) -> dict[str, int]:
    dry = run_writer(medium, f"{medium.base}/dry", 0)
    assert dry.returncode == 0, dry.stderr[-2000:]
    total_ops = int(dry.stdout.split("ops=")[1].split()[0])
    rng = random.Random(seed)
    # the writer's operation count depends on how many checkpoints its timing allowed (fewer on
    # a loaded machine): every point when there are fewer than asked for
    population = range(1, max(2, int(total_ops * 0.95)))
    kill_points = sorted(rng.sample(population, min(points, len(population))))
    totals = {"points": len(kill_points), "total_ops": total_ops, "killed": 0, "restored": 0,
              "orphans": 0, "lost": 0, "duplicated": 0}
    killed_at: list[int] = []
    for n, k in enumerate(kill_points):
        for attempt in range(3):  # timing varies the operation count: re-aim if the job finished
            root = f"{medium.base}/p{n}-{attempt}-k{k}"
            proc = run_writer(medium, root, k)
            assert proc.returncode in (0, -9), proc.stderr[-2000:]
            counts = verify_after_crash(medium, root)  # a finished run must verify too
            if proc.returncode == -9:
                totals["killed"] += 1
                killed_at.append(k)
                break
            k = rng.randint(1, int(proc.stdout.split("ops=")[1].split()[0]) - 1)
        totals["restored"] += counts["restored"]
        totals["orphans"] += counts["orphans"]
    print(f"\ncrash campaign {medium.name}: {totals} killed before operations {killed_at}")
    return totals


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.heavy)])
def medium(request, tmp_path):
    if request.param == "local":
        return Medium("local", str(tmp_path), None, None)
    server = request.getfixturevalue("s3_server")
    url = request.getfixturevalue("s3_url")
    return Medium("s3", url, server.endpoint_url, server.storage_options())


def test_crash_at_random_points(medium):
    totals = crash_campaign(medium, points=8, seed=6)  # 50 under slow
    assert totals["killed"] == totals["points"] >= min(8, totals["total_ops"] // 2)
    assert totals["lost"] == totals["duplicated"] == 0


@pytest.mark.slow
def test_crash_at_50_random_points(medium):
    totals = crash_campaign(medium, points=50, seed=66)  # every operation when there are fewer
    assert totals["killed"] == totals["points"] >= min(50, totals["total_ops"] // 2)
