"""Savepoints and restoring from a path: a self-contained savepoint directory being written, and
:func:`open_external` for a retained checkpoint or savepoint named by its path."""

from __future__ import annotations

import posixpath
import uuid
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.checkpoint.blobstore.retry import RetryPolicy
from statekit.checkpoint.layout import CHK_NAME, JOBMANAGER_SCHEME, METADATA, CheckpointStorageAccess
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import CheckpointStreams
from statekit.errors import CheckpointNotFoundError


class Savepoint:
    """A self-contained savepoint directory being written (``savepoint-<job>-<id>/``)."""

    def __init__(self, target_dir: str, job_id: str,
                 storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
                 ) -> None:
        name = f"savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}"
        self.path = f"{target_dir.rstrip('/')}/{name}"
        self.store = blob_store_for(self.path, storage_options, retry=retry)

    def streams(self, task_name: str, inline_threshold: int) -> CheckpointStreams:
        return CheckpointStreams(self.store, "", task_name, inline_threshold, allow_shared=False)

    def commit(self, body: dict[str, Any]) -> str:
        self.store.put(METADATA, encode_metadata({**body, "layout": "savepoint"}))
        return self.path

    def abort(self) -> None:
        """Remove what a savepoint that will not be committed wrote (its directory is its own:
        a fresh name), so that no partial savepoint is left where nothing lists or sweeps it."""
        self.store.delete_prefix("")
        self.store.remove_if_empty()


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
        chk = CHK_NAME.fullmatch(posixpath.basename(path))
        job_dir = posixpath.dirname(path) if chk else path
        access = CheckpointStorageAccess(blob_store_for(job_dir, storage_options, retry=retry),
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
    chk = CHK_NAME.fullmatch(posixpath.basename(path))
    if path.startswith(JOBMANAGER_SCHEME):
        job_id, _, name = path[len(JOBMANAGER_SCHEME):].partition("/")
        store: BlobStore = MemoryBlobStore.named(job_id)
        key = f"{name}/{METADATA}"
    elif chk:
        store = blob_store_for(posixpath.dirname(path), storage_options, retry=retry)
        key = f"{posixpath.basename(path)}/{METADATA}"
    else:
        store = blob_store_for(path, storage_options, retry=retry)
        key = METADATA
    if not store.exists(key):
        raise CheckpointNotFoundError(f"no checkpoint or savepoint metadata at {path}")
    checkpoint_id = int(chk.group(1)) if chk else None  # the directory names the checkpoint
    return (decode_metadata(store.get(key), f"{path}/{METADATA}", checkpoint_id),
            StateReader(store))
