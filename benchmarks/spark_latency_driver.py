"""A Spark ``foreach_batch`` micro-batch's latency against the state already held: inputs, the keyed
function, the stateless baseline and one run per backend configuration.

One streaming query per configuration reads parquet files one per trigger (``maxFilesPerTrigger=1``,
``trigger(availableNow=True)``).  The files, in order: for each state size, *growth* files whose
rows are new keys (bulk micro-batches of up to ``GROW_ROWS`` rows, up to the size), then ``WARM``
*warm-up* micro-batches and ``PAIRS`` pairs of *measured* micro-batches, each of ``TOUCH`` rows
over ``TOUCH`` distinct keys already held.  Every micro-batch but one kind goes through statekit's
``foreach_batch``: the second batch of each pair goes through a plain ``foreachBatch`` doing the same
Python work without state (the baseline: what Spark, Arrow and the value building cost alone).

The keyed function reads each key's ValueState (about 1 KiB of bytes), writes a new value, and
emits whether the key had a value (the sink checks that every measured key had one).  Per
micro-batch: Spark's own ``durationMs`` (``triggerExecution``, ``addBatch``), the wall time of the
``foreachBatch`` call, and the bytes that appeared under statekit's checkpoint directory.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.spark_driver import ByteMeter, _git, _write
from statekit import Types, ValueStateDescriptor
from statekit.runtime.functions import VectorizedKeyedFunction

VALUE_BYTES = 1024
OUTPUT = "key long, had boolean, fresh boolean"
_POOL = random.Random(42).randbytes(1 << 20)
_SPAN = len(_POOL) - VALUE_BYTES


def values(keys: list[int], versions: list[int]) -> list[bytes]:
    """About 1 KiB per key, different per (key, version): slices of a fixed random pool."""
    pool, span, n = _POOL, _SPAN, VALUE_BYTES
    out = []
    for k, v in zip(keys, versions, strict=True):
        o = (k * 7919 + v * 104729) % span
        out.append(pool[o:o + n])
    return out


class Touch(VectorizedKeyedFunction):
    """Read each key's value, write a new one; one row ``(key, had a value, fresh)`` per key,
    ``fresh`` in the first batch after ``open()`` (the partition's state was restored, not reused)."""

    def open(self, ctx: Any) -> None:
        self.desc = ValueStateDescriptor("value", Types.PRIMITIVE_ARRAY(Types.BYTE()))
        ctx.get_state(self.desc)
        self.fresh = True

    def process_batch(self, rows: pd.DataFrame, state: Any) -> pd.DataFrame:
        keys = rows["key"].tolist()
        old = state.get(self.desc, keys)
        state.put(self.desc, keys, values(keys, rows["v"].tolist()))
        fresh, self.fresh = self.fresh, False
        return pd.DataFrame({"key": keys, "had": [o is not None and len(o) == VALUE_BYTES for o in old],
                             "fresh": fresh})


def stateless(batches: Any) -> Any:
    """The baseline's partition: the same Arrow -> pandas -> values -> Arrow work, no state."""
    import pyarrow as pa

    for batch in batches:
        if batch.num_rows == 0:
            continue
        frame = batch.to_pandas()
        keys = frame["key"].tolist()
        built = values(keys, frame["v"].tolist())
        yield pa.RecordBatch.from_pandas(
            pd.DataFrame({"key": keys, "had": [len(b) == VALUE_BYTES for b in built], "fresh": False}),
            preserve_index=False)


# --- inputs ---------------------------------------------------------------------------------------


@dataclass
class Plan:
    """The micro-batches of one run, in order: ``(kind, size, rows)`` per file / batch id."""

    sizes: list[int]
    touch: int
    warm: int
    pairs: int
    grow_rows: int
    batches: list[tuple[str, int, int]] = field(default_factory=list)

    def write(self, directory: Path, seed: int = 7) -> None:
        """The input files, one per micro-batch (strictly increasing mtimes: read in order)."""
        directory.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        held, i = 0, 0
        for size in self.sizes:
            while held < size:  # growth: new keys held .. min(held + grow_rows, size)
                n = min(self.grow_rows, size - held)
                keys = np.arange(held, held + n, dtype="int64")
                _write(directory, i, pd.DataFrame({"key": keys, "v": np.zeros(n, dtype="int64")}))
                self.batches.append(("grow", size, n))
                held, i = held + n, i + 1
            kinds = ["warm"] * self.warm + ["statekit", "baseline"] * self.pairs
            for version, kind in enumerate(kinds, start=1):
                keys = rng.choice(size, self.touch, replace=False).astype("int64")
                _write(directory, i, pd.DataFrame({"key": keys, "v": np.full(self.touch, version,
                                                                            dtype="int64")}))
                self.batches.append((kind, size, self.touch))
                i += 1


def plan(quick: bool, sizes: list[int]) -> Plan:
    if quick:
        return Plan(sizes, touch=1_000, warm=1, pairs=3, grow_rows=20_000)
    return Plan(sizes, touch=10_000, warm=2, pairs=8, grow_rows=150_000)


# --- one run --------------------------------------------------------------------------------------


class Timed:
    """The ``foreachBatch`` callable: statekit's ``foreach_batch`` or the stateless baseline by the
    plan's kind of the batch; records wall time, checkpoint bytes and the sink's check."""

    def __init__(self, spark: Any, kinds: list[tuple[str, int, int]], conf: dict[str, Any],
                 meter: ByteMeter) -> None:
        from statekit.spark import foreach_batch

        self.kinds, self.meter = kinds, meter
        self.records: dict[int, dict[str, Any]] = {}
        self.checked: dict[int, tuple[int, int, int]] = {}
        self.stateful = foreach_batch(Touch(), "key", OUTPUT, self.sink, num_partitions=2, conf=conf)

    def sink(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("had").cast("long")).alias("had"),
                     F.sum(F.col("fresh").cast("long")).alias("fresh")).first()
        self.checked[batch_id] = (int(row["n"]), int(row["had"] or 0), int(row["fresh"] or 0))

    def baseline(self, df: Any, batch_id: int) -> None:
        from pyspark import StorageLevel

        out = df.repartition(2, "key").mapInArrow(stateless, OUTPUT).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            out.count()
            self.sink(out, batch_id)
        finally:
            out.unpersist()

    def __call__(self, df: Any, batch_id: int) -> None:
        kind = self.kinds[batch_id][0]
        t0 = time.perf_counter()
        (self.baseline if kind == "baseline" else self.stateful)(df, batch_id)
        wall = time.perf_counter() - t0
        written = self.meter.sample()
        self.records[batch_id] = {"wall_s": round(wall, 4), "checkpoint_bytes": written,
                                  "loadavg_1m": round(os.getloadavg()[0], 2)}


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(xs), 4), "max": round(max(xs), 4),
            "min": round(min(xs), 4)} if xs else {}


def run(spark: Any, backend: str, incremental: bool, the_plan: Plan, work: Path) -> dict[str, Any]:
    """Run the plan's micro-batches through one query; the per-size figures."""
    tag = f"{backend}-{'incremental' if incremental else 'full'}"
    base = work / tag
    shutil.rmtree(base, ignore_errors=True)
    inputs, ckpt, skdir = base / "input", base / "ckpt", base / "statekit"
    the_plan.write(inputs)
    skdir.mkdir(parents=True)
    kind, _, changelog = backend.partition("+")  # "rocksdb+changelog": changelog checkpoints
    conf = {"state.backend.type": kind, "state.checkpoints.dir": str(skdir),
            "state.backend.incremental": str(incremental).lower(),
            "state.changelog.enabled": str(changelog == "changelog").lower()}
    timed = Timed(spark, the_plan.batches, conf, ByteMeter(skdir))
    src = spark.readStream.schema("key long, v long").option("maxFilesPerTrigger", 1).parquet(str(inputs))
    t0 = time.perf_counter()
    query = (src.writeStream.foreachBatch(timed).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.perf_counter() - t0
    progress = {int(p["batchId"]): p["durationMs"] for p in query.recentProgress if p["numInputRows"]}
    batches = []
    for bid, (kind, size, rows) in enumerate(the_plan.batches):
        rec = timed.records.get(bid, {})
        dur = progress.get(bid, {})
        n, had, fresh = timed.checked.get(bid, (None, None, None))
        batches.append({"batch": bid, "kind": kind, "size": size, "rows": rows, **rec,
                        "trigger_s": dur.get("triggerExecution", 0) / 1000 if dur else None,
                        "add_batch_s": dur.get("addBatch", 0) / 1000 if dur else None,
                        "out_rows": n, "had": had, "restored_rows": fresh})
    shutil.rmtree(base, ignore_errors=True)
    return {"backend": backend, "incremental": incremental, "git": _git(), "wall_s": round(wall, 1),
            "touch": the_plan.touch, "value_bytes": VALUE_BYTES, "batches": batches,
            "sizes": summarize(batches, the_plan.sizes)}


def summarize(batches: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Per size: p50 / max of the measured statekit and baseline batches, ratios to the smallest
    size, checkpoint bytes per measured batch, load averages; ``correct``: every touched key had a
    value (none of the growth batches' new keys had one) and every batch emitted one row per key."""
    out: list[dict[str, Any]] = []
    for size in sizes:
        mine = [b for b in batches if b["size"] == size]
        sk = [b for b in mine if b["kind"] == "statekit"]
        bl = [b for b in mine if b["kind"] == "baseline"]
        grow = [b for b in mine if b["kind"] == "grow"]
        row: dict[str, Any] = {"size": size, "measured": len(sk)}
        for name, group in (("statekit", sk), ("baseline", bl)):
            for metric in ("trigger_s", "add_batch_s", "wall_s"):
                row[f"{name}_{metric}"] = _stats([b[metric] for b in group if b.get(metric) is not None])
        row["state_added_p50_s"] = round(row["statekit_trigger_s"]["p50"]
                                         - row["baseline_trigger_s"]["p50"], 4) if sk and bl else None
        row["checkpoint_bytes_p50"] = (int(statistics.median([b["checkpoint_bytes"] for b in sk]))
                                       if sk else None)
        row["restored_share_p50"] = (round(statistics.median([b["restored_rows"] / b["rows"]
                                                              for b in sk]), 3) if sk else None)
        row["batches_with_restore"] = sum(1 for b in sk if b["restored_rows"])
        row["grow_batches"] = len(grow)
        row["grow_s"] = round(sum(b.get("trigger_s") or 0 for b in grow), 2)
        loads = [b["loadavg_1m"] for b in sk + bl if "loadavg_1m" in b]
        row["loadavg_1m"] = [min(loads), max(loads)] if loads else []
        row["correct"] = (all(b["had"] == (0 if b["kind"] == "grow" else b["rows"]) for b in mine)
                          and all(b["out_rows"] == b["rows"] for b in mine))
        out.append(row)
    first = out[0] if out else None
    for row in out:
        for name in ("statekit", "baseline"):
            ref = first[f"{name}_trigger_s"].get("p50") if first else None
            cur = row[f"{name}_trigger_s"].get("p50")
            row[f"{name}_ratio_to_smallest"] = round(cur / ref, 3) if ref and cur else None
    return out
