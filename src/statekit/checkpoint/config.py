"""Checkpointing settings with PyFlink's names, constants and defaults, and the flat keys
that set them (:meth:`CheckpointConfig.configure`, as Flink's ``CheckpointConfig.configure``)."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from statekit import config as cfg
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.durations import Time, to_millis
from statekit.errors import ConfigError
from statekit.registry import storage_registry
from statekit.values import checked_int


class CheckpointingMode(IntEnum):
    """Exactly-once (state reflects every record once after recovery) or at-least-once."""

    EXACTLY_ONCE = 0
    AT_LEAST_ONCE = 1


class ExternalizedCheckpointCleanup(IntEnum):
    """What happens to retained checkpoints when a job is cancelled (or its input ends)."""

    DELETE_ON_CANCELLATION = 0
    RETAIN_ON_CANCELLATION = 1
    NO_EXTERNALIZED_CHECKPOINTS = 2


class CheckpointConfig:
    """All checkpointing settings of one environment (PyFlink's ``CheckpointConfig``)."""

    DEFAULT_MODE = CheckpointingMode[cfg.default("execution.checkpointing.mode")]
    DEFAULT_TIMEOUT: int = cfg.default("execution.checkpointing.timeout")
    DEFAULT_MIN_PAUSE_BETWEEN_CHECKPOINTS: int = cfg.default("execution.checkpointing.min-pause")
    DEFAULT_MAX_CONCURRENT_CHECKPOINTS: int = cfg.default(
        "execution.checkpointing.max-concurrent-checkpoints")
    DEFAULT_NUM_RETAINED_CHECKPOINTS: int = cfg.default("state.checkpoints.num-retained")
    UNDEFINED_TOLERABLE_CHECKPOINT_NUMBER = -1

    def __init__(self) -> None:
        self._mode = self.DEFAULT_MODE
        self._interval = -1
        self._timeout = self.DEFAULT_TIMEOUT
        self._min_pause = self.DEFAULT_MIN_PAUSE_BETWEEN_CHECKPOINTS
        self._max_concurrent = self.DEFAULT_MAX_CONCURRENT_CHECKPOINTS
        self._fail_on_errors = True
        self._tolerable_failures = self.UNDEFINED_TOLERABLE_CHECKPOINT_NUMBER
        self._cleanup = ExternalizedCheckpointCleanup.NO_EXTERNALIZED_CHECKPOINTS
        self._prefer_checkpoint = False
        self._unaligned = False
        self._force_unaligned = False
        self._alignment_timeout = 0
        self._storage: CheckpointStorage | None = None
        self._num_retained = self.DEFAULT_NUM_RETAINED_CHECKPOINTS

    # --- flat keys ------------------------------------------------------------------------------

    def configure(self, configuration: Mapping[str, Any]) -> CheckpointConfig:
        """Apply the checkpointing keys set in ``configuration`` (canonical names).

        Like its setters (and Flink's ``CheckpointConfig.configure``) this changes the settings
        in place: the environment's one ``CheckpointConfig``, which callers may already hold.
        ``state.checkpoint-storage`` or ``state.checkpoints.dir`` replace the storage, since
        keys given explicitly win over earlier settings.
        """
        for key, setter in _FLAT_KEYS:
            value = configuration.get(key)
            if value is not None:
                setter(self, cfg.BY_KEY[key].parse(key, value))
        if "state.checkpoint-storage" in configuration or "state.checkpoints.dir" in configuration:
            self.set_checkpoint_storage(storage_from_config(configuration))
        return self

    # --- interval and mode ---------------------------------------------------------------------

    def is_checkpointing_enabled(self) -> bool:
        return self._interval > 0

    def get_checkpointing_mode(self) -> CheckpointingMode:
        return self._mode

    def set_checkpointing_mode(self, checkpointing_mode: CheckpointingMode) -> CheckpointConfig:
        self._mode = CheckpointingMode(checkpointing_mode)
        return self

    def get_checkpoint_interval(self) -> int:
        """The interval in milliseconds, or -1 when checkpointing is disabled."""
        return self._interval

    def set_checkpoint_interval(self, checkpoint_interval: int) -> CheckpointConfig:
        interval = to_millis(checkpoint_interval, "execution.checkpointing.interval")
        if interval < 10:
            raise ConfigError("execution.checkpointing.interval",
                              f"{interval} ms is below the minimum of 10 ms")
        self._interval = interval
        return self

    def get_checkpoint_timeout(self) -> int:
        return self._timeout

    def set_checkpoint_timeout(self, checkpoint_timeout: int) -> CheckpointConfig:
        timeout = to_millis(checkpoint_timeout, "execution.checkpointing.timeout")
        if timeout < 1:
            raise ConfigError("execution.checkpointing.timeout", "must be at least 1 ms")
        self._timeout = timeout
        return self

    def get_min_pause_between_checkpoints(self) -> int:
        return self._min_pause

    def set_min_pause_between_checkpoints(self, min_pause_between_checkpoints: int) -> CheckpointConfig:
        pause = to_millis(min_pause_between_checkpoints, "execution.checkpointing.min-pause")
        if pause < 0:
            raise ConfigError("execution.checkpointing.min-pause", "must not be negative")
        self._min_pause = pause
        return self

    def get_max_concurrent_checkpoints(self) -> int:
        return self._max_concurrent

    def set_max_concurrent_checkpoints(self, max_concurrent_checkpoints: int) -> CheckpointConfig:
        self._max_concurrent = checked_int("execution.checkpointing.max-concurrent-checkpoints",
                                           max_concurrent_checkpoints, 1)
        return self

    # --- failures ----------------------------------------------------------------------------------

    def is_fail_on_checkpointing_errors(self) -> bool:
        return self._fail_on_errors

    def set_fail_on_checkpointing_errors(self, fail_on_checkpointing_errors: bool) -> CheckpointConfig:
        """True (default): a failed checkpoint fails the job; False: it is only declined.

        As in Flink, False means unlimited tolerable failures unless a number was set explicitly.
        """
        self._fail_on_errors = bool(fail_on_checkpointing_errors)
        return self

    def get_tolerable_checkpoint_failure_number(self) -> int:
        if self._tolerable_failures == self.UNDEFINED_TOLERABLE_CHECKPOINT_NUMBER:
            return 0 if self._fail_on_errors else 2**31 - 1
        return self._tolerable_failures

    def set_tolerable_checkpoint_failure_number(self, tolerable_checkpoint_failure_number: int
                                                ) -> CheckpointConfig:
        self._tolerable_failures = checked_int(
            "execution.checkpointing.tolerable-failed-checkpoints",
            tolerable_checkpoint_failure_number, 0)
        return self

    # --- retention -----------------------------------------------------------------------------------

    def enable_externalized_checkpoints(self, cleanup_mode: ExternalizedCheckpointCleanup
                                        ) -> CheckpointConfig:
        return self.set_externalized_checkpoint_cleanup(cleanup_mode)

    def set_externalized_checkpoint_cleanup(self, cleanup_mode: ExternalizedCheckpointCleanup
                                            ) -> CheckpointConfig:
        self._cleanup = ExternalizedCheckpointCleanup(cleanup_mode)
        return self

    set_externalized_checkpoint_retention = set_externalized_checkpoint_cleanup

    def is_externalized_checkpoints_enabled(self) -> bool:
        return self._cleanup != ExternalizedCheckpointCleanup.NO_EXTERNALIZED_CHECKPOINTS

    def get_externalized_checkpoint_cleanup(self) -> ExternalizedCheckpointCleanup | None:
        return self._cleanup if self.is_externalized_checkpoints_enabled() else None

    def get_externalized_checkpoint_retention(self) -> ExternalizedCheckpointCleanup:
        return self._cleanup

    def get_num_retained_checkpoints(self) -> int:
        """How many completed checkpoints are kept (``state.checkpoints.num-retained``)."""
        return self._num_retained

    def set_num_retained_checkpoints(self, num_retained: int) -> CheckpointConfig:
        self._num_retained = checked_int("state.checkpoints.num-retained", num_retained, 1)
        return self

    def is_prefer_checkpoint_for_recovery(self) -> bool:
        return self._prefer_checkpoint

    def set_prefer_checkpoint_for_recovery(self, prefer_checkpoint_for_recovery: bool
                                           ) -> CheckpointConfig:
        self._prefer_checkpoint = bool(prefer_checkpoint_for_recovery)
        return self

    # --- unaligned checkpoints (one operator, no channels: recorded for API compatibility) ----------

    def is_unaligned_checkpoints_enabled(self) -> bool:
        return self._unaligned

    def enable_unaligned_checkpoints(self, enabled: bool = True) -> CheckpointConfig:
        self._unaligned = bool(enabled)
        return self

    def disable_unaligned_checkpoints(self) -> CheckpointConfig:
        return self.enable_unaligned_checkpoints(False)

    def set_alignment_timeout(self, alignment_timeout: Time | _dt.timedelta | int) -> CheckpointConfig:
        self._alignment_timeout = to_millis(alignment_timeout, "alignment_timeout", minimum=0)
        return self

    def get_alignment_timeout(self) -> _dt.timedelta:
        return _dt.timedelta(milliseconds=self._alignment_timeout)

    def set_force_unaligned_checkpoints(self, force_unaligned_checkpoints: bool = True
                                        ) -> CheckpointConfig:
        self._force_unaligned = bool(force_unaligned_checkpoints)
        return self

    def is_force_unaligned_checkpoints(self) -> bool:
        return self._force_unaligned

    # --- storage -------------------------------------------------------------------------------------

    def set_checkpoint_storage(self, storage: CheckpointStorage) -> CheckpointConfig:
        if not isinstance(storage, CheckpointStorage):
            raise ConfigError("state.checkpoint-storage",
                              f"expected a CheckpointStorage, got {type(storage).__name__}")
        self._storage = storage
        return self

    def set_checkpoint_storage_dir(self, checkpoint_path: str) -> CheckpointConfig:
        """Checkpoint to files under ``checkpoint_path`` (a path or fsspec URL)."""
        self._storage = FileSystemCheckpointStorage(checkpoint_path)
        return self

    def get_checkpoint_storage(self) -> CheckpointStorage | None:
        return self._storage


#: flat key -> the setter its parsed value goes to (see :meth:`CheckpointConfig.configure`)
_FLAT_KEYS: tuple[tuple[str, Any], ...] = (
    ("execution.checkpointing.interval", CheckpointConfig.set_checkpoint_interval),
    ("execution.checkpointing.mode",
     lambda c, name: c.set_checkpointing_mode(CheckpointingMode[name])),
    ("execution.checkpointing.timeout", CheckpointConfig.set_checkpoint_timeout),
    ("execution.checkpointing.min-pause", CheckpointConfig.set_min_pause_between_checkpoints),
    ("execution.checkpointing.max-concurrent-checkpoints",
     CheckpointConfig.set_max_concurrent_checkpoints),
    ("execution.checkpointing.tolerable-failed-checkpoints",
     CheckpointConfig.set_tolerable_checkpoint_failure_number),
    ("execution.checkpointing.prefer-checkpoint-for-recovery",
     CheckpointConfig.set_prefer_checkpoint_for_recovery),
    ("execution.checkpointing.unaligned", CheckpointConfig.enable_unaligned_checkpoints),
    ("state.checkpoints.num-retained", CheckpointConfig.set_num_retained_checkpoints),
    ("execution.checkpointing.externalized-checkpoint-retention",
     lambda c, name: c.set_externalized_checkpoint_cleanup(ExternalizedCheckpointCleanup[name])),
)


def storage_from_config(config: Mapping[str, Any]) -> CheckpointStorage:
    """The storage ``state.checkpoint-storage`` names, built by the registry from ``config``.

    Unnamed, it is implied as in Flink: file system storage under ``state.checkpoints.dir``
    when that is set, JobManager storage otherwise.
    """
    name = config.get("state.checkpoint-storage") or (
        "filesystem" if config.get("state.checkpoints.dir") else "jobmanager")
    return storage_registry.create(str(name), config, CheckpointStorage)
