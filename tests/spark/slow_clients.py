"""Hostile clients of the driver's server, in a process of their own: ``trickling`` connections
that send a request a byte a second and ``idle`` ones that send nothing, each opened again as soon
as the server closes it.  Runs until stdin closes, then prints counts as JSON.

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


class Client:
    def __init__(self, address: tuple[str, int], trickling: bool) -> None:
        self.address, self.trickling = address, trickling
        self.sock: socket.socket | None = None
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
        self.sock, self.sent, self.next_byte = sock, 0, time.monotonic()
        selector.register(sock, selectors.EVENT_READ, self)
        counts["connects"] += 1

    def drop(self, selector: selectors.BaseSelector) -> None:
        if self.sock is not None:
            selector.unregister(self.sock)
            self.sock.close()
            self.sock = None


def main() -> None:
    host, port, trickling, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    selector = selectors.DefaultSelector()
    clients = [Client((host, port), n < trickling) for n in range(trickling + idle)]
    counts = {"connects": 0, "closed_by_server": 0, "refused": 0, "bytes_trickled": 0}
    while not stop.is_set():
        for client in clients:
            if client.sock is None:
                client.connect(selector, counts)
        now = time.monotonic()
        for client in clients:
            if client.sock is not None and client.trickling and now >= client.next_byte:
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
        for key, _ in selector.select(timeout=0.2):
            client = key.data
            try:
                data = client.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:  # the server closed it (a reply, if any, came first)
                client.drop(selector)
                counts["closed_by_server"] += 1
        time.sleep(0.05)
    for client in clients:
        client.drop(selector)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
