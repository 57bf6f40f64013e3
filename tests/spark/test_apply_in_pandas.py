"""End-to-end: the applyInPandasWithState adapter x {hashmap, rocksdb} x {jobmanager, filesystem}."""

from collections import Counter

import pandas as pd
import pytest

from statekit.testing.workloads import VectorCount
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(("backend", "storage"), [
    ("rocksdb", "filesystem"), ("hashmap", "jobmanager"),  # the default run's: each once
    pytest.param("hashmap", "filesystem", marks=pytest.mark.heavy),
    pytest.param("rocksdb", "jobmanager", marks=pytest.mark.heavy)])
def test_exactly_once_across_retry_rerun_and_restart(spark, tmp_path, backend, storage):
    # snapshots within every task too: Spark hands a batch to any idle Python worker, and a task
    # on a worker that did not hold the partition restores instead of snapshotting at its start
    conf = {"state.backend.type": backend, "state.changelog.materialize-every-batches": 1,
            "state.changelog.materialize-after-calls": 10}
    if storage == "filesystem":
        conf["state.checkpoints.dir"] = str(tmp_path / "statekit")
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    sink = Outputs(fail_batch=2)
    checkpoint = str(tmp_path / "query")
    adapter = "apply_in_pandas_with_state"
    run_until_done(spark, adapter, RunningCount(fail=True), str(tmp_path / "in"), checkpoint, sink, conf)
    assert sink.final() == expected(frame)
    frame2 = write_inputs(str(tmp_path / "in"), 3, 3)
    run_until_done(spark, adapter, RunningCount(), str(tmp_path / "in"), checkpoint, sink, conf)
    assert sorted(sink.by_batch) == list(range(6))
    assert sink.final() == expected(pd.concat([frame, frame2]))
    assert sum(len(rows) for rows in sink.by_batch.values()) == len(frame) + len(frame2)
    if storage == "filesystem":  # one durable marker per task attempt, and snapshots were taken
        markers = list((tmp_path / "statekit").rglob("attempts/b*/*"))
        per_batch = Counter(str(m.parent) for m in markers)
        assert markers and max(per_batch.values()) <= 2
        assert list((tmp_path / "statekit").rglob("chk-*/_metadata"))


def test_vectorized_per_key_form(spark, tmp_path):
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    sink = Outputs()
    run_until_done(spark, "apply_in_pandas_with_state", VectorCount(), str(tmp_path / "in"),
                   str(tmp_path / "q"), sink, {"state.checkpoints.dir": str(tmp_path / "statekit")})
    assert sink.final() == expected(frame)


def test_integer_grouping_keys(spark, tmp_path):
    """pandas hands the grouping key over as NumPy scalars: an integer key (np.int64) failed
    every task ("cannot serialize object of type int64 without pickle")."""
    from statekit.spark import apply_in_pandas_with_state

    write_inputs(str(tmp_path / "in"), 0, 1)
    source = (spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1)
              .parquet(str(tmp_path / "in")).selectExpr("cast(substr(key, 2) as long) AS key", "v"))
    frame = pd.read_parquet(str(tmp_path / "in"))
    sink = Outputs()
    query = (apply_in_pandas_with_state(source.groupBy("key"), RunningCount(), "key long, c long, t long")
             .writeStream.foreachBatch(sink).outputMode("update")
             .option("checkpointLocation", str(tmp_path / "q")).trigger(availableNow=True).start())
    query.awaitTermination()
    want = {int(k[1:]): v for k, v in expected(frame).items()}
    assert sink.final() == want
