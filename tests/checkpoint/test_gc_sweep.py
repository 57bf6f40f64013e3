"""Garbage collection, the retention sweep and ``verify`` on checkpoints a restore reads exactly
but that record their files unusually (a list recorded as a tuple, a path with a trailing
``/``), on directories holding files statekit did not write, and with links planted or swapped
in while they work: whatever a restore reads is kept and checked, only files statekit wrote are
deleted, and no link is ever followed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from statekit.backends.transfer import restore_into
from statekit.checkpoint.blobstore import LocalBlobStore, set_operation_hook
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.savepoint import open_external
from statekit.checkpoint.schema import recorded_key_groups
from statekit.inspection import collect_garbage, verify
from statekit.serde.keygroups import key_group_range_for_operator
from statekit.serde.types import GenericSerializer
from tests.checkpoint.forge import (
    backend_factory,
    expected_state,
    raw_body,
    restore_and_read,
    rewrite_metadata,
    write_job,
)
from tests.inspection.states import KEYS, MAXP, descriptors
from tests.inspection.states import write_job as write_states_job

#: a name as statekit names the files it writes (``<task>-<state>-<12 hex digits>``)
STATEKIT_NAME = "p0-count-0123456789ab"


def _tuple_logs(body):
    """An incremental heap checkpoint's changelogs recorded as a tuple (read the same)."""
    for task in body["tasks"].values():
        task["logs"] = tuple(task["logs"])


def _slashed_ssts(body):
    """An incremental RocksDB checkpoint's SST paths with a trailing ``/`` (read as the same
    files)."""
    for task in body["tasks"].values():
        for handle in task["sst"].values():
            if handle["type"] == "file":
                handle["path"] += "/"


def _only_there(job: str, change) -> list[str]:
    """Shared files checkpoint 3 references through the records ``change`` rewrites."""
    tasks = raw_body(Path(f"{job}/chk-3/_metadata").read_bytes())["tasks"].values()
    if change is _tuple_logs:
        return sorted({e["data"]["path"] for t in tasks for log in t["logs"] for e in log.values()
                       if e["data"]["type"] == "file"})
    return sorted({h["path"] for t in tasks for h in t["sst"].values() if h["type"] == "file"
                   and h["path"].startswith("shared/")})


def _read_all(kind: str, path: str) -> dict[str, dict]:
    """Every state of a :mod:`tests.inspection.states` job's checkpoint, restored as a job
    restores it (two partitions of ``kind``), per state and key."""
    metadata, reader = open_external(path)
    out: dict[str, dict] = {name: {} for name in descriptors()}
    for index in range(2):
        rng = key_group_range_for_operator(MAXP, 2, index)
        backend = backend_factory(kind).create_keyed_state_backend(
            key_serializer=GenericSerializer(), key_group_range=rng, max_parallelism=MAXP)
        try:
            restore_into(backend, [(h, reader) for h in metadata["tasks"].values()
                                   if len(recorded_key_groups(h).intersection(rng))])
            states = {n: backend.get_partitioned_state(d) for n, d in descriptors().items()}
            for key in KEYS:
                if backend.key_group_of(key) not in rng:
                    continue
                backend.set_current_key(key)
                out["count"][key] = states["count"].value()
                out["seen"][key] = list(states["seen"].get())
                out["bymod"][key] = dict(states["bymod"].items())
                out["last"][key] = states["last"].value()
                out["anything"][key] = states["anything"].value()
        finally:
            backend.dispose()
    return out


@pytest.mark.parametrize(("kind", "change"), [("hashmap", _tuple_logs),
                                              ("rocksdb", _slashed_ssts)])
def test_gc_the_sweep_and_verify_see_every_file_a_restore_reads(tmp_path, kind, change):
    """A checkpoint that restores exactly lost 12-30 needed files to ``gc --delete`` and to the
    sweep after each checkpoint while ``verify`` said OK: their walk skipped lists recorded as
    tuples and took ``shared/x/`` for another file than ``shared/x``."""
    job = write_states_job(str(tmp_path / "ck"), kind, True, str(tmp_path / "work"), rounds=3).path
    needed = _only_there(job, change)
    assert needed
    rewrite_metadata(f"{job}/chk-3/_metadata", change)
    expected = _read_all(kind, f"{job}/chk-3")
    assert expected["count"]

    damaged = str(tmp_path / "damaged")
    shutil.copytree(job, damaged)
    data = bytearray(Path(damaged, needed[0]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(damaged, needed[0]).write_bytes(bytes(data))
    report = verify(f"{damaged}/chk-3")
    assert not report.ok and [p.path for p in report.problems] == [f"{damaged}/{needed[0]}"]

    report = collect_garbage(job, delete=True)
    assert not {g.path for g in report.items} & {f"{job}/{p}" for p in needed}
    access = CheckpointStorageAccess(LocalBlobStore(job), job, 0)
    access.discard(1, [3])  # the retention sweep after checkpoint 3
    access.discard(2, [3])
    assert all(os.path.exists(f"{job}/{p}") for p in needed)
    assert _read_all(kind, f"{job}/chk-3") == expected
    assert verify(job).ok


def test_gc_and_the_sweep_delete_only_files_statekit_wrote(tmp_path):
    job = write_job("hashmap-incremental", str(tmp_path / "ck"))
    base = Path(job)
    inner = write_job("hashmap", str(base / "shared" / "inner"))  # a whole job nested in shared/
    user = [base / "chk-9" / "notes.txt", base / "chk-1" / "README", base / "shared" / "data.csv",
            base / "notes"]
    for path in user:
        path.parent.mkdir(exist_ok=True)
        path.write_text("the user's")
    garbage = [base / "chk-9" / STATEKIT_NAME, base / "shared" / "p1-seen-base-abcdef012345"]
    for path in garbage:
        path.write_bytes(b"x")

    report = collect_garbage(job, delete=True)
    assert sorted(g.path for g in report.items) == sorted(map(str, garbage))
    assert not any(p.exists() for p in garbage)
    CheckpointStorageAccess(LocalBlobStore(job), job, 0).discard(1, [2])
    assert all(p.read_text() == "the user's" for p in user)
    assert restore_and_read("hashmap", f"{inner}/chk-2") == expected_state(2)
    assert restore_and_read("hashmap", f"{job}/chk-2") == expected_state(2)
    assert verify(str(base)).ok


def test_gc_leaves_planted_links_alone_and_goes_on(tmp_path):
    job = write_job("hashmap-incremental", str(tmp_path / "ck"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / STATEKIT_NAME).write_text("not statekit's")
    os.symlink(outside / STATEKIT_NAME, f"{job}/shared/p9-count-base-0123456789ab")
    os.symlink(outside, f"{job}/chk-7")  # an incomplete checkpoint's directory, linked out
    orphan = Path(job, "shared", "p8-count-base-0123456789ab")
    orphan.write_bytes(b"x")

    report = collect_garbage(job, delete=True)
    assert [g.path for g in report.items] == [str(orphan)] and not orphan.exists()
    assert (outside / STATEKIT_NAME).read_text() == "not statekit's"
    assert os.path.islink(f"{job}/shared/p9-count-base-0123456789ab")
    assert restore_and_read("hashmap", f"{job}/chk-2") == expected_state(2)


def _swap_for_link(directory: Path, outside: Path):
    """An operation hook that replaces ``directory`` by a link to ``outside`` the first time
    it runs: between whatever a store checked and what it then does."""
    done: list[bool] = []

    def hook(operation: str, path: str) -> None:
        if not done and path.startswith(str(directory)):
            done.append(True)
            directory.rename(directory.with_name("moved"))
            os.symlink(outside, directory)

    return hook


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside"
    path.mkdir()
    (path / STATEKIT_NAME).write_text("outside the checkpoint")
    return path


def test_gc_deletes_relative_to_the_opened_directory_never_through_a_swapped_link(tmp_path, outside):
    """A directory swapped for a link between gc's check and its delete used to make it delete
    the file the link reaches; the delete acts on the directory it opened (``dir_fd``)."""
    job = write_job("hashmap", str(tmp_path / "ck"))
    victim = Path(job, "chk-9")
    victim.mkdir()
    (victim / STATEKIT_NAME).write_bytes(b"garbage")
    previous = set_operation_hook(_swap_for_link(victim, outside))
    try:
        collect_garbage(job, delete=True)
    finally:
        set_operation_hook(previous)
    assert (outside / STATEKIT_NAME).read_text() == "outside the checkpoint"
    assert not Path(job, "moved", STATEKIT_NAME).exists()  # the garbage itself went


def test_writes_land_in_the_opened_directory_never_through_a_swapped_link(tmp_path, outside):
    root = tmp_path / "root"
    (root / "chk-9").mkdir(parents=True)
    previous = set_operation_hook(_swap_for_link(root / "chk-9", outside))
    try:
        LocalBlobStore(str(root)).put("chk-9/new", b"state")
    finally:
        set_operation_hook(previous)
    assert sorted(os.listdir(outside)) == [STATEKIT_NAME]
    assert (root / "moved" / "new").read_bytes() == b"state"
