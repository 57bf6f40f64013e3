"""Hypothesis: the heap backend against a dict model, over both storages."""

import tempfile

from statekit.backends.heap import HashMapStateBackend
from statekit.checkpoint.storage import FileSystemCheckpointStorage, JobManagerCheckpointStorage
from statekit.testing.stateful import model_test

# every example's checkpoint directory lives under one directory, removed when the run ends
_ROOT = tempfile.TemporaryDirectory(prefix="statekit-model-")

TestHeapJobManager = model_test(HashMapStateBackend, JobManagerCheckpointStorage)
TestHeapFilesystem = model_test(
    lambda: HashMapStateBackend(using_asynchronous_snapshots=False),
    lambda: FileSystemCheckpointStorage(tempfile.mkdtemp(dir=_ROOT.name),
                                        file_state_size_threshold=128),
)
