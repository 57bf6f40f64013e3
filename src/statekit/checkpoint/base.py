"""The checkpoint storage ABC (PyFlink's ``CheckpointStorage``) and :class:`CustomCheckpointStorage`.

A storage is a small picklable configuration; :meth:`CheckpointStorage.create_access` gives the
:class:`~statekit.checkpoint.layout.CheckpointStorageAccess` of one job's checkpoints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.configurable import Configurable
from statekit.errors import ConfigError


def strip_path(path: str | None) -> str | None:
    """``path`` without trailing slashes (a lone ``/`` stays), or None."""
    if path is None:
        return None
    path = str(path)
    return path.rstrip("/") if path.rstrip("/") else path


class CheckpointStorage(Configurable, ABC):
    """Where checkpoints of a job go; a small picklable configuration.

    Built from flat keys by :meth:`from_config` (``state.checkpoint-storage`` names the class in
    the registry) and configured by :meth:`configure`, which returns a configured copy.
    """

    name = "custom"

    @abstractmethod
    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        """The access object for one job's checkpoints."""

    @abstractmethod
    def get_savepoint_path(self) -> str | None:
        """Default directory for savepoints, or None."""

    def check_writable(self) -> None:
        """ConfigError if checkpoints certainly cannot be written here (a job checks before it
        starts; nothing to check by default)."""


class CustomCheckpointStorage(CheckpointStorage):
    """Wraps a user-provided :class:`CheckpointStorage` instance (PyFlink's ``CustomCheckpointStorage``)."""

    def __init__(self, storage: CheckpointStorage) -> None:
        if not isinstance(storage, CheckpointStorage):
            raise ConfigError("state.checkpoint-storage",
                              f"expected a CheckpointStorage, got {type(storage).__name__}")
        self.storage = storage
        self.name = storage.name

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CheckpointStorage:
        """Configuration names the wrapped storage itself (``state.checkpoint-storage`` takes a
        class path), so this wrapper is only built in code."""
        raise ConfigError("state.checkpoint-storage", "CustomCheckpointStorage wraps a storage "
                          "given in code; name the storage's class (a dotted path) instead")

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        return self.storage.create_access(job_id)

    def check_writable(self) -> None:
        self.storage.check_writable()

    def get_savepoint_path(self) -> str | None:
        return self.storage.get_savepoint_path()

