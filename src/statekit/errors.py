"""Typed errors: every failure statekit reports is one of these, so callers can tell them apart.

Each class also derives from the builtin a caller would naturally catch (``ValueError``,
``TypeError``, ``FileNotFoundError``), as zarr's error tree does.
"""

from __future__ import annotations


class StatekitError(Exception):
    """Root of every statekit error."""


# --- configuration -------------------------------------------------------------------------------


class ConfigError(StatekitError, ValueError):
    """A configuration key holds a value statekit cannot use; ``key`` names the offending key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class ConfigTypeError(ConfigError, TypeError):
    """A setting was given a value of the wrong type (e.g. a string where a duration belongs)."""


class UnknownPluginError(ConfigError):
    """A backend or checkpoint-storage name is neither built in, registered, nor importable."""


class MissingDependencyError(UnknownPluginError, ImportError):
    """A plugin's optional dependency is not installed; the message says what to install."""


# --- state access --------------------------------------------------------------------------------


class StateError(StatekitError):
    """Misuse of the keyed state API; ``state_name`` names the state when one is involved."""

    def __init__(self, message: str, state_name: str | None = None) -> None:
        self.state_name = state_name
        prefix = f"state '{state_name}': " if state_name is not None else ""
        super().__init__(prefix + message)


class NoKeyContextError(StateError, RuntimeError):
    """Keyed state was used where no current key is set (outside ``process_element``)."""


class ConcurrentModificationError(StateError, RuntimeError):
    """Keys were added to or removed from a state while its keys were being enumerated."""


class StateTypeError(StateError, TypeError):
    """A value does not match the type information of its state descriptor."""


class StateNameClashError(StateError, ValueError):
    """Two descriptors of different kinds or types were registered under one state name."""


class ReadOnlyStateError(StateError, TypeError):
    """A read-only view of state was written to (broadcast state on the non-broadcast side)."""


class InvalidStateNameError(StateError, ValueError):
    """A state name no backend can hold (empty, a NUL character, not encodable as UTF-8, too long)."""


class StateSizeError(StateError, ValueError):
    """A key, value or whole state exceeds a configured size limit."""


class SerializationError(StatekitError, ValueError):
    """Bytes could not be turned into a value, or a value into bytes."""


# --- checkpoints ---------------------------------------------------------------------------------


class CheckpointError(StatekitError):
    """A checkpoint could not be written, read or restored."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No completed checkpoint or savepoint exists at the requested place."""


class MissingFileError(CheckpointNotFoundError):
    """A file the store was asked for is missing (``path``): a checkpoint's ``_metadata`` (nothing
    there) or a file some metadata names (damage)."""

    def __init__(self, path: str, message: str | None = None) -> None:
        super().__init__(message or f"missing checkpoint file {path}")
        self.path = path


class MissingStateError(CheckpointNotFoundError):
    """State that must exist is gone: a query resumed past its first batch finds no statekit
    state (deleted, moved, or held in a driver's memory that ended); never continued from empty."""


class CorruptCheckpointError(CheckpointError, ValueError):
    """Checkpoint data is damaged: bad checksum, wrong size, unreadable structure."""


class ChecksumMismatchError(CorruptCheckpointError):
    """A file or inline chunk does not have the checksum its metadata records."""


class TruncatedCheckpointError(CorruptCheckpointError):
    """A file or metadata is shorter (or longer) than recorded."""


class UnsupportedFormatVersionError(CorruptCheckpointError):
    """Metadata was written in a format version this statekit cannot read."""


class UnsafePathError(CorruptCheckpointError):
    """A path (from metadata or a caller) escapes the directory it must stay in."""


class PickleNotAllowedError(CorruptCheckpointError):
    """Checkpoint data needs pickle but the state did not opt into it."""


class CheckpointTimeoutError(CheckpointError, TimeoutError):
    """A checkpoint ran longer than the configured timeout and was aborted."""


class CheckpointStorageError(CheckpointError, OSError):
    """The storage failed an operation (after retries where they apply)."""


class CarriedStateError(CheckpointError):
    """Part of an ``applyInPandasWithState`` query's state lives in Spark's state store (the
    changes each key carries in its ``GroupState``), which only Spark can read: it needs a
    SparkSession, and the query's checkpointLocation."""


# --- execution -----------------------------------------------------------------------------------


class JobExecutionError(StatekitError, RuntimeError):
    """A job failed and its restart strategy allowed no further attempt."""


class BackendLockedError(StatekitError, RuntimeError):
    """A local state directory is already opened by another process."""
