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
  are is the machine's, not the query's.  What they output is determined once the driver paces
  the files (``diff_driver``: before a file is read and before the queries stop, every TTL and
  timer set by earlier files is long due and every due timer has fired; without the wait before
  the stop, when each query stopped decided whether its sessions closed before the restart or
  in the first batch after it, a difference of the driver, not of statekit), so the short TTL
  and the session gap expire between files and a long TTL never: TTL's expiry and keeping, not
  where it falls within a run of batches closer together than the TTL (that depends on the
  machine's timing, on Spark alone too).

The default run has event-time sessions on RocksDB; the rest of the matrix
is marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.compat.diff_driver import NATIVE, batches
from tests.spark.compat.diff_workloads import WORKLOADS

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


def compare(work: Path, workloads: list[str], backends: list[str], files: int) -> None:
    for name in workloads:
        native = per_batch(work, name, NATIVE)
        # the native run read every file and put out rows in several batches (not vacuous)
        assert max(b["offset"] for b in batches(work / "query" / f"{name}-{NATIVE}")) >= files - 1
        assert sum(1 for rows in native.values() if rows) >= 3, name
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


@pytest.mark.heavy  # two driver processes, 2-3 min: make test-heavy (CI); the compat cases run by default
def test_event_sessions(tmp_path):
    """The heavy run's case (state, event-time timers, a restart); the rest is marked slow."""
    run_differential(tmp_path, ["esession_tws"], ["rocksdb"], 2, 4)


@pytest.mark.slow
@pytest.mark.parametrize("workloads", [
    ["count_tws", "count_aipws", "initial_tws"],
    ["esession_tws", "esession_aipws"],
    ["ttl_tws", "psession_tws"],
], ids=["counts", "event-sessions", "processing-time"])
def test_full_matrix(tmp_path, workloads):
    run_differential(tmp_path, workloads, list(BACKENDS), 3, 6)
