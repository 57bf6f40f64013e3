"""Opening one checkpoint, savepoint or Spark batch, and walking it: operators, partitions (task
handles with their key-group ranges), states; each state readable as Arrow record batches.

``open_checkpoint`` accepts what users have at hand: a ``chk-<n>`` directory (or its
``_metadata``), a savepoint directory, a job directory (its newest complete checkpoint, or
``checkpoint_id``), a Spark query's statekit root or its ``checkpointLocation`` (every partition's
version of the query's last committed batch, or of ``batch``), on the local disk or any fsspec
URL.  An ``applyInPandasWithState`` query's state is its snapshots plus the changes its keys
carry in Spark's state store; :mod:`statekit.spark` reads those (registering the reader here).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from statekit.backends.timers import TIMERS_KIND
from statekit.checkpoint.blobstore.base import is_url
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import METADATA
from statekit.checkpoint.metadata import decode_metadata
from statekit.checkpoint.reader import StateReader
from statekit.errors import (
    CarriedStateError,
    CheckpointNotFoundError,
    ConfigError,
    CorruptCheckpointError,
    StateError,
)
from statekit.inspection import catalog
from statekit.inspection.arrow import describe
from statekit.inspection.committed import SparkQuery, find_query
from statekit.inspection.entries import (
    PartitionSource,
    peek_count,
    state_entries,
)
from statekit.inspection.model import CheckpointInfo, PartitionInfo, StateInfo, handle_size
from statekit.inspection.operator import OperatorStateView, operator_states
from statekit.inspection.stateview import StateView

if TYPE_CHECKING:
    pass

_CHK_DIR = re.compile(r"^chk-(\d+)$")
_OPERATOR = re.compile(r"^(.*)-(\d+)$")
_SNAPSHOT_IDS = 1_000_000  # applyInPandasWithState snapshot ids start here (batch + 1) * 10**6
#: what reads an applyInPandasWithState query's state as of a batch (Spark's state store merged
#: onto the snapshots): registered by :mod:`statekit.spark`, which may use Spark
CarriedReader = Callable[[SparkQuery, "int | None", dict[str, Any]], "CheckpointView"]
_carried_reader: list[CarriedReader] = []


def register_carried_reader(reader: CarriedReader) -> None:
    """Make ``reader`` open applyInPandasWithState queries (see the module docstring)."""
    _carried_reader[:] = [reader]


class CheckpointView:
    """One opened checkpoint, savepoint or Spark batch: its partitions and their states."""

    def __init__(self, info: CheckpointInfo, metadata: dict[str, Any],
                 partitions: list[tuple[PartitionInfo, PartitionSource]]) -> None:
        self.info = info
        self.path = info.path
        self.metadata = metadata
        self._partitions = partitions

    @property
    def partitions(self) -> list[PartitionInfo]:
        return [p for p, _ in self._partitions]

    @property
    def sources(self) -> list[PartitionSource]:
        return [s for _, s in self._partitions]

    @property
    def operators(self) -> list[str]:
        return sorted({p.operator for p, _ in self._partitions})

    def states(self, include_internal: bool = False) -> list[StateView]:
        """Every state (per operator), statekit's internal ones only when asked for."""
        grouped: dict[tuple[str, str], list[tuple[PartitionInfo, StateInfo, PartitionSource]]] = {}
        for part, source in self._partitions:
            for state in part.states:
                if include_internal or not state.internal:
                    grouped.setdefault((part.operator, state.name), []).append((part, state, source))
        return [StateView(name, op, parts) for (op, name), parts in sorted(grouped.items())]

    def operator_states(self) -> list[OperatorStateView]:
        """The subtasks' operator states (list, union list, broadcast), by name."""
        sources = self.sources
        return operator_states(self.metadata, StateReader(sources[0].store) if sources else None)

    def check_outside(self, target: str, what: str = "to") -> None:
        """ConfigError when ``target`` (a path or URL a tool writes to) lies inside a directory
        this view reads: a checkpoint, savepoint or Spark partition directory is statekit's,
        and writing into it (its own ``_metadata`` included) would damage it."""
        where = _location(target)
        roots = [_location(source.store.root if isinstance(source.store, LocalBlobStore)
                           else source.store.describe()) for source in self.sources]
        if self.info.kind == "version":  # a Spark query's checkpointLocation: Spark's and ours
            roots.append(_location(self.info.path))
        for root in roots:
            if where == root or where.startswith(root.rstrip("/") + "/"):
                raise ConfigError(what, f"{target} lies inside the checkpoint directory {root}; "
                                        "write it somewhere else")

    def timers(self, operator: str | None = None) -> StateView:
        """The timers of an operator's partitions (both domains) as one view: rows of ``key``,
        ``timestamp`` and ``domain`` (``EVENT_TIME`` / ``PROCESSING_TIME``)."""
        found = [s for s in self.states(include_internal=True)
                 if s.kind == TIMERS_KIND and operator in (None, s.operator)]
        operators = sorted({s.operator for s in found})
        if len(operators) > 1:
            raise StateError(f"several operators hold timers ({', '.join(operators)}); name one",
                             "timers")
        if not found:
            raise StateError(f"{self.path} holds no timers" + (
                f" of operator {operator!r}" if operator else ""), "timers")
        return StateView("timers", operators[0],
                         [part for view in found for part in view._parts])

    def state(self, name: str, operator: str | None = None) -> StateView | OperatorStateView:
        """The state ``name`` (of ``operator`` when several operators have one of that name;
        operator state is operator ``operator-state``)."""
        found: list[Any] = [s for s in self.states(include_internal=True)
                            if s.name == name and operator in (None, s.operator)]
        found += [s for s in self.operator_states()
                  if s.name == name and operator in (None, s.operator)]
        if len(found) == 1:
            return found[0]
        if not found:
            if operator is not None and operator not in self.operators:
                raise StateError(f"{self.path} holds no operator {operator!r} (operators: "
                                 f"{', '.join(self.operators) or 'none'})", name)
            known = ", ".join(sorted({s.name for s in [*self.states(), *self.operator_states()]
                                      })) or "none"
            raise StateError(f"no such state in {self.path} (states: {known})", name)
        raise StateError(f"held by several operators ({', '.join(s.operator for s in found)}); "
                         "name one", name)


# --- opening -----------------------------------------------------------------------------------


def open_checkpoint(path: str, *, checkpoint_id: int | None = None, batch: int | None = None,
                    storage_options: dict[str, Any] | None = None,
                    include_tentative: bool = False, snapshots_only: bool = False) -> CheckpointView:
    """Open the checkpoint or savepoint ``path`` names (see the module docstring).

    A Spark query's state is that of its last committed batch (Spark's ``commits/``), or of
    ``batch``: each partition's version of it (its newest one at or before it); ``info.batch``
    says which.  For applyInPandasWithState, the changes carried in Spark's state store are
    merged onto the snapshots (through :mod:`statekit.spark`, with a SparkSession; else
    :class:`CarriedStateError`) unless ``snapshots_only``, which reads the snapshots alone (they
    lag); ``include_tentative`` then also considers snapshots whose attempts are unconfirmed.
    CheckpointNotFoundError when nothing (or more than one job) is there.
    """
    path = path.rstrip("/")
    if path.endswith("/" + METADATA):
        path = path[: -len(METADATA) - 1]
    options = dict(storage_options or {})
    if (chk := _CHK_DIR.match(posixpath.basename(path))) is not None:
        _only(None, checkpoint_id, batch, path)
        listing = catalog.scan(posixpath.dirname(path), options)
        job = listing.jobs.get("") or catalog.JobDir("")
        return _view_of(listing, [(job, int(chk.group(1)))], "checkpoint")
    store = catalog.open_store(path, options)
    if store.exists(METADATA):
        _only(None, checkpoint_id, batch, path)
        body = decode_metadata(store.get(METADATA), f"{path}/{METADATA}")
        listing = catalog.Listing(path, store, options, {}, [""], [])
        info = catalog.savepoint_info(listing, "")
        cid = body.get("checkpoint_id")
        items = [(name, PartitionSource(store, h, path), cid if isinstance(cid, int) else None, None)
                 for name, h in _tasks(body, path)]
        return CheckpointView(info, body, _partitions(items))
    listing = catalog.scan(path, options)
    spark = catalog.jobs_of(listing, ["spark"])
    if spark or listing.carried:
        _only("batch", checkpoint_id, batch, path)
        query = find_query(path, options)
        if query is not None and batch is not None and (query.committed is None
                                                        or batch > query.committed):
            raise CheckpointNotFoundError(
                f"{path}: no batch {batch}: the query's last committed batch is "
                f"{query.committed}" if query.committed is not None
                else f"{path}: the query has not committed a batch yet")
        if not snapshots_only and (listing.carried or any(_carries(job) for job in spark)):
            return _open_carried(path, query, batch, options)
        if query is not None and batch is None:
            if query.committed is None:
                raise CheckpointNotFoundError(f"{path}: the query has not committed a batch yet")
            batch = query.committed
        queries = sorted({job.spark_names()[0] or "" for job in spark})
        if len(queries) > 1:
            raise CheckpointNotFoundError(
                f"{path} holds the state of {len(queries)} queries; open one of: "
                + ", ".join(catalog._join(path, posixpath.dirname(job.operator or ""))
                            for job in {j.spark_names()[0]: j for j in spark}.values()))
        found = [(job, cid) for job in spark
                 if (cid := _version(listing, job, batch, include_tentative)) is not None]
        if not found:
            raise CheckpointNotFoundError(f"no version at or before batch {batch} under {path}")
        picked = _same_run(listing, found, path)
        view = _view_of(listing, picked, "version")
        if query is not None:
            view.info = CheckpointInfo(**{**view.info.__dict__, "committed_batch": query.committed})
        return view
    jobs = [job for job in catalog.jobs_of(listing, ["job"]) if job.complete]
    _only("checkpoint_id" if jobs else None, checkpoint_id, batch, path)
    if len(jobs) == 1:
        job = jobs[0]
        cid = max(job.complete) if checkpoint_id is None else checkpoint_id
        if cid not in job.complete:
            raise CheckpointNotFoundError(f"no complete checkpoint {cid} in {path}")
        return _view_of(listing, [(job, cid)], "checkpoint")
    if not jobs and len(listing.savepoints) == 1:
        return open_checkpoint(catalog._join(path, listing.savepoints[0]), storage_options=options)
    candidates = [catalog._join(path, j.rel) for j in jobs] + [
        catalog._join(path, s) for s in listing.savepoints]
    if not candidates:
        raise CheckpointNotFoundError(f"no complete checkpoint or savepoint under {path}")
    raise CheckpointNotFoundError(f"{path} holds {len(candidates)} jobs or savepoints; open one "
                                  f"of: {', '.join(candidates[:10])}")


def _only(allowed: str | None, checkpoint_id: int | None, batch: int | None, path: str) -> None:
    """A ConfigError for a selector that cannot take effect here (it was ignored): a job's
    checkpoints are picked by id, a Spark query's state by batch, a savepoint or a ``chk-<n>``
    directory by neither."""
    for name, value, flag in (("checkpoint_id", checkpoint_id, "--checkpoint-id"),
                              ("batch", batch, "--batch")):
        if value is not None and name != allowed:
            what = {None: "names one checkpoint or savepoint", "batch": "holds Spark query state "
                    "(pick it with --batch)", "checkpoint_id": "holds a job's checkpoints (pick "
                    "one with --checkpoint-id)"}[allowed]
            raise ConfigError(name, f"{flag} cannot apply: {path} {what}")


def _carries(job: catalog.JobDir) -> bool:
    """Whether a Spark partition is applyInPandasWithState's (attempt markers, snapshot ids)."""
    return bool(job.attempts) or any(cid >= _SNAPSHOT_IDS for cid in job.complete)


def _open_carried(path: str, query: SparkQuery | None, batch: int | None,
                  options: dict[str, Any]) -> CheckpointView:
    if query is None:
        raise CarriedStateError(
            f"{path} holds applyInPandasWithState state, whose changes since each snapshot live "
            "in the query's Spark state store: open the query's checkpointLocation (where Spark "
            "keeps it), or pass snapshots_only=True (--snapshots-only) to read the snapshots "
            "alone, which lag behind the query")
    if not _carried_reader:
        raise CarriedStateError(
            f"{path}: an applyInPandasWithState query's state needs Spark's state store reader: "
            "import statekit.spark first (it reads the changes through a SparkSession), or pass "
            "snapshots_only=True to read the snapshots alone, which lag behind the query")
    return _carried_reader[0](query, batch, options)


def _version(listing: catalog.Listing, job: catalog.JobDir, batch: int | None,
             include_tentative: bool) -> int | None:
    """A Spark partition's newest (valid) version at or before ``batch``.  Versions of
    ``foreach_batch`` / ``transform_with_state`` are batch ids; applyInPandasWithState snapshot
    ids are larger, their metadata records the batch they cover."""
    access = listing.access(job)
    for cid in sorted(job.complete, reverse=True):
        if batch is not None and cid < _SNAPSHOT_IDS and cid > batch:
            continue
        body = access.load(cid)  # a damaged version is an error, never a fall back to older state
        if batch is not None and int(body.get("batch", cid)) > batch:
            continue
        if include_tentative or catalog.valid_snapshot(job, body):
            return cid
    return None


def _same_run(listing: catalog.Listing, picked: list[tuple[catalog.JobDir, int]], path: str
              ) -> list[tuple[catalog.JobDir, int]]:
    """The partitions of the run that wrote the batch: after a ``foreach_batch`` query's
    partition count fell, the partitions it no longer has keep their older versions (the
    count is partition 0's, which every run writes).

    Each partition of that run commits every batch, so one missing, or at an older version,
    lost its state (a deleted directory or ``_metadata``): a CorruptCheckpointError, never fewer
    keys or older values.  applyInPandasWithState snapshots (taken now and then) are left out."""
    operators: dict[Any, dict[int | None, tuple[catalog.JobDir, int]]] = {}
    for job, cid in picked:
        operators.setdefault(job.spark_names(), {})[job.partition] = (job, cid)
    counts: dict[Any, Any] = {}
    for names, have in operators.items():
        first = have.get(0)
        count = counts[names] = None if first is None else listing.access(first[0]).load(
            first[1]).get("num_partitions")
        newest = max(cid for _, cid in have.values())
        if newest >= _SNAPSHOT_IDS:
            continue
        for partition in range(count if isinstance(count, int) else 1):
            found = have.get(partition)
            if found is None or found[1] != newest:
                held = "none" if found is None else f"version {found[1]}"
                raise CorruptCheckpointError(
                    f"{path}: partition {partition} of {count or '?'} holds {held} where the "
                    f"others hold version {newest}: its state for that batch is missing or damaged")
    return [(job, cid) for job, cid in picked
            if not isinstance(n := counts.get(job.spark_names()), int) or job.partition < n]


def _tasks(body: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    tasks = body.get("tasks")
    if not isinstance(tasks, dict):
        raise CheckpointNotFoundError(f"{where}: metadata without task handles")
    return sorted((str(n), h) for n, h in tasks.items() if isinstance(h, dict))


def _view_of(listing: catalog.Listing, picked: list[tuple[catalog.JobDir, int]], kind: str
             ) -> CheckpointView:
    items: list[tuple[str, PartitionSource, int | None, int | None]] = []
    first_body: dict[str, Any] = {}
    infos = []
    for job, cid in picked:
        access = listing.access(job)
        body = access.load(cid)
        info = catalog.describe(listing, job, cid, body)
        infos.append(info)
        first_body = first_body or body
        _, operator = job.spark_names()
        for name, handle in _tasks(body, access.checkpoint_path(cid)):
            label = f"{operator}/p{job.partition:05d}" if operator is not None else name
            items.append((label, PartitionSource(access.store, handle, access.location), cid,
                          info.batch))
    info = infos[0]
    if len(infos) > 1:  # one Spark batch: the partitions' versions together
        batches = [i.batch for i in infos if i.batch is not None]
        info = CheckpointInfo(**{**info.__dict__, "path": listing.url, "job": listing.url,
                                 "id": max(batches) if batches else None, "partition": None,
                                 "batch": max(batches) if batches else None,
                                 "size": sum(i.size or 0 for i in infos),
                                 "files": sum(i.files or 0 for i in infos),
                                 "partitions": len(items), "kind": kind})
    return CheckpointView(info, first_body, _partitions(items))


def _partitions(items: list[tuple[str, PartitionSource, int | None, int | None]]
                ) -> list[tuple[PartitionInfo, PartitionSource]]:
    out = []
    for index, (label, source, version, batch) in enumerate(items):
        handle = source.handle
        operator, name = label.split("/", 1) if "/" in label else (_operator(label), label)
        size, files = handle_size(handle)
        states = []
        for state, (entry, encoding) in sorted(state_entries(handle).items()):
            layout = list(entry.get("layout") or ["value", "generic", None, False])
            states.append(StateInfo(
                name=state, kind=str(entry.get("kind", layout[0])), value_type=describe(layout[1]),
                user_key_type=describe(layout[2]) if layout[2] is not None else None,
                ttl=bool(layout[3]) if len(layout) > 3 else False, encoding=encoding,
                bytes=int(entry["data"].get("size", 0)) if encoding in ("plain", "indexed") else None,
                keys=peek_count(source, entry) if encoding in ("plain", "indexed") else None,
                layout=layout))
        rng = source.key_groups
        out.append((PartitionInfo(
            operator=operator, name=name, index=index, key_groups=(rng.start, rng.end),
            backend=str(handle.get("backend", "?")), format=source.format,
            incremental=bool(handle.get("incremental")), version=int(version or 0),
            batch=batch, bytes=size, files=files, states=tuple(states)), source))
    return out


def _location(target: str) -> str:
    """A comparable form of a path or URL: a local path resolved (links included, ``file://``
    dropped), a URL without trailing slashes."""
    if target.startswith("file://"):
        target = target[len("file://"):]
    if is_url(target):
        return target.rstrip("/")
    return os.path.realpath(os.path.abspath(target))


def _operator(task_name: str) -> str:
    """The operator of a local runner task name (``keyed-process-2`` -> ``keyed-process``)."""
    match = _OPERATOR.match(task_name)
    return match.group(1) if match else task_name
