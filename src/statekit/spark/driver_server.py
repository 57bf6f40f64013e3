"""The driver's HTTP server: JobManager checkpoints in the driver's memory and query locations.

Executors reach it with a secret created per query definition.  The server is exposed on the
driver's address, so it treats every request as untrusted:

- a secret made for an operator reaches only the area of *(query id, operator id)*, for a query
  its request proves it runs in: the request names the query and its run id (Spark's id of the
  query's current run, which only the query's tasks carry), and the driver confirms that run.  So
  a query stopped and started again in the same driver (a new definition, a new secret, the same
  query id) finds its state, and another query with an operator of the same name does not.  A
  secret made without an operator has a private area;
- ``/query`` tells the checkpoint location of a query only to a request that runs in it;
- each area holds at most its secret's quota of bytes (507 beyond);
- ``Content-Length`` must be plain ASCII digits (else 400, 411 when a body is missing it); a body
  over the frame limit gets 413 and the connection is closed without reading the body;
- deadlines per request, slots per client address and a reserve for authenticated connections
  (:mod:`statekit.spark.connections`): connections held by trickling or silence cannot keep
  executors out, and a client that hangs up ends its connection quietly;
- every malformed request (header, token, key, range, method) is answered with a 4xx, never a
  dropped connection with a traceback.
"""

from __future__ import annotations

import hmac
import io
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from statekit import config as cfg
from statekit.checkpoint.blobstore.base import check_key
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.errors import CheckpointNotFoundError, UnsafePathError
from statekit.spark.connections import Connection, DeadlineReader, GuardedServer

#: Flink's RPC frame limit: the largest request body the server accepts
MAX_REQUEST_BYTES = 10 * 1024 * 1024
TOKEN_HEADER = "X-Statekit-Token"  # noqa: S105 (a header name)
QUERY_HEADER = "X-Statekit-Query"
RUN_HEADER = "X-Statekit-Run"
#: seconds a connection may wait between requests
IDLE_TIMEOUT = 30.0
#: connections served at once, of which a quarter (by default) only for connections that showed
#: a valid secret
MAX_CONNECTIONS = 128
#: connections one client address may hold before showing a secret
PER_ADDRESS = 32
#: seconds a confirmed run of a query is trusted before the driver is asked again
RUN_TTL = 10.0
QUOTA_KEY = "state.checkpoint-storage.jobmanager.max-total-size"

_LENGTH = re.compile(r"[0-9]{1,19}")
_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")


class _Refused(Exception):
    """A request the handler answers with ``status`` and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class _Grant:
    """What one secret may do: the operator whose areas it reaches, and their quota."""

    operator_id: str | None
    quota: int
    private: str  # the area of a secret made without an operator


class JobManagerServer:
    """The driver-side blob server (one per driver process, many query secrets).

    ``current_run`` (query id → its running run's id) and ``locate`` (query id → its checkpoint
    location) answer for the driver's queries; :mod:`statekit.spark.jobmanager` sets them to ask
    Spark.  Without them no query is known: only secrets without an operator can store.
    """

    _instances: dict[str, JobManagerServer] = {}
    _lock = threading.Lock()

    def __init__(self, host: str = "127.0.0.1", max_request_bytes: int = MAX_REQUEST_BYTES,
                 advertise: str | None = None, *, idle_timeout: float = IDLE_TIMEOUT,
                 request_timeout: float | None = None, max_connections: int = MAX_CONNECTIONS,
                 reserved: int | None = None, per_address: int = PER_ADDRESS,
                 quota: int | None = None) -> None:
        self.store = MemoryBlobStore()
        self.max_request_bytes = max_request_bytes
        #: the quota of secrets made without one (bytes per area)
        self.quota = int(quota if quota is not None else cfg.default(QUOTA_KEY))
        self.locate: Callable[[str], str | None] = lambda query_id: None
        self.current_run: Callable[[str], str | None] = lambda query_id: None
        self._grants: dict[bytes, _Grant] = {}
        self._named: dict[tuple[str, str], str] = {}  # (query id, operator id) -> its area
        self._used: dict[str, int] = {}  # area -> bytes it holds
        self._runs: dict[str, tuple[str, float]] = {}  # query id -> (confirmed run, when)
        self._state = threading.Lock()
        self._httpd = GuardedServer(
            (host, 0), _handler(self), max_connections=max_connections,
            reserved=max_connections // 4 if reserved is None else reserved,
            per_address=per_address, idle_timeout=idle_timeout,
            request_timeout=request_timeout if request_timeout is not None else idle_timeout)
        self.url = f"http://{advertise or host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="statekit-jobmanager",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def get(cls, spark: Any = None) -> JobManagerServer:
        """The server of this driver process, started on first use, on the address executors
        reach the driver at (``spark.driver.bindAddress`` / ``spark.driver.host``; loopback
        without a session)."""
        bind, advertise = _driver_address(spark)
        with cls._lock:
            server = cls._instances.get(bind)
            if server is None:
                server = cls._instances[bind] = JobManagerServer(bind, advertise=advertise)
            return server

    def new_secret(self, operator_id: str | None = None, quota: int | None = None) -> str:
        """A secret for one query definition: for the areas of operator ``operator_id`` in the
        queries it runs in (each area holding at most ``quota`` bytes), or, without an operator,
        for an area of its own."""
        secret = secrets.token_urlsafe(24)
        grant = _Grant(operator_id, int(quota if quota is not None else self.quota),
                       f"s{secrets.token_hex(8)}")
        with self._state:
            self._grants[secret.encode()] = grant
        return secret

    def grant(self, token: bytes) -> _Grant | None:
        """The grant of the secret ``token`` (compared in constant time), or None."""
        found = None
        for secret, grant in list(self._grants.items()):
            if hmac.compare_digest(token, secret):
                found = grant
        return found

    def runs(self, query_id: str, run: str) -> bool:
        """Whether ``run`` is the running run of query ``query_id`` (asked of the driver, trusted
        for :data:`RUN_TTL` seconds)."""
        if not query_id or not run:
            return False
        now = time.monotonic()
        with self._state:
            known = self._runs.get(query_id)
        if known is not None and now - known[1] < RUN_TTL \
                and hmac.compare_digest(known[0].encode(), run.encode()):
            return True
        try:
            current = self.current_run(query_id)  # JVM calls: not under the lock
        except Exception as exc:  # report (the client retries), never crash
            raise _Refused(503, f"cannot ask the driver about query {query_id!r}: {exc}") from exc
        if current is None:
            return False
        with self._state:
            if len(self._runs) > 10_000:
                self._runs.clear()
            self._runs[query_id] = (current, now)
        return hmac.compare_digest(current.encode(), run.encode())

    def area(self, grant: _Grant, query_id: str) -> str:
        """The area of ``grant`` in query ``query_id`` (created on first use)."""
        if grant.operator_id is None:
            return grant.private
        with self._state:
            return self._named.setdefault((query_id, grant.operator_id), f"q{secrets.token_hex(8)}")

    def raw_key(self, secret: str, key: str, query_id: str = "") -> str:
        """Where the server keeps ``key`` of ``secret`` in query ``query_id`` (tests reach the
        driver's memory)."""
        return f"{self.area(self._grants[secret.encode()], query_id)}/{key}"

    def used(self, area: str) -> int:
        """Bytes the area ``area`` holds."""
        with self._state:
            return self._used.get(area, 0)

    def put(self, area: str, key: str, data: bytes, quota: int) -> None:
        """Store ``data`` at ``key`` of ``area``, unless the area would pass ``quota`` bytes."""
        with self._state:
            try:
                old = self.store.size(key)
            except CheckpointNotFoundError:
                old = 0
            total = self._used.get(area, 0) - old + len(data)
            if total > quota and len(data) > old:
                raise _Refused(507, f"this query's operator holds {self._used.get(area, 0)} bytes "
                                    f"in the driver's memory; {len(data)} more would pass its "
                                    f"quota of {quota} bytes ({QUOTA_KEY})")
            self.store.put(key, data)
            self._used[area] = total

    def delete(self, area: str, key: str) -> None:
        with self._state:
            try:
                size = self.store.size(key)
            except CheckpointNotFoundError:
                return
            self.store.delete(key)
            self._used[area] = max(0, self._used.get(area, 0) - size)

    def connections(self) -> tuple[int, int]:
        """``(anonymous, authenticated)`` connections open now."""
        return self._httpd.open_connections()

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: JobManagerServer) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``server``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        default_request_version = "HTTP/1.1"  # a garbled request line gets a status line too
        httpd: GuardedServer
        conn: Connection
        reader: DeadlineReader

        def setup(self) -> None:
            super().setup()
            self.httpd = self.server  # type: ignore[assignment]
            self.conn = self.httpd.connection(self.request)
            self.reader = DeadlineReader(self.conn, self.httpd.idle_timeout,
                                         self.httpd.request_timeout)
            self.rfile.close()
            self.rfile = io.BufferedReader(self.reader)

        def handle_one_request(self) -> None:
            self.reader.next_request()
            super().handle_one_request()

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def send_response(self, code: int, message: str | None = None) -> None:
            # the reply has the whole request deadline, whatever the reads left of it
            self.connection.settimeout(self.httpd.request_timeout)
            super().send_response(code, message)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None
                       ) -> None:
            # an unknown method is the client's mistake (405), not a server fault (501)
            super().send_error(405 if code == 501 else code, message, explain)

        def _reply(self, code: int, body: bytes = b"", close: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _serve(self, action: Callable[[_Grant], None]) -> None:
            """Authenticate, then run ``action(grant)``; a refusal or a malformed request is
            answered with a 4xx and the connection closed."""
            try:
                if self.headers.defects:  # e.g. a header line without a colon
                    raise _Refused(400, f"malformed headers: {self.headers.defects[0]!r}")
                grant = server.grant(self._header(TOKEN_HEADER).encode("latin-1", "replace"))
                if grant is None:
                    raise _Refused(403, "bad token")
                self.httpd.authenticated(self.conn)
                action(grant)
            except _Refused as exc:
                self._reply(exc.status, str(exc).encode(), close=True)
            except (ValueError, UnicodeError, UnsafePathError) as exc:
                self._reply(400, f"malformed request: {exc}".encode(), close=True)

        def _header(self, name: str) -> str:
            return (self.headers.get(name) or "").strip()

        def _area(self, grant: _Grant) -> str:
            """The area this request reaches: its grant's in the query it proves it runs in."""
            if grant.operator_id is None:
                return grant.private
            query_id = self._header(QUERY_HEADER)
            if not server.runs(query_id, self._header(RUN_HEADER)):
                raise _Refused(403, f"not a task of a running query {query_id!r} of this driver")
            return server.area(grant, query_id)

        def _key(self, area: str) -> str:
            path = urllib.parse.urlparse(self.path).path
            if not path.startswith("/b/"):
                raise _Refused(404, "no such resource")
            try:
                return f"{area}/{check_key(urllib.parse.unquote(path[3:], errors='strict'))}"
            except UnsafePathError as exc:
                raise _Refused(400, f"unsafe key: {exc}") from None

        def _length(self) -> int:
            values = self.headers.get_all("Content-Length") or []
            if not values:
                raise _Refused(411, "a body needs a Content-Length")
            if len(values) > 1 or not _LENGTH.fullmatch(values[0].strip()):
                raise _Refused(400, "Content-Length must be one non-negative decimal number")
            length = int(values[0])
            if length > server.max_request_bytes:
                raise _Refused(413, f"{length} bytes exceed the JobManager frame limit of "
                                    f"{server.max_request_bytes} bytes")
            return length

        def do_PUT(self) -> None:
            def put(grant: _Grant) -> None:
                if self.headers.get("Transfer-Encoding"):
                    raise _Refused(400, "chunked bodies are not accepted")
                length = self._length()
                area = self._area(grant)
                key = self._key(area)
                self.reader.allow(length)
                data = self.rfile.read(length)
                if len(data) != length:
                    raise _Refused(400, "the body ended early")
                server.put(area, key, data, grant.quota)
                self._reply(204)

            self._serve(put)

        def do_GET(self) -> None:
            def get(grant: _Grant) -> None:
                parsed = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(parsed.query, errors="strict")
                if parsed.path == "/query":
                    self._locate(query.get("id", [""])[0])
                    return
                area = self._area(grant)
                if parsed.path == "/list":
                    prefix = f"{area}/{query.get('prefix', [''])[0]}"
                    strip = len(area) + 1
                    listed = [k[strip:] for k in server.store.list(prefix)]
                    self._reply(200, "\n".join(listed).encode())
                    return
                key = self._key(area)
                try:
                    data = server.store.get(key)
                except CheckpointNotFoundError:
                    self._reply(404)
                    return
                rng = self.headers.get("Range")
                if rng is not None:
                    match = _RANGE.fullmatch(rng.strip())
                    if match is None or (match.group(2) and int(match.group(2)) < int(match.group(1))):
                        raise _Refused(400, "Range must be bytes=<first>-[<last>]")
                    start, end = int(match.group(1)), match.group(2)
                    data = data[start:int(end) + 1 if end else None]
                self._reply(200, data)

            self._serve(get)

        def _locate(self, query_id: str) -> None:
            """The checkpoint location of ``query_id``, to a task of that query only."""
            if not server.runs(query_id, self._header(RUN_HEADER)):
                raise _Refused(403, f"not a task of a running query {query_id!r} of this driver")
            try:
                location = server.locate(query_id)
            except Exception as exc:  # the lookup runs JVM calls: report, never crash
                self._reply(500, f"cannot look up query {query_id}: {exc}".encode())
                return
            self._reply(200 if location else 404, (location or "").encode())

        def do_HEAD(self) -> None:
            self._serve(lambda grant: self._reply(
                200 if server.store.exists(self._key(self._area(grant))) else 404))

        def do_DELETE(self) -> None:
            def delete(grant: _Grant) -> None:
                area = self._area(grant)
                server.delete(area, self._key(area))
                self._reply(204)

            self._serve(delete)

    return Handler


def _driver_address(spark: Any) -> tuple[str, str]:
    """``(bind, advertise)``: where the driver listens and the address executors use."""
    if spark is None:
        return "127.0.0.1", "127.0.0.1"
    conf = spark.sparkContext.getConf()
    host = conf.get("spark.driver.host", None) or "127.0.0.1"  # what Spark tells executors
    return conf.get("spark.driver.bindAddress", None) or host, host
