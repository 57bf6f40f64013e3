"""Local checkpoint files reached without following links: a blob is read, written or deleted
only as a regular file whose every path component below the store's root is a real directory.

Checkpoints never contain symbolic links (restores hard-link, never symlink), so a link inside a
checkpoint directory is tampering: following one read (or deleted) files outside the job
directory, and a FIFO or device in place of a state file blocked the restore forever or fed it
without end.  The root itself may be a link (a configured checkpoint directory is trusted).

Every operation opens the directories below the root one at a time (``O_NOFOLLOW``) and acts on
the last component relative to the opened parent (``dir_fd``): a directory swapped for a link
after a check can no longer redirect the act, since there is no check apart from the act.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator

from statekit.checkpoint.blobstore.base import check_key
from statekit.errors import CheckpointStorageError, CorruptCheckpointError, UnsafePathError

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting for a writer
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
#: a new file below the root: never through a link, never an existing file
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


def _unsafe(root: str, key: str, exc: OSError) -> UnsafePathError:
    return UnsafePathError(f"{root}/{key}: a path component is a symbolic link (or not a "
                           "directory); checkpoint files are never reached through links")


def open_dir(root: str, names: list[str], *, create: bool = False) -> int:
    """An fd of the directory ``root/names...``, each step opened without following a link
    (``create``: missing steps are made, relative to their parent; a missing root is made as a
    path, since the configured directory is trusted)."""
    if create:
        try:
            os.makedirs(root, exist_ok=True)
        except (FileNotFoundError, FileExistsError, NotADirectoryError) as exc:  # not "missing"
            raise CheckpointStorageError(f"cannot create the directory {root}: "
                                         f"{type(exc).__name__}: {exc}") from exc
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except NotADirectoryError as exc:  # a component is a regular file
        raise CheckpointStorageError(f"cannot create the directory {root}: "
                                     f"{type(exc).__name__}: {exc}") from exc
    try:
        for name in names:
            try:
                child = os.open(name, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(name, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def parent_of(root: str, key: str, *, create: bool = False) -> tuple[int, str]:
    """``(fd of the directory holding key's last component, that component)``; UnsafePathError
    when a directory on the way is a link."""
    parts = check_key(key).split("/")
    try:
        return open_dir(root, parts[:-1], create=create), parts[-1]
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _unsafe(root, key, exc) from exc
        raise


def open_regular(root: str, key: str) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file ``key`` under ``root``, opened for reading without
    following a link anywhere below ``root``: UnsafePathError for a link, CorruptCheckpointError
    for a FIFO, device, socket or directory; OSError (FileNotFoundError...) otherwise."""
    parent, name = parent_of(root, key)
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _unsafe(root, key, exc) from exc
        raise
    finally:
        os.close(parent)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptCheckpointError(f"{root}/{key}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def unlink(root: str, key: str, before: Callable[[], None] | None = None) -> bool:
    """Delete the regular file ``key`` under ``root`` relative to its opened parent directory;
    False when it is not there.  A link, directory or other non-file is left alone
    (UnsafePathError / CorruptCheckpointError).  ``before`` runs between opening the parent
    and the unlink (the operation hook of crash and race tests)."""
    try:
        parent, name = parent_of(root, key)
    except FileNotFoundError:
        return False
    try:
        if before is not None:
            before()
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePathError(f"{root}/{key}: a symbolic link inside a checkpoint directory "
                                  "(statekit writes none; left alone)")
        if not stat.S_ISREG(info.st_mode):
            raise CorruptCheckpointError(f"{root}/{key}: not a regular file (left alone)")
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(parent)


def prune(root: str, names: list[str]) -> None:
    """Remove the directory ``root/names...`` and the directories below it once they are empty
    (bottom up, each relative to its opened parent; links and non-empty ones stay)."""
    if not names:
        _prune_below(root, None)
        return
    try:
        parent = open_dir(root, names[:-1])
    except OSError:
        return
    try:
        _prune_below(root, (parent, names[-1]))
    finally:
        os.close(parent)


def _prune_below(root: str, at: tuple[int, str] | None) -> None:
    try:
        fd = (os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC) if at is None
              else os.open(at[1], _DIRECTORY, dir_fd=at[0]))
    except OSError:
        return
    try:
        for entry in list(os.scandir(fd)):
            if entry.is_dir(follow_symlinks=False):
                _prune_below(root, (fd, entry.name))
    finally:
        os.close(fd)
    if at is not None:
        try:
            os.rmdir(at[1], dir_fd=at[0])
        except OSError:
            pass


def regular_files(root: str) -> Iterator[str]:
    """Every regular file below ``root`` as a relative key, each directory opened relative to
    its parent without following links (links, FIFOs and other non-files are no blobs, and a
    linked directory is not entered)."""
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    stack: list[tuple[int, str]] = [(top, "")]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                for entry in list(os.scandir(fd)):
                    key = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        try:
                            stack.append((os.open(entry.name, _DIRECTORY, dir_fd=fd), key))
                        except OSError:  # gone, or swapped for a link meanwhile
                            continue
                    elif entry.is_file(follow_symlinks=False):
                        yield key
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
