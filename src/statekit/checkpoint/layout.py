"""One job's checkpoints in one blob store: the directory layout, commit, listing, verification,
discard with mark-and-sweep of shared files, and orphan cleanup.

``<root>/<job_id>/chk-<n>/_metadata`` is written last and makes checkpoint ``n`` complete;
``shared/`` holds files several checkpoints reference.  Instead of a reference-count table that
can drift after a crash, discarding checkpoint ``n`` deletes the shared files ``n`` referenced
that no retained checkpoint's ``_metadata`` references.  What a checkpoint references is what a
restore of it reads (:func:`~statekit.checkpoint.handles.file_paths`), and only files named as
statekit names them are ever deleted (:func:`written_here`): never a user's file, a link, or
another job's directory nested inside this one.  ``attempts/b<batch>/<token>`` are empty
markers of task attempts, for a writer that commits nothing of its own per batch (Spark's
``applyInPandasWithState`` adapter): which attempts ran a batch tells which one Spark kept.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.handles import file_paths, verify_body
from statekit.checkpoint.metadata import decode_metadata, encode_metadata
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.streams import SHARED_PREFIX, STATE_FILE, CheckpointStreams
from statekit.errors import CheckpointNotFoundError, CorruptCheckpointError, UnsafePathError

log = logging.getLogger("statekit.checkpoint")

#: flat key: when the newest checkpoint is damaged, restore the newest older one that is intact
RECOVER_FROM_OLDER_KEY = "execution.checkpointing.recover-from-older-on-corruption"

METADATA = "_metadata"
#: a checkpoint directory's name: ``chk-<id>``, the id in plain ASCII digits (no leading zero,
#: at most 19 of them), so that listing a forged directory never runs a huge ``int()``
CHK_NAME = re.compile(r"chk-(0|[1-9][0-9]{0,18})")
CHK_PATTERN = re.compile(rf"^{CHK_NAME.pattern}/")
ATTEMPTS_PREFIX = "attempts/"
_ATTEMPT_BATCH = re.compile(r"b([0-9]{1,19})/")
JOBMANAGER_SCHEME = "jobmanager://"
#: the files statekit writes in a job directory: ``chk-<n>/_metadata``, state files directly in
#: ``chk-<n>/`` or ``shared/``
_WRITTEN = re.compile(rf"{CHK_NAME.pattern}/(?:{METADATA}|{STATE_FILE.pattern})|shared/{STATE_FILE.pattern}")
#: temp files of interrupted writes, where statekit writes
_TEMPORARY = re.compile(rf"(?:{CHK_NAME.pattern}|shared|attempts/b[0-9]{{1,19}})/\.tmp-[0-9a-f]+")


def written_here(key: str) -> bool:
    """Whether ``key`` (relative to a job directory) is named as statekit names the files it
    writes there: only such files are ever deleted by the sweep or garbage collection."""
    return _WRITTEN.fullmatch(key) is not None


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
            match = CHK_PATTERN.match(key)
            if match and key == f"chk-{match.group(1)}/{METADATA}":
                ids.add(int(match.group(1)))
        return sorted(ids)

    def load(self, checkpoint_id: int) -> dict[str, Any]:
        key = f"chk-{checkpoint_id}/{METADATA}"
        return decode_metadata(self.store.get(key), f"{self.location}/{key}", checkpoint_id)

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
        """Delete a checkpoint and every shared file no retained checkpoint still references
        (only files statekit wrote; others stay and are logged)."""
        try:
            doomed = file_paths(self.load(checkpoint_id))
        except (CheckpointNotFoundError, ValueError):
            doomed = set()
        prefix = f"chk-{checkpoint_id}/"
        self.store.delete(prefix + METADATA)  # first: from now on the checkpoint is incomplete
        self.delete_files(self.store.list(prefix))
        self.store.prune(prefix)
        self._sweep_shared({p for p in doomed if p.startswith(SHARED_PREFIX)}, retained)

    def abort(self, checkpoint_id: int, written: list[str], retained: list[int]) -> None:
        """Remove what an unfinished checkpoint wrote; shared files only if nothing uses them."""
        prefix = f"chk-{checkpoint_id}/"
        self.delete_files(self.store.list(prefix))
        self.store.prune(prefix)
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
        self.delete_files(candidates - in_use)

    def delete_files(self, keys: Iterable[str]) -> tuple[list[str], dict[str, str]]:
        """Delete the files statekit wrote among ``keys`` (by :func:`written_here` and the
        temp-file pattern); ``(deleted, {left alone: why})``.  A link or other non-file in a
        written file's place is left alone, never followed, and the rest go on."""
        deleted: list[str] = []
        kept: dict[str, str] = {}
        for key in sorted(set(keys)):
            if not (written_here(key) or _TEMPORARY.fullmatch(key)):
                kept[key] = "not a file statekit writes"
                continue
            try:
                self.store.delete(key)
            except (UnsafePathError, CorruptCheckpointError) as exc:
                log.warning("left %s/%s alone: %s", self.location, key, exc)
                kept[key] = str(exc)
                continue
            deleted.append(key)
        return deleted, kept

    def cleanup_orphans(self, in_flight: set[str] | None = None, temporary: bool = True) -> list[str]:
        """Delete files of checkpoints that never completed and shared files nothing references.

        ``in_flight`` names files of checkpoints still being written, which must survive;
        ``temporary`` also deletes temp files of interrupted local writes (only safe while no
        writer is active, e.g. at job start after a crash).
        """
        return self.delete_files(self.orphans(in_flight, temporary))[0]

    def orphans(self, in_flight: set[str] | None = None, temporary: bool = True) -> list[str]:
        """What :meth:`cleanup_orphans` deletes, without deleting it: files statekit wrote under
        ``chk-<n>/`` of checkpoints without ``_metadata`` and in ``shared/`` that no complete
        checkpoint references (and leftover temp files with ``temporary``).  Other files (a
        user's, another job's nested here) are never garbage."""
        completed = self.completed()
        referenced: set[str] = set(in_flight or ())
        for cid in completed:
            referenced |= file_paths(self.load(cid))
        removed = []
        done = {f"chk-{c}/" for c in completed}
        for key in self.store.list():
            match = CHK_PATTERN.match(key)
            orphan_chk = match is not None and f"chk-{match.group(1)}/" not in done
            if ((orphan_chk or key.startswith(SHARED_PREFIX)) and written_here(key)
                    and key not in referenced):
                removed.append(key)
        if temporary:
            removed += [k for k in self.store.list_temporary() if _TEMPORARY.fullmatch(k)]
        return removed

    # --- task attempt markers --------------------------------------------------------------------

    @staticmethod
    def _attempts_prefix(batch: int) -> str:
        return f"{ATTEMPTS_PREFIX}b{batch:012d}/"

    def mark_attempt(self, batch: int, token: str) -> None:
        """Record durably that the task attempt ``token`` ran batch ``batch``."""
        self.store.put(self._attempts_prefix(batch) + token, b"")

    def attempts(self, batch: int) -> list[str]:
        """Tokens of the attempts recorded for ``batch``."""
        return [k.rsplit("/", 1)[-1] for k in self.store.list(self._attempts_prefix(batch))]

    def retire_attempts(self, before_batch: int) -> None:
        """Delete the attempt markers of every batch before ``before_batch``."""
        for key in self.store.list(ATTEMPTS_PREFIX):
            batch = _ATTEMPT_BATCH.match(key[len(ATTEMPTS_PREFIX):])  # others were not written here
            if batch is not None and int(batch.group(1)) < before_batch:
                self.store.delete(key)

    def delete_all(self) -> None:
        self.store.delete_prefix("")
