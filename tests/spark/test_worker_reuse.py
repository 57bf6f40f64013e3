"""Exactly-once with ``spark.python.worker.reuse=false``: every task is a fresh Python process,
so no partition state is ever reused locally and each batch restores from checkpoint storage."""

import pytest

from tests.spark.conftest import session
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark


@pytest.fixture  # per test: under pytest-xdist another module's test may replace the session
def spark_no_reuse():
    yield session(**{"spark.python.worker.reuse": "false"})


@pytest.mark.slow  # 30-90 s each: make test-slow (the fresh-worker snapshot case below stays)
@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state",
                                     "apply_in_pandas_with_state"])
def test_no_worker_reuse(spark_no_reuse, tmp_path, adapter):
    frame = write_inputs(str(tmp_path / "in"), 0, 2)  # batch 1 fails (task and sink) and re-runs
    sink = Outputs(fail_batch=1)
    run_until_done(spark_no_reuse, adapter, RunningCount(fail=True), str(tmp_path / "in"),
                   str(tmp_path / "q"), sink,
                   {"state.backend.type": "rocksdb", "state.checkpoints.dir": str(tmp_path / "s"),
                    "state.changelog.materialize-every-batches": 1,
                    "state.changelog.materialize-after-calls": 5})
    assert sink.final() == expected(frame)
    assert sum(len(r) for r in sink.by_batch.values()) == len(frame)
    if adapter == "apply_in_pandas_with_state":  # fresh processes still materialize (mid-task)
        assert list((tmp_path / "s").rglob("chk-*/_metadata"))


def test_apply_in_pandas_snapshots_in_fresh_workers_with_default_settings(spark_no_reuse, tmp_path):
    """Every task in a new Python process, fewer key calls per task than
    materialize-after-calls: no task ever started in a process that held its partition, so
    nothing was ever snapshotted and each key's log held its whole history.  Snapshots are now
    taken at the end of the task whose partition is due."""
    frame = write_inputs(str(tmp_path / "in"), 0, 6, rows=1000, keys=200)
    sink = Outputs()
    run_until_done(spark_no_reuse, "apply_in_pandas_with_state", RunningCount(),
                   str(tmp_path / "in"), str(tmp_path / "q"), sink,
                   {"state.checkpoints.dir": str(tmp_path / "s")})
    assert sink.final() == expected(frame)
    snapshots = {m.parent.parent.name for m in (tmp_path / "s").rglob("chk-*/_metadata")}
    assert snapshots == {"p00000", "p00001"}
