"""Local checkpoint files reached without following links: a blob is read only as a regular file
whose every path component below the store's root is a real directory or file.

Checkpoints never contain symbolic links (restores hard-link, never symlink), so a link inside a
checkpoint directory is tampering: following one read (or deleted) files outside the job
directory, and a FIFO or device in place of a state file blocked the restore forever or fed it
without end.  The root itself may be a link (a configured checkpoint directory is trusted).
"""

from __future__ import annotations

import errno
import os
import stat

from statekit.checkpoint.blobstore.base import check_key
from statekit.errors import CheckpointStorageError, CorruptCheckpointError, UnsafePathError

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: opening a FIFO returns at once (and is refused below) instead of waiting for a writer
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _parent_fd(root: str, parts: list[str]) -> int:
    """An fd of the directory holding ``parts[-1]``, each step opened without following links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for name in parts[:-1]:
            child = os.open(name, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(root: str, key: str) -> tuple[int, os.stat_result]:
    """``(fd, stat)`` of the regular file ``key`` under ``root``, opened for reading without
    following a link anywhere below ``root``: UnsafePathError for a link, CorruptCheckpointError
    for a FIFO, device, socket or directory; OSError (FileNotFoundError...) otherwise."""
    parts = check_key(key).split("/")
    try:
        parent = _parent_fd(root, parts)
        try:
            fd = os.open(parts[-1], _FILE, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{root}/{key}: a path component is a symbolic link (or not a "
                                  "directory); checkpoint files are never reached through links"
                                  ) from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptCheckpointError(f"{root}/{key}: not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def check_no_links(root: str, key: str) -> None:
    """UnsafePathError when a path component of ``key`` below ``root`` is a symbolic link (before
    writing or deleting it: through a linked directory both would act outside the root)."""
    path = root
    for name in check_key(key).split("/"):
        path = f"{path}/{name}"
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                raise UnsafePathError(f"{path}: a symbolic link inside a checkpoint directory; "
                                      "checkpoint files are never reached through links")
        except FileNotFoundError:
            return
        except NotADirectoryError as exc:  # a component above is a regular file
            raise CheckpointStorageError(f"cannot write {root}/{key}: a path component is not "
                                         "a directory") from exc
