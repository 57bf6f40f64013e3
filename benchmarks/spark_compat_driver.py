"""Spark compat benchmark driver: the same unchanged Spark code run by Spark and through statekit's switch.

Each workload is a user's code written for Spark's own API, run twice on the same input files
and sink: natively (Spark's ``transformWithStateInPandas`` / ``applyInPandasWithState`` with
Spark's RocksDB state store provider) and with ``statekit.spark.compat.enable(spark)`` plus
``spark.statekit.state.backend.type`` (hashmap, rocksdb), nothing else changed.  The runs
themselves are those of the other Spark benchmarks, so inputs, sink, timing and the checks
against pandas are the same:

- ``count``: a running (count, sum) per key, ``spark_driver``'s ``CountProcessor``
  (``transformWithStateInPandas``) and ``spark_count_fn`` (``applyInPandasWithState``), over
  ``files`` files (``STATEKIT_COMPAT_FILES``, default 1) of ``keys`` rows of ``keys`` keys
  (``STATEKIT_COMPAT_KEYS``, default 100k; every key in the first file);
- ``sessions_event`` / ``sessions_processing``: ``spark_sessions_driver``'s ``SparkSessions``
  processor (list state and timers, event or processing time) and, for event time,
  :func:`aipws_sessions` (the same sessions as an ``applyInPandasWithState`` function with an
  ``EventTimeTimeout``), over ``files`` minutes of events of ``keys`` users, then the sentinel
  files that close every session.

Rows/s of each statekit run over Spark's own run of the same API and workload, in the same
process and session: the ratio.  Spark's run comes first in each group (after an untimed warm-up
of both).

Standalone: ``python -m benchmarks.spark_compat_driver WORKLOAD API BACKEND [--quick]``
(``BACKEND``: ``spark-rocksdb`` for Spark's own run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks import spark_driver, spark_sessions_driver
from benchmarks.spark_driver import make_spark, save_summary, stop_spark
from statekit.testing.workloads import GAP, split_sessions

NATIVE = "spark-rocksdb"
#: (workload, api, backend), Spark's own run first in each (workload, api) group
PATHS = [(w, a, b) for w, a in (("count", "tws"), ("count", "aipws"), ("sessions_event", "tws"),
                                 ("sessions_event", "aipws"), ("sessions_processing", "tws"))
         for b in (NATIVE, "hashmap", "rocksdb")]
#: rows/s through statekit over Spark's own, per API
TARGETS = {"tws": 1.5, "aipws": 1.0}
#: the open event times as int64 bytes: Spark's Python worker cannot read an ``array<long>`` state
#: schema of ``applyInPandasWithState`` (``KeyError: 'elementType'`` in ``StructType.fromJson``)
SESSION_STATE = "times binary"


def sizes(quick: bool) -> dict[str, int]:
    if quick:
        return {"count_files": 2, "count_rows": 2_000, "count_keys": 500,
                "session_files": 1, "session_rows": 2_000, "session_keys": 500}
    keys = int(os.environ.get("STATEKIT_COMPAT_KEYS", "100000"))
    files = int(os.environ.get("STATEKIT_COMPAT_FILES", "1"))
    return {"count_files": files, "count_rows": keys, "count_keys": keys,
            "session_files": files, "session_rows": keys, "session_keys": keys}


def aipws_sessions(key: tuple[Any, ...], pdfs: Iterator[pd.DataFrame], state: Any
                   ) -> Iterator[pd.DataFrame]:
    """Event-time sessions for ``applyInPandasWithState`` (``EventTimeTimeout``): a user's open
    event times in the state; sessions that ended ``GAP`` before the watermark are emitted, the
    timeout set to when the last open one ends."""
    times = np.frombuffer(state.get[0], dtype=np.int64).tolist() if state.exists else []
    for frame in pdfs:
        times.extend(int(t) for t in frame["ms"].tolist())
    watermark = state.getCurrentWatermarkMs()
    out, kept = [], []
    for start, end, count in split_sessions(times, GAP):
        if end + GAP <= watermark:
            out.append((key[0], start, end, count))
        else:
            kept.extend(t for t in times if start <= t <= end)
    if kept:
        state.update((np.array(kept, dtype=np.int64).tobytes(),))
        state.setTimeoutTimestamp(max(kept) + GAP)
    elif state.exists:
        state.remove()
    if out:
        yield pd.DataFrame(out, columns=["user", "start", "end", "events"])


class Inputs:
    """The input files of every workload (and tiny ones for the warm-up), in a private dir."""

    def __init__(self, quick: bool) -> None:
        self.sizes = s = sizes(quick)
        self.root = Path(tempfile.mkdtemp(prefix="statekit-compat-bench-",
                                          dir=os.environ.get("STATEKIT_BENCH_TMP")))
        self.counts = self.root / "counts"
        spark_driver.write_counts_input(self.counts, s["count_files"], s["count_rows"],
                                        s["count_keys"])
        self.sessions = self.root / "sessions"
        spark_sessions_driver.write_input(self.sessions, s["session_files"], s["session_rows"],
                                          s["session_keys"])
        self.warm_counts = self.root / "warm-counts"
        spark_driver.write_counts_input(self.warm_counts, 2, 200, 50)
        self.warm_sessions = self.root / "warm-sessions"
        spark_sessions_driver.write_input(self.warm_sessions, 1, 200, 50)
        self.work = self.root / "work"


def switch(spark: Any, backend: str) -> None:
    """What a user changes: the switch and the backend flag (nothing for Spark's own run)."""
    import statekit.spark.compat

    if backend == NATIVE:
        statekit.spark.compat.disable(spark)
        spark.conf.unset("spark.statekit.state.backend.type")
    else:
        statekit.spark.compat.enable(spark)
        spark.conf.set("spark.statekit.state.backend.type", backend)


def run(spark: Any, workload: str, api: str, backend: str, counts: Path, sessions: Path,
        work: Path, keys: int) -> dict[str, Any]:
    """One run: the user's unchanged code, natively or through the switch; its figures."""
    switch(spark, backend)
    try:
        if workload == "count":
            path = ("spark_transform_with_state_in_pandas" if api == "tws"
                    else "spark_apply_in_pandas_with_state")
            result = spark_driver.run(spark, path, NATIVE, counts, work / backend, keys=keys)
        else:
            domain = workload.removeprefix("sessions_")
            result = spark_sessions_driver.run(
                spark, f"spark_tws_{domain}", NATIVE, sessions, work / f"{api}-{backend}",
                keys=keys, query=aipws_sessions_query if api == "aipws" else None)
    finally:
        switch(spark, NATIVE)
    keep = ("rows", "keys", "batches", "wall_s", "rows_per_s", "batch_s", "correct", "checked",
            "sessions", "loadavg_1m_start_end", "git")
    return {"workload": workload, "api": api, "backend": backend,
            **{k: result[k] for k in keep if k in result}}


def aipws_sessions_query(spark: Any, path: str, backend: str, input_dir: Path, sink: Any,
                        skdir: Path) -> Any:
    """The event-time sessions' writer with :func:`aipws_sessions` (``applyInPandasWithState``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    src = (spark.readStream.schema("user string, ms long, ts timestamp")
           .option("maxFilesPerTrigger", 1).parquet(str(input_dir))
           .withWatermark("ts", f"{spark_sessions_driver.DELAY_MS // 1000} seconds"))
    df = src.groupBy("user").applyInPandasWithState(
        aipws_sessions, spark_sessions_driver.OUTPUT, SESSION_STATE, "update",
        GroupStateTimeout.EventTimeTimeout)
    return df.writeStream.outputMode("update").foreachBatch(sink)


def run_path(spark: Any, inputs: Inputs, workload: str, api: str, backend: str,
             work: Path | None = None, warm: bool = False) -> dict[str, Any]:
    """:func:`run` of one path over ``inputs`` (the warm-up inputs if ``warm``)."""
    counts = inputs.warm_counts if warm else inputs.counts
    sessions = inputs.warm_sessions if warm else inputs.sessions
    keys = 50 if warm else inputs.sizes["count_keys" if workload == "count" else "session_keys"]
    work = work or inputs.work
    return run(spark, workload, api, backend, counts, sessions, work, keys)


def warm_up(spark: Any, inputs: Inputs) -> None:
    """Untimed tiny runs of both APIs, natively and through the switch (JIT, planning, workers)."""
    for workload, api in (("count", "tws"), ("count", "aipws"), ("sessions_event", "aipws")):
        for backend in (NATIVE, "rocksdb"):
            run_path(spark, inputs, workload, api, backend, inputs.work / "warm", warm=True)


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each statekit run's rows/s over Spark's own run of the same workload and API."""
    native = {(r["workload"], r["api"]): r for r in results if r["backend"] == NATIVE}
    out = []
    for r in results:
        r = dict(r)
        ref = native.get((r["workload"], r["api"]))
        if r["backend"] != NATIVE and ref is not None:
            r["ratio_to_spark"] = round(r["rows_per_s"] / ref["rows_per_s"], 2)
            r["target_ratio"] = TARGETS[r["api"]]
            if "sessions" in r:
                r["same_sessions_as_spark"] = bool(r["correct"] and ref["correct"]
                                                   and r["sessions"] == ref["sessions"])
        out.append(r)
    return out


def save(results: list[dict[str, Any]], quick: bool) -> Path:
    return save_summary(summarize(results), "STATEKIT_COMPAT_JSON", "spark-compat", quick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted({w for w, _, _ in PATHS}))
    parser.add_argument("api", choices=sorted(TARGETS))
    parser.add_argument("backend", choices=[NATIVE, "hashmap", "rocksdb"])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    inputs = Inputs(args.quick)
    spark = make_spark()
    try:
        warm_up(spark, inputs)
        print(json.dumps(run_path(spark, inputs, args.workload, args.api, args.backend), indent=1))
    finally:
        stop_spark(spark)
        shutil.rmtree(inputs.root, ignore_errors=True)


if __name__ == "__main__":
    main()
