"""``StatefulProcessorHandle.getQueryInfo()``: Spark's own query id, run id and micro-batch id.

PySpark's handle has no ``getQueryInfo`` (Spark's Scala and Java handle has), so Spark's Python
tests have no case using it; ported here is the use in Spark's Scala suite
(``TransformWithStateSuite``'s ``RunningCountStatefulProcessor`` asserts
``handle.getQueryInfo().getBatchId >= 0`` in ``init``), and each value is checked against the
query Spark runs: the id of ``StreamingQuery.id`` (the same after a restart), the run id of
``StreamingQuery.runId`` (new at each start) and the id of the batch the sink receives.
"""

import os
import shutil
import tempfile

import pandas as pd
import pytest
from pyspark.sql.streaming import StatefulProcessor

pytestmark = pytest.mark.spark


class RunningCountWithQueryInfo(StatefulProcessor):
    """Spark's ``RunningCountStatefulProcessor`` (its ``init`` checks the batch id), emitting
    the query info each key's call sees."""

    def init(self, handle):
        self.handle = handle
        assert handle.getQueryInfo().getBatchId() >= 0
        self.count = handle.getValueState("countState", "value long")

    def handleInputRows(self, key, rows, timerValues):
        count = (self.count.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
        self.count.update((count,))
        info = self.handle.getQueryInfo()
        yield pd.DataFrame({"key": [key[0]], "count": [count],
                            "query": [str(info.getQueryId())], "run": [str(info.getRunId())],
                            "batch": [info.getBatchId()]})

    def close(self):
        pass


def test_query_info_is_sparks_query_run_and_batch(spark, backend):
    work = tempfile.mkdtemp()
    try:
        seen = {}

        def sink(df, batch_id):
            seen[batch_id] = [tuple(r) for r in df.collect()]

        def run(files):
            for i, users in files:
                path = f"{work}/in/part-{i}.parquet"
                pd.DataFrame({"key": users}).to_parquet(path)
                os.utime(path, (1_000_000 + i, 1_000_000 + i))
            query = (spark.readStream.schema("key string").option("maxFilesPerTrigger", 1)
                     .parquet(f"{work}/in").groupBy("key")
                     .transformWithStateInPandas(RunningCountWithQueryInfo(),
                                                 "key string, count long, query string, "
                                                 "run string, batch long", "Update", "None")
                     .writeStream.outputMode("update").foreachBatch(sink)
                     .option("checkpointLocation", f"{work}/q").trigger(availableNow=True)
                     .start())
            query.awaitTermination()
            return query.id, query.runId

        os.makedirs(f"{work}/in")
        first = run([(0, ["a", "b", "a"]), (1, ["a"])])
        second = run([(2, ["b", "c"])])  # restarted from its checkpoint: a new run
        assert first[0] == second[0] and first[1] != second[1]
        assert sorted(seen) == [0, 1, 2]
        for batch, rows in seen.items():
            query, run_id = first if batch < 2 else second
            assert rows and all(r[2:] == (query, run_id, batch) for r in rows), (batch, rows)
        assert sorted(r[:2] for r in seen[2]) == [("b", 2), ("c", 1)]  # the state went on
    finally:
        shutil.rmtree(work, ignore_errors=True)
