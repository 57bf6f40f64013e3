"""Where tests put RocksDB databases: tmpfs when the machine has it (RocksDB fsyncs on every open,
which dominates test time on slow disks), a directory owned by this test process (statekit's
working-directory convention: a held lock beside it), removed when the process ends and swept by
the next session if it was killed."""

import os

from statekit import workdirs

_DIR: str | None = None


def rocksdb_dir() -> str | None:
    """This test process's tmpfs directory for RocksDB working dirs, or None without /dev/shm."""
    global _DIR
    if _DIR is None and os.path.isdir("/dev/shm"):
        _DIR = str(workdirs.create("/dev/shm", "statekit-tests-"))
    return _DIR
