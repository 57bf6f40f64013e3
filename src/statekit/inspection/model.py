"""What the inspection API reports: plain, immutable records (each with ``to_dict()`` for JSON).

A :class:`CheckpointInfo` describes one checkpoint, savepoint or Spark partition version as
listed; a :class:`PartitionInfo` one task handle inside it, with a :class:`StateInfo` per state;
a :class:`VerifyReport` the outcome of reading back every file a checkpoint references.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from statekit.checkpoint.handles import walk_handles

#: states statekit keeps for itself (the applyInPandasWithState applied markers): hidden by default
INTERNAL_PREFIX = "__statekit"


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Record:
    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-able values (times in ISO 8601)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if not f.name.startswith("_")}


@dataclass(frozen=True)
class StateInfo(_Record):
    """One state as a task handle records it: descriptor layout, encoding and (where known) size.

    ``keys`` is None when counting would read the whole state (RocksDB, incremental heap
    checkpoints); :meth:`statekit.inspection.CheckpointView.count_keys` counts exactly.
    """

    name: str
    kind: str  # value | list | map
    value_type: str
    user_key_type: str | None
    ttl: bool
    encoding: str  # plain | indexed | changelog | rocksdb
    bytes: int | None
    keys: int | None
    layout: list[Any] = field(repr=False)

    @property
    def internal(self) -> bool:
        """Whether statekit keeps this state for itself (hidden unless asked for)."""
        return self.name.startswith(INTERNAL_PREFIX)


@dataclass(frozen=True)
class PartitionInfo(_Record):
    """One task handle: a local runner task, or one Spark partition's version."""

    operator: str
    name: str
    index: int
    key_groups: tuple[int, int]
    backend: str
    format: str
    incremental: bool
    version: int
    batch: int | None
    bytes: int
    files: int
    states: tuple[StateInfo, ...]


@dataclass(frozen=True)
class CheckpointInfo(_Record):
    """One checkpoint, savepoint or Spark partition version as listed under a location.

    ``status``: ``retained`` (complete: its ``_metadata`` exists), ``incomplete`` (files without
    ``_metadata``: interrupted, or still being written), ``unreadable`` (damaged ``_metadata``),
    ``tentative`` (an applyInPandasWithState snapshot whose task attempts are not confirmed),
    ``carried`` (an applyInPandasWithState partition without a snapshot yet), ``committed`` (a
    Spark query's state as of its last committed batch, snapshots and carried changes merged).
    ``committed_batch``: a Spark query's last committed batch (Spark's ``commits/``), when known.
    """

    path: str
    kind: str  # checkpoint | savepoint | version
    job: str
    id: int | None
    batch: int | None
    status: str
    timestamp: _dt.datetime | None
    backend: str | None
    incremental: bool | None
    size: int | None
    files: int | None
    max_parallelism: int | None
    partitions: int | None
    error: str | None = None
    query: str | None = None
    operator: str | None = None
    partition: int | None = None
    committed_batch: int | None = None
    #: a RocksDB changelog checkpoint: its materialization's files and log segments are shared
    #: with earlier checkpoints
    changelog: bool = False


@dataclass(frozen=True)
class Problem(_Record):
    """One damaged or missing thing: the file (or metadata) and the typed error it raised."""

    checkpoint: str
    path: str
    error: str
    message: str


@dataclass
class VerifyReport(_Record):
    """The result of verifying checkpoints: what was checked and every problem found."""

    target: str
    checkpoints: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every checked checkpoint is intact (and at least one was checked)."""
        return not self.problems and bool(self.checkpoints)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "ok": self.ok}


def handle_size(obj: Any) -> tuple[int, int]:
    """``(bytes, files)`` a metadata body or handle references: every distinct file once, plus
    every inline chunk."""
    sizes: dict[str, int] = {}
    inline = 0
    for _, handle in walk_handles(obj):
        size = handle.get("size")
        size = size if type(size) is int else 0
        if handle.get("type") == "file":
            sizes[str(handle.get("path")).rstrip("/")] = size
        else:
            inline += size
    return sum(sizes.values()) + inline, len(sizes)


def timestamp_of(body: dict[str, Any]) -> _dt.datetime | None:
    """The commit time a metadata body records (milliseconds since the epoch), if any.

    The time only informs: restore does not use it, so one outside what a date can hold shows
    as unknown rather than stopping the tools from showing state a restore reads."""
    stamp = body.get("timestamp")
    if not isinstance(stamp, int) or isinstance(stamp, bool):
        return None
    try:
        return _dt.datetime.fromtimestamp(stamp / 1000, tz=_dt.UTC)
    except (ValueError, OverflowError, OSError):
        return None
