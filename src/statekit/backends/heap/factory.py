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
from statekit.config import BY_KEY, canonical, default
from statekit.configurable import Setting, apply_settings, refuse_keys_of
from statekit.errors import ConfigError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.serializers import TypeSerializer
from statekit.values import checked_int, choice, parse_bool, parse_float, parse_int


def _checked(parse: Callable[[str, Any], Any], rule: Callable[[Any], bool], wording: str
             ) -> Callable[[str, Any], Any]:
    """``parse`` followed by ``rule`` (ConfigError naming the key, with ``wording``)."""

    def parse_checked(key: str, value: Any) -> Any:
        parsed = parse(key, value)
        if not rule(parsed):
            raise ConfigError(key, wording)
        return parsed

    return parse_checked


_INTERVAL = _checked(parse_int, lambda v: v >= 1, "must be at least 1")
_RATIO = _checked(parse_float, lambda v: v > 0, "must be positive")
_PACE = _checked(parse_float, lambda v: v >= 0, "must not be negative")

_INTERVAL_KEY = "state.backend.heap.materialization-interval"
_RATIO_KEY = "state.backend.heap.max-log-ratio"
_PACE_KEY = "state.backend.heap.snapshot-pace"
_THREADS_KEY = "state.backend.heap.transfer.thread.num"
_LAZY_KEY = "state.backend.heap.lazy-restore"
_ORDER_KEY = "state.backend.heap.snapshot-key-group-order"
_ORDER = choice("auto", "true", "false")

#: the heap backend's flat keys (a setting made in code wins over them)
_SETTINGS = (
    Setting("_incremental", ("state.backend.heap.incremental", "state.backend.incremental",
                             "execution.checkpointing.incremental")),
    Setting("_interval", (_INTERVAL_KEY,), _INTERVAL),
    Setting("_ratio", (_RATIO_KEY,), _RATIO),
    Setting("_pace", (_PACE_KEY,), _PACE),
    Setting("_mode", ("state.backend.heap.snapshot-mode",), lambda k, v: check_snapshot_mode(v, k)),
    Setting("_lazy", (_LAZY_KEY,)),
    Setting("_order", (_ORDER_KEY,), _ORDER),
    Setting("_threads", (_THREADS_KEY,)),
    Setting("_async", ("state.backend.async", "execution.checkpointing.async"), given="_async_given"),
)


class HashMapStateBackend(StateBackend):
    """Working state on the Python heap; fast, bounded by memory; snapshots asynchronous by default.

    ``incremental=True`` writes changelog checkpoints (only keys changed since the last confirmed
    checkpoint) and a full base every ``materialization_interval`` checkpoints or once the log
    exceeds ``max_log_ratio`` of the base.  Flat keys: ``state.backend.heap.incremental`` (or
    ``state.backend.incremental``), ``state.backend.heap.materialization-interval``,
    ``state.backend.heap.max-log-ratio``, ``state.backend.heap.snapshot-mode`` (thread|fork),
    ``state.backend.heap.snapshot-pace``, ``state.backend.heap.lazy-restore``,
    ``state.backend.heap.snapshot-key-group-order``, ``state.backend.async``.
    ``lazy_restore`` (default true): restored values stay serialized until first accessed or
    decoded by a background thread.  ``key_group_order`` (``auto``, ``true`` or ``false``; default
    ``auto``: when a task holds part of the key groups): full snapshots are written by key group,
    so a rescale reads only the parts of its key groups.
    """

    name = "hashmap"

    def __init__(self, using_asynchronous_snapshots: bool | None = None, *,
                 incremental: bool | None = None, materialization_interval: int | None = None,
                 max_log_ratio: float | None = None,
                 number_of_transfering_threads: int | None = None,
                 snapshot_mode: str | None = None, snapshot_pace: float | None = None,
                 lazy_restore: bool | None = None,
                 key_group_order: bool | str | None = None) -> None:
        super().__init__(using_asynchronous_snapshots)
        # None: not set in code, so a flat key may set it and the getter's default applies
        self._async_given = using_asynchronous_snapshots
        self._incremental = incremental
        self._threads: int | None = None
        if number_of_transfering_threads is not None:
            self.set_number_of_transfering_threads(number_of_transfering_threads)
        self._mode = None if snapshot_mode is None else check_snapshot_mode(snapshot_mode)
        self._interval: int | None = (None if materialization_interval is None
                                      else _INTERVAL(_INTERVAL_KEY, materialization_interval))
        self._ratio: float | None = None if max_log_ratio is None else _RATIO(_RATIO_KEY, max_log_ratio)
        self._pace: float | None = None if snapshot_pace is None else _PACE(_PACE_KEY, snapshot_pace)
        self._lazy: bool | None = None if lazy_restore is None else parse_bool(_LAZY_KEY, lazy_restore)
        self._order: str | None = (None if key_group_order is None
                                   else _ORDER(_ORDER_KEY, key_group_order))

    def is_incremental_checkpoints_enabled(self) -> bool:
        return bool(self._incremental)

    def get_materialization_interval(self) -> int:
        return int(default(_INTERVAL_KEY) if self._interval is None else self._interval)

    def get_max_log_ratio(self) -> float:
        return float(default(_RATIO_KEY) if self._ratio is None else self._ratio)

    def get_snapshot_mode(self) -> str:
        """How asynchronous snapshots serialize: ``thread`` (the default) or ``fork``."""
        return self._mode or check_snapshot_mode(DEFAULT_SNAPSHOT_MODE)

    def get_snapshot_pace(self) -> float:
        """Seconds the transfer thread sleeps per second of serialization (thread mode, default 4):
        higher keeps more GIL for processing and makes the asynchronous part longer."""
        return float(default(_PACE_KEY) if self._pace is None else self._pace)

    def is_lazy_restore_enabled(self) -> bool:
        """Whether restored values stay serialized until first needed (default true)."""
        return bool(default(_LAZY_KEY) if self._lazy is None else self._lazy)

    def get_key_group_order(self) -> str:
        """``auto`` (the default: when a task holds part of the key groups), ``true`` or
        ``false``: whether full snapshots are written by key group."""
        return str(default(_ORDER_KEY) if self._order is None else self._order)

    def get_number_of_transfering_threads(self) -> int:
        """How many tasks' asynchronous snapshots the local runner writes at once (default 1; one
        thread writes each snapshot, restores do not use it); misspelt as PyFlink spells it."""
        return int(default(_THREADS_KEY) if self._threads is None else self._threads)

    def set_number_of_transfering_threads(self, number_of_transfering_threads: int) -> None:
        self._threads = checked_int(_THREADS_KEY, number_of_transfering_threads, 1)

    def configure(self, config: dict[str, Any]) -> HashMapStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        for key in ("state.changelog.enabled", "state.backend.changelog.enabled",
                    "state.changelog.periodic-materialize.interval",
                    "state.backend.changelog.periodic-materialize.interval"):
            if config.get(key) is not None and BY_KEY[canonical(key)].parse(key, config[key]):
                raise ConfigError(key, "changelog checkpoints of the write-ahead log are the "
                                  "RocksDB backend's; the heap backend's changelog is "
                                  "state.backend.heap.incremental: true")
        refuse_keys_of(config, "state.backend.rocksdb.", "rocksdb", self.name)
        new = copy.copy(self)
        apply_settings(_SETTINGS, self, new, config)
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
            pace_ratio=self.get_snapshot_pace(), lazy_restore=self.is_lazy_restore_enabled(),
            key_group_order=_ordered(self.get_key_group_order(), key_group_range, max_parallelism),
        )

    def __repr__(self) -> str:
        return (f"HashMapStateBackend(using_asynchronous_snapshots={self._async}, "
                f"incremental={bool(self._incremental)})")


def _ordered(setting: str, rng: KeyGroupRange, max_parallelism: int) -> bool:
    """Whether a task's full snapshots are written by key group (``auto``: it holds part of the
    key groups, so a rescale may split its state)."""
    return setting == "true" or (setting == "auto" and len(rng) < max_parallelism)
