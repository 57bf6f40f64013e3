"""Garbage in checkpoint directories: files of checkpoints that never completed, shared files
no complete checkpoint references, temp files of interrupted writes.  The rule is the one
:meth:`~statekit.checkpoint.layout.CheckpointStorageAccess.cleanup_orphans` applies at job start;
here it is listed (a dry run) unless deletion is asked for.

Only for stopped jobs: a running job's checkpoint in flight looks exactly like garbage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statekit.checkpoint.streams import SHARED_PREFIX
from statekit.inspection import catalog
from statekit.inspection.model import _Record


@dataclass(frozen=True)
class Garbage(_Record):
    """One file nothing needs, and why."""

    job: str
    path: str
    reason: str  # incomplete-checkpoint | unreferenced-shared | temporary


@dataclass
class GcReport(_Record):
    """What a garbage collection found, and whether it deleted it."""

    target: str
    deleted: bool
    items: list[Garbage] = field(default_factory=list)


def collect_garbage(path: str, *, delete: bool = False,
                    storage_options: dict[str, Any] | None = None) -> GcReport:
    """List (or with ``delete``, delete) the garbage of every job directory under ``path``."""
    listing = catalog.scan(path, storage_options)
    report = GcReport(target=path, deleted=delete)
    for job in catalog.jobs_of(listing):
        access = listing.access(job)
        temporary = set(access.store.list_temporary())
        for key in access.orphans(temporary=True):
            reason = ("temporary" if key in temporary else
                      "unreferenced-shared" if key.startswith(SHARED_PREFIX) else
                      "incomplete-checkpoint")
            report.items.append(Garbage(job=access.location, path=f"{access.location}/{key}",
                                        reason=reason))
            if delete:
                access.store.delete(key)
    return report
