"""What changed between batches, and what a location holds: the counterparts of Spark's
``statestore`` change feed and its ``state-metadata`` source.

:func:`change_feed` compares one state at consecutive batches (each batch's state as
:func:`~statekit.inspection.views.open_checkpoint` gives it, so every backend has a feed as far
back as partition versions are retained) and yields what batch ``b`` wrote: an ``update`` row per
row of a key whose rows changed (a list's whole new list; a map's changed entries), a ``delete``
row per key (or map entry) that went.  :func:`state_metadata` lists operators, their states and
the batches their versions cover.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from statekit.errors import ConfigError
from statekit.inspection.catalog import list_checkpoints
from statekit.inspection.stateview import StateView
from statekit.inspection.views import CheckpointView, open_checkpoint

if TYPE_CHECKING:
    import pyarrow as pa

#: The columns a change feed adds around the state's own (Spark's names).
BATCH_COLUMN, CHANGE_COLUMN, PARTITION_COLUMN = "batch_id", "change_type", "partition_id"


def pick_state(view: CheckpointView, state: str | None, timers: bool,
               operator: str | None) -> StateView:
    """The state (or the timers) ``view`` holds under those names."""
    return view.timers(operator) if timers else view.state(str(state), operator)


def feed_schema(state_schema: pa.Schema) -> pa.Schema:
    """A change feed's schema: ``batch_id``, ``change_type``, the state's columns (nullable),
    ``partition_id``."""
    import pyarrow as pa

    fields = [pa.field(BATCH_COLUMN, pa.int64(), False), pa.field(CHANGE_COLUMN, pa.string(), False)]
    fields += [f.with_nullable(True) for f in state_schema]
    return pa.schema([*fields, pa.field(PARTITION_COLUMN, pa.int32(), False)])


def change_feed(path: str, start: int, end: int | None = None, *, state: str | None = None,
                timers: bool = False, operator: str | None = None,
                storage_options: dict[str, Any] | None = None,
                key_type: Any = "auto", value_type: Any = "auto") -> Iterator[pa.RecordBatch]:
    """The changes each batch from ``start`` to ``end`` (default: the last committed) made to a
    Spark query's state, one record batch per batch that changed something."""
    import pyarrow as pa

    last = open_checkpoint(path, storage_options=storage_options)
    committed = last.info.batch
    if committed is None:
        raise ConfigError("readChangeFeed", f"{path} is not a Spark query's state: a change "
                                            "feed needs batches")
    end = committed if end is None else int(end)
    if not 0 <= int(start) <= end:
        raise ConfigError("changeStartBatchId", f"must be between 0 and the end batch {end}, got "
                                                f"{start}")
    if end > committed:
        raise ConfigError("changeEndBatchId", f"batch {end} is past the last committed batch "
                                              f"{committed}")

    def at(batch: int) -> StateView:
        view = last if batch == committed else open_checkpoint(
            path, batch=batch, storage_options=storage_options)
        return pick_state(view, state, timers, operator)

    after = at(end)
    plan = after.plan(key_type, value_type)
    schema = feed_schema(plan.schema)
    identity = _identity_columns(plan.schema)
    before = _rows(at(start - 1), key_type, value_type, identity) if start > 0 else {}
    for batch in range(int(start), end + 1):
        now = _rows(at(batch), key_type, value_type, identity)
        rows = list(_diff(before, now, batch, plan.schema.names, identity))
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=schema)
        before = now


def _identity_columns(schema: pa.Schema) -> list[str]:
    """What names one changeable thing: the key, and a map's user key."""
    return [c for c in ("key", "user_key") if c in schema.names]


Rows = dict[tuple[int, str], tuple[dict[str, Any], ...]]


def _rows(view: StateView, key_type: Any, value_type: Any, identity: list[str]) -> Rows:
    """Each (partition, identity)'s rows, in order."""
    out: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for i, part in enumerate(view.partitions):
        for batch in view.read_batches(key_type=key_type, value_type=value_type, partitions=[i]):
            for row in batch.to_pylist():
                out.setdefault((part.index, repr([row[c] for c in identity])), []).append(row)
    return {k: tuple(v) for k, v in out.items()}


def _diff(before: Rows, now: Rows, batch: int, columns: list[str], identity: list[str]
          ) -> Iterator[dict[str, Any]]:
    for where, rows in now.items():
        if before.get(where) != rows:
            for row in rows:
                yield {BATCH_COLUMN: batch, CHANGE_COLUMN: "update", **row,
                       PARTITION_COLUMN: where[0]}
    for where, rows in before.items():
        if where not in now:
            gone = {c: (rows[0][c] if c in identity else None) for c in columns}
            yield {BATCH_COLUMN: batch, CHANGE_COLUMN: "delete", **gone,
                   PARTITION_COLUMN: where[0]}


def state_metadata(path: str, *, storage_options: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per (operator, state) of the state under ``path`` (an operator's timers as one
    state, ``timers``): the operator's index among the operators (what ``operatorId`` takes),
    kind, value type, partitions and, for a Spark query, the first and the last batch that can
    be read (the versions every partition still retains, up to the last committed batch)."""
    view = open_checkpoint(path, storage_options=storage_options)
    first: dict[tuple[str, int], int] = {}
    if view.info.batch is not None:
        for info in list_checkpoints(path, storage_options=storage_options):
            if info.operator is not None and info.batch is not None and info.partition is not None:
                where = (info.operator, info.partition)
                first[where] = min(first.get(where, info.batch), info.batch)
    operators = view.operators
    rows = []
    for state in [*view.states(), *(view.timers(op) for op in operators if _has_timers(view, op))]:
        seen = [b for (op, _), b in first.items() if op == state.operator]
        rows.append({
            "operatorId": operators.index(state.operator), "operatorName": state.operator,
            "stateName": state.name, "kind": state.kind, "valueType": str(state.value_type),
            "numPartitions": len(state.partitions),
            "minBatchId": max(seen) if seen else None, "maxBatchId": view.info.batch,
        })
    return sorted(rows, key=lambda r: (r["operatorId"], r["stateName"]))


def _has_timers(view: CheckpointView, operator: str) -> bool:
    return any(s.kind == "timers" and s.operator == operator
               for s in view.states(include_internal=True))
