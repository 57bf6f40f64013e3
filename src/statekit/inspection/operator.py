"""Operator state in an opened checkpoint: each subtask's list, union list and broadcast states
(the metadata's ``operator_state`` handles, in subtask order), readable as rows like keyed
state, with the subtask in place of the key: one row per list element (``subtask``, ``index``,
``value``) or per broadcast entry (``subtask``, ``user_key``, ``value``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from statekit.backends.operator import read_snapshots
from statekit.backends.operator_format import DistributionMode, Snapshot
from statekit.checkpoint.reader import StateReader
from statekit.checkpoint.schema import OPERATOR_STATE
from statekit.inspection.arrow import Chunk, RowPlan, TypeChoice, describe, record_batches

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: the kind each distribution mode shows as (``inspect``, ``StateView.kind``)
KIND = {DistributionMode.SPLIT_DISTRIBUTE: "operator-list",
        DistributionMode.UNION: "operator-union-list",
        DistributionMode.BROADCAST: "broadcast"}
#: the pseudo-operator operator state is listed under (one per job on the local runner)
OPERATOR = "operator-state"


class OperatorStateView:
    """One named operator state across the subtasks that hold it."""

    def __init__(self, name: str, parts: list[tuple[int, Any]], nbytes: list[int]) -> None:
        self.name = name
        self.operator = OPERATOR
        self._parts = parts  # (subtask, StateEntries)
        self._nbytes = nbytes
        first = parts[0][1]
        self.mode = first.mode
        self.kind = KIND[first.mode]
        self.layout = list(first.layout)
        self.ttl = False
        self.value_type = describe(self.layout[1])
        self.user_key_type = describe(self.layout[2]) if self.layout[2] is not None else None

    @property
    def subtasks(self) -> list[int]:
        return [subtask for subtask, _ in self._parts]

    @property
    def partitions(self) -> list[int]:
        return self.subtasks

    @property
    def bytes(self) -> int:
        """Bytes of the snapshots of the subtasks holding the state (all their states)."""
        return sum(self._nbytes)

    @property
    def keys(self) -> int:
        """Elements (list states) or entries (broadcast states), over every subtask."""
        return sum(len(entries.entries) for _, entries in self._parts)

    def count(self, progress: Any = None) -> int:
        return self.keys

    def _chunks(self, progress: Any = None) -> Iterator[Chunk]:
        for (subtask, entries), size in zip(self._parts, self._nbytes, strict=True):
            if progress is not None:
                progress(size)
            yield Chunk([subtask], [entries.entries], size)

    def plan(self, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto",
             user_key_type: TypeChoice = "auto") -> RowPlan:
        """How entries become rows (the ``key`` column holds the subtask index)."""
        kind = "map" if self.mode is DistributionMode.BROADCAST else "list"
        return RowPlan(self.layout, kind, lambda: next(self._chunks(), None), key_type="auto",
                       value_type=value_type, user_key_type=user_key_type, key_config="INT")

    def schema(self, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto") -> pa.Schema:
        """``subtask``, ``index`` (list states) or ``user_key`` (broadcast state), ``value``."""
        return _renamed(self.plan(key_type, value_type).schema)

    def read_batches(self, *, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto",
                     batch_rows: int = 65536, progress: Any = None, **_: Any
                     ) -> Iterator[pa.RecordBatch]:
        """The state's rows as record batches; ``progress(n)`` is told each subtask's snapshot
        bytes as it is read."""
        plan = self.plan(key_type, value_type)
        schema = _renamed(plan.schema)
        for batch in record_batches(plan, self._chunks(progress), batch_rows):
            yield batch.rename_columns(schema.names)

    def to_pandas(self, **options: Any) -> pd.DataFrame:
        """The whole state as one DataFrame."""
        import pyarrow as pa

        schema = self.schema(options.get("key_type", "auto"), options.get("value_type", "auto"))
        return pa.Table.from_batches(list(self.read_batches(**options)), schema=schema).to_pandas()

    def __repr__(self) -> str:
        return f"OperatorStateView({self.name!r}, kind={self.kind}, value={self.value_type})"


def _renamed(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([f.with_name("subtask") if f.name == "key" else f for f in schema])


def operator_states(metadata: dict[str, Any], reader: StateReader | None) -> list[OperatorStateView]:
    """The operator states a checkpoint's metadata records (none without ``operator_state``)."""
    handles = metadata.get(OPERATOR_STATE) or []
    if not handles or reader is None:
        return []
    snapshots: list[Snapshot | None] = read_snapshots(handles, reader)
    by_name: dict[str, list[tuple[int, Any]]] = {}
    sizes: dict[str, list[int]] = {}
    for subtask, (snapshot, handle) in enumerate(zip(snapshots, handles, strict=True)):
        for name, entries in sorted((snapshot or {}).items()):
            by_name.setdefault(name, []).append((subtask, entries))
            sizes.setdefault(name, []).append(int(handle.get("size", 0)))
    return [OperatorStateView(name, parts, sizes[name]) for name, parts in sorted(by_name.items())]
