"""Finding checkpoints under a path or URL: one listing of the store, classified by the layouts
statekit writes, then each ``_metadata`` read (several at a time on object stores).

* a job directory holds ``chk-<n>/_metadata`` (complete) and ``chk-<n>/...`` without it
  (incomplete); its shared files are under ``shared/`` (the local runner: ``<dir>/<job id>/``);
* a savepoint is a directory with ``_metadata`` directly inside (``savepoint-<job>-<id>/``);
* a Spark operator directory holds ``_operator`` and one job directory per partition
  (``<root>/<query id>/<operator>/p<partition>/``), whose checkpoint ids are batch ids, or for
  ``apply_in_pandas_with_state`` snapshot ids with ``attempts/b<batch>/<token>`` markers.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import CHK_NAME, METADATA, CheckpointStorageAccess
from statekit.checkpoint.metadata import decode_metadata
from statekit.errors import CheckpointNotFoundError, StatekitError
from statekit.inspection.model import CheckpointInfo, handle_size, timestamp_of
from statekit.runtime.partition import OperatorManifest

_CHK = re.compile(rf"^(?:(.*)/)?{CHK_NAME.pattern}/(.+)$")
_PARTITION = re.compile(r"^p(\d+)$")
_ATTEMPT = re.compile(r"^(?:(.*)/)?attempts/b(\d+)/([^/]+)$")


def _join(base: str, rel: str) -> str:
    return f"{base.rstrip('/')}/{rel}" if rel else base.rstrip("/")


@dataclass
class JobDir:
    """One directory holding ``chk-<n>/`` checkpoints (a job, or one Spark partition)."""

    rel: str
    complete: set[int] = field(default_factory=set)
    incomplete: set[int] = field(default_factory=set)
    attempts: dict[int, list[str]] = field(default_factory=dict)  # batch -> attempt tokens
    operator: str | None = None  # rel path of the Spark operator directory, if a partition
    partition: int | None = None

    def spark_names(self) -> tuple[str | None, str | None]:
        """``(query id, operator id)`` of a Spark partition directory."""
        if self.operator is None:
            return None, None
        parts = self.operator.split("/")
        return (parts[-2] if len(parts) >= 2 else None), parts[-1]


@dataclass
class Listing:
    """Everything statekit wrote under one location, from one listing of its store."""

    url: str
    store: BlobStore
    storage_options: dict[str, Any]
    jobs: dict[str, JobDir]
    savepoints: list[str]
    operators: list[str]
    #: applyInPandasWithState partitions without a snapshot yet: their state is all carried in
    #: Spark's GroupState (attempt markers only)
    carried: dict[str, JobDir] = field(default_factory=dict)

    def access(self, job: JobDir) -> CheckpointStorageAccess:
        """The layout of one job directory (its paths are relative to it)."""
        return CheckpointStorageAccess(self.store_at(job.rel), _join(self.url, job.rel), 0)

    def store_at(self, rel: str) -> BlobStore:
        """The store of the directory ``rel`` below the listed location, derived from the
        listing's own store (a directory name is never parsed as a URL: ``a::b`` stays one)."""
        if not rel:
            return self.store
        child = getattr(self.store, "child", None)
        if child is None:
            return blob_store_for(_join(self.url, rel), self.storage_options)
        return child(rel)  # type: ignore[no-any-return]


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> BlobStore:
    """The blob store rooted at ``url``; a missing local directory is CheckpointNotFoundError."""
    store = blob_store_for(url, storage_options)
    if isinstance(store, LocalBlobStore) and not os.path.isdir(store.root):
        what = "not a directory" if os.path.exists(store.root) else "no such directory"
        raise CheckpointNotFoundError(f"{what}: {url}")
    return store


def scan(url: str, storage_options: dict[str, Any] | None = None) -> Listing:
    """Classify every key under ``url`` (one recursive listing)."""
    url = url.rstrip("/") or "/"
    options = dict(storage_options or {})
    store = open_store(url, options)
    jobs: dict[str, JobDir] = {}
    savepoints: list[str] = []
    operators: list[str] = []
    for key in store.list():
        if (chk := _CHK.match(key)) is not None:
            job = jobs.setdefault(chk.group(1) or "", JobDir(chk.group(1) or ""))
            cid = int(chk.group(2))
            if chk.group(3) == METADATA:
                job.complete.add(cid)
            else:
                job.incomplete.add(cid)
        elif (attempt := _ATTEMPT.match(key)) is not None:
            job = jobs.setdefault(attempt.group(1) or "", JobDir(attempt.group(1) or ""))
            job.attempts.setdefault(int(attempt.group(2)), []).append(attempt.group(3))
        elif posixpath.basename(key) == METADATA:
            savepoints.append(posixpath.dirname(key))
        elif posixpath.basename(key) == OperatorManifest.NAME:
            operators.append(posixpath.dirname(key))
    # how many ``p<n>`` partition directories each parent holds: several make a manifest-less
    # operator (counted once, so the listing stays linear in the number of directories)
    partitions: dict[str, int] = {}
    for rel in jobs:
        parent, base = posixpath.split(rel)
        if _PARTITION.match(base):
            partitions[parent] = partitions.get(parent, 0) + 1
    known = set(operators)
    for job in jobs.values():
        job.incomplete -= job.complete
        parent, base = posixpath.split(job.rel)
        match = _PARTITION.match(base)
        if match is not None and (parent in known or job.attempts or partitions[parent] > 1):
            job.operator, job.partition = parent, int(match.group(1))
    carried = {rel: job for rel, job in jobs.items()
               if not (job.complete or job.incomplete) and job.partition is not None}
    jobs = {rel: job for rel, job in jobs.items() if job.complete or job.incomplete}
    return Listing(url, store, options, jobs, sorted(savepoints), sorted(operators), carried)


def valid_snapshot(job: JobDir, body: dict[str, Any]) -> bool:
    """Whether an applyInPandasWithState snapshot's task attempts were each the only attempt of
    their batch (only such snapshots are restored); other versions are always valid."""
    attempts = body.get("attempts")
    if not isinstance(attempts, list):
        return True
    return all(job.attempts.get(int(batch), []) == [str(token)] for batch, token in attempts)


def describe(listing: Listing, job: JobDir, cid: int, body: dict[str, Any] | None,
             error: str | None = None) -> CheckpointInfo:
    """The listing record of checkpoint ``cid`` of ``job`` (``body``: its metadata, if read)."""
    query, operator = job.spark_names()
    path = _join(listing.url, posixpath.join(job.rel, f"chk-{cid}") if job.rel else f"chk-{cid}")
    common = {"path": path, "kind": "version" if job.operator is not None else "checkpoint",
              "job": job.rel or posixpath.basename(listing.url), "id": cid, "query": query,
              "operator": operator, "partition": job.partition}
    if body is None:
        status = "unreadable" if error else "incomplete"
        return CheckpointInfo(**common, batch=None, status=status, timestamp=None, backend=None,
                              incremental=None, size=None, files=None, max_parallelism=None,
                              partitions=None, error=error)
    return _from_body(body, common, "retained" if valid_snapshot(job, body) else "tentative")


def _from_body(body: dict[str, Any], common: dict[str, Any], status: str) -> CheckpointInfo:
    tasks = body.get("tasks") if isinstance(body.get("tasks"), dict) else {}
    handles = [h for h in tasks.values() if isinstance(h, dict)]
    size, files = handle_size(tasks)
    backends = sorted({str(h.get("backend")) for h in handles if h.get("backend")})
    batch = body.get("batch")
    return CheckpointInfo(
        **common, batch=int(batch) if isinstance(batch, int) else None, status=status,
        timestamp=timestamp_of(body), backend=str(body.get("backend") or ",".join(backends) or "?"),
        incremental=any(bool(h.get("incremental")) for h in handles), size=size, files=files,
        changelog=any(isinstance(h.get("changelog"), dict) and bool(h["changelog"].get("segments"))
                      for h in handles),
        max_parallelism=body.get("max_parallelism") or next(
            (h.get("max_parallelism") for h in handles if h.get("max_parallelism")), None),
        partitions=len(handles))


def _load(listing: Listing, job: JobDir, cid: int) -> CheckpointInfo:
    try:
        body = listing.access(job).load(cid)
    except (StatekitError, OSError) as exc:
        return describe(listing, job, cid, None, f"{type(exc).__name__}: {exc}")
    return describe(listing, job, cid, body)


def savepoint_info(listing: Listing, rel: str) -> CheckpointInfo:
    """The listing record of the savepoint (or standalone ``_metadata``) directory ``rel``."""
    path = _join(listing.url, rel)
    common = {"path": path, "kind": "savepoint", "job": rel or posixpath.basename(listing.url),
              "id": None}
    key = posixpath.join(rel, METADATA) if rel else METADATA
    try:
        body = decode_metadata(listing.store.get(key), _join(listing.url, key))
    except (StatekitError, OSError) as exc:
        return CheckpointInfo(**common, batch=None, status="unreadable", timestamp=None,
                              backend=None, incremental=None, size=None, files=None,
                              max_parallelism=None, partitions=None,
                              error=f"{type(exc).__name__}: {exc}")
    info = _from_body(body, common, "retained")
    cid = body.get("checkpoint_id")
    return CheckpointInfo(**{**info.__dict__, "id": int(cid) if isinstance(cid, int) else None})


def list_checkpoints(location: str, *, storage_options: dict[str, Any] | None = None,
                     threads: int = 8) -> list[CheckpointInfo]:
    """Every checkpoint, savepoint and Spark partition version under ``location`` (a path or
    fsspec URL): complete ones with their metadata's facts, incomplete and unreadable ones too.

    Sorted by job, then id.  Spark versions carry ``query``, ``operator``, ``partition`` and
    ``batch``; applyInPandasWithState snapshots whose attempts are unconfirmed are ``tentative``.
    """
    listing = scan(location, storage_options)
    work: list[tuple[JobDir, int]] = [(job, cid) for job in listing.jobs.values()
                                       for cid in sorted(job.complete)]
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        loaded = list(pool.map(lambda item: _load(listing, *item), work))
        saved = list(pool.map(lambda rel: savepoint_info(listing, rel), listing.savepoints))
    pending = [describe(listing, job, cid, None) for job in listing.jobs.values()
               for cid in sorted(job.incomplete)]
    found = loaded + pending + saved + [_carried_info(listing, job) for job in listing.carried.values()]
    if not found:
        raise CheckpointNotFoundError(f"no checkpoint, savepoint or statekit state under {location}")
    return sorted(found, key=lambda i: (i.job, i.kind == "savepoint", i.id if i.id is not None else -1))


def _carried_info(listing: Listing, job: JobDir) -> CheckpointInfo:
    """An applyInPandasWithState partition with no snapshot yet (status ``carried``: its state
    is in Spark's GroupState; ``batch`` is the newest batch a task of it ran)."""
    query, operator = job.spark_names()
    return CheckpointInfo(path=_join(listing.url, job.rel), kind="version", job=job.rel, id=None,
                          batch=max(job.attempts), status="carried", timestamp=None, backend=None,
                          incremental=None, size=None, files=None, max_parallelism=None,
                          partitions=None, query=query, operator=operator, partition=job.partition)


def jobs_of(listing: Listing, kinds: Iterable[str] = ("job", "spark")) -> list[JobDir]:
    """The job directories of a listing: plain jobs, Spark partitions, or both."""
    wanted = set(kinds)
    return [job for _, job in sorted(listing.jobs.items())
            if ("spark" if job.operator is not None else "job") in wanted]
