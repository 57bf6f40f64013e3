"""End-to-end: both adapters x {hashmap, rocksdb} x {jobmanager, filesystem} on local Spark.

Each run injects a task failure mid-partition (Spark retries the task), makes the query fail after
a batch's state was committed but before Spark committed the batch (the restarted query re-runs
that batch), then adds input and restarts the stopped query from its checkpoint.  Results must
equal a pandas computation over the same input: no lost and no duplicated state updates.
"""

import pandas as pd
import pytest

from statekit.testing.workloads import VectorCount
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark

BACKENDS = ["hashmap", "rocksdb"]
STORAGES = ["jobmanager", "filesystem"]


def conf_for(backend, storage, tmp_path):
    conf = {"state.backend.type": backend}
    if storage == "filesystem":
        conf["state.checkpoints.dir"] = str(tmp_path / "statekit")
    return conf


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state"])
def test_exactly_once_across_retry_rerun_and_restart(spark, tmp_path, adapter, backend, storage):
    conf = conf_for(backend, storage, tmp_path)
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    sink = Outputs(fail_batch=2)
    checkpoint = str(tmp_path / "query")
    run_until_done(spark, adapter, RunningCount(fail=True), str(tmp_path / "in"), checkpoint, sink, conf)
    assert sorted(sink.by_batch) == [0, 1, 2]
    assert sink.final() == expected(frame)
    # the query stopped at the end of its input; more input arrives and it is restarted
    frame2 = write_inputs(str(tmp_path / "in"), 3, 2)
    run_until_done(spark, adapter, RunningCount(), str(tmp_path / "in"), checkpoint, sink, conf)
    assert sorted(sink.by_batch) == [0, 1, 2, 3, 4]
    assert sink.final() == expected(pd.concat([frame, frame2]))
    assert sum(len(rows) for rows in sink.by_batch.values()) == len(frame) + len(frame2)


@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state"])
def test_vectorized_form(spark, tmp_path, adapter):
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    sink = Outputs()
    run_until_done(spark, adapter, VectorCount(), str(tmp_path / "in"), str(tmp_path / "q"), sink,
                   {"state.checkpoints.dir": str(tmp_path / "statekit")})
    assert sink.final() == expected(frame)
