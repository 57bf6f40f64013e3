"""applyInPandasWithState on local Spark with default settings: snapshots come on schedule and
every key's carried log stays within its bounds, with a CPU hog beside the query as well (at two
cores, Spark then hands tasks to whichever Python worker is free, and starts more of them).

The carried logs are read with Spark's own state store reader, as the tools read them."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from statekit import config as cfg
from statekit.inspection import list_checkpoints
from statekit.serde.msgpack import unpackb
from statekit.spark.apply_in_pandas import MATERIALIZE_KEY, MAX_LOG_KEY
from tests.spark.jobs import Outputs, RunningCount, expected, run_until_done, write_inputs

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # minutes: the regressions run by default in
# test_apply_in_pandas_schedule.py (simulated) and test_worker_reuse.py (fresh workers)

EVERY = cfg.default(MATERIALIZE_KEY)
MAX_LOG_BYTES = cfg.default(MAX_LOG_KEY)


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """Busy loops beside the test, one per core, ended with it."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def carried_logs(spark, checkpoint: str) -> list[tuple[int, int, int]]:
    """Per key: (bytes of its carried log, entries, batch of its oldest entry)."""
    rows = (spark.read.format("statestore").load(checkpoint)
            .selectExpr("value.groupState.log AS log").collect())
    out = []
    for row in rows:
        entries = unpackb(bytes(row["log"])) if row["log"] else []
        out.append((len(row["log"] or b""), len(entries),
                    min((e[1] for e in entries), default=-1)))
    return out


@pytest.mark.parametrize("hog", [False, True], ids=["quiet", "cpu-hog"])
def test_snapshots_on_schedule_and_bounded_logs_with_default_settings(spark, tmp_path, hog):
    """1,000 users (2,000 under the hog) over 4 partitions, one batch per file, default
    settings: each partition's newest snapshot at most the schedule behind, each key's log
    within its bounds.  (A 5-batch run with 2,000 users used to leave no snapshot at all.)"""
    batches, rows, keys = (12, 4000, 2000) if hog else (7, 2000, 1000)
    frame = write_inputs(str(tmp_path / "in"), 0, batches, rows=rows, keys=keys)
    checkpoint, sink = str(tmp_path / "query"), Outputs()
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "4")
    try:
        with cpu_hog(2) if hog else contextlib.nullcontext():
            run_until_done(spark, "apply_in_pandas_with_state", RunningCount(),
                           str(tmp_path / "in"), checkpoint, sink)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    assert sink.final() == expected(frame)
    last = batches - 1
    newest = {}
    for info in list_checkpoints(checkpoint):
        if info.status == "retained":
            newest[info.partition] = max(newest.get(info.partition, -1), info.batch)
    logs = carried_logs(spark, checkpoint)
    sizes = sorted(size for size, _, _ in logs)
    print(f"\nnewest snapshot per partition: {newest} (last batch {last}); carried logs of "
          f"{len(logs)} keys: max {sizes[-1]} B, median {sizes[len(sizes) // 2]} B, max "
          f"{max(n for _, n, _ in logs)} entries, oldest change of batch "
          f"{min(b for _, _, b in logs if b >= 0)}")
    assert set(newest) == {0, 1, 2, 3}
    assert min(newest.values()) >= last - EVERY  # on schedule, in every partition
    assert max(n for _, n, _ in logs) <= EVERY + 1
    assert sizes[-1] <= MAX_LOG_BYTES
