"""Functions the cluster tests run in executor tasks (imported there as ``tests.cluster.tasks``)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd

LOCATION = "worker string, address string, netns string, pid long, partition int, attempt int, rows long"


def source_address(peer: str) -> str:
    """This host's address towards ``peer`` (a UDP connect only picks a route: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((peer, 9))
        return str(sock.getsockname()[0])


def location(peer: str, rows: int = 0) -> dict[str, Any]:
    """Where this task runs: the Worker (by the cluster's environment marker), address, netns, pid."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return {"worker": os.environ.get("STATEKIT_CLUSTER_WORKER", "?"), "address": source_address(peer),
            "netns": os.readlink("/proc/self/ns/net"), "pid": os.getpid(),
            "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(), "rows": rows}


def locate(batches: Iterator[pd.DataFrame], peer: str, sleep: float = 0.0,
           marker_dir: str | None = None) -> Iterator[pd.DataFrame]:
    """One row per task: its location and row count; writes ``<worker>-<partition>-<attempt>`` into
    ``marker_dir`` when it starts, and sleeps ``sleep`` s before it ends."""
    where = location(peer)
    if marker_dir:
        open(os.path.join(marker_dir, f"{where['worker']}-{where['partition']}-{where['attempt']}"),
             "w").close()
    rows = sum(len(pdf) for pdf in batches)
    time.sleep(sleep)
    yield pd.DataFrame([{**where, "rows": rows}])


def write_s3(batches: Iterator[pd.DataFrame], url: str, options: dict[str, Any], peer: str,
             sleep: float = 0.0) -> Iterator[pd.DataFrame]:
    """Writes the partition's ids to ``<url>/part-<partition>.csv`` with s3fs; one location row."""
    import s3fs

    where = location(peer)
    frames = list(batches)
    frame = pd.concat(frames) if frames else pd.DataFrame({"id": []})
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    with fs.open(f"{url}/part-{where['partition']}.csv", "w") as f:
        frame.to_csv(f, index=False)
    time.sleep(sleep)
    yield pd.DataFrame([{**where, "rows": len(frame)}])


def probe_stores(batches: Iterator[pd.DataFrame], stores: dict[str, Any],
                 peer: str) -> Iterator[pd.DataFrame]:
    """Puts one blob into each RemoteBlobStore; a row per store: location, whether it worked, error."""
    where = location(peer, sum(len(pdf) for pdf in batches))
    rows = []
    for name, store in stores.items():
        try:
            store.put(f"from-{where['partition']}", b"hello")
            ok, error = True, ""
        except Exception as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        rows.append({**where, "store": name, "ok": ok, "error": error})
    yield pd.DataFrame(rows)
