"""Checkpoint storage: where snapshots go (PyFlink's ``CheckpointStorage`` classes) and the layout.

The names are kept importable from here (the registry's built-in names and the entry points
point at this module); they live in :mod:`~statekit.checkpoint.base` (the ABC and the custom
storage), :mod:`~statekit.checkpoint.jobmanager`, :mod:`~statekit.checkpoint.filesystem`,
:mod:`~statekit.checkpoint.layout` and :mod:`~statekit.checkpoint.savepoint`.
"""

from statekit.checkpoint.base import CheckpointStorage, CustomCheckpointStorage
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage, s3_options_from_config
from statekit.checkpoint.handles import verify_body
from statekit.checkpoint.jobmanager import INLINE_ALL, JobManagerCheckpointStorage
from statekit.checkpoint.layout import (
    JOBMANAGER_SCHEME,
    METADATA,
    RECOVER_FROM_OLDER_KEY,
    CheckpointStorageAccess,
)
from statekit.checkpoint.savepoint import Savepoint, open_external

_INLINE_ALL = INLINE_ALL  # the earlier private name, still imported by the Spark driver storage

__all__ = [
    "INLINE_ALL",
    "JOBMANAGER_SCHEME",
    "METADATA",
    "RECOVER_FROM_OLDER_KEY",
    "CheckpointStorage",
    "CheckpointStorageAccess",
    "CustomCheckpointStorage",
    "FileSystemCheckpointStorage",
    "JobManagerCheckpointStorage",
    "Savepoint",
    "open_external",
    "s3_options_from_config",
    "verify_body",
]
