"""File system checkpoint storage: checkpoints as files on any fsspec file system (local paths,
``file://``, ``memory://``, ``s3://``), small chunks inlined into ``_metadata``."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from statekit import config as cfg
from statekit.checkpoint.base import CheckpointStorage, strip_path
from statekit.checkpoint.blobstore.fsspec import FsspecBlobStore, blob_store_for
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.blobstore.retry import RetryPolicy
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.configurable import Setting, apply_settings
from statekit.errors import ConfigError
from statekit.values import checked_int

THRESHOLD_KEY = "state.storage.fs.memory-threshold"
WRITE_BUFFER_KEY = "state.storage.fs.write-buffer-size"

#: the storage's flat keys (a setting made in code wins over them)
_SETTINGS = (Setting("multipart_threshold", ("state.storage.fs.multipart-threshold",)),)


def check_local_directory(url: str, key: str = "state.checkpoints.dir") -> None:
    """ConfigError (naming ``key``) unless statekit can keep checkpoints under the local path or
    ``file://`` URL ``url``: the directory, or the nearest existing one above it, must take a
    new file.  Other URLs are not checked (their stores report their own errors)."""
    if "://" in url and not url.startswith("file://"):
        return
    path = os.path.abspath(url[len("file://"):] if url.startswith("file://") else url)
    probe = path
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(key, f"{url}: {probe} is not a directory, so statekit cannot keep "
                               "checkpoints under it")
    try:
        fd, name = tempfile.mkstemp(prefix=".statekit-probe-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise ConfigError(key, f"{url}: statekit cannot write in {probe} ({exc.strerror or exc})"
                          ) from None


class FileSystemCheckpointStorage(CheckpointStorage):
    """Checkpoints as files on any fsspec file system (local paths, ``file://``, ``memory://``, ``s3://``).

    Chunks under ``file_state_size_threshold`` bytes (default 20 KiB, at most 1 MiB) are inlined
    into ``_metadata`` rather than written as small files.
    """

    name = "filesystem"
    DEFAULT_FILE_STATE_THRESHOLD: int = cfg.default(THRESHOLD_KEY)
    MAX_FILE_STATE_THRESHOLD = 1024 * 1024
    DEFAULT_WRITE_BUFFER_SIZE: int = cfg.default(WRITE_BUFFER_KEY)

    def __init__(self, checkpoint_path: str, file_state_size_threshold: int | None = None,
                 write_buffer_size: int | None = None, savepoint_path: str | None = None,
                 storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy | None = None, multipart_threshold: int | None = None) -> None:
        if not checkpoint_path:
            raise ConfigError("state.checkpoints.dir", "FileSystemCheckpointStorage needs a path")
        threshold = (self.DEFAULT_FILE_STATE_THRESHOLD if file_state_size_threshold in (None, -1)
                     else checked_int(THRESHOLD_KEY, file_state_size_threshold, 0))
        if not 0 <= threshold <= self.MAX_FILE_STATE_THRESHOLD:
            raise ConfigError(
                "execution.checkpointing.data-inline-threshold",
                f"{threshold} must be between 0 and {self.MAX_FILE_STATE_THRESHOLD} bytes",
            )
        buffer = (self.DEFAULT_WRITE_BUFFER_SIZE if write_buffer_size in (None, -1)
                  else checked_int(WRITE_BUFFER_KEY, write_buffer_size, 0))
        if buffer < 0:
            raise ConfigError("execution.checkpointing.write-buffer-size", "must not be negative")
        self._checkpoint_path = strip_path(checkpoint_path)
        self._savepoint_path = strip_path(savepoint_path)
        self._threshold = threshold
        self._write_buffer_size = buffer
        self.storage_options = dict(storage_options or {})
        self._retry_given = retry  # None: not set in code, the flat keys decide
        self.retry = retry or RetryPolicy()
        self.multipart_threshold = multipart_threshold

    def check_writable(self) -> None:
        """ConfigError unless a local checkpoint directory can take files (see
        :func:`check_local_directory`): a job checks it before it starts."""
        check_local_directory(self._checkpoint_path)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FileSystemCheckpointStorage:
        """``state.checkpoint-storage: filesystem``, the default when ``state.checkpoints.dir``
        is set (which it needs); inline threshold and write buffer from their keys."""
        directory = config.get("state.checkpoints.dir")
        if not directory:
            raise ConfigError("state.checkpoint-storage",
                              "'filesystem' needs state.checkpoints.dir to be set")
        return cls(str(directory), cfg.read(config, THRESHOLD_KEY), cfg.read(config, WRITE_BUFFER_KEY),
                   savepoint_path=config.get("state.savepoints.dir")).configure(dict(config))

    def configure(self, config: dict[str, Any]) -> FileSystemCheckpointStorage:
        """A copy with flat keys applied: retries (``state.storage.fs.retries``, ``.retry-backoff``,
        ``.retry-max-backoff``), ``state.storage.fs.multipart-threshold`` and, for ``s3://``
        paths, Flink's ``s3.endpoint`` / ``s3.access-key`` / ``s3.secret-key`` /
        ``s3.path.style.access`` (otherwise the usual AWS environment and config files apply).
        Settings made in code win over keys."""
        new = copy.copy(self)
        if self._retry_given is None and any(k.startswith("state.storage.fs.retr") for k in config):
            new.retry = RetryPolicy.from_config(config)
        apply_settings(_SETTINGS, self, new, config)
        if str(self._checkpoint_path).startswith(("s3://", "s3a://")):
            new.storage_options = {**s3_options_from_config(config), **self.storage_options}
        return new

    def store_for(self, root: str) -> LocalBlobStore | FsspecBlobStore:
        """A blob store under ``root`` with this storage's options, retries and multipart size."""
        return blob_store_for(root, self.storage_options, retry=self.retry,
                              multipart_threshold=self.multipart_threshold)

    def get_checkpoint_path(self) -> str:
        return self._checkpoint_path  # type: ignore[return-value]

    def get_savepoint_path(self) -> str | None:
        return self._savepoint_path

    def get_min_file_size_threshold(self) -> int:
        return self._threshold

    def get_write_buffer_size(self) -> int:
        """The write buffer size as configured (Flink's getter returns it as set and applies
        ``max(buffer, inline threshold)`` only where it creates a stream)."""
        return self._write_buffer_size

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        location = f"{self._checkpoint_path}/{job_id}"
        return CheckpointStorageAccess(self.store_for(location), location, self._threshold)

    def __repr__(self) -> str:
        return (f"FileSystemCheckpointStorage(checkpoint_path={self._checkpoint_path!r}, "
                f"file_state_size_threshold={self._threshold})")


def s3_options_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """s3fs options from Flink's ``s3.*`` keys (only those present)."""
    options: dict[str, Any] = {}
    if config.get("s3.endpoint"):
        options["endpoint_url"] = str(config["s3.endpoint"])
    if config.get("s3.access-key"):
        options["key"] = str(config["s3.access-key"])
    if config.get("s3.secret-key"):
        options["secret"] = str(config["s3.secret-key"])
    if str(config.get("s3.path.style.access", "")).lower() == "true":
        options["config_kwargs"] = {"s3": {"addressing_style": "path"}}
    return options
