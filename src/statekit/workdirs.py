"""Working directories owned by one process: gone when their owner closes them or exits, and
swept by the next process that finds their owner dead.

Each directory ``<root>/<name>`` has a lock file ``<root>/<name>.lock`` its owner holds with
``flock`` for the directory's life; the kernel drops that lock when the owner dies however it
dies (a killed Spark worker included), so a later process that can take the lock knows the
owner is gone and removes both.  A live owner's lock cannot be taken, so a live directory is
never swept.  RocksDB instances, local Spark warehouses and the demos' work directories use it.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

LOCK_SUFFIX = ".lock"
#: roots statekit makes for many owners' directories (the RocksDB default ``<temp>/statekit-rocksdb``):
#: removed by the last owner that leaves them empty
SHARED_ROOTS = frozenset({"statekit-rocksdb", "statekit-localstate"})

_owned: dict[str, tuple[Path, int]] = {}  # directory -> (lock file, its descriptor)
_lock = threading.Lock()


def create(root: str | os.PathLike[str], prefix: str) -> Path:
    """A new directory ``<root>/<prefix><pid>-<random>`` owned by this process.

    Dead owners' directories with the same ``prefix`` under ``root`` are swept first.
    """
    base = Path(root)
    name = f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    # lock a temporary name first, then rename: a sweeper only ever sees locked lock files
    pending = base / f".{name}{LOCK_SUFFIX}.new"
    for _ in range(100):  # a shared root another process removed as empty is made again
        base.mkdir(parents=True, exist_ok=True)
        sweep(base, prefix, keep_root=True)
        try:
            fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
            break
        except FileNotFoundError:
            continue
    else:
        raise FileNotFoundError(f"cannot create a working directory under {base}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        lock = base / f"{name}{LOCK_SUFFIX}"
        os.replace(pending, lock)
        path = base / name
        path.mkdir()
    except BaseException:
        os.close(fd)
        pending.unlink(missing_ok=True)
        raise
    with _lock:
        _owned[str(path)] = (lock, fd)
    return path


def remove(path: str | os.PathLike[str]) -> None:
    """Delete a directory this process created (its lock file too); any other path is deleted."""
    key = str(path)
    shutil.rmtree(key, ignore_errors=True)
    with _lock:
        owned = _owned.pop(key, None)
    if owned is not None:
        lock, fd = owned
        lock.unlink(missing_ok=True)
        os.close(fd)
        _remove_shared_root(Path(key).parent)


def _remove_shared_root(root: Path) -> None:
    """Remove statekit's own shared root once nothing is in it; a root the user configured under
    another name stays."""
    if root.name in SHARED_ROOTS:
        try:
            root.rmdir()  # only when empty: a live owner's directory or lock keeps it
        except OSError:
            pass


def sweep(root: str | os.PathLike[str], prefix: str = "", *, keep_root: bool = False) -> list[Path]:
    """Remove the directories under ``root`` whose owners are dead; the ones removed.  A shared
    root left empty goes too, unless ``keep_root`` (a directory is about to be made in it)."""
    base = Path(root)
    removed: list[Path] = []
    if not base.is_dir():
        return removed
    for lock in base.glob(f"{prefix}*{LOCK_SUFFIX}"):
        path = lock.with_name(lock.name[: -len(LOCK_SUFFIX)])
        if str(path) in _owned:
            continue
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    if not keep_root:
        _remove_shared_root(base)
    return removed


def sweep_unowned(root: str | os.PathLike[str], pattern: str, idle_seconds: float,
                  busy: Callable[[Path], bool]) -> list[Path]:
    """Remove directories under ``root`` made before owners held lock files (older statekit
    versions): names matching ``pattern``, no lock file, untouched for ``idle_seconds``, and not
    ``busy`` (e.g. a database some process still has open)."""
    base = Path(root)
    removed: list[Path] = []
    if not base.is_dir():
        return removed
    now = time.time()
    for path in base.iterdir():
        if (not re.fullmatch(pattern, path.name) or not path.is_dir()
                or (base / f"{path.name}{LOCK_SUFFIX}").exists()):
            continue
        try:
            if now - path.stat().st_mtime < idle_seconds or busy(path):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def release_all() -> None:
    """Remove every directory this process owns (what happens when it exits)."""
    for path in list(_owned):
        remove(path)


def _after_fork_in_child() -> None:
    # a forked child shares its parent's locks but owns none of the directories
    _owned.clear()


atexit.register(release_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
