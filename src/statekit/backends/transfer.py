"""Moving state between backends and partitionings: any statekit snapshot into any backend.

A backend restores its own formats (and the backend-neutral ``statekit-kv`` ones) directly.  A
snapshot it cannot read, or cannot split by key (a native RocksDB checkpoint is split only by
key-group ranges), is first restored into a temporary backend of its own kind, which writes a
backend-neutral savepoint into a temporary directory; that savepoint restores into the target.
So a retained checkpoint of either backend restores into the other (Flink asks for a savepoint
there), and on Spark, where a partition owns the keys Spark's hash partitioning routes to it, a
new partition keeps exactly its keys from several old partitions.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from statekit import workdirs
from statekit.backends.base import KeyedStateBackend, RestoreSource, StateBackend, gc_paused
from statekit.backends.heap.factory import HashMapStateBackend
from statekit.backends.heap.snapshot import HEAP_CHANGELOG_FORMAT
from statekit.backends.kvformat import KV_FORMATS
from statekit.backends.rocksdb.factory import EmbeddedRocksDBStateBackend
from statekit.backends.rocksdb.snapshot import ROCKSDB_FORMAT
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.layout import CheckpointStorageAccess
from statekit.errors import CorruptCheckpointError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.types import serializer_from_config

#: the backend that reads each format natively, for the conversion of a snapshot
_READERS: dict[str, Callable[[], StateBackend]] = {
    **dict.fromkeys(KV_FORMATS, HashMapStateBackend),
    HEAP_CHANGELOG_FORMAT: HashMapStateBackend,
    ROCKSDB_FORMAT: EmbeddedRocksDBStateBackend,
}


def restore_into(backend: KeyedStateBackend, sources: list[RestoreSource], *,
                 key_filter: Callable[[Any], bool] | None = None,
                 skip_states: frozenset[str] = frozenset()) -> None:
    """Restore ``(handle, reader)`` sources of any format into ``backend``: its range, only the
    keys ``key_filter`` accepts, without the states named in ``skip_states``."""
    with gc_paused():
        _restore(backend, sources, key_filter, skip_states)


def _restore(backend: KeyedStateBackend, sources: list[RestoreSource],
             key_filter: Callable[[Any], bool] | None, skip_states: frozenset[str]) -> None:
    direct: list[RestoreSource] = []
    foreign: list[RestoreSource] = []
    filtering = key_filter is not None or bool(skip_states)
    for handle, reader in sources:
        fmt = handle.get("format")
        if fmt not in _READERS:
            raise CorruptCheckpointError(f"unknown snapshot format {fmt!r}")
        backend.restore_key_check(handle)  # a key type that cannot restore fails before any work
        readable = backend.filters(handle) if filtering else fmt in backend.native_formats
        (direct if readable else foreign).append((handle, reader))
    if not foreign:
        backend.restore_sources(direct, key_filter=key_filter, skip_states=skip_states)
        return
    scratch = workdirs.create(tempfile.gettempdir(), "statekit-transfer-")
    try:
        access = CheckpointStorageAccess(LocalBlobStore(str(scratch)), str(scratch), 0)
        for n, (handle, reader) in enumerate(foreign):
            direct.append((_neutral(backend, handle, reader, access, n), access.reader()))
        backend.restore_sources(direct, key_filter=key_filter, skip_states=skip_states)
    finally:
        workdirs.remove(scratch)


def _neutral(backend: KeyedStateBackend, handle: dict[str, Any], reader: Any,
             access: CheckpointStorageAccess, n: int) -> dict[str, Any]:
    """``handle`` rewritten as a backend-neutral savepoint by a backend of its own kind."""
    try:
        key_groups = KeyGroupRange.of(handle["key_group_range"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpointError("snapshot without a valid key_group_range") from exc
    # read with the key type the snapshot records (checked by restore_into): the savepoint
    # records it too, and the target checks it against its own when it restores the savepoint
    recorded = handle.get("key_type")
    key_serializer = (backend.key_serializer if recorded is None
                      else serializer_from_config(recorded))
    reader_factory = _READERS[handle["format"]]()
    if isinstance(reader_factory, EmbeddedRocksDBStateBackend):  # downloads on the target's threads
        reader_factory.set_number_of_transfering_threads(getattr(backend, "transfer_threads", 1))
    source = reader_factory.create_keyed_state_backend(
        key_serializer=key_serializer, key_group_range=key_groups,
        max_parallelism=backend.max_parallelism, operator_id="transfer")
    try:
        source.restore([handle], reader)
        return source.snapshot(0, access.streams(0, f"t{n}"), savepoint=True).run()
    finally:
        source.dispose()
