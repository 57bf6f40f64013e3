"""A Spark driver process for the restart tests: run each adapter's query, stop it mid-stream
several times, and (in a second, new process) resume it with more input.

``python -m tests.spark.restart_driver run WORK BACKENDS STOPS FILES [KEY=VALUE ...]`` (the
pairs are ``spark.statekit.`` settings) writes input files ``0..FILES-1`` (when missing), then
per adapter and backend (``BACKENDS``: comma-separated; ``hashmap@jobmanager`` also chooses
the storage) starts the query, stops it at a random
moment after it ran a batch, ``STOPS`` times, and finally lets it drain what is there; all
queries run at once, each on its own thread.  Each batch's output rows are written to
``WORK/out/<adapter>-<backend>/b<batch>.json`` (a re-run batch replaces its file), so another
process can check exactness.  Settings are the defaults apart from the backend flag (given per
query) and small materialization intervals (snapshots and log truncation within a few batches).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ADAPTERS = ("foreach_batch", "transform_with_state", "apply_in_pandas_with_state")
ROWS, KEYS = 600, 600


def main(work: str, backends: list[str], stops: int, files: int, extra: dict[str, str]) -> None:

    from statekit.spark import local_spark
    from tests.spark.jobs import write_inputs

    root = Path(work)
    present = len(list((root / "in").glob("*.parquet"))) if (root / "in").exists() else 0
    if present < files:
        write_inputs(str(root / "in"), present, files - present, rows=ROWS, keys=KEYS)
    adapters = extra.pop("adapters", ",".join(ADAPTERS)).split(",")  # not a statekit setting
    spark = local_spark(conf={
        "spark.statekit.state.changelog.materialize-every-batches": 2,
        "spark.statekit.state.changelog.materialize-after-calls": 100,
        **{f"spark.statekit.{k}": v for k, v in extra.items()},
    })
    pairs = [(a, b) for a in adapters for b in backends]
    # every query runs at once (Spark runs concurrent queries; most of a batch's time is latency)
    with ThreadPoolExecutor(len(pairs)) as pool:
        results = list(pool.map(lambda pair: _run(spark, root, *pair, stops), pairs))
    failed = False
    for line, ok in results:
        print(line, flush=True)
        failed = failed or not ok
    spark.stop()
    if failed:
        sys.exit(3)


def _run(spark, root: Path, adapter: str, backend: str, stops: int) -> tuple[str, bool]:
    """Start, stop ``stops`` times at a random moment after a batch, then drain one query."""
    from pyspark.errors import StreamingQueryException

    from statekit.spark import statekit_error
    from tests.spark.jobs import OUTPUT, RunningCount

    name = f"{adapter}-{backend}"
    out = root / "out" / name
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{root}{name}{stops}")

    def sink(df, batch_id):
        rows = [list(r) for r in df.collect()]
        tmp = out / f".b{batch_id}.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, out / f"b{batch_id}.json")

    for attempt in range(stops + 1):
        query = _start(spark, adapter, RunningCount(), str(root / "in"), str(root / "query" / name),
                       sink, OUTPUT, backend, drain=attempt == stops)
        if attempt == stops:
            try:
                query.awaitTermination()
            except StreamingQueryException:
                pass  # reported below, from query.exception()
        else:  # mid-stream: once the query has run a batch, at a random moment
            deadline = time.monotonic() + 120
            while not query.recentProgress and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.1, 1.5))
            query.stop()
        error = query.exception()
        if error is not None:  # reported in one line
            found = statekit_error(error)
            return (f"{name}: {type(found).__name__}: {found}" if found else f"{name}: {error}"), False
    return f"{name}: done", True


def _start(spark, adapter, function, input_dir, checkpoint, sink, output, backend, drain):
    from statekit.spark import apply_in_pandas_with_state, foreach_batch, transform_with_state

    name, _, storage = backend.partition("@")  # "hashmap@jobmanager": storage chosen explicitly
    conf = {"state.backend.type": name}  # the one flag, here per query
    if storage:
        conf["state.checkpoint-storage"] = storage
    source = (spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1)
              .parquet(input_dir))
    if adapter == "foreach_batch":
        writer = source.writeStream.foreachBatch(
            foreach_batch(function, "key", output, sink, num_partitions=2, conf=conf))
    elif adapter == "transform_with_state":
        writer = transform_with_state(source.groupBy("key"), function, output, conf=conf
                                      ).writeStream.foreachBatch(sink).outputMode("update")
    else:
        writer = apply_in_pandas_with_state(source.groupBy("key"), function, output, conf=conf
                                            ).writeStream.foreachBatch(sink).outputMode("update")
    writer = writer.option("checkpointLocation", checkpoint)
    if drain:
        writer = writer.trigger(availableNow=True)
    return writer.start()


if __name__ == "__main__":
    _, command, work_dir, backend_names, stop_count, file_count, *settings = sys.argv
    assert command == "run"
    main(work_dir, backend_names.split(","), int(stop_count), int(file_count),
         dict(s.split("=", 1) for s in settings))
