"""The execution environment: PyFlink's state-related ``StreamExecutionEnvironment`` methods.

Settings come from method calls or flat keys (a dict, ``STATEKIT_*`` environment variables);
the environment resolves them into a state backend and a checkpoint storage when a job runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from statekit import config as cfg
from statekit.backends.base import StateBackend
from statekit.checkpoint.config import (
    CheckpointConfig,
    CheckpointingMode,
    ExternalizedCheckpointCleanup,
)
from statekit.checkpoint.storage import (
    CheckpointStorage,
    FileSystemCheckpointStorage,
    JobManagerCheckpointStorage,
)
from statekit.errors import ConfigError
from statekit.registry import backend_registry, storage_registry
from statekit.runtime.restart import RestartStrategies, RestartStrategyConfiguration
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, UPPER_BOUND_MAX_PARALLELISM
from statekit.serde.types import TypeInformation

DEFAULT_RESTART = RestartStrategies.fixed_delay_restart(3, 0)


class StreamExecutionEnvironment:
    """The context a job runs in; holds checkpointing, state backend and parallelism settings."""

    def __init__(self) -> None:
        self._checkpoint_config = CheckpointConfig()
        self._backend: StateBackend | None = None
        self._parallelism = os.cpu_count() or 1
        self._max_parallelism = -1
        self._restart: RestartStrategyConfiguration | None = None
        self._savepoint_dir: str | None = None
        self._config: dict[str, Any] = {}

    @staticmethod
    def get_execution_environment(config: Mapping[str, Any] | None = None
                                  ) -> StreamExecutionEnvironment:
        """A fresh environment with defaults, ``STATEKIT_*`` variables, then ``config`` applied."""
        env = StreamExecutionEnvironment()
        env.configure({**cfg.from_env(), **cfg.normalize(config)})
        return env

    # --- flat configuration ---------------------------------------------------------------------

    def configure(self, configuration: Mapping[str, Any]) -> StreamExecutionEnvironment:
        """Apply flat Flink keys (canonical names or aliases).

        Keys outside statekit's namespaces are the job's own parameters
        (``RuntimeContext.get_job_parameter``); an unknown key inside them (``state.*``,
        ``execution.checkpointing.*``, ...) is a typo and raises :class:`ConfigError`.
        """
        conf = cfg.validate(cfg.normalize(configuration))
        self._config.update(conf)
        cc = self._checkpoint_config
        interval = cfg.get(conf, "execution.checkpointing.interval", cfg.parse_duration_ms)
        if interval is not None:
            cc.set_checkpoint_interval(interval)
        modes = {m.name: m for m in CheckpointingMode}
        mode = cfg.get(conf, "execution.checkpointing.mode", lambda k, v: cfg.parse_enum(k, v, modes))
        if mode is not None:
            cc.set_checkpointing_mode(mode)
        setters = [
            ("execution.checkpointing.timeout", cfg.parse_duration_ms, cc.set_checkpoint_timeout),
            ("execution.checkpointing.min-pause", cfg.parse_duration_ms,
             cc.set_min_pause_between_checkpoints),
            ("execution.checkpointing.max-concurrent-checkpoints", cfg.parse_int,
             cc.set_max_concurrent_checkpoints),
            ("execution.checkpointing.tolerable-failed-checkpoints", cfg.parse_int,
             cc.set_tolerable_checkpoint_failure_number),
            ("execution.checkpointing.prefer-checkpoint-for-recovery", cfg.parse_bool,
             cc.set_prefer_checkpoint_for_recovery),
            ("execution.checkpointing.unaligned", cfg.parse_bool, cc.enable_unaligned_checkpoints),
            ("state.checkpoints.num-retained", cfg.parse_int, cc.set_num_retained_checkpoints),
            ("parallelism.default", cfg.parse_int, self.set_parallelism),
            ("pipeline.max-parallelism", cfg.parse_int, self.set_max_parallelism),
        ]
        for key, parse, setter in setters:
            value = cfg.get(conf, key, parse)
            if value is not None:
                setter(value)
        cleanups = {c.name: c for c in ExternalizedCheckpointCleanup}
        cleanup = cfg.get(conf, "execution.checkpointing.externalized-checkpoint-retention",
                          lambda k, v: cfg.parse_enum(k, v, cleanups))
        if cleanup is not None:
            cc.set_externalized_checkpoint_cleanup(cleanup)
        if conf.get("state.savepoints.dir"):
            self._savepoint_dir = str(conf["state.savepoints.dir"])
        restart = _restart_from_config(conf)
        if restart is not None:
            self._restart = restart
        if "state.backend.type" in conf:
            self._backend = backend_from_config(conf)
        elif self._backend is not None:
            self._backend = self._backend.configure(conf)
        if "state.checkpoint-storage" in conf or "state.checkpoints.dir" in conf:
            cc._storage = storage_from_config(conf)  # explicit keys win over earlier settings
        return self

    def get_configuration(self) -> dict[str, Any]:
        """The flat keys applied so far (canonical names)."""
        return dict(self._config)

    # --- checkpointing ------------------------------------------------------------------------------

    def enable_checkpointing(self, interval: int, mode: CheckpointingMode | None = None
                             ) -> StreamExecutionEnvironment:
        self._checkpoint_config.set_checkpoint_interval(interval)
        if mode is not None:
            self._checkpoint_config.set_checkpointing_mode(mode)
        return self

    def get_checkpoint_config(self) -> CheckpointConfig:
        return self._checkpoint_config

    def get_checkpoint_interval(self) -> int:
        return self._checkpoint_config.get_checkpoint_interval()

    def get_checkpointing_mode(self) -> CheckpointingMode:
        return self._checkpoint_config.get_checkpointing_mode()

    def set_default_savepoint_directory(self, directory: str) -> StreamExecutionEnvironment:
        self._savepoint_dir = directory
        return self

    def get_default_savepoint_directory(self) -> str | None:
        return self._savepoint_dir

    # --- state backend ---------------------------------------------------------------------------

    def set_state_backend(self, state_backend: StateBackend) -> StreamExecutionEnvironment:
        if not isinstance(state_backend, StateBackend):
            raise ConfigError("state.backend.type",
                              f"expected a StateBackend, got {type(state_backend).__name__}")
        self._backend = state_backend
        return self

    def get_state_backend(self) -> StateBackend | None:
        return self._backend

    def resolved_state_backend(self) -> StateBackend:
        """The backend a job uses: the one set, else ``hashmap``."""
        if self._backend is None:
            from statekit.backends.heap import HashMapStateBackend

            return HashMapStateBackend().configure(self._config)
        return self._backend

    def resolved_checkpoint_storage(self) -> CheckpointStorage:
        """Explicit storage, else the legacy backend's, else JobManager (as Flink decides)."""
        explicit = self._checkpoint_config.get_checkpoint_storage()
        if explicit is not None:
            return explicit
        implied = self.resolved_state_backend().default_checkpoint_storage()
        if implied is not None:
            return implied
        return JobManagerCheckpointStorage()

    # --- parallelism and restarts ------------------------------------------------------------------

    def set_parallelism(self, parallelism: int) -> StreamExecutionEnvironment:
        if int(parallelism) < 1:
            raise ConfigError("parallelism.default", "must be at least 1")
        self._parallelism = int(parallelism)
        return self

    def get_parallelism(self) -> int:
        return self._parallelism

    def set_max_parallelism(self, max_parallelism: int) -> StreamExecutionEnvironment:
        if not 0 < int(max_parallelism) <= UPPER_BOUND_MAX_PARALLELISM:
            raise ConfigError("pipeline.max-parallelism",
                              f"must be in 1..{UPPER_BOUND_MAX_PARALLELISM}")
        self._max_parallelism = int(max_parallelism)
        return self

    def get_max_parallelism(self) -> int:
        """The configured max parallelism, or -1 when unset (then 128 is used)."""
        return self._max_parallelism

    def effective_max_parallelism(self) -> int:
        return self._max_parallelism if self._max_parallelism > 0 else DEFAULT_MAX_PARALLELISM

    def set_restart_strategy(self, restart_strategy_configuration: RestartStrategyConfiguration
                             ) -> StreamExecutionEnvironment:
        self._restart = restart_strategy_configuration
        return self

    def get_restart_strategy(self) -> RestartStrategyConfiguration:
        """The strategy set, else no restart without checkpointing and fixed-delay(3, 0) with it."""
        if self._restart is not None and self._restart.kind != "fallback":
            return self._restart
        if self._checkpoint_config.is_checkpointing_enabled():
            return DEFAULT_RESTART
        return RestartStrategies.no_restart()

    # --- sources and execution ---------------------------------------------------------------------

    def from_collection(self, collection: Iterable[Any], type_info: TypeInformation | None = None
                        ) -> Any:
        """A replayable source over ``collection``; its position is part of every checkpoint."""
        from statekit.runtime.local import DataStream

        return DataStream(self, list(collection), [])

    def execute(self, job_name: str | None = None) -> Any:
        """Run every stream that ends in ``add_sink``."""
        from statekit.runtime.local import run_sinks

        return run_sinks(self, job_name)


def backend_from_config(conf: Mapping[str, Any]) -> StateBackend:
    """The backend named by ``state.backend.type`` (a registry name or dotted path), configured."""
    name = str(conf["state.backend.type"]).strip()
    legacy = name.lower()
    if legacy == "jobmanager":
        from statekit.backends.legacy import MemoryStateBackend

        return MemoryStateBackend(conf.get("state.checkpoints.dir"),
                                  conf.get("state.savepoints.dir"))
    if legacy == "filesystem":
        from statekit.backends.legacy import FsStateBackend

        if not conf.get("state.checkpoints.dir"):
            raise ConfigError("state.backend.type",
                              "'filesystem' needs state.checkpoints.dir to be set")
        return FsStateBackend(str(conf["state.checkpoints.dir"]), conf.get("state.savepoints.dir"))
    target = backend_registry.resolve(name)
    backend = target() if callable(target) else target
    if not isinstance(backend, StateBackend):
        raise ConfigError("state.backend.type",
                          f"{name!r} does not create a statekit StateBackend")
    return backend.configure(dict(conf))


def storage_from_config(conf: Mapping[str, Any]) -> CheckpointStorage:
    """The checkpoint storage named by ``state.checkpoint-storage`` / implied by the directory."""
    directory = conf.get("state.checkpoints.dir")
    name = str(conf.get("state.checkpoint-storage") or ("filesystem" if directory else "jobmanager"))
    if name.lower() == "jobmanager":
        max_size = cfg.get(conf, "state.checkpoint-storage.jobmanager.max-state-size", cfg.parse_size)
        return JobManagerCheckpointStorage(directory, max_size)
    if name.lower() == "filesystem":
        if not directory:
            raise ConfigError("state.checkpoint-storage",
                              "'filesystem' needs state.checkpoints.dir to be set")
        return FileSystemCheckpointStorage(
            str(directory),
            cfg.get(conf, "state.storage.fs.memory-threshold", cfg.parse_size),
            cfg.get(conf, "state.storage.fs.write-buffer-size", cfg.parse_size),
            savepoint_path=conf.get("state.savepoints.dir"),
        ).configure(dict(conf))
    target = storage_registry.resolve(name)
    storage = target() if callable(target) else target
    if not isinstance(storage, CheckpointStorage):
        raise ConfigError("state.checkpoint-storage",
                          f"{name!r} does not create a statekit CheckpointStorage")
    return storage.configure(dict(conf))


def _restart_from_config(conf: Mapping[str, Any]) -> RestartStrategyConfiguration | None:
    kind = conf.get("restart-strategy.type")
    if kind is None:
        return None
    kind = str(kind).strip().lower().replace("_", "-")
    if kind in ("none", "off", "disable"):
        return RestartStrategies.no_restart()
    if kind in ("fixed-delay", "fixeddelay"):
        return RestartStrategies.fixed_delay_restart(
            cfg.get(conf, "restart-strategy.fixed-delay.attempts", cfg.parse_int, 1),
            cfg.get(conf, "restart-strategy.fixed-delay.delay", cfg.parse_duration_ms, 1000),
        )
    if kind in ("failure-rate", "failurerate"):
        return RestartStrategies.failure_rate_restart(
            cfg.get(conf, "restart-strategy.failure-rate.max-failures-per-interval",
                    cfg.parse_int, 1),
            cfg.get(conf, "restart-strategy.failure-rate.failure-rate-interval",
                    cfg.parse_duration_ms, 60_000),
            cfg.get(conf, "restart-strategy.failure-rate.delay", cfg.parse_duration_ms, 1000),
        )
    raise ConfigError("restart-strategy.type",
                      f"expected none, fixed-delay or failure-rate, got {kind!r}")
