"""The driver's services to executors: JobManager checkpoint storage and query locations.

A small HTTP server in the driver process (bound to the driver host, loopback in local mode)
keeps JobManager checkpoints in memory; executors reach it through :class:`RemoteBlobStore`,
authenticated by a secret created per query definition.  Flink's limits apply: each state under
``max_state_size`` (checked when it is written) and each request under the 10 MiB "RPC frame"
(checked by the server).  Such checkpoints survive any worker process and end with the driver,
like a JobManager's.

The same server tells executors where a running query keeps its Spark checkpoint, so that
:class:`QueryCheckpointStorage` (the default on Spark) can keep statekit's checkpoints beside it:
state is then exactly as durable as the query.
"""

from __future__ import annotations

import http.client
import os
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.blobstore.base import BlobStore, check_key
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import INLINE_ALL, JobManagerCheckpointStorage
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CheckpointNotFoundError, CheckpointStorageError, StateSizeError
from statekit.spark.driver_server import MAX_REQUEST_BYTES, TOKEN_HEADER, JobManagerServer

__all__ = ["MAX_REQUEST_BYTES", "DriverCheckpointStorage", "JobManagerServer",
           "QueryCheckpointStorage", "RemoteBlobStore"]


class RemoteBlobStore(BlobStore):
    """A :class:`BlobStore` in the driver's memory, reached over HTTP from executors."""

    def __init__(self, url: str, secret: str, namespace: str) -> None:
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.secret = secret
        self.namespace = check_key(namespace)
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def describe(self) -> str:
        return f"jobmanager://{self.namespace}"

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        for attempt in range(2):  # one reconnect: a pooled connection may have gone stale
            conn = getattr(self._local, "conn", None)
            if conn is None or getattr(self._local, "pid", None) != os.getpid():
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self._local.conn, self._local.pid = conn, os.getpid()
            try:
                conn.request(method, path, body=body,
                             headers={TOKEN_HEADER: self.secret, **(headers or {})})
                response = conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise CheckpointStorageError(f"JobManager storage unreachable: {exc}") from exc
        raise AssertionError("unreachable")

    def _path(self, key: str) -> str:
        return "/b/" + urllib.parse.quote(f"{self.namespace}/{check_key(key)}")

    def put(self, key: str, data: bytes) -> None:
        if len(data) > MAX_REQUEST_BYTES:  # the server would refuse it unread and hang up
            raise StateSizeError(f"{len(data)} bytes exceed the JobManager frame limit of "
                                 f"{MAX_REQUEST_BYTES} bytes")
        status, body = self._request("PUT", self._path(key), bytes(data))
        if status == 413:
            raise StateSizeError(body.decode())
        if status != 204:
            raise CheckpointStorageError(f"JobManager storage refused {key}: {status} {body!r}")

    def get(self, key: str, start: int | None = None, length: int | None = None) -> bytes:
        headers = {}
        if start is not None:
            end = "" if length is None else str(start + length - 1)
            headers["Range"] = f"bytes={start}-{end}"
        status, body = self._request("GET", self._path(key), headers=headers)
        if status == 404:
            raise CheckpointNotFoundError(f"no blob {key!r} in JobManager storage")
        if status != 200:
            raise CheckpointStorageError(f"JobManager storage: {status} {body!r}")
        return body

    def exists(self, key: str) -> bool:
        return self._request("HEAD", self._path(key))[0] == 200

    def delete(self, key: str) -> None:
        self._request("DELETE", self._path(key))

    def list(self, prefix: str = "") -> list[str]:
        full = f"{self.namespace}/{prefix}"
        status, body = self._request("GET", "/list?" + urllib.parse.urlencode({"prefix": full}))
        if status != 200:
            raise CheckpointStorageError(f"JobManager storage: {status} {body!r}")
        strip = len(self.namespace) + 1
        return [k[strip:] for k in body.decode().split("\n") if k]


class DriverCheckpointStorage(CheckpointStorage):
    """JobManager checkpoint storage whose memory is the Spark driver's (picklable to executors)."""

    name = "jobmanager"

    def __init__(self, url: str, secret: str, max_state_size: int) -> None:
        self.url = url
        self.secret = secret
        self.max_state_size = max_state_size

    @classmethod
    def start(cls, storage: JobManagerCheckpointStorage, spark: Any = None,
              area: str | None = None) -> DriverCheckpointStorage:
        """Storage on this driver's server; ``area`` (the operator id) is shared by every query
        definition of that operator, so a query started again in this driver finds its state."""
        server = JobManagerServer.get(spark)
        return cls(server.url, server.new_secret(area), storage.get_max_state_size())

    def get_max_state_size(self) -> int:
        return self.max_state_size

    def get_savepoint_path(self) -> str | None:
        return None

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        store = RemoteBlobStore(self.url, self.secret, job_id)
        return CheckpointStorageAccess(store, f"jobmanager://{job_id}", INLINE_ALL,
                                       self.max_state_size)


def query_checkpoint_root(spark: Any, query_id: str) -> str | None:
    """Where the running query ``query_id`` of ``spark`` keeps its Spark checkpoint, or None."""
    jquery = spark._jsparkSession.streams().get(query_id)
    if jquery is None:
        return None
    return str(jquery.streamingQuery().resolvedCheckpointRoot())


def fsspec_url(hadoop_path: str) -> str:
    """The fsspec spelling of a Hadoop path (``file:/x`` → ``/x``, ``s3a://`` → ``s3://``)."""
    path = hadoop_path.strip()
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            rest = path[len(prefix):]
            return "/" + rest.lstrip("/")
    for scheme in ("s3a://", "s3n://"):
        if path.startswith(scheme):
            return "s3://" + path[len(scheme):]
    if path.startswith("dbfs:/"):
        return "/dbfs/" + path[len("dbfs:/"):].lstrip("/")
    return path


def _lookup(url: str, secret: str, query_id: str) -> tuple[int, bytes]:
    """Ask the driver's server where query ``query_id`` keeps its checkpoint."""
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=60)
    try:
        conn.request("GET", "/query?" + urllib.parse.urlencode({"id": query_id}),
                     headers={TOKEN_HEADER: secret})
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise CheckpointStorageError(f"the Spark driver is unreachable at {url}: {exc}") from exc
    finally:
        conn.close()


_LOCATIONS: dict[tuple[str, str], str] = {}
_LOCATIONS_LOCK = threading.Lock()


class QueryCheckpointStorage(CheckpointStorage):
    """statekit's checkpoints under each query's own checkpoint location (``<root>/statekit``).

    The default on Spark: the driver knows every running query's ``checkpointLocation``; a task
    asks the driver's server once per process and query, then writes files there through the
    file-system storage configured by the same flat keys.  A query is then restart-safe exactly
    when Spark's own checkpoint is, and deleting the query's checkpoint starts both afresh.
    """

    name = "query"
    SUBDIR = "statekit"

    def __init__(self, url: str, secret: str, conf: Mapping[str, Any]) -> None:
        self.url = url
        self.secret = secret
        self.conf = dict(conf)

    @classmethod
    def start(cls, spark: Any, conf: Mapping[str, Any]) -> QueryCheckpointStorage:
        """The storage for queries of ``spark``, with the driver's server answering lookups."""
        server = JobManagerServer.get(spark)
        server.locate = lambda query_id: query_checkpoint_root(spark, query_id)
        return cls(server.url, server.new_secret(), conf)

    def get_savepoint_path(self) -> str | None:
        return self.conf.get("state.savepoints.dir")

    def root(self, query_id: str) -> str:
        """``<the query's checkpoint location>/statekit``, looked up once per process."""
        slot = (self.url, query_id)
        with _LOCATIONS_LOCK:
            found = _LOCATIONS.get(slot)
        if found is None:
            status, body = _lookup(self.url, self.secret, query_id)
            if status != 200:
                raise CheckpointStorageError(
                    f"the driver does not know the checkpoint location of query {query_id} "
                    f"({status} {body.decode(errors='replace')}); set "
                    f"spark.statekit.state.checkpoints.dir to keep statekit state elsewhere")
            found = f"{fsspec_url(body.decode())}/{self.SUBDIR}"
            with _LOCATIONS_LOCK:
                _LOCATIONS[slot] = found
        return found

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        query_id = job_id.split("/", 1)[0]
        storage = FileSystemCheckpointStorage.from_config(
            {**self.conf, "state.checkpoints.dir": self.root(query_id)})
        return storage.create_access(job_id)

    def __repr__(self) -> str:
        return "QueryCheckpointStorage(<query checkpointLocation>/statekit)"
