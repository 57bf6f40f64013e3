"""What every Spark adapter does inside a task: open the partition's state at the previous batch,
run the user's function over the rows, commit the new version durably, or abort."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from statekit.backends.base import NO_KEY, StateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import s3_options_from_config
from statekit.errors import StatekitError
from statekit.runtime.functions import Function, VectorizedKeyedFunction
from statekit.runtime.localrecovery import enabled as local_recovery_enabled
from statekit.runtime.operator import KeyedOperator
from statekit.runtime.partition import (
    DEFAULT_VERSIONS_RETAINED,
    PartitionStore,
    Scaling,
    external_sources,
    new_attempt_token,
)
from statekit.runtime.timers import Refusal
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange
from statekit.serde.types import GenericSerializer
from statekit.spark.clock import BatchClock, epoch_ms
from statekit.spark.partitioning import SparkPartitioner

log = logging.getLogger("statekit.spark")

BATCH_ID = "streaming.sql.batchId"
QUERY_ID = "sql.streaming.queryId"


@dataclass
class AdapterSpec:
    """Everything a task needs, resolved on the driver and shipped with the UDF."""

    function: Function
    backend: StateBackend
    storage: CheckpointStorage
    operator_id: str
    key_columns: list[str]
    output_columns: list[str]
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    versions_retained: int = DEFAULT_VERSIONS_RETAINED
    conf: dict[str, Any] = field(default_factory=dict)
    allow_missing_state: bool = False
    #: the key columns' Spark types and the query's partition count where known at the call:
    #: what Spark's hash partitioning needs to tell which partition owns a key
    key_types: list[str] | None = None
    partitions: int | None = None
    #: whether the partition count may change between runs (foreach_batch's own repartition)
    rescalable: bool = False
    #: another query's state this one starts from when it has none (execution.savepoint.path)
    savepoint_path: str | None = None
    #: where each row's event time is (``ctx.timestamp()``): the column's position in the rows
    #: the function gets, and the session time zone naive timestamps are wall times of
    event_time_column: str | None = None
    timestamp_index: int | None = None
    time_zone: str = "UTC"
    #: the interpreter the driver runs statekit's tasks with when Spark's own lacks statekit
    worker_python: str | None = None

    def scaling(self, partition: int, partitions: int | None = None,
                key_types: list[str] | None = None,
                key_groups: KeyGroupRange | None = None) -> Scaling:
        """How ``partition`` relates to the others, for rescaling and starting from a savepoint:
        it owns ``key_groups`` where rows are routed by key group, else the keys Spark's hash
        sends it."""
        count, types = partitions or self.partitions, key_types or self.key_types
        owns = None
        if key_groups is None and types and count:
            owns = SparkPartitioner(types, count).owns(partition)
        initial = None
        if self.savepoint_path:
            initial = functools.partial(external_sources, self.savepoint_path, self.operator_id,
                                        s3_options_from_config(self.conf))
        return Scaling(count if self.rescalable else None, owns, initial, key_groups)

    @property
    def vectorized(self) -> bool:
        return isinstance(self.function, VectorizedKeyedFunction)


_TOKENS: dict[tuple[int, int, int, int], str] = {}


@dataclass
class TaskInfo:
    """Identity of the running Spark task (from ``TaskContext`` and its local properties)."""

    batch_id: int
    query_id: str
    partition: int
    attempt_number: int
    attempt_token: str

    @staticmethod
    def current(batch_id: int | None = None) -> TaskInfo:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is None:
            raise StatekitError("statekit adapters must run inside a Spark task")
        batch = batch_id if batch_id is not None else tc.getLocalProperty(BATCH_ID)
        if batch is None:
            raise StatekitError("no micro-batch id: statekit adapters need a streaming query")
        query = tc.getLocalProperty(QUERY_ID) or "query"
        ids = (tc.stageId(), tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId())
        token = _TOKENS.get(ids)
        if token is None:  # one token per task attempt: every call of the task shares it
            if len(_TOKENS) > 10_000:
                _TOKENS.clear()
            token = _TOKENS[ids] = new_attempt_token(*ids)
        return TaskInfo(int(batch), query, tc.partitionId(), tc.attemptNumber(), token)


class PartitionTask:
    """One task attempt's view of its partition: the state opened at the previous batch, the
    operator running the user's function on it, and the batch's time.

    The operator (the opened function) is kept with the state in this process across batches,
    so ``open()`` runs once per partition and process (again only after a restore), and
    ``close()`` when the state is dropped.
    """

    def __init__(self, spec: AdapterSpec, info: TaskInfo, scaling: Scaling | None = None,
                 refusal: Refusal | None = None) -> None:
        self.spec = spec
        self.info = info
        self.store = PartitionStore(
            spec.backend, spec.storage, info.query_id, spec.operator_id, info.partition,
            GenericSerializer(), spec.max_parallelism, spec.versions_retained,
            spec.allow_missing_state, scaling or spec.scaling(info.partition),
            local_recovery=local_recovery_enabled(spec.conf),
        )
        self.backend = self.store.open(info.batch_id, info.attempt_token)
        self.clock = BatchClock()
        op = self.store.operator
        if op is None:
            try:
                op = KeyedOperator(
                    spec.function, self.backend, task_name=spec.operator_id, index=info.partition,
                    max_parallelism=spec.max_parallelism, attempt=info.attempt_number,
                    job_parameters={**spec.conf, "partition": info.partition,
                                    "batch_id": info.batch_id},
                    clock=self.clock, refusal=refusal)
            except BaseException:
                self.store.abort()
                raise
            self.store.operator = op
        else:
            op.timers.clock = self.clock
            op.runtime_context.begin_attempt(info.attempt_number, batch_id=info.batch_id)
        self.op = op
        self.committed = False

    @property
    def function(self) -> Any:
        return self.op.function

    def set_time(self, processing_time: int, watermark: int) -> None:
        """The micro-batch's time: its processing time and watermark (never moving back)."""
        self.clock.now = processing_time
        if watermark > self.op.timers.watermark:
            self.op.timers.watermark = watermark

    def fire_due(self) -> list[Any]:
        """Fire the timers due at the batch's time (both domains, in timestamp order); their
        outputs (rows, or frames for a vectorized function)."""
        out: list[Any] = []
        self.op.fire_due(self.clock.now, None, out)
        return out

    def timestamp_of(self) -> Callable[[Sequence[Any]], int | None] | None:
        """``row -> its event time`` when the adapter names an event-time column."""
        index, tz = self.spec.timestamp_index, self.spec.time_zone
        if index is None:
            return None
        return lambda row: epoch_ms(row[index], tz)

    def process(self, key: Any, rows: Iterable[Sequence[Any]]) -> list[Any]:
        """Run the per-element function over one key's rows; the output rows."""
        return self.op.process_key_rows(key, rows, self.timestamp_of())

    def process_keyed_rows(self, rows: Iterable[Sequence[Any]], key_index: list[int]) -> list[Any]:
        """Run the per-element function over rows of many keys (key taken from ``key_index``)."""
        out: list[Any] = []
        op, ts, tz = self.op, self.spec.timestamp_index, self.spec.time_zone
        single = key_index[0] if len(key_index) == 1 else None
        for row in rows:
            key = row[single] if single is not None else tuple(row[i] for i in key_index)
            produced = op.process_element(key, row, None if ts is None else epoch_ms(row[ts], tz))
            if produced is not None:
                out.extend(produced)
        return out

    def process_frame(self, frame: Any, key: Any = NO_KEY,
                      keys_of: Callable[[], list[Any]] | None = None) -> Any:
        """Run the vectorized function over a pandas DataFrame: the rows of ``key``, or of many
        keys (``keys_of()`` lists each row's key)."""
        return self.op.process_frame(frame, key, keys_of)

    def commit(self) -> None:
        self.store.commit({"spark_partition": self.info.partition,
                           "spark_attempt": self.info.attempt_number})
        self.committed = True

    def abort(self) -> None:
        if not self.committed:
            self.store.abort()
