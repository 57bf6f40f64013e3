"""Spark session-window benchmark driver: statekit's timers against Spark's own, one run per path.

The workload is :class:`statekit.testing.workloads.Sessions` (a user's session closes ``GAP``
after their last event; every event registers a timer, every fired timer emits the sessions it
closes).  statekit runs it through ``transform_with_state`` (``time_mode`` ``EventTime`` and
``ProcessingTime``) and ``foreach_batch`` on both backends; Spark runs the same sessions as a
native ``StatefulProcessor`` over ``transformWithStateInPandas`` with Spark's own list state and
timers (:class:`SparkSessions`), ``timeMode`` ``EventTime`` and ``ProcessingTime``.

Every path reads the same parquet files through the streaming file source (one file per
micro-batch) and writes through the same ``foreachBatch`` sink as ``spark_driver`` (parquet per
batch).  Input: ``files`` files of ``rows`` events of ``keys`` users (every user in the first
file), each file a minute of event time, arriving up to 20 s out of order; then two one-row files
of a sentinel user far later, whose batches close every session in every path (an event-time
timer fires once the watermark, the largest event time of the earlier batches minus 30 s, passes
it; a processing-time timer in the next batch).  Event time uses ``GAP`` = 30 s; processing time,
where the time is the batch's timestamp, a 1 ms gap: a user's events of one batch are one session,
closed in the next batch, so the sessions do not depend on how fast a path runs.

Outputs are checked before speeds are compared: each path's sessions (sentinel excluded) equal
the pandas computation (event time: :func:`~statekit.testing.workloads.expected_sessions`;
processing time: one session per user and batch, batches numbered by their timestamps' order).
Rows/s = input rows / wall time from ``start()`` to the end of the sink of the batch that read the
last file.

Standalone: ``python -m benchmarks.spark_sessions_driver PATH BACKEND [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.spark_driver import _git, make_spark, save_summary, stop_spark
from statekit.testing.workloads import GAP, Sessions, expected_sessions, split_sessions

OUTPUT = "user string, start long, end long, events long"
SENTINEL = "~sentinel"
DELAY_MS = 30_000  # the watermark's delay (Spark's withWatermark; foreach_batch's allowed lateness)
DISORDER_MS = 20_000
PROCESSING_GAP = 1  # ms: a user's events of one batch are one session, closed in the next batch
T0 = 1_700_000_000_000

#: (path, backend): ``spark-rocksdb`` is Spark's own state store and timers, run before and
#: after statekit's paths of its time domain (the machine is shared: the faster of its two runs
#: is the baseline)
SESSION_PATHS = [
    ("spark_tws_event", "spark-rocksdb"),
    ("transform_with_state_event", "hashmap"),
    ("transform_with_state_event", "rocksdb"),
    ("foreach_batch_event", "hashmap"),
    ("foreach_batch_event", "rocksdb"),
    ("spark_tws_event", "spark-rocksdb"),
    ("spark_tws_processing", "spark-rocksdb"),
    ("transform_with_state_processing", "hashmap"),
    ("transform_with_state_processing", "rocksdb"),
    ("foreach_batch_processing", "hashmap"),
    ("foreach_batch_processing", "rocksdb"),
    ("spark_tws_processing", "spark-rocksdb"),
]
TARGET_RATIO = 2.0


def sizes(quick: bool) -> dict[str, int]:
    if quick:
        return {"files": 2, "rows": 3_000, "keys": 1_000}
    return {"files": int(os.environ.get("STATEKIT_SESSIONS_FILES", "2")), "rows": 100_000,
            "keys": 100_000}


def domain_of(path: str) -> str:
    return "event" if path.endswith("_event") else "processing"


# --- inputs ---------------------------------------------------------------------------------------


def _write(directory: Path, i: int, frame: pd.DataFrame) -> None:
    frame = frame.assign(ts=pd.to_datetime(frame["ms"], unit="ms", utc=True))
    path = directory / f"part-{i:05d}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, coerce_timestamps="us")
    os.utime(path, (1_000_000 + i, 1_000_000 + i))  # strictly increasing: files run in order


def write_input(directory: Path, files: int, rows: int, keys: int) -> None:
    """``files`` minutes of events (user, ms, ts), then the two sentinel files."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        rng = np.random.default_rng(100 + i)
        ids = rng.integers(0, keys, rows)
        if i == 0 and rows >= keys:
            ids[:keys] = np.arange(keys)
        ms = T0 + i * 60_000 + rng.integers(0, 60_000, rows)
        order = np.argsort(ms + rng.integers(0, DISORDER_MS + 1, rows), kind="stable")
        _write(directory, i, pd.DataFrame({"user": [f"u{x:06d}" for x in ids[order]],
                                           "ms": ms[order].astype("int64")}))
    last = T0 + files * 60_000
    for j, ms in enumerate((last + 10 * 60_000, last + 20 * 60_000)):
        _write(directory, files + j, pd.DataFrame({"user": [SENTINEL], "ms": [ms]}))


def read_input(directory: Path) -> list[pd.DataFrame]:
    return [pd.read_parquet(p, columns=["user", "ms"])
            for p in sorted(directory.glob("part-*.parquet"))]


# --- Spark's own sessions ---------------------------------------------------------------------------


def spark_sessions(domain: str, gap: int) -> Any:
    """The sessions of :class:`~statekit.testing.workloads.Sessions` as a native Spark
    ``StatefulProcessor``: the user's open event times in a list state, a timer ``gap`` after each
    event time (processing time: after the batch's time), sessions emitted when a timer fires."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SparkSessions(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.events = handle.getListState("events", "t long")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
                            ) -> Iterator[pd.DataFrame]:
            if domain == "event":
                times = [t for frame in rows for t in frame["ms"].tolist()]
                for t in sorted(set(times)):
                    self.handle.registerTimer(t + gap)
            else:
                now = timerValues.getCurrentProcessingTimeInMs()
                times = [now] * sum(len(frame) for frame in rows)
                self.handle.registerTimer(now + gap)
            self.events.appendList([(t,) for t in times])
            return iter(())

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any
                               ) -> Iterator[pd.DataFrame]:
            timestamp = expiredTimerInfo.getExpiryTimeInMs()
            times = [row[0] for row in self.events.get()]
            out, kept = [], []
            for start, end, count in split_sessions(times, gap):
                if end + gap <= timestamp:
                    out.append((key[0], start, end, count))
                else:
                    kept.extend(t for t in times if start <= t <= end)
            if kept:
                self.events.put([(t,) for t in kept])
            else:
                self.events.clear()
            if out:
                yield pd.DataFrame(out, columns=["user", "start", "end", "events"])

        def close(self) -> None:
            pass

    return SparkSessions()


# --- one run --------------------------------------------------------------------------------------


class Sink:
    """foreachBatch sink: the batch's sessions as parquet; when each batch's sink ended."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.done: dict[int, float] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(self.out / f"batch={batch_id:05d}"))
        self.done[batch_id] = time.perf_counter()


def _query(spark: Any, path: str, backend: str, input_dir: Path, sink: Sink, skdir: Path) -> Any:
    """The streaming writer of ``path`` (not started)."""
    from statekit.spark import foreach_batch, transform_with_state

    domain = domain_of(path)
    gap = GAP if domain == "event" else PROCESSING_GAP
    conf = {"state.backend.type": backend, "state.checkpoints.dir": str(skdir)}
    src = (spark.readStream.schema("user string, ms long, ts timestamp")
           .option("maxFilesPerTrigger", 1).parquet(str(input_dir)))
    if path.startswith("foreach_batch_"):
        timed = {"event_time_column": "ms", "allowed_lateness": DELAY_MS} if domain == "event" else {}
        return src.writeStream.foreachBatch(foreach_batch(
            Sessions(domain, gap), "user", OUTPUT, sink, num_partitions=2, conf=conf,
            operator_id=f"sessions-{domain}", **timed))
    if domain == "event":
        src = src.withWatermark("ts", f"{DELAY_MS // 1000} seconds")
    grouped = src.groupBy("user")
    mode = "EventTime" if domain == "event" else "ProcessingTime"
    if path.startswith("spark_tws_"):
        df = grouped.transformWithStateInPandas(spark_sessions(domain, gap), OUTPUT, "Update", mode)
    elif path.startswith("transform_with_state_"):
        df = transform_with_state(grouped, Sessions(domain, gap), OUTPUT, time_mode=mode,
                                  event_time_column="ms" if domain == "event" else None,
                                  conf=conf, operator_id=f"sessions-{domain}")
    else:
        raise ValueError(f"unknown path {path!r}")
    return df.writeStream.outputMode("update").foreachBatch(sink)


def run(spark: Any, path: str, backend: str, input_dir: Path, work: Path, *, keys: int,
        timeout: float = 3_600, query: Any = None) -> dict[str, Any]:
    """Run ``path`` over ``input_dir``; its figures and whether its sessions are right.
    ``query`` builds the writer instead of ``path``'s (same arguments as :func:`_query`)."""
    tag = f"{path}-{backend}"
    base = work / tag
    shutil.rmtree(base, ignore_errors=True)
    ckpt, out, skdir = base / "ckpt", base / "out", base / "statekit"
    for d in (ckpt, out, skdir):
        d.mkdir(parents=True)
    frames = read_input(input_dir)
    last_batch = len(frames) - 1
    sink = Sink(out)
    writer = (query or _query)(spark, path, backend, input_dir, sink, skdir)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    # availableNow, stopped once the last file's batch is through the sink (a query with
    # processing-time timers may go on running batches without input)
    query = writer.option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    try:
        deadline = time.monotonic() + timeout
        while last_batch not in sink.done and query.isActive:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tag}: no batch {last_batch} after {timeout} s")
            query.awaitTermination(0.2)
        if query.exception() is not None:
            raise RuntimeError(f"{tag} failed: {query.exception()}")
    finally:
        query.stop()
    wall = sink.done[last_batch] - t0
    rows = sum(len(f) for f in frames)
    result: dict[str, Any] = {
        "path": path, "backend": backend, "domain": domain_of(path), "rows": rows, "keys": keys,
        "batches": last_batch + 1, "wall_s": round(wall, 2), "rows_per_s": round(rows / wall, 1),
        "batch_s": [round(b - a, 2) for a, b in zip([t0, *(sink.done[i] for i in range(last_batch))],
                                                     (sink.done[i] for i in range(last_batch + 1)),
                                                     strict=True)],
        "sink": "foreachBatch -> parquet", "git": _git(),
        "loadavg_1m_start_end": [round(load0, 1), round(os.getloadavg()[0], 1)],
    }
    got = read_sessions(out)
    result.update(verify(frames, got, domain_of(path)))
    result["sessions_file"] = str(base / "sessions.parquet")
    got.to_parquet(result["sessions_file"], index=False)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.rmtree(skdir, ignore_errors=True)
    return result


def read_sessions(out: Path) -> pd.DataFrame:
    parts = [pd.read_parquet(p) for p in sorted(out.glob("batch=*")) if any(p.glob("*.parquet"))]
    got = (pd.concat(parts, ignore_index=True) if parts
           else pd.DataFrame(columns=["user", "start", "end", "events"]))
    return got[got["user"] != SENTINEL].reset_index(drop=True)


def normalized(got: pd.DataFrame, domain: str) -> list[tuple[Any, ...]]:
    """A path's sessions, sorted; processing-time sessions as (user, batch number, events), the
    batch numbered by the order of the batch timestamps the sessions carry."""
    rows = [(u, int(s), int(e), int(c)) for u, s, e, c in
            got[["user", "start", "end", "events"]].itertuples(index=False)]
    if domain == "event":
        return sorted(rows)
    rank = {t: i for i, t in enumerate(sorted({s for _, s, _, _ in rows}))}
    return sorted((u, rank[s], c) for u, s, e, c in rows if s == e)


def expected(frames: list[pd.DataFrame], domain: str) -> list[tuple[Any, ...]]:
    real = [f[f["user"] != SENTINEL] for f in frames]
    if domain == "event":
        events = pd.concat(real, ignore_index=True)
        return expected_sessions(zip(events["user"], events["ms"].astype(int), strict=True))
    return sorted((u, i, int(c)) for i, f in enumerate(real) if len(f)
                  for u, c in f.groupby("user").size().items())


def verify(frames: list[pd.DataFrame], got: pd.DataFrame, domain: str) -> dict[str, Any]:
    mine, want = normalized(got, domain), expected(frames, domain)
    return {"correct": mine == want, "sessions": len(mine), "expected_sessions": len(want),
            "checked": f"{len(want)} sessions against pandas"}


# --- whole benchmark ------------------------------------------------------------------------------


class Inputs:
    def __init__(self, quick: bool) -> None:
        self.sizes = s = sizes(quick)
        self.root = Path(tempfile.mkdtemp(prefix="statekit-sessions-bench-",
                                          dir=os.environ.get("STATEKIT_BENCH_TMP")))
        self.events = self.root / f"sessions-{s['files']}x{s['rows']}-{s['keys']}"
        write_input(self.events, s["files"], s["rows"], s["keys"])
        self.warm = self.root / "warmup"
        write_input(self.warm, 1, 200, 50)
        self.work = self.root / "work"


def warm_up(spark: Any, inputs: Inputs) -> None:
    """Untimed tiny runs, so JIT, planning and Python worker start-up are not charged to a path."""
    for path, backend in (("spark_tws_event", "spark-rocksdb"),
                          ("foreach_batch_event", "hashmap")):
        run(spark, path, backend, inputs.warm, inputs.work / "warmup", keys=50)


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each statekit path's rows/s against Spark's own of the same time domain (the faster of
    its runs), and whether the sessions equal Spark's (both checked against pandas)."""
    native: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["path"].startswith("spark_tws_") and (
                r["domain"] not in native or r["rows_per_s"] > native[r["domain"]]["rows_per_s"]):
            native[r["domain"]] = r
    out = []
    for r in results:
        r = dict(r)
        ref = native.get(r["domain"])
        if r["path"].startswith("spark_tws_"):
            r["baseline"] = ref is not None and r["rows_per_s"] == ref["rows_per_s"]
        elif ref is not None:
            r["ratio_to_spark_tws"] = round(r["rows_per_s"] / ref["rows_per_s"], 2)
            r["same_sessions_as_spark"] = bool(
                r["correct"] and ref["correct"] and r["sessions"] == ref["sessions"]
                and _same_file(r, ref))
            r["target_ratio"] = TARGET_RATIO
        out.append(r)
    return out


def _same_file(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        left, right = pd.read_parquet(a["sessions_file"]), pd.read_parquet(b["sessions_file"])
    except OSError:
        return False
    return normalized(left, a["domain"]) == normalized(right, b["domain"])


def save(results: list[dict[str, Any]], quick: bool) -> Path:
    return save_summary(summarize(results), "STATEKIT_SESSIONS_JSON", "spark-sessions", quick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("backend")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    inputs = Inputs(args.quick)
    spark = make_spark()
    try:
        warm_up(spark, inputs)
        res = run(spark, args.path, args.backend, inputs.events, inputs.work,
                  keys=inputs.sizes["keys"])
        print(json.dumps(res, indent=1))
    finally:
        stop_spark(spark)
        shutil.rmtree(inputs.root, ignore_errors=True)


if __name__ == "__main__":
    main()
