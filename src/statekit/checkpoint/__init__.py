"""Where snapshots go: checkpoint settings, storages, the job layout, streams and blob stores.

This layer knows nothing of backends or state: a backend writes its snapshot through
:class:`CheckpointStreams` and reads it back through :class:`StateReader`.
"""

from statekit.checkpoint.base import CheckpointStorage, CustomCheckpointStorage
from statekit.checkpoint.blobstore import (
    BlobStore,
    FsspecBlobStore,
    LocalBlobStore,
    MemoryBlobStore,
    RetryPolicy,
    blob_store_for,
)
from statekit.checkpoint.config import (
    CheckpointConfig,
    CheckpointingMode,
    ExternalizedCheckpointCleanup,
)
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.savepoint import Savepoint, open_external
from statekit.checkpoint.streams import CheckpointStreams

__all__ = [
    "BlobStore",
    "CheckpointConfig",
    "CheckpointStorage",
    "CheckpointStorageAccess",
    "CheckpointStreams",
    "CheckpointingMode",
    "CustomCheckpointStorage",
    "ExternalizedCheckpointCleanup",
    "FileSystemCheckpointStorage",
    "FsspecBlobStore",
    "JobManagerCheckpointStorage",
    "LocalBlobStore",
    "MemoryBlobStore",
    "RetryPolicy",
    "Savepoint",
    "StateReader",
    "blob_store_for",
    "open_external",
]
