"""The embedded RocksDB backend: working state as bytes in a local ``rocksdict`` database.

One column family per state; every key starts with its key group and the serialized key, so a
key-group range is one contiguous scan.  Checkpoints are native (flush and hard-link the live
files, then upload them; incremental ones upload only new SST files into ``shared/``); savepoints
use the backend-neutral format, so they restore into any backend.

``db`` opens databases, ``encoding`` holds the key layout, ``states`` the state classes,
``backend`` the keyed backend, ``snapshot`` / ``restore`` its snapshot strategy and restore
operation, ``factory`` the PyFlink-facing configuration and ``options`` the RocksDB options.
"""

from statekit.backends.rocksdb.backend import RocksDBKeyedStateBackend
from statekit.backends.rocksdb.db import open_db
from statekit.backends.rocksdb.factory import EmbeddedRocksDBStateBackend, RocksDBStateBackend
from statekit.backends.rocksdb.options import PredefinedOptions
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT
from statekit.backends.rocksdb.states import RocksDBListState, RocksDBMapState, RocksDBValueState

__all__ = [
    "ROCKSDB_FORMAT",
    "EmbeddedRocksDBStateBackend",
    "PredefinedOptions",
    "RocksDBKeyedStateBackend",
    "RocksDBListState",
    "RocksDBMapState",
    "RocksDBStateBackend",
    "RocksDBValueState",
    "open_db",
]
