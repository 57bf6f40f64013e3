"""The driver's JobManager server against hostile clients, on a real server on loopback: secrets
confined to their own area, strict Content-Length, oversize bodies refused unread, idle and
surplus connections closed, and a 4xx for every malformed request (never a dropped connection)."""

from __future__ import annotations

import socket
import time

import pytest

from statekit.errors import StateSizeError
from statekit.spark.jobmanager import MAX_REQUEST_BYTES, JobManagerServer, RemoteBlobStore

SMALL_LIMIT = 4096


@pytest.fixture(scope="module")
def server():
    server = JobManagerServer("127.0.0.1", max_request_bytes=SMALL_LIMIT, idle_timeout=0.5,
                              max_connections=8)
    yield server
    server.shutdown()


def _connect(server) -> socket.socket:
    host, port = server.url[len("http://"):].split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _exchange(server, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` on a fresh connection; ``(status, everything the server sent)``; the
    server must answer with a status line and then close or keep the connection."""
    with _connect(server) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1."), data[:200]
    return int(data.split()[1]), data


def _request(method: str, path: str, secret: str, headers: dict[str, str] | None = None,
             body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"X-Statekit-Token: {secret}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def test_a_secret_reaches_only_its_own_area(server):
    mine = RemoteBlobStore(server.url, server.new_secret(), "job-a")
    theirs = RemoteBlobStore(server.url, server.new_secret(), "job-a")  # the same job name
    mine.put("chk-1/_metadata", b"mine")
    assert theirs.list("") == [] and not theirs.exists("chk-1/_metadata")
    status, data = _exchange(server, _request("GET", "/list?prefix=", theirs.secret,
                                              {"Connection": "close"}))
    assert status == 200 and data.endswith(b"\r\n\r\n")  # the list of everything: empty
    theirs.put("chk-1/_metadata", b"theirs")
    theirs.delete("chk-1/_metadata")
    assert mine.get("chk-1/_metadata") == b"mine" and mine.list("") == ["chk-1/_metadata"]
    with pytest.raises(Exception, match="no blob"):
        theirs.get("chk-1/_metadata")


def test_definitions_of_one_operator_share_its_area(server):
    """A query stopped and started again in the same driver is a new definition (a new secret)
    of the same operator: it must find its state; another operator still sees nothing."""
    first = RemoteBlobStore(server.url, server.new_secret("count"), "query-1")
    again = RemoteBlobStore(server.url, server.new_secret("count"), "query-1")
    other = RemoteBlobStore(server.url, server.new_secret("sessions"), "query-1")
    first.put("_operator", b"manifest")
    assert again.get("_operator") == b"manifest"
    assert other.list("") == [] and not other.exists("_operator")


def test_an_unknown_secret_is_refused(server):
    status, _ = _exchange(server, _request("GET", "/list?prefix=", "forged"))
    assert status == 403
    status, _ = _exchange(server, _request("GET", "/list?prefix=", "caf\xe9"))  # not ASCII
    assert status == 403


@pytest.mark.parametrize("length", ["-1", "abc", "1e3", "+5", " ", "99999999999999999999999",
                                    "5, 5"])
def test_a_malformed_content_length_is_400(server, length):
    secret = server.new_secret()
    status, data = _exchange(server, _request("PUT", "/b/k", secret, {"Content-Length": length},
                                              b"x" * 5))
    assert status == 400, data
    assert not server.store.exists(server.raw_key(secret, "k"))


def test_a_body_without_a_length_is_411(server):
    status, _ = _exchange(server, _request("PUT", "/b/k", server.new_secret()))
    assert status == 411


def test_an_oversize_body_is_413_and_the_connection_closed_unread(server):
    secret = server.new_secret()
    with _connect(server) as sock:
        sock.sendall(_request("PUT", "/b/k", secret, {"Content-Length": str(64 << 20)}))
        start, data = time.monotonic(), b""
        while chunk := sock.recv(65536):  # the server closes: no body is awaited
            data += chunk
        assert time.monotonic() - start < 3
    assert data.split()[1] == b"413" and b"frame limit" in data
    assert not server.store.exists(server.raw_key(secret, "k"))


def test_the_client_refuses_oversize_blobs_before_sending():
    server = JobManagerServer("127.0.0.1")
    try:
        store = RemoteBlobStore(server.url, server.new_secret(), "job")
        with pytest.raises(StateSizeError, match="frame limit"):
            store.put("big", b"x" * (MAX_REQUEST_BYTES + 1))
        store.put("fits", b"x" * 1000)
        assert store.get("fits", 10, 5) == b"xxxxx"
    finally:
        server.shutdown()


@pytest.mark.parametrize("raw", [
    _request("GET", "/b/k", "s", {"Range": "bytes=abc"}),
    _request("GET", "/b/k", "s", {"Range": "bytes=10-2"}),
    _request("GET", "/b/k", "s", {"Range": "lines=1-2"}),
    _request("GET", "/b/..%2F..%2Fetc", "s"),
    _request("GET", "/b/%ff%fe", "s"),
    _request("GET", "/b/", "s"),
    _request("POST", "/b/k", "s", {"Content-Length": "0"}),
    _request("PUT", "/b/k", "s", {"Content-Length": "3", "Transfer-Encoding": "chunked"}, b"abc"),
    b"GARBAGE\r\n\r\n",
    b"GET /b/k HTTP/1.1\r\nX-Statekit-Token: s\r\nBroken header line\r\n\r\n",
    b"GET /b/k HTTP/1.1\r\nX-Statekit-Token: s\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
], ids=lambda raw: repr(raw[:40]))
def test_every_malformed_request_gets_a_4xx(server, raw):
    secret = server.new_secret()
    server.store.put(server.raw_key(secret, "k"), b"0123456789")
    status, data = _exchange(server, raw.replace(b"Token: s\r", f"Token: {secret}\r".encode()))
    assert 400 <= status < 500, data[:300]


def test_a_valid_range_still_reads(server):
    secret = server.new_secret()
    server.store.put(server.raw_key(secret, "k"), b"0123456789")
    status, data = _exchange(server, _request("GET", "/b/k", secret, {"Range": "bytes=2-4",
                                                                      "Connection": "close"}))
    assert status == 200 and data.endswith(b"\r\n\r\n234")


def test_idle_and_half_sent_connections_are_closed(server):
    socks = [_connect(server) for _ in range(6)]
    try:
        for n, sock in enumerate(socks):  # half-sent, unauthenticated requests
            sock.sendall(b"PUT /b/k HTTP/1.1\r\n" if n % 2 else b"PU")
        time.sleep(1.5)  # past the idle timeout
        for sock in socks:
            sock.settimeout(3)
            data = b""
            while chunk := sock.recv(65536):  # at most a 408-style reply, then the close
                data += chunk
            assert data == b"" or data.startswith(b"HTTP/1.1 4")
    finally:
        for sock in socks:
            sock.close()


def test_connections_beyond_the_bound_are_turned_away():
    server = JobManagerServer("127.0.0.1", idle_timeout=30, max_connections=8)
    held = [_connect(server) for _ in range(8)]
    try:
        time.sleep(0.2)
        with _connect(server) as extra:
            extra.settimeout(3)
            assert extra.recv(65536).startswith(b"HTTP/1.1 503")
        for sock in held:
            sock.close()
        time.sleep(0.5)  # the held slots are released when their connections end
        store = RemoteBlobStore(server.url, server.new_secret(), "job")
        store.put("k", b"v")
        assert store.get("k") == b"v"
    finally:
        for sock in held:
            sock.close()
        server.shutdown()
