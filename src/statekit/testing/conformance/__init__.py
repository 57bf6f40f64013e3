"""Conformance suites shipped with statekit: subclass them to test a plugin through its public
interface, like zarr's ``StoreTests``.

:class:`BackendConformance` (a keyed state backend over every storage), :class:`StorageConformance`
(a checkpoint storage), :class:`BlobStoreConformance` (a blob store, checked against raw
reads and writes that bypass its API) and :class:`NamespaceConformance` (namespaced keyed state).
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
from statekit.testing.conformance.namespaces import NamespaceConformance
from statekit.testing.conformance.storage import STORAGE_KINDS, StorageConformance, make_storage

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
    "ManualClock",
    "NamespaceConformance",
    "StorageConformance",
    "make_storage",
]
