"""Local recovery on Spark: a partition restored by a new Python worker on the same executor
reads the executor's local copy of its version (under Spark's local directories)."""

from pathlib import Path

import pandas as pd
import pytest

from tests.spark.conftest import session
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = pytest.mark.spark


@pytest.fixture  # per test: under pytest-xdist another module's test may replace the session
def spark_no_reuse():
    yield session(**{"spark.python.worker.reuse": "false"})


def damage_newest_versions(state: Path) -> int:
    """Overwrite the state files of each partition's newest version in checkpoint storage."""
    damaged = 0
    for partition in state.glob("*/*/p*"):
        newest = max(partition.glob("chk-*/_metadata"), key=lambda m: int(m.parent.name[4:]))
        for f in newest.parent.iterdir():
            if f.name != "_metadata" and f.stat().st_size:
                f.write_bytes(b"\0" * f.stat().st_size)
                damaged += 1
    return damaged


def test_restart_restores_from_the_executors_local_copy(spark_no_reuse, tmp_path):
    """Every task runs in a fresh Python worker (no reuse), so each batch restores its
    partition; after the first run the versions' files in checkpoint storage are damaged, and
    the restarted query is still exact: its tasks read the executor's local copies."""
    conf = {"state.checkpoints.dir": str(tmp_path / "s"), "state.backend.local-recovery": "true",
            "state.storage.fs.memory-threshold": "0"}
    first = write_inputs(str(tmp_path / "in"), 0, 2)
    sink = Outputs()
    run_until_done(spark_no_reuse, "foreach_batch", RunningCount(), str(tmp_path / "in"),
                   str(tmp_path / "q"), sink, conf)
    assert damage_newest_versions(tmp_path / "s") >= 2
    second = write_inputs(str(tmp_path / "in"), 2, 1)
    run_until_done(spark_no_reuse, "foreach_batch", RunningCount(), str(tmp_path / "in"),
                   str(tmp_path / "q"), sink, conf)
    assert sink.final() == expected(pd.concat([first, second], ignore_index=True))
