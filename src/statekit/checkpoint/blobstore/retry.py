"""Retries with exponential backoff and jitter for checkpoint storage operations.

Object stores fail transiently (throttling, 5xx, dropped connections); one such failure must not
fail a checkpoint.  :class:`RetryPolicy` retries only errors classified as transient, sleeping
``initial_backoff * multiplier**n`` (capped, with full jitter), and after the budget raises
:class:`~statekit.errors.CheckpointStorageError`, which the coordinator counts as a failed
checkpoint under its tolerable-failure rules.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from statekit import config as cfg
from statekit.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    ConfigError,
)

log = logging.getLogger("statekit.checkpoint.retry")

T = TypeVar("T")

#: errno values s3fs / the OS use for transient conditions (s3fs maps 503 SlowDown to EBUSY,
#: 500 InternalError to EREMOTEIO)
TRANSIENT_ERRNOS = frozenset({
    errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
    errno.ECONNREFUSED, errno.EPIPE, errno.EREMOTEIO, errno.ENETUNREACH, errno.ENETDOWN,
    errno.EHOSTUNREACH, errno.EINTR,
})
_TRANSIENT_WORDS = ("slowdown", "throttl", "reduce your request rate", "serviceunavailable",
                    "service unavailable", "internalerror", "internal error", "requesttimeout",
                    "too many requests", "connection reset", "connection was closed",
                    "broken pipe", "timed out", "temporarily unavailable")


class TransientStorageError(OSError):
    """A storage error that is worth retrying (raised by fault injection and custom stores)."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a transient storage failure (retry) rather than a permanent one."""
    if isinstance(exc, CheckpointError):
        return False  # already classified by statekit (missing, corrupt, exhausted retries)
    if isinstance(exc, TransientStorageError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, FileNotFoundError | FileExistsError | IsADirectoryError | NotADirectoryError):
        return False
    if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
        return True
    name = type(exc).__name__
    if name in ("ReadTimeoutError", "ConnectTimeoutError", "EndpointConnectionError",
                "ConnectionClosedError", "ServerDisconnectedError", "ClientPayloadError",
                "ClientOSError", "IncompleteRead", "ResponseParserError", "HTTPClientError"):
        return True
    text = str(exc).lower()
    if isinstance(exc, OSError | PermissionError) or name == "ClientError":
        return any(word in text for word in _TRANSIENT_WORDS)
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient storage failure.

    ``retries`` is the number of retries after the first attempt (0 disables retrying).
    """

    retries: int = cfg.default("state.storage.fs.retries")
    initial_backoff: float = cfg.default("state.storage.fs.retry-backoff") / 1000
    max_backoff: float = cfg.default("state.storage.fs.retry-max-backoff") / 1000
    multiplier: float = 2.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ConfigError("state.storage.fs.retries", f"must not be negative, got {self.retries}")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ConfigError("state.storage.fs.retry-backoff", "backoff must not be negative")

    @classmethod
    def from_config(cls, conf: Mapping[str, Any]) -> RetryPolicy:
        """The policy from flat keys ``state.storage.fs.retries`` / ``.retry-backoff`` /
        ``.retry-max-backoff`` (durations such as ``"100 ms"``)."""

        return cls(
            retries=cfg.read(conf, "state.storage.fs.retries"),
            initial_backoff=cfg.read(conf, "state.storage.fs.retry-backoff") / 1000,
            max_backoff=cfg.read(conf, "state.storage.fs.retry-max-backoff") / 1000,
        )

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number ``attempt`` (1-based)."""
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return random.uniform(0, cap) if self.jitter else cap

    def call(self, operation: Callable[[], T], what: str,
             sleep: Callable[[float], None] = time.sleep) -> T:
        """``operation()``, retried on transient errors; :class:`CheckpointStorageError` after the budget.

        Permanent errors propagate unchanged (the caller maps them to typed errors).
        """
        attempt = 0
        while True:
            try:
                return operation()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                attempt += 1
                if attempt > self.retries:
                    raise CheckpointStorageError(
                        f"{what} failed after {attempt} attempt(s) "
                        f"(retry budget {self.retries}): {type(exc).__name__}: {exc}"
                    ) from exc
                pause = self.delay(attempt)
                log.warning("%s failed transiently (%s: %s); retry %d/%d in %.0f ms", what,
                            type(exc).__name__, exc, attempt, self.retries, pause * 1000)
                sleep(pause)


NO_RETRY = RetryPolicy(retries=0)


def call_typed(retry: RetryPolicy, what: str, operation: Callable[[], T]) -> T:
    """``operation`` retried per ``retry``; permanent errors become typed checkpoint errors
    (a missing file :class:`CheckpointNotFoundError`, any other OS error
    :class:`CheckpointStorageError`), so callers never see a bare ``OSError``."""
    try:
        return retry.call(operation, what)
    except CheckpointError:
        raise
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"{what}: not found ({exc})") from exc
    except OSError as exc:
        raise CheckpointStorageError(f"cannot {what}: {type(exc).__name__}: {exc}") from exc

