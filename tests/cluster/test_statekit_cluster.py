"""statekit on a real Spark standalone cluster: executors on other hosts (network namespaces),
a Worker killed mid-batch, a stop and a restart with more input; exact every time.

Every adapter x {hashmap, rocksdb} x {S3 checkpoints (moto on the bridge), JobManager storage
(the driver's server on its bridge address)}.  The recovery time (Worker killed -> next batch
committed) of each case is printed in the summary.
"""

import time
import uuid

import pandas as pd
import pytest

from tests.cluster.conftest import RECOVERY
from tests.spark.jobs import Outputs, RunningCount, expected, start, write_inputs

pytestmark = pytest.mark.cluster

ROWS, KEYS = 4_000, 300


def conf_for(storage, backend, s3):
    conf = {"state.backend.type": backend}
    if storage == "jobmanager":
        conf["state.checkpoint-storage"] = "jobmanager"
    else:
        bucket = s3.create_bucket(f"c-{uuid.uuid4().hex[:10]}")
        options = s3.storage_options()
        conf.update({"state.checkpoints.dir": f"{bucket}/statekit",
                     "s3.endpoint": options["endpoint_url"], "s3.access-key": options["key"],
                     "s3.secret-key": options["secret"], "s3.path.style.access": "true"})
    return conf


def wait_for(condition, what, timeout=300.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def committed(query):
    progress = query.recentProgress
    return max((p["batchId"] for p in progress), default=-1)


@pytest.mark.parametrize("storage", ["s3", "jobmanager"])
@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state",
                                     "apply_in_pandas_with_state"])
def test_worker_killed_mid_batch_then_restart_with_more_input(spark, spark_cluster, cluster_s3,
                                                              tmp_path, adapter, backend, storage):
    conf = conf_for(storage, backend, cluster_s3)
    conf["state.changelog.materialize-every-batches"] = 2  # applyInPandasWithState snapshots
    inputs, checkpoint, sink = str(tmp_path / "in"), str(tmp_path / "q"), Outputs()
    frames = [write_inputs(inputs, 0, 5, rows=ROWS, keys=KEYS)]
    query = start(spark, adapter, RunningCount(), inputs, checkpoint, sink, conf)
    wait_for(lambda: committed(query) >= 1, "two batches")
    wait_for(lambda: query.status["isTriggerActive"], "a batch running")
    time.sleep(0.3)
    killed_after = committed(query)
    spark_cluster.kill_worker(0)  # the Worker, its executor and Python workers: SIGKILL
    killed = time.monotonic()
    wait_for(lambda: committed(query) > killed_after or not query.isActive, "the next batch")
    RECOVERY[f"{adapter}/{backend}/{storage}"] = time.monotonic() - killed
    query.awaitTermination()
    assert query.exception() is None
    assert sink.final() == expected(frames[0])
    spark_cluster.start_worker(0)  # the Worker comes back; more input arrives; restart
    spark_cluster.wait_executors(spark)
    frames.append(write_inputs(inputs, 5, 2, rows=ROWS, keys=KEYS))
    query = start(spark, adapter, RunningCount(), inputs, checkpoint, sink, conf)
    query.awaitTermination()
    assert sink.final() == expected(pd.concat(frames))
    assert sum(len(rows) for rows in sink.by_batch.values()) == sum(len(f) for f in frames)

