"""Spark's ``QueryInfo``: which query, run and micro-batch a ``StatefulProcessor`` runs in
(``StatefulProcessorHandle.getQueryInfo()``), read from Spark's own task properties."""

from __future__ import annotations

import re
import uuid

from statekit.errors import StateError
from statekit.spark.task import QUERY_ID

#: local properties of a micro-batch's tasks: Spark runs each batch's jobs in the job group of
#: the query's run, and describes them with the run's id
_JOB_GROUP = "spark.jobGroup.id"
_JOB_DESCRIPTION = "spark.job.description"
_RUN_LINE = re.compile(r"^runId = ([0-9a-fA-F-]{36})$", re.M)


class QueryInfo:
    """Spark's ``QueryInfo`` (``StatefulProcessorHandle.getQueryInfo()``): the running query's
    id, the id of its current run and the micro-batch's id, as Spark's task sees them."""

    def __init__(self, query_id: uuid.UUID, run_id: uuid.UUID, batch_id: int) -> None:
        self._query_id = query_id
        self._run_id = run_id
        self._batch_id = batch_id

    @staticmethod
    def of_task(batch_id: int) -> QueryInfo:
        """The running task's query, run and ``batch_id`` (from Spark's local properties)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise StateError("getQueryInfo() outside a Spark task")
        query = context.getLocalProperty(QUERY_ID)
        run = context.getLocalProperty(_JOB_GROUP)
        if not _is_uuid(run):  # the batch's job group changed by user code: its description
            found = _RUN_LINE.search(context.getLocalProperty(_JOB_DESCRIPTION) or "")
            run = found.group(1) if found else None
        if not _is_uuid(query) or not _is_uuid(run):
            raise StateError(f"Spark's task names no streaming query and run (query id "
                             f"{query!r}, run id {run!r}): getQueryInfo() needs a micro-batch")
        return QueryInfo(uuid.UUID(query), uuid.UUID(run), int(batch_id))

    @staticmethod
    def on_driver() -> QueryInfo:
        """What Spark's driver-side handle answers while ``init`` runs there: new ids, batch 0."""
        return QueryInfo(uuid.uuid4(), uuid.uuid4(), 0)

    def getQueryId(self) -> uuid.UUID:
        """The query's id (``StreamingQuery.id``), the same across restarts."""
        return self._query_id

    def getRunId(self) -> uuid.UUID:
        """The id of this run of the query (``StreamingQuery.runId``), new at each start."""
        return self._run_id

    def getBatchId(self) -> int:
        """The micro-batch's id."""
        return self._batch_id

    def __str__(self) -> str:
        return f"QueryInfo(queryId={self._query_id}, runId={self._run_id}, batchId={self._batch_id})"

    __repr__ = __str__


def _is_uuid(text: str | None) -> bool:
    try:
        uuid.UUID(str(text))
    except ValueError:
        return False
    return text is not None
