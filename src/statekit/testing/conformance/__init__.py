"""Conformance suites shipped with statekit: subclass them to test a plugin through its public
interface, like zarr's ``StoreTests``.

:class:`BackendConformance` (a keyed state backend over every storage, bulk access to list and
map state included), :class:`StorageConformance`
(a checkpoint storage), :class:`BlobStoreConformance` (a blob store, checked against raw reads and
writes that bypass its API), :class:`NamespaceConformance` (namespaced keyed state),
:class:`OperatorStateConformance` (operator and broadcast state), and Flink's
``StateBackendTestBase`` ported: :class:`StateKindConformance` (each state kind's semantics),
:class:`SnapshotConformance` (snapshots, restores, rescaling, concurrency) and
:class:`KeyEnumerationConformance` (counting and enumerating keys, namespaces required); and
PyFlink's ``test_data_stream.py`` keyed and connected cases: :class:`DataStreamConformance`,
:class:`ConnectedStreamConformance`; and PyFlink's ``test_window.py`` keyed cases:
:class:`WindowConformance`.
"""

from statekit.testing.conformance.backend import (
    AGG,
    LIST,
    MAP,
    REDUCE,
    VALUE,
    BackendConformance,
    ManualClock,
)
from statekit.testing.conformance.blobstore import UNSAFE_KEYS, BlobStoreConformance
from statekit.testing.conformance.connected import ConnectedStreamConformance
from statekit.testing.conformance.datastream import DataStreamConformance
from statekit.testing.conformance.keys import KeyEnumerationConformance
from statekit.testing.conformance.namespaces import NamespaceConformance
from statekit.testing.conformance.operator import OperatorStateConformance
from statekit.testing.conformance.snapshots import SnapshotConformance
from statekit.testing.conformance.statekinds import StateKindConformance
from statekit.testing.conformance.storage import STORAGE_KINDS, StorageConformance, make_storage
from statekit.testing.conformance.windows import WindowConformance

__all__ = [
    "AGG",
    "LIST",
    "MAP",
    "REDUCE",
    "STORAGE_KINDS",
    "UNSAFE_KEYS",
    "VALUE",
    "BackendConformance",
    "BlobStoreConformance",
    "ConnectedStreamConformance",
    "DataStreamConformance",
    "KeyEnumerationConformance",
    "ManualClock",
    "NamespaceConformance",
    "OperatorStateConformance",
    "SnapshotConformance",
    "StateKindConformance",
    "StorageConformance",
    "WindowConformance",
    "make_storage",
]
