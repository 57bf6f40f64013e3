"""The driver's JobManager server against hostile clients, on a real server on loopback: secrets
confined to their own area (per query and operator, for requests proving their query's run),
query locations told only to the query's own tasks, a quota per area, strict Content-Length,
oversize bodies refused unread, a deadline per request however slowly it trickles, slots per
client address with a reserve for authenticated connections, quiet ends of clients that hang up,
and a 4xx for every malformed request (never a dropped connection)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import StateSizeError
from statekit.spark.jobmanager import (
    MAX_REQUEST_BYTES,
    DriverCheckpointStorage,
    JobManagerServer,
    RemoteBlobStore,
)

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


def _queries(server, runs: dict[str, str], roots: dict[str, str] | None = None) -> None:
    """Let ``server`` know the running queries ``runs`` (query id -> run id), as the Spark driver
    tells it about its own."""
    server.current_run = runs.get
    server.locate = (roots or {}).get


def _store(server, secret, query, run, operator="count", partition=0):
    return RemoteBlobStore(server.url, secret, f"{query}/{operator}/p{partition:05d}",
                           query_id=query, run=run)


def _as(query: str, run: str) -> dict[str, str]:
    return {"X-Statekit-Query": query, "X-Statekit-Run": run, "Connection": "close"}


def test_definitions_of_one_operator_share_its_area_in_one_query(server):
    """A query stopped and started again in the same driver is a new definition (a new secret)
    of the same operator in the same query (id): it must find its state; another operator still
    sees nothing."""
    _queries(server, {"query-1": "run-1"})
    first = _store(server, server.new_secret("count"), "query-1", "run-1")
    first.put("_operator", b"manifest")
    server.current_run = {"query-1": "run-2"}.get  # started again: a new run
    again = _store(server, server.new_secret("count"), "query-1", "run-2")
    other = _store(server, server.new_secret("sessions"), "query-1", "run-2")
    assert again.get("_operator") == b"manifest"
    assert other.list("") == [] and not other.exists("_operator")


def test_same_named_operators_of_two_queries_do_not_share_an_area():
    """Two queries whose functions have the same class name (the default operator id): neither's
    secret lists, reads or deletes the other's blobs, whatever query it names."""
    server = JobManagerServer("127.0.0.1")
    try:
        _queries(server, {"qa": "ra", "qb": "rb"})
        mine, theirs = server.new_secret("RunningCount"), server.new_secret("RunningCount")
        status, _ = _exchange(server, _request("PUT", "/b/qa/p0/_metadata", mine,
                                               {**_as("qa", "ra"), "Content-Length": "4"}, b"mine"))
        assert status == 204
        status, data = _exchange(server, _request("GET", "/list?prefix=", theirs, _as("qb", "rb")))
        assert status == 200 and b"_metadata" not in data
        for query, run in [("qa", "rb"), ("qa", ""), ("", ""), ("qa", "r\xe9")]:  # without its run
            for method in ("GET", "DELETE"):
                status, _ = _exchange(server, _request(method, "/b/qa/p0/_metadata", theirs,
                                                       _as(query, run)))
                assert status in (403, 404), (method, query, run)
        status, data = _exchange(server, _request("GET", "/b/qa/p0/_metadata", mine, _as("qa", "ra")))
        assert status == 200 and data.endswith(b"\r\n\r\nmine")
        status, _ = _exchange(server, _request("GET", "/list?prefix=", mine, _as("qa", "stale")))
        assert status == 403  # a run that is not the query's current one
    finally:
        server.shutdown()


def test_query_locations_are_told_only_to_the_query_itself():
    server = JobManagerServer("127.0.0.1")
    try:
        _queries(server, {"qa": "ra", "qb": "rb"}, {"qa": "file:/ckpt/a", "qb": "file:/ckpt/b"})
        secret = server.new_secret()
        status, data = _exchange(server, _request("GET", "/query?id=qa", secret, _as("", "ra")))
        assert status == 200 and data.endswith(b"file:/ckpt/a")
        status, data = _exchange(server, _request("GET", "/query?id=qb", secret, _as("", "ra")))
        assert status == 403 and b"/ckpt/b" not in data
        status, _ = _exchange(server, _request("GET", "/query?id=qb", secret, {"Connection": "close"}))
        assert status == 403
    finally:
        server.shutdown()


def test_each_area_holds_at_most_its_quota():
    server = JobManagerServer("127.0.0.1")
    try:
        server.quota = 10_000  # of secrets made without one
        store = RemoteBlobStore(server.url, server.new_secret(), "job")
        other = RemoteBlobStore(server.url, server.new_secret(), "job")
        store.put("a", b"x" * 6000)
        with pytest.raises(StateSizeError, match="quota of 10000 bytes"):
            store.put("b", b"x" * 6000)
        assert not store.exists("b")
        store.put("a", b"x" * 3000)  # an overwrite counts the difference
        store.put("b", b"x" * 6000)
        other.put("a", b"x" * 9000)  # another secret's area has its own quota
        store.delete("a")
        store.put("c", b"x" * 4000)
        assert sorted(store.list("")) == ["b", "c"]
    finally:
        server.shutdown()


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


def _closed_within(sock, seconds: float, trickle: bytes = b"") -> float | None:
    """Send ``trickle`` a byte every 0.1 s (then wait); seconds until the server closed the
    connection, or None if it was still open after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() - start < seconds:
        try:
            if sent < len(trickle):
                sock.sendall(trickle[sent:sent + 1])
                sent += 1
            while sock.recv(65536):  # a reply, if any, then the close
                pass
            return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:  # reset or broken pipe: closed
            return time.monotonic() - start
    return None


def test_the_quota_comes_from_the_query_definitions_configuration():
    server = JobManagerServer.get()
    key = "state.checkpoint-storage.jobmanager.max-total-size"
    for conf, quota in [({key: "1 kb"}, 1024), ({}, 256 << 20)]:
        storage = DriverCheckpointStorage.start(JobManagerCheckpointStorage(), None, "count", conf)
        assert storage.url == server.url
        assert server.grant(storage.secret.encode()).quota == quota


def test_a_trickled_request_is_cut_at_its_deadline(server):
    """A byte every 0.1 s never leaves a read idle for the 0.5 s timeout: the request as a whole
    must still arrive within its deadline (here 0.5 s too), headers and body alike."""
    secret = server.new_secret()
    headers = _request("GET", "/list?prefix=", secret)[:-2] + b"X-Pad: " + b"a" * 200
    with _connect(server) as sock:
        assert _closed_within(sock, 6.0, headers) is not None
    body_first = _request("PUT", "/b/k", secret, {"Content-Length": "200"})
    with _connect(server) as sock:
        sock.sendall(body_first)  # the headers at once, then the body a byte at a time
        assert _closed_within(sock, 6.0, b"b" * 200) is not None
    assert not server.store.exists(server.raw_key(secret, "k"))


def _hold(server, n: int, trickling: bool, source: str = "127.0.0.1") -> list[socket.socket]:
    host, port = server.url[len("http://"):].split(":")
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
        if trickling:
            sock.sendall(b"PUT /b/k HTTP/1.1\r\nX-Pad: ")
        socks.append(sock)
    return socks


def _eventually(condition, seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (the server accepts in its own time)."""
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _open(sock) -> bool:
    """Whether the server still keeps ``sock`` open (no end-of-file or reset waiting behind
    whatever it sent)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_idle_and_trickling_clients_cannot_keep_executors_out():
    """More silent and trickling connections than the server has slots, from the executors' own
    address (local mode): an executor still connects, writes and reads at once."""
    server = JobManagerServer("127.0.0.1", idle_timeout=30, max_connections=8)
    held = _hold(server, 8, trickling=False) + _hold(server, 8, trickling=True)
    try:
        time.sleep(0.2)
        store = RemoteBlobStore(server.url, server.new_secret(), "job")
        start = time.monotonic()
        store.put("k", b"v")
        assert store.get("k") == b"v" and store.list("") == ["k"]
        assert time.monotonic() - start < 10  # not after a deadline of the held ones (30 s)
        anonymous, authenticated = server.connections()
        assert anonymous + authenticated <= 8 and authenticated == 1
    finally:
        for sock in held:
            sock.close()
        server.shutdown()


def _served(sock, secret) -> bytes:
    sock.sendall(_request("HEAD", "/b/k", secret))
    sock.settimeout(5)
    return sock.recv(65536)


def test_one_address_cannot_take_the_slots_of_others():
    """Connections without a secret are bounded per client address (32 by default): a flood of
    150 from one address closes its own oldest connections, never those of another address,
    which still connects and is served."""
    server = JobManagerServer("127.0.0.1", idle_timeout=30)
    secret = server.new_secret()
    others = _hold(server, 3, trickling=False, source="127.0.0.3")
    flood = _hold(server, 150, trickling=True, source="127.0.0.2")
    try:
        assert _eventually(lambda: sum(_open(sock) for sock in flood) <= 32)
        assert all(_open(sock) for sock in others)
        late = _hold(server, 1, trickling=False, source="127.0.0.3")
        others += late
        assert _served(late[0], secret).startswith(b"HTTP/1.1 404")
    finally:
        for sock in others + flood:
            sock.close()
        server.shutdown()


def test_authenticated_connections_keep_the_reserved_slots():
    """A quarter of the slots is kept for connections that showed a secret: a flood of anonymous
    connections holds at most the rest, and closes none of the executors' kept-alive
    connections.  With every slot busy serving requests, a newcomer is answered 503."""
    server = JobManagerServer("127.0.0.1", idle_timeout=30, max_connections=8)
    secret = server.new_secret()
    flood = _hold(server, 20, trickling=True)
    executors: list[socket.socket] = []
    try:
        assert _eventually(lambda: sum(_open(sock) for sock in flood) <= 6)
        executors = _hold(server, 2, trickling=False)
        assert all(_served(sock, secret).startswith(b"HTTP/1.1 404") for sock in executors)
        flood += _hold(server, 20, trickling=True)
        assert _eventually(lambda: server.connections() == (6, 2))
        assert all(_served(sock, secret).startswith(b"HTTP/1.1 404") for sock in executors)
        for sock in flood:
            sock.close()
        assert _eventually(lambda: server.connections() == (0, 2))
        executors += _hold(server, 6, trickling=False)
        for sock in executors:  # eight authenticated requests, each waiting for its body
            sock.sendall(_request("PUT", "/b/k", secret, {"Content-Length": "10"}))
        assert _eventually(lambda: server.connections() == (0, 8))
        with _connect(server) as extra:
            extra.settimeout(3)
            assert extra.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        for sock in executors + flood:
            sock.close()
        server.shutdown()


def test_an_idle_kept_alive_connection_makes_room_when_every_slot_is_taken():
    """Every slot held by executors' kept-alive connections waiting for their next request: a
    new executor connection is served, the connection idle the longest is closed (its client
    opens a new one when it needs it)."""
    server = JobManagerServer("127.0.0.1", idle_timeout=30, max_connections=4)
    secret = server.new_secret()
    kept: list[socket.socket] = []
    try:
        for _ in range(4):  # each shows its secret before the next connects, as executors do
            kept += _hold(server, 1, trickling=False)
            assert _served(kept[-1], secret).startswith(b"HTTP/1.1 404")
        store = RemoteBlobStore(server.url, secret, "job")
        store.put("k", b"v")
        assert store.get("k") == b"v"
        # the server closed an idle kept-alive connection to make room (the one idle the
        # longest; on a loaded machine the order of equally idle ones is not checked)
        assert _eventually(lambda: any(not _open(sock) for sock in kept))
    finally:
        for sock in kept:
            sock.close()
        server.shutdown()


def test_clients_that_hang_up_end_quietly(capfd):
    """A client resetting its connection before its request, or while its reply is written:
    the server goes on serving and prints nothing (no traceback)."""
    server = JobManagerServer("127.0.0.1", idle_timeout=5)
    try:
        store = RemoteBlobStore(server.url, server.new_secret(), "job")
        store.put("big", b"x" * (8 << 20))
        for raw in [b"", b"GET /b/k HT",
                    _request("GET", "/b/job/big", store.secret)]:
            with _connect(server) as sock:
                sock.sendall(raw)
                time.sleep(0.1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            time.sleep(0.2)
        assert store.get("big", 0, 3) == b"xxx"
    finally:
        server.shutdown()
    out, err = capfd.readouterr()
    assert "Traceback" not in err + out and "Exception" not in err + out, err


def test_headers_are_bounded_in_total_not_only_per_line(server):
    """A hundred header lines just under the 64 KiB line limit were buffered whole (6 MB per
    request) before any check: the header block as a whole is bounded (96 KiB, then 431)."""
    raw = _request("GET", "/list?prefix=", "s", {"X-A": "a" * 60_000})[:-2]
    raw += b"X-B: " + b"b" * (96 * 1024 - len(raw) - 5)  # the block's bound, still unfinished
    status, _ = _exchange(server, raw)
    assert status == 431
