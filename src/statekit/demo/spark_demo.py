"""The main job: a Structured Streaming query keeping per-user state in statekit on local Spark.

Clickstream events arrive as files (generated here, one micro-batch each).  A statekit
``KeyedProcessFunction`` keeps per-user running totals and sessions (a session closes after 30
minutes of event time without events) in the RocksDB backend.  Only the backend flag is set:
statekit keeps its checkpoints beside the query's own (``<checkpointLocation>/statekit``).
Halfway through, the query is stopped and restarted from its checkpoint, as an operator would
after a deploy.  Each micro-batch's output is written to the work directory under its batch id
(so a batch Spark replays overwrites its own output), and at the end every user's latest output
is checked against pandas.  The work directory (input, outputs, the query's checkpoint,
statekit's state) is kept, for ``statekit checkpoints inspect``; running the demo again with the
same ``--dir`` (after Ctrl-C, say) resumes the query from its checkpoint and checks it all again.

Run: ``python -m statekit.demo.spark_demo [--backend rocksdb|hashmap] [--adapter ...]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from statekit import KeyedProcessFunction, Types, ValueStateDescriptor
from statekit.demo import at_least, check_flags, check_work_dir, statekit_command
from statekit.errors import StatekitError

SESSION_GAP_MS = 30 * 60 * 1000
OUTPUT = "user string, events long, amount long, sessions long, last_ts long"
OUTPUT_COLUMNS = ["user", "events", "amount", "sessions", "last_ts"]
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


def write_output(directory: str, batch_id: int, rows: list[Any]) -> None:
    """One micro-batch's output, under its batch id: written whole (a rename), and overwritten
    when Spark replays the batch, so the outputs hold each batch once."""
    os.makedirs(directory, exist_ok=True)
    frame = pd.DataFrame([tuple(r) for r in rows], columns=OUTPUT_COLUMNS).astype(
        {c: "int64" for c in OUTPUT_COLUMNS[1:]})
    path = f"{directory}/batch-{batch_id:06d}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def read_outputs(directory: str) -> pd.DataFrame:
    """Every batch's output written so far, by this run or an earlier one on the same ``--dir``."""
    files = sorted(glob.glob(f"{directory}/batch-*.parquet"))
    if not files:
        return pd.DataFrame({c: pd.Series(dtype="object" if c == "user" else "int64")
                             for c in OUTPUT_COLUMNS})
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _shape(args: argparse.Namespace) -> dict[str, Any]:
    """The flags a rerun on the same ``--dir`` must repeat (the backend may change: statekit
    restores either backend's checkpoints)."""
    return {"adapter": args.adapter, "files": args.files, "rows": args.rows, "users": args.users}


def check_same_run(parser: argparse.ArgumentParser, work: str, args: argparse.Namespace) -> None:
    """A ``--dir`` used before is resumed only with the flags it was built with."""
    path = os.path.join(work, "demo.json")
    if os.path.exists(path):
        with open(path) as fh:
            before = json.load(fh)
        changed = [f"--{k} {before.get(k)} (now {v})" for k, v in _shape(args).items()
                   if before.get(k) != v]
        if changed:
            parser.error(f"--dir {work} holds a run made with {', '.join(changed)}: "
                         "resume it with the same flags, or use another --dir")


def record_run(work: str, args: argparse.Namespace) -> None:
    """Record the flags a rerun on ``work`` must repeat (:func:`check_same_run` reads them)."""
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "demo.json"), "w") as fh:
        json.dump(_shape(args), fh)


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
    check_flags(parser, args.backend)  # a typo (flag or STATEKIT_*) fails here, before Spark starts
    if args.dir:
        check_same_run(parser, args.dir, args)
    try:
        return run(args)
    except KeyboardInterrupt:  # Ctrl-C before the query started (run() reports later ones)
        print("\ninterrupted", flush=True)
        return 130
    except StatekitError as exc:  # raised by the adapter call, before any query starts
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 2


def run(args: argparse.Namespace) -> int:
    from pyspark.errors import StreamingQueryException

    from statekit.spark import (
        apply_in_pandas_with_state,
        foreach_batch,
        interruptible,
        local_spark,
        statekit_error,
        transform_with_state,
    )

    work = args.dir or tempfile.mkdtemp(prefix="statekit-spark-demo-")
    record_run(work, args)  # the flags a rerun must repeat
    print(f"statekit streaming demo: backend={args.backend}, adapter={args.adapter}, dir={work}")
    with stage("starting Spark (local[2], loopback only)"):
        spark = local_spark(app_name="statekit-demo",
                            conf={"spark.statekit.state.backend.type": args.backend})
    users = set(read_outputs(f"{work}/output")["user"])  # an earlier run's, on a rerun

    def sink(df: Any, batch_id: int) -> None:
        rows = df.collect()
        write_output(f"{work}/output", batch_id, rows)
        users.update(row[0] for row in rows)
        print(f"    batch {batch_id}: {len(rows)} updates, {len(users)} users so far", flush=True)

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
        with interruptible(spark):  # Ctrl-C: the query stopped quietly, then KeyboardInterrupt
            half = args.files // 2
            with stage(f"generating {half} event files"):
                first = generate(f"{work}/events", 0, half, args.rows, args.users)
            with stage("query run 1 (first half of the input)"):
                run_query()
            print("    query stopped; more input arrives; restarting from its checkpoint",
                  flush=True)
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
        print(f"\ninterrupted; the work directory is kept: {look}; to resume, run the demo "
              f"again with --dir {work}", flush=True)
        return 130
    finally:
        spark.stop()
    print(f"    statekit's checkpoints: {work}/query/statekit (beside the query's own)")
    print(f"    kept for you to look at: {statekit_command()} checkpoints inspect {work}/query "
          f"(then: rm -rf {work})")

    want = expected(pd.concat([first, rest], ignore_index=True)).sort_index().astype("int64")
    outputs = read_outputs(f"{work}/output")
    got = outputs.sort_values("events").groupby("user").last().sort_index().astype("int64")
    wrong = [] if got.index.equals(want.index) else ["users"]
    wrong += [c for c in want.columns if not wrong and not want[c].equals(got[c])]
    rows_ok = len(outputs) == int(want["events"].sum())
    ok = not wrong and rows_ok
    top = want.sort_values("amount", ascending=False).head(3)
    print(f"{int(want['events'].sum())} events, {len(want)} users, "
          f"{int(want['sessions'].sum())} sessions; top users by amount:")
    for user, row in top.iterrows():
        print(f"  {user}: {row['events']} events, amount {row['amount']}, {row['sessions']} sessions")
    if not rows_ok:
        print(f"  {len(outputs)} output rows for {int(want['events'].sum())} events")
    if wrong:
        print(f"  the latest output per user differs from pandas in: {', '.join(wrong)}")
    print("RESULT: " + ("OK — every user's state matches pandas; no update lost or duplicated "
                        "across the restart" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
