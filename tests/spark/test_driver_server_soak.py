"""Soak: the driver's server under 200 trickling and 200 silent clients (in a process of their own,
each connection opened again as soon as the server closes it) while the executors of two queries
write and read JobManager checkpoints through it, across a restart of both queries.  Both must
finish exact, and the driver's memory and threads stay bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from statekit.spark import foreach_batch, transform_with_state
from statekit.spark.jobmanager import serving
from tests.spark.jobs import OUTPUT, Outputs, RunningCount, expected, write_inputs

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOBMANAGER = {"state.checkpoint-storage": "jobmanager"}
TRICKLING = IDLE = 200
#: the driver's resident memory may grow by at most this much while under attack
RSS_BOUND_MB = 150


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Sampler(threading.Thread):
    """The driver's RSS, threads and the server's connections, every half second."""

    def __init__(self, server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.samples: list[tuple[float, int, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            anonymous, authenticated = self.server.connections()
            self.samples.append((_rss_mb(), threading.active_count(), anonymous, authenticated))


def _start(spark, tmp_path, sinks):
    source = spark.readStream.schema("key string, v long").option("maxFilesPerTrigger", 1)
    a = (source.parquet(str(tmp_path / "in-a")).writeStream
         .foreachBatch(foreach_batch(RunningCount(), "key", OUTPUT, sinks[0], conf=JOBMANAGER))
         .option("checkpointLocation", str(tmp_path / "query-a")).trigger(availableNow=True).start())
    b = (transform_with_state(source.parquet(str(tmp_path / "in-b")).groupBy("key"), RunningCount(),
                              OUTPUT, conf=JOBMANAGER)
         .writeStream.foreachBatch(sinks[1]).outputMode("update")
         .option("checkpointLocation", str(tmp_path / "query-b")).trigger(availableNow=True).start())
    return [a, b]


def _finish(queries, seconds: float = 600) -> None:
    """Wait for ``queries`` to end; stopped and failed if they take more than ``seconds`` (as
    they did when the clients kept executors out of the server)."""
    end = time.monotonic() + seconds
    try:
        for query in queries:
            assert query.awaitTermination(max(1, end - time.monotonic())), "the query did not finish"
    finally:
        for query in queries:
            query.stop()


def test_two_queries_finish_exact_beside_400_slow_clients(spark, tmp_path):
    server = serving(spark)
    host, port = server.url[len("http://"):].split(":")
    frames = [write_inputs(str(tmp_path / "in-a"), 0, 4), write_inputs(str(tmp_path / "in-b"), 20, 4)]
    sinks = [Outputs(), Outputs()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    baseline = _rss_mb()
    sampler = Sampler(server)
    attackers = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.slow_clients", host, port, str(TRICKLING), str(IDLE)],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        sampler.start()
        assert attackers.stdout.readline().strip() == "ready"  # every client had its connection
        started = time.monotonic()
        _finish(_start(spark, tmp_path, sinks))
        frames = [pd.concat([frames[0], write_inputs(str(tmp_path / "in-a"), 4, 4)]),
                  pd.concat([frames[1], write_inputs(str(tmp_path / "in-b"), 24, 4)])]
        _finish(_start(spark, tmp_path, sinks))  # both started again: a new run each
        elapsed = time.monotonic() - started
    finally:
        out, _ = attackers.communicate("", timeout=60)
        sampler.done.set()
        sampler.join()
    counts = json.loads(out.strip().splitlines()[-1])
    rss = [s[0] for s in sampler.samples]
    figures = {"seconds": round(elapsed, 1), "rss_baseline_mb": round(baseline, 1),
               "rss_max_mb": round(max(rss), 1), "rss_end_mb": round(rss[-1], 1),
               "threads_max": max(s[1] for s in sampler.samples),
               "anonymous_max": max(s[2] for s in sampler.samples),
               "authenticated_max": max(s[3] for s in sampler.samples), **counts}
    print("driver server soak:", json.dumps(figures))
    for sink, frame in zip(sinks, frames, strict=True):
        assert sink.final() == expected(frame)
        assert sum(len(rows) for rows in sink.by_batch.values()) == len(frame)
    assert counts["connects"] >= TRICKLING + IDLE and counts["bytes_trickled"] > 0
    assert figures["anonymous_max"] + figures["authenticated_max"] <= 128
    assert max(rss) - baseline < RSS_BOUND_MB, figures
