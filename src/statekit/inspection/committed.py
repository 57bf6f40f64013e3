"""Which batch of a Spark query is committed: Spark's ``commits/`` under its checkpointLocation.

Spark commits micro-batch *N* by writing ``<checkpointLocation>/commits/<N>`` after every task of
the batch finished.  statekit's adapters write their state within the batch's tasks, so after a
stop (or a failure) statekit may hold a version of a batch Spark never committed; Spark runs that
batch again when the query restarts.  What the query's state *is* is therefore the state as of
the last committed batch, and that is what inspection, export, convert and the Spark reader show
by default.

By default statekit keeps its state under ``<checkpointLocation>/statekit``, so the query's
checkpoint is found from any of the paths users give: the checkpointLocation itself, its
``statekit`` directory, or a directory below that.  State kept elsewhere
(``state.checkpoints.dir``) has no committed batch to go by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.errors import StatekitError

#: the directory under a query's checkpointLocation statekit keeps its state in by default
STATEKIT_DIR = "statekit"


@dataclass(frozen=True)
class SparkQuery:
    """A Spark query's checkpoint: its location, its statekit state, its last committed batch."""

    location: str  # the checkpointLocation (a path or URL)
    statekit: str  # where statekit keeps the query's state
    committed: int | None  # the last committed batch (None: no batch committed yet)


def _is_query(url: str, storage_options: dict[str, Any] | None) -> bool:
    """Whether ``url`` is a Spark checkpoint: its ``metadata`` and ``offsets/``."""
    try:
        return (blob_store_for(url, storage_options).exists("metadata")
                and bool(_store(url, "offsets", storage_options).list()))
    except (StatekitError, OSError):
        return False


def _store(url: str, name: str, storage_options: dict[str, Any] | None) -> BlobStore:
    return blob_store_for(f"{url.rstrip('/')}/{name}", storage_options)


def find_query(path: str, storage_options: dict[str, Any] | None = None) -> SparkQuery | None:
    """The Spark query whose checkpoint ``path`` is, or holds its statekit state (``path`` is
    the checkpointLocation, its ``statekit`` directory or one below it); None otherwise."""
    url = path.rstrip("/") or "/"
    candidates = [url]
    parts = url.split("/")
    if STATEKIT_DIR in parts:  # <location>/statekit[/<query id>/<operator>/...]
        index = len(parts) - 1 - parts[::-1].index(STATEKIT_DIR)
        candidates.append("/".join(parts[:index]) or "/")
    for candidate in candidates:
        if _is_query(candidate, storage_options):
            return SparkQuery(candidate, f"{candidate.rstrip('/')}/{STATEKIT_DIR}",
                              last_committed(candidate, storage_options))
    return None


def last_committed(location: str, storage_options: dict[str, Any] | None = None) -> int | None:
    """The highest batch id in ``commits/`` of the Spark checkpoint at ``location``."""
    return max((int(key) for key in _store(location, "commits", storage_options).list()
                if key.isdigit()), default=None)
