"""End-to-end: both adapters x {hashmap, rocksdb} x {jobmanager, filesystem} on local Spark.

Each run injects a task failure mid-partition (Spark retries the task), makes the query fail after
a batch's state was committed but before Spark committed the batch (the restarted query re-runs
that batch), then adds input and restarts the stopped query from its checkpoint.  Results must
equal a pandas computation over the same input: no lost and no duplicated state updates.
"""

import sys

import pandas as pd
import pytest

from statekit.testing.workloads import VectorCount
from tests.spark.jobs import (
    KeyedVectorCount,
    Outputs,
    RunningCount,
    expected,
    run_until_done,
    write_inputs,
)

pytestmark = pytest.mark.spark

BACKENDS = ["hashmap", "rocksdb"]
STORAGES = ["jobmanager", "filesystem"]


def conf_for(backend, storage, tmp_path):
    conf = {"state.backend.type": backend}
    if storage == "filesystem":
        conf["state.checkpoints.dir"] = str(tmp_path / "statekit")
    return conf


#: the default run's cases: each adapter, each backend and each storage once; the rest are heavy
DEFAULT = {("foreach_batch", "rocksdb", "filesystem"), ("transform_with_state", "hashmap", "jobmanager")}


@pytest.mark.parametrize(("adapter", "backend", "storage"), [
    pytest.param(a, b, s, marks=() if (a, b, s) in DEFAULT else pytest.mark.heavy)
    for a in ("foreach_batch", "transform_with_state") for b in BACKENDS for s in STORAGES])
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


@pytest.mark.parametrize("adapter", ["foreach_batch",
                                     pytest.param("transform_with_state", marks=pytest.mark.heavy)])
def test_vectorized_form(spark, tmp_path, adapter):
    frame = write_inputs(str(tmp_path / "in"), 0, 3)
    sink = Outputs()
    run_until_done(spark, adapter, VectorCount(), str(tmp_path / "in"), str(tmp_path / "q"), sink,
                   {"state.checkpoints.dir": str(tmp_path / "statekit")})
    assert sink.final() == expected(frame)


@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state",
                                     "apply_in_pandas_with_state"])
def test_vectorized_function_gets_the_current_key(spark, tmp_path, adapter):
    """A VectorizedKeyedFunction gets the current key as a per-element function does: the key
    of the rows where the engine hands one key's rows (its state handles then read that key),
    and each row's key on every engine."""
    frame = write_inputs(str(tmp_path / "in"), 0, 2)
    sink = Outputs()
    run_until_done(spark, adapter, KeyedVectorCount(), str(tmp_path / "in"), str(tmp_path / "q"),
                   sink, {"state.backend.type": "rocksdb"}, restarts=0)
    assert sink.final() == expected(frame)


@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state",
                                     "apply_in_pandas_with_state"])
def test_tasks_run_with_the_drivers_python_when_sparks_lacks_statekit(spark, tmp_path, adapter):
    """A plain SparkSession starts Python workers with ``python3`` (``PYSPARK_PYTHON`` unset),
    which often lacks statekit (the driver runs in a virtual environment): every task failed at
    the first batch.  Here Spark's worker Python cannot import statekit (nor anything outside
    the standard library); statekit's tasks run with the driver's interpreter instead."""
    lacking = tmp_path / "python-without-statekit"
    lacking.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    lacking.chmod(0o755)
    frame = write_inputs(str(tmp_path / "in"), 0, 1)
    sink = Outputs()
    context = spark.sparkContext
    saved, context.pythonExec = context.pythonExec, str(lacking)  # as PYSPARK_PYTHON sets it
    try:
        run_until_done(spark, adapter, RunningCount(), str(tmp_path / "in"), str(tmp_path / "q"),
                       sink, restarts=0)
    finally:
        context.pythonExec = saved
    assert sink.final() == expected(frame)
