"""Verifying checkpoints: every file a checkpoint references read back (present, its recorded
size, its CRC-32), streamed in spans; every problem collected, not only the first.

A shared file is read once per run however many checkpoints reference it; a checkpoint whose
incremental chain lost a file reports it too.  ``deep`` also decodes every state's entries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekit.checkpoint.handles import file_handles, file_path, inline_handles
from statekit.checkpoint.layout import METADATA
from statekit.checkpoint.metadata import decode_metadata
from statekit.checkpoint.reader import StateReader
from statekit.errors import CheckpointNotFoundError, StatekitError
from statekit.inspection import catalog
from statekit.inspection.entries import PartitionSource, iter_chunks, state_entries
from statekit.inspection.model import Problem, VerifyReport

Progress = Callable[[int], None] | None


def _problem(checkpoint: str, path: str, exc: BaseException) -> Problem:
    return Problem(checkpoint=checkpoint, path=path, error=type(exc).__name__, message=str(exc))


def _check_body(report: VerifyReport, checkpoint: str, location: str, store: Any,
                body: dict[str, Any], seen: dict[str, Problem | None], deep: bool,
                progress: Progress) -> None:
    reader = StateReader(store)
    report.checkpoints.append(checkpoint)
    for key, handle in _handles(body).items():
        path = f"{location}/{key}"
        if path in seen:  # a shared file another checkpoint referenced: checked already
            earlier = seen[path]
            if earlier is not None:
                report.problems.append(Problem(checkpoint=checkpoint, path=path, error=earlier.error,
                                               message=earlier.message))
            continue
        try:
            report.bytes += reader.check(handle, progress)
            report.files += 1
            seen[path] = None
        except (StatekitError, OSError) as exc:
            problem = _problem(checkpoint, path, exc)
            seen[path] = problem
            report.problems.append(problem)
    broken = any(p.checkpoint == checkpoint for p in report.problems)
    for name, handle in _tasks(body):
        for inline in inline_handles(handle):
            try:
                report.bytes += reader.check(inline)
            except (StatekitError, OSError) as exc:
                broken = True
                report.problems.append(
                    _problem(checkpoint, f"{checkpoint}/{METADATA} (inline state of {name})", exc))
        if not deep or broken:
            continue
        source = PartitionSource(store, handle, location)
        try:
            states = list(state_entries(handle))
        except (StatekitError, OSError) as exc:
            report.problems.append(_problem(checkpoint, f"{checkpoint}/{METADATA} ({name})", exc))
            continue
        for state in states:
            try:
                for _ in iter_chunks(source, state):
                    pass
            except (StatekitError, OSError) as exc:
                report.problems.append(_problem(checkpoint, f"{checkpoint} ({name}, state {state})", exc))


def _handles(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every file a restore of ``body`` reads, by its normalized path (the walk the retention
    sweep and garbage collection use: what they keep is what is checked here)."""
    unique: dict[str, dict[str, Any]] = {}
    for handle in file_handles(body.get("tasks", {})):
        unique.setdefault(file_path(handle), handle)
    return unique


def _tasks(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    tasks = body.get("tasks")
    if not isinstance(tasks, dict):
        raise CheckpointNotFoundError("metadata without task handles")
    return [(str(n), h) for n, h in tasks.items() if isinstance(h, dict)]


def verify(path: str, *, storage_options: dict[str, Any] | None = None, deep: bool = False,
           latest_only: bool = False, progress: Progress = None) -> VerifyReport:
    """Verify what ``path`` names: one checkpoint (``.../chk-<n>``), a savepoint, or every
    complete checkpoint and savepoint under a job directory or any root above them.

    ``latest_only`` checks only each job's newest complete checkpoint; ``deep`` also decodes
    every entry; ``progress(n)`` is told the bytes read.  The report lists every problem with
    the damaged file's path and its typed error; ``report.ok`` is False when any was found or
    nothing was there to check.
    """
    path = path.rstrip("/")
    if path.endswith("/" + METADATA):
        path = path[: -len(METADATA) - 1]
    report = VerifyReport(target=path)
    base, _, last = path.rpartition("/")
    only: int | None = None
    if last.startswith("chk-") and last[4:].isdigit():
        path, only = base, int(last[4:])
    listing = catalog.scan(path, storage_options)
    seen: dict[str, Problem | None] = {}
    for job in catalog.jobs_of(listing):
        access = listing.access(job)
        ids = sorted(job.complete)
        if only is not None:
            if only not in job.complete:
                raise CheckpointNotFoundError(f"no complete checkpoint {only} in {path}")
            ids = [only]
        elif latest_only and ids:
            ids = ids[-1:]
        for cid in ids:
            checkpoint = access.checkpoint_path(cid)
            try:
                body = access.load(cid)
            except (StatekitError, OSError) as exc:
                report.checkpoints.append(checkpoint)
                report.problems.append(_problem(checkpoint, f"{checkpoint}/{METADATA}", exc))
                continue
            _check_body(report, checkpoint, access.location, access.store, body, seen, deep,
                        progress)
    if only is None:
        for rel in listing.savepoints:
            location = catalog._join(listing.url, rel)
            store = listing.store_at(rel)
            try:
                body = decode_metadata(store.get(METADATA), f"{location}/{METADATA}")
            except (StatekitError, OSError) as exc:
                report.checkpoints.append(location)
                report.problems.append(_problem(location, f"{location}/{METADATA}", exc))
                continue
            _check_body(report, location, location, store, body, seen, deep, progress)
    return report
