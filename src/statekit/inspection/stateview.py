"""One state of an opened checkpoint (:class:`StateView`), across the partitions that hold it,
readable as Arrow record batches or cut into picklable splits (Spark reads one per task)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekit.backends.timers import TIMER_STATE_PREFIX, is_timer_state
from statekit.inspection.arrow import RowPlan, TypeChoice, record_batches
from statekit.inspection.entries import PartitionSource, iter_chunks
from statekit.inspection.model import PartitionInfo, StateInfo
from statekit.serde.keygroups import KeyGroupRange

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

Progress = Callable[[int], None] | None


def timer_domain(state_name: str) -> str | None:
    """The time domain of a timer queue's state name (None for other states)."""
    if not is_timer_state(state_name):
        return None
    queue = state_name[len(TIMER_STATE_PREFIX):]
    return "PROCESSING_TIME" if queue.startswith("processing") else "EVENT_TIME"


def state_chunks(source: PartitionSource, name: str, key_groups: KeyGroupRange | None = None,
                 progress: Progress = None) -> Iterator[Any]:
    """:func:`iter_chunks`, timer queues' chunks tagged with their time domain."""
    domain = timer_domain(name)
    for chunk in iter_chunks(source, name, key_groups, progress):
        chunk.domain = domain
        yield chunk


@dataclass(frozen=True)
class StateSplit:
    """A picklable piece of one state: one partition, optionally one key-group range of it."""

    source: PartitionSource
    state: str
    key_groups: tuple[int, int] | None = None


class StateView:
    """One state of an opened checkpoint, across the partitions that hold it."""

    def __init__(self, name: str, operator: str, parts: list[tuple[PartitionInfo, StateInfo,
                                                                        PartitionSource]]) -> None:
        self.name = name
        self.operator = operator
        self._parts = parts
        first = parts[0][1]
        self.kind, self.layout, self.ttl = first.kind, first.layout, first.ttl
        self.value_type, self.user_key_type = first.value_type, first.user_key_type
        # the key type the snapshots record (generic, so inferred, when absent or mixed)
        recorded = [source.handle.get("key_type", "generic") for _, _, source in parts]
        self.key_config = recorded[0] if all(r == recorded[0] for r in recorded) else "generic"
        self._plans: dict[tuple[Any, ...], RowPlan] = {}

    @property
    def partitions(self) -> list[PartitionInfo]:
        return [p for p, _, _ in self._parts]

    @property
    def bytes(self) -> int | None:
        """Bytes of the state's own data, when its encoding records them (not RocksDB)."""
        sizes = [s.bytes for _, s, _ in self._parts]
        return None if any(b is None for b in sizes) else sum(b for b in sizes if b is not None)

    @property
    def keys(self) -> int | None:
        """Number of keys, when it is known without reading the state (see :meth:`count`)."""
        counts = [s.keys for _, s, _ in self._parts]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def plan(self, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto",
             user_key_type: TypeChoice = "auto") -> RowPlan:
        """How entries become rows (untyped columns inferred from the first entries once)."""
        cache_key = (str(key_type), str(value_type), str(user_key_type))
        plan = self._plans.get(cache_key)
        if plan is None:
            plan = RowPlan(self.layout, self.kind, self._sample, key_type=key_type,
                           value_type=value_type, user_key_type=user_key_type,
                           key_config=self.key_config)
            self._plans[cache_key] = plan
        return plan

    def _sample(self) -> Any:
        for _, state, source in self._parts:
            for chunk in state_chunks(source, state.name):
                if chunk.keys:
                    return chunk
        return None

    def schema(self, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto") -> pa.Schema:
        """The Arrow schema of :meth:`read_batches`: ``key``, ``index`` (lists) or ``user_key``
        (maps), ``value``, and ``ttl_timestamp`` for TTL states."""
        return self.plan(key_type, value_type).schema

    def splits(self, key_group_splits: int = 1) -> list[StateSplit]:
        """The state cut into picklable pieces: per partition, ``key_group_splits`` key-group
        ranges each (Spark reads one per task)."""
        out = []
        for _, state, source in self._parts:
            rng = source.key_groups
            n = max(1, min(int(key_group_splits), len(rng)))
            for i in range(n):
                lo = rng.start + len(rng) * i // n
                hi = rng.start + len(rng) * (i + 1) // n - 1
                out.append(StateSplit(source, state.name, None if n == 1 else (lo, hi)))
        return out

    def read_batches(self, *, key_type: TypeChoice = "auto", value_type: TypeChoice = "auto",
                     partitions: list[int] | None = None, key_groups: tuple[int, int] | None = None,
                     batch_rows: int = 65536, progress: Progress = None
                     ) -> Iterator[pa.RecordBatch]:
        """The state as record batches, streamed: one batch (about ``batch_rows`` rows) in
        memory at a time.  ``partitions`` (indexes into :attr:`partitions`) and ``key_groups``
        (an inclusive range) select part of it; ``progress(n)`` is told the bytes read."""
        plan = self.plan(key_type, value_type)
        rng = None if key_groups is None else KeyGroupRange.of(key_groups)
        chosen = [(state.name, src) for i, (_, state, src) in enumerate(self._parts)
                  if partitions is None or i in partitions]

        def chunks() -> Iterator[Any]:
            for name, source in chosen:
                yield from state_chunks(source, name, rng, progress)

        yield from record_batches(plan, chunks(), batch_rows)

    def count(self, progress: Progress = None) -> int:
        """The exact number of keys (reads the whole state, streaming)."""
        return sum(len(chunk.keys) for _, state, source in self._parts
                   for chunk in iter_chunks(source, state.name, progress=progress))

    def to_pandas(self, **options: Any) -> pd.DataFrame:
        """The whole state as one DataFrame: for small states (tests, notebooks); large ones
        belong in :meth:`read_batches` or :func:`statekit.inspection.export_state`."""
        import pyarrow as pa

        plan = self.plan(options.get("key_type", "auto"), options.get("value_type", "auto"))
        batches = list(self.read_batches(**options))
        return pa.Table.from_batches(batches, schema=plan.schema).to_pandas()

    def __repr__(self) -> str:
        return f"StateView({self.name!r}, kind={self.kind}, value={self.value_type}, ttl={self.ttl})"
