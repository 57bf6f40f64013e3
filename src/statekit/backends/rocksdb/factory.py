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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocksdict import Options

from statekit import workdirs
from statekit.backends.base import StateBackend
from statekit.backends.legacy import FsStateBackend
from statekit.backends.rocksdb.backend import RocksDBKeyedStateBackend
from statekit.backends.rocksdb.options import (
    OptionsFactory,
    PredefinedOptions,
    build_options,
    resolve_options_factory,
)
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.streams import safe_name
from statekit.errors import ConfigError
from statekit.serde.keygroups import KeyGroupRange
from statekit.serde.serializers import TypeSerializer
from statekit.values import parse_bool, parse_int


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


class EmbeddedRocksDBStateBackend(StateBackend):
    """Working state in embedded RocksDB (via rocksdict): state larger than memory, native snapshots.

    Snapshots are always asynchronous; incremental checkpoints are opt-in, as in Flink.
    """

    name = "rocksdb"
    DEFAULT_TRANSFER_THREADS = 1

    def __init__(self, enable_incremental_checkpointing: bool | None = None) -> None:
        super().__init__(True)
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
        self._predefined = PredefinedOptions.parse(options)

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
        self._threads = self._parse_threads(number_of_transfering_threads)

    def get_number_of_transfering_threads(self) -> int:
        """Threads used to transfer files (default 1); misspelt as PyFlink spells it."""
        return self._threads or self.DEFAULT_TRANSFER_THREADS

    def enable_ttl_compaction_filter(self) -> None:
        """Clean up expired TTL state in the background (the default)."""
        self._ttl_filter = True

    def disable_ttl_compaction_filter(self) -> None:
        """Stop background cleanup of expired TTL state."""
        self._ttl_filter = False

    def is_ttl_compaction_filter_enabled(self) -> bool:
        """Whether expired TTL state is cleaned up in the background (default True)."""
        return True if self._ttl_filter is None else self._ttl_filter

    @staticmethod
    def _parse_threads(value: Any) -> int:
        key = "state.backend.rocksdb.checkpoint.transfer.thread.num"
        n = parse_int(key, value)
        if n < 1:
            raise ConfigError(key, f"expected a positive number of threads, got {value!r}")
        return n

    # --- configuration ----------------------------------------------------------------------------

    def configure(self, config: dict[str, Any]) -> EmbeddedRocksDBStateBackend:
        """A copy with flat configuration keys applied; settings made in code take precedence."""
        new = copy.copy(self)
        for key in ("execution.checkpointing.incremental", "state.backend.incremental"):
            if key in config and self._incremental is None:
                new._incremental = parse_bool(key, config[key])
                break
        key = "state.backend.rocksdb.localdir"
        if key in config and self._paths is None and config[key] not in (None, ""):
            value = config[key]
            if isinstance(value, str):
                seps = ",;" if "://" in value else ",;" + os.pathsep
                value = [p for p in re.split(f"[{re.escape(seps)}]", value) if p.strip()]
            elif not isinstance(value, list | tuple):
                value = [value]
            new._paths = [_local_path(p, key) for p in value]
        key = "state.backend.rocksdb.predefined-options"
        if key in config and self._predefined is None:
            new._predefined = PredefinedOptions.parse(config[key], key)
        key = "state.backend.rocksdb.options-factory"
        if key in config and self._options_factory is None and config[key] not in (None, ""):
            resolve_options_factory(config[key], key)
            new._options_factory = config[key]
        key = "state.backend.rocksdb.checkpoint.transfer.thread.num"
        if key in config and self._threads is None:
            new._threads = self._parse_threads(config[key])
        key = "state.backend.rocksdb.ttl.compaction.filter.enabled"
        if key in config and self._ttl_filter is None:
            new._ttl_filter = parse_bool(key, config[key])
        return new

    # --- keyed backends ---------------------------------------------------------------------------

    def _options_builder(self) -> Callable[[], Options]:
        predefined = self.get_predefined_options()
        factory = resolve_options_factory(self._options_factory)

        def build() -> Options:
            return build_options(predefined, factory)

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
