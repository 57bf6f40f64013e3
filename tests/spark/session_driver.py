"""A Spark driver process for the session-window tests: the session workload on timers through
every adapter and backend, event time or processing time, until the query has read the input
files there are; a second process goes on with more files.

``python -m tests.spark.session_driver WORK DOMAIN FILES`` (``DOMAIN``: ``event`` or
``processing``) runs every query over ``WORK/in-<domain>/part-*.parquet`` (one file per batch) and
writes each batch's output rows to ``WORK/out/<domain>-<adapter>-<backend>/b<batch>.json`` (a
re-run batch replaces its file).  Queries stop once they have read ``FILES`` files and, for
processing time, once the batch after them has run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ADAPTERS = ("foreach_batch", "transform_with_state", "apply_in_pandas_with_state")
BACKENDS = ("hashmap", "rocksdb")
OUTPUT = "user string, start long, end long, events long"
GAP = {"event": 30_000, "processing": 1_500}
LATENESS = 25_000  # ms, more than the input's disorder


def main(work: str, domain: str, files: int) -> None:
    from statekit.spark import local_spark

    spark = local_spark(conf={"spark.sql.shuffle.partitions": "2",
                              "spark.statekit.state.changelog.materialize-every-batches": "2"})
    root = Path(work)
    runs = [(a, b) for a in ADAPTERS for b in BACKENDS]
    with ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda run: _run(spark, root, domain, files, *run), runs))
    spark.stop()
    for line in results:
        print(line, flush=True)
    if any(not line.endswith(": done") for line in results):
        sys.exit(3)


def _run(spark, root: Path, domain: str, files: int, adapter: str, backend: str) -> str:
    from statekit.spark import statekit_error

    name = f"{domain}-{adapter}-{backend}"
    out = root / "out" / name
    out.mkdir(parents=True, exist_ok=True)

    def sink(df, batch_id):
        rows = [list(r) for r in df.collect()]
        tmp = out / f".b{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, out / f"b{batch_id}.json")

    query = _start(spark, root, domain, adapter, backend, sink)
    deadline = time.monotonic() + 600
    while _files_read(query, root, name) < files and query.exception() is None:
        if time.monotonic() > deadline:
            query.stop()
            return f"{name}: timed out"
        time.sleep(0.3)
    query.stop()
    error = query.exception()
    if error is not None:
        found = statekit_error(error)
        return f"{name}: {type(found).__name__}: {found}" if found else f"{name}: {error}"
    return f"{name}: done"


def _files_read(query, root: Path, name: str) -> int:
    """How many input files the query's committed batches read (its offset log and commits)."""
    checkpoint = root / "query" / name
    commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    read = 0
    for batch in commits:
        try:
            lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        except OSError:
            continue
        read = max(read, json.loads(lines[-1])["logOffset"] + 1)
    return read


def _start(spark, root: Path, domain: str, adapter: str, backend: str, sink):
    from pyspark.sql import functions as F

    from statekit.spark import apply_in_pandas_with_state, foreach_batch, transform_with_state
    from statekit.testing.workloads import Sessions

    name = f"{domain}-{adapter}-{backend}"
    conf = {"state.backend.type": backend}
    source = (spark.readStream.schema("user string, ms long").option("maxFilesPerTrigger", 1)
              .parquet(str(root / f"in-{domain}")).withColumn("ts", F.timestamp_millis("ms")))
    function = Sessions(domain, GAP[domain])
    column = "ms" if domain == "event" else None
    if adapter == "foreach_batch":
        writer = source.writeStream.foreachBatch(foreach_batch(
            function, "user", OUTPUT, sink, event_time_column=column,
            allowed_lateness=LATENESS, conf=conf, num_partitions=2))
    else:
        grouped = source.withWatermark("ts", f"{LATENESS // 1000} seconds").groupBy("user")
        if adapter == "transform_with_state":
            out = transform_with_state(
                grouped, function, OUTPUT, conf=conf, event_time_column=column,
                time_mode="EventTime" if domain == "event" else "ProcessingTime")
        else:
            out = apply_in_pandas_with_state(
                grouped, function, OUTPUT, conf=conf, event_time_column=column,
                timeout_conf="EventTimeTimeout" if domain == "event" else "ProcessingTimeTimeout")
        writer = out.writeStream.foreachBatch(sink).outputMode("update")
    return writer.option("checkpointLocation", str(root / "query" / name)).start()


if __name__ == "__main__":
    _, work_dir, time_domain, file_count = sys.argv
    main(work_dir, time_domain, int(file_count))
