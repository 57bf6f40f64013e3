"""Where working state lives: the backend ABCs, the heap backend, PyFlink's legacy facades, bulk
access, and (loaded on first use, so importing statekit does not load the RocksDB library) the
embedded RocksDB backend.  Backends write snapshots only through :mod:`statekit.checkpoint`'s
streams and reader."""

from typing import Any

from statekit.backends.base import KeyedStateBackend, SnapshotRun, StateBackend, StateMeta
from statekit.backends.bulk import BulkState
from statekit.backends.heap import HashMapStateBackend, HeapKeyedStateBackend
from statekit.backends.legacy import CustomStateBackend, FsStateBackend, MemoryStateBackend

_ROCKSDB_NAMES = ("EmbeddedRocksDBStateBackend", "PredefinedOptions", "RocksDBKeyedStateBackend",
                  "RocksDBStateBackend")


def __getattr__(name: str) -> Any:
    """The RocksDB names, imported on first use."""
    if name in _ROCKSDB_NAMES:
        from statekit.backends import rocksdb

        return getattr(rocksdb, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BulkState",
    "CustomStateBackend",
    "EmbeddedRocksDBStateBackend",
    "FsStateBackend",
    "HashMapStateBackend",
    "HeapKeyedStateBackend",
    "KeyedStateBackend",
    "MemoryStateBackend",
    "PredefinedOptions",
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
    "SnapshotRun",
    "StateBackend",
    "StateMeta",
]
