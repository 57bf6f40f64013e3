"""Blob stores: kept importable from here; they live in :mod:`statekit.checkpoint.blobstore`."""

from statekit.checkpoint.blobstore import (
    BlobStore,
    FsspecBlobStore,
    LocalBlobStore,
    MemoryBlobStore,
    OperationHook,
    blob_store_for,
    check_key,
    set_operation_hook,
    write_all,
    write_local_file,
)

__all__ = [
    "BlobStore",
    "FsspecBlobStore",
    "LocalBlobStore",
    "MemoryBlobStore",
    "OperationHook",
    "blob_store_for",
    "check_key",
    "set_operation_hook",
    "write_all",
    "write_local_file",
]
