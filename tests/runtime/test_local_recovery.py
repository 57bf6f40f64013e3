"""Local recovery on the local runner: a restart within the job reads each task's local copy of
the restored checkpoint, and falls back to checkpoint storage when that copy is missing, stale
or damaged; the copies end with the job."""

import os
import re
import time
from pathlib import Path

import pytest

from statekit import KeyedProcessFunction, RestartStrategies, Types, ValueStateDescriptor
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.handles import file_paths
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import ConfigError, CorruptCheckpointError, JobExecutionError
from statekit.testing.files import walked
from tests.runtime.envs import env_for, expected_final, final_of

ITEMS = [(f"user{i % 13}", i) for i in range(4000)]  # from 1000 on: up to 6 s for a checkpoint
TASKS = ("keyed-process-0", "keyed-process-1")


def remote_state_files(chk: Path):
    """The state files of complete checkpoints in checkpoint storage (not ``_metadata``)."""
    def files():
        done = {m.parent for m in chk.rglob("chk-*/_metadata")}
        return [f for f in chk.rglob("*") if f.is_file() and f.name != "_metadata"
                and (f.parent in done or f.parent.name == "shared")]
    return walked(files)


def local_copies(root: Path):
    """Each task's copies: ``<root>/<job dir>/<task>/chk-<id>``."""
    return sorted(p for p in root.glob("*/*/chk-*")) if root.exists() else []


def copies_ready(root: Path, first: int = 1) -> bool:
    """Both tasks have a copy of checkpoint ``first`` or later, and each holds state."""
    copies = walked(lambda: local_copies(root))
    return len(copies) == 2 and walked(lambda: all(
        int(c.name[len("chk-"):]) >= first
        and any(f.stat().st_size for f in c.rglob("*") if f.is_file() and f.name != "_local")
        for c in copies))


class Failing(KeyedProcessFunction):
    """Running count and sum per key; in the first attempt, from element 1000 on, it fails at
    the first element that finds ``ready()`` (a checkpoint completed), after ``before_failure``
    (the test spoils a copy there); it slows down until then, so that checkpoints complete."""

    def __init__(self, before_failure, ready):
        self.before_failure = before_failure
        self.ready = ready

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.total = ctx.get_state(ValueStateDescriptor("sum", Types.LONG()))
        self.attempt = ctx.get_attempt_number()

    def process_element(self, value, ctx):
        if self.attempt == 0 and value[1] >= 1000:
            if self.ready():
                self.before_failure()
                raise RuntimeError("injected failure")
            time.sleep(0.002)
        c = (self.count.value() or 0) + 1
        s = (self.total.value() or 0) + value[1]
        self.count.update(c)
        self.total.update(s)
        yield ctx.get_current_key(), c, s


def run(tmp_path, backend, before_failure, first=1, **conf):
    env = env_for(tmp_path, backend, **{
        "execution.checkpointing.interval": "20 ms", "state.backend.local-recovery": "true",
        "taskmanager.state.local.root-dirs": str(tmp_path / "local"),
        "state.storage.fs.memory-threshold": "0", **conf})
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    seen = {}

    def hook():
        seen["copies"] = local_copies(tmp_path / "local")
        before_failure()

    result = env.from_collection(ITEMS).key_by(lambda x: x[0]).process(
        Failing(hook, lambda: copies_ready(tmp_path / "local", first))).execute_and_collect()
    assert result.restarts == 1
    assert final_of(result) == expected_final(ITEMS)
    assert len(result) == len(ITEMS)
    assert len(seen["copies"]) == 2  # one copy per task: of the latest checkpoint only
    assert not (tmp_path / "local").exists() or not any((tmp_path / "local").iterdir())
    return result.restore_sources


@pytest.mark.parametrize(("backend", "incremental"), [
    ("hashmap", False), ("hashmap", True), ("rocksdb", False), ("rocksdb", True),
    ("rocksdb", "changelog")])
def test_restart_reads_the_local_copy(tmp_path, backend, incremental):
    """The checkpoint's files in checkpoint storage are damaged before the failure: only the
    local copies hold the state, and the restart is exact.  Incremental snapshots re-reference
    files of earlier checkpoints, which each copy links from the copy before it; so do changelog
    checkpoints (their materialization's files and earlier log segments)."""
    def damage_remote():
        files = remote_state_files(tmp_path / "chk")
        assert files
        if incremental:  # the copy holds files of earlier checkpoints, linked from its forerunner
            newest = max(local_copies(tmp_path / "local"))
            n = int(newest.name[len("chk-"):])
            (job,) = (tmp_path / "chk").iterdir()
            access = CheckpointStorageAccess(LocalBlobStore(str(job)), str(job), 0)
            earlier = file_paths(access.load(n - 1)) & file_paths(access.load(n))
            assert earlier and all((c / p).is_file() for p in earlier
                                   for c in local_copies(tmp_path / "local") if c.parent.name in p)
        for f in files:
            f.write_bytes(b"\0" * f.stat().st_size)

    sources = run(tmp_path, backend, damage_remote, first=3 if incremental else 1,
                  **{"state.backend.incremental": bool(incremental),
                     "state.changelog.enabled": incremental == "changelog",
                     # a materialization always on its way: its shares are in the copies too
                     **({"state.changelog.periodic-materialize.interval": "1 ms"}
                        if incremental == "changelog" else {}),
                     "state.checkpoints.num-retained": 3})
    assert sources == [{t: "local" for t in TASKS}]


def test_without_local_recovery_the_damaged_remote_copy_fails(tmp_path):
    """The same damage without local recovery: the restore reads checkpoint storage and fails."""
    env = env_for(tmp_path, "hashmap", **{"execution.checkpointing.interval": "20 ms",
                                          "state.storage.fs.memory-threshold": "0"})
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))

    def damage_remote():
        for f in remote_state_files(tmp_path / "chk"):
            f.write_bytes(b"\0" * f.stat().st_size)

    with pytest.raises(JobExecutionError) as info:  # the restore reads and checks every byte
        env.from_collection(ITEMS).key_by(lambda x: x[0]).process(
            Failing(damage_remote, lambda: remote_state_files(tmp_path / "chk"))
        ).execute_and_collect()
    assert isinstance(info.value.__cause__, CorruptCheckpointError)


def _spoil(tmp_path, how):
    def spoil():
        copies = local_copies(tmp_path / "local")
        assert copies
        for copy in copies:
            files = [f for f in copy.rglob("*") if f.is_file() and f.name != "_local"]
            assert files
            if how == "missing":
                for f in copy.rglob("*"):
                    if f.is_file():
                        f.unlink()
            elif how == "damaged":  # same size, other bytes: only the checksum tells
                for f in files:
                    f.write_bytes(b"\xff" * f.stat().st_size)
            elif how == "last-byte":  # a value's byte: a lazy restore reads it only later
                for f in files:
                    data = bytearray(f.read_bytes())
                    if data:
                        data[-1] ^= 0xFF
                        f.write_bytes(bytes(data))
            elif how == "truncated":
                for f in files:
                    f.write_bytes(f.read_bytes()[:-1])
            elif how == "stale":  # another checkpoint's copy in its place (a different id)
                copy.rename(copy.with_name("chk-999999"))
            elif how == "manifest":
                (copy / "_local").write_bytes(b"garbage")
    return spoil


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("how", ["missing", "damaged", "last-byte", "truncated", "stale",
                                 "manifest"])
def test_unusable_local_copy_falls_back_to_checkpoint_storage(tmp_path, backend, how):
    # a lazy heap restore reads its values after the restore: the copy's damaged values are
    # read from checkpoint storage then, part by part (the restore itself used the copy)
    lazy = backend == "hashmap" and how == "last-byte"
    assert run(tmp_path, backend, _spoil(tmp_path, how)) == [
        {t: "local" if lazy else "remote" for t in TASKS}]


def test_local_copy_that_is_a_link_out_of_the_root_is_refused(tmp_path):
    """A copy directory replaced by a link to a directory elsewhere (holding a real copy) is
    never followed: the restore reads checkpoint storage."""
    outside = tmp_path / "elsewhere"

    def swap():
        outside.mkdir()
        for n, copy in enumerate(local_copies(tmp_path / "local")):
            target = outside / str(n)
            copy.rename(target)
            os.symlink(target, copy)

    assert run(tmp_path, "hashmap", swap) == [{t: "remote" for t in TASKS}]
    assert any(outside.rglob("*"))  # the link's target was left alone


def test_copies_are_kept_only_with_local_recovery(tmp_path):
    env = env_for(tmp_path, "hashmap", **{"execution.checkpointing.interval": "20 ms",
                                          "taskmanager.state.local.root-dirs": str(tmp_path / "l"),
                                          "state.storage.fs.memory-threshold": "0"})
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    result = env.from_collection(ITEMS).key_by(lambda x: x[0]).process(
        Failing(lambda: None, lambda: remote_state_files(tmp_path / "chk"))).execute_and_collect()
    assert result.restore_sources == [{t: "remote" for t in TASKS}]
    assert not (tmp_path / "l").exists()


def test_local_recovery_keys_are_checked():
    with pytest.raises(ConfigError, match=re.escape("state.backend.local-recovery")):
        env_for("/nonexistent", "hashmap", **{"state.backend.local-recovery": "maybe"})
    with pytest.raises(ConfigError, match=re.escape("taskmanager.state.local.root-dirs")):
        env_for("/nonexistent", "hashmap", **{"taskmanager.state.local.root-dir": "/x"})


def test_copies_of_a_job_whose_process_died_are_swept(tmp_path):
    """A job directory whose lock nobody holds (its process was killed) goes when the next job
    with local recovery starts on the same root."""
    root = tmp_path / "local"
    dead = root / "job-999999-0123456789ab"
    (dead / "keyed-process-0" / "chk-3").mkdir(parents=True)
    (root / "job-999999-0123456789ab.lock").write_text("999999\n")
    run(tmp_path, "hashmap", lambda: None)
    assert not dead.exists()


def test_a_restart_does_not_wait_for_subsumed_checkpoints_to_be_deleted(tmp_path, monkeypatch):
    """Deleting a subsumed checkpoint (slow here: half a second) goes on while the job restarts;
    the job still ends with every subsumed checkpoint deleted."""
    slow: list[float] = []
    original = CheckpointStorageAccess.discard

    def discard(self, checkpoint_id, retained):
        slow.append(time.perf_counter())  # the job fails while this deletion runs
        time.sleep(0.5)
        return original(self, checkpoint_id, retained)

    monkeypatch.setattr(CheckpointStorageAccess, "discard", discard)
    marks: dict[str, float] = {}

    def failed():
        marks.setdefault("failure", time.perf_counter())

    class Timed(Failing):
        def process_element(self, value, ctx):
            if self.attempt > 0:
                marks.setdefault("restarted", time.perf_counter())
            yield from super().process_element(value, ctx)

    env = env_for(tmp_path, "hashmap", **{"execution.checkpointing.interval": "20 ms"})
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(1, 0))
    result = env.from_collection(ITEMS).key_by(lambda x: x[0]).process(
        Timed(failed, lambda: bool(slow))).execute_and_collect()
    assert result.restarts == 1 and final_of(result) == expected_final(ITEMS)
    assert marks["failure"] - slow[0] < 0.2  # the job failed while a deletion ran ...
    assert marks["restarted"] - marks["failure"] < 0.25  # ... and restarted without waiting
    assert not result.retained_checkpoints
    assert not list((tmp_path / "chk").rglob("_metadata"))  # and none outlives the job
