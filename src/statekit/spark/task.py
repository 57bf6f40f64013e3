"""What every Spark adapter does inside a task: open the partition's state at the previous batch,
run the user's function over the rows, commit the new version durably, or abort."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from statekit.backends.base import StateBackend
from statekit.backends.bulk import BulkState
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import s3_options_from_config
from statekit.errors import StatekitError
from statekit.runtime.functions import (
    Function,
    KeyedProcessFunction,
    VectorizedKeyedFunction,
    open_function,
)
from statekit.runtime.partition import (
    DEFAULT_VERSIONS_RETAINED,
    PartitionStore,
    Scaling,
    external_sources,
    new_attempt_token,
)
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM
from statekit.serde.types import GenericSerializer
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
    #: the interpreter the driver runs statekit's tasks with when Spark's own lacks statekit
    worker_python: str | None = None

    def scaling(self, partition: int, partitions: int | None = None,
                key_types: list[str] | None = None) -> Scaling:
        """How ``partition`` relates to the others, for rescaling and starting from a savepoint."""
        count, types = partitions or self.partitions, key_types or self.key_types
        owns = SparkPartitioner(types, count).owns(partition) if types and count else None
        initial = None
        if self.savepoint_path:
            initial = functools.partial(external_sources, self.savepoint_path, self.operator_id,
                                        s3_options_from_config(self.conf))
        return Scaling(count if self.rescalable else None, owns, initial)

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
    """One task attempt's view of its partition state and function instance."""

    def __init__(self, spec: AdapterSpec, info: TaskInfo, scaling: Scaling | None = None) -> None:
        self.spec = spec
        self.info = info
        self.store = PartitionStore(
            spec.backend, spec.storage, info.query_id, spec.operator_id, info.partition,
            GenericSerializer(), spec.max_parallelism, spec.versions_retained,
            spec.allow_missing_state, scaling or spec.scaling(info.partition),
        )
        self.backend = self.store.open(info.batch_id, info.attempt_token)
        self.ctx = KeyedProcessFunction.Context(self.backend)
        self.bulk = BulkState(self.backend)
        self.function = open_function(
            spec.function, self.backend, spec.operator_id, info.partition, spec.max_parallelism,
            attempt=info.attempt_number,
            job_parameters={**spec.conf, "batch_id": info.batch_id, "partition": info.partition},
        )
        self.committed = False

    def process(self, key: Any, rows: Iterable[Sequence[Any]]) -> list[Any]:
        """Run the per-element function over one key's rows; the output rows."""
        out: list[Any] = []
        backend, func, ctx = self.backend, self.function, self.ctx
        backend.set_current_key(key)
        for row in rows:
            produced = func.process_element(row, ctx)  # type: ignore[attr-defined]
            if produced is not None:
                out.extend(produced)
        return out

    def process_keyed_rows(self, rows: Iterable[Sequence[Any]], key_index: list[int]) -> list[Any]:
        """Run the per-element function over rows of many keys (key taken from ``key_index``)."""
        out: list[Any] = []
        backend, func, ctx = self.backend, self.function, self.ctx
        single = key_index[0] if len(key_index) == 1 else None
        for row in rows:
            backend.set_current_key(row[single] if single is not None
                                    else tuple(row[i] for i in key_index))
            produced = func.process_element(row, ctx)  # type: ignore[attr-defined]
            if produced is not None:
                out.extend(produced)
        return out

    def process_frame(self, frame: Any) -> Any:
        """Run the vectorized function over a pandas DataFrame."""
        return self.function.process_batch(frame, self.bulk)  # type: ignore[attr-defined]

    def commit(self) -> None:
        self.function.close()
        self.store.commit({"spark_partition": self.info.partition,
                           "spark_attempt": self.info.attempt_number})
        self.committed = True

    def abort(self) -> None:
        if not self.committed:
            self.store.abort()
