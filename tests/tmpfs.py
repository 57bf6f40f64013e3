"""Where tests put RocksDB databases: tmpfs when the machine has it (RocksDB fsyncs on every open,
which dominates test time on slow disks), private to this test process and removed with it."""

import os
import tempfile
from pathlib import Path


def rocksdb_dir() -> str | None:
    """This test process's tmpfs directory for RocksDB working dirs, or None without /dev/shm."""
    if not os.path.isdir("/dev/shm"):
        return None
    return str(Path("/dev/shm") / Path(tempfile.gettempdir()).name / "rocksdb")
