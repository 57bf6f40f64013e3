"""Checking a restored RocksDB database's linked files in the background (lazy restore).

A restore hard-links the SST files of a checkpoint on the local disk; reading each of them whole
for its CRC-32 was the only full read of the state a restart made.  With lazy restore the
database opens at once and a thread checks those files.  Until it is done, column families are
handed out wrapped: a point read runs at once (RocksDB checks every block it reads against the
block's own checksum; a mismatch becomes :class:`CorruptCheckpointError`), an iteration waits
for the check, so no scan ever sees a file that failed or was not yet checked; a snapshot waits
too, so no checkpoint is taken of unchecked files.  A file that fails makes every state raise.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from statekit.checkpoint.reader import FileCheck
from statekit.errors import CorruptCheckpointError, StatekitError


def pinned(checks: list[FileCheck], side: Path) -> list[FileCheck]:
    """The checks, each reading a hard link of its own under ``side``, made before the database
    opens: RocksDB may compact a restored file away (at open, or flushing a changelog's replayed
    logs) before the thread reads it, and the link keeps the file until its check ran."""
    side.mkdir(parents=True)
    out = []
    for n, check in enumerate(checks):
        link = side / f"{n}-{Path(check.local_path).name}"
        os.link(check.local_path, link)
        out.append(dataclasses.replace(check, local_path=str(link)))
    return out


class RestoreChecks:
    """A thread checking ``checks`` one by one; ``on_damage(error)`` runs on it if one fails,
    ``on_done()`` once all passed.  ``side``: the directory of the checks' links
    (:func:`pinned`), removed when the thread ends."""

    def __init__(self, checks: list[FileCheck],
                 on_damage: Callable[[CorruptCheckpointError], None],
                 on_done: Callable[[], None], side: Path | None = None) -> None:
        self.side = side
        self.left = len(checks)
        self.error: CorruptCheckpointError | None = None
        self._stop = threading.Event()
        self._on_damage = on_damage
        self._on_done = on_done
        self._thread = threading.Thread(target=self._run, args=(checks,), daemon=True,
                                        name="statekit-rocksdb-restore-check")
        self._thread.start()

    def _run(self, checks: list[FileCheck]) -> None:
        try:
            self._check(checks)
        finally:
            if self.side is not None:
                shutil.rmtree(self.side, ignore_errors=True)

    def _check(self, checks: list[FileCheck]) -> None:
        for check in checks:
            if self._stop.is_set():
                return
            try:
                check.run()
            except (StatekitError, OSError) as exc:
                if self._stop.is_set():  # disposed: the files went with the backend
                    return
                if isinstance(exc, CorruptCheckpointError):  # a checksum, a length: as it is
                    self.error = exc
                else:
                    self.error = CorruptCheckpointError(f"a restored RocksDB file is unreadable: "
                                                        f"{exc}")
                    self.error.__cause__ = exc
                self._on_damage(self.error)
                return
            self.left -= 1
        self._on_done()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        """Until every file is checked; CorruptCheckpointError if one failed."""
        self._thread.join()
        if self.error is not None:
            raise self.error

    def passed(self) -> bool:
        """Until every file is checked; whether all passed."""
        self._thread.join()
        return self.error is None

    def stop(self) -> None:
        """End the thread early (the backend is disposed)."""
        self._stop.set()
        self._thread.join()


class Compaction:
    """A thread compacting ``(column family, begin, end)`` ranges once ``checks`` (if any) passed:
    a rescaling restore's foreign key groups, deleted with ``delete_range``, whose files would
    otherwise stay in every checkpoint (Flink's compaction after a rescaling restore, which it
    also runs in the background).  RocksDB releases the GIL while it compacts; a compaction never
    removes a file the checks still read, as they run first."""

    def __init__(self, ranges: Sequence[tuple[Any, bytes, bytes]],
                 checks: RestoreChecks | None) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(list(ranges), checks),
                                        daemon=True, name="statekit-rocksdb-rescale-compaction")
        _RUNNING.add(self)
        self._thread.start()

    def _run(self, ranges: list[tuple[Any, bytes, bytes]], checks: RestoreChecks | None) -> None:
        if checks is not None and not checks.passed():  # the state is unusable: nothing to tidy
            return
        for cf, begin, end in ranges:
            if self._stop.is_set():
                return
            try:
                cf.compact_range(begin, end)
            except Exception:  # the state stays exact, its checkpoints only larger
                logging.getLogger("statekit.rocksdb").warning(
                    "compacting a rescaled RocksDB database's foreign key groups failed",
                    exc_info=True)
                return

    def wait(self) -> None:
        """Until the compaction is done."""
        self._thread.join()

    def cancel(self) -> None:
        """Skip the ranges not started yet."""
        self._stop.set()

    def stop(self) -> None:
        """Skip what has not started and wait for what has (the backend is disposed)."""
        self._stop.set()
        self._thread.join()


#: compactions whose backend may never be disposed: at interpreter exit each one ends its
#: current range before the interpreter goes (a thread stopped inside RocksDB aborts the process)
_RUNNING: weakref.WeakSet[Compaction] = weakref.WeakSet()


@atexit.register
def _end_compactions() -> None:
    for compaction in list(_RUNNING):
        compaction.stop()


def _corrupt(exc: Exception) -> Exception:
    text = str(exc)
    if text.startswith("Corruption"):
        return CorruptCheckpointError(f"a restored RocksDB file is damaged: {text}")
    return exc


class CheckedFamily:
    """A column family while its database's files are being checked: point reads and writes run
    at once, iterations wait for the check (see the module's docstring)."""

    __slots__ = ("_cf", "_wait")

    def __init__(self, cf: Any, wait: Callable[[], None]) -> None:
        self._cf = cf
        self._wait = wait

    @staticmethod
    def _typed(call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, a damaged block's bare RocksDB exception raised as
        CorruptCheckpointError."""
        try:
            return call(*args)
        except Exception as exc:
            error = _corrupt(exc)
            if error is exc:
                raise
            raise error from exc

    def _scan(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._wait()
        return getattr(self._cf, name)(*args, **kwargs)

    def get(self, *args: Any) -> Any:
        return self._typed(self._cf.get, *args)

    def __getitem__(self, key: Any) -> Any:
        return self._typed(self._cf.__getitem__, key)

    def __contains__(self, key: Any) -> bool:
        return bool(self._typed(self._cf.__contains__, key))

    def iter(self, *args: Any, **kwargs: Any) -> Any:
        return self._scan("iter", *args, **kwargs)

    def keys(self, *args: Any, **kwargs: Any) -> Any:
        return self._scan("keys", *args, **kwargs)

    def values(self, *args: Any, **kwargs: Any) -> Any:
        return self._scan("values", *args, **kwargs)

    def items(self, *args: Any, **kwargs: Any) -> Any:
        return self._scan("items", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # put, delete, delete_range, write...: as they are
        return getattr(self._cf, name)
