"""Blob stores: one class per medium behind the :class:`BlobStore` ABC (as zarr v3's stores).

:class:`MemoryBlobStore` (a dict owned by this process), :class:`LocalBlobStore` (temp file,
fsync, rename; kernel copies, hard links, ``pread``) and :class:`FsspecBlobStore` (object stores:
one PUT or a multipart upload); :func:`blob_store_for` picks the one a URL needs.
"""

from statekit.checkpoint.blobstore.base import (
    BlobStore,
    OperationHook,
    check_key,
    set_operation_hook,
    write_all,
    write_local_file,
)
from statekit.checkpoint.blobstore.fsspec import FsspecBlobStore, blob_store_for
from statekit.checkpoint.blobstore.local import LocalBlobStore
from statekit.checkpoint.blobstore.memory import MemoryBlobStore
from statekit.checkpoint.blobstore.retry import RetryPolicy, TransientStorageError

__all__ = [
    "BlobStore",
    "FsspecBlobStore",
    "LocalBlobStore",
    "MemoryBlobStore",
    "OperationHook",
    "RetryPolicy",
    "TransientStorageError",
    "blob_store_for",
    "check_key",
    "set_operation_hook",
    "write_all",
    "write_local_file",
]
