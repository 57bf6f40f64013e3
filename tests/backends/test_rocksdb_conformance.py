"""The RocksDB backend through the shared conformance suite and the hypothesis model test."""

import tempfile

import pytest

from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
from statekit.checkpoint.storage import FileSystemCheckpointStorage, JobManagerCheckpointStorage
from statekit.testing.conformance import BackendConformance
from statekit.testing.stateful import model_test


class TestRocksDBFull(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend()


class TestRocksDBIncremental(BackendConformance):
    @pytest.fixture
    def state_backend(self):
        return EmbeddedRocksDBStateBackend(enable_incremental_checkpointing=True)


TestRocksDBModelJobManagerIncremental = model_test(
    lambda: EmbeddedRocksDBStateBackend(True), JobManagerCheckpointStorage, max_examples=10)
TestRocksDBModelFilesystemFull = model_test(
    EmbeddedRocksDBStateBackend,
    lambda: FileSystemCheckpointStorage(tempfile.mkdtemp(prefix="statekit-rocks-model-"),
                                        file_state_size_threshold=128),
    max_examples=10,
)
TestRocksDBModelFilesystemIncremental = model_test(
    lambda: EmbeddedRocksDBStateBackend(True),
    lambda: FileSystemCheckpointStorage(tempfile.mkdtemp(prefix="statekit-rocks-model-"),
                                        file_state_size_threshold=128),
    max_examples=10,
)
