"""PyFlink-style configuration: constructors, getters, setters, defaults and flat keys."""

import pytest

from statekit import (
    CheckpointConfig,
    CheckpointingMode,
    CustomCheckpointStorage,
    CustomStateBackend,
    ExternalizedCheckpointCleanup,
    FileSystemCheckpointStorage,
    FsStateBackend,
    HashMapStateBackend,
    JobManagerCheckpointStorage,
    MemoryStateBackend,
    RestartStrategies,
    StreamExecutionEnvironment,
)
from statekit import config as cfg
from statekit.errors import ConfigError, UnknownPluginError


def test_checkpoint_config_defaults_and_setters():
    c = CheckpointConfig()
    assert CheckpointConfig.DEFAULT_MODE == CheckpointingMode.EXACTLY_ONCE
    assert CheckpointConfig.DEFAULT_TIMEOUT == 600000
    assert CheckpointConfig.DEFAULT_MIN_PAUSE_BETWEEN_CHECKPOINTS == 0
    assert CheckpointConfig.DEFAULT_MAX_CONCURRENT_CHECKPOINTS == 1
    assert not c.is_checkpointing_enabled() and c.get_checkpoint_interval() == -1
    assert c.get_checkpoint_timeout() == 600000
    assert c.get_tolerable_checkpoint_failure_number() == 0
    assert c.is_fail_on_checkpointing_errors()
    assert not c.is_externalized_checkpoints_enabled()
    assert c.get_externalized_checkpoint_cleanup() is None
    assert not c.is_prefer_checkpoint_for_recovery()
    c.set_checkpoint_interval(1000).set_checkpointing_mode(CheckpointingMode.AT_LEAST_ONCE)
    c.set_checkpoint_timeout(5000).set_min_pause_between_checkpoints(10)
    c.set_max_concurrent_checkpoints(3).set_tolerable_checkpoint_failure_number(2)
    c.enable_externalized_checkpoints(ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION)
    c.set_prefer_checkpoint_for_recovery(True)
    c.enable_unaligned_checkpoints()
    c.set_alignment_timeout(250)
    c.set_force_unaligned_checkpoints(True)
    assert (c.get_checkpoint_interval(), c.get_checkpoint_timeout()) == (1000, 5000)
    assert c.get_checkpointing_mode() == CheckpointingMode.AT_LEAST_ONCE
    assert c.get_min_pause_between_checkpoints() == 10 and c.get_max_concurrent_checkpoints() == 3
    assert c.get_tolerable_checkpoint_failure_number() == 2
    assert c.get_externalized_checkpoint_cleanup() == ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION
    assert c.is_prefer_checkpoint_for_recovery() and c.is_unaligned_checkpoints_enabled()
    assert c.get_alignment_timeout().total_seconds() == 0.25 and c.is_force_unaligned_checkpoints()
    c.set_fail_on_checkpointing_errors(False)
    assert not c.is_fail_on_checkpointing_errors()
    c.set_checkpoint_storage_dir("/tmp/x/")
    assert isinstance(c.get_checkpoint_storage(), FileSystemCheckpointStorage)
    c.set_checkpoint_storage(JobManagerCheckpointStorage())
    assert isinstance(c.get_checkpoint_storage(), JobManagerCheckpointStorage)
    with pytest.raises(ConfigError):
        c.set_max_concurrent_checkpoints(0)


def test_fail_on_errors_false_means_unlimited_tolerance():
    c = CheckpointConfig().set_fail_on_checkpointing_errors(False)
    assert c.get_tolerable_checkpoint_failure_number() == 2**31 - 1


def test_backend_facades():
    m = MemoryStateBackend()
    assert m.get_max_state_size() == MemoryStateBackend.DEFAULT_MAX_STATE_SIZE == 5 * 1024 * 1024
    assert m.is_using_asynchronous_snapshots()
    assert MemoryStateBackend(max_state_size=10, using_asynchronous_snapshots=False
                              ).get_max_state_size() == 10
    assert not MemoryStateBackend(using_asynchronous_snapshots=False).is_using_asynchronous_snapshots()
    f = FsStateBackend("file:///tmp/ck/")
    assert f.get_checkpoint_path() == "file:///tmp/ck"
    assert f.get_min_file_size_threshold() == 1024
    assert f.get_write_buffer_size() == 4096
    assert FsStateBackend("/tmp/ck", file_state_size_threshold=2048,
                          write_buffer_size=8192).get_write_buffer_size() == 8192
    assert isinstance(f.default_checkpoint_storage(), FileSystemCheckpointStorage)
    assert isinstance(m.default_checkpoint_storage(), JobManagerCheckpointStorage)
    custom = CustomStateBackend("statekit.backends.heap.HashMapStateBackend")
    assert custom.name == "hashmap"
    with pytest.raises(ConfigError):
        CustomStateBackend(object())


def test_storage_constructors():
    jm = JobManagerCheckpointStorage()
    assert JobManagerCheckpointStorage.DEFAULT_MAX_STATE_SIZE == 5 * 1024 * 1024
    assert jm.get_max_state_size() == 5 * 1024 * 1024 and jm.get_checkpoint_path() is None
    assert JobManagerCheckpointStorage("/tmp/a/", 100).get_savepoint_path() == "/tmp/a"
    fs = FileSystemCheckpointStorage("/tmp/b")
    assert fs.get_min_file_size_threshold() == 20480 and fs.get_write_buffer_size() == 4096
    with pytest.raises(ConfigError, match="inline-threshold"):
        FileSystemCheckpointStorage("/tmp/b", file_state_size_threshold=2 * 1024 * 1024)
    assert isinstance(CustomCheckpointStorage(fs).storage, FileSystemCheckpointStorage)


def test_environment_methods_and_fresh_defaults():
    env = StreamExecutionEnvironment.get_execution_environment()
    assert env.get_checkpoint_interval() == -1
    env.enable_checkpointing(300000, CheckpointingMode.AT_LEAST_ONCE)
    assert env.get_checkpoint_interval() == 300000
    assert env.get_checkpointing_mode() == CheckpointingMode.AT_LEAST_ONCE
    env.set_state_backend(HashMapStateBackend()).set_parallelism(3).set_max_parallelism(64)
    assert isinstance(env.get_state_backend(), HashMapStateBackend)
    assert (env.get_parallelism(), env.get_max_parallelism()) == (3, 64)
    env.set_restart_strategy(RestartStrategies.fixed_delay_restart(5, 100))
    assert env.get_restart_strategy().attempts == 5
    fresh = StreamExecutionEnvironment.get_execution_environment()
    assert fresh.get_checkpoint_interval() == -1 and fresh.get_state_backend() is None
    assert fresh.get_max_parallelism() == -1 and fresh.effective_max_parallelism() == 128


def test_flat_keys_and_aliases(tmp_path):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": "hashmap",
        "execution.checkpointing.dir": str(tmp_path),  # Flink 2 alias of state.checkpoints.dir
        "execution.checkpointing.interval": "2 s",
        "execution.checkpointing.mode": "AT_LEAST_ONCE",
        "execution.checkpointing.timeout": "1 min",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "3",
        "execution.checkpointing.data-inline-threshold": "1 kb",
        "state.backend.incremental": "false",
        "execution.state-recovery.path": "/somewhere/chk-3",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "4",
        "parallelism.default": 2,
    })
    cc = env.get_checkpoint_config()
    assert cc.get_checkpoint_interval() == 2000 and cc.get_checkpoint_timeout() == 60000
    assert cc.get_checkpointing_mode() == CheckpointingMode.AT_LEAST_ONCE
    assert cc.get_num_retained_checkpoints() == 3
    storage = env.resolved_checkpoint_storage()
    assert isinstance(storage, FileSystemCheckpointStorage)
    assert storage.get_min_file_size_threshold() == 1024
    assert env.get_configuration()["execution.savepoint.path"] == "/somewhere/chk-3"
    assert env.get_restart_strategy().attempts == 4 and env.get_parallelism() == 2
    assert isinstance(env.resolved_state_backend(), HashMapStateBackend)


def test_a_key_and_its_alias_set_differently_is_refused():
    """Both spellings of one option in one configuration: one of them would be dropped."""
    with pytest.raises(ConfigError, match=r"^state\.backend\.changelog\.enabled: .*state\.changelog"
                       r"\.enabled is set to 'true': they name the same option"):
        StreamExecutionEnvironment.get_execution_environment({
            "state.changelog.enabled": "true", "state.backend.changelog.enabled": "false"})
    with pytest.raises(ConfigError, match="same option"):
        StreamExecutionEnvironment.get_execution_environment({
            "state.backend": "rocksdb", "state.backend.type": "hashmap"})
    env = StreamExecutionEnvironment.get_execution_environment({  # the same value: fine
        "state.checkpoints.num-retained": "2", "execution.checkpointing.num-retained": 2,
        "state.changelog.periodic-materialize.interval": "10 min",
        "state.backend.changelog.periodic-materialize.interval": "600 s"})
    assert env.get_checkpoint_config().get_num_retained_checkpoints() == 2


def test_legacy_backend_names(tmp_path):
    env = StreamExecutionEnvironment.get_execution_environment(
        {"state.backend": "filesystem", "state.checkpoints.dir": str(tmp_path)})
    assert isinstance(env.get_state_backend(), FsStateBackend)
    env = StreamExecutionEnvironment.get_execution_environment({"state.backend.type": "jobmanager"})
    assert isinstance(env.resolved_checkpoint_storage(), JobManagerCheckpointStorage)


def test_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("STATEKIT_STATE_CHECKPOINTS_DIR", str(tmp_path))
    monkeypatch.setenv("STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL", "500ms")
    env = StreamExecutionEnvironment.get_execution_environment()
    assert env.get_checkpoint_interval() == 500
    assert env.resolved_checkpoint_storage().get_checkpoint_path() == str(tmp_path)
    # an explicit dict wins over the environment
    env = StreamExecutionEnvironment.get_execution_environment(
        {"execution.checkpointing.interval": "1 s"})
    assert env.get_checkpoint_interval() == 1000
    assert cfg.env_name("state.backend.type") == "STATEKIT_STATE_BACKEND_TYPE"


def test_a_malformed_environment_value_fails_even_when_the_job_overrides_it(monkeypatch):
    """Every STATEKIT_* variable is checked, named as written, on the local runner as on Spark:
    one the job's dict overrides was accepted and never looked at."""
    monkeypatch.setenv("STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL", "-3s")
    with pytest.raises(ConfigError) as info:
        StreamExecutionEnvironment.get_execution_environment(
            {"execution.checkpointing.interval": "1 s"})
    assert info.value.key == "STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL"
    assert "cannot be negative, got '-3s'" in str(info.value)
    monkeypatch.delenv("STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL")
    monkeypatch.setenv("STATEKIT_STATE_BACKEND_TYPE", "rocksbd")  # a backend name: resolved too
    with pytest.raises(UnknownPluginError, match="STATEKIT_STATE_BACKEND_TYPE: unknown name "
                                                 "'rocksbd'; did you mean 'rocksdb'"):
        StreamExecutionEnvironment.get_execution_environment({"state.backend.type": "hashmap"})


@pytest.mark.parametrize("conf, key", [
    ({"state.backend.type": "nosuchbackend"}, "state.backend.type"),
    ({"state.backend.type": "no.such.module.Backend"}, "state.backend.type"),
    ({"state.checkpoint-storage": "tape"}, "state.checkpoint-storage"),
    ({"execution.checkpointing.interval": "soon"}, "execution.checkpointing.interval"),
    ({"execution.checkpointing.mode": "MAYBE_ONCE"}, "execution.checkpointing.mode"),
    ({"parallelism.default": "two"}, "parallelism.default"),
    ({"execution.checkpointing.unaligned": "perhaps"}, "execution.checkpointing.unaligned"),
    ({"state.checkpoint-storage": "filesystem"}, "state.checkpoint-storage"),
    ({"restart-strategy.type": "sometimes"}, "restart-strategy.type"),
])
def test_malformed_values_name_the_key(conf, key):
    with pytest.raises(ConfigError) as info:
        StreamExecutionEnvironment.get_execution_environment(conf)
    assert info.value.key == key and key in str(info.value)


def test_unknown_backend_is_a_typed_error_listing_known_names():
    with pytest.raises(UnknownPluginError, match="hashmap"):
        StreamExecutionEnvironment.get_execution_environment({"state.backend.type": "rocks"})


def test_plugin_registration():
    from statekit.registry import backend_registry

    class MyBackend(HashMapStateBackend):
        name = "mine"

    backend_registry.register("mine", MyBackend)
    env = StreamExecutionEnvironment.get_execution_environment({"state.backend.type": "mine"})
    assert isinstance(env.get_state_backend(), MyBackend)


def test_documented_defaults_are_the_defaults_readers_get():
    from statekit import config

    assert cfg.OPTIONS is config.OPTIONS  # the old module path re-exports the ground-floor table
    for option in config.OPTIONS:
        if not option.described:
            assert option.read({}) == option.parse(option.key, option.default), option.key
    assert config.read({}, "execution.checkpointing.timeout") == CheckpointConfig.DEFAULT_TIMEOUT
    assert config.read({"pipeline.max-parallelism": "64"}, "pipeline.max-parallelism") == 64
    assert config.default("state.checkpoints.dir") is None
    with pytest.raises(ConfigError):
        config.read({"state.changelog.materialize-every-batches": "0"},
                    "state.changelog.materialize-every-batches")


def test_every_name_goes_through_the_registry(tmp_path):
    from statekit.checkpoint.config import storage_from_config
    from statekit.registry import backend_registry, storage_registry
    from statekit.runtime.environment import backend_from_config

    assert backend_registry.resolve("jobmanager") is MemoryStateBackend
    assert backend_registry.resolve("filesystem") is FsStateBackend
    conf = {"state.checkpoints.dir": str(tmp_path), "state.backend.incremental": "true"}
    fs = backend_from_config({**conf, "state.backend.type": "filesystem"})
    assert isinstance(fs, FsStateBackend) and fs.is_incremental_checkpoints_enabled()
    assert type(backend_from_config({})) is HashMapStateBackend  # the table's default name
    assert isinstance(storage_registry.create("filesystem", conf, FileSystemCheckpointStorage),
                      FileSystemCheckpointStorage)
    jm = storage_from_config({"state.checkpoint-storage.jobmanager.max-state-size": "1 kb"})
    assert isinstance(jm, JobManagerCheckpointStorage) and jm.get_max_state_size() == 1024
    with pytest.raises(ConfigError, match="wraps"):
        CustomStateBackend.from_config({})


def test_a_missing_optional_dependency_names_what_to_install():
    from statekit.errors import MissingDependencyError
    from statekit.registry import PluginRegistry

    registry = PluginRegistry("statekit.test", "state.backend.type", {
        "absent": {"class": "no_such_module_here:Backend", "err": "pip install no-such-module"},
    })
    with pytest.raises(MissingDependencyError, match="pip install no-such-module") as info:
        registry.resolve("absent")
    assert isinstance(info.value, ImportError) and info.value.key == "state.backend.type"


def test_configure_returns_a_configured_copy(tmp_path):
    storage = FileSystemCheckpointStorage(str(tmp_path))
    configured = storage.configure({"state.storage.fs.multipart-threshold": "1 mb",
                                    "state.storage.fs.retries": "1"})
    assert configured is not storage and configured.multipart_threshold == 1 << 20
    assert storage.multipart_threshold is None and storage.retry.retries == 4
    assert configured.retry.retries == 1
    # a setting made in code wins over the flat key
    given = FileSystemCheckpointStorage(str(tmp_path), multipart_threshold=5 << 20)
    assert given.configure({"state.storage.fs.multipart-threshold": "1 mb"}
                           ).multipart_threshold == 5 << 20
    heap = HashMapStateBackend()
    assert heap.configure({"state.backend.heap.transfer.thread.num": "3"}
                          ).get_number_of_transfering_threads() == 3
    assert heap.get_number_of_transfering_threads() == 1


def test_checkpoint_config_reads_its_own_keys(tmp_path):
    c = CheckpointConfig()
    assert c.configure({"execution.checkpointing.interval": "1 s",
                        "execution.checkpointing.mode": "at-least-once",
                        "execution.checkpointing.externalized-checkpoint-retention":
                            "RETAIN_ON_CANCELLATION",
                        "state.checkpoints.dir": str(tmp_path)}) is c
    assert c.get_checkpoint_interval() == 1000
    assert c.get_checkpointing_mode() == CheckpointingMode.AT_LEAST_ONCE
    assert c.get_externalized_checkpoint_cleanup() == ExternalizedCheckpointCleanup.RETAIN_ON_CANCELLATION
    assert isinstance(c.get_checkpoint_storage(), FileSystemCheckpointStorage)
    with pytest.raises(ConfigError) as info:
        c.configure({"execution.checkpointing.timeout": "soon"})
    assert info.value.key == "execution.checkpointing.timeout"


def test_pyflink_names_that_used_to_fail():
    """PyFlink names that raised at run time: each works and means what PyFlink means."""
    import datetime as dt

    from statekit import (
        AggregateFunction,
        AggregatingStateDescriptor,
        ReducingStateDescriptor,
        StateTtlConfig,
        Time,
        Types,
    )
    from statekit.backends.rocksdb import EmbeddedRocksDBStateBackend
    from statekit.runtime.functions import RuntimeContext

    rocks = EmbeddedRocksDBStateBackend()
    rocks.set_number_of_transfer_threads(3)
    assert rocks.get_number_of_transfer_threads() == 3 == rocks.get_number_of_transfering_threads()
    ttl = (StateTtlConfig.new_builder(Time.seconds(1))
           .cleanup_in_rocksdb_compact_filter(500, Time.hours(1)).build())
    strategies = ttl.get_cleanup_strategies()
    assert strategies.get_rocksdb_compact_filter_cleanup_strategy() == 500
    assert strategies.get_periodic_compaction_time() == 3_600_000
    reduce = ReducingStateDescriptor("r", lambda a, b: a + b, Types.LONG())
    assert reduce.get_reduce_function()(2, 3) == 5

    class Avg(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, accumulator):
            return accumulator + value

        def get_result(self, accumulator):
            return accumulator

    agg = Avg()
    assert AggregatingStateDescriptor("a", agg, Types.LONG()).get_agg_function() is agg
    context = RuntimeContext(None, "keyed-process", 1, 4, 128, attempt=2)
    assert context.get_task_name_with_subtasks() == "keyed-process (2/4)#2"
    for info, value in ((Types.LOCAL_DATE(), dt.date(2024, 1, 2)),
                        (Types.LOCAL_TIME(), dt.time(3, 4)),
                        (Types.LOCAL_DATE_TIME(), dt.datetime(2024, 1, 2, 3, 4))):
        serializer = info.get_serializer()
        assert serializer.deserialize(serializer.serialize(value)) == value
        assert serializer.check("not a date") is not None
    assert FileSystemCheckpointStorage("/tmp/b", write_buffer_size=100).get_write_buffer_size() == 100


@pytest.mark.parametrize("where", ["under a regular file", "under /proc", "under /sys"])
def test_an_unusable_checkpoint_directory_fails_before_the_job_runs(tmp_path, where):
    """On the local runner as at a Spark adapter's call: a typed error before the first element,
    not a failed checkpoint, restarts and the same error again at each attempt."""
    (tmp_path / "file").write_text("a regular file")
    directory = {"under a regular file": str(tmp_path / "file" / "statekit"),
                 "under /proc": "/proc/statekit-test-dir", "under /sys": "/sys/statekit-test-dir"}[where]
    seen = []
    env = StreamExecutionEnvironment.get_execution_environment(
        {"state.checkpoints.dir": directory, "execution.checkpointing.interval": "1 s"})
    with pytest.raises(ConfigError, match=r"^state\.checkpoints\.dir: .*(not a directory|cannot write)"):
        env.from_collection([1, 2]).key_by(lambda x: x).map(seen.append).execute_and_collect("j")
    assert seen == []
    env = StreamExecutionEnvironment.get_execution_environment()
    env.enable_checkpointing(1000)
    env.get_checkpoint_config().set_checkpoint_storage(
        CustomCheckpointStorage(FileSystemCheckpointStorage(directory)))  # set in code: the same
    with pytest.raises(ConfigError, match=r"^state\.checkpoints\.dir"):
        env.from_collection([1, 2]).key_by(lambda x: x).map(seen.append).execute_and_collect("j")
    assert seen == []


@pytest.mark.parametrize(("backend", "key", "value"), [
    ("rocksdb", "state.backend.heap.snapshot-key-group-order", "true"),
    ("rocksdb", "state.backend.heap.lazy-restore", "false"),
    ("rocksdb", "state.backend.heap.incremental", "true"),
    ("hashmap", "state.backend.rocksdb.localdir", "/tmp/statekit-unused"),
    ("hashmap", "state.backend.rocksdb.timer-service.factory", "HEAP"),
    ("hashmap", "state.backend.rocksdb.compaction.style", "LEVEL"),
])
def test_a_key_of_the_other_backend_is_refused_not_ignored(backend, key, value):
    """A setting of one backend cannot take effect on the other: the config names it at once."""
    from statekit.runtime.environment import backend_from_config

    with pytest.raises(ConfigError, match=f"{key}: a setting of the .* state backend, which "
                                          f"cannot take effect on the {backend} backend"):
        backend_from_config({"state.backend.type": backend, key: value})
    other = "hashmap" if backend == "rocksdb" else "rocksdb"
    assert backend_from_config({"state.backend.type": other, key: value}).name == other
