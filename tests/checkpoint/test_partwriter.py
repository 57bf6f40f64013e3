"""``PartWriter``: a local file written from parts on a helper thread, the caller writing what the
helper has not taken, never waiting for it; every byte at its offset, errors raised, no thread
left behind."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from statekit.checkpoint.blobstore import partwriter
from statekit.checkpoint.blobstore.partwriter import PartWriter

PARTS = [os.urandom(n) for n in (70_000, 0, 1, 300_000, 5, 1 << 20, 12_345)]


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "statekit-writer"]


def _write(path: Path, parts: list[bytes], pause: float = 0.0) -> list[str]:
    """Write ``parts`` into ``path``; the names of the threads that wrote them."""
    who: list[str] = []
    real = partwriter.pwrite_all

    def recording(fd: int, data: Any, offset: int) -> None:
        who.append(threading.current_thread().name)
        real(fd, data, offset)

    partwriter.pwrite_all = recording  # type: ignore[assignment]
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            with PartWriter(fd) as writer:
                for part in parts:
                    writer.add(part)
                    time.sleep(pause)
        finally:
            os.close(fd)
    finally:
        partwriter.pwrite_all = real
    return who


@pytest.fixture
def helper_at_once(monkeypatch: Any) -> None:
    """The helper starts with the second part (by default only once a file is large)."""
    monkeypatch.setattr(partwriter, "HELPER_AFTER", 1)


def test_parts_land_at_their_offsets(tmp_path: Path, helper_at_once: None) -> None:
    path = tmp_path / "f"
    who = _write(path, PARTS, pause=0.02)  # time for the helper to take each part
    assert path.read_bytes() == b"".join(PARTS)
    assert "statekit-writer" in who
    assert len(who) == sum(1 for p in PARTS if p)
    assert _writer_threads() == []


def test_a_small_file_needs_no_helper(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "f"
    assert _write(path, PARTS[:1]) == ["MainThread"]
    assert path.read_bytes() == PARTS[0]
    monkeypatch.setattr(partwriter, "HELPER_AFTER", sum(map(len, PARTS)))
    assert set(_write(path, PARTS, pause=0.01)) == {"MainThread"}  # smaller than the threshold
    assert path.read_bytes() == b"".join(PARTS)


def test_a_stalled_helper_never_stalls_the_caller(tmp_path: Path, monkeypatch: Any,
                                                  helper_at_once: None) -> None:
    """The helper blocks inside its first write: the caller writes every later part itself
    without waiting, and the file is whole once the helper's write completes."""
    release = threading.Event()
    real = partwriter.pwrite_all
    callers: list[str] = []

    def stalling(fd: int, data: Any, offset: int) -> None:
        name = threading.current_thread().name
        callers.append(name)
        if name == "statekit-writer":
            assert release.wait(30)
        real(fd, data, offset)

    monkeypatch.setattr(partwriter, "pwrite_all", stalling)
    path = tmp_path / "f"
    parts = [bytes([n]) * 100_000 for n in range(12)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        writer = PartWriter(fd)
        writer.add(parts[0])
        writer.add(parts[1])  # starts the helper, which takes this part and stalls
        deadline = time.monotonic() + 10
        while "statekit-writer" not in callers:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        for part in parts[2:]:
            writer.add(part)  # returns although the helper is stuck
        assert callers.count("MainThread") == len(parts) - 2  # all but the helper's, so far
        release.set()
        writer.close()
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(parts)
    assert _writer_threads() == []


def test_a_failed_write_is_raised_and_ends_the_helper(tmp_path: Path, monkeypatch: Any,
                                                      helper_at_once: None) -> None:
    real = partwriter.pwrite_all

    def failing(fd: int, data: Any, offset: int) -> None:
        if threading.current_thread().name == "statekit-writer":
            raise OSError(28, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(partwriter, "pwrite_all", failing)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with pytest.raises(OSError, match="No space left"), PartWriter(fd) as writer:
            for n in range(50):
                writer.add(b"x" * 100_000)
                time.sleep(0.005)
                assert n < 49, "the helper's failure was never raised"
    finally:
        os.close(fd)
    assert _writer_threads() == []


def test_a_failing_caller_ends_the_helper(tmp_path: Path, helper_at_once: None) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with pytest.raises(RuntimeError, match="producer failed"), PartWriter(fd) as writer:
            for _ in range(5):
                writer.add(b"y" * 200_000)
            raise RuntimeError("producer failed")
    finally:
        os.close(fd)
    assert _writer_threads() == []


def test_writeback_starts_behind_the_written_stretch(tmp_path: Path, monkeypatch: Any,
                                                     helper_at_once: None) -> None:
    """The disk writes are started only for stretches written completely (parts written by
    either thread), every :data:`WRITEBACK_CHUNK` or so, in order."""
    advised: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def recording(fd: int, offset: int, length: int, advice: int) -> None:
        advised.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(partwriter.os, "posix_fadvise", recording)
    monkeypatch.setattr(partwriter, "WRITEBACK_CHUNK", 256 * 1024)
    path = tmp_path / "f"
    parts = [os.urandom(100_000) for _ in range(40)]
    _write(path, parts, pause=0.001)
    assert path.read_bytes() == b"".join(parts)
    stretches: list[tuple[int, int]] = []  # each started stretch, then the pages before it dropped
    for offset, length in advised:
        if stretches and (offset, length) == (0, stretches[-1][0]):
            continue
        assert offset == sum(stretches[-1]) if stretches else offset == 0
        assert length >= 256 * 1024
        stretches.append((offset, length))
    assert len(stretches) >= 10 and sum(stretches[-1]) <= len(b"".join(parts))
