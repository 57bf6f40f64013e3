"""PyFlink's pre-1.13 backend facades: a working-state backend bundled with checkpoint storage.

``MemoryStateBackend`` = heap + JobManager storage, ``FsStateBackend`` = heap + file system
storage (``RocksDBStateBackend`` lives with the RocksDB backend), and ``CustomStateBackend``
wraps a user class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from statekit import config as cfg
from statekit.backends.base import KeyedStateBackend, StateBackend
from statekit.backends.heap import HashMapStateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import ConfigError
from statekit.registry import backend_registry
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import TypeSerializer


class MemoryStateBackend(HashMapStateBackend):
    """Heap state with checkpoints in the JobManager's memory (5 MiB per state by default)."""

    DEFAULT_MAX_STATE_SIZE = JobManagerCheckpointStorage.DEFAULT_MAX_STATE_SIZE

    def __init__(self, checkpoint_path: str | None = None, savepoint_path: str | None = None,
                 max_state_size: int | None = None,
                 using_asynchronous_snapshots: bool | None = None) -> None:
        super().__init__(using_asynchronous_snapshots)
        self._storage = JobManagerCheckpointStorage(checkpoint_path, max_state_size)
        self._savepoint_path = savepoint_path.rstrip("/") if savepoint_path else None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MemoryStateBackend:
        """``state.backend.type: jobmanager`` (Flink's legacy name): heap state, checkpoints in
        memory (their metadata also under ``state.checkpoints.dir`` when it is set)."""
        return cls(config.get("state.checkpoints.dir"), config.get("state.savepoints.dir"),
                   cfg.get(config, "state.checkpoint-storage.jobmanager.max-state-size",
                           cfg.parse_size)).configure(dict(config))

    def get_max_state_size(self) -> int:
        return self._storage.get_max_state_size()

    def get_checkpoint_path(self) -> str | None:
        return self._storage.get_checkpoint_path()

    def get_savepoint_path(self) -> str | None:
        return self._savepoint_path or self._storage.get_savepoint_path()

    def default_checkpoint_storage(self) -> CheckpointStorage:
        return self._storage

    def __repr__(self) -> str:
        return f"MemoryStateBackend(max_state_size={self.get_max_state_size()})"


class FsStateBackend(HashMapStateBackend):
    """Heap state with checkpoints as files (state under 1 KiB inlined into the metadata)."""

    DEFAULT_FILE_STATE_THRESHOLD = 1024

    def __init__(self, checkpoint_directory_uri: str,
                 default_savepoint_directory_uri: str | None = None,
                 file_state_size_threshold: int | None = None,
                 write_buffer_size: int | None = None,
                 using_asynchronous_snapshots: bool | None = None) -> None:
        super().__init__(using_asynchronous_snapshots)
        if not checkpoint_directory_uri:
            raise ConfigError("state.checkpoints.dir", "FsStateBackend needs a checkpoint directory")
        threshold = (self.DEFAULT_FILE_STATE_THRESHOLD if file_state_size_threshold in (None, -1)
                     else file_state_size_threshold)
        self._storage = FileSystemCheckpointStorage(
            checkpoint_directory_uri, threshold, write_buffer_size,
            savepoint_path=default_savepoint_directory_uri,
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FsStateBackend:
        """``state.backend.type: filesystem`` (Flink's legacy name): heap state, checkpoints as
        files under ``state.checkpoints.dir``, which it needs."""
        if not config.get("state.checkpoints.dir"):
            raise ConfigError("state.backend.type",
                              "'filesystem' needs state.checkpoints.dir to be set")
        return cls(str(config["state.checkpoints.dir"]),
                   config.get("state.savepoints.dir")).configure(dict(config))

    def get_checkpoint_path(self) -> str:
        return self._storage.get_checkpoint_path()

    def get_savepoint_path(self) -> str | None:
        return self._storage.get_savepoint_path()

    def get_min_file_size_threshold(self) -> int:
        return self._storage.get_min_file_size_threshold()

    def get_write_buffer_size(self) -> int:
        return self._storage.get_write_buffer_size()

    def default_checkpoint_storage(self) -> CheckpointStorage:
        return self._storage

    def __repr__(self) -> str:
        return f"FsStateBackend({self.get_checkpoint_path()!r})"


class CustomStateBackend(StateBackend):
    """A user-defined backend: a :class:`StateBackend` instance, class, or dotted class path."""

    def __init__(self, backend: StateBackend | type | str) -> None:
        if isinstance(backend, str):
            backend = backend_registry.resolve(backend)
        if isinstance(backend, type):
            backend = backend()
        if not isinstance(backend, StateBackend):
            raise ConfigError("state.backend.type",
                              f"{type(backend).__name__} is not a statekit StateBackend")
        super().__init__(backend.is_using_asynchronous_snapshots())
        self.backend = backend
        self.name = backend.name

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> StateBackend:
        """Configuration names the wrapped backend itself (``state.backend.type`` takes a class
        path), so this wrapper is only built in code."""
        raise ConfigError("state.backend.type", "CustomStateBackend wraps a backend given in "
                          "code; name the backend's class (a dotted path) instead")

    def default_checkpoint_storage(self) -> CheckpointStorage | None:
        return self.backend.default_checkpoint_storage()

    def configure(self, config: dict[str, Any]) -> StateBackend:
        return CustomStateBackend(self.backend.configure(config))

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None) -> KeyedStateBackend:
        return self.backend.create_keyed_state_backend(
            key_serializer=key_serializer, key_group_range=key_group_range,
            max_parallelism=max_parallelism, operator_id=operator_id, clock=clock,
        )
