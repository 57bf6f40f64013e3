"""The RocksDB backend through the shared conformance suite and the hypothesis model test.

Every conformance case runs with full, incremental and changelog checkpoints, over every
storage of the suite.  The model test covers both storages and both modes on the default run (JobManager +
incremental, file system + full); the other two combinations are marked slow.
"""

import tempfile

import pytest

from statekit import workdirs
from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.testing.conformance import BackendConformance
from statekit.testing.conformance.storage import STORAGE_KINDS, make_storage
from statekit.testing.stateful import model_test
from tests.tmpfs import rocksdb_dir

# tmpfs where available: RocksDB fsyncs on every open, which dominates test time on slow disks
SHM = rocksdb_dir()


def rocks(incremental=None, threads=1):
    backend = EmbeddedRocksDBStateBackend(incremental)
    backend.set_number_of_transfering_threads(threads)
    if SHM:
        backend.set_db_storage_paths(SHM)
    return backend


class TestRocksDBFull(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return rocks()


class TestRocksDBIncremental(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return rocks(True, threads=2)


def _changelog():
    """Changelog checkpoints whose next materialization is always on its way (1 ms)."""
    return rocks(True).configure({"state.changelog.enabled": True,
                                  "state.changelog.periodic-materialize.interval": "1 ms"})


class TestRocksDBChangelog(BackendConformance):
    """Changelog checkpoints: the write-ahead log on top of a materialization (file storage in
    the default run; the storages behave alike for every backend above)."""

    @pytest.fixture
    def state_backend(self):
        return _changelog()

    @pytest.fixture(params=[k if k == "filesystem" else pytest.param(k, marks=pytest.mark.heavy)
                            for k in STORAGE_KINDS])
    def checkpoint_storage(self, request, tmp_path):
        return make_storage(request.param, tmp_path)


def _fs_storage():
    return FileSystemCheckpointStorage(str(workdirs.create(tempfile.gettempdir(), "statekit-rocks-model-")),
                                       file_state_size_threshold=128)


def _threaded(incremental):
    return lambda: rocks(incremental, threads=2)


TestRocksDBModelJobManagerIncremental = model_test(
    _threaded(True), JobManagerCheckpointStorage, max_examples=25)
TestRocksDBModelFilesystemFull = model_test(
    rocks, _fs_storage, max_examples=10)
TestRocksDBModelChangelog = model_test(_changelog, _fs_storage, max_examples=10)
TestRocksDBModelJobManagerFull = pytest.mark.slow(
    model_test(rocks, JobManagerCheckpointStorage, max_examples=25))
TestRocksDBModelFilesystemIncremental = pytest.mark.slow(
    model_test(_threaded(True), _fs_storage, max_examples=10))
