"""Session windows on timers through every Spark adapter and backend equal a pandas computation:
event time over out-of-order input, across a stop and a restart by a new driver process; and
processing time, the micro-batches' timestamps taken from the query's offset log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statekit.testing.workloads import expected_sessions, session_events, split_sessions
from tests.spark.session_driver import ADAPTERS, BACKENDS, GAP

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TICK = "~tick"


def write(directory: Path, n: int, rows) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows, columns=["user", "ms"])
    path = directory / f"part-{n:04d}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    os.utime(path, (1_000_000 + n, 1_000_000 + n))


def drive(work: Path, domain: str, files: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-m", "tests.spark.session_driver", str(work),
                           domain, str(files)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def sessions_of(work: Path, name: str) -> list[tuple]:
    out = []
    for path in (work / "out" / name).glob("b*.json"):
        out += [tuple(row) for row in json.loads(path.read_text()) if row[0] != TICK]
    return sorted(out)


def test_event_time_sessions_across_a_new_driver(tmp_path):
    events = session_events(3000, users=60, disorder=20_000)
    chunks = [events[i:i + 300] for i in range(0, len(events), 300)]
    directory = tmp_path / "in-event"
    for n, chunk in enumerate(chunks[:5]):
        write(directory, n, chunk)
    drive(tmp_path, "event", 5)  # the first driver stops after five batches
    last = events[-1][1]
    for n, chunk in enumerate(chunks[5:], 5):
        write(directory, n, chunk)
    # two ticks far ahead: the first moves the watermark past every session, the second is a
    # batch with input that runs at that watermark (foreach_batch runs only batches with input)
    write(directory, len(chunks), [(TICK, last + 10 * GAP["event"])])
    write(directory, len(chunks) + 1, [(TICK, last + 10 * GAP["event"])])
    drive(tmp_path, "event", len(chunks) + 2)  # a new driver goes on
    want = expected_sessions(events, GAP["event"])
    for adapter in ADAPTERS:
        for backend in BACKENDS:
            assert sessions_of(tmp_path, f"event-{adapter}-{backend}") == want, (adapter, backend)


def batch_times(checkpoint: Path, committed: bool = False) -> dict[int, int]:
    """Input file -> the timestamp of the batch that read it (the offset log: batches read one
    file each, batches without input repeat the offset); only committed batches if asked."""
    times: dict[int, int] = {}
    done = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
    for path in sorted((checkpoint / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        if committed and path.name not in done:
            continue
        lines = path.read_text().splitlines()
        offset = json.loads(lines[-1])["logOffset"]
        times.setdefault(offset, json.loads(lines[1])["batchTimestampMs"])
    return times


def test_processing_time_sessions(spark, tmp_path):
    """Each event's time is its batch's timestamp; sessions close ``GAP`` after their last
    event, in the first batch whose timestamp passes that (ticks keep batches coming)."""
    from tests.spark.session_driver import _start

    directory = tmp_path / "in-processing"
    files = [[(f"u{(n * 7 + i) % 9}", 0) for i in range(n % 3 + 1)] for n in range(8)]
    for n, rows in enumerate(files):
        write(directory, n, rows)
    queries = {}
    for adapter in ADAPTERS:
        for backend in BACKENDS:
            name = f"processing-{adapter}-{backend}"
            out = tmp_path / "out" / name
            out.mkdir(parents=True)

            def sink(df, batch_id, out=out):
                (out / f"b{batch_id}.json").write_text(json.dumps([list(r) for r in df.collect()]))

            queries[name] = _start(spark, tmp_path, "processing", adapter, backend, sink)
    n = len(files)
    deadline = time.monotonic() + 600
    while True:  # ticks until every query ran a batch 3 gaps after its last event
        assert time.monotonic() < deadline
        write(directory, n, [(TICK, 0)])
        n += 1
        time.sleep(0.5)
        ready = True
        for name in queries:
            times = batch_times(tmp_path / "query" / name, committed=True)
            if len(files) - 1 not in times or max(times.values()) < times[len(files) - 1] + 3 * GAP[
                    "processing"]:
                ready = False
        if ready:
            break
    for name, query in queries.items():
        query.stop()
        assert query.exception() is None, name
        times = batch_times(tmp_path / "query" / name)
        by_user: dict[str, list[int]] = {}
        for index, rows in enumerate(files):
            for user, _ in rows:
                by_user.setdefault(user, []).append(times[index])
        want = sorted((u, *s) for u, stamps in by_user.items()
                      for s in split_sessions(stamps, GAP["processing"]))
        assert sessions_of(tmp_path, name) == want, name
