"""Connection limits of the driver's server: deadlines per request, slots per client address, a
reserve for authenticated clients, and quiet ends of connections whose client hung up.

A thread serves each connection (``socketserver``'s threading server).  What a client can hold
without a secret is bounded in time and in number:

- a request (request line, headers and body) must arrive whole within ``request_timeout`` of its
  first byte, however slowly it trickles, and the next request must start within
  ``idle_timeout``; its request line and headers may take at most :data:`HEADER_BYTES`;
- a connection is *anonymous* until one of its requests presents a valid secret.  Anonymous
  connections may hold at most ``per_address`` slots per client address and
  ``max_connections - reserved`` in all: the ``reserved`` slots are kept for authenticated ones;
- a new connection never waits for a slot: when the slots it may take are full, the server closes
  the oldest anonymous connection of the address holding the most (one that has not yet sent its
  request headers), else the authenticated connection idle the longest; only when every slot is
  busy with a request is the newcomer answered 503.  An executor's request arrives whole at once,
  so connections that hold slots by trickling or by silence are the ones that make room.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field
from http.client import HTTPException
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("statekit.spark")

#: the most bytes a request line and its headers may take (an executor's take a few hundred); more
#: than the 64 KiB request line ``http.server`` allows, which it answers with 414 first
HEADER_BYTES = 96 * 1024
_END = b"\r\n\r\n"


class HeadersTooLarge(HTTPException):
    """The request line and headers passed :data:`HEADER_BYTES` (answered 431)."""


@dataclass(eq=False)
class Connection:
    """One client connection as the admission control sees it."""

    sock: socket.socket
    address: str
    accepted: float = field(default_factory=time.monotonic)
    authenticated: bool = False
    #: the current request's headers have arrived whole: it is being served, not trickled
    arrived: bool = False
    #: since when the connection waits for its next request (None: a request is under way)
    idle_since: float | None = field(default_factory=time.monotonic)
    closed: bool = False

    def close(self) -> None:
        """End the connection from another thread: its reads return end-of-file at once."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def headers_buffered(self) -> bool:
        """Whether a whole header block waits in the socket's receive buffer (not yet read)."""
        try:  # through a non-blocking duplicate: a socket with a timeout would wait for data
            with socket.socket(fileno=os.dup(self.sock.fileno())) as peek:
                peek.setblocking(False)
                data = peek.recv(4096, socket.MSG_PEEK)
        except OSError:  # nothing buffered (BlockingIOError), or the connection ended
            return False
        return _END in data


class DeadlineReader(io.RawIOBase):
    """The socket as one connection's requests read it: every read waits at most until the
    request's deadline and reads nothing past its byte budget."""

    def __init__(self, conn: Connection, idle_timeout: float, request_timeout: float) -> None:
        self.conn = conn
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.next_request()

    def next_request(self) -> None:
        """Start waiting for a request: the idle clock runs until its first byte arrives."""
        self._until = time.monotonic() + self.idle_timeout
        self._started = False
        self._budget = HEADER_BYTES
        self._tail = b""
        self.conn.arrived = False
        self.conn.idle_since = time.monotonic()

    def allow(self, length: int) -> None:
        """Let the body of ``length`` bytes be read (its size was checked)."""
        self._budget += length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.conn.closed:
            return 0
        left = self._until - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        if self._budget <= 0:
            raise HeadersTooLarge(f"request line and headers over {HEADER_BYTES} bytes")
        view = memoryview(buffer)[:self._budget]
        self.conn.sock.settimeout(left)
        n = self.conn.sock.recv_into(view)
        if n and not self._started:
            self._started = True
            self._until = time.monotonic() + self.request_timeout
            self.conn.idle_since = None
        self._budget -= n
        if not self.conn.arrived and n:
            seen = self._tail + bytes(view[:n])
            self.conn.arrived = _END in seen
            self._tail = seen[-3:]
        return n


class GuardedServer(ThreadingHTTPServer):
    """A threading HTTP server whose connections are admitted and ended as the module says, and
    that binds without the reverse DNS lookup ``HTTPServer`` makes of its address (a query to the
    machine's name server for a cluster address)."""

    daemon_threads = True
    #: a burst of connections waits in the kernel's queue, not for SYN retries (the default is 5)
    request_queue_size = socket.SOMAXCONN

    def __init__(self, address: tuple[str, int], handler: Any, *, max_connections: int,
                 reserved: int, per_address: int, idle_timeout: float,
                 request_timeout: float) -> None:
        self.max_connections = max(1, max_connections)
        self.reserved = min(max(0, reserved), self.max_connections - 1)
        self.per_address = max(1, per_address)
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self._conns: dict[socket.socket, Connection] = {}
        self._guard = threading.Lock()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    # --- admission ---------------------------------------------------------------------------

    def connection(self, sock: socket.socket) -> Connection:
        """The admitted connection of ``sock`` (a handler's)."""
        with self._guard:
            conn = self._conns.get(sock)
        return conn if conn is not None else Connection(sock, "", closed=True)

    def authenticated(self, conn: Connection) -> None:
        """``conn`` presented a valid secret: it may use the reserved slots from now on."""
        with self._guard:
            if not conn.closed:
                conn.authenticated = True

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = Connection(request, str(client_address[0]))
        with self._guard:
            victim, admitted = self._admit(conn)
            if admitted:
                self._conns[request] = conn
                if victim is not None:
                    del self._conns[victim.sock]
        if victim is not None:
            victim.close()
        if not admitted:
            try:
                request.setblocking(False)  # a tiny reply into an empty buffer: never waits
                request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def _admit(self, conn: Connection) -> tuple[Connection | None, bool]:
        """``(connection to close, admitted)`` for the new ``conn`` (under the guard)."""
        anonymous = [c for c in self._conns.values() if not c.authenticated]
        own = [c for c in anonymous if c.address == conn.address]
        if len(own) >= self.per_address:
            victim = self._victim(own)
            return victim, victim is not None
        full = len(self._conns) >= self.max_connections
        if full or len(anonymous) >= self.max_connections - self.reserved:
            victim = self._victim(anonymous)
            if victim is None and full:
                victim = self._idle_victim()
            return victim, victim is not None or not full
        return None, True

    @staticmethod
    def _victim(candidates: list[Connection]) -> Connection | None:
        """The anonymous connection to close: of the address holding the most, the oldest that
        has not sent its request headers."""
        counts: dict[str, int] = {}
        for c in candidates:
            counts[c.address] = counts.get(c.address, 0) + 1
        for c in sorted(candidates, key=lambda c: (-counts[c.address], c.accepted)):
            if not c.arrived and not c.headers_buffered():
                return c
        return None

    def _idle_victim(self) -> Connection | None:
        """The authenticated connection waiting the longest for its next request, if any."""
        idle = [c for c in self._conns.values() if c.authenticated and c.idle_since is not None
                and not c.arrived and not c.headers_buffered()]
        return min(idle, key=lambda c: c.idle_since or 0.0, default=None)

    def _forget(self, request: Any) -> None:
        with self._guard:
            self._conns.pop(request, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def open_connections(self) -> tuple[int, int]:
        """``(anonymous, authenticated)`` connections held now."""
        with self._guard:
            auth = sum(1 for c in self._conns.values() if c.authenticated)
            return len(self._conns) - auth, auth

    # --- quiet ends -------------------------------------------------------------------------

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (reset, broken pipe, a read past its deadline) ends its
        connection quietly; anything else is logged, never printed."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | HTTPException):
            log.debug("driver server: connection from %s ended: %r", client_address, exc)
            return
        log.error("driver server: request from %s failed", client_address, exc_info=exc)
