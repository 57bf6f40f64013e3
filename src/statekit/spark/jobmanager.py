"""The driver's services to executors: JobManager checkpoint storage and query locations.

A small HTTP server in the driver process (bound to the driver host, loopback in local mode)
keeps JobManager checkpoints in memory; executors reach it through :class:`RemoteBlobStore`,
authenticated by a secret created per query definition, and proving with their query's run id
(Spark's job group of the run's batches) which query they work for.  Flink's limits apply: each
state under ``max_state_size`` (checked when it is written) and each request under the 10 MiB
"RPC frame" (checked by the server); each operator of a query holds at most
``state.checkpoint-storage.jobmanager.max-total-size``.  Such checkpoints survive any worker
process and end with the driver, like a JobManager's.

The same server tells executors where a running query keeps its Spark checkpoint, so that
:class:`QueryCheckpointStorage` (the default on Spark) can keep statekit's checkpoints beside it:
state is then exactly as durable as the query.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

from statekit import config as cfg
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.blobstore.base import BlobStore, check_key
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import INLINE_ALL, JobManagerCheckpointStorage
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CheckpointNotFoundError, CheckpointStorageError, StateSizeError
from statekit.spark.driver_server import (
    MAX_REQUEST_BYTES,
    QUERY_HEADER,
    QUOTA_KEY,
    RUN_HEADER,
    TOKEN_HEADER,
    JobManagerServer,
)

#: the local property Spark sets to the run id on every job of a streaming query's run
RUN_PROPERTY = "spark.jobGroup.id"

__all__ = ["MAX_REQUEST_BYTES", "DriverCheckpointStorage", "JobManagerServer",
           "QueryCheckpointStorage", "RemoteBlobStore", "serving", "task_run"]


class _DriverClient:
    """Requests to the driver's server from one process: a kept-alive connection per thread, one
    reconnect when it went stale, and patience while the server is busy (503)."""

    #: how long a request keeps retrying while the server answers 503
    BUSY_PATIENCE = 60.0

    def __init__(self, url: str, secret: str) -> None:
        parsed = urllib.parse.urlparse(url)
        self.url = url
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.secret = secret
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """``(status, body)`` of one request; :class:`CheckpointStorageError` if unreachable."""
        headers = {TOKEN_HEADER: self.secret, **(headers or {})}
        deadline, pause = time.monotonic() + self.BUSY_PATIENCE, 0.05
        while True:
            status, data = self._once(method, path, body, headers)
            if status != 503 or time.monotonic() + pause > deadline:
                return status, data
            time.sleep(pause)
            pause = min(2 * pause, 2.0)

    def _once(self, method: str, path: str, body: bytes | None, headers: dict[str, str]
              ) -> tuple[int, bytes]:
        for attempt in range(2):  # one reconnect: a pooled connection may have gone stale
            conn = getattr(self._local, "conn", None)
            if conn is None or getattr(self._local, "pid", None) != os.getpid():
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                self._local.conn, self._local.pid = conn, os.getpid()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                if response.will_close:
                    conn.close()
                    self._local.conn = None
                return response.status, data
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise CheckpointStorageError(
                        f"the Spark driver's server is unreachable at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close this thread's connection, if any."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def task_run() -> str:
    """The id of the run of the streaming query the caller works for ('' if none): Spark makes it
    the job group of every batch of the run, seen by the batch's tasks and, in the driver, by the
    thread running the batch (a ``foreachBatch`` function).  The driver's server checks it."""
    from pyspark import SparkContext, TaskContext

    context = TaskContext.get()
    if context is not None:
        return context.getLocalProperty(RUN_PROPERTY) or ""
    driver = SparkContext._active_spark_context
    return (driver.getLocalProperty(RUN_PROPERTY) or "") if driver is not None else ""


class RemoteBlobStore(BlobStore):
    """A :class:`BlobStore` in the driver's memory, reached over HTTP from executors.

    With ``query_id``, requests reach the area of the secret's operator in that query, and carry
    ``run`` (default: the calling task's run, read at each request) to prove they belong to it.
    """

    def __init__(self, url: str, secret: str, namespace: str, query_id: str | None = None,
                 run: str | None = None) -> None:
        self.client = _DriverClient(url, secret)
        self.secret = secret
        self.namespace = check_key(namespace)
        self.query_id = query_id
        self.run = run

    def describe(self) -> str:
        return f"jobmanager://{self.namespace}"

    def _request(self, method: str, path: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        headers = dict(headers or {})
        if self.query_id is not None:
            headers[QUERY_HEADER] = self.query_id
            headers[RUN_HEADER] = self.run if self.run is not None else task_run()
        return self.client.request(method, path, body, headers)

    def _path(self, key: str) -> str:
        return "/b/" + urllib.parse.quote(f"{self.namespace}/{check_key(key)}")

    def put(self, key: str, data: bytes) -> None:
        if len(data) > MAX_REQUEST_BYTES:  # the server would refuse it unread and hang up
            raise StateSizeError(f"{len(data)} bytes exceed the JobManager frame limit of "
                                 f"{MAX_REQUEST_BYTES} bytes")
        status, body = self._request("PUT", self._path(key), bytes(data))
        if status in (413, 507):  # over the frame limit, over the area's quota
            raise StateSizeError(body.decode(errors="replace"))
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
        status = self._request("HEAD", self._path(key))[0]
        if status not in (200, 404):
            raise CheckpointStorageError(f"JobManager storage: {status} for {key}")
        return status == 200

    def delete(self, key: str) -> None:
        status, body = self._request("DELETE", self._path(key))
        if status != 204:
            raise CheckpointStorageError(f"JobManager storage refused to delete {key}: "
                                         f"{status} {body!r}")

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
              area: str | None = None, conf: Mapping[str, Any] | None = None
              ) -> DriverCheckpointStorage:
        """Storage on this driver's server for operator ``area`` (its operator id): its state in
        each query lies in the area of (query id, operator id), shared by every definition of the
        operator in that query (a query started again in this driver finds its state) and
        holding at most ``state.checkpoint-storage.jobmanager.max-total-size`` of ``conf``."""
        server = serving(spark)
        quota = cfg.read(conf or {}, QUOTA_KEY)
        return cls(server.url, server.new_secret(area, quota),
                   storage.get_max_state_size())

    def get_max_state_size(self) -> int:
        return self.max_state_size

    def get_savepoint_path(self) -> str | None:
        return None

    def create_access(self, job_id: str) -> CheckpointStorageAccess:
        store = RemoteBlobStore(self.url, self.secret, job_id, query_id=job_id.split("/", 1)[0])
        return CheckpointStorageAccess(store, f"jobmanager://{job_id}", INLINE_ALL,
                                       self.max_state_size)


_SESSIONS: list[Any] = []  # the sessions whose queries the driver's server answers for
_SESSIONS_LOCK = threading.Lock()


def serving(spark: Any) -> JobManagerServer:
    """This driver's server, answering for the queries of ``spark`` (and of sessions before)."""
    server = JobManagerServer.get(spark)
    if spark is not None:
        with _SESSIONS_LOCK:
            if all(s is not spark for s in _SESSIONS):
                _SESSIONS.insert(0, spark)
        server.current_run = query_run
        server.locate = _query_root
    return server


def _running_query(query_id: str) -> Any:
    """The running query ``query_id`` of a session the server answers for (JVM), or None."""
    try:  # Spark's query ids, as Spark spells them; anything else is no query (never sent on)
        if str(uuid.UUID(query_id)) != query_id:
            return None
    except ValueError:
        return None
    with _SESSIONS_LOCK:
        sessions = [s for s in _SESSIONS if s.sparkContext._jsc is not None]
        _SESSIONS[:] = sessions  # stopped sessions are forgotten
    for spark in sessions:
        jquery = spark._jsparkSession.streams().get(query_id)
        if jquery is not None:
            return jquery
    return None


def query_run(query_id: str) -> str | None:
    """The id of the current run of the running query ``query_id``, or None."""
    jquery = _running_query(query_id)
    return None if jquery is None else str(jquery.runId().toString())


def _query_root(query_id: str) -> str | None:
    """Where the running query ``query_id`` keeps its Spark checkpoint, or None."""
    jquery = _running_query(query_id)
    return None if jquery is None else str(jquery.streamingQuery().resolvedCheckpointRoot())


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
    """Ask the driver's server where query ``query_id`` (the calling task's) keeps its checkpoint."""
    client = _DriverClient(url, secret)
    try:
        return client.request("GET", "/query?" + urllib.parse.urlencode({"id": query_id}),
                              headers={RUN_HEADER: task_run()})
    finally:
        client.close()


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
        server = serving(spark)
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
