"""Forked heap snapshots: a child process serializes its frozen copy of memory and streams the
result through a pipe, so the parent never holds the GIL for serialization (``fork`` mode)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from statekit.checkpoint.blobstore.base import write_all
from statekit.errors import CheckpointError
from statekit.serde.msgpack import packb, unpackb

# one state as written by a snapshot: (name, kind, layout, encoding, payload), the payload being
# ``(index, blob)`` for an indexed entry and an iterable of packed parts for a plain one
Part = tuple[str, str, list[Any], str, Any]


def fork_serialize(produce: Callable[[], list[Part]]) -> tuple[int, int]:
    """Fork a child that runs ``produce`` on its frozen copy of memory and streams the result
    into a pipe; returns ``(pid, read fd)``.  The parent never holds the GIL for serialization."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_fd)
            rows = []
            for name, kind, layout, encoding, payload in produce():
                if encoding == "plain":
                    rows.append([name, kind, layout, encoding, list(payload)])
                else:
                    index, blob = payload
                    rows.append([name, kind, layout, encoding,
                                 [[[kg, *loc] for kg, loc in index.items()], blob]])
            write_all(write_fd, packb(rows))
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def fork_collect(pid: int, read_fd: int) -> list[Part]:
    """Read the child's serialized states and reap it."""
    chunks = []
    try:
        while True:
            data = os.read(read_fd, 1 << 20)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise CheckpointError(f"the snapshot child process failed (wait status {status})")
    parts: list[Part] = []
    for name, kind, layout, encoding, payload in unpackb(b"".join(chunks)):
        if encoding != "plain":
            rows, blob = payload
            payload = ({int(row[0]): list(row[1:]) for row in rows}, blob)
        parts.append((name, kind, layout, encoding, payload))
    return parts


def fork_kill(pid: int, read_fd: int) -> None:
    """Stop the child of a cancelled snapshot and reap it (closing the pipe)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.close(read_fd)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
