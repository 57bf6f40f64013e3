"""The heap backend's factory: :class:`HashMapStateBackend`, PyFlink's name and settings.

A small picklable configuration; each partition gets its own :class:`HeapKeyedStateBackend`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from statekit.backends.base import StateBackend
from statekit.backends.heap.backend import HeapKeyedStateBackend
from statekit.backends.heap.snapshot import DEFAULT_SNAPSHOT_MODE, check_snapshot_mode
from statekit.errors import ConfigError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.serializers import TypeSerializer
from statekit.values import parse_bool, parse_float, parse_int

#: the heap backend's numeric settings: flat key -> (attribute, parser, rule, its wording)
_NUMERIC_SETTINGS: dict[str, tuple[str, Callable[[str, Any], Any], Callable[[Any], bool], str]] = {
    "state.backend.heap.materialization-interval":
        ("_interval", parse_int, lambda v: v >= 1, "must be at least 1"),
    "state.backend.heap.max-log-ratio": ("_ratio", parse_float, lambda v: v > 0, "must be positive"),
    "state.backend.heap.snapshot-pace":
        ("_pace", parse_float, lambda v: v >= 0, "must not be negative"),
}


def _setting(key: str, value: Any) -> Any:
    """``value`` of the numeric setting ``key``, parsed and checked (ConfigError naming the key)."""
    _, parse, rule, wording = _NUMERIC_SETTINGS[key]
    parsed = parse(key, value)
    if not rule(parsed):
        raise ConfigError(key, wording)
    return parsed


class HashMapStateBackend(StateBackend):
    """Working state on the Python heap; fast, bounded by memory; snapshots asynchronous by default.

    ``incremental=True`` writes changelog checkpoints (only keys changed since the last confirmed
    checkpoint) and a full base every ``materialization_interval`` checkpoints or once the log
    exceeds ``max_log_ratio`` of the base.  Flat keys: ``state.backend.heap.incremental`` (or
    ``state.backend.incremental``), ``state.backend.heap.materialization-interval``,
    ``state.backend.heap.max-log-ratio``, ``state.backend.heap.snapshot-mode`` (thread|fork),
    ``state.backend.heap.snapshot-pace``, ``state.backend.async``.
    """

    name = "hashmap"
    # set from ``_NUMERIC_SETTINGS`` (None: not set, the getter's default applies)
    _interval: int | None
    _ratio: float | None
    _pace: float | None

    def __init__(self, using_asynchronous_snapshots: bool | None = None, *,
                 incremental: bool | None = None, materialization_interval: int | None = None,
                 max_log_ratio: float | None = None,
                 number_of_transfering_threads: int | None = None,
                 snapshot_mode: str | None = None, snapshot_pace: float | None = None) -> None:
        super().__init__(using_asynchronous_snapshots)
        self._explicit_async = using_asynchronous_snapshots is not None
        self._incremental = incremental
        self._threads: int | None = None
        if number_of_transfering_threads is not None:
            self.set_number_of_transfering_threads(number_of_transfering_threads)
        self._mode = None if snapshot_mode is None else check_snapshot_mode(snapshot_mode)
        for key, value in (("state.backend.heap.materialization-interval", materialization_interval),
                           ("state.backend.heap.max-log-ratio", max_log_ratio),
                           ("state.backend.heap.snapshot-pace", snapshot_pace)):
            setattr(self, _NUMERIC_SETTINGS[key][0], None if value is None else _setting(key, value))

    def is_incremental_checkpoints_enabled(self) -> bool:
        return bool(self._incremental)

    def get_materialization_interval(self) -> int:
        return int(self._interval or 10)

    def get_max_log_ratio(self) -> float:
        return float(self._ratio or 0.5)

    def get_snapshot_mode(self) -> str:
        """How asynchronous snapshots serialize: ``thread`` (the default) or ``fork``."""
        return self._mode or check_snapshot_mode(DEFAULT_SNAPSHOT_MODE)

    def get_snapshot_pace(self) -> float:
        """Seconds the transfer thread sleeps per second of serialization (thread mode, default 1):
        higher keeps more GIL for processing and makes the asynchronous part longer."""
        return 1.0 if self._pace is None else float(self._pace)

    def get_number_of_transfering_threads(self) -> int:
        """Threads writing snapshots (default 1); misspelt as PyFlink spells it, for drop-in use."""
        return int(self._threads or 1)

    def set_number_of_transfering_threads(self, number_of_transfering_threads: int) -> None:
        if int(number_of_transfering_threads) < 1:
            raise ConfigError("state.backend.heap.transfer.thread.num", "must be at least 1")
        self._threads = int(number_of_transfering_threads)

    def configure(self, config: dict[str, Any]) -> HashMapStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        new = copy.copy(self)
        for key in ("state.backend.heap.incremental", "state.backend.incremental",
                    "execution.checkpointing.incremental"):
            if config.get(key) is not None and self._incremental is None:
                new._incremental = parse_bool(key, config[key])
                break
        for key, (attribute, *_) in _NUMERIC_SETTINGS.items():
            if config.get(key) is not None and getattr(self, attribute) is None:
                setattr(new, attribute, _setting(key, config[key]))
        key = "state.backend.heap.snapshot-mode"
        if config.get(key) is not None and self._mode is None:
            new._mode = check_snapshot_mode(config[key], key)
        for key in ("state.backend.async", "execution.checkpointing.async"):
            if config.get(key) is not None and not self._explicit_async:
                new._async = parse_bool(key, config[key])
                break
        return new

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            key_serializer, key_group_range, max_parallelism, clock,
            self.is_using_asynchronous_snapshots(), incremental=bool(self._incremental),
            materialization_interval=self.get_materialization_interval(),
            max_log_ratio=self.get_max_log_ratio(), snapshot_mode=self.get_snapshot_mode(),
            pace_ratio=self.get_snapshot_pace(),
        )

    def __repr__(self) -> str:
        return (f"HashMapStateBackend(using_asynchronous_snapshots={self._async}, "
                f"incremental={bool(self._incremental)})")
