"""The execution environment: PyFlink's state-related ``StreamExecutionEnvironment`` methods.

Settings come from method calls or flat keys (a dict, ``STATEKIT_*`` environment variables);
the environment resolves them into a state backend and a checkpoint storage when a job runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from statekit import config as cfg
from statekit.backends.base import StateBackend
from statekit.checkpoint.base import CheckpointStorage
from statekit.checkpoint.config import (  # noqa: F401 (storage_from_config: kept importable here)
    CheckpointConfig,
    CheckpointingMode,
    storage_from_config,
)
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.errors import ConfigError, ConfigTypeError
from statekit.registry import backend_registry
from statekit.runtime.batch import MODE_KEY, RuntimeExecutionMode
from statekit.runtime.datastream import DataStream, ProcessedStream
from statekit.runtime.job import LocalJob
from statekit.runtime.outputs import CollectResult
from statekit.runtime.restart import RestartStrategies, RestartStrategyConfiguration
from statekit.runtime.timers import wall_clock_ms
from statekit.serde.keygroups import DEFAULT_MAX_PARALLELISM, UPPER_BOUND_MAX_PARALLELISM
from statekit.serde.types import TypeInformation
from statekit.values import checked_int

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
        self._clock: Callable[[], int] = wall_clock_ms
        self._sinks: list[tuple[ProcessedStream, Callable[[Any], None]]] = []
        self._side_streams: list[ProcessedStream] = []

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
        ``execution.checkpointing.*``, ...) is a typo and raises :class:`ConfigError`.  Each
        part reads its own keys: the checkpoint config, the restart strategies and the backend
        (named through the registry, or the one set in code, configured).
        """
        conf = cfg.validate(cfg.normalize(configuration))
        self._config.update(conf)
        self._checkpoint_config.configure(conf)
        for key, setter in (("parallelism.default", self.set_parallelism),
                            ("pipeline.max-parallelism", self.set_max_parallelism)):
            if conf.get(key) is not None:
                setter(cfg.read(conf, key))
        if conf.get("state.savepoints.dir"):
            self._savepoint_dir = str(conf["state.savepoints.dir"])
        restart = RestartStrategies.from_config(conf)
        if restart is not None:
            self._restart = restart
        if "state.backend.type" in conf:
            self._backend = backend_from_config(conf)
        elif self._backend is not None:
            self._backend = self._backend.configure(conf)
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
        """PyFlink's default savepoint directory (``state.savepoints.dir``), kept for its API.

        In Flink it names where a savepoint goes when one is triggered without a directory; it
        never triggers one.  statekit's one trigger, ``execute_and_collect(savepoint_dir=...)``,
        always names its directory, so a job with this set still takes no savepoint unasked.
        """
        self._savepoint_dir = directory
        return self

    def get_default_savepoint_directory(self) -> str | None:
        """The directory :meth:`set_default_savepoint_directory` or ``state.savepoints.dir`` set."""
        return self._savepoint_dir

    # --- state backend ---------------------------------------------------------------------------

    def set_state_backend(self, state_backend: StateBackend) -> StreamExecutionEnvironment:
        if not isinstance(state_backend, StateBackend):
            raise ConfigError("state.backend.type",
                              f"expected a StateBackend, got {type(state_backend).__name__}")
        # the keys configured so far apply to it too, settings made in code winning (Flink
        # configures the application's backend with the job's configuration)
        self._backend = state_backend.configure(dict(self._config)) if self._config else state_backend
        return self

    def enable_changelog_state_backend(self, enabled: bool) -> StreamExecutionEnvironment:
        """PyFlink's switch for changelog checkpoints (``state.changelog.enabled``): the RocksDB
        backend uploads its write-ahead log between materializations; the heap backend refuses it
        (its changelog is ``state.backend.heap.incremental``)."""
        return self.configure({"state.changelog.enabled": enabled})

    def is_changelog_state_backend_enabled(self) -> bool:
        """Whether ``state.changelog.enabled`` is set (default False, as in Flink)."""
        return bool(cfg.read(self._config, "state.changelog.enabled"))

    def get_state_backend(self) -> StateBackend | None:
        return self._backend

    def resolved_state_backend(self) -> StateBackend:
        """The backend a job uses: the one set, else the default (``hashmap``) configured."""
        if self._backend is None:
            return backend_from_config(self._config)
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
        self._parallelism = checked_int("parallelism.default", parallelism, 1)
        return self

    def get_parallelism(self) -> int:
        return self._parallelism

    def set_max_parallelism(self, max_parallelism: int) -> StreamExecutionEnvironment:
        self._max_parallelism = checked_int("pipeline.max-parallelism", max_parallelism, 1,
                                            UPPER_BOUND_MAX_PARALLELISM)
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

    # --- time --------------------------------------------------------------------------------------

    def set_runtime_mode(self, execution_mode: RuntimeExecutionMode) -> StreamExecutionEnvironment:
        """STREAMING (default), or BATCH: the bounded input processed by key, each key's timers
        fired at its end, without checkpoints (AUTOMATIC is BATCH here: the input is bounded)."""
        if not isinstance(execution_mode, RuntimeExecutionMode):
            raise ConfigTypeError(MODE_KEY, "expected a RuntimeExecutionMode, got "
                                            f"{type(execution_mode).__name__}")
        self._config[MODE_KEY] = execution_mode.name
        return self

    def get_runtime_mode(self) -> RuntimeExecutionMode:
        return RuntimeExecutionMode[cfg.read(self._config, MODE_KEY)]

    def set_processing_time_clock(self, clock: Callable[[], int]) -> StreamExecutionEnvironment:
        """The clock processing-time timers and ``current_processing_time()`` read (epoch
        milliseconds; default: the machine's clock).  A statekit extension: tests drive it
        (``statekit.testing.ManualClock``) to make processing time deterministic."""
        if not callable(clock):
            raise ConfigError("clock", f"expected a function returning milliseconds, got {clock!r}")
        self._clock = clock
        return self

    def get_processing_time_clock(self) -> Callable[[], int]:
        return self._clock

    # --- sources and execution ---------------------------------------------------------------------

    def from_collection(self, collection: Iterable[Any], type_info: TypeInformation | None = None
                        ) -> DataStream:
        """A replayable source over ``collection``; its position is part of every checkpoint.
        Held as a tuple: one the garbage collector stops scanning once it holds plain values."""
        return DataStream(self, tuple(collection), [])

    def register_sink(self, stream: ProcessedStream, sink: Callable[[Any], None]) -> None:
        """Remember a stream that ends in ``sink`` (``ProcessedStream.add_sink``) for
        :meth:`execute`."""
        self._sinks.append((stream, sink))

    def register_side_output(self, stream: ProcessedStream) -> None:
        """Remember a stream whose side output has a sink, so :meth:`execute` runs it even
        without a sink of its own."""
        if all(s is not stream for s in self._side_streams):
            self._side_streams.append(stream)

    def take_sinks(self) -> list[tuple[ProcessedStream, Callable[[Any], None] | None]]:
        """The streams registered with their sinks (or run for their side outputs' sinks
        alone), forgotten here: each runs once."""
        sinks: list[tuple[ProcessedStream, Callable[[Any], None] | None]] = list(self._sinks)
        sinks += [(s, None) for s in self._side_streams if all(s is not m for m, _ in sinks)]
        self._sinks, self._side_streams = [], []
        return sinks

    def execute(self, job_name: str | None = None) -> list[CollectResult]:
        """Run every stream that ends in ``add_sink`` (or has a side output that does), each
        as its own job."""
        return [LocalJob(stream, job_name, None, None, sink=sink).run()
                for stream, sink in self.take_sinks()]


def backend_from_config(conf: Mapping[str, Any]) -> StateBackend:
    """The backend ``state.backend.type`` names (default ``hashmap``; a registry name or dotted
    path), built by the registry from the flat keys ``conf``."""
    name = conf.get("state.backend.type") or cfg.default("state.backend.type")
    return backend_registry.create(str(name).strip(), conf, StateBackend)
