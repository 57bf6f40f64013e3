"""A Spark driver process for the differential runs: each workload's unchanged user code run
natively by Spark and through statekit's switch (one query per statekit backend) over the same
input files, batch by batch in lockstep; a second, new process goes on from the checkpoints.

``python -m tests.spark.compat.diff_driver WORK FIRST LAST WORKLOADS BACKENDS [--flush]`` writes
input files ``FIRST..LAST-1`` of each workload (``WORK/in-<workload>``) one at a time and hands
each to one query after the other (a hard link in ``WORK/in-<workload>-<run>``), waiting until
the query has run the file's batch (and, without processing time, every batch that follows
without input).  Before each file of a processing-time workload it waits until ``PERIOD`` plus
a margin has passed since the last batch that read a file, and until every query has run a batch
that late (but before the first file of a process: a restarted query runs no batch before it
has input): every TTL and timer set by earlier files is then long due, and every due timer has
fired.  A processing-time workload ends with a last such wait (when the queries stop would
decide otherwise whether a timer fires before the stop or in the first batch after the
restart); ``--flush`` ends an event-time one with a tick file (the watermark passes every
session).
Each batch's output rows go to ``WORK/out/<workload>-<run>/b<batch>.json`` (``run``: ``spark``
or the statekit backend); a re-run batch replaces its file.  Workloads run one after the other
(a loaded machine's Python workers miss their start-up deadline when many start at once).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tests.spark.compat.diff_workloads import PERIOD, WORKLOADS, rows_of, tick_rows

NATIVE = "spark"
MARGIN_MS = 2_000
TIMEOUT_S = 600
MAX_RESTARTS = 20
#: how Spark reports a Python worker that missed its start-up deadline on a loaded machine
STARTUP_FAILURES = ("failed to connect back", "STREAMING_PYTHON_RUNNER_INITIALIZATION")


def write(directory: Path, index: int, rows: list[tuple[str, int, int]]) -> Path:
    """Input file ``index`` (its modification time orders the files)."""
    directory.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["k", "v", "ms"])
    path = directory / f"part-{index:04d}.parquet"
    tmp = directory / f".part-{index:04d}.tmp"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp)
    os.utime(tmp, (1_000_000 + index, 1_000_000 + index))
    os.replace(tmp, path)
    return path


def batches(checkpoint: Path) -> list[dict[str, Any]]:
    """The query's planned batches from its offset and commit logs: id, the last file read
    (``offset``), timestamp, committed, and whether it read a file (``data``)."""
    done = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
    out: list[dict[str, Any]] = []
    for path in sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            lines = path.read_text().splitlines()
            offset = json.loads(lines[-1])["logOffset"]
            stamp = json.loads(lines[1])["batchTimestampMs"]
        except (OSError, ValueError, IndexError, KeyError):
            continue  # being written
        data = not out or offset > out[-1]["offset"]
        out.append({"batch": int(path.name), "offset": offset, "ts": stamp,
                    "committed": path.name in done, "data": data})
    return out


def main(work: str, first: int, last: int, workloads: list[str], backends: list[str],
         flush: bool) -> None:
    from statekit.spark import local_spark

    root = Path(work)
    spark = local_spark(master="local[2,3]", conf={  # task retries: a loaded machine's workers
        "spark.sql.shuffle.partitions": "2",         # can miss their start-up deadline
        "spark.statekit.state.changelog.materialize-every-batches": "2"})
    starter = Starter(spark, root)
    results, failed = [], []
    for name in workloads:  # one workload at a time: a loaded machine starts few workers at once
        queries = {run: starter.start(name, run) for run in (NATIVE, *backends)}
        results.append(_pace(starter, name, queries, first, last, flush))
        for query in queries.values():
            query.stop()
        failed += [f"{name}-{run}: {q.exception()}" for run, q in queries.items()
                   if q.exception() is not None]
    spark.stop()
    for line in [*(f.splitlines()[0] for f in failed), *results]:  # results last: read first
        print(line, flush=True)
    if failed or any(not line.endswith(": done") for line in results):
        sys.exit(3)


class Starter:
    """Starts each query as its user would: Spark's own, or switched to a statekit backend (one
    at a time, as the switch is the session's)."""

    def __init__(self, spark: Any, root: Path) -> None:
        self.spark = spark
        self.root = root
        self.lock = threading.Lock()
        self.restarts = 0

    def start(self, name: str, run: str) -> Any:
        from pyspark.sql import functions as F

        import statekit.spark.compat

        spark, root = self.spark, self.root
        out = root / "out" / f"{name}-{run}"
        out.mkdir(parents=True, exist_ok=True)
        (root / f"in-{name}-{run}").mkdir(parents=True, exist_ok=True)

        def sink(df: Any, batch_id: int) -> None:
            rows = sorted(json.dumps(list(r)) for r in df.collect())
            tmp = out / f".b{batch_id}.tmp"
            tmp.write_text(json.dumps([json.loads(r) for r in rows]))
            os.replace(tmp, out / f"b{batch_id}.json")

        with self.lock:
            if run == NATIVE:
                statekit.spark.compat.disable(spark)
            else:
                statekit.spark.compat.enable(spark)
                spark.conf.set("spark.statekit.state.backend.type", run)
            source = (spark.readStream.schema("k string, v long, ms long")
                      .option("maxFilesPerTrigger", 1).parquet(str(root / f"in-{name}-{run}"))
                      .withColumn("ts", F.timestamp_millis("ms")))
            df = WORKLOADS[name].define(spark, source)
            query = (df.writeStream.foreachBatch(sink).outputMode("update")
                     .option("checkpointLocation", str(root / "query" / f"{name}-{run}")).start())
            statekit.spark.compat.disable(spark)
            return query

    def check(self, name: str, queries: dict[str, Any]) -> None:
        """A query that failed because a Python worker missed its start-up deadline (a loaded
        machine) is started again from its checkpoint, as its user would; any other failure
        raises."""
        for run, query in queries.items():
            error = query.exception()
            if error is None:
                continue
            if not any(m in str(error) for m in STARTUP_FAILURES) or \
                    self.restarts >= MAX_RESTARTS:
                raise RuntimeError(f"{run} failed: {error}")
            self.restarts += 1
            queries[run] = self.start(name, run)


def _pace(starter: Starter, name: str, queries: dict[str, Any], first: int, last: int,
          flush: bool) -> str:
    """Feed the workload's files one at a time, every query in step."""
    root = starter.root
    workload = WORKLOADS[name]

    def check() -> None:
        starter.check(name, queries)

    checkpoints = {run: root / "query" / f"{name}-{run}" for run in queries}
    processing = workload.time == "ProcessingTime"
    files = root / f"in-{name}"

    def feed(index: int, rows: list[tuple[str, int, int]], settle: bool) -> None:
        """File ``index`` to one query after the other (the same file: hard links)."""
        path = write(files, index, rows)
        for run in queries:
            os.link(path, root / f"in-{name}-{run}" / path.name)
            _wait_for(check, queries, run, checkpoints[run], index, settle)

    try:
        for index in range(first, last):
            if processing:  # a restarted query runs no batch before it has input
                _wait_period(check, checkpoints, ran=index != first)
            feed(index, rows_of(index), settle=not processing)
        if flush and workload.time == "EventTime":
            feed(last, tick_rows(last), settle=True)
        elif processing:  # every due timer fired before the queries stop (else when they stop
            _wait_period(check, checkpoints)  # decides whether it fires now or after a restart)
    except Exception as exc:  # reported in one line
        return f"{name}: {type(exc).__name__}: {exc}"
    return f"{name}: done"


def _wait_for(check: Any, queries: dict[str, Any], run: str, checkpoint: Path, index: int,
              settle: bool) -> None:
    """Until query ``run`` committed the batch that read file ``index`` (and, if ``settle``, ran
    every batch that follows without input)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not any(b["committed"] and b["offset"] >= index for b in batches(checkpoint)):
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run}: file {index} not read in {TIMEOUT_S} s")
        time.sleep(0.1)
    while settle:
        try:
            queries[run].processAllAvailable()
            break
        except Exception:  # a failed query: started again by check, or raised
            check()


def _wait_period(check: Any, checkpoints: dict[str, Path], ran: bool = True) -> None:
    """Until ``PERIOD`` plus a margin has passed since every query's last batch with input, and
    (if ``ran``) each query committed a batch that late (Spark runs batches without input in
    processing time, except after a restart until a file comes)."""
    last = max((b["ts"] for c in checkpoints.values() for b in batches(c) if b["data"]),
               default=0)
    due = last + PERIOD + MARGIN_MS
    while time.time() * 1000 < due:
        check()
        time.sleep(0.1)
    deadline = time.monotonic() + TIMEOUT_S
    while ran and not all(any(b["committed"] and b["ts"] >= due for b in batches(c))
                          for c in checkpoints.values()):
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no batch after {due} in {TIMEOUT_S} s")
        time.sleep(0.1)


if __name__ == "__main__":
    _, work_dir, first_file, last_file, names, runs, *flags = sys.argv
    main(work_dir, int(first_file), int(last_file), names.split(","), runs.split(","),
         "--flush" in flags)
