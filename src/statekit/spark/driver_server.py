"""The driver's HTTP server: JobManager checkpoints in the driver's memory and query locations.

Executors reach it with a secret created per query definition.  The server is exposed on the
driver's address, so it treats every request as untrusted:

- a secret reaches only its own area: every key it reads, writes, lists or deletes lies under a
  private prefix the server chose for it, so one operator can neither see nor touch another's
  blobs.  Definitions of the same operator (its operator id) share an area: a query stopped and
  started again in the same driver is a new definition that must find its state;
- ``Content-Length`` must be plain ASCII digits (else 400, 411 when a body is missing it); a body
  over the frame limit gets 413 and the connection is closed without reading the body;
- a connection idle for ``idle_timeout`` seconds is closed, and at most ``max_connections`` are
  served at once (others get 503 and are closed), so half-sent requests cannot pin threads;
- every malformed request (header, token, key, range, method) is answered with a 4xx, never a
  dropped connection with a traceback.
"""

from __future__ import annotations

import hmac
import re
import secrets
import socketserver
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from statekit.checkpoint.blobstore.base import check_key
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.errors import CheckpointNotFoundError, UnsafePathError

#: Flink's RPC frame limit: the largest request body the server accepts
MAX_REQUEST_BYTES = 10 * 1024 * 1024
TOKEN_HEADER = "X-Statekit-Token"  # noqa: S105 (a header name)
#: seconds a connection may stay silent (between requests or within one)
IDLE_TIMEOUT = 30.0
#: connections served at once
MAX_CONNECTIONS = 128

_LENGTH = re.compile(r"[0-9]{1,19}")
_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")


class _Refused(Exception):
    """A request the handler answers with ``status`` and closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class JobManagerServer:
    """The driver-side blob server (one per driver process, many query secrets)."""

    _instances: dict[str, JobManagerServer] = {}
    _lock = threading.Lock()

    def __init__(self, host: str = "127.0.0.1", max_request_bytes: int = MAX_REQUEST_BYTES,
                 advertise: str | None = None, *, idle_timeout: float = IDLE_TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.store = MemoryBlobStore()
        self.max_request_bytes = max_request_bytes
        self._areas: dict[bytes, str] = {}  # secret -> the private prefix of its blobs
        self._named: dict[str, str] = {}  # operator id -> its private prefix
        self.locate: Callable[[str], str | None] = lambda query_id: None
        self._httpd = _Server((host, 0), _handler(self, idle_timeout), max_connections)
        self._httpd.daemon_threads = True
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

    def new_secret(self, area: str | None = None) -> str:
        """A secret for one query definition: with its own area of the store, or with the area
        of ``area`` (an operator id) shared by every definition of that operator."""
        secret = secrets.token_urlsafe(24)
        with self._lock:
            prefix = f"q{secrets.token_hex(8)}"
            if area is not None:
                prefix = self._named.setdefault(area, prefix)
            self._areas[secret.encode()] = prefix
        return secret

    def area(self, token: bytes) -> str | None:
        """The area of the secret ``token`` (compared in constant time), or None."""
        found = None
        for secret, area in list(self._areas.items()):
            if hmac.compare_digest(token, secret):
                found = area
        return found

    def raw_key(self, secret: str, key: str) -> str:
        """Where the server keeps ``key`` of ``secret`` (tests reach the driver's memory)."""
        return f"{self._areas[secret.encode()]}/{key}"

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(server: JobManagerServer, idle_timeout: float) -> type[BaseHTTPRequestHandler]:
    """The request handler class of ``server``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        default_request_version = "HTTP/1.1"  # a garbled request line gets a status line too
        timeout = idle_timeout  # every read of the socket: an idle client is dropped

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

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

        def _serve(self, action: Callable[[str], None]) -> None:
            """Authenticate, then run ``action(area)``; a refusal or a malformed request is
            answered with a 4xx and the connection closed."""
            try:
                if self.headers.defects:  # e.g. a header line without a colon
                    raise _Refused(400, f"malformed headers: {self.headers.defects[0]!r}")
                area = server.area(self.headers.get(TOKEN_HEADER, "").encode("latin-1", "replace"))
                if area is None:
                    raise _Refused(403, "bad token")
                action(area)
            except _Refused as exc:
                self._reply(exc.status, str(exc).encode(), close=True)
            except (ValueError, UnicodeError, UnsafePathError) as exc:
                self._reply(400, f"malformed request: {exc}".encode(), close=True)

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
            def put(area: str) -> None:
                if self.headers.get("Transfer-Encoding"):
                    raise _Refused(400, "chunked bodies are not accepted")
                length, key = self._length(), self._key(area)
                data = self.rfile.read(length)
                if len(data) != length:
                    raise _Refused(400, "the body ended early")
                server.store.put(key, data)
                self._reply(204)

            self._serve(put)

        def do_GET(self) -> None:
            def get(area: str) -> None:
                parsed = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(parsed.query, errors="strict")
                if parsed.path == "/query":
                    self._locate(query.get("id", [""])[0])
                    return
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
            try:
                location = server.locate(query_id)
            except Exception as exc:  # the lookup runs JVM calls: report, never crash
                self._reply(500, f"cannot look up query {query_id}: {exc}".encode())
                return
            self._reply(200 if location else 404, (location or "").encode())

        def do_HEAD(self) -> None:
            self._serve(lambda area: self._reply(200 if server.store.exists(self._key(area))
                                                 else 404))

        def do_DELETE(self) -> None:
            def delete(area: str) -> None:
                server.store.delete(self._key(area))
                self._reply(204)

            self._serve(delete)

    return Handler


class _Server(ThreadingHTTPServer):
    """Serves at most ``max_connections`` connections at once, and binds without the reverse
    DNS lookup of the address that ``HTTPServer`` makes (a query to the machine's name server for
    a cluster address)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _driver_address(spark: Any) -> tuple[str, str]:
    """``(bind, advertise)``: where the driver listens and the address executors use."""
    if spark is None:
        return "127.0.0.1", "127.0.0.1"
    conf = spark.sparkContext.getConf()
    host = conf.get("spark.driver.host", None) or "127.0.0.1"  # what Spark tells executors
    return conf.get("spark.driver.bindAddress", None) or host, host
