"""Garbage in checkpoint directories: files of checkpoints that never completed, shared files
no complete checkpoint references, temp files of interrupted writes.  The rule is the one
:meth:`~statekit.checkpoint.layout.CheckpointStorageAccess.cleanup_orphans` applies at job start;
here it is listed (a dry run) unless deletion is asked for.  Only files named as statekit names
them are garbage; a file any complete checkpoint's restore reads never is.  A link planted in a
file's place is left alone (and reported), and the collection goes on.

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
    #: garbage that could not be deleted (a link or non-file put in its place): left alone
    skipped: list[Garbage] = field(default_factory=list)


def collect_garbage(path: str, *, delete: bool = False,
                    storage_options: dict[str, Any] | None = None) -> GcReport:
    """List (or with ``delete``, delete) the garbage of every job directory under ``path``."""
    listing = catalog.scan(path, storage_options)
    report = GcReport(target=path, deleted=delete)
    for job in catalog.jobs_of(listing):
        access = listing.access(job)
        temporary = set(access.store.list_temporary())
        found = access.orphans(temporary=True)
        kept: dict[str, str] = {}
        if delete:
            _, kept = access.delete_files(found)
        for key in found:
            reason = ("temporary" if key in temporary else
                      "unreferenced-shared" if key.startswith(SHARED_PREFIX) else
                      "incomplete-checkpoint")
            item = Garbage(job=access.location, path=f"{access.location}/{key}", reason=reason)
            report.items.append(item)
            if key in kept:
                report.skipped.append(Garbage(job=item.job, path=item.path, reason=kept[key]))
    return report
