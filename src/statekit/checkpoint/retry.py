"""Storage retries: kept importable from here; they live in
:mod:`statekit.checkpoint.blobstore.retry`."""

from statekit.checkpoint.blobstore.retry import (
    NO_RETRY,
    TRANSIENT_ERRNOS,
    RetryPolicy,
    TransientStorageError,
    is_transient,
)

__all__ = ["NO_RETRY", "TRANSIENT_ERRNOS", "RetryPolicy", "TransientStorageError", "is_transient"]
