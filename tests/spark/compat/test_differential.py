"""Differential runs: a user's unchanged code for Spark's stateful APIs, run natively by Spark and
through statekit's switch on both backends, over the same input files, gives the same output rows
in every micro-batch, across a stop and a restart by a new driver process.

Each workload (``diff_workloads``) runs as one native query and one switched query per backend,
fed in lockstep by ``diff_driver`` in two processes: the first reads some files and stops, the
second goes on from the checkpoints with more.  Every batch's rows are compared:

- without processing time (running count, initial state, event-time sessions with
  ``transformWithStateInPandas`` timers and with ``applyInPandasWithState``'s
  ``EventTimeTimeout``) batch by batch: the batches are the same ones (the driver waits for the
  batches without input a watermark starts before it writes the next file);
- with processing time (list and map state with TTL, sessions on processing-time timers) by the
  file each batch read: the batch that read a file, and together the batches without input that
  followed it.  Spark runs such batches back to back as long as the query runs, so how many there
  are is the machine's, not the query's; what they output is determined once the driver paces the
  files (``diff_driver``: every TTL or timer is either ``PERIOD`` plus a margin past or not yet
  due at every batch), which the test checks from the offset logs before comparing.

The default run has the running count and event-time sessions on RocksDB; the rest of the matrix
is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.compat.diff_driver import MARGIN_MS, NATIVE, ROUND, batches
from tests.spark.compat.diff_workloads import PERIOD, WORKLOADS

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[3]
BACKENDS = ("hashmap", "rocksdb")


def drive(work: Path, first: int, last: int, workloads: list[str], backends: list[str],
          flush: bool = False) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.compat.diff_driver", str(work), str(first), str(last),
         ",".join(workloads), ",".join(backends), *(["--flush"] if flush else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def per_batch(work: Path, name: str, run: str) -> dict[object, list]:
    """The run's committed batches' output rows: by batch id, or (processing time) by the file
    read: ``("read", i)`` for the batch that read file ``i``, ``("after", i)`` for the batches
    without input after it."""
    processing = WORKLOADS[name].time == "ProcessingTime"
    out: dict[object, list] = {}
    for b in batches(work / "query" / f"{name}-{run}"):
        if not b["committed"]:
            continue
        rows = json.loads((work / "out" / f"{name}-{run}" / f"b{b['batch']}.json").read_text())
        if not processing:
            out[b["batch"]] = rows
        else:
            out.setdefault(("read" if b["data"] else "after", b["offset"]), []).extend(rows)
    return {k: sorted(v) for k, v in out.items()}


def check_pacing(work: Path, name: str, run: str) -> None:
    """Processing time: the files of a round were read within ``PERIOD`` less the margin, so no
    TTL or timer fell due between them (the rounds themselves are ``PERIOD`` apart by design)."""
    reads = {b["offset"]: b["ts"] for b in batches(work / "query" / f"{name}-{run}")
             if b["data"]}
    for i, ts in reads.items():
        if i % ROUND and i - 1 in reads:
            assert ts - reads[i - 1] < PERIOD - MARGIN_MS, (
                f"{name}-{run}: files {i - 1} and {i} were read {ts - reads[i - 1]} ms apart; the "
                f"run is not determined by its input (the machine is too loaded for PERIOD)")


def compare(work: Path, workloads: list[str], backends: list[str], files: int) -> None:
    for name in workloads:
        processing = WORKLOADS[name].time == "ProcessingTime"
        if processing:
            for run in (NATIVE, *backends):
                check_pacing(work, name, run)
        native = per_batch(work, name, NATIVE)
        # the native run read every file and put out something (the comparison is not vacuous)
        assert max(b["offset"] for b in batches(work / "query" / f"{name}-{NATIVE}")) >= files - 1
        assert sum(len(rows) for rows in native.values()) >= files, name
        for backend in backends:
            mine = per_batch(work, name, backend)
            assert mine.keys() == native.keys(), (name, backend)
            for key, rows in native.items():
                assert mine[key] == rows, (name, backend, key)


def run_differential(work: Path, workloads: list[str], backends: list[str], first: int,
                     files: int) -> None:
    drive(work, 0, first, workloads, backends)  # the first driver stops after these files
    drive(work, first, files, workloads, backends, flush=True)  # a new driver goes on
    compare(work, workloads, backends, files)


def test_count_and_event_sessions(tmp_path):
    run_differential(tmp_path, ["count_tws", "esession_tws"], ["rocksdb"], 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("workloads", [
    ["count_tws", "count_aipws", "initial_tws"],
    ["esession_tws", "esession_aipws"],
    ["ttl_tws", "psession_tws"],
], ids=["counts", "event-sessions", "processing-time"])
def test_full_matrix(tmp_path, workloads):
    run_differential(tmp_path, workloads, list(BACKENDS), 4, 8)
