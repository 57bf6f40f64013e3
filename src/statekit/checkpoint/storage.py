"""Checkpoint storage: where snapshots go (PyFlink's ``CheckpointStorage`` classes) and the layout.

``<root>/<job_id>/chk-<n>/_metadata`` is written last and makes checkpoint ``n`` complete;
``shared/`` holds files several checkpoints reference; a savepoint is one self-contained
directory.  JobManager storage keeps everything inline in memory with Flink's size limit.
"""

from __future__ import annotations

import logging
import posixpath
import re
import uuid
from abc import ABC, abstractmethod
from typing import Any

from statekit import values as cfg
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.retry import RetryPolicy
from statekit.checkpoint.store import BlobStore, FsspecBlobStore, MemoryBlobStore
from statekit.checkpoint.streams import SHARED_PREFIX, CheckpointStreams, StateReader, file_paths
from statekit.errors import CheckpointNotFoundError, ConfigError, CorruptCheckpointError

log = logging.getLogger("statekit.checkpoint")

#: flat key: when the newest checkpoint is damaged, restore the newest older one that is intact
RECOVER_FROM_OLDER_KEY = "execution.checkpointing.recover-from-older-on-corruption"

METADATA = "_metadata"
_CHK = re.compile(r"^chk-(\d+)/")
JOBMANAGER_SCHEME = "jobmanager://"


def _strip(path: str | None) -> str | None:
    if path is None:
        return None
    path = str(path)
    return path.rstrip("/") if path.rstrip("/") else path


class CheckpointStorageAccess:
    """One job's checkpoints in one blob store: write, commit, list, load, discard, clean up."""

    def __init__(self, store: BlobStore, location: str, inline_threshold: int,
                 max_state_size: int | None = None) -> None:
        self.store = store
        self.location = location
        self.inline_threshold = inline_threshold
        self.max_state_size = max_state_size

    def streams(self, checkpoint_id: int, task_name: str) -> CheckpointStreams:
        return CheckpointStreams(
            self.store, f"chk-{checkpoint_id}/", task_name, self.inline_threshold,
            self.max_state_size,
        )

    def reader(self) -> StateReader:
        return StateReader(self.store)

    def commit(self, checkpoint_id: int, body: dict[str, Any]) -> str:
        """Write ``chk-<id>/_metadata`` last, atomically: from now on the checkpoint is complete."""
        body = {**body, "layout": "checkpoint", "checkpoint_id": checkpoint_id}
        self.store.put(f"chk-{checkpoint_id}/{METADATA}", encode_metadata(body))
        return self.checkpoint_path(checkpoint_id)

    def checkpoint_path(self, checkpoint_id: int) -> str:
        return f"{self.location}/chk-{checkpoint_id}"

    def completed(self) -> list[int]:
        """Ids of complete checkpoints (those whose ``_metadata`` exists), ascending."""
        ids = set()
        for key in self.store.list("chk-"):
            match = _CHK.match(key)
            if match and key == f"chk-{match.group(1)}/{METADATA}":
                ids.add(int(match.group(1)))
        return sorted(ids)

    def load(self, checkpoint_id: int) -> dict[str, Any]:
        key = f"chk-{checkpoint_id}/{METADATA}"
        return decode_metadata(self.store.get(key), f"{self.location}/{key}")

    def verify(self, checkpoint_id: int) -> dict[str, Any]:
        """The checkpoint's metadata after reading back every file it references (size, CRC,
        path safety); the typed :class:`CorruptCheckpointError` of the first problem otherwise."""
        body = self.load(checkpoint_id)
        verify_body(body, self.reader())
        return body

    def latest_valid(self, candidates: list[int] | None = None, fallback: bool = True
                     ) -> tuple[int, dict[str, Any]] | None:
        """The newest checkpoint (among ``candidates``, default: all complete ones) that verifies.

        With ``fallback`` a damaged checkpoint is skipped (and logged) in favour of an older one;
        without it the newest one's error is raised.  None when there is no checkpoint at all.
        """
        ids = sorted(self.completed() if candidates is None else candidates, reverse=True)
        first_error: Exception | None = None
        for cid in ids:
            try:
                return cid, self.verify(cid)
            except (CorruptCheckpointError, CheckpointNotFoundError) as exc:
                if not fallback:
                    raise
                first_error = first_error or exc
                log.warning("checkpoint %d at %s is unusable (%s); trying an older one",
                            cid, self.location, exc)
        if first_error is not None:
            raise first_error
        return None

    def discard(self, checkpoint_id: int, retained: list[int]) -> None:
        """Delete a checkpoint and every shared file no retained checkpoint still references."""
        try:
            doomed = file_paths(self.load(checkpoint_id))
        except (CheckpointNotFoundError, ValueError):
            doomed = set()
        self.store.delete(f"chk-{checkpoint_id}/{METADATA}")
        self.store.delete_prefix(f"chk-{checkpoint_id}/")
        self._sweep_shared({p for p in doomed if p.startswith(SHARED_PREFIX)}, retained)

    def abort(self, checkpoint_id: int, written: list[str], retained: list[int]) -> None:
        """Remove what an unfinished checkpoint wrote; shared files only if nothing uses them."""
        self.store.delete_prefix(f"chk-{checkpoint_id}/")
        self._sweep_shared({p for p in written if p.startswith(SHARED_PREFIX)}, retained)

    def _sweep_shared(self, candidates: set[str], retained: list[int]) -> None:
        if not candidates:
            return
        in_use: set[str] = set()
        for cid in retained:
            try:
                in_use |= file_paths(self.load(cid))
            except CheckpointNotFoundError:
                continue
        for path in candidates - in_use:
            self.store.delete(path)

    def cleanup_orphans(self, in_flight: set[str] | None = None, temporary: bool = True) -> list[str]:
        """Delete files of checkpoints that never completed and shared files nothing references.

        ``in_flight`` names files of checkpoints still being written, which must survive;
        ``temporary`` also deletes temp files of interrupted local writes (only safe while no
        writer is active, e.g. at job start after a crash).
        """
        completed = self.completed()
        referenced: set[str] = set(in_flight or ())
        for cid in completed:
            referenced |= file_paths(self.load(cid))
        removed = []
        done = {f"chk-{c}/" for c in completed}
        for key in self.store.list():
            match = _CHK.match(key)
            orphan_chk = match is not None and f"chk-{match.group(1)}/" not in done
            if (orphan_chk or key.startswith(SHARED_PREFIX)) and key not in referenced:
                removed.append(key)
        if temporary:
            removed += self.store.list_temporary()
        for key in removed:
            self.store.delete(key)
        return removed

    def delete_all(self) -> None:
        self.store.delete_prefix("")


def verify_body(body: dict[str, Any], reader: StateReader) -> None:
    """Read back every file handle in a metadata body, checking path, size and checksum."""
    stack: list[Any] = [body]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") == "file":
                reader.read(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class CheckpointStorage(ABC):
    """Where checkpoints of a job go; a small picklable configuration."""

    name = "custom"

    @abstractmethod
    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        """The access object for one job's checkpoints."""

    @abstractmethod
    def get_savepoint_path(self) -> str | None:
        """Default directory for savepoints, or None."""

    def configure(self, config: dict[str, Any]) -> CheckpointStorage:
        return self


class JobManagerCheckpointStorage(CheckpointStorage):
    """Checkpoints in the memory of the coordinating process (the JobManager, or Spark's driver).

    Each state must stay under ``max_state_size`` (5 MiB by default).  With a
    ``checkpoint_path``, checkpoint metadata (holding the state inline) is also persisted there.
    """

    name = "jobmanager"
    DEFAULT_MAX_STATE_SIZE = 5 * 1024 * 1024

    def __init__(self, checkpoint_path: str | None = None, max_state_size: int | None = None) -> None:
        if max_state_size is not None and max_state_size <= 0:
            raise ConfigError("max_state_size", "must be positive")
        self._checkpoint_path = _strip(checkpoint_path)
        self._max_state_size = max_state_size or self.DEFAULT_MAX_STATE_SIZE

    def get_max_state_size(self) -> int:
        return self._max_state_size

    def get_checkpoint_path(self) -> str | None:
        return self._checkpoint_path

    def get_savepoint_path(self) -> str | None:
        return self._checkpoint_path

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        if self._checkpoint_path is not None:
            location = f"{self._checkpoint_path}/{job_id}"
            store: BlobStore = FsspecBlobStore(location)
        else:
            location = f"{JOBMANAGER_SCHEME}{job_id}"
            store = MemoryBlobStore.named(job_id)
        return CheckpointStorageAccess(store, location, _INLINE_ALL, self._max_state_size)

    def __repr__(self) -> str:
        return (f"JobManagerCheckpointStorage(checkpoint_path={self._checkpoint_path!r}, "
                f"max_state_size={self._max_state_size})")


_INLINE_ALL = 1 << 62


class FileSystemCheckpointStorage(CheckpointStorage):
    """Checkpoints as files on any fsspec file system (local paths, ``file://``, ``memory://``, ``s3://``).

    Chunks under ``file_state_size_threshold`` bytes (default 20 KiB, at most 1 MiB) are inlined
    into ``_metadata`` rather than written as small files.
    """

    name = "filesystem"
    DEFAULT_FILE_STATE_THRESHOLD = 20 * 1024
    MAX_FILE_STATE_THRESHOLD = 1024 * 1024
    DEFAULT_WRITE_BUFFER_SIZE = 4096

    def __init__(self, checkpoint_path: str, file_state_size_threshold: int | None = None,
                 write_buffer_size: int | None = None, savepoint_path: str | None = None,
                 storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy | None = None, multipart_threshold: int | None = None) -> None:
        if not checkpoint_path:
            raise ConfigError("state.checkpoints.dir", "FileSystemCheckpointStorage needs a path")
        threshold = (self.DEFAULT_FILE_STATE_THRESHOLD if file_state_size_threshold in (None, -1)
                     else int(file_state_size_threshold))  # type: ignore[arg-type]
        if not 0 <= threshold <= self.MAX_FILE_STATE_THRESHOLD:
            raise ConfigError(
                "execution.checkpointing.data-inline-threshold",
                f"{threshold} must be between 0 and {self.MAX_FILE_STATE_THRESHOLD} bytes",
            )
        buffer = (self.DEFAULT_WRITE_BUFFER_SIZE if write_buffer_size in (None, -1)
                  else int(write_buffer_size))  # type: ignore[arg-type]
        if buffer < 0:
            raise ConfigError("execution.checkpointing.write-buffer-size", "must not be negative")
        self._checkpoint_path = _strip(checkpoint_path)
        self._savepoint_path = _strip(savepoint_path)
        self._threshold = threshold
        self._write_buffer_size = buffer
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.multipart_threshold = multipart_threshold

    def configure(self, config: dict[str, Any]) -> FileSystemCheckpointStorage:
        """Apply flat keys: retries (``state.storage.fs.retries``, ``.retry-backoff``,
        ``.retry-max-backoff``), ``state.storage.fs.multipart-threshold`` and, for ``s3://``
        paths, Flink's ``s3.endpoint`` / ``s3.access-key`` / ``s3.secret-key`` /
        ``s3.path.style.access`` (otherwise the usual AWS environment and config files apply)."""

        if any(k.startswith("state.storage.fs.retr") for k in config):
            self.retry = RetryPolicy.from_config(config)
        threshold = cfg.get(config, "state.storage.fs.multipart-threshold", cfg.parse_size)
        if threshold is not None:
            self.multipart_threshold = threshold
        if str(self._checkpoint_path).startswith(("s3://", "s3a://")):
            self.storage_options = {**s3_options_from_config(config), **self.storage_options}
        return self

    def store_for(self, root: str) -> FsspecBlobStore:
        """A blob store under ``root`` with this storage's options, retries and multipart size."""
        return FsspecBlobStore(root, self.storage_options, retry=self.retry,
                               multipart_threshold=self.multipart_threshold)

    def get_checkpoint_path(self) -> str:
        return self._checkpoint_path  # type: ignore[return-value]

    def get_savepoint_path(self) -> str | None:
        return self._savepoint_path

    def get_min_file_size_threshold(self) -> int:
        return self._threshold

    def get_write_buffer_size(self) -> int:
        """Write buffer of checkpoint streams: max(configured buffer, inline threshold), as Flink."""
        return max(self._write_buffer_size, self._threshold)

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


class CustomCheckpointStorage(CheckpointStorage):
    """Wraps a user-provided :class:`CheckpointStorage` instance (PyFlink's ``CustomCheckpointStorage``)."""

    def __init__(self, storage: CheckpointStorage) -> None:
        if not isinstance(storage, CheckpointStorage):
            raise ConfigError("state.checkpoint-storage",
                              f"expected a CheckpointStorage, got {type(storage).__name__}")
        self.storage = storage
        self.name = storage.name

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        return self.storage.create_access(job_id)

    def get_savepoint_path(self) -> str | None:
        return self.storage.get_savepoint_path()


# --- savepoints and restoring from a path ---------------------------------------------------------


class Savepoint:
    """A self-contained savepoint directory being written (``savepoint-<job>-<id>/``)."""

    def __init__(self, target_dir: str, job_id: str,
                 storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
                 ) -> None:
        name = f"savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}"
        self.path = f"{target_dir.rstrip('/')}/{name}"
        self.store = FsspecBlobStore(self.path, storage_options, retry=retry)

    def streams(self, task_name: str, inline_threshold: int) -> CheckpointStreams:
        return CheckpointStreams(self.store, "", task_name, inline_threshold, allow_shared=False)

    def commit(self, body: dict[str, Any]) -> str:
        self.store.put(METADATA, encode_metadata({**body, "layout": "savepoint"}))
        return self.path


def open_external(path: str, storage_options: dict[str, Any] | None = None,
                  retry: RetryPolicy | None = None, fallback_to_older: bool = False
                  ) -> tuple[dict[str, Any], StateReader]:
    """Metadata and a reader for a retained checkpoint or savepoint named by its path.

    ``path`` may also name a job's checkpoint directory (holding ``chk-<n>/``): its newest
    complete checkpoint is used.  With ``fallback_to_older``, a damaged checkpoint (metadata or
    any state file) is skipped for the newest older intact one in the same job directory.
    """
    path = path.rstrip("/")
    if path.endswith("/" + METADATA):
        path = path[: -len(METADATA) - 1]
    if not path.startswith(JOBMANAGER_SCHEME):
        chk = re.fullmatch(r"chk-(\d+)", posixpath.basename(path))
        job_dir = posixpath.dirname(path) if chk else path
        access = CheckpointStorageAccess(FsspecBlobStore(job_dir, storage_options, retry=retry),
                                         job_dir, 0)
        if chk or (not access.store.exists(METADATA) and access.completed()):
            newest = int(chk.group(1)) if chk else max(access.completed())
            if fallback_to_older:
                candidates = [c for c in access.completed() if c <= newest]
                found = access.latest_valid(candidates, fallback=True)
                if found is None:
                    raise CheckpointNotFoundError(f"no complete checkpoint at {path}")
                return found[1], access.reader()
            if not chk:
                path = f"{job_dir}/chk-{newest}"
    return _open_one(path, storage_options, retry)


def _open_one(path: str, storage_options: dict[str, Any] | None, retry: RetryPolicy | None
              ) -> tuple[dict[str, Any], StateReader]:
    if path.endswith("/" + METADATA):
        path = path[: -len(METADATA) - 1]
    if path.startswith(JOBMANAGER_SCHEME):
        job_id, _, chk = path[len(JOBMANAGER_SCHEME):].partition("/")
        store: BlobStore = MemoryBlobStore.named(job_id)
        key = f"{chk}/{METADATA}"
    elif re.fullmatch(r"chk-\d+", posixpath.basename(path)):
        store = FsspecBlobStore(posixpath.dirname(path), storage_options, retry=retry)
        key = f"{posixpath.basename(path)}/{METADATA}"
    else:
        store = FsspecBlobStore(path, storage_options, retry=retry)
        key = METADATA
    if not store.exists(key):
        raise CheckpointNotFoundError(f"no checkpoint or savepoint metadata at {path}")
    return decode_metadata(store.get(key), f"{path}/{METADATA}"), StateReader(store)
