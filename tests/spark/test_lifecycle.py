"""The function lifecycle on Spark: one instance per partition and worker process, kept across
micro-batches (``open()`` again only when the partition's state was restored), ``close()`` when
its state is dropped."""

from __future__ import annotations

import json
import os

import pytest

from statekit import KeyedProcessFunction, Types, ValueStateDescriptor
from tests.spark.conftest import session
from tests.spark.jobs import Outputs, run_until_done, write_inputs

pytestmark = pytest.mark.spark


class Recording(KeyedProcessFunction):
    """Appends ``[event, pid, partition, batch]`` lines to a file: ``open``, ``close``, and the
    first element of each task (``task``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _note(self, event: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps([event, os.getpid(), self.ctx.get_job_parameter("partition"),
                                 self.ctx.get_job_parameter("batch_id")]) + "\n")

    def open(self, ctx):
        self.ctx = ctx
        self.count = ctx.get_state(ValueStateDescriptor("c", Types.LONG()))
        self.seen = None
        self._note("open")

    def process_element(self, row, ctx):
        batch = self.ctx.get_job_parameter("batch_id")
        if self.seen != batch:
            self.seen = batch
            self._note("task")
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        yield ctx.get_current_key(), n, row[1]

    def close(self):
        self._note("close")


# under slow (make test-slow runs tests one at a time): with other Spark sessions busy on the
# same two cores, Spark starts a new Python worker for a task before the previous one is idle
# again, so no partition's next batch meets the process that ran its last one
@pytest.mark.slow
@pytest.mark.parametrize("adapter", ["foreach_batch", "transform_with_state"])
def test_functions_are_opened_once_per_partition_and_process(tmp_path, adapter):
    # a session that reuses Python workers, asked for here: under pytest-xdist another module's
    # test may have replaced the module's session with one that does not
    spark = session()
    # which Python worker runs a task is Spark's choice: on a loaded machine it may start new
    # ones for a whole run, so a run without a partition's next batch in the same process is
    # run again (up to three times) before the property is checked
    for attempt in range(3):
        log = tmp_path / f"life-{attempt}.jsonl"
        inputs = str(tmp_path / f"in-{attempt}")
        write_inputs(inputs, 0, 6, rows=200, keys=40)
        run_until_done(spark, adapter, Recording(str(log)), inputs, str(tmp_path / f"cp-{attempt}"),
                       Outputs())
        events = [json.loads(line) for line in log.read_text().splitlines()]
        tasks = sorted({(pid, part, batch) for kind, pid, part, batch in events if kind == "task"})
        opens = [(pid, part, batch) for kind, pid, part, batch in events if kind == "open"]
        assert len(tasks) >= 12  # 6 batches, 2 partitions
        # a process that ran a partition's previous batch kept its function: no open() for it
        kept = [(pid, part, batch) for pid, part, batch in tasks if (pid, part, batch - 1) in tasks]
        if kept:
            break
    assert kept, "Spark never gave a partition's next batch to the same process (3 runs)"
    assert not set(kept) & set(opens), sorted(set(kept) & set(opens))
    assert len(opens) < len(tasks)
    # a function whose state was dropped (another process took the partition) was closed
    closes = [(pid, part) for kind, pid, part, _ in events if kind == "close"]
    for pid, part, batch in opens:
        earlier = [o for o in opens if o[:2] == (pid, part) and o[2] < batch]
        assert len([c for c in closes if c == (pid, part)]) >= len(earlier)
