"""The Spark half of a state import: a new checkpoint location from which the switched query
continues at the source query's last committed batch.

Spark resumes a query from its ``offsets/`` and ``commits/`` logs, the sources' own logs
(``sources/``) and its ``metadata`` (the query id); these are copied up to the committed batch
(offsets one further: a batch Spark planned but did not commit runs again over the same input).
The switched query runs Spark's transformWithState operator, which keeps no state of its own but
still opens Spark's state store at the batch it resumes from: that store version, the operator's
metadata and its schema file are taken from a run of the same operator (same API, key columns,
time mode, output mode and partition count) over one empty file in a scratch directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from statekit.checkpoint.blobstore.base import BlobStore
from statekit.checkpoint.blobstore.fsspec import blob_store_for
from statekit.errors import CheckpointError
from statekit.spark.compat.bridge import PROVIDER_KEY
from statekit.spark.session import ROCKSDB_PROVIDER

#: what Spark's own checkpoint holds besides state, copied as it is (the metadata, naming the
#: query id, last: without it Spark does not take the location for a query's)
COPIED = ("sources/", "metadata")
PRIME_TIMEOUT_S = 300.0
#: the event-time column of the priming run (a watermark, for operators in event time)
PRIME_TIME = "__statekit_import_time"


def log_entry(data: bytes) -> tuple[str, dict[str, Any], list[str]]:
    """A Spark log file (``offsets/N``, ``commits/N``): its version line, its first JSON object
    and the lines after it."""
    lines = data.decode().split("\n")
    return lines[0], json.loads(lines[1]), lines[2:]


def write_entry(version: str, head: dict[str, Any], rest: list[str]) -> bytes:
    return "\n".join([version, json.dumps(head, separators=(",", ":")), *rest]).encode()


def copy_progress(source: BlobStore, target: BlobStore, committed: int) -> None:
    """Copy the query's progress up to batch ``committed``: the offsets (with Spark's RocksDB
    provider, which the switched operator needs, in the configuration Spark restores from
    them), the commits (without the source operator's state checkpoint ids), the sources'
    logs and the query's metadata."""
    for key in sorted(source.list("offsets/")):
        name = key.split("/")[-1]
        if not name.isdigit() or int(name) > committed + 1:
            continue
        version, head, rest = log_entry(source.get(key))
        head.setdefault("conf", {})[PROVIDER_KEY] = ROCKSDB_PROVIDER
        target.put(f"offsets/{name}", write_entry(version, head, rest))
    for key in sorted(source.list("commits/")):
        name = key.split("/")[-1]
        if not name.isdigit() or int(name) > committed:
            continue
        version, head, rest = log_entry(source.get(key))
        head.pop("stateUniqueIds", None)
        target.put(f"commits/{name}", write_entry(version, head, rest))
    for prefix in COPIED:
        keys = source.list(prefix) if prefix.endswith("/") else [prefix]
        for key in keys:
            if not key.split("/")[-1].startswith("."):  # Hadoop's .crc files stay behind
                target.put(key, source.get(key))


def prime_operator_state(spark: Any, target: BlobStore, target_location: str, *, operator: int,
                         committed: int, partitions: int, key_schema: Any,
                         start: Callable[[Any, str], Any]) -> None:
    """Give the switched operator Spark's (empty) state store at batch ``committed``.

    ``start(grouped_df, checkpoint)`` starts the same operator as the switched query will run
    (statekit's bridge: same API, time mode and output mode) over ``grouped_df``; it runs one
    batch over an empty file with ``partitions`` shuffle partitions, and its store version,
    operator metadata and schema file become the target's (``target_location`` as Spark spells
    it), renamed to batch ``committed``.
    """
    from pyspark.sql.types import StructType, TimestampType

    work = tempfile.mkdtemp(prefix="statekit-import-")
    saved = {key: spark.conf.get(key, None) for key in
             ("spark.sql.shuffle.partitions", PROVIDER_KEY, "spark.statekit.state.checkpoints.dir",
              "spark.statekit.state.checkpoint-storage")}
    query = None
    try:
        schema = StructType([*key_schema.fields]).add(PRIME_TIME, TimestampType())
        spark.createDataFrame([], schema).coalesce(1).write.parquet(f"{work}/in")
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        spark.conf.set(PROVIDER_KEY, ROCKSDB_PROVIDER)
        spark.conf.set("spark.statekit.state.checkpoints.dir", f"{work}/statekit")
        spark.conf.unset("spark.statekit.state.checkpoint-storage")
        df = (spark.readStream.schema(schema).parquet(f"{work}/in")
              .withWatermark(PRIME_TIME, "0 seconds"))
        query = start(df.groupBy(*[f.name for f in key_schema.fields]), f"{work}/cp")
        _await_commit(query, blob_store_for(f"{work}/cp"))
        query.stop()
        query = None
        _adopt_state(blob_store_for(f"{work}/cp/state/0"), target, target_location, operator,
                     committed, partitions)
    finally:
        if query is not None:
            query.stop()
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
        _remove_when_quiet(work)


def _remove_when_quiet(path: str, quiet_s: float = 0.5, limit_s: float = 15.0) -> None:
    """Remove the priming run's directory once nothing writes into it any more: a task of its
    next batch, cancelled by ``stop()``, can still be writing (and recreating directories) for
    a moment after ``stop()`` returns."""
    deadline = time.monotonic() + limit_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(quiet_s)
        if not os.path.exists(path) or time.monotonic() > deadline:
            return


def _await_commit(query: Any, checkpoint: BlobStore) -> None:
    """Wait until the priming query committed its first batch (a query in processing time
    runs on without input, so it is stopped rather than awaited)."""
    deadline = time.monotonic() + PRIME_TIMEOUT_S
    while not checkpoint.exists("commits/0"):
        error = query.exception()
        if error is not None:
            raise CheckpointError(f"preparing Spark's operator state failed: {error}")
        if time.monotonic() > deadline:
            raise CheckpointError("preparing Spark's operator state did not finish within "
                                  f"{PRIME_TIMEOUT_S:.0f} s")
        time.sleep(0.2)


def _adopt_state(prime: BlobStore, target: BlobStore, target_location: str, operator: int,
                 committed: int, partitions: int) -> None:
    """The primed operator's store version 1 (after its batch 0), metadata and schema file as
    the target's at batch ``committed`` (store version ``committed + 1``)."""
    base = f"state/{operator}"
    for partition in range(partitions):
        target.put(f"{base}/{partition}/{committed + 1}.zip", prime.get(f"{partition}/1.zip"))
    version, head, rest = log_entry(prime.get("_metadata/v2/0"))
    head["operatorInfo"]["operatorId"] = operator
    for info in head.get("stateStoreInfo", []):
        paths = []
        for path in info.get("stateSchemaFilePaths", []):
            key = path[path.index("/_stateSchema/") + 1:]
            new = re.sub(r"/[^/]*$", f"/{committed}_{uuid.uuid4()}", key)
            target.put(f"{base}/{new}", prime.get(key))
            paths.append(f"{target_location.rstrip('/')}/{base}/{new}")
        info["stateSchemaFilePaths"] = paths
    target.put(f"{base}/_metadata/v2/{committed}", write_entry(version, head, rest))
