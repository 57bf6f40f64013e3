"""Restores that used to succeed on damaged checkpoints: a file longer than recorded, a state
given another state's bytes, a lost task handle whose loss was hidden by deleting an optional
field.  Each is now a typed error, the same from the restore of either backend and from the
inspection path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from statekit.checkpoint.savepoint import Savepoint
from statekit.errors import CorruptCheckpointError, TruncatedCheckpointError
from tests.checkpoint.conftest import WRITERS
from tests.checkpoint.forge import (
    MAXP,
    inspect_state,
    raw_body,
    restore,
    restore_and_read,
    rewrite_metadata,
    write_job,
)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A job's heap checkpoints (plain entries) and a savepoint of its newest one (key-grouped,
    indexed entries), both with the state in files."""
    root = tmp_path_factory.mktemp("strict")
    job = write_job("hashmap", str(root / "ck"))
    partitions = restore("hashmap", f"{job}/chk-2")
    try:
        savepoint = Savepoint(str(root / "sp"), "forged")
        tasks = {f"p{i}": b.snapshot(3, savepoint.streams(f"p{i}", 64), savepoint=True).run()
                 for i, b in enumerate(partitions)}
        path = savepoint.commit({"tasks": tasks, "max_parallelism": MAXP, "checkpoint_id": 3})
    finally:
        for backend in partitions:
            backend.dispose()
    return job, path


def _copy(written, encoding: str, tmp_path: Path) -> tuple[str, str]:
    """A private copy of the checkpoint (``plain``) or savepoint (``indexed``): ``(what to
    restore, its directory of state files)``."""
    job, savepoint = written
    if encoding == "plain":
        shutil.copytree(job, tmp_path / "job")
        return str(tmp_path / "job" / "chk-2"), str(tmp_path / "job" / "chk-2")
    shutil.copytree(savepoint, tmp_path / "sp")
    return str(tmp_path / "sp"), str(tmp_path / "sp")


@pytest.mark.parametrize("reader", WRITERS)
@pytest.mark.parametrize("encoding", ["plain", "indexed"])
def test_a_file_longer_than_recorded_is_refused(tmp_path, written, reader, encoding):
    """Restore read the recorded parts of a longer file and accepted it (verify flagged it)."""
    path, files = _copy(written, encoding, tmp_path)
    victim = next(p for p in sorted(Path(files).iterdir()) if p.name != "_metadata")
    with open(victim, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(TruncatedCheckpointError, match="metadata records"):
        restore_and_read(reader, path)
    with pytest.raises(TruncatedCheckpointError, match="metadata records"):
        inspect_state(path)


def _give(dst: str, src: str):
    """Give state ``dst`` the bytes of state ``src`` (its data and their index or parts)."""
    def change(body):
        for task in body["tasks"].values():
            entries = task["states"]
            for field in ("data", "parts", "index"):
                if field in entries[src]:
                    entries[dst][field] = entries[src][field]
    return change


@pytest.mark.parametrize("reader", WRITERS)
@pytest.mark.parametrize("encoding", ["plain", "indexed"])
@pytest.mark.parametrize(("dst", "src"), [("totals", "events"), ("events", "totals"),
                                          ("count", "events")])
def test_a_state_given_another_states_bytes_is_corrupt(tmp_path, written, reader, encoding,
                                                       dst, src):
    """A map state given a list state's bytes raised TypeError; a list state given a map
    state's bytes restored a list holding map entries, a LONG value state one holding a list."""
    path, _ = _copy(written, encoding, tmp_path)
    rewrite_metadata(f"{path}/_metadata", _give(dst, src))
    for read in (lambda: restore_and_read(reader, path), lambda: inspect_state(path)):
        with pytest.raises(CorruptCheckpointError, match=f"state '{dst}'"):
            read()


@pytest.mark.parametrize("writer", WRITERS)
def test_a_lost_task_handle_is_corrupt_without_the_optional_parallelism(tmp_path, writer):
    """Deleting one task handle together with the optional ``parallelism`` field restored half
    the state silently: coverage is now checked from the handles alone."""
    job = write_job(writer, str(tmp_path / "ck"))

    def drop(body):
        del body["tasks"]["p1"]
        del body["parallelism"]

    rewrite_metadata(f"{job}/chk-2/_metadata", drop)
    assert "parallelism" not in raw_body(Path(f"{job}/chk-2/_metadata").read_bytes())
    for read in (lambda: restore_and_read(writer, f"{job}/chk-2"),
                 lambda: inspect_state(f"{job}/chk-2")):
        with pytest.raises(CorruptCheckpointError, match="cover 64 of the job's 128 key groups"):
            read()
    assert os.path.exists(f"{job}/chk-2/_metadata")
