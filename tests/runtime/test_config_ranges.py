"""Every numeric setting is range-checked, by flat key and through the programmatic API alike:
NaN, infinities, negative sizes and values past a signed 64-bit number are a ConfigError naming
the setting (they were accepted, or failed later as a plain ValueError or OverflowError)."""

from __future__ import annotations

import math

import pytest

from statekit.backends.heap import HashMapStateBackend
from statekit.checkpoint.filesystem import FileSystemCheckpointStorage
from statekit.checkpoint.jobmanager import JobManagerCheckpointStorage
from statekit.durations import Time, to_millis
from statekit.errors import ConfigError
from statekit.runtime.environment import StreamExecutionEnvironment
from statekit.runtime.restart import RestartStrategies
from statekit.state.ttl import StateTtlConfig

BAD_NUMBERS = [math.nan, math.inf, -math.inf, 10**30, 1e300, "abc", True]


def _env(conf=None):
    return StreamExecutionEnvironment.get_execution_environment(conf or {})


@pytest.mark.parametrize("key, value", [
    ("execution.checkpointing.interval", "nan"), ("execution.checkpointing.interval", math.nan),
    ("execution.checkpointing.interval", math.inf), ("execution.checkpointing.interval", "-5 s"),
    ("execution.checkpointing.timeout", "99999999999999999999999 d"),
    ("state.backend.max-key-size", -5), ("state.backend.max-key-size", "-5"),
    ("state.backend.max-value-size", 0), ("state.storage.fs.write-buffer-size", -1),
    ("state.checkpoint-storage.jobmanager.max-state-size", 10**30),
    ("pipeline.max-parallelism", 40000), ("parallelism.default", 0),
    ("state.backend.heap.snapshot-pace", "inf"), ("state.backend.heap.snapshot-pace", 1e300),
    ("state.backend.heap.max-log-ratio", "nan"), ("restart-strategy.fixed-delay.attempts", -1),
])
def test_flat_keys_out_of_range_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _env({key: value})


@pytest.mark.parametrize("key, value, what", [
    ("execution.checkpointing.interval", "-5 s", "duration"),
    ("execution.checkpointing.timeout", " - 10min", "duration"),
    ("state.storage.fs.memory-threshold", "-1 kb", "memory size"),
])
def test_a_negative_duration_or_size_is_named_as_such(key, value, what):
    with pytest.raises(ConfigError, match=f"{key}: a {what} cannot be negative, got '{value}'"):
        _env({key: value})


def test_unknown_keys_in_statekit_namespaces_fail_with_a_hint():
    with pytest.raises(ConfigError, match=r"did you mean 'state\.backend\.type'"):
        _env({"state.backend.tpye": "rocksdb"})
    _env({"my.job.parameter": 1})  # not statekit's: left to the job
    with pytest.raises(ConfigError, match=r"did you mean 'parallelism\.default'"):
        _env({"parallelism.defualt": 3})  # was taken as a job parameter, the parallelism unset


SETTERS = {
    "enable_checkpointing": lambda v: _env().enable_checkpointing(v),
    "set_checkpoint_interval": lambda v: _env().get_checkpoint_config().set_checkpoint_interval(v),
    "set_checkpoint_timeout": lambda v: _env().get_checkpoint_config().set_checkpoint_timeout(v),
    "set_min_pause": lambda v: _env().get_checkpoint_config().set_min_pause_between_checkpoints(v),
    "set_max_concurrent": lambda v: _env().get_checkpoint_config().set_max_concurrent_checkpoints(v),
    "set_tolerable": lambda v: _env().get_checkpoint_config().set_tolerable_checkpoint_failure_number(v),
    "set_num_retained": lambda v: _env().get_checkpoint_config().set_num_retained_checkpoints(v),
    "set_parallelism": lambda v: _env().set_parallelism(v),
    "set_max_parallelism": lambda v: _env().set_max_parallelism(v),
    "Time.seconds": Time.seconds,
    "Time.milliseconds": Time.milliseconds,
    "to_millis": to_millis,
    "jobmanager max_state_size": lambda v: JobManagerCheckpointStorage(max_state_size=v),
    "filesystem threshold": lambda v: FileSystemCheckpointStorage("/x", file_state_size_threshold=v),
    "filesystem write buffer": lambda v: FileSystemCheckpointStorage("/x", write_buffer_size=v),
    "fixed_delay attempts": lambda v: RestartStrategies.fixed_delay_restart(v, 0),
    "fixed_delay delay": lambda v: RestartStrategies.fixed_delay_restart(1, v),
    "failure_rate interval": lambda v: RestartStrategies.failure_rate_restart(1, v, 0),
    "ttl": lambda v: StateTtlConfig.new_builder(v).build(),
    "heap transfer threads": lambda v: HashMapStateBackend().set_number_of_transfering_threads(v),
}


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("setter", SETTERS)
def test_programmatic_settings_out_of_range_are_config_errors(setter, value):
    if setter in ("Time.seconds", "Time.milliseconds", "to_millis", "ttl") and value == 10**30:
        value = 10**19  # past a signed 64-bit number of milliseconds
    with pytest.raises(ConfigError):
        SETTERS[setter](value)


@pytest.mark.parametrize("setter", ["Time.seconds", "jobmanager max_state_size", "filesystem threshold",
                                    "fixed_delay attempts", "fixed_delay delay", "ttl",
                                    "set_min_pause", "set_tolerable"])
def test_negative_values_are_config_errors(setter):
    with pytest.raises(ConfigError):
        SETTERS[setter](-5)


def test_valid_values_still_work():
    assert Time.seconds(1.5).to_milliseconds() == 1500
    assert to_millis(Time.minutes(2)) == 120_000
    config = _env().enable_checkpointing(2000.0).get_checkpoint_config()
    assert config.get_checkpoint_interval() == 2000
    assert _env().set_parallelism(3.0).get_parallelism() == 3
    assert JobManagerCheckpointStorage(max_state_size=1024).get_max_state_size() == 1024
