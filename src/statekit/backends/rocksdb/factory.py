"""The RocksDB backend's factories: :class:`EmbeddedRocksDBStateBackend` with PyFlink's getters
and setters, and PyFlink's seed facade :class:`RocksDBStateBackend` (RocksDB plus file checkpoints).
"""

from __future__ import annotations

import copy
import fcntl
import os
import random
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rocksdict import Options

from statekit import workdirs
from statekit.backends.base import StateBackend
from statekit.backends.legacy import FsStateBackend
from statekit.backends.rocksdb.backend import RocksDBKeyedStateBackend
from statekit.backends.rocksdb.changelog import WAL_TTL_SECONDS, WalChangelog
from statekit.backends.rocksdb.memory import (
    FIXED_KEY,
    MANAGED_KEY,
    RATIO_KEY,
    RocksDBMemoryConfiguration,
    shared_memory,
)
from statekit.backends.rocksdb.options import (
    TUNING_KEYS,
    OptionsFactory,
    PredefinedOptions,
    build_options,
    check_tuning,
    resolve_options_factory,
)
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.streams import safe_name
from statekit.config import BY_KEY, default
from statekit.configurable import Setting, apply_settings, refuse_keys_of
from statekit.errors import ConfigError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.serializers import TypeSerializer
from statekit.values import parse_bool

_THREADS_KEY = "state.backend.rocksdb.checkpoint.transfer.thread.num"
_LAZY_KEY = "state.backend.rocksdb.lazy-restore"
CHANGELOG_KEY = "state.changelog.enabled"
_MATERIALIZE_KEY = "state.changelog.periodic-materialize.interval"
_LOG_RATIO_KEY = "state.backend.rocksdb.changelog.max-log-ratio"


def _local_path(path: Any, key: str = "state.backend.rocksdb.localdir") -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(key, f"expected a local directory path, got {path!r}")
    path = path.strip()
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        raise ConfigError(key, f"{path!r}: RocksDB working directories must be local paths")
    return os.path.abspath(os.path.expanduser(path))


def _parse_paths(key: str, value: Any) -> list[str] | None:
    """``state.backend.rocksdb.localdir``: one directory, or several separated by commas,
    semicolons or the OS path separator (not in URLs); empty leaves the default."""
    if value in (None, ""):
        return None
    if isinstance(value, str):
        seps = ",;" if "://" in value else ",;" + os.pathsep
        value = [p for p in re.split(f"[{re.escape(seps)}]", value) if p.strip()]
    elif not isinstance(value, list | tuple):
        value = [value]
    return [_local_path(p, key) for p in value]


def _parse_options_factory(key: str, value: Any) -> OptionsFactory | str | None:
    """An options factory's dotted name, checked now so that a typo fails at configuration."""
    if value in (None, ""):
        return None
    resolve_options_factory(value, key)
    return value  # type: ignore[no-any-return]


_TIMER_KEY = "state.backend.rocksdb.timer-service.factory"

#: the RocksDB backend's flat keys (a setting made in code wins over them)
_SETTINGS = (
    Setting("_incremental", ("execution.checkpointing.incremental", "state.backend.incremental")),
    Setting("_paths", ("state.backend.rocksdb.localdir",), _parse_paths),
    Setting("_predefined", ("state.backend.rocksdb.predefined-options",),
            lambda k, v: PredefinedOptions.parse(v, k)),
    Setting("_options_factory", ("state.backend.rocksdb.options-factory",), _parse_options_factory),
    Setting("_threads", (_THREADS_KEY,)),
    Setting("_ttl_filter", ("state.backend.rocksdb.ttl.compaction.filter.enabled",)),
    Setting("_managed", (MANAGED_KEY,)),
    Setting("_fixed_memory", (FIXED_KEY,)),
    Setting("_write_buffer_ratio", (RATIO_KEY,)),
    Setting("_timer_factory", (_TIMER_KEY,)),
    Setting("_lazy", (_LAZY_KEY,)),
    Setting("_changelog", (CHANGELOG_KEY, "state.backend.changelog.enabled")),
    Setting("_materialize", (_MATERIALIZE_KEY,
                             "state.backend.changelog.periodic-materialize.interval")),
    Setting("_log_ratio", (_LOG_RATIO_KEY,)),
)


class EmbeddedRocksDBStateBackend(StateBackend):
    """Working state in embedded RocksDB (via rocksdict): state larger than memory, native snapshots.

    Snapshots are always asynchronous; incremental checkpoints are opt-in, as in Flink.
    """

    name = "rocksdb"
    DEFAULT_TRANSFER_THREADS: int = default(_THREADS_KEY)

    def __init__(self, enable_incremental_checkpointing: bool | None = None, *,
                 lazy_restore: bool | None = None) -> None:
        super().__init__(True)
        self._lazy: bool | None = None if lazy_restore is None else parse_bool(_LAZY_KEY, lazy_restore)
        self._incremental: bool | None = (
            None if enable_incremental_checkpointing is None
            else parse_bool("execution.checkpointing.incremental",
                             enable_incremental_checkpointing)
        )
        self._paths: list[str] | None = None
        self._predefined: PredefinedOptions | None = None
        self._options_factory: OptionsFactory | str | None = None
        self._threads: int | None = None
        self._ttl_filter: bool | None = None
        self._timer_factory: str | None = None
        self._managed: bool | None = None
        self._fixed_memory: int | None = None
        self._write_buffer_ratio: float | None = None
        self._changelog: bool | None = None
        self._materialize: int | None = None
        self._log_ratio: float | None = None
        #: Flink's configurable options set by configuration (full key -> parsed value)
        self._tuning: dict[str, Any] = {}

    # --- PyFlink getters and setters ------------------------------------------------------------

    def is_incremental_checkpoints_enabled(self) -> bool:
        """Whether checkpoints upload only new SST files (default False, as in Flink)."""
        return bool(self._incremental)

    def set_db_storage_paths(self, *paths: str | None) -> None:
        """Local directories for the databases' files, spread across them; None resets the default."""
        if not paths or (len(paths) == 1 and paths[0] is None):
            self._paths = None
            return
        flat: list[Any] = []
        for p in paths:
            flat.extend(p if isinstance(p, list | tuple) else [p])
        self._paths = [_local_path(p) for p in flat]

    def working_roots(self) -> list[str]:
        """Where this backend's instances keep their working directories."""
        return self._paths or [os.path.join(tempfile.gettempdir(), "statekit-rocksdb")]

    def get_db_storage_paths(self) -> list[str] | None:
        """The configured local directories, or None (then the temp directory is used)."""
        return None if self._paths is None else list(self._paths)

    def set_predefined_options(self, options: PredefinedOptions) -> None:
        """Select a pre-tuned option profile (see :class:`PredefinedOptions`)."""
        if options is None:
            raise ConfigError("state.backend.rocksdb.predefined-options", "must not be None")
        predefined = PredefinedOptions.parse(options)
        check_tuning(self._tuning, predefined)
        self._predefined = predefined

    def get_predefined_options(self) -> PredefinedOptions:
        """The option profile in use (``PredefinedOptions.DEFAULT`` unless set)."""
        return self._predefined or PredefinedOptions.DEFAULT

    def set_options(self, options_factory: OptionsFactory | str) -> None:
        """An options factory (callable or dotted name) adjusting rocksdict ``Options`` on top."""
        resolve_options_factory(options_factory)  # fail early on a bad name
        self._options_factory = options_factory

    def get_options(self) -> OptionsFactory | str | None:
        """The options factory as set (callable or dotted name), or None."""
        return self._options_factory

    def set_number_of_transfering_threads(self, number_of_transfering_threads: int) -> None:
        """Threads uploading and downloading files while snapshotting and restoring."""
        self._threads = BY_KEY[_THREADS_KEY].parse(_THREADS_KEY, number_of_transfering_threads)

    def get_number_of_transfering_threads(self) -> int:
        """Threads used to transfer files (default 1); misspelt as PyFlink spells it."""
        return self._threads or self.DEFAULT_TRANSFER_THREADS

    def set_number_of_transfer_threads(self, number_of_transfer_threads: int) -> None:
        """Threads uploading and downloading files (PyFlink's later spelling)."""
        self.set_number_of_transfering_threads(number_of_transfer_threads)

    def get_number_of_transfer_threads(self) -> int:
        """Threads used to transfer files (default 1)."""
        return self.get_number_of_transfering_threads()

    def set_priority_queue_state_type(self, state_type: str) -> None:
        """Where timers live: ``"ROCKSDB"`` (the default: two column families per queue) or
        ``"HEAP"`` (in memory, snapshotted with the checkpoint), Flink's
        ``state.backend.rocksdb.timer-service.factory``."""
        self._timer_factory = BY_KEY[_TIMER_KEY].parse(_TIMER_KEY, state_type)

    def get_priority_queue_state_type(self) -> str:
        return self._timer_factory or str(default(_TIMER_KEY))

    def enable_ttl_compaction_filter(self) -> None:
        """Clean up expired TTL state in the background (the default)."""
        self._ttl_filter = True

    def disable_ttl_compaction_filter(self) -> None:
        """Stop background cleanup of expired TTL state."""
        self._ttl_filter = False

    def is_ttl_compaction_filter_enabled(self) -> bool:
        """Whether expired TTL state is cleaned up in the background (default True)."""
        key = "state.backend.rocksdb.ttl.compaction.filter.enabled"
        return bool(default(key) if self._ttl_filter is None else self._ttl_filter)

    def is_lazy_restore_enabled(self) -> bool:
        """Whether a restore opens the database at once and checks the checkpoint files it
        hard-linked in the background (default True; false checks them before opening)."""
        return bool(default(_LAZY_KEY) if self._lazy is None else self._lazy)

    def is_changelog_enabled(self) -> bool:
        """Whether checkpoints upload the write-ahead log between materializations
        (``state.changelog.enabled``, default False as in Flink)."""
        return bool(self._changelog)

    def get_materialization_interval(self) -> int:
        """Milliseconds between materializations of changelog checkpoints (default 10 min; -1:
        none by time, only by the log's size)."""
        return int(default(_MATERIALIZE_KEY) if self._materialize is None else self._materialize)

    def get_max_log_ratio(self) -> float:
        """Changelog: a materialization once the logs exceed this share of the last one
        (default 0.5: a restore replays at most half the state's size of log)."""
        return float(default(_LOG_RATIO_KEY) if self._log_ratio is None else self._log_ratio)

    def get_memory_configuration(self) -> RocksDBMemoryConfiguration:
        """How much memory this process's RocksDB instances share (Flink's
        ``state.backend.rocksdb.memory.*``: managed by default, 0.5 for write buffers)."""
        return RocksDBMemoryConfiguration(
            bool(default(MANAGED_KEY) if self._managed is None else self._managed),
            self._fixed_memory,
            float(default(RATIO_KEY) if self._write_buffer_ratio is None
                  else self._write_buffer_ratio))

    def set_memory_configuration(self, *, managed: bool | None = None,
                                 fixed_per_slot: int | str | None = None,
                                 write_buffer_ratio: float | None = None) -> None:
        """Bound the memory of this process's RocksDB instances: ``managed`` (one shared budget,
        the default), ``fixed_per_slot`` (the budget in bytes or a size like ``"1 gb"``) and
        ``write_buffer_ratio`` (the share of memtables)."""
        if managed is not None:
            self._managed = BY_KEY[MANAGED_KEY].parse(MANAGED_KEY, managed)
        if fixed_per_slot is not None:
            self._fixed_memory = BY_KEY[FIXED_KEY].parse(FIXED_KEY, fixed_per_slot)
        if write_buffer_ratio is not None:
            self._write_buffer_ratio = BY_KEY[RATIO_KEY].parse(RATIO_KEY, write_buffer_ratio)

    # --- configuration ----------------------------------------------------------------------------

    def configure(self, config: dict[str, Any]) -> EmbeddedRocksDBStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        refuse_keys_of(config, "state.backend.heap.", "hashmap", self.name)
        new = copy.copy(self)
        apply_settings(_SETTINGS, self, new, config)
        new._tuning = {**self._tuning, **{key: BY_KEY[key].parse(key, config[key])
                                          for key in TUNING_KEYS if config.get(key) is not None}}
        check_tuning(new._tuning, new.get_predefined_options())
        return new

    def get_configurable_options(self) -> dict[str, Any]:
        """Flink's configurable RocksDB options set through configuration (``state.backend.
        rocksdb.compaction.style`` and its siblings), applied over the predefined options."""
        return dict(self._tuning)

    # --- keyed backends ---------------------------------------------------------------------------

    def _options_builder(self) -> Callable[[], Options]:
        predefined = self.get_predefined_options()
        factory = resolve_options_factory(self._options_factory)
        memory = shared_memory(self.get_memory_configuration())
        tuning = dict(self._tuning)
        changelog = self.is_changelog_enabled()

        def build() -> Options:
            options = build_options(predefined, factory, memory, tuning)
            if changelog:  # obsolete logs are archived until a checkpoint holds them
                options.set_wal_ttl_seconds(WAL_TTL_SECONDS)
            return options

        return build

    def _instance_dir(self, operator_id: str, key_group_range: KeyGroupRange) -> str:
        roots = self.working_roots()
        root = roots[0] if len(roots) == 1 else random.choice(roots)
        sweep_legacy(root)
        prefix = f"{safe_name(operator_id)[:64]}-kg{key_group_range.start}-{key_group_range.end}-"
        return str(workdirs.create(root, prefix))  # removed on dispose, at exit, or by a sweep

    def create_keyed_state_backend(self, *, key_serializer: TypeSerializer,
                                   key_group_range: KeyGroupRange, max_parallelism: int,
                                   operator_id: str = "op",
                                   clock: Callable[[], int] | None = None
                                   ) -> RocksDBKeyedStateBackend:
        return RocksDBKeyedStateBackend(
            key_serializer, key_group_range, max_parallelism, clock,
            instance_dir=self._instance_dir(operator_id, key_group_range),
            options=self._options_builder(),
            incremental=self.is_incremental_checkpoints_enabled(),
            transfer_threads=self.get_number_of_transfering_threads(),
            ttl_compaction_filter=self.is_ttl_compaction_filter_enabled(),
            timer_factory=self.get_priority_queue_state_type(),
            lazy_restore=self.is_lazy_restore_enabled(),
            changelog=(WalChangelog(self.get_materialization_interval(), self.get_max_log_ratio())
                       if self.is_changelog_enabled() else None),
        )

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(incremental={self.is_incremental_checkpoints_enabled()}, "
                f"predefined_options={self.get_predefined_options().name})")


class RocksDBStateBackend(EmbeddedRocksDBStateBackend):
    """PyFlink's seed facade: embedded RocksDB working state plus file-system checkpoints.

    ``checkpoint_data_uri`` creates an ``FsStateBackend`` the checkpoints are written through;
    ``checkpoint_stream_backend`` supplies one (any backend with a default checkpoint storage).
    """

    def __init__(self, checkpoint_data_uri: str | None = None,
                 enable_incremental_checkpointing: bool | None = None,
                 checkpoint_stream_backend: StateBackend | None = None) -> None:
        super().__init__(enable_incremental_checkpointing)
        if checkpoint_stream_backend is not None:
            if checkpoint_stream_backend.default_checkpoint_storage() is None:
                raise ConfigError("state.checkpoints.dir",
                                  "checkpoint_stream_backend has no checkpoint storage")
            self._checkpoint_backend = checkpoint_stream_backend
        elif checkpoint_data_uri:
            self._checkpoint_backend = FsStateBackend(checkpoint_data_uri)
        else:
            raise ConfigError("state.checkpoints.dir", "RocksDBStateBackend needs "
                              "checkpoint_data_uri or checkpoint_stream_backend")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RocksDBStateBackend:
        """RocksDB working state with file checkpoints under ``state.checkpoints.dir``."""
        return cls(config.get("state.checkpoints.dir")).configure(dict(config))

    def get_checkpoint_backend(self) -> StateBackend:
        """The backend whose checkpoint storage persists this backend's snapshot bytes."""
        return self._checkpoint_backend

    def default_checkpoint_storage(self) -> CheckpointStorage | None:
        return self._checkpoint_backend.default_checkpoint_storage()

    def __repr__(self) -> str:
        return (f"RocksDBStateBackend({self._checkpoint_backend!r}, "
                f"incremental={self.is_incremental_checkpoints_enabled()})")


_swept: set[str] = set()


def sweep_legacy(root: str) -> None:
    """Once per process and root: remove working directories earlier statekit versions left
    (named ``<operator>-kg<a>-<b>-<hex>``, no lock file), idle for 10 minutes, whose database no
    process holds open (RocksDB's own ``LOCK`` file is free)."""
    if root in _swept:
        return
    _swept.add(root)
    workdirs.sweep_unowned(root, r".+-kg\d+-\d+-[0-9a-f]{12}", 600, _database_open)


def _database_open(path: Path) -> bool:
    lock = path / "db" / "LOCK"
    if not lock.exists():
        return False
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True  # another process has the database open
    finally:
        os.close(fd)
    return False
