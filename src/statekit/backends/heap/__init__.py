"""The heap backend: working state as Python objects in dicts (Flink's ``HashMapStateBackend``).

Snapshots capture in constant time: the synchronous part marks each table; the transfer thread
then copies or reads the live dicts in short steps while the live side keeps what the snapshot
must see (old values saved on first change, mutable ones copied; new keys staged; removals as
tombstones), and packs and uploads in paced turns so the processing thread never waits long for
the GIL.  ``table`` holds the tables and their captures, ``states`` the states, ``snapshot``
the snapshot strategy, ``backend`` the keyed backend and ``factory`` the
:class:`HashMapStateBackend` configuration.
"""

from statekit.backends.heap.backend import HeapKeyedStateBackend
from statekit.backends.heap.factory import HashMapStateBackend
from statekit.backends.heap.snapshot import (
    DEFAULT_SNAPSHOT_MODE,
    HEAP_CHANGELOG_FORMAT,
    SNAPSHOT_MODES,
    HeapSnapshotStrategy,
)
from statekit.backends.heap.states import HeapListState, HeapMapState, HeapValueState
from statekit.backends.heap.table import HeapTable

__all__ = [
    "DEFAULT_SNAPSHOT_MODE",
    "HEAP_CHANGELOG_FORMAT",
    "SNAPSHOT_MODES",
    "HashMapStateBackend",
    "HeapKeyedStateBackend",
    "HeapListState",
    "HeapMapState",
    "HeapSnapshotStrategy",
    "HeapTable",
    "HeapValueState",
]
