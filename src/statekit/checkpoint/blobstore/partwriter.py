"""Writing one local file from parts produced on the caller's thread, with the writes on a helper
thread: the caller produces the next part (under the GIL) while the helper writes the last one
(``pwrite`` releases it), so packing and writing share the two cores.

The caller never waits for the helper: a part the helper has not taken by the time the next one
arrives is written by the caller itself, at its own offset.  So a helper starved of CPU (another
process on the other core, a GIL hand-over that comes late) costs no more than writing every part
on the caller's thread, instead of stalling the caller behind it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from types import TracebackType

#: once this much more of the file is written, its disk writes are started
#: (``POSIX_FADV_DONTNEED`` on dirty pages starts their writeback without waiting), so the final
#: fsync waits for the last stretch only, and the stretches written back before are dropped
#: from the page cache, so later writes reuse their pages instead of faulting in fresh memory
WRITEBACK_CHUNK = 2 * 1024 * 1024
#: the helper starts once this much of the file is written: a smaller file is written faster by
#: the caller alone (a checkpoint of 10.6 MB took 1.1-1.3x as long with a helper from its second
#: part: the GIL hand-overs cost more than the writes they overlap)
HELPER_AFTER = 16 * 1024 * 1024


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``os.pwrite`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class PartWriter:
    """Writes the parts :meth:`add` is given one after another into ``fd`` (see the module
    docstring).  A part stays referenced until written, so a reused buffer it views is not
    packed into meanwhile.  Use as a context manager: leaving it waits for the helper's last
    write and raises the first write error (a failed write also fails the next :meth:`add`)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.end = 0  # where the next part goes
        self._queued: deque[tuple[int, bytes | memoryview]] = deque()
        self._unwritten: set[int] = set()  # offsets of parts added and not written yet
        self._started = 0  # the file's writeback has been started up to here
        self._wake = threading.Condition()
        self._advising = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._advise = getattr(os, "posix_fadvise", None)

    def add(self, part: bytes | memoryview) -> None:
        """Write ``part`` after the parts before it: here while the file is small, else queued
        for the helper (the parts it has not taken yet are written here first)."""
        if self._error is not None:
            raise self._error
        size = len(part)
        if not size:
            return
        offset = self.end
        self._unwritten.add(offset)  # before the end moves: the helper's writeback stops here
        self.end = offset + size
        if self._thread is None and offset < HELPER_AFTER:  # written here, before the next
            self._write(offset, part)                       # part is packed into its buffer
            return
        queued = self._queued
        while queued:  # the helper lags: write what it has not taken on this thread
            try:
                earlier = queued.popleft()
            except IndexError:  # taken meanwhile
                break
            self._write(*earlier)
            del earlier
        queued.append((offset, part))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="statekit-writer",
                                            daemon=True)
            self._thread.start()
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        queued = self._queued
        try:
            while True:
                with self._wake:
                    while not queued and not self._closed:
                        self._wake.wait()
                try:
                    job = queued.popleft()
                except IndexError:
                    if self._closed:
                        return
                    continue
                self._write(*job)
                del job
        except BaseException as exc:  # raised on the caller's thread
            self._error = exc

    def _write(self, offset: int, part: bytes | memoryview) -> None:
        pwrite_all(self.fd, part, offset)
        unwritten = self._unwritten
        unwritten.discard(offset)
        if self._advise is None:
            return
        done = min(unwritten, default=self.end)  # everything before it is written
        if done - self._started >= WRITEBACK_CHUNK and self._advising.acquire(blocking=False):
            try:
                started = self._started
                if done > started:
                    self._advise(self.fd, started, done - started, os.POSIX_FADV_DONTNEED)
                    self._advise(self.fd, 0, started, os.POSIX_FADV_DONTNEED)
                    self._started = done
            finally:
                self._advising.release()

    def close(self) -> None:
        """Write what is still queued, wait for the helper's last write, end the helper; the
        first write error is raised."""
        queued = self._queued
        while queued:
            try:
                job = queued.popleft()
            except IndexError:
                break
            if self._error is None:
                self._write(*job)
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
            return
        self._queued.clear()  # failing already: drop what is queued and end the helper
        with contextlib.suppress(BaseException):  # the error raised already is the one reported
            self.close()
