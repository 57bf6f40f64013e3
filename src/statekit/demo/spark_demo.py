"""The main job: a Structured Streaming query keeping per-user state in statekit on local Spark.

Clickstream events arrive as files (generated here, one micro-batch each).  A statekit
``KeyedProcessFunction`` keeps per-user running totals and sessions (a session closes after 30
minutes of event time without events) in the RocksDB backend.  Only the backend flag is set:
statekit keeps its checkpoints beside the query's own (``<checkpointLocation>/statekit``).
Halfway through, the query is stopped and restarted from its checkpoint, as an operator would
after a deploy.  At the end every user's totals are checked against pandas.  The work directory
(input, the query's checkpoint, statekit's state) is kept, for ``statekit checkpoints inspect``.

Run: ``python -m statekit.demo.spark_demo [--backend rocksdb|hashmap] [--adapter ...]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from statekit import KeyedProcessFunction, Types, ValueStateDescriptor
from statekit.demo import at_least, check_backend_flag, check_work_dir, statekit_command
from statekit.errors import StatekitError

SESSION_GAP_MS = 30 * 60 * 1000
OUTPUT = "user string, events long, amount long, sessions long, last_ts long"
ADAPTERS = ("foreach_batch", "transform_with_state", "apply_in_pandas_with_state")


class UserSessions(KeyedProcessFunction):
    """Per user: event count, amount, number of sessions, last event time."""

    def open(self, runtime_context: Any) -> None:
        self.events = runtime_context.get_state(ValueStateDescriptor("events", Types.LONG()))
        self.amount = runtime_context.get_state(ValueStateDescriptor("amount", Types.LONG()))
        self.sessions = runtime_context.get_state(ValueStateDescriptor("sessions", Types.LONG()))
        self.last_ts = runtime_context.get_state(ValueStateDescriptor("last_ts", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        _user, ts, amount = value
        last = self.last_ts.value()
        sessions = self.sessions.value() or 0
        if last is None or ts - last > SESSION_GAP_MS:
            sessions += 1
        events = (self.events.value() or 0) + 1
        total = (self.amount.value() or 0) + amount
        self.events.update(events)
        self.amount.update(total)
        self.sessions.update(sessions)
        self.last_ts.update(ts)
        yield ctx.get_current_key(), events, total, sessions, ts


def generate(directory: str, first: int, files: int, rows: int, users: int) -> pd.DataFrame:
    """Event files ``first..first+files-1`` in time order, each an hour later than the one before."""
    os.makedirs(directory, exist_ok=True)
    frames = []
    start = 1_700_000_000_000
    for i in range(first, first + files):
        rng = np.random.default_rng(100 + i)
        ts = np.sort(rng.integers(start + i * 3_600_000, start + (i + 1) * 3_600_000, rows))
        frame = pd.DataFrame({
            "user": [f"user-{u:05d}" for u in rng.zipf(1.3, rows) % users],
            "ts": ts.astype("int64"),
            "amount": rng.integers(1, 500, rows).astype("int64"),
        })
        path = f"{directory}/events-{i:04d}.parquet"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def expected(frame: pd.DataFrame) -> pd.DataFrame:
    def sessions(ts: pd.Series) -> int:
        return int((ts.diff().fillna(SESSION_GAP_MS + 1) > SESSION_GAP_MS).sum())

    g = frame.groupby("user")
    return pd.DataFrame({
        "events": g.size(), "amount": g["amount"].sum(), "sessions": g["ts"].apply(sessions),
        "last_ts": g["ts"].max(),
    })


@contextmanager
def stage(what: str) -> Any:
    """Print what the demo is doing, then how long it took."""
    print(f"==> {what} ...", flush=True)
    started = time.perf_counter()
    yield
    print(f"    {what}: {time.perf_counter() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="rocksdb",
                        help="statekit backend: the one config flag (default: rocksdb)")
    parser.add_argument("--adapter", default="foreach_batch", choices=ADAPTERS)
    parser.add_argument("--files", type=at_least(2), default=6,
                        help="input files, half before the restart (at least 2)")
    parser.add_argument("--rows", type=at_least(1), default=20_000, help="events per file")
    parser.add_argument("--users", type=at_least(1), default=2_000)
    parser.add_argument("--dir", default=None,
                        help="work directory (default: a new one in the temporary directory); "
                             "kept afterwards, so the state can be inspected")
    args = parser.parse_args(argv)
    check_work_dir(parser, args.dir)
    try:
        check_backend_flag(parser, args.backend)  # a typo fails here, before Spark starts
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C before the query started (run() reports later ones)
        print("\ninterrupted", flush=True)
        return 130
    except StatekitError as exc:  # raised by the adapter call, before any query starts
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 2


def _not_an_interrupt(record: logging.LogRecord) -> bool:
    """A log record that is not a report of a call Ctrl-C interrupted (the driver's, or a batch
    the stopping query interrupted)."""
    from statekit.spark.stopping import QueryInterrupted

    kind = record.exc_info[0] if record.exc_info else None
    if kind is not None and issubclass(kind, KeyboardInterrupt | BrokenPipeError | QueryInterrupted):
        return False
    return "KeyboardInterrupt" not in record.getMessage()


def _quiet_stop(spark: Any) -> None:
    """Stop an interrupted run's query without the errors its tasks and Spark log on the way."""
    try:
        spark.sparkContext.setLogLevel("OFF")
        for query in spark.streams.active:
            query.stop()
    except Exception:  # noqa: S110 (already stopping: what is left is Spark's to report)
        pass


def run(args: argparse.Namespace) -> int:
    from pyspark.errors import StreamingQueryException

    from statekit.spark import (
        apply_in_pandas_with_state,
        foreach_batch,
        local_spark,
        statekit_error,
        transform_with_state,
    )

    work = args.dir or tempfile.mkdtemp(prefix="statekit-spark-demo-")
    print(f"statekit streaming demo: backend={args.backend}, adapter={args.adapter}, dir={work}")
    with stage("starting Spark (local[2], loopback only)"):
        spark = local_spark(app_name="statekit-demo",
                            conf={"spark.statekit.state.backend.type": args.backend})
    # Ctrl-C: a plain KeyboardInterrupt here (PySpark's own handler calls into the JVM from
    # inside the interrupted call, which fails and logs several tracebacks), and py4j's reports
    # of the call it interrupted left out
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("", "py4j", "py4j.java_gateway", "py4j.clientserver"):
        logging.getLogger(name).addFilter(_not_an_interrupt)
    latest: dict[str, tuple[Any, ...]] = {}
    produced = {"rows": 0}

    def sink(df: Any, batch_id: int) -> None:
        rows = df.collect()
        produced["rows"] += len(rows)
        for row in rows:
            if row[1] > latest.get(row[0], (None, 0))[1]:
                latest[row[0]] = tuple(row)
        print(f"    batch {batch_id}: {len(rows)} updates, {len(latest)} users so far", flush=True)

    def run_query() -> None:
        source = (spark.readStream.schema("user string, ts long, amount long")
                  .option("maxFilesPerTrigger", 1).parquet(f"{work}/events"))
        if args.adapter == "foreach_batch":
            writer = source.writeStream.foreachBatch(
                foreach_batch(UserSessions(), "user", OUTPUT, sink, num_partitions=4))
        elif args.adapter == "transform_with_state":
            writer = transform_with_state(source.groupBy("user"), UserSessions(), OUTPUT
                                          ).writeStream.foreachBatch(sink).outputMode("update")
        else:
            writer = apply_in_pandas_with_state(source.groupBy("user"), UserSessions(), OUTPUT
                                                ).writeStream.foreachBatch(sink).outputMode("update")
        query = (writer.option("checkpointLocation", f"{work}/query")
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    try:
        half = args.files // 2
        with stage(f"generating {half} event files"):
            first = generate(f"{work}/events", 0, half, args.rows, args.users)
        with stage("query run 1 (first half of the input)"):
            run_query()
        print("    query stopped; more input arrives; restarting from its checkpoint", flush=True)
        with stage(f"generating {args.files - half} more event files"):
            rest = generate(f"{work}/events", half, args.files - half, args.rows, args.users)
        with stage("query run 2 (resumed)"):
            run_query()
    except StreamingQueryException as exc:
        found = statekit_error(exc)
        print(f"error: {type(found).__name__}: {found}" if found else f"error: {exc}", flush=True)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: say what is kept instead of a traceback
        committed = os.path.isdir(f"{work}/query/commits") and os.listdir(f"{work}/query/commits")
        look = (f"{statekit_command()} checkpoints inspect {work}/query (then: rm -rf {work})"
                if committed else f"no batch was committed yet (rm -rf {work})")
        print(f"\ninterrupted; the work directory is kept: {look}", flush=True)
        _quiet_stop(spark)
        return 130
    finally:
        spark.stop()
    print(f"    statekit's checkpoints: {work}/query/statekit (beside the query's own)")
    print(f"    kept for you to look at: {statekit_command()} checkpoints inspect {work}/query "
          f"(then: rm -rf {work})")

    want = expected(pd.concat([first, rest], ignore_index=True))
    got = pd.DataFrame.from_dict(latest, orient="index",
                                 columns=["user", "events", "amount", "sessions", "last_ts"])
    got = got.drop(columns="user").sort_index()
    ok = want.sort_index().astype("int64").equals(got.astype("int64")) and \
        produced["rows"] == int(want["events"].sum())
    top = want.sort_values("amount", ascending=False).head(3)
    print(f"{int(want['events'].sum())} events, {len(want)} users, "
          f"{int(want['sessions'].sum())} sessions; top users by amount:")
    for user, row in top.iterrows():
        print(f"  {user}: {row['events']} events, amount {row['amount']}, {row['sessions']} sessions")
    print("RESULT: " + ("OK — every user's state matches pandas; no update lost or duplicated "
                        "across the restart" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
