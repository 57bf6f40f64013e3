"""``foreach_batch`` rescaling against restarts at the same size: 4 -> 8 -> 3 partitions.

One query (local Spark, ``local[2]``) builds a ValueState of ``keys`` x 1 KiB at 4 partitions, then
runs one micro-batch per phase, each in a new Spark session (new Python workers: every partition
restores from checkpoint storage): at 8 partitions (a rescale), at 8 again (a restart), at 3 (a
rescale) and at 3 again (a restart).  Each phase's micro-batch reads and writes ``touch`` random
keys.  Per phase: the micro-batch's wall time, and from the version each partition commits
(``restore`` in its ``_metadata``) the bytes of checkpoint files its restore read by the commit
the restore's own time, and the times of the checkpoint after it (``commit``: the snapshot,
then its upload).  Prints one JSON line.

Run: ``python -m benchmarks.rescale_driver --root DIR --keys 1000000 --backend hashmap``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.spark_driver import _write
from benchmarks.spark_latency_driver import OUTPUT, Touch

PHASES = [("rescale", 8), ("restart", 8), ("rescale", 3), ("restart", 3)]


def _versions(statekit_dir: Path, batch: int) -> list[dict[str, Any]]:
    """The ``_metadata`` of version ``batch`` of every partition of the query's operator."""
    from statekit.checkpoint.blobstore.local import LocalBlobStore
    from statekit.checkpoint.layout import CheckpointStorageAccess

    out = []
    for where in sorted(statekit_dir.rglob("p[0-9][0-9][0-9][0-9][0-9]")):
        access = CheckpointStorageAccess(LocalBlobStore(str(where)), str(where), 0)
        if batch in access.completed():
            out.append(access.load(batch))
    return out


def _state_bytes(statekit_dir: Path, batch: int) -> int:
    from statekit.checkpoint.handles import file_handles

    return sum(int(h.get("size", 0)) for meta in _versions(statekit_dir, batch)
               for task in meta["tasks"].values() for h in file_handles(task))


def _run(inputs: Path, ckpt: Path, statekit_dir: Path, partitions: int, backend: str,
         sink: dict[int, Any]) -> dict[int, float]:
    """One query run in a new Spark session until its input is done; wall time per batch."""
    from statekit.spark import foreach_batch, local_spark

    spark = local_spark()
    walls: dict[int, float] = {}

    def keep(df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        row = df.agg(F.count("key").alias("n"), F.sum(F.col("had").cast("long")).alias("had")) \
            .first()
        sink[batch_id] = (int(row["n"]), int(row["had"] or 0))

    stateful = foreach_batch(Touch(), "key", OUTPUT, keep, num_partitions=partitions,
                             conf={"state.backend.type": backend,
                                   "state.checkpoints.dir": str(statekit_dir)})

    def timed(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        stateful(df, batch_id)
        walls[batch_id] = time.perf_counter() - t0

    try:
        src = spark.readStream.schema("key long, v long").option("maxFilesPerTrigger", 1) \
            .parquet(str(inputs))
        query = (src.writeStream.foreachBatch(timed).option("checkpointLocation", str(ckpt))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        spark.stop()
    return walls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--touch", type=int, default=1_000)
    parser.add_argument("--backend", default="hashmap")
    args = parser.parse_args()
    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    inputs, ckpt, statekit_dir = root / "input", root / "ckpt", root / "statekit"
    inputs.mkdir(parents=True)
    statekit_dir.mkdir()
    rng = np.random.default_rng(7)
    grow, files = 150_000, 0
    for start in range(0, args.keys, grow):  # the build: new keys, at 4 partitions
        keys = np.arange(start, min(start + grow, args.keys), dtype="int64")
        _write(inputs, files, pd.DataFrame({"key": keys, "v": np.zeros(len(keys), dtype="int64")}))
        files += 1
    sink: dict[int, Any] = {}
    t0 = time.perf_counter()
    _run(inputs, ckpt, statekit_dir, 4, args.backend, sink)
    build_s = time.perf_counter() - t0
    state_bytes = _state_bytes(statekit_dir, files - 1)
    phases = []
    for version, (kind, partitions) in enumerate(PHASES, start=1):
        keys = rng.choice(args.keys, args.touch, replace=False).astype("int64")
        _write(inputs, files, pd.DataFrame({"key": keys, "v": np.full(args.touch, version,
                                                                    dtype="int64")}))
        walls = _run(inputs, ckpt, statekit_dir, partitions, args.backend, sink)
        assert sink[files] == (args.touch, args.touch), sink[files]  # every key had its state
        versions = _versions(statekit_dir, files)
        restores = [m.get("restore") or {} for m in versions]
        commits = [m["commit"] for m in versions]
        assert len(restores) == partitions and all(restores), restores
        bytes_read = sum(r["bytes_read"] for r in restores)
        phases.append({
            "phase": kind, "partitions": partitions, "batch_s": round(walls[files], 3),
            "bytes_read": bytes_read, "read_vs_state": round(bytes_read / state_bytes, 3),
            "restore_s_max": max(r["seconds"] for r in restores),
            # the checkpoint after: its snapshot (a RocksDB rescale's compaction wait included)
            # and its upload (full checkpoints, the default: the whole partition either way)
            "snapshot_s_max": max(c["sync_s"] for c in commits),
            "upload_s_max": max(c["async_s"] for c in commits),
            "per_partition": [[r.get("seconds"), c["sync_s"], c["async_s"]]
                              for r, c in zip(restores, commits, strict=True)],
            "rescaled": all(r["rescaled"] for r in restores),
        })
        files += 1
    rescale_vs_restart = {
        f"to {p}": round(phases[i]["batch_s"] / phases[i + 1]["batch_s"], 3)
        for i, (_, p) in enumerate(PHASES) if i % 2 == 0}
    print(json.dumps({"backend": args.backend, "keys": args.keys, "touch": args.touch,
                      "state_bytes": state_bytes, "build_s": round(build_s, 2),
                      "phases": phases, "rescale_vs_restart_batch": rescale_vs_restart}))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
