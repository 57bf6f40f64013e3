"""JobManager checkpoint storage: checkpoints in the memory of the coordinating process, with
Flink's size limit per state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from statekit import config as cfg
from statekit.checkpoint.base import CheckpointStorage, strip_path
from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.checkpoint.layout import JOBMANAGER_SCHEME, CheckpointStorageAccess
from statekit.values import checked_int

MAX_STATE_SIZE_KEY = "state.checkpoint-storage.jobmanager.max-state-size"

#: an inline threshold no chunk reaches: JobManager storage keeps every chunk in the metadata
INLINE_ALL = 1 << 62


class JobManagerCheckpointStorage(CheckpointStorage):
    """Checkpoints in the memory of the coordinating process (the JobManager, or Spark's driver).

    Each state must stay under ``max_state_size`` (5 MiB by default).  With a
    ``checkpoint_path``, checkpoint metadata (holding the state inline) is also persisted there.
    """

    name = "jobmanager"
    DEFAULT_MAX_STATE_SIZE: int = cfg.default(MAX_STATE_SIZE_KEY)

    def __init__(self, checkpoint_path: str | None = None, max_state_size: int | None = None) -> None:
        self._checkpoint_path = strip_path(checkpoint_path)
        self._max_state_size = (self.DEFAULT_MAX_STATE_SIZE if max_state_size is None
                                else checked_int(MAX_STATE_SIZE_KEY, max_state_size, 1))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> JobManagerCheckpointStorage:
        """``state.checkpoint-storage: jobmanager``, the default without a checkpoint directory;
        with ``state.checkpoints.dir`` the metadata is also persisted there."""
        return cls(config.get("state.checkpoints.dir"),
                   cfg.read(config, MAX_STATE_SIZE_KEY)).configure(dict(config))

    def get_max_state_size(self) -> int:
        return self._max_state_size

    def get_checkpoint_path(self) -> str | None:
        return self._checkpoint_path

    def get_savepoint_path(self) -> str | None:
        return self._checkpoint_path

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        if self._checkpoint_path is not None:
            location = f"{self._checkpoint_path}/{job_id}"
            store: BlobStore = blob_store_for(location)
        else:
            location = f"{JOBMANAGER_SCHEME}{job_id}"
            store = MemoryBlobStore.named(job_id)
        return CheckpointStorageAccess(store, location, INLINE_ALL, self._max_state_size)

    def __repr__(self) -> str:
        return (f"JobManagerCheckpointStorage(checkpoint_path={self._checkpoint_path!r}, "
                f"max_state_size={self._max_state_size})")
