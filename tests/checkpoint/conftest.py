"""Fixtures of the hostile-input tests: a job's checkpoints written by each backend, and a private
copy of them for each test to tamper with."""

import shutil

import pytest

from tests.checkpoint.forge import write_job

WRITERS = ["hashmap", "rocksdb"]


@pytest.fixture(scope="module", params=WRITERS)
def job(request, tmp_path_factory):
    """A job's two checkpoints written with each backend (shared by a module's tests: each test
    tampers with a copy)."""
    root = tmp_path_factory.mktemp(f"job-{request.param}")
    return request.param, write_job(request.param, str(root))


@pytest.fixture
def copy(job, tmp_path):
    """A private copy of the job directory: ``(writer, job directory)``."""
    writer, source = job
    target = tmp_path / "job"
    shutil.copytree(source, target, symlinks=True)
    return writer, str(target)
