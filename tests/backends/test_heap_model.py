"""Hypothesis: the heap backend against a dict model, over both storages."""

import tempfile

from statekit import workdirs
from statekit.backends.heap import HashMapStateBackend
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.testing.stateful import model_test

TestHeapJobManager = model_test(HashMapStateBackend, JobManagerCheckpointStorage)
TestHeapFilesystem = model_test(
    lambda: HashMapStateBackend(using_asynchronous_snapshots=False),
    lambda: FileSystemCheckpointStorage(str(workdirs.create(tempfile.gettempdir(), "statekit-model-")),
                                        file_state_size_threshold=128),
)
