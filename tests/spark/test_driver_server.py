"""The driver's server with real queries: two queries whose functions have the same class name
(the default operator id) keep their JobManager checkpoints in separate areas, and a task learns
the checkpoint location of its own query only."""

from __future__ import annotations

import functools

import pandas as pd
import pytest

from statekit.spark import foreach_batch, transform_with_state
from statekit.spark.jobmanager import JobManagerServer, QueryCheckpointStorage, _lookup
from tests.spark.jobs import OUTPUT, Outputs, RunningCount, expected, write_inputs

pytestmark = pytest.mark.spark

JOBMANAGER = {"state.checkpoint-storage": "jobmanager"}


def _probe(url: str, secret: str, query_ids: list[str], batches):
    """In a task of the query running the batch: what the server answers for each query id."""
    for _ in batches:
        pass
    statuses = [_lookup(url, secret, query_id)[0] for query_id in query_ids]
    yield pd.DataFrame({"query": query_ids, "status": statuses})


class ProbingOutputs(Outputs):
    """A sink that also asks the driver's server, from a task of its query, where each of
    ``queries()`` keeps its checkpoint."""

    def __init__(self, url: str, secret: str, queries) -> None:
        super().__init__()
        self.url, self.secret, self.queries = url, secret, queries
        self.answers: dict[str, int] = {}

    def __call__(self, df, batch_id):
        super().__call__(df, batch_id)
        probe = functools.partial(_probe, self.url, self.secret, self.queries())
        rows = df.sparkSession.range(1, numPartitions=1).mapInPandas(
            probe, "query string, status int").collect()
        self.answers.update({r["query"]: r["status"] for r in rows})


def test_queries_with_same_named_functions_stay_apart(spark, tmp_path):
    frame_a = write_inputs(str(tmp_path / "in-a"), 0, 3)
    frame_b = write_inputs(str(tmp_path / "in-b"), 10, 3, keys=25)
    source = spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1)
    sink_b = Outputs()
    query_b = (transform_with_state(source.parquet(str(tmp_path / "in-b")).groupBy("key"),
                                    RunningCount(), OUTPUT, conf=JOBMANAGER)
               .writeStream.foreachBatch(sink_b).outputMode("update")
               .option("checkpointLocation", str(tmp_path / "query-b")).start())
    try:
        lookups = QueryCheckpointStorage.start(spark, {})  # a query definition's secret
        sink_a = ProbingOutputs(lookups.url, lookups.secret, lambda: [query_a.id, query_b.id])
        query_a = (source.parquet(str(tmp_path / "in-a")).writeStream
                   .foreachBatch(foreach_batch(RunningCount(), "key", OUTPUT, sink_a, conf=JOBMANAGER))
                   .option("checkpointLocation", str(tmp_path / "query-a"))
                   .trigger(availableNow=True).start())
        query_a.awaitTermination()
        query_b.processAllAvailable()
    finally:
        query_b.stop()
    assert sink_a.final() == expected(frame_a)
    assert sink_b.final() == expected(frame_b)
    # a task of query A learns its own location, never B's
    assert sink_a.answers == {query_a.id: 200, query_b.id: 403}
    # both operators are "RunningCount": each query's checkpoints lie in an area of their own
    server = JobManagerServer.get(spark)
    areas: dict[str, set[str]] = {}
    for key in server.store.list(""):
        area, query_id = key.split("/")[:2]
        if query_id in (query_a.id, query_b.id):
            areas.setdefault(area, set()).add(query_id)
    assert sorted(map(sorted, areas.values())) == sorted([[query_a.id], [query_b.id]])
