"""Reproductions of a hostile-input probe of checkpoints, as regression tests: each damaged or
forged checkpoint restores exactly or raises a typed error (a crash, a hang or an untyped error
was reported for each before)."""

from __future__ import annotations

import pytest

from statekit.errors import CorruptCheckpointError
from tests.checkpoint.forge import expected_state, restore_and_read, rewrite_metadata, write_job

WRITERS = ["hashmap", "rocksdb"]


@pytest.fixture(scope="module", params=WRITERS)
def job(request, tmp_path_factory):
    """A job's two checkpoints written with each backend (shared by the module's tests: each
    test tampers with a copy)."""
    root = tmp_path_factory.mktemp(f"job-{request.param}")
    return request.param, write_job(request.param, str(root))


@pytest.fixture
def copy(job, tmp_path):
    """A private copy of the job directory: ``(writer, job directory)``."""
    import shutil

    writer, source = job
    target = tmp_path / "job"
    shutil.copytree(source, target, symlinks=True)
    return writer, str(target)


@pytest.mark.parametrize("reader", WRITERS)
def test_an_intact_checkpoint_restores_exactly_into_either_backend(copy, reader):
    _, where = copy
    assert restore_and_read(reader, f"{where}/chk-2") == expected_state(2)
    assert restore_and_read(reader, f"{where}/chk-2", parallelism=3) == expected_state(2)


@pytest.mark.parametrize("reader", WRITERS)
def test_swapped_key_group_ranges_are_detected(copy, reader):
    """Finding 6: two tasks' handles with their key-group ranges swapped restored "successfully"
    with all state gone; every restored key is now checked against its recorded range."""
    _, where = copy

    def swap(body):
        first, second = body["tasks"]["p0"], body["tasks"]["p1"]
        first["key_group_range"], second["key_group_range"] = (second["key_group_range"],
                                                               first["key_group_range"])

    rewrite_metadata(f"{where}/chk-2/_metadata", swap)
    with pytest.raises(CorruptCheckpointError, match="outside the key groups"):
        restore_and_read(reader, f"{where}/chk-2")
