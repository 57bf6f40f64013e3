"""Hostile clients of the driver's server, in a process of their own: ``trickling`` connections
that send a request a byte a second and ``idle`` ones that send nothing, each opened again as soon
as the server closes it.  Connections are opened a few at a time (as a patient attacker does, so
that none is lost to a full listen queue).  Prints ``ready`` once every client has had its
connection (or after :data:`READY_AFTER` seconds), runs until stdin closes, then prints counts as
JSON.

    python -m tests.spark.slow_clients HOST PORT TRICKLING IDLE
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import threading
import time

REQUEST = b"PUT /b/soak HTTP/1.1\r\nHost: driver\r\nContent-Length: 10\r\nX-Pad: " + b"a" * 4096
#: connections being opened at once, and how long one may take before it is tried again
OPENING, OPEN_TIMEOUT = 16, 2.0
#: seconds after which the clients are ready even if some never got a connection (a full server)
READY_AFTER = 15.0


class Client:
    def __init__(self, address: tuple[str, int], trickling: bool) -> None:
        self.address, self.trickling = address, trickling
        self.sock: socket.socket | None = None
        self.established = False
        self.ever = False  # connected at least once
        self.since = 0.0
        self.sent = 0
        self.next_byte = 0.0

    def connect(self, selector: selectors.BaseSelector, counts: dict[str, int]) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(self.address)
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            counts["refused"] += 1
            return
        self.sock, self.established, self.since, self.sent = sock, False, time.monotonic(), 0
        selector.register(sock, selectors.EVENT_WRITE, self)

    def opened(self, selector: selectors.BaseSelector, counts: dict[str, int]) -> None:
        assert self.sock is not None
        if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.drop(selector)
            counts["refused"] += 1
            return
        self.established, self.ever, self.next_byte = True, True, time.monotonic()
        selector.modify(self.sock, selectors.EVENT_READ, self)
        counts["connects"] += 1

    def drop(self, selector: selectors.BaseSelector) -> None:
        if self.sock is not None:
            selector.unregister(self.sock)
            self.sock.close()
        self.sock, self.established = None, False


def main() -> None:
    host, port, trickling, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    selector = selectors.DefaultSelector()
    clients = [Client((host, port), n < trickling) for n in range(trickling + idle)]
    counts = {"connects": 0, "closed_by_server": 0, "refused": 0, "bytes_trickled": 0}
    ready, started = False, time.monotonic()
    while not stop.is_set():
        if not ready and (all(c.ever for c in clients) or time.monotonic() - started > READY_AFTER):
            print("ready", flush=True)
            ready = True
        now = time.monotonic()
        opening = 0
        for client in clients:
            if client.sock is not None and not client.established:
                if now - client.since > OPEN_TIMEOUT:
                    client.drop(selector)
                else:
                    opening += 1
        for client in clients:
            if opening >= OPENING:
                break
            if client.sock is None:
                client.connect(selector, counts)
                opening += 1
        for client in clients:
            if client.established and client.trickling and now >= client.next_byte:
                try:
                    client.sock.send(REQUEST[client.sent % len(REQUEST):][:1])
                    client.sent += 1
                    counts["bytes_trickled"] += 1
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    client.drop(selector)
                    counts["closed_by_server"] += 1
                    continue
                client.next_byte = now + 1.0
        for key, _ in selector.select(timeout=0.05):
            client = key.data
            if not client.established:
                client.opened(selector, counts)
                continue
            try:
                data = client.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:  # the server closed it (a reply, if any, came first)
                client.drop(selector)
                counts["closed_by_server"] += 1
    held = sum(1 for c in clients if c.established)
    for client in clients:
        client.drop(selector)
    print(json.dumps({**counts, "held_at_end": held}), flush=True)


if __name__ == "__main__":
    main()
