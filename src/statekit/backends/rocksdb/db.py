"""Opening RocksDB databases for the embedded backend, and keeping forked children off them.

RocksDB allows one process per database and is not fork-safe: a child that inherits an open
database through ``fork`` gets stand-in handles that raise instead of touching it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from rocksdict import AccessType, Options, Rdict, WriteOptions

from statekit.errors import BackendLockedError, CheckpointError, CorruptCheckpointError


class ForkAware(Protocol):
    """What the fork hook needs of an open backend (the backend imports this module)."""

    def forked(self) -> None:
        """Called in a forked child: stop using the parent's database."""
        ...


_DEFAULT_CF = "default"

live_backends: weakref.WeakSet[ForkAware] = weakref.WeakSet()
inherited: list[Any] = []  # handles inherited through fork: never released in the child


def _after_fork_in_child() -> None:
    for backend in list(live_backends):
        backend.forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def write_options(wal: bool = False) -> WriteOptions:
    """Writes without the WAL (state is made durable by checkpoints, as in Flink), unless
    changelog checkpoints upload it (``wal``)."""
    wo = WriteOptions()
    wo.disable_wal = not wal
    return wo


def open_db(path: str | os.PathLike[str], options_factory: Callable[[], Options],
            *, read_only: bool = False) -> Rdict:
    """Open (or create) the database at ``path`` with the options on every column family.

    A database another process (or this one) holds open raises :class:`BackendLockedError`.
    A ``read_only`` open (inspection, copying a checkpoint's key groups, writing a savepoint of
    one) opens its table files on the calling thread: by default RocksDB starts up to 16 short-
    lived threads per column family for that, each mapping an 8 MiB stack and possibly its own
    64 MiB malloc arena, and under an address-space limit (1 GiB: about 5-20 % of opens of a
    small checkpoint) one failed thread start aborted the whole process (SIGABRT).
    """
    path = str(path)
    cfs: dict[str, Options] = {}
    if os.path.exists(os.path.join(path, "CURRENT")):
        try:
            names = Rdict.list_cf(path, options_factory())
        except Exception as exc:
            raise CorruptCheckpointError(f"cannot list column families of {path}: {exc}") from exc
        cfs = {name: options_factory() for name in names if name != _DEFAULT_CF}
    access = AccessType.read_only(False) if read_only else AccessType.read_write()
    options = options_factory()
    if read_only:
        options.set_max_file_opening_threads(1)
    try:
        return Rdict(path, options, column_families=cfs or None, access_type=access)
    except Exception as exc:
        text = str(exc)
        if "while lock file" in text.lower() or "/LOCK" in text:  # not "block size ..."
            raise BackendLockedError(
                f"RocksDB database {path} is already open in another process or handle "
                f"(RocksDB allows one process per database): {text}"
            ) from exc
        raise CheckpointError(f"cannot open RocksDB database {path}: {text}") from exc


class Unusable:
    """Stands in for a database handle that must not be used (closed, or inherited by fork)."""

    __slots__ = ("_error", "_why")

    def __init__(self, why: str, error: type[Exception] = BackendLockedError) -> None:
        self._why = why
        self._error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self._error(self._why)

        return fail
